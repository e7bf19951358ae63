/*
 * epd_router_metrics.c — counters, histograms, Prometheus text format
 * (version 0.0.4) rendering (see epd_router_metrics.h).
 */
#include "epd_router_metrics.h"

#include <stdarg.h>
#include <stdatomic.h>
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

/* The rule-38 families (TTFT taken apart, tokens per request). */
static void epd_router_metrics_phases(epd_prom_text_t *p, const epd_router_metrics_t *m)
{
    const char *model = m->model != NULL ? m->model : "";
    char extra[96];

    epd_prom_family(p, "epd_router_ttft_phase_seconds", "histogram",
                    "Time to first token taken apart, per request: queue (router), encode, "
                    "prefill_queue, prefill_compute, kv_transfer (compute done to decode holding "
                    "the KV), first_token_handoff, messages (the rest: message latencies); the "
                    "phases of a request sum to its TTFT");
    for (int i = 0; i < EPD_ROUTER_PHASES; i++) {
        snprintf(extra, sizeof(extra), "pool=\"%s\",phase=\"%s\"",
                 epd_router_phase_pool((epd_router_phase_t)i),
                 epd_router_phase_name((epd_router_phase_t)i));
        epd_prom_histo(p, "epd_router_ttft_phase_seconds", model, extra, &m->phase[i]);
    }
    epd_prom_family(p, "epd_router_request_prompt_tokens", "histogram",
                    "Prompt tokens per request that got its first token");
    epd_prom_histo(p, "epd_router_request_prompt_tokens", model, NULL, &m->req_prompt_tokens);
    epd_prom_family(p, "epd_router_request_cached_tokens", "histogram",
                    "Prompt tokens per request that prefill's prefix cache served");
    epd_prom_histo(p, "epd_router_request_cached_tokens", model, NULL, &m->req_cached_tokens);
    epd_prom_counter(p, "epd_router_cached_tokens_total",
                     "Prompt tokens prefill's prefix cache served (requests that got their first "
                     "token)",
                     model, m->cached_tokens);
    epd_prom_counter(p, "epd_router_phase_times_missing_total",
                     "First tokens that came without phase times (a worker older than rule 38): "
                     "their phases count as messages",
                     model, m->phase_times_missing);
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

/*
 * Every router series carries model="..." first (the name the router
 * serves, escaped by epd_prom), then its own labels, like the workers'
 * /metrics: one scrape config and one dashboard filter fit every daemon.
 * The samples are written into an epd_prom_text_t and appended to the
 * caller's buffer at the end.
 */

/* `s` escaped as a label value (backslash, double quote, newline) into
 * out[cap]; cut short (still a valid escape) when out is too small. */
static void epd_router_metrics_escape(char *out, size_t cap, const char *s)
{
    size_t n = 0;

    for (; *s != '\0'; s++) {
        const char *e = *s == '\\' ? "\\\\" : *s == '"' ? "\\\"" : *s == '\n' ? "\\n" : NULL;
        size_t len = e != NULL ? 2 : 1;

        if (n + len >= cap) {
            break;
        }
        if (e != NULL) {
            memcpy(out + n, e, 2);
        } else {
            out[n] = *s;
        }
        n += len;
    }
    out[n] = '\0';
}

/* worker="ID"[,pool="POOL"] (the id escaped) into out[cap]. */
static const char *epd_router_metrics_worker(char *out, size_t cap, const epd_router_worker_t *w,
                                             int with_pool)
{
    char id[2 * EPD_CLIENT_NAME_MAX];

    epd_router_metrics_escape(id, sizeof(id), w->info.worker_id);
    if (with_pool) {
        snprintf(out, cap, "worker=\"%s\",pool=\"%s\"", id,
                 epd_router_pool_name(epd_router_pool_of(w->info.role)));
    } else {
        snprintf(out, cap, "worker=\"%s\"", id);
    }
    return out;
}

/* A router histogram (the same bounds as EPD_PROM_SECONDS) through
 * epd_prom_histo, so its samples are labelled like every other. */
static void epd_router_metrics_histo(epd_prom_text_t *p, const char *model, const char *name,
                                     const char *help, const epd_router_histo_t *h)
{
    epd_prom_histo_t ph;

    epd_prom_histo_init(&ph, EPD_PROM_SECONDS);
    for (size_t i = 0; i <= EPD_ROUTER_HISTO_BUCKETS; i++) {
        atomic_store_explicit(&ph.counts[i], h->counts[i], memory_order_relaxed);
    }
    atomic_store_explicit(&ph.sum, h->sum, memory_order_relaxed);
    epd_prom_family(p, name, "histogram", help);
    epd_prom_histo(p, name, model, NULL, &ph);
}

/* A family of one gauge sample with an integer value. */
static void epd_router_metrics_gauge_u64(epd_prom_text_t *p, const char *model, const char *name,
                                         const char *help, uint64_t v)
{
    epd_prom_family(p, name, "gauge", help);
    epd_prom_sample_u64(p, name, model, NULL, v);
}

/* The prefill workers' prefix caches: the totals of their counters, the
 * hit ratio, each worker's size now (epd_prefix_stats_t's words in order). */
static void epd_router_metrics_prefix(epd_prom_text_t *p, const char *model,
                                      const epd_router_registry_t *reg,
                                      const epd_prefix_stats_t *ps)
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
    char name[96], lab[3 * EPD_CLIENT_NAME_MAX];

    memcpy(v, ps, sizeof(v));
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(name, sizeof(name), "epd_router_prefix_%s_total", names[i][0]);
        epd_prom_counter(p, name, names[i][1], model, v[i]);
    }
    /* the host/disk tier: counters (words 12..19), then its two gauges */
    static const char *const tier[][2] = {
        {"tier_stored", "KV blocks evicted from a prefill pool stored in its host tier"},
        {"tier_spilled", "KV blocks the host tiers spilled to disk"},
        {"tier_restored_host", "KV blocks restored from a host tier"},
        {"tier_restored_disk", "KV blocks restored from a disk tier"},
        {"tier_restore_us",
         "Microseconds spent restoring tier blocks (reads, decompression, checks)"},
        {"tier_checksum_failures", "Tier blocks that failed their checksum: not used, recomputed"},
        {"tier_refused_files", "Disk tier files refused (corrupt, truncated, another model's)"},
        {"tier_dropped", "Tier blocks dropped for room with nowhere to go"},
    };
    for (size_t i = 0; i < sizeof(tier) / sizeof(tier[0]); i++) {
        if (strcmp(tier[i][0], "tier_restore_us") == 0) {
            /* Prometheus wants base units: seconds, from the workers' µs */
            epd_prom_family(p, "epd_router_prefix_tier_restore_seconds_total", "counter",
                            "Seconds spent restoring tier blocks (reads, decompression, checks)");
            epd_prom_sample(p, "epd_router_prefix_tier_restore_seconds_total", model, NULL,
                            (double)v[12 + i] / 1e6);
            continue;
        }
        snprintf(name, sizeof(name), "epd_router_prefix_%s_total", tier[i][0]);
        epd_prom_counter(p, name, tier[i][1], model, v[12 + i]);
    }
    epd_prom_family(p, "epd_router_prefix_tier_bytes", "gauge",
                    "Bytes the prefill workers' KV tiers hold (their last heartbeats)");
    {
        uint64_t hb = 0, db = 0;

        for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
            if (w->state != EPD_ROUTER_DEAD && w->info.role == EPD_CLIENT_ROLE_PREFILL) {
                hb += w->hb_prefix.tier_host_bytes;
                db += w->hb_prefix.tier_disk_bytes;
            }
        }
        epd_prom_sample_u64(p, "epd_router_prefix_tier_bytes", model, "tier=\"host\"", hb);
        epd_prom_sample_u64(p, "epd_router_prefix_tier_bytes", model, "tier=\"disk\"", db);
    }
    epd_prom_gauge(p, "epd_router_prefix_hit_ratio",
                   "Hit tokens over prompt tokens of the prefill workers' prefix caches", model,
                   ps->prompt_tokens > 0 ? (double)ps->hit_tokens / (double)ps->prompt_tokens
                                         : 0.0);
    epd_prom_family(p, "epd_router_worker_prefix_cached_blocks", "gauge",
                    "KV blocks a prefill worker's prefix cache holds (its last heartbeat)");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD && w->info.role == EPD_CLIENT_ROLE_PREFILL) {
            epd_prom_sample_u64(p, "epd_router_worker_prefix_cached_blocks", model,
                                epd_router_metrics_worker(lab, sizeof(lab), w, 0),
                                w->hb_prefix.cached_blocks);
        }
    }
}

static const char *const epd_router_err_names[EPD_ROUTER_ERR_KINDS] = {
    "bad_request", "no_workers", "upstream", "timeout", "client_gone", "internal", "overloaded",
};

/* Which workers a per-worker family lists. */
enum { EPD_RM_ANY = 0, EPD_RM_PREFILL, EPD_RM_DECODE };

/* What a per-worker family reports of a worker. */
typedef enum {
    EPD_RM_QUEUE_DEPTH = 0,
    EPD_RM_IN_FLIGHT,
    EPD_RM_SERVED,
    EPD_RM_KV_FREE,
    EPD_RM_QUARANTINED,
    EPD_RM_LATE_WRITES,
    EPD_RM_GRANTS,
    EPD_RM_PREEMPTIONS,
    EPD_RM_KV_BLOCKS,
    EPD_RM_QUEUED_TOKENS,
} epd_rm_field_t;

static uint64_t epd_router_metrics_value(const epd_router_worker_t *w, epd_rm_field_t f)
{
    switch (f) {
    case EPD_RM_QUEUE_DEPTH:
        return w->hb_queue_depth;
    case EPD_RM_IN_FLIGHT:
        return w->inflight;
    case EPD_RM_SERVED:
        return w->served;
    case EPD_RM_KV_FREE:
        return w->hb_kv_blocks_free;
    case EPD_RM_QUARANTINED:
        return w->hb_quarantined;
    case EPD_RM_LATE_WRITES:
        return w->hb_late_writes_refused;
    case EPD_RM_GRANTS:
        return w->hb_grants_held;
    case EPD_RM_PREEMPTIONS:
        return w->hb_preemptions;
    case EPD_RM_KV_BLOCKS:
        return w->info.kv_blocks_total;
    case EPD_RM_QUEUED_TOKENS:
        return w->hb_queued_tokens;
    }
    return 0;
}

/* A per-worker gauge or counter family: one sample per live worker the
 * filter admits, labelled worker= (and pool= when with_pool). */
static void epd_router_metrics_workers(epd_prom_text_t *p, const char *model,
                                       const epd_router_registry_t *reg, const char *name,
                                       const char *type, const char *help, int which, int with_pool,
                                       epd_rm_field_t field)
{
    char lab[3 * EPD_CLIENT_NAME_MAX];

    epd_prom_family(p, name, type, help);
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state == EPD_ROUTER_DEAD ||
            (which == EPD_RM_PREFILL && w->info.role != EPD_CLIENT_ROLE_PREFILL) ||
            (which == EPD_RM_DECODE && w->info.role != EPD_CLIENT_ROLE_DECODE)) {
            continue;
        }
        epd_prom_sample_u64(p, name, model,
                            epd_router_metrics_worker(lab, sizeof(lab), w, with_pool),
                            epd_router_metrics_value(w, field));
    }
}

/* The per-worker families (the registry's view and the workers' last
 * heartbeats). */
static void epd_router_metrics_per_worker(epd_prom_text_t *p, const char *model,
                                          const epd_router_registry_t *reg)
{
    char lab[3 * EPD_CLIENT_NAME_MAX + 32];

    epd_router_metrics_workers(p, model, reg, "epd_router_worker_queue_depth", "gauge",
                               "Requests waiting on a worker (its last heartbeat)", EPD_RM_ANY, 1,
                               EPD_RM_QUEUE_DEPTH);
    epd_router_metrics_workers(p, model, reg, "epd_router_worker_in_flight", "gauge",
                               "Requests the router has on a worker", EPD_RM_ANY, 1,
                               EPD_RM_IN_FLIGHT);
    epd_router_metrics_workers(p, model, reg, "epd_router_worker_requests_total", "counter",
                               "Requests the router sent to a worker", EPD_RM_ANY, 1,
                               EPD_RM_SERVED);
    epd_prom_family(p, "epd_router_worker_kv_hints", "gauge",
                    "KV blocks the router believes a worker holds (KV-aware routing: its "
                    "heartbeats' hints and the prompts sent to it)");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD && w->hints != NULL && w->has_root) {
            epd_prom_sample_u64(p, "epd_router_worker_kv_hints", model,
                                epd_router_metrics_worker(lab, sizeof(lab), w, 1),
                                epd_router_hints_count(w->hints));
        }
    }
    epd_router_metrics_workers(p, model, reg, "epd_router_worker_kv_blocks_free", "gauge",
                               "Free KV blocks of a decode worker (its last heartbeat)",
                               EPD_RM_DECODE, 0, EPD_RM_KV_FREE);
    /* the fence (proto/README.md "Late writes: the fence") */
    epd_router_metrics_workers(p, model, reg, "epd_router_worker_quarantined", "gauge",
                               "Memory a worker holds for writers that may still write into it: "
                               "decode KV blocks, prefill embedding slots (its last heartbeat)",
                               EPD_RM_ANY, 1, EPD_RM_QUARANTINED);
    epd_router_metrics_workers(p, model, reg, "epd_router_worker_late_writes_refused_total",
                               "counter",
                               "Writes a worker refused: from a retired writer, or outside what "
                               "it was granted (its last heartbeat; per incarnation)",
                               EPD_RM_ANY, 1, EPD_RM_LATE_WRITES);
    epd_router_metrics_workers(p, model, reg, "epd_router_worker_grants_held", "gauge",
                               "Retired writers a worker waits on: they may still write without "
                               "its check until their process ends or they confirm (its last "
                               "heartbeat)",
                               EPD_RM_ANY, 1, EPD_RM_GRANTS);
    epd_router_metrics_workers(p, model, reg, "epd_router_worker_preemptions_total", "counter",
                               "Requests a decode worker preempted for KV room (its last "
                               "heartbeat; per incarnation)",
                               EPD_RM_DECODE, 0, EPD_RM_PREEMPTIONS);
    /* the autoscalers' signals (deploy/k8s): decode KV usage needs the
     * total beside the free count; prefill backlog is queued prompt tokens */
    epd_router_metrics_workers(p, model, reg, "epd_router_worker_kv_blocks", "gauge",
                               "KV blocks of a decode worker (its registration)", EPD_RM_DECODE, 0,
                               EPD_RM_KV_BLOCKS);
    epd_router_metrics_workers(p, model, reg, "epd_router_worker_queued_tokens", "gauge",
                               "Prompt tokens waiting on a prefill worker (its last heartbeat)",
                               EPD_RM_PREFILL, 0, EPD_RM_QUEUED_TOKENS);
    epd_prom_family(p, "epd_router_worker_kv_bytes_total", "counter",
                    "KV bytes a worker moved over the data plane (its last heartbeat; per "
                    "incarnation)");
    for (const epd_router_worker_t *w = reg->workers; w != NULL; w = w->next) {
        if (w->state != EPD_ROUTER_DEAD) {
            int dec = w->info.role == EPD_CLIENT_ROLE_DECODE;
            char id[2 * EPD_CLIENT_NAME_MAX];

            epd_router_metrics_escape(id, sizeof(id), w->info.worker_id);
            snprintf(lab, sizeof(lab), "worker=\"%s\",pool=\"%s\",direction=\"%s\"", id,
                     dec ? "decode" : "prefill", dec ? "received" : "sent");
            epd_prom_sample_u64(p, "epd_router_worker_kv_bytes_total", model, lab,
                                dec ? w->hb_kv_bytes_received : w->hb_kv_bytes_sent);
        }
    }
}

epd_status_t epd_router_metrics_render(const epd_router_metrics_t *m,
                                       const epd_router_registry_t *reg, uint32_t live,
                                       epd_router_text_t *t)
{
    static const char *const kinds[2] = {"completions", "chat"};
    static const char *const limits[] = {
        "max_connections", "per_address",  "body_budget",       "header_timeout", "body_size",
        "header_size",     "http_version", "transfer_encoding", "host_header",    "malformed",
    };
    const uint64_t refused[] = {
        m->http.refused_max_conns, m->http.refused_per_addr,  m->http.refused_body_budget,
        m->http.header_timeouts,   m->http.refused_body_size, m->http.refused_header_size,
        m->http.refused_version,   m->http.refused_encoding,  m->http.refused_host,
        m->http.refused_malformed,
    };
    const char *model = m->model != NULL ? m->model : "";
    epd_prom_text_t p = {0};
    uint32_t counts[EPD_ROUTER_POOLS][5];
    char lab[96];

    epd_prom_counter(&p, "epd_router_http_requests_total", "HTTP requests received", model,
                     m->http_requests);
    epd_prom_family(&p, "epd_router_requests_total", "counter", "Generation requests accepted");
    for (int k = 0; k < 2; k++) {
        for (int s = 0; s < 2; s++) {
            snprintf(lab, sizeof(lab), "api=\"%s\",stream=\"%s\"", kinds[k], s ? "true" : "false");
            epd_prom_sample_u64(&p, "epd_router_requests_total", model, lab, m->requests[k][s]);
        }
    }
    epd_prom_counter(&p, "epd_router_requests_ok_total", "Generations finished (stop or length)",
                     model, m->ok);
    epd_prom_family(&p, "epd_router_errors_total", "counter", "Requests that ended in an error");
    for (int e = 0; e < EPD_ROUTER_ERR_KINDS; e++) {
        snprintf(lab, sizeof(lab), "kind=\"%s\"", epd_router_err_names[e]);
        epd_prom_sample_u64(&p, "epd_router_errors_total", model, lab, m->errors[e]);
    }
    epd_prom_counter(&p, "epd_router_http_auth_failures_total",
                     "HTTP requests refused 401: no API key, or not one of the keys", model,
                     m->http.auth_failures);
    epd_prom_family(&p, "epd_router_http_refused_total", "counter",
                    "HTTP connections and requests refused by a limit of the front door");
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        snprintf(lab, sizeof(lab), "limit=\"%s\"", limits[i]);
        epd_prom_sample_u64(&p, "epd_router_http_refused_total", model, lab, refused[i]);
    }
    epd_router_metrics_gauge_u64(&p, model, "epd_router_http_connections", "HTTP connections open",
                                 m->http.connections);
    epd_router_metrics_gauge_u64(&p, model, "epd_router_http_buffered_body_bytes",
                                 "Request body bytes held (counted against "
                                 "--max-buffered-body-bytes)",
                                 m->http.buffered_body_bytes);
    epd_prom_counter(&p, "epd_router_retries_total", "Requests sent again to another worker", model,
                     m->retries);
    epd_prom_counter(&p, "epd_router_migrations_total",
                     "Streams cut after some tokens that went on from another prefill and decode "
                     "worker (proto/README.md rule 37)",
                     model, m->migrations);
    epd_prom_counter(&p, "epd_router_capacity_retries_total",
                     "Attempts refused for room (KV or prefill pool full), sent again after a "
                     "backoff",
                     model, m->capacity_retries);
    epd_prom_counter(&p, "epd_router_no_worker_waits_total",
                     "Requests that found no usable prefill and decode pair and waited for one "
                     "(--no-worker-wait-ms)",
                     model, m->no_worker_waits);
    epd_prom_counter(&p, "epd_router_no_worker_timeouts_total",
                     "Requests answered 503 after waiting --no-worker-wait-ms for a usable pair",
                     model, m->no_worker_timeouts);
    epd_router_metrics_gauge_u64(&p, model, "epd_router_queue_depth",
                                 "Requests waiting for room in the pools", m->queue_depth);
    epd_prom_family(&p, "epd_router_rejected_total", "counter",
                    "Requests answered 429 (Retry-After)");
    epd_prom_sample_u64(&p, "epd_router_rejected_total", model, "reason=\"queue_full\"",
                        m->rejected_queue_full);
    epd_prom_sample_u64(&p, "epd_router_rejected_total", model, "reason=\"queue_timeout\"",
                        m->rejected_queue_timeout);
    epd_prom_counter(&p, "epd_router_decode_preemptions_total",
                     "Requests decode workers preempted for KV room (from their heartbeats)", model,
                     m->preemptions);
    epd_prom_counter(&p, "epd_router_decode_recomputed_tokens_total",
                     "Tokens prefilled again to resume preempted requests (from the decode "
                     "workers' heartbeats)",
                     model, m->recomputed_tokens);
    epd_prom_counter(&p, "epd_router_prefill_wasted_tokens_total",
                     "Prompt tokens prefill workers computed for requests whose KV no decode "
                     "worker took, by the layers that ran (from their heartbeats)",
                     model, m->wasted_prefill_tokens);
    epd_prom_counter(&p, "epd_router_prompt_tokens_total", "Prompt tokens (BOS included)", model,
                     m->prompt_tokens);
    epd_prom_counter(&p, "epd_router_completion_tokens_total", "Tokens generated", model,
                     m->completion_tokens);
    epd_prom_counter(&p, "epd_router_registrations_total", "RegisterWorker calls accepted", model,
                     m->registrations);
    epd_prom_counter(&p, "epd_router_heartbeats_total", "Heartbeats received", model,
                     m->heartbeats);
    epd_prom_counter(&p, "epd_router_workers_died_total", "Workers whose endpoint failed", model,
                     m->workers_died);
    epd_prom_counter(&p, "epd_router_kv_bytes_sent_total",
                     "KV and recurrent-state bytes prefill workers wrote to decode workers (from "
                     "their heartbeats)",
                     model, m->kv_bytes_sent);
    epd_prom_counter(&p, "epd_router_kv_bytes_received_total",
                     "KV bytes decode workers received and verified (from their heartbeats)", model,
                     m->kv_bytes_received);
    epd_router_metrics_prefix(&p, model, reg, &m->prefix);
    epd_prom_counter(&p, "epd_router_decode_prefix_requests_total",
                     "Prompts decode workers looked up among the blocks they kept", model,
                     m->dprefix.requests);
    epd_prom_counter(&p, "epd_router_decode_prefix_hit_tokens_total",
                     "Prompt tokens whose KV a decode worker still held, so prefill did not write "
                     "it again (decode-side reuse)",
                     model, m->dprefix.hit_tokens);
    epd_prom_counter(&p, "epd_router_decode_prefix_evictions_total",
                     "Kept blocks decode workers evicted for room", model, m->dprefix.evictions);
    epd_prom_counter(&p, "epd_router_images_total", "Images of requests that got their first token",
                     model, m->images);
    epd_prom_counter(&p, "epd_router_image_bytes_total", "Encoded bytes of the images received",
                     model, m->image_bytes);
    epd_prom_counter(&p, "epd_router_image_cache_hits_total",
                     "Images whose embeddings a prefill worker had cached (no encoder involved)",
                     model, m->image_cache_hits);
    epd_prom_counter(&p, "epd_router_images_encoded_total", "Images encoded by the encoder pool",
                     model, m->images_encoded);
    epd_prom_counter(&p, "epd_router_images_local_total",
                     "Images encoded by the prefill worker itself (no encoder available)", model,
                     m->images_local);
    epd_prom_counter(&p, "epd_router_image_cache_stale_total",
                     "Cache hints a prefill worker disproved (the request went again with an "
                     "encoder)",
                     model, m->image_cache_stale);
    epd_prom_gauge(&p, "epd_router_image_cache_hit_ratio", "Image cache hits over images", model,
                   m->images > 0 ? (double)m->image_cache_hits / (double)m->images : 0.0);
    epd_router_metrics_gauge_u64(&p, model, "epd_router_requests_in_flight",
                                 "Requests held by the router", live);
    epd_router_metrics_histo(&p, model, "epd_router_ttft_seconds",
                             "Time from request arrival to the first token", &m->ttft);
    epd_router_metrics_histo(&p, model, "epd_router_itl_seconds",
                             "Time between token chunks of a request", &m->itl);
    epd_router_metrics_histo(&p, model, "epd_router_e2e_seconds",
                             "Time from request arrival to its end", &m->e2e);
    epd_router_metrics_histo(&p, model, "epd_router_dispatch_seconds",
                             "Router's own time from request arrival to submission to the workers",
                             &m->dispatch);
    epd_router_metrics_phases(&p, m);
    epd_router_metrics_histo(&p, model, "epd_router_no_worker_wait_seconds",
                             "Time a request waited for a usable prefill and decode pair (served "
                             "or answered 503)",
                             &m->no_worker_wait);

    epd_router_registry_counts(reg, counts);
    epd_prom_family(&p, "epd_router_workers", "gauge", "Workers per pool and state");
    for (int r = 0; r < EPD_ROUTER_POOLS; r++) {
        for (int s = 1; s <= 4; s++) {
            snprintf(lab, sizeof(lab), "pool=\"%s\",state=\"%s\"", epd_router_pool_name(r),
                     epd_router_state_name((epd_router_state_t)s));
            epd_prom_sample_u64(&p, "epd_router_workers", model, lab, counts[r][s]);
        }
    }
    epd_router_metrics_per_worker(&p, model, reg);
    if (p.failed) {
        t->failed = 1;
    } else if (p.data != NULL) {
        epd_router_text_printf(t, "%s", p.data);
    }
    epd_prom_text_cleanup(&p);
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
