/*
 * test_epd_router_metrics.c — the router's metrics (router/epd_router_metrics.c)
 * linked with the registry alone: the queue's drain rate and the wait a
 * 429 advertises from it, that the migrations counter is rendered, and
 * that every series carries the model label (escaped) before its own.
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
    assert_non_null(strstr(t.data, "\nepd_router_migrations_total{model=\"\"} 3\n"));
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
    assert_non_null(strstr(t.data, "\nepd_router_prefix_evictions_total{model=\"\"} 9\n"));
    assert_non_null(strstr(t.data, "\nepd_router_prefix_tier_stored_total{model=\"\"} 11\n"));
    assert_non_null(strstr(t.data, "\nepd_router_prefix_tier_restored_disk_total{model=\"\"} 5\n"));
    assert_non_null(
        strstr(t.data, "\nepd_router_prefix_tier_restore_seconds_total{model=\"\"} 0.001234\n"));
    assert_non_null(
        strstr(t.data, "\nepd_router_prefix_tier_checksum_failures_total{model=\"\"} 2\n"));
    assert_non_null(strstr(t.data, "\nepd_router_prefix_tier_dropped_total{model=\"\"} 7\n"));
    assert_non_null(strstr(t.data, "# TYPE epd_router_prefix_tier_bytes gauge\n"));
    assert_null(strstr(t.data, "epd_router_prefix_tier_host_bytes_total"));
    epd_router_text_cleanup(&t);
    epd_router_registry_cleanup(&reg);
}

/* A worker of `role` named `id` in the registry (the client handle the
 * registry asks about). */
static struct epd_client_worker fx_cw[4];

static epd_router_worker_t *fx_add(epd_router_registry_t *reg, int i, const char *id, int role)
{
    epd_client_worker_info_t info;
    epd_router_worker_t *w;

    memset(&info, 0, sizeof(info));
    snprintf(info.worker_id, sizeof(info.worker_id), "%s", id);
    info.role = role;
    info.block_tokens = 16;
    info.kv_blocks_total = 512;
    info.kv_blocks_free = 512;
    info.max_batch = 8;
    w = epd_router_registry_add(reg, &info, 1);
    assert_non_null(w);
    fx_cw[i].state = EPD_OK;
    w->cw = &fx_cw[i];
    return w;
}

/* Every sample line of the router's /metrics is NAME{model="MODEL"...}
 * with the model label first and escaped (backslash, quote, newline), so
 * the older families (counters, per-worker gauges, ttft) fit the same
 * scrape config as the workers' own /metrics; values and other labels
 * are what they were. */
static void test_render_model_label(void **state)
{
    epd_router_registry_t reg;
    epd_router_metrics_t m;
    epd_router_text_t t = {0};
    epd_router_worker_t *pw, *dw;
    const char *want = "{model=\"a\\\"b\\\\c\\nd\"";
    size_t samples = 0;

    (void)state;
    memset(&m, 0, sizeof(m));
    epd_router_metrics_init(&m, "a\"b\\c\nd");
    m.migrations = 3;
    m.ok = 41;
    m.requests[1][1] = 6;
    m.errors[EPD_ROUTER_ERR_CLIENT_GONE] = 2;
    m.http.refused_per_addr = 5;
    m.rejected_queue_full = 4;
    epd_router_histo_observe(&m.ttft, 0.003);
    epd_router_histo_observe(&m.ttft, 0.2);
    epd_router_registry_init(&reg, EPD_ROUTER_POLICY_LEAST_LOAD, 1000);
    pw = fx_add(&reg, 0, "prefill-\"0\"", EPD_CLIENT_ROLE_PREFILL);
    dw = fx_add(&reg, 1, "decode-0", EPD_CLIENT_ROLE_DECODE);
    pw->hb_queued_tokens = 77;
    pw->served = 9;
    dw->hb_kv_blocks_free = 100;
    dw->hb_kv_bytes_received = 4096;
    assert_int_equal(epd_router_metrics_render(&m, &reg, 2, &t), EPD_OK);
    assert_non_null(t.data);
    for (const char *l = t.data; *l != '\0';) {
        const char *eol = strchr(l, '\n');
        const char *brace = strchr(l, '{');

        assert_non_null(eol);
        if (*l != '#') {
            /* the name, then the model label first, before any other */
            assert_non_null(brace);
            assert_true(brace < eol);
            assert_int_equal(strncmp(brace, want, strlen(want)), 0);
            assert_true(brace[strlen(want)] == '}' || brace[strlen(want)] == ',');
            samples++;
        }
        l = eol + 1;
    }
    assert_true(samples > 100);
#define HAS(s) assert_non_null(strstr(t.data, s))
    HAS("\nepd_router_migrations_total{model=\"a\\\"b\\\\c\\nd\"} 3\n");
    HAS("\nepd_router_requests_ok_total{model=\"a\\\"b\\\\c\\nd\"} 41\n");
    HAS("\nepd_router_requests_total{model=\"a\\\"b\\\\c\\nd\",api=\"chat\",stream=\"true\"} 6\n");
    HAS("\nepd_router_errors_total{model=\"a\\\"b\\\\c\\nd\",kind=\"client_gone\"} 2\n");
    HAS("\nepd_router_http_refused_total{model=\"a\\\"b\\\\c\\nd\",limit=\"per_address\"} 5\n");
    HAS("\nepd_router_rejected_total{model=\"a\\\"b\\\\c\\nd\",reason=\"queue_full\"} 4\n");
    HAS("\nepd_router_requests_in_flight{model=\"a\\\"b\\\\c\\nd\"} 2\n");
    /* the router's histograms: buckets cumulative, +Inf and _count equal */
    HAS("\nepd_router_ttft_seconds_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"0.0025\"} 0\n");
    HAS("\nepd_router_ttft_seconds_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"0.005\"} 1\n");
    HAS("\nepd_router_ttft_seconds_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"0.25\"} 2\n");
    HAS("\nepd_router_ttft_seconds_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"60\"} 2\n");
    HAS("\nepd_router_ttft_seconds_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"+Inf\"} 2\n");
    HAS("\nepd_router_ttft_seconds_sum{model=\"a\\\"b\\\\c\\nd\"} 0.203000000\n");
    HAS("\nepd_router_ttft_seconds_count{model=\"a\\\"b\\\\c\\nd\"} 2\n");
    HAS("\nepd_router_itl_seconds_count{model=\"a\\\"b\\\\c\\nd\"} 0\n");
    HAS("\nepd_router_workers{model=\"a\\\"b\\\\c\\nd\",pool=\"decode\",state=\"READY\"} 1\n");
    /* per-worker series: the worker id escaped too */
    HAS("\nepd_router_worker_queued_tokens{model=\"a\\\"b\\\\c\\nd\","
        "worker=\"prefill-\\\"0\\\"\"} 77\n");
    HAS("\nepd_router_worker_requests_total{model=\"a\\\"b\\\\c\\nd\","
        "worker=\"prefill-\\\"0\\\"\",pool=\"prefill\"} 9\n");
    HAS("\nepd_router_worker_kv_blocks_free{model=\"a\\\"b\\\\c\\nd\",worker=\"decode-0\"} 100\n");
    HAS("\nepd_router_worker_kv_blocks{model=\"a\\\"b\\\\c\\nd\",worker=\"decode-0\"} 512\n");
    HAS("\nepd_router_worker_kv_bytes_total{model=\"a\\\"b\\\\c\\nd\",worker=\"decode-0\","
        "pool=\"decode\",direction=\"received\"} 4096\n");
    HAS("\nepd_router_prefix_tier_bytes{model=\"a\\\"b\\\\c\\nd\",tier=\"host\"} 0\n");
    /* the families' names and types are unchanged */
    HAS("\n# TYPE epd_router_ttft_seconds histogram\n");
    HAS("\n# TYPE epd_router_worker_kv_blocks_free gauge\n");
    HAS("\n# TYPE epd_router_errors_total counter\n");
#undef HAS
    /* the raw newline of the model name never reaches the text */
    assert_null(strstr(t.data, "a\"b"));
    epd_router_text_cleanup(&t);
    epd_router_registry_cleanup(&reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drain_retry),
        cmocka_unit_test(test_render_migrations),
        cmocka_unit_test(test_render_tier),
        cmocka_unit_test(test_render_model_label),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
