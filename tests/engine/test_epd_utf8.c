/* test_epd_utf8.c — epd_utf8_repair against the WHATWG examples (one U+FFFD
 * per maximal invalid subsequence) and the streaming tail helper. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#include "epd_utf8.h"

#define R "\xEF\xBF\xBD"

static void check(const char *in, size_t len, const char *want)
{
    char out[256];
    size_t n = 0;

    assert_int_equal(epd_utf8_repair(in, len, out, sizeof(out), &n), EPD_OK);
    out[n] = '\0';
    assert_string_equal(out, want);
}

static void test_valid_unchanged(void **state)
{
    (void)state;
    check("", 0, "");
    check("hello", 5, "hello");
    check("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF", 19,
          "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF");
    check("a\0b", 3, "a"); /* NUL is valid; the comparison stops there */
}

static void test_whatwg_examples(void **state)
{
    (void)state;
    check("\xF0\x9F\x98", 3, R);           /* truncated at the end: one */
    check("\xF0\x9F\x98X", 4, R "X");      /* truncated in the middle */
    check("\xC0\x80", 2, R R);             /* overlong: two */
    check("\xED\xA0\x80", 3, R R R);       /* surrogate: three */
    check("\xE0\x80\x80", 3, R R R);       /* overlong 3-byte */
    check("\xF4\x90\x80\x80", 4, R R R R); /* above U+10FFFF */
    check("\xF5", 1, R);
    check("\xFF\xFE", 2, R R);
    check("\x80\x80", 2, R R); /* lone continuations */
    check("\xE2\x82", 2, R);
    check("\xE2\x82\xE2\x82\xAC", 5, R "\xE2\x82\xAC");
    check("a\xC3", 2, "a" R);
    /* the WHATWG spec's own example bytes: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 */
    check("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64", 13, "a" R R R "b" R "c" R R "d");
}

static void test_capacity(void **state)
{
    char out[4];
    size_t n;

    (void)state;
    assert_int_equal(epd_utf8_repair("\xFF\xFF", 2, out, sizeof(out), &n), EPD_ERR_TOO_LONG);
    assert_int_equal(epd_utf8_repair("abcde", 5, out, sizeof(out), &n), EPD_ERR_TOO_LONG);
    assert_int_equal(epd_utf8_repair("abcd", 4, out, sizeof(out), &n), EPD_OK);
    assert_int_equal(n, 4);
}

static void test_incomplete_tail(void **state)
{
    (void)state;
    assert_int_equal(epd_utf8_incomplete_tail("abc", 3), 0);
    assert_int_equal(epd_utf8_incomplete_tail("ab\xF0\x9F\x98", 5), 3);
    assert_int_equal(epd_utf8_incomplete_tail("ab\xF0\x9F", 4), 2);
    assert_int_equal(epd_utf8_incomplete_tail("ab\xC3", 3), 1);
    assert_int_equal(epd_utf8_incomplete_tail("ab\xC3\xA9", 4), 0);
    assert_int_equal(epd_utf8_incomplete_tail("ab\xC0", 3), 0);     /* invalid, not incomplete */
    assert_int_equal(epd_utf8_incomplete_tail("ab\xED\xA0", 4), 0); /* surrogate prefix */
    assert_int_equal(epd_utf8_incomplete_tail("\xF0\x9F\x98\x80", 4), 0);
}

static void test_valid_prefix(void **state)
{
    (void)state;
    assert_int_equal(epd_utf8_valid_prefix("", 0), 0);
    assert_int_equal(epd_utf8_valid_prefix("abc", 3), 3);
    assert_int_equal(epd_utf8_valid_prefix("a\0b", 3), 3);
    assert_int_equal(epd_utf8_valid_prefix("caf\xC3\xA9 \xF0\x9F\x98\x80", 10), 10);
    assert_int_equal(epd_utf8_valid_prefix("ab\xF0\x9F\x98", 5), 2);   /* truncated */
    assert_int_equal(epd_utf8_valid_prefix("ab\x80", 3), 2);           /* lone continuation */
    assert_int_equal(epd_utf8_valid_prefix("\xC0\x80", 2), 0);         /* overlong */
    assert_int_equal(epd_utf8_valid_prefix("\xE0\x9F\xBF", 3), 0);     /* overlong 3-byte */
    assert_int_equal(epd_utf8_valid_prefix("\xED\xA0\x80", 3), 0);     /* surrogate */
    assert_int_equal(epd_utf8_valid_prefix("\xED\x9F\xBFx", 4), 4);    /* U+D7FF */
    assert_int_equal(epd_utf8_valid_prefix("\xF4\x8F\xBF\xBF", 4), 4); /* U+10FFFF */
    assert_int_equal(epd_utf8_valid_prefix("\xF4\x90\x80\x80", 4), 0); /* above it */
    assert_int_equal(epd_utf8_valid_prefix("\xE2\x82x", 3), 0);
    assert_int_equal(epd_utf8_valid_prefix("x\xFF", 2), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_unchanged),
        cmocka_unit_test(test_whatwg_examples),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_incomplete_tail),
        cmocka_unit_test(test_valid_prefix),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
