/*
 * epd_router_metrics.c — counters, histograms, Prometheus text format
 * (version 0.0.4) rendering (see epd_router_metrics.h).
 */
#include "epd_router_metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"

static const double epd_router_bounds[EPD_ROUTER_HISTO_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,     1.0,    2.5,   5.0,    10.0,  20.0, 30.0,  45.0, 60.0,
};

void epd_router_histo_observe(epd_router_histo_t *h, double seconds)
{
    size_t i = 0;

    while (i < EPD_ROUTER_HISTO_BUCKETS && seconds > epd_router_bounds[i]) {
        i++;
    }
    h->counts[i]++;
    h->sum += seconds;
    h->n++;
}

static const char *const epd_router_phase_names[EPD_ROUTER_PHASES][2] = {
    [EPD_ROUTER_PHASE_QUEUE] = {"queue", "router"},
    [EPD_ROUTER_PHASE_ENCODE] = {"encode", "encoder"},
    [EPD_ROUTER_PHASE_PREFILL_QUEUE] = {"prefill_queue", "prefill"},
    [EPD_ROUTER_PHASE_PREFILL_COMPUTE] = {"prefill_compute", "prefill"},
    [EPD_ROUTER_PHASE_KV_TRANSFER] = {"kv_transfer", "decode"},
    [EPD_ROUTER_PHASE_HANDOFF] = {"first_token_handoff", "decode"},
    [EPD_ROUTER_PHASE_MESSAGES] = {"messages", "router"},
};

const char *epd_router_phase_name(epd_router_phase_t p)
{
    return epd_router_phase_names[p][0];
}

const char *epd_router_phase_pool(epd_router_phase_t p)
{
    return epd_router_phase_names[p][1];
}

void epd_router_metrics_init(epd_router_metrics_t *m, const char *model)
{
    m->model = model;
    for (int p = 0; p < EPD_ROUTER_PHASES; p++) {
        epd_prom_histo_init(&m->phase[p], EPD_PROM_SECONDS);
    }
    epd_prom_histo_init(&m->req_prompt_tokens, EPD_PROM_TOKENS);
    epd_prom_histo_init(&m->req_cached_tokens, EPD_PROM_TOKENS);
}

/* The rule-38 families, through epd_prom (labels escaped), appended. */
static void epd_router_metrics_phases(epd_router_text_t *t, const epd_router_metrics_t *m)
{
    const char *model = m->model != NULL ? m->model : "";
    epd_prom_text_t p = {0};
    char extra[96];

    epd_prom_family(&p, "epd_router_ttft_phase_seconds", "histogram",
                    "Time to first token taken apart, per request: queue (router), encode, "
                    "prefill_queue, prefill_compute, kv_transfer (compute done to decode holding "
                    "the KV), first_token_handoff, messages (the rest: message latencies); the "
                    "phases of a request sum to its TTFT");
    for (int i = 0; i < EPD_ROUTER_PHASES; i++) {
        snprintf(extra, sizeof(extra), "pool=\"%s\",phase=\"%s\"",
                 epd_router_phase_pool((epd_router_phase_t)i),
                 epd_router_phase_name((epd_router_phase_t)i));
        epd_prom_histo(&p, "epd_router_ttft_phase_seconds", model, extra, &m->phase[i]);
    }
    epd_prom_family(&p, "epd_router_request_prompt_tokens", "histogram",
                    "Prompt tokens per request that got its first token");
    epd_prom_histo(&p, "epd_router_request_prompt_tokens", model, NULL, &m->req_prompt_tokens);
    epd_prom_family(&p, "epd_router_request_cached_tokens", "histogram",
                    "Prompt tokens per request that prefill's prefix cache served");
    epd_prom_histo(&p, "epd_router_request_cached_tokens", model, NULL, &m->req_cached_tokens);
    epd_prom_counter(&p, "epd_router_cached_tokens_total",
                     "Prompt tokens prefill's prefix cache served (requests that got their first "
                     "token)",
                     model, m->cached_tokens);
    epd_prom_counter(&p, "epd_router_phase_times_missing_total",
                     "First tokens that came without phase times (a worker older than rule 38): "
                     "their phases count as messages",
                     model, m->phase_times_missing);
    if (p.failed) {
        t->failed = 1;
    } else if (p.data != NULL) {
        epd_router_text_printf(t, "%s", p.data);
    }
    epd_prom_text_cleanup(&p);
}

void epd_router_text_printf(epd_router_text_t *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (t->failed) {
        return;
    }
    for (;;) {
        size_t room = t->cap - t->len;

        va_start(ap, fmt);
        n = vsnprintf(t->data != NULL ? t->data + t->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if ((size_t)n < room) {
            t->len += (size_t)n;
            return;
        }
        {
            size_t cap = (t->cap + (size_t)n + 1) * 2;
            char *p = epd_realloc(t->data, cap);

            if (p == NULL) {
                t->failed = 1;
                return;
            }
            t->data = p;
            t->cap = cap;
        }
    }
}

void epd_router_text_cleanup(epd_router_text_t *t)
{
    epd_free(t->data);
    memset(t, 0, sizeof(*t));
}

static void epd_router_metrics_histo(epd_router_text_t *t, const char *name, const char *help,
                                     const epd_router_histo_t *h)
{
    uint64_t cum = 0;

    epd_router_text_printf(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t i = 0; i < EPD_ROUTER_HISTO_BUCKETS; i++) {
        cum += h->counts[i];
        epd_router_text_printf(t, "%s_bucket{le=\"%g\"} %llu\n", name, epd_router_bounds[i],
                               (unsigned long long)cum);
    }
    cum += h->counts[EPD_ROUTER_HISTO_BUCKETS];
    epd_router_text_printf(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9f\n%s_count %llu\n", name,
                           (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->n);
}

static void epd_router_metrics_counter(epd_router_text_t *t, const char *name, const char *help,
                                       uint64_t v)
{
    epd_router_text_printf(t, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
                           (unsigned long long)v);
}

/* The prefill workers' prefix caches: the totals of their counters, the
 * hit ratio, each worker's size now (epd_prefix_stats_t's words in order). */
static void epd_router_metrics_prefix(epd_router_text_t *t, const epd_router_registry_t *reg,
                                      const epd_prefix_stats_t *p)
{
    static const char *const names[][2] = {
        {"requests", "Prompts the prefill workers looked up in their prefix caches"},
        {"prompt_tokens", "Tokens of those prompts"},
        {"hit_tokens", "Prompt tokens whose KV came from a prefix cache"},
        {"computed_tokens", "Prompt tokens prefill runs computed (replayed ones included)"},
        {"replayed_tokens", "Tokens replayed from a recurrent-state checkpoint"},
        {"replay_cut", "Hits cut back to a checkpoint because the replay was over budget"},
        {"checkpoints_taken", "Recurrent-state checkpoints cached"},
        {"checkpoints_restored", "Prefill runs started from a checkpoint"},
        {"checkpoints_dropped", "Checkpoints taken away for room"},
        {"evictions", "Cached KV blocks evicted for room"},
    };
    uint64_t v[EPD_PREFIX_STATS_WORDS];
    char name[96];

    memcpy(v, p, sizeof(v));
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(name, sizeof(name), "epd_router_prefix_%s_total", names[i][0]);
        epd_router_metrics_counter(t, name, names[i][1], v[i]);
    }
    /* the host/disk tier: counters (words 12..19), then its two gauges */
    static const char *const tier[][2] = {
        {"tier_stored", "KV blocks evicted from a prefill pool stored in its host tier"},
        {"tier_spilled", "KV blocks the host tiers spilled to disk"},
        {"tier_restored_host", "KV blocks restored from a host tier"},
        {"tier_restored_disk", "KV blocks restored from a disk tier"},
        {"tier_restore_us", "Microseconds spent restoring tier blocks (reads, decompression, checks)"},
        {"tier_checksum_failures", "Tier blocks that failed their checksum: not used, recomputed"},
        {"tier_refused_files", "Disk tier files refused (corrupt, truncated, another model's)"},
        {"tier_dropped", "Tier blocks dropped for room with nowhere to go"},
    };
    for (size_t i = 0; i < sizeof(tier) / sizeof(tier[0]); i++) {
        if (strcmp(tier[i][0], "tier_restore_us") == 0) {
            /* Prometheus wants base units: seconds, from the workers' µs */
            epd_router_text_printf(t,
                                   "# HELP epd_router_prefix_tier_restore_seconds_total Seconds "
                                   "spent restoring tier blocks (reads, decompression, checks)\n"
                                   "# TYPE epd_router_prefix_tier_restore_seconds_total counter\n"
                                   "epd_router_prefix_tier_restore_seconds_total %.6f\n",
                                   (double)v[12 + i] / 1e6);
            continue;
        }
        snprintf(name, sizeof(name), "epd_router_prefix_%s_total", tier[i][0]);
        epd_router_metrics_counter(t, name, tier[i][1], v[12 + i]);
    }
    epd_router_text_printf(t, "# HELP epd_router_prefix_tier_bytes Bytes the prefill workers' KV "
                              "tiers hold (their last heartbeats)\n"
                              "# TYPE epd_router_prefix_tier_bytes gauge\n");
    {
        uint64_t hb = 0, db = 0;

        for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
            if (w->state != EPD_ROUTER_DEAD && w->info.role == EPD_CLIENT_ROLE_PREFILL) {
                hb += w->hb_prefix.tier_host_bytes;
                db += w->hb_prefix.tier_disk_bytes;
            }
        }
        epd_router_text_printf(t, "epd_router_prefix_tier_bytes{tier=\"host\"} %llu\n"
                                  "epd_router_prefix_tier_bytes{tier=\"disk\"} %llu\n",
                               (unsigned long long)hb, (unsigned long long)db);
    }
    epd_router_text_printf(t, "# HELP epd_router_prefix_hit_ratio Hit tokens over prompt tokens of "
                              "the prefill workers' prefix caches\n"
                              "# TYPE epd_router_prefix_hit_ratio gauge\n"
                              "epd_router_prefix_hit_ratio %.6f\n",
                           p->prompt_tokens > 0 ? (double)p->hit_tokens / (double)p->prompt_tokens
                                                : 0.0);
    epd_router_text_printf(t, "# HELP epd_router_worker_prefix_cached_blocks KV blocks a prefill "
                              "worker's prefix cache holds (its last heartbeat)\n"
                              "# TYPE epd_router_worker_prefix_cached_blocks gauge\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD && w->info.role == EPD_CLIENT_ROLE_PREFILL) {
            epd_router_text_printf(t, "epd_router_worker_prefix_cached_blocks{worker=\"%s\"} %llu\n",
                                   w->info.worker_id,
                                   (unsigned long long)w->hb_prefix.cached_blocks);
        }
    }
}

static const char *const epd_router_err_names[EPD_ROUTER_ERR_KINDS] = {
    "bad_request", "no_workers", "upstream", "timeout", "client_gone", "internal", "overloaded",
};

epd_status_t epd_router_metrics_render(const epd_router_metrics_t *m,
                                       const epd_router_registry_t *reg, uint32_t live,
                                       epd_router_text_t *t)
{
    static const char *const kinds[2] = {"completions", "chat"};
    uint32_t counts[EPD_ROUTER_POOLS][5];

    epd_router_metrics_counter(t, "epd_router_http_requests_total", "HTTP requests received",
                               m->http_requests);
    epd_router_text_printf(t, "# HELP epd_router_requests_total Generation requests accepted\n"
                              "# TYPE epd_router_requests_total counter\n");
    for (int k = 0; k < 2; k++) {
        for (int s = 0; s < 2; s++) {
            epd_router_text_printf(t, "epd_router_requests_total{api=\"%s\",stream=\"%s\"} %llu\n",
                                   kinds[k], s ? "true" : "false",
                                   (unsigned long long)m->requests[k][s]);
        }
    }
    epd_router_metrics_counter(t, "epd_router_requests_ok_total",
                               "Generations finished (stop or length)", m->ok);
    epd_router_text_printf(t, "# HELP epd_router_errors_total Requests that ended in an error\n"
                              "# TYPE epd_router_errors_total counter\n");
    for (int e = 0; e < EPD_ROUTER_ERR_KINDS; e++) {
        epd_router_text_printf(t, "epd_router_errors_total{kind=\"%s\"} %llu\n",
                               epd_router_err_names[e], (unsigned long long)m->errors[e]);
    }
    epd_router_metrics_counter(t, "epd_router_http_auth_failures_total",
                               "HTTP requests refused 401: no API key, or not one of the keys",
                               m->http.auth_failures);
    epd_router_text_printf(
        t,
        "# HELP epd_router_http_refused_total HTTP connections and requests "
        "refused by a limit of the front door\n"
        "# TYPE epd_router_http_refused_total counter\n"
        "epd_router_http_refused_total{limit=\"max_connections\"} %llu\n"
        "epd_router_http_refused_total{limit=\"per_address\"} %llu\n"
        "epd_router_http_refused_total{limit=\"body_budget\"} %llu\n"
        "epd_router_http_refused_total{limit=\"header_timeout\"} %llu\n"
        "epd_router_http_refused_total{limit=\"body_size\"} %llu\n"
        "epd_router_http_refused_total{limit=\"header_size\"} %llu\n"
        "epd_router_http_refused_total{limit=\"http_version\"} %llu\n"
        "epd_router_http_refused_total{limit=\"transfer_encoding\"} %llu\n"
        "epd_router_http_refused_total{limit=\"host_header\"} %llu\n"
        "epd_router_http_refused_total{limit=\"malformed\"} %llu\n",
        (unsigned long long)m->http.refused_max_conns, (unsigned long long)m->http.refused_per_addr,
        (unsigned long long)m->http.refused_body_budget,
        (unsigned long long)m->http.header_timeouts, (unsigned long long)m->http.refused_body_size,
        (unsigned long long)m->http.refused_header_size,
        (unsigned long long)m->http.refused_version, (unsigned long long)m->http.refused_encoding,
        (unsigned long long)m->http.refused_host, (unsigned long long)m->http.refused_malformed);
    epd_router_text_printf(t,
                           "# HELP epd_router_http_connections HTTP connections open\n"
                           "# TYPE epd_router_http_connections gauge\n"
                           "epd_router_http_connections %u\n"
                           "# HELP epd_router_http_buffered_body_bytes Request body bytes held "
                           "(counted against --max-buffered-body-bytes)\n"
                           "# TYPE epd_router_http_buffered_body_bytes gauge\n"
                           "epd_router_http_buffered_body_bytes %zu\n",
                           m->http.connections, m->http.buffered_body_bytes);
    epd_router_metrics_counter(t, "epd_router_retries_total",
                               "Requests sent again to another worker", m->retries);
    epd_router_metrics_counter(t, "epd_router_migrations_total",
                               "Streams cut after some tokens that went on from another prefill "
                               "and decode worker (proto/README.md rule 37)",
                               m->migrations);
    epd_router_metrics_counter(t, "epd_router_capacity_retries_total",
                               "Attempts refused for room (KV or prefill pool full), sent again "
                               "after a backoff",
                               m->capacity_retries);
    epd_router_metrics_counter(t, "epd_router_no_worker_waits_total",
                               "Requests that found no usable prefill and decode pair and waited "
                               "for one (--no-worker-wait-ms)",
                               m->no_worker_waits);
    epd_router_metrics_counter(t, "epd_router_no_worker_timeouts_total",
                               "Requests answered 503 after waiting --no-worker-wait-ms for a "
                               "usable pair",
                               m->no_worker_timeouts);
    epd_router_text_printf(t,
                           "# HELP epd_router_queue_depth Requests waiting for room in the pools\n"
                           "# TYPE epd_router_queue_depth gauge\n"
                           "epd_router_queue_depth %u\n"
                           "# HELP epd_router_rejected_total Requests answered 429 (Retry-After)\n"
                           "# TYPE epd_router_rejected_total counter\n"
                           "epd_router_rejected_total{reason=\"queue_full\"} %llu\n"
                           "epd_router_rejected_total{reason=\"queue_timeout\"} %llu\n",
                           m->queue_depth, (unsigned long long)m->rejected_queue_full,
                           (unsigned long long)m->rejected_queue_timeout);
    epd_router_metrics_counter(t, "epd_router_decode_preemptions_total",
                               "Requests decode workers preempted for KV room (from their "
                               "heartbeats)",
                               m->preemptions);
    epd_router_metrics_counter(t, "epd_router_decode_recomputed_tokens_total",
                               "Tokens prefilled again to resume preempted requests (from the "
                               "decode workers' heartbeats)",
                               m->recomputed_tokens);
    epd_router_metrics_counter(t, "epd_router_prefill_wasted_tokens_total",
                               "Prompt tokens prefill workers computed for requests whose KV no "
                               "decode worker took, by the layers that ran (from their "
                               "heartbeats)",
                               m->wasted_prefill_tokens);
    epd_router_metrics_counter(t, "epd_router_prompt_tokens_total", "Prompt tokens (BOS included)",
                               m->prompt_tokens);
    epd_router_metrics_counter(t, "epd_router_completion_tokens_total", "Tokens generated",
                               m->completion_tokens);
    epd_router_metrics_counter(t, "epd_router_registrations_total", "RegisterWorker calls accepted",
                               m->registrations);
    epd_router_metrics_counter(t, "epd_router_heartbeats_total", "Heartbeats received",
                               m->heartbeats);
    epd_router_metrics_counter(t, "epd_router_workers_died_total", "Workers whose endpoint failed",
                               m->workers_died);
    epd_router_metrics_counter(
        t, "epd_router_kv_bytes_sent_total",
        "KV and recurrent-state bytes prefill workers wrote to decode workers "
        "(from their heartbeats)",
        m->kv_bytes_sent);
    epd_router_metrics_counter(
        t, "epd_router_kv_bytes_received_total",
        "KV bytes decode workers received and verified (from their heartbeats)",
        m->kv_bytes_received);
    epd_router_metrics_prefix(t, reg, &m->prefix);
    epd_router_metrics_counter(t, "epd_router_decode_prefix_requests_total",
                               "Prompts decode workers looked up among the blocks they kept",
                               m->dprefix.requests);
    epd_router_metrics_counter(t, "epd_router_decode_prefix_hit_tokens_total",
                               "Prompt tokens whose KV a decode worker still held, so prefill did "
                               "not write it again (decode-side reuse)",
                               m->dprefix.hit_tokens);
    epd_router_metrics_counter(t, "epd_router_decode_prefix_evictions_total",
                               "Kept blocks decode workers evicted for room",
                               m->dprefix.evictions);
    epd_router_metrics_counter(t, "epd_router_images_total",
                               "Images of requests that got their first token", m->images);
    epd_router_metrics_counter(t, "epd_router_image_bytes_total",
                               "Encoded bytes of the images received", m->image_bytes);
    epd_router_metrics_counter(
        t, "epd_router_image_cache_hits_total",
        "Images whose embeddings a prefill worker had cached (no encoder involved)",
        m->image_cache_hits);
    epd_router_metrics_counter(t, "epd_router_images_encoded_total",
                               "Images encoded by the encoder pool", m->images_encoded);
    epd_router_metrics_counter(t, "epd_router_images_local_total",
                               "Images encoded by the prefill worker itself (no encoder available)",
                               m->images_local);
    epd_router_metrics_counter(
        t, "epd_router_image_cache_stale_total",
        "Cache hints a prefill worker disproved (the request went again with an encoder)",
        m->image_cache_stale);
    epd_router_text_printf(t,
                           "# HELP epd_router_image_cache_hit_ratio Image cache hits over images\n"
                           "# TYPE epd_router_image_cache_hit_ratio gauge\n"
                           "epd_router_image_cache_hit_ratio %.6f\n",
                           m->images > 0 ? (double)m->image_cache_hits / (double)m->images : 0.0);
    epd_router_text_printf(t,
                           "# HELP epd_router_requests_in_flight Requests held by the router\n"
                           "# TYPE epd_router_requests_in_flight gauge\n"
                           "epd_router_requests_in_flight %u\n",
                           live);
    epd_router_metrics_histo(t, "epd_router_ttft_seconds",
                             "Time from request arrival to the first token", &m->ttft);
    epd_router_metrics_histo(t, "epd_router_itl_seconds", "Time between token chunks of a request",
                             &m->itl);
    epd_router_metrics_histo(t, "epd_router_e2e_seconds", "Time from request arrival to its end",
                             &m->e2e);
    epd_router_metrics_histo(t, "epd_router_dispatch_seconds",
                             "Router's own time from request arrival to submission to the workers",
                             &m->dispatch);
    epd_router_metrics_phases(t, m);
    epd_router_metrics_histo(t, "epd_router_no_worker_wait_seconds",
                             "Time a request waited for a usable prefill and decode pair (served "
                             "or answered 503)",
                             &m->no_worker_wait);

    epd_router_registry_counts(reg, counts);
    epd_router_text_printf(t, "# HELP epd_router_workers Workers per pool and state\n"
                              "# TYPE epd_router_workers gauge\n");
    for (int r = 0; r < EPD_ROUTER_POOLS; r++) {
        for (int s = 1; s <= 4; s++) {
            epd_router_text_printf(t, "epd_router_workers{pool=\"%s\",state=\"%s\"} %u\n",
                                   epd_router_pool_name(r),
                                   epd_router_state_name((epd_router_state_t)s), counts[r][s]);
        }
    }
    epd_router_text_printf(t, "# HELP epd_router_worker_queue_depth Requests waiting on a worker "
                              "(its last heartbeat)\n"
                              "# TYPE epd_router_worker_queue_depth gauge\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD) {
            epd_router_text_printf(
                t, "epd_router_worker_queue_depth{worker=\"%s\",pool=\"%s\"} %u\n",
                w->info.worker_id, epd_router_pool_name(epd_router_pool_of(w->info.role)),
                w->hb_queue_depth);
        }
    }
    epd_router_text_printf(t, "# HELP epd_router_worker_in_flight Requests the router has on a "
                              "worker\n# TYPE epd_router_worker_in_flight gauge\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD) {
            epd_router_text_printf(
                t, "epd_router_worker_in_flight{worker=\"%s\",pool=\"%s\"} %u\n", w->info.worker_id,
                epd_router_pool_name(epd_router_pool_of(w->info.role)), w->inflight);
        }
    }
    epd_router_text_printf(t, "# HELP epd_router_worker_requests_total Requests the router sent "
                              "to a worker\n# TYPE epd_router_worker_requests_total counter\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD) {
            epd_router_text_printf(
                t, "epd_router_worker_requests_total{worker=\"%s\",pool=\"%s\"} %llu\n",
                w->info.worker_id, epd_router_pool_name(epd_router_pool_of(w->info.role)),
                (unsigned long long)w->served);
        }
    }
    epd_router_text_printf(t, "# HELP epd_router_worker_kv_hints KV blocks the router believes a "
                              "worker holds (KV-aware routing: its heartbeats' hints and the "
                              "prompts sent to it)\n"
                              "# TYPE epd_router_worker_kv_hints gauge\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD && w->hints != NULL && w->has_root) {
            epd_router_text_printf(t, "epd_router_worker_kv_hints{worker=\"%s\",pool=\"%s\"} %u\n",
                                   w->info.worker_id,
                                   epd_router_pool_name(epd_router_pool_of(w->info.role)),
                                   epd_router_hints_count(w->hints));
        }
    }
    epd_router_text_printf(t, "# HELP epd_router_worker_kv_blocks_free Free KV blocks of a decode "
                              "worker (its last heartbeat)\n"
                              "# TYPE epd_router_worker_kv_blocks_free gauge\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD && w->info.role == EPD_CLIENT_ROLE_DECODE) {
            epd_router_text_printf(t, "epd_router_worker_kv_blocks_free{worker=\"%s\"} %u\n",
                                   w->info.worker_id, w->hb_kv_blocks_free);
        }
    }
    /* the fence (proto/README.md "Late writes: the fence") */
    epd_router_text_printf(t, "# HELP epd_router_worker_quarantined Memory a worker holds for "
                              "writers that may still write into it: decode KV blocks, prefill "
                              "embedding slots (its last heartbeat)\n"
                              "# TYPE epd_router_worker_quarantined gauge\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD) {
            epd_router_text_printf(
                t, "epd_router_worker_quarantined{worker=\"%s\",pool=\"%s\"} %u\n",
                w->info.worker_id, epd_router_pool_name(epd_router_pool_of(w->info.role)),
                w->hb_quarantined);
        }
    }
    epd_router_text_printf(t, "# HELP epd_router_worker_late_writes_refused_total Writes a worker "
                              "refused: from a retired writer, or outside what it was granted "
                              "(its last heartbeat; per incarnation)\n"
                              "# TYPE epd_router_worker_late_writes_refused_total counter\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD) {
            epd_router_text_printf(
                t, "epd_router_worker_late_writes_refused_total{worker=\"%s\",pool=\"%s\"} %llu\n",
                w->info.worker_id, epd_router_pool_name(epd_router_pool_of(w->info.role)),
                (unsigned long long)w->hb_late_writes_refused);
        }
    }
    epd_router_text_printf(t, "# HELP epd_router_worker_grants_held Retired writers a worker waits "
                              "on: they may still write without its check until their process "
                              "ends or they confirm (its last heartbeat)\n"
                              "# TYPE epd_router_worker_grants_held gauge\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD) {
            epd_router_text_printf(
                t, "epd_router_worker_grants_held{worker=\"%s\",pool=\"%s\"} %u\n",
                w->info.worker_id, epd_router_pool_name(epd_router_pool_of(w->info.role)),
                w->hb_grants_held);
        }
    }
    epd_router_text_printf(t, "# HELP epd_router_worker_preemptions_total Requests a decode "
                              "worker preempted for KV room (its last heartbeat; per "
                              "incarnation)\n"
                              "# TYPE epd_router_worker_preemptions_total counter\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD && w->info.role == EPD_CLIENT_ROLE_DECODE) {
            epd_router_text_printf(t, "epd_router_worker_preemptions_total{worker=\"%s\"} %llu\n",
                                   w->info.worker_id, (unsigned long long)w->hb_preemptions);
        }
    }
    /* the autoscalers' signals (deploy/k8s): decode KV usage needs the
     * total beside the free count; prefill backlog is queued prompt tokens */
    epd_router_text_printf(t, "# HELP epd_router_worker_kv_blocks KV blocks of a decode "
                              "worker (its registration)\n"
                              "# TYPE epd_router_worker_kv_blocks gauge\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD && w->info.role == EPD_CLIENT_ROLE_DECODE) {
            epd_router_text_printf(t, "epd_router_worker_kv_blocks{worker=\"%s\"} %u\n",
                                   w->info.worker_id, w->info.kv_blocks_total);
        }
    }
    epd_router_text_printf(t, "# HELP epd_router_worker_queued_tokens Prompt tokens waiting on a "
                              "prefill worker (its last heartbeat)\n"
                              "# TYPE epd_router_worker_queued_tokens gauge\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD && w->info.role == EPD_CLIENT_ROLE_PREFILL) {
            epd_router_text_printf(t, "epd_router_worker_queued_tokens{worker=\"%s\"} %llu\n",
                                   w->info.worker_id, (unsigned long long)w->hb_queued_tokens);
        }
    }
    epd_router_text_printf(t, "# HELP epd_router_worker_kv_bytes_total KV bytes a worker moved "
                              "over the data plane (its last heartbeat; per incarnation)\n"
                              "# TYPE epd_router_worker_kv_bytes_total counter\n");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD) {
            int dec = w->info.role == EPD_CLIENT_ROLE_DECODE;

            epd_router_text_printf(
                t,
                "epd_router_worker_kv_bytes_total{worker=\"%s\",pool=\"%s\",direction=\"%s\"} "
                "%llu\n",
                w->info.worker_id, dec ? "decode" : "prefill", dec ? "received" : "sent",
                (unsigned long long)(dec ? w->hb_kv_bytes_received : w->hb_kv_bytes_sent));
        }
    }
    return t->failed ? EPD_ERR_NO_MEMORY : EPD_OK;
}

void epd_router_drain_sample(epd_router_drain_t *d, uint64_t ok, uint64_t now_ns)
{
    double dt, rate;

    if (d->t_ns == 0 || now_ns < d->t_ns || ok < d->ok) {
        d->t_ns = now_ns;
        d->ok = ok;
        return;
    }
    dt = (double)(now_ns - d->t_ns) / 1e9;
    if (dt < 1.0) {
        return;
    }
    rate = (double)(ok - d->ok) / dt;
    /* a window with nothing finished while the rate is known: the pools
     * may be stalled, or idle; either way the old rate decays */
    d->per_s = d->per_s > 0 ? 0.7 * d->per_s + 0.3 * rate : rate;
    d->t_ns = now_ns;
    d->ok = ok;
}

uint32_t epd_router_drain_retry_ms(const epd_router_drain_t *d, uint32_t n_waiting)
{
    double ms;

    if (!(d->per_s > 0)) {
        return 1000;
    }
    ms = ((double)n_waiting + 1.0) / d->per_s * 1000.0;
    return ms < 1000.0 ? 1000 : ms > 60000.0 ? 60000 : (uint32_t)ms;
}
