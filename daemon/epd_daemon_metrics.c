/*
 * epd_daemon_metrics.c — a worker's own /metrics (--metrics-addr): the
 * families every role has, from what the daemon already knows (its request
 * counts, the role's load as the heartbeats carry it, its capacity, the
 * fence), then the role's own (epd_daemon_set_metrics: histograms of its
 * phases).  Names are epd_<role>_*, every sample labelled with `model`
 * (docs/metrics.md lists them all).
 *
 * The same load the router sees in heartbeats is rendered here, so a
 * worker scraped directly and the router's per-worker gauges agree.
 */
#include <stdio.h>
#include <string.h>

#include "epd_daemon_int.h"
#include "epd_log.h"
#include "epd_metrics_http.h"

void epd_daemon_set_metrics(epd_daemon_t *d, epd_daemon_metrics_cb_t cb, void *arg)
{
    d->metrics_cb = cb;
    d->metrics_arg = arg;
}

const char *epd_daemon_metrics_model(const epd_daemon_t *d)
{
    const char *s = d->fl->served_model_name;

    return s != NULL && s[0] != '\0' ? s : d->model_name;
}

/* epd_<role>_<what> into buf (names are the caller's constants) */
static const char *epd_daemon_mname(const epd_daemon_t *d, char *buf, size_t cap, const char *what)
{
    snprintf(buf, cap, "epd_%s_%s", d->log, what);
    return buf;
}

static void epd_daemon_mcounter(epd_daemon_t *d, epd_prom_text_t *t, const char *what,
                                const char *help, uint64_t v)
{
    char name[128];

    epd_prom_counter(t, epd_daemon_mname(d, name, sizeof(name), what), help,
                     epd_daemon_metrics_model(d), v);
}

static void epd_daemon_mgauge(epd_daemon_t *d, epd_prom_text_t *t, const char *what,
                              const char *help, double v)
{
    char name[128];

    epd_prom_gauge(t, epd_daemon_mname(d, name, sizeof(name), what), help,
                   epd_daemon_metrics_model(d), v);
}

static void epd_daemon_render(void *arg, epd_prom_text_t *t)
{
    epd_daemon_t *d = arg;
    const char *model = epd_daemon_metrics_model(d);
    const epd_daemon_counts_t *c = &d->counts;
    epd_daemon_load_t l;
    epd_prom_text_t w = {0};
    char name[128], extra[300];

    epd__daemon_load_now(d, &l);
    epd_prom_family(t, epd_daemon_mname(d, name, sizeof(name), "info"), "gauge",
                    "This worker: always 1, its identity in the labels");
    epd_prom_label(&w, d->worker_id);
    snprintf(extra, sizeof(extra), "worker=\"%s\",transport=\"%s\"", w.data != NULL ? w.data : "",
             d->fl->transport);
    epd_prom_text_cleanup(&w);
    epd_prom_sample(t, name, model, extra, 1);
    epd_prom_family(t, epd_daemon_mname(d, name, sizeof(name), "requests_total"), "counter",
                    "Requests by outcome: received, served (finished as asked), failed "
                    "(failed or aborted), refused (at the door)");
    epd_prom_sample_u64(t, name, model, "outcome=\"received\"", c->received);
    epd_prom_sample_u64(t, name, model, "outcome=\"served\"", c->served);
    epd_prom_sample_u64(t, name, model, "outcome=\"failed\"", c->failed);
    epd_prom_sample_u64(t, name, model, "outcome=\"refused\"", c->refused);
    epd_daemon_mgauge(d, t, "queue_depth", "Requests waiting (what heartbeats report)",
                      l.queue_depth);
    epd_daemon_mgauge(d, t, "running_requests", "Requests running now", l.running_requests);
    epd_daemon_mgauge(d, t, "draining", "1 while the worker drains (takes no new work)",
                      l.draining);
    if (d->cfg.role == EPD__ROLE__ROLE_PREFILL) {
        epd_daemon_mgauge(d, t, "queued_tokens", "Prompt tokens waiting for compute",
                          (double)l.queued_tokens);
        epd_daemon_mcounter(d, t, "kv_bytes_sent_total", "KV bytes written to decode workers",
                            l.kv_bytes_sent);
        epd_daemon_mcounter(d, t, "wasted_tokens_total",
                            "Prompt tokens computed that no decode worker took",
                            l.wasted_prefill_tokens);
    }
    if (d->cfg.role == EPD__ROLE__ROLE_DECODE) {
        epd_daemon_mgauge(d, t, "kv_blocks", "KV blocks of the pool", d->capacity.kv_blocks_total);
        /* --kv-blocks counts blocks of the KV dtype map's size: what they
         * hold in tokens is what an operator sizes by */
        epd_daemon_mgauge(d, t, "kv_tokens", "Tokens the KV pool holds (blocks x block tokens)",
                          (double)d->capacity.kv_blocks_total * d->capacity.block_tokens);
        epd_daemon_mgauge(d, t, "kv_blocks_used", "KV blocks not free (in use, quarantined, kept)",
                          d->capacity.kv_blocks_total >= l.kv_blocks_free
                              ? d->capacity.kv_blocks_total - l.kv_blocks_free
                              : 0);
        epd_daemon_mgauge(d, t, "kv_usage_ratio", "KV blocks not free over the pool (0..1)",
                          d->capacity.kv_blocks_total > 0
                              ? 1.0 - (double)l.kv_blocks_free / d->capacity.kv_blocks_total
                              : 0.0);
        epd_daemon_mgauge(d, t, "state_slots_free", "Free recurrent-state slots",
                          l.state_slots_free);
        epd_daemon_mcounter(d, t, "kv_bytes_received_total",
                            "KV bytes received from prefill workers and verified",
                            l.kv_bytes_received);
        epd_daemon_mcounter(d, t, "preemptions_total",
                            "Running requests that gave their blocks back (resumed later)",
                            l.preemptions);
        epd_daemon_mcounter(d, t, "recomputed_tokens_total",
                            "Tokens recomputed to resume preempted requests", l.recomputed_tokens);
    }
    if (l.prefix.requests > 0 || d->have_prefix_root) {
        epd_daemon_mcounter(d, t, "prefix_cache_queries_total",
                            "Prompts looked up in the prefix cache", l.prefix.requests);
        epd_daemon_mcounter(d, t, "prefix_cache_query_tokens_total",
                            "Prompt tokens of those lookups", l.prefix.prompt_tokens);
        epd_daemon_mcounter(d, t, "prefix_cache_hit_tokens_total",
                            "Prompt tokens whose KV the cache served (not computed)",
                            l.prefix.hit_tokens);
        epd_daemon_mgauge(d, t, "prefix_cache_blocks", "KV blocks the prefix cache holds",
                          (double)l.prefix.cached_blocks);
    }
    epd_daemon_mgauge(d, t, "quarantined",
                      "Memory units held for writers that may still write (the fence)",
                      l.quarantined);
    epd_daemon_mcounter(d, t, "late_writes_refused_total",
                        "Remote writes the transport refused (late or out of range)",
                        l.late_writes_refused);
    if (d->metrics_cb != NULL) {
        d->metrics_cb(d->metrics_arg, model, t);
    }
}

epd_status_t epd__daemon_metrics_start(epd_daemon_t *d)
{
    epd_status_t st;

    if (d->metrics_bind[0] == '\0') {
        return EPD_OK;
    }
    st = epd_metrics_http_start(&d->loop, d->metrics_bind, d->log, epd_daemon_render, d,
                                &d->metrics);
    if (st != EPD_OK) {
        return st;
    }
    epd_log_info(d->log, 0, "metrics: GET /metrics on %s (port %u), model label '%s'",
                 d->metrics_bind, epd_metrics_http_port(d->metrics), epd_daemon_metrics_model(d));
    return EPD_OK;
}

void epd__daemon_metrics_stop(epd_daemon_t *d)
{
    epd_metrics_http_stop(d->metrics);
    d->metrics = NULL;
}
