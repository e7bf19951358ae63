/*
 * epd_router_metrics.h — the router's counters and latency histograms,
 * rendered as Prometheus text (GET /metrics).
 *
 * Histograms have fixed buckets (seconds, 100 µs .. 60 s), so observing is
 * a short scan and two additions: no allocation on the request path.
 * Per-worker gauges (state, load) come from the registry at render time.
 *
 * Threads: the router's loop thread only.
 */
#ifndef EPD_ROUTER_METRICS_H
#define EPD_ROUTER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "epd_http.h"
#include "epd_prom.h"
#include "epd_router_registry.h"
#include "epd_registrar.h"
#include "epd_status.h"

#define EPD_ROUTER_HISTO_BUCKETS 20

typedef struct {
    uint64_t counts[EPD_ROUTER_HISTO_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} epd_router_histo_t;

/* Why a request ended badly (the "kind" label of epd_router_errors_total). */
typedef enum {
    EPD_ROUTER_ERR_BAD_REQUEST = 0, /* 4xx: the client's input */
    EPD_ROUTER_ERR_NO_WORKERS,      /* 503: no READY prefill or decode */
    EPD_ROUTER_ERR_UPSTREAM,        /* a worker failed / refused (after retries) */
    EPD_ROUTER_ERR_TIMEOUT,         /* the request's deadline */
    EPD_ROUTER_ERR_CLIENT_GONE,     /* the HTTP client disconnected */
    EPD_ROUTER_ERR_INTERNAL,        /* out of memory, detokenize failure */
    EPD_ROUTER_ERR_OVERLOADED,      /* 429: no room in the pools within the queue's bounds */
    EPD_ROUTER_ERR_KINDS
} epd_router_err_kind_t;

/* Where a request's time to first token went (rule 38): the phases of
 * epd_router_ttft_phase_seconds, in causal order; their sum per request
 * is its TTFT (MESSAGES is what the others leave: message latencies
 * between the daemons and the router's own reading). */
typedef enum {
    EPD_ROUTER_PHASE_QUEUE = 0,    /* router: arrival -> the serving attempt submitted */
    EPD_ROUTER_PHASE_ENCODE,       /* encoder: images encoded and landed at prefill */
    EPD_ROUTER_PHASE_PREFILL_QUEUE, /* prefill: waiting for the compute thread */
    EPD_ROUTER_PHASE_PREFILL_COMPUTE, /* prefill: the run */
    EPD_ROUTER_PHASE_KV_TRANSFER,  /* compute done -> decode holds the KV (the tail) */
    EPD_ROUTER_PHASE_HANDOFF,      /* decode: the KV held -> first token posted */
    EPD_ROUTER_PHASE_MESSAGES,     /* the rest: request-plane message latencies */
    EPD_ROUTER_PHASES
} epd_router_phase_t;

typedef struct {
    uint64_t requests[2][2]; /* [completion=0/chat=1][stream] accepted for generation */
    uint64_t http_requests;  /* every HTTP request */
    uint64_t ok;             /* generations finished (stop/length) */
    uint64_t errors[EPD_ROUTER_ERR_KINDS];
    uint64_t retries;
    uint64_t migrations; /* streams that went on from another pair (rule 37) */
    uint64_t prompt_tokens;
    uint64_t completion_tokens;
    uint64_t registrations;
    uint64_t heartbeats;
    uint64_t workers_died;
    /* data plane, summed from the workers' heartbeats (increments of each
     * incarnation's monotonic counters, so they survive worker restarts) */
    uint64_t kv_bytes_sent;     /* written by prefill workers */
    uint64_t kv_bytes_received; /* received and verified by decode workers */
    /* overload: decode workers' preemptions and the tokens recomputed to
     * resume them, prefill workers' compute no decode worker took (all
     * from heartbeats, like the data plane's); the router's own queue */
    uint64_t preemptions;
    uint64_t recomputed_tokens;
    uint64_t wasted_prefill_tokens;
    uint64_t rejected_queue_full;    /* 429: the queue held --max-queue requests */
    uint64_t rejected_queue_timeout; /* 429: no room within --queue-timeout-ms */
    uint64_t capacity_retries;       /* attempts refused for room, sent again after a backoff */
    uint64_t no_worker_waits;        /* requests that found no usable pair and waited for one */
    uint64_t no_worker_timeouts;     /* ... of which none came within --no-worker-wait-ms: 503 */
    uint32_t queue_depth;            /* requests waiting for room now (set before a render) */
    /* the prefill workers' prefix caches, summed the same way (the two
     * gauges at the end stay 0: per worker below) */
    epd_prefix_stats_t prefix;
    epd_prefix_stats_t dprefix; /* the decode workers' (decode-side reuse) */
    /* images: where their embeddings came from, counted once an attempt
     * got its first token; stale = a cache hint the prefill worker
     * disproved (retried with an encoder) */
    uint64_t images;
    uint64_t image_cache_hits;
    uint64_t images_encoded;
    uint64_t images_local;
    uint64_t image_cache_stale;
    uint64_t image_bytes;
    epd_router_histo_t ttft;     /* arrival → first token out */
    epd_router_histo_t itl;      /* between token chunks */
    epd_router_histo_t e2e;      /* arrival → last byte */
    epd_router_histo_t dispatch; /* arrival → submitted to the workers (router's own work) */
    epd_router_histo_t no_worker_wait; /* a wait for a usable pair, when it ended */
    /* TTFT taken apart (rule 38), one observation each per request that
     * got its first token (as ttft); `model` labels them */
    const char *model;
    epd_prom_histo_t phase[EPD_ROUTER_PHASES];
    epd_prom_histo_t req_prompt_tokens; /* per request (tokens) */
    epd_prom_histo_t req_cached_tokens; /* of those, prefix-cache hits at prefill */
    uint64_t cached_tokens;             /* their total */
    uint64_t phase_times_missing;       /* first tokens without phase times (older worker) */
    /* the front door: the HTTP server's own counts (epd_http_server_stats),
     * copied in before each render */
    epd_http_stats_t http;
} epd_router_metrics_t;

void epd_router_histo_observe(epd_router_histo_t *h, double seconds);

/* Zeroes the rule-38 histograms and sets the model label (borrowed). */
void epd_router_metrics_init(epd_router_metrics_t *m, const char *model);

/* The name and pool of phase p (labels). */
const char *epd_router_phase_name(epd_router_phase_t p);
const char *epd_router_phase_pool(epd_router_phase_t p);

/* A growable text buffer (epd_malloc'ed data, NUL terminated). */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
    int failed; /* an append ran out of memory */
} epd_router_text_t;

void epd_router_text_printf(epd_router_text_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void epd_router_text_cleanup(epd_router_text_t *t);

/* How fast the queue drains: generations finished per second, an EWMA
 * over windows of at least a second (epd_router_drain_sample, from the
 * tick), and from it when a client refused with 429 should come back. */
typedef struct {
    uint64_t t_ns; /* the current window's start (0: none yet) */
    uint64_t ok;   /* metrics.ok at its start */
    double per_s;  /* 0 until a window with a finished generation closed */
} epd_router_drain_t;

void epd_router_drain_sample(epd_router_drain_t *d, uint64_t ok, uint64_t now_ns);

/* The wait (ms) a 429 advertises with n_waiting requests in line: what
 * they take to drain at the measured rate, within [1 s, 60 s]; 1 s before
 * anything was measured. */
uint32_t epd_router_drain_retry_ms(const epd_router_drain_t *d, uint32_t n_waiting);

/* Renders every metric into `out` (appended), every sample labelled
 * model="<m->model>" first (escaped; "" when NULL), then its own labels
 * (worker ids escaped too).  `live` is the number of requests the router
 * holds now.  EPD_OK or EPD_ERR_NO_MEMORY. */
epd_status_t epd_router_metrics_render(const epd_router_metrics_t *m,
                                       const epd_router_registry_t *reg, uint32_t live,
                                       epd_router_text_t *out);

#endif
