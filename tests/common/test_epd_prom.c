/* Unit tests of common/epd_prom.c: buckets at their bounds, cumulative
 * output with _count equal to +Inf, label escaping, whole bounds printed
 * in full, and every allocation failure reported as `failed`. */
#include "epd_test.h"

#include <string.h>

#include "epd_alloc.h"
#include "epd_prom.h"

static void test_buckets_and_text(void **state)
{
    epd_prom_histo_t h;
    epd_prom_text_t t = {0};

    (void)state;
    epd_prom_histo_init(&h, EPD_PROM_SECONDS);
    epd_prom_histo_observe(&h, 0.0001);      /* on the first bound: le="0.0001" */
    epd_prom_histo_observe(&h, 0.00010001);  /* just above: le="0.00025" */
    epd_prom_histo_observe_ns(&h, 2000000);  /* 2 ms: le="0.0025" */
    epd_prom_histo_observe(&h, 61.0);        /* over the last: +Inf only */
    epd_prom_family(&t, "x_seconds", "histogram", "help");
    epd_prom_histo(&t, "x_seconds", "m", "phase=\"a\"", &h);
    assert_false(t.failed);
    assert_non_null(strstr(t.data, "# TYPE x_seconds histogram\n"));
    assert_non_null(strstr(t.data, "x_seconds_bucket{model=\"m\",phase=\"a\",le=\"0.0001\"} 1\n"));
    assert_non_null(strstr(t.data, "x_seconds_bucket{model=\"m\",phase=\"a\",le=\"0.00025\"} 2\n"));
    assert_non_null(strstr(t.data, "x_seconds_bucket{model=\"m\",phase=\"a\",le=\"0.001\"} 2\n"));
    assert_non_null(strstr(t.data, "x_seconds_bucket{model=\"m\",phase=\"a\",le=\"0.0025\"} 3\n"));
    assert_non_null(strstr(t.data, "x_seconds_bucket{model=\"m\",phase=\"a\",le=\"60\"} 3\n"));
    assert_non_null(strstr(t.data, "x_seconds_bucket{model=\"m\",phase=\"a\",le=\"+Inf\"} 4\n"));
    assert_non_null(strstr(t.data, "x_seconds_count{model=\"m\",phase=\"a\"} 4\n"));
    assert_non_null(strstr(t.data, "x_seconds_sum{model=\"m\",phase=\"a\"} 61.002200010\n"));
    epd_prom_text_cleanup(&t);
}

static void test_whole_bounds_in_full(void **state)
{
    epd_prom_histo_t h;
    epd_prom_text_t t = {0};

    (void)state;
    epd_prom_histo_init(&h, EPD_PROM_TOKENS);
    epd_prom_histo_observe(&h, 1048576);
    epd_prom_histo(&t, "tok", "m", NULL, &h);
    assert_non_null(strstr(t.data, "tok_bucket{model=\"m\",le=\"1048576\"} 1\n"));
    assert_null(strstr(t.data, "e+"));
    epd_prom_text_cleanup(&t);
}

static void test_label_escaping(void **state)
{
    epd_prom_text_t t = {0};

    (void)state;
    epd_prom_counter(&t, "c_total", "help", "a\"b\\c\nd", 7);
    assert_string_equal(t.data,
                        "# HELP c_total help\n# TYPE c_total counter\n"
                        "c_total{model=\"a\\\"b\\\\c\\nd\"} 7\n");
    epd_prom_text_cleanup(&t);
}

static void test_allocation_failures(void **state)
{
    (void)state;
    for (long n = 0; n < 4; n++) {
        epd_prom_histo_t h;
        epd_prom_text_t t = {0};

        epd_prom_histo_init(&h, EPD_PROM_COUNT);
        epd_alloc_fail_after(n);
        for (int i = 0; i < 50; i++) {
            epd_prom_histo(&t, "batch_size", "model-with-a-long-name", NULL, &h);
        }
        epd_alloc_fail_after(-1);
        assert_true(t.failed); /* 50 renders need more than n growths */
        epd_prom_text_cleanup(&t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_and_text),
        cmocka_unit_test(test_whole_bounds_in_full),
        cmocka_unit_test(test_label_escaping),
        cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
