/* Unit tests of common/epd_log.c: line format, levels, truncation.  stderr
 * is redirected into a pipe to read what was written. */
#include "epd_test.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "epd_log.h"
#include "epd_time.h"

static int log_fds[2];
static int saved_stderr;

static size_t log_capture(void (*emit)(void), char *out, size_t cap)
{
    ssize_t n;

    assert_int_equal(pipe(log_fds), 0);
    saved_stderr = dup(STDERR_FILENO);
    dup2(log_fds[1], STDERR_FILENO);
    emit();
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    close(log_fds[1]);
    n = read(log_fds[0], out, cap - 1);
    close(log_fds[0]);
    out[n > 0 ? n : 0] = '\0';
    return n > 0 ? (size_t)n : 0;
}

static void emit_levels(void)
{
    epd_log_set_level(EPD_LOG_INFO);
    epd_log_error("prefill", 42, "reservation refused: %s", "no capacity");
    epd_log_debug("prefill", 0, "hidden");
    epd_log_info("decode", 0, "plain");
}

static void test_format_and_levels(void **state)
{
    char out[8192];

    (void)state;
    log_capture(emit_levels, out, sizeof(out));
    assert_non_null(strstr(out, "Z ERROR prefill req=42 reservation refused: no capacity\n"));
    assert_non_null(strstr(out, "Z INFO  decode plain\n"));
    assert_null(strstr(out, "hidden"));
    assert_null(strstr(out, "req=0"));
    /* ISO-8601 UTC timestamp at the start of the line */
    assert_true(out[4] == '-' && out[7] == '-' && out[10] == 'T' && out[13] == ':');
}

static void emit_long(void)
{
    char big[5000];

    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    epd_log_warn("router", 0, "%s", big);
}

static void test_truncation(void **state)
{
    char out[8192];
    size_t n;

    (void)state;
    n = log_capture(emit_long, out, sizeof(out));
    assert_true(n <= 2048);
    assert_true(n > 2000);
    assert_memory_equal(out + n - 4, "...\n", 4);
}

static void test_level_parse(void **state)
{
    epd_log_level_t level;

    (void)state;
    assert_int_equal(epd_log_level_parse("DEBUG", &level), EPD_OK);
    assert_int_equal(level, EPD_LOG_DEBUG);
    assert_int_equal(epd_log_level_parse("loud", &level), EPD_ERR_INVALID_PARAM);
    assert_int_equal(level, EPD_LOG_DEBUG);
}

/* The limiter lets `burst` lines through per window, then none until the
 * window is over (moved back by hand: no sleeping in tests). */
static void test_limit(void **state)
{
    epd_log_limit_t l = {0, 0};

    (void)state;
    for (int i = 0; i < 3; i++) {
        assert_true(epd_log_limit_ok(&l, 3));
    }
    assert_false(epd_log_limit_ok(&l, 3));
    assert_false(epd_log_limit_ok(&l, 3));
    l.window_ns -= 2 * EPD_NSEC_PER_SEC; /* a second and more has passed */
    assert_true(epd_log_limit_ok(&l, 3));
    assert_true(epd_log_limit_ok(&l, 3));
    assert_true(epd_log_limit_ok(&l, 3));
    assert_false(epd_log_limit_ok(&l, 3));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_and_levels),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_level_parse),
        cmocka_unit_test(test_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
