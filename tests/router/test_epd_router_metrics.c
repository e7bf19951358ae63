/*
 * test_epd_router_metrics.c — the router's metrics (router/epd_router_metrics.c)
 * linked with the registry alone: the queue's drain rate and the wait a
 * 429 advertises from it, and that the migrations counter is rendered.
 */
#include <stdio.h>
#include <string.h>

#include "epd_test.h"

#include "epd_client.h"
#include "epd_router_metrics.h"
#include "epd_router_registry.h"

/* The client's worker handle, as far as the registry can see it. */
struct epd_client_worker {
    epd_status_t state;
};

epd_status_t epd_client_worker_state(const epd_client_worker_t *w)
{
    return w->state;
}

#define SEC 1000000000ull

static void test_drain_retry(void **state)
{
    epd_router_drain_t d = {0};

    (void)state;
    /* nothing measured: 1 s, whatever waits */
    assert_int_equal(epd_router_drain_retry_ms(&d, 500), 1000);
    epd_router_drain_sample(&d, 10, 5 * SEC); /* opens the first window */
    assert_int_equal(epd_router_drain_retry_ms(&d, 500), 1000);
    epd_router_drain_sample(&d, 30, 5 * SEC + SEC / 2); /* under a second: not closed */
    assert_int_equal(epd_router_drain_retry_ms(&d, 500), 1000);
    epd_router_drain_sample(&d, 50, 7 * SEC); /* 40 in 2 s: 20/s */
    assert_true(d.per_s > 19.99 && d.per_s < 20.01);
    /* 99 waiting + the refused one, at 20/s: 5 s */
    assert_int_equal(epd_router_drain_retry_ms(&d, 99), 5000);
    assert_int_equal(epd_router_drain_retry_ms(&d, 0), 1000);       /* at least 1 s */
    assert_int_equal(epd_router_drain_retry_ms(&d, 100000), 60000); /* at most 60 s */
    /* a window with nothing finished: the rate decays (0.7 x 20 = 14/s) */
    epd_router_drain_sample(&d, 50, 8 * SEC);
    assert_true(d.per_s > 13.99 && d.per_s < 14.01);
    assert_int_equal(epd_router_drain_retry_ms(&d, 13), 1000);
    assert_int_equal(epd_router_drain_retry_ms(&d, 69), 5000);
    /* a counter that went back (cannot happen) or a clock that did: a new
     * window, the rate kept */
    epd_router_drain_sample(&d, 3, 9 * SEC);
    assert_int_equal(d.ok, 3);
    assert_true(d.per_s > 13.99 && d.per_s < 14.01);
}

static void test_render_migrations(void **state)
{
    epd_router_registry_t reg;
    epd_router_metrics_t m;
    epd_router_text_t t = {0};

    (void)state;
    memset(&m, 0, sizeof(m));
    m.migrations = 3;
    epd_router_registry_init(&reg, EPD_ROUTER_POLICY_LEAST_LOAD, 1000);
    assert_int_equal(epd_router_metrics_render(&m, &reg, 0, &t), EPD_OK);
    assert_non_null(t.data);
    assert_non_null(strstr(t.data, "\nepd_router_migrations_total 3\n"));
    assert_non_null(strstr(t.data, "# TYPE epd_router_migrations_total counter\n"));
    epd_router_text_cleanup(&t);
    epd_router_registry_cleanup(&reg);
}

/* The prefix cache's host/disk tier counters (words 12..19 of
 * epd_prefix_stats_t) under their own names; the gauges are not counters. */
static void test_render_tier(void **state)
{
    epd_router_registry_t reg;
    epd_router_metrics_t m;
    epd_router_text_t t = {0};

    (void)state;
    memset(&m, 0, sizeof(m));
    m.prefix.evictions = 9;
    m.prefix.tier_stored = 11;
    m.prefix.tier_restored_disk = 5;
    m.prefix.tier_restore_us = 1234;
    m.prefix.tier_checksum_failures = 2;
    m.prefix.tier_dropped = 7;
    epd_router_registry_init(&reg, EPD_ROUTER_POLICY_LEAST_LOAD, 1000);
    assert_int_equal(epd_router_metrics_render(&m, &reg, 0, &t), EPD_OK);
    assert_non_null(strstr(t.data, "\nepd_router_prefix_evictions_total 9\n"));
    assert_non_null(strstr(t.data, "\nepd_router_prefix_tier_stored_total 11\n"));
    assert_non_null(strstr(t.data, "\nepd_router_prefix_tier_restored_disk_total 5\n"));
    assert_non_null(strstr(t.data, "\nepd_router_prefix_tier_restore_seconds_total 0.001234\n"));
    assert_non_null(strstr(t.data, "\nepd_router_prefix_tier_checksum_failures_total 2\n"));
    assert_non_null(strstr(t.data, "\nepd_router_prefix_tier_dropped_total 7\n"));
    assert_non_null(strstr(t.data, "# TYPE epd_router_prefix_tier_bytes gauge\n"));
    assert_null(strstr(t.data, "epd_router_prefix_tier_host_bytes_total"));
    epd_router_text_cleanup(&t);
    epd_router_registry_cleanup(&reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drain_retry),
        cmocka_unit_test(test_render_migrations),
        cmocka_unit_test(test_render_tier),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
