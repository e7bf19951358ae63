/*
 * epd_bench_serve_int.h — what the files of `epd-bench serve` share: the
 * workload (sv_work_t), one request's result (sv_res_t), one phase's
 * results (sv_phase_t) and the benchmark's state (sv_t).  The files, each
 * calling only those listed after it (tests/tree/test_layers.sh):
 *   epd_bench_serve.c          options, the phases' loop, the direct path
 *   epd_bench_serve_http.c     the router path's requests and streams
 *                              (on epd_bench_sse.c)
 *   epd_bench_serve_cluster.c  the own cluster, the router's /metrics
 *   epd_bench_serve_load.c     the workload: arrivals, prompts, images, tokens
 *   epd_bench_serve_stats.c    errors and token events recorded, the table
 * Internal to bench/: one thread (the benchmark's; the phases run on its
 * libuv loop).
 */
#ifndef EPD_BENCH_SERVE_INT_H
#define EPD_BENCH_SERVE_INT_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>
#include <netinet/in.h>

#include <uv.h>

#include "epd_bench_http.h"
#include "epd_client.h"
#include "epd_secret.h"
#include "epd_time.h"
#include "epd_xport_uv.h"

#define SV_TEXT_BYTES (1u << 20)
#define SV_MAX_ERR_KINDS 16

/* ------------------------------------------------------------- workload */

typedef struct {
    uint64_t at_ns; /* arrival, from the phase's start */
    uint32_t text_off, text_len;
    uint32_t max_tokens;
    int32_t image; /* index into the image pool, -1: none */
    int is_long;   /* --long-every: one of the long prompts */
    uint64_t seed;
    int32_t *tokens; /* direct phase: BOS + bytes (tokenized here) */
    uint32_t n_tokens;
} sv_work_t;

typedef struct {
    uint64_t t_send, t_first, t_last, t_end; /* monotonic ns; 0 = not reached */
    uint32_t n_tokens;
    int err; /* index into the phase's error kinds + 1; 0 = ok */
    int done;
    int unused; /* interleaved: this arrival went the other path */
} sv_res_t;

typedef struct {
    char name[48];
    char example[160]; /* the first one's message, when known */
    uint64_t count;
} sv_errkind_t;

typedef struct {
    const char *name;
    sv_res_t *res;
    uint32_t n;
    double *itl_us;
    size_t n_itl, cap_itl;
    sv_errkind_t errs[SV_MAX_ERR_KINDS];
    int n_errs;
    uint64_t dropped;
    uint64_t t0, t_end;
} sv_phase_t;

/* ------------------------------------------------------------ the bench */

typedef struct sv sv_t;

struct sv {
    /* options */
    const char *router;     /* HTTP host:port */
    const char *router_ctl; /* gRPC host:port */
    const char *prefill_ctl, *decode_ctl;
    const char *model_dir;
    const char *engine_name;
    const char *model_name;
    const char *prompt_len, *output_len;
    const char *phases;
    const char *sim_model;
    double rate;
    double duration_s;
    int64_t max_inflight;
    int64_t seed;
    int64_t warmup;
    int chat;
    int keep;
    int64_t n_images;     /* --images: distinct images per path (0: text requests) */
    int64_t image_size;   /* their width and height */
    int64_t long_len;     /* --long-len: bytes of every --long-every'th prompt */
    int64_t long_every;   /* 0: no long prompts */
    int64_t chunk_tokens; /* own cluster: prefill's --prefill-chunk-tokens, -1 default */
    int no_prefix_cache;  /* own cluster: prefill's --no-prefix-cache */
    const char *trace_dir; /* own cluster: each daemon's --trace FILE in this folder */
    char **img_url;       /* [2 * n_images] data: URLs */
    size_t *img_url_len;
    double img0[6], img1[6]; /* the router's image counters before / after */
    char enc_ctl_buf[64];
    /* workload */
    char *text;
    sv_work_t *work;
    uint32_t n_work;
    /* running phase */
    uv_loop_t loop;
    uv_timer_t tick;
    sv_phase_t *hph, *dph; /* the router's and the direct path's results */
    uint64_t t0;
    int mode;           /* 0 router, 1 direct, 2 both interleaved (even: router) */
    uint32_t next;      /* next arrival to launch */
    uint32_t *deferred; /* [n_work] ring: direct submits refused by backpressure */
    uint32_t deferred_head, n_deferred;
    uint32_t inflight;
    uint64_t hard_end;
    struct sockaddr_in addr;
    epd_bench_sse_t *sse; /* the router path's client (epd_bench_sse.c) */
    /* direct */
    epd_client_t *client;
    epd_client_worker_t *pw, *dw;
    epd_xport_uv_t *xuv;
    /* our cluster */
    char tmp[PATH_MAX];
    /* the cluster secret the bench makes for its own daemons (mode 0600 in
     * tmp): the figures are those of an authenticated cluster */
    char secret_file[PATH_MAX + 16];
    epd_secret_t secret;
    char bindir[PATH_MAX];
    pid_t pids[4];
    char router_buf[64], router_ctl_buf[64], p_ctl_buf[64], d_ctl_buf[64];
    char model_buf[PATH_MAX + 16];
    /* the router's epd_router_ttft_seconds over the run (/metrics deltas) */
    double m_sum;
    uint64_t m_count;
};

static inline uint64_t sv_now(void)
{
    return epd_time_now_ns();
}

/* ---- epd_bench_serve_stats.c: results and the table ---- */
/* Counts an error of `kind` for request `r`; `example` (may be NULL) is
 * kept for the first error of the kind. */
void epd__sv_err_ex(sv_phase_t *ph, sv_res_t *r, const char *kind, const char *example);
void epd__sv_err(sv_phase_t *ph, sv_res_t *r, const char *kind);
/* A text event (or chunk) of request `r` arrived at `now`. */
void epd__sv_token_event(sv_phase_t *ph, sv_res_t *r, uint64_t now);
/* Request `r` ended at `now` (once; one less in flight). */
void epd__sv_finish(sv_t *b, sv_res_t *r, uint64_t now);
/* A phase named `name` for b->n_work arrivals.  0 or -1 (no memory). */
int epd__sv_phase_init(sv_t *b, sv_phase_t *ph, const char *name);
/* The table of phases phs[0..n_ph) on stdout (sorts their samples). */
void epd__sv_print(sv_t *b, sv_phase_t *phs, int n_ph);

/* ---- epd_bench_serve_load.c: the workload ---- */
/* b->work, b->text and b->deferred from the options (seeded).  0, or -1
 * after a line on stderr (or out of memory). */
int epd__sv_workload(sv_t *b);
/* 2 x --images distinct PNGs as data: URLs (b->img_url).  0 or -1. */
int epd__sv_images_make(sv_t *b);
void epd__sv_images_free(sv_t *b);
/* Every arrival's token ids (direct path), with the model's tokenizer.
 * 0 or -1. */
int epd__sv_tokenize(sv_t *b);

/* ---- epd_bench_serve_http.c: the router path ---- */
/* The router path's callbacks for epd_bench_sse_create (arg b; on_close
 * left NULL for the caller). */
void epd__sv_http_cbs(sv_t *b, epd_bench_sse_cbs_t *cbs_p);
/* Sends arrival `i` of phase `ph` to the router (b->sse); its end is
 * recorded in ph->res[i]. */
void epd__sv_http_start(sv_t *b, uint32_t i, sv_phase_t *ph);

/* ---- epd_bench_serve_cluster.c: the own cluster, /metrics ---- */
/* Router, prefill, decode (and encoder with --images) from b->bindir in a
 * fresh temp folder; b->router and the workers' addresses set.  0 or -1
 * (said on stderr; what started is stopped by epd__sv_cluster_stop). */
int epd__sv_cluster_start(sv_t *b);
void epd__sv_cluster_stop(sv_t *b);
/* The values of the router's `n` series `names` from GET /metrics
 * (5 s at most): absent ones read 0, how many were there into *found_p
 * (may be NULL).  0, or -1 when /metrics did not answer. */
int epd__sv_metrics_get(const sv_t *b, const char *const *names, int n, double *out, int *found_p);
/* The router's epd_router_ttft_seconds _sum and _count.  0 or -1. */
int epd__sv_metrics_ttft(const sv_t *b, double *sum_p, uint64_t *count_p);
/* The router's image counters the multimodal mix reads (6). */
extern const char *const epd__sv_img_metrics[6];

#endif
