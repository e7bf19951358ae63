/*
 * epd_bench_overhead_int.h — what the files of `epd-bench overhead` share:
 * the benchmark's state (ob_t), one request as the traces tell it
 * (ob_req_t) and one row (ob_row_t).  epd_bench_overhead.c runs the
 * one-host mode (it starts the daemons); epd_bench_overhead_attach.c runs
 * against daemons someone else started, on other hosts (--attach-*).
 * Internal to bench/: one thread (the benchmark's).
 *
 * The files, each calling only those below it:
 *   epd_bench_overhead.c          the one-host mode's main
 *   epd_bench_overhead_attach.c   the attach mode (main and clocks)
 *   epd_bench_overhead_opts.c     options of both modes, engines, transports
 *   epd_bench_overhead_cluster.c  one daemon pair (one-host mode)
 *   epd_bench_overhead_req.c      the request plane: one request of an arm
 *   epd_bench_overhead_cpu.c      the daemons' per-thread CPU (one-host)
 *   epd_bench_overhead_trace.c    trace events folded into the requests
 *   epd_bench_overhead_row.c      a row's statistics, floor and printing
 */
#ifndef EPD_BENCH_OVERHEAD_INT_H
#define EPD_BENCH_OVERHEAD_INT_H

#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "epd_client.h"
#include "epd_engine.h"
#include "epd_kvq.h"
#include "epd_secret.h"
#include "epd_sim.h"
#include "epd_xport.h"

#define OB_MAX_LIST 16
#define OB_MAX_REQS 4096
#define OB_MAX_THREADS 48
#define OB_GROUP_DEFAULT (-1LL) /* the daemon's default --write-group-bytes */
#define OB_BLOCK_TOKENS 16      /* the daemons' --block-tokens default */
#define OB_PROBES_DEFAULT 16    /* the attach mode's --probes */
/* a GenerateRequest carries its prompt: room for 1M tokens and more (the
 * transport's limit; 1 MiB refused 1M-token prompts) */
#define OB_TXBUF (16u << 20)

enum { OB_ARM_A = 0, OB_ARM_B = 1, OB_ARM_Z = 2, OB_ARMS = 3 };

/* The arm's letter, as the table and the messages name it. */
static inline const char *ob_arm_name(int arm)
{
    return arm == OB_ARM_A ? "A" : arm == OB_ARM_B ? "B" : "Z";
}

typedef struct {
    const char *name;
    const char *backend;
    const char *provider; /* ofi */
    /* "NAME=VALUE", NULL-terminated: set over the environment of both
     * daemons and of the benchmark's own client transport */
    const char *env[3];
} ob_xport_t;

/* the window of the ref model overhead makes itself (no --ref-model) */
#define OB_REF_MAX_CONTEXT 40000u

typedef struct {
    const char *name;    /* as on the command line and in the table */
    const char *profile; /* sim: model profile file; NULL: ref */
    const char *accel;
    uint32_t devices;
    double scale;
} ob_engine_t;

/* A layer's moment in a request's trace: a "compute" span's end (the
 * sink ran: a chunk's KV of the layer exists), or a "KV write" span (one
 * busy episode of the layer's writes: s..e). */
typedef struct {
    double s, e;
    uint32_t layer;
} ob_span_t;

/* A growing list of them (owned by its request). */
typedef struct {
    ob_span_t *v;
    int n, cap;
} ob_spans_t;

/* One request as the daemons' traces tell it (ns, CLOCK_MONOTONIC). */
typedef struct {
    uint64_t id;
    uint32_t n_tokens;
    int arm;
    int rep;
    int warmup;
    int ok;
    double p_recv, q_end, c_start, c_end, resv, d_held, pc_recv, step1;
    ob_spans_t ready;        /* every chunk's layers: e = the sink ran */
    ob_spans_t writes;       /* the layers' write episodes */
    /* per layer ([n_layers] each, one allocation; 0 = not seen) */
    double *ld_sent, *ld_rx; /* LayerDone sent (prefill) / received (decode) */
} ob_req_t;

/* Host CPU of one thread name ("p:<comm>" / "d:<comm>") per arm. */
typedef struct {
    char name[32];
    double ns[OB_ARMS];
} ob_cpu_t;

/* A thread seen in /proc (its CPU so far). */
typedef struct {
    int tid;
    char name[32];
    double ns;
} ob_task_t;

typedef struct {
    /* options */
    uint32_t lengths[OB_MAX_LIST];
    int n_lengths;
    uint32_t ref_lengths[OB_MAX_LIST];
    int n_ref_lengths;
    const ob_engine_t *engines[OB_MAX_LIST];
    int n_engines;
    const ob_xport_t *xports[OB_MAX_LIST];
    int n_xports;
    long long groups[OB_MAX_LIST];
    int n_groups;
    const char *kv_dtypes[OB_MAX_LIST]; /* --kv-dtype maps (borrowed from argv) */
    int n_kv_dtypes;                    /* 0: each engine's own dtype */
    char kv_dtypes_buf[1024];           /* --kv-dtypes' copies, split at ';' */
    size_t kv_dtypes_used;              /* bytes of kv_dtypes_buf taken */
    int reps, reps_long, reps_ref, warmup;
    int zero; /* run the Z arm */
    double scale; /* 0: each sim engine's own */
    int chunk_tokens; /* prefill's --prefill-chunk-tokens; -1: its engine's default */
    int tsv;
    int cpu;  /* print the per-thread CPU lines */
    const char *verify; /* decode's --verify */
    const char *trace_out;
    uint32_t trace_len;
    const char *profiles;
    const char *ref_model;
    int keep;
    int attach; /* against running daemons (epd_bench_overhead_attach.c) */
    /* the attach mode's options: the daemons' control addresses (prefill,
     * decode), the cluster secret file, this host's data-plane address,
     * clock probes per round */
    const char *attach_addr[2];
    const char *attach_secret;
    const char *data_addr;
    int probes;
    char bindir[1024];
    char tmp[256];
    /* the cluster secret the bench makes for its daemons and itself (0600
     * in tmp): the request plane authenticated, as in a deployment */
    char secret_file[320];
    epd_secret_t secret;
    /* state of one configuration */
    epd_xport_t *x;
    epd_xport_ep_t *ep_p, *ep_d;
    epd_client_worker_info_t pi, di;
    uint64_t epoch_start, epoch_nonce;
    uint64_t seq;
    int n_connected, connect_failed;
    uint64_t waiting_id;
    int waiting_done;
    epd_status_t waiting_status;
    char waiting_msg[256];
    unsigned char *txbuf;
    ob_req_t reqs[OB_MAX_REQS];
    int n_reqs;
    uint64_t next_id;
    int trace_written;
    /* the engine's layout (bytes per layer) and model */
    epd_kv_layout_t kv;
    epd_sim_timing_t timing;
    int have_timing;
    char kv_name[EPD_KVQ_MAP_MAX]; /* its canonical KV dtype map */
    int n_configs;                 /* daemon pairs started so far (log names) */
    int kv_w;                      /* the table's kv_dtype column width */
    /* CPU accounting of the configuration being run */
    pid_t pid_p, pid_d;
    ob_task_t tasks[2][OB_MAX_THREADS];
    int n_tasks[2];
    ob_cpu_t cpu_tab[OB_MAX_LIST][OB_MAX_THREADS];
    int n_cpu[OB_MAX_LIST];
    int cpu_reqs[OB_MAX_LIST][OB_ARMS];
} ob_t;

/* What one row reports. */
typedef struct {
    int n_pairs;
    double model_ms; /* NaN: no model (ref) */
    double a_ms, b_ms, z_ms, a_compute_ms;
    double d_ms, d_lo_ms, d_hi_ms; /* B - A paired */
    double zd_ms;                  /* Z - A paired */
    double msg_us, link_gbs, floor_ms;
    int link_bound;
    double queue_ms, resv_ms, tail_ms, verify_ms, step1_ms, b_compute_ms;
    int a_flag;
} ob_row_t;

/* ---- epd_bench_overhead_attach.c (called by epd_bench_main.c) ---- */
/* Whether argv asks for the attach mode (--attach-prefill / -decode). */
int epd__ob_attach_wanted(int argc, char **argv);
/* `epd-bench overhead --attach-prefill HOST:PORT --attach-decode HOST:PORT
 * --cluster-secret-file F ...`: the exit status. */
int epd__ob_attach_main(int argc, char **argv);

/* ---- epd_bench_overhead_opts.c ---- */
/* A comma list of engine (engines 1) or transport names appended to
 * b->engines / b->xports; 0, or -1 after a line naming an unknown one. */
int epd__ob_parse_names(const char *s, int engines, ob_t *b);
/* Parses argv[1..argc) into b for its mode (b->attach; b holds the
 * mode's defaults).  -1: run; else the exit status (0 after --help, 2
 * after a line on stderr for an unknown option, a missing or bad value).
 * The strings stored in b point into argv. */
int epd__ob_parse_args(ob_t *b, int argc, char **argv);

/* ---- epd_bench_overhead_cluster.c ---- */
/* Runs one daemon pair (engine e, transport xp, prefill's
 * --write-group-bytes `group`, KV dtype map kvd; NULL: the engine's own)
 * over lengths[0..n_lengths) and prints its rows.  0, or -1 (said on
 * stderr; the daemons' logs kept in b->tmp). */
int epd__ob_config(ob_t *b, const ob_engine_t *e, const ob_xport_t *xp, long long group,
                   const char *kvd, const uint32_t *lengths, int n_lengths);

/* ---- epd_bench_overhead_req.c ---- */
/* The client transport's callbacks (arg: the ob_t). */
void epd__ob_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len);
void epd__ob_on_err(void *arg, epd_xport_ep_t *ep, epd_status_t status);
void epd__ob_on_connect(void *arg, epd_status_t status);
/* One request of arm `arm` to completion, recorded in b->reqs (its times
 * come later, from the traces; row li's CPU accounted when b->cpu; its
 * per-layer arrays are b's, from epd_calloc, freed by epd__ob_free_reqs).
 * 0 or -1 (said on stderr). */
int epd__ob_request(ob_t *b, const uint32_t *tokens, uint32_t n, int arm, int rep, int warmup,
                    int li);
/* Frees every recorded request's per-layer times; b->n_reqs = 0. */
void epd__ob_free_reqs(ob_t *b);

/* ---- epd_bench_overhead_cpu.c ---- */
/* Adds what each thread of daemon `which` (0 prefill, 1 decode) ran since
 * the last sample to row `li`, arm `arm` (arm < 0: only take the sample). */
void epd__ob_cpu_account(ob_t *b, int which, int li, int arm);
/* Row li's "cpu ms/req" line (nothing with --no-cpu, --tsv or no data). */
void epd__ob_print_cpu(const ob_t *b, int li);

/* ---- epd_bench_overhead_trace.c ---- */
/* The recorded request `id`, or NULL. */
ob_req_t *epd__ob_find(ob_t *b, uint64_t id);
/* One trace event of prefill (is_decode 0) or decode into its request, if
 * it is one of ours; ts and dur in ns on the benchmark's clock. */
void epd__ob_fold(ob_t *b, int is_decode, const char *name, uint64_t req, long long layer,
                  double ts, double dur);
/* Folds one daemon's trace file into the requests.  Its root (the
 * caller's, json_decref) or NULL (said on stderr). */
json_t *epd__ob_read_trace(ob_t *b, const char *path, int is_decode);
/* Writes request `id`'s events of both traces (and their track names)
 * into one Chrome trace file `out`.  0 or -1. */
int epd__ob_write_merged(const char *out, json_t *p, json_t *d, uint64_t id);

/* ---- epd_bench_overhead_row.c ---- */
/* Bytes layer l of a request of n_tokens writes; of all its layers. */
double epd__ob_layer_bytes(const epd_kv_layout_t *kv, uint32_t l, uint32_t n_tokens);
double epd__ob_req_bytes(const epd_kv_layout_t *kv, uint32_t n_tokens);
/* The row of prompt length `len` from b->reqs. */
void epd__ob_row(const ob_t *b, uint32_t len, ob_row_t *row);
/* The table's header and one row (--tsv: tab-separated). */
void epd__ob_print_header(const ob_t *b);
void epd__ob_print_row(const ob_t *b, const ob_engine_t *e, const ob_xport_t *xp, uint32_t len,
                       const ob_row_t *row);

#endif
