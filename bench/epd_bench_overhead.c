/*
 * epd_bench_overhead.c — `epd-bench overhead`: what disaggregation costs.
 *
 * For each engine (sim profiles in sleep mode, the ref CPU model), each
 * transport and each prompt length, one epd-prefill and one epd-decode
 * daemon are started (with --trace), and the same prefill daemon serves,
 * alternately, request by request:
 *
 *   A  prefill only: GenerateRequest{prefill_only} to prefill alone; it
 *      computes every layer exactly as usual, writes nothing, and answers
 *      with the first token;
 *   B  prefill + KV transfer: the same GenerateRequest to decode and
 *      prefill (proto/README.md); prefill streams each finished layer's KV
 *      into decode's reservation, decode verifies the checksums.
 *
 * One request at a time (no queueing between them).  Everything is measured
 * from the daemons' own trace timestamps (CLOCK_MONOTONIC, shared by the
 * processes of one host), parsed after the daemons exit:
 *
 *   t0        prefill's "GenerateRequest received" (its loop thread)
 *   A end     prefill's compute done: the end of the "prefill" span (every
 *             layer + sampling the first token, compute thread)
 *   B end     decode's "KV held": PrefillComplete received and every
 *             layer's checksum verified against decode's copy
 *   overhead  (median B - median A) / median A
 *   breakdown (medians over the B requests)
 *     queue    t0 -> compute start (the "queued" span)
 *     resv     t0 -> prefill's "KvReservation received" (reservation
 *              handshake: the client sends to both at once)
 *     compute  the "prefill" span
 *     tail     prefill's compute done (first token sampled) -> decode's
 *              "KV held": the part of the transfer not hidden behind
 *              compute (PrefillComplete carries the first token, so it is
 *              never negative)
 *     verify   decode's hashing on the tail: the check of the newest layer
 *              (per-layer verification: "verify layer", the last layer's)
 *              plus the final pass over layers not checked as they landed
 *              ("verify KV"; every layer with --no-layer-notify)
 *     step1    decode's "first decode step" span (KV held -> the loop sees
 *              the first decoded token)
 *
 * --trace FILE writes one B request's events from both daemons into one
 * Chrome trace JSON (open it in ui.perfetto.dev).  This measures; it never
 * judges (tests/ do).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "epd_bench.h"
#include "epd_client.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_sim.h"
#include "epd_time.h"
#include "epd_xport.h"

#define OB_MAX_LIST 16
#define OB_MAX_REQS 4096
#define OB_GROUP_DEFAULT (-1LL) /* the daemon's default --write-group-bytes */

typedef struct {
    const char *name;
    const char *backend;
    const char *provider; /* ofi */
    const char *ucx_tls;  /* ucx */
} ob_xport_t;

static const ob_xport_t ob_xports[] = {
    {"ucx-shm", "ucx", NULL, "posix,cma,tcp"},
    {"ucx-tcp", "ucx", NULL, "tcp"},
    {"ofi-tcp", "ofi", "tcp;ofi_rxm", NULL},
};

typedef struct {
    const char *name;    /* as on the command line and in the table */
    const char *profile; /* sim: model profile file; NULL: ref */
    const char *accel;
    uint32_t devices;
    double scale;
} ob_engine_t;

static const ob_engine_t ob_engines[] = {
    {"dense-70b", "dense-70b.profile", "h200.profile", 4, 0.05},
    {"hybrid-320b", "hybrid-moe-320b.profile", "h200.profile", 8, 0.1},
    {"ref", NULL, NULL, 0, 0},
};

/* One request as the daemons' traces tell it (ns, CLOCK_MONOTONIC). */
typedef struct {
    uint64_t id;
    uint32_t n_tokens;
    int arm; /* 0 = A (prefill only), 1 = B (prefill + transfer) */
    int warmup;
    int ok;
    double p_recv, q_end, c_start, c_end, last_layer_end, resv, d_held, step1, verify;
    /* decode's hashing: the final pass over layers not verified as they
     * landed ("verify KV"), and the newest per-layer check ("verify layer",
     * the last layer's: on the tail) */
    double verify_end, verify_last, verify_last_ts;
    int n_layers_seen, n_writes_seen;
} ob_req_t;

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
    int groups_given;
    uint32_t compare_max;    /* extra rows with compare_group up to this length */
    long long compare_group; /* --write-group-bytes of those rows */
    int reps, reps_long, reps_ref, warmup;
    const char *trace_out;
    uint32_t trace_len;
    const char *profiles;
    const char *ref_model;
    int keep;
    char bindir[1024];
    char tmp[256];
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
} ob_t;

/* ------------------------------------------------------------ processes */

static pid_t ob_spawn(char *const argv[], const ob_xport_t *xp, const char *log)
{
    pid_t pid = fork();

    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        if (xp->ucx_tls != NULL) {
            setenv("UCX_TLS", xp->ucx_tls, 1);
            setenv("UCX_NET_DEVICES", "lo", 1);
        }
        if (xp->provider != NULL) {
            setenv("FI_PROVIDER", xp->provider, 1);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* SIGTERM, then up to timeout_ms for the exit (the trace is written at
 * exit), then SIGKILL.  0 when the daemon exited cleanly (status 0: under a
 * sanitizer, no report either), -1 otherwise (said on stderr, with its log). */
static int ob_stop(pid_t pid, int timeout_ms, const char *log)
{
    uint64_t end;
    int status;

    if (pid <= 0) {
        return -1;
    }
    kill(pid, SIGTERM);
    end = epd_time_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (epd_time_now_ns() < end) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
                return 0;
            }
            fprintf(stderr, "overhead: daemon %d ended with %s %d (log: %s)\n", (int)pid,
                    WIFEXITED(status) ? "status" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), log);
            return -1;
        }
        epd_time_sleep_ns(10 * 1000000ull);
    }
    fprintf(stderr, "overhead: pid %d did not stop in %d ms: killed (log: %s)\n", (int)pid,
            timeout_ms, log);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

/* Waits for a ready file and returns its control address. */
static int ob_wait_ready(const char *path, pid_t pid, char *control, size_t cap)
{
    uint64_t end = epd_time_now_ns() + 120ull * 1000000000ull;
    int status;

    while (epd_time_now_ns() < end) {
        FILE *f = fopen(path, "r");

        if (f != NULL) {
            char line[512];
            char *p;

            if (fgets(line, sizeof(line), f) != NULL && (p = strstr(line, "control=")) != NULL) {
                size_t n = strcspn(p + 8, " \n");

                fclose(f);
                if (n >= cap) {
                    return -1;
                }
                memcpy(control, p + 8, n);
                control[n] = '\0';
                return 0;
            }
            fclose(f);
        }
        if (waitpid(pid, &status, WNOHANG) == pid) {
            return -1;
        }
        epd_time_sleep_ns(20 * 1000000ull);
    }
    return -1;
}

/* ------------------------------------------------------- request plane */

static void ob_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    ob_t *b = arg;
    Epd__Envelope *env = NULL;
    const char *why = NULL;

    (void)ep;
    if (epd_msg_decode(data, len, &env, &why) != EPD_OK) {
        return;
    }
    if (epd_msg_request_id(env) == b->waiting_id && !b->waiting_done) {
        switch (env->body_case) {
        case EPD__ENVELOPE__BODY_TOKENS:
            if (env->tokens->finish != EPD__FINISH_REASON__FINISH_NONE) {
                b->waiting_done = 1;
                b->waiting_status = env->tokens->finish == EPD__FINISH_REASON__FINISH_LENGTH ||
                                            env->tokens->finish == EPD__FINISH_REASON__FINISH_STOP
                                        ? EPD_OK
                                        : EPD_ERR_CANCELED;
            }
            break;
        case EPD__ENVELOPE__BODY_ERROR:
            b->waiting_done = 1;
            b->waiting_status = env->error->status < 0 ? env->error->status : EPD_ERR_FATAL;
            snprintf(b->waiting_msg, sizeof(b->waiting_msg), "%s: %s", env->sender->worker_id,
                     env->error->message != NULL ? env->error->message : "");
            break;
        case EPD__ENVELOPE__BODY_REFUSED:
            b->waiting_done = 1;
            b->waiting_status = EPD_ERR_NO_CAPACITY;
            snprintf(b->waiting_msg, sizeof(b->waiting_msg), "refused: %s",
                     env->refused->reason != NULL ? env->refused->reason : "");
            break;
        default:
            break;
        }
    }
    epd_msg_free(env);
}

static void ob_on_err(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    ob_t *b = arg;

    (void)ep;
    if (!b->waiting_done && b->waiting_id != 0) {
        b->waiting_done = 1;
        b->waiting_status = status;
        snprintf(b->waiting_msg, sizeof(b->waiting_msg), "endpoint failed: %s",
                 epd_status_string(status));
    }
}

static void ob_on_connect(void *arg, epd_status_t status)
{
    ob_t *b = arg;

    if (status == EPD_OK) {
        b->n_connected++;
    } else {
        b->connect_failed = 1;
    }
}

static epd_status_t ob_send_generate(ob_t *b, epd_xport_ep_t *ep, const uint32_t *tokens,
                                     uint32_t n, uint64_t id, int prefill_only)
{
    Epd__Envelope env = EPD__ENVELOPE__INIT;
    Epd__SenderRef sender = EPD__SENDER_REF__INIT;
    Epd__Epoch me = EPD__EPOCH__INIT, pe = EPD__EPOCH__INIT, de = EPD__EPOCH__INIT;
    Epd__GenerateRequest g = EPD__GENERATE_REQUEST__INIT;
    Epd__SamplingParams sp = EPD__SAMPLING_PARAMS__INIT;
    char wid[64];
    size_t len;
    epd_status_t st;

    snprintf(wid, sizeof(wid), "bench-overhead-%d", (int)getpid());
    me.start_time_ns = b->epoch_start;
    me.nonce = b->epoch_nonce;
    sender.worker_id = wid;
    sender.epoch = &me;
    env.sender = &sender;
    env.seq = ++b->seq;
    sp.temperature = 0.0f;
    sp.top_p = 1.0f;
    sp.seed = 1;
    sp.max_tokens = 2; /* decode runs exactly one step after the KV is held */
    g.request_id = id;
    g.prompt_tokens = (uint32_t *)tokens;
    g.n_prompt_tokens = n;
    g.sampling = &sp;
    g.prefill_worker_id = b->pi.worker_id;
    pe.start_time_ns = b->pi.epoch_start_ns;
    pe.nonce = b->pi.epoch_nonce;
    g.prefill_epoch = &pe;
    g.prefill_address.data = b->pi.address;
    g.prefill_address.len = b->pi.address_len;
    g.prefill_only = prefill_only;
    if (!prefill_only) {
        g.decode_worker_id = b->di.worker_id;
        de.start_time_ns = b->di.epoch_start_ns;
        de.nonce = b->di.epoch_nonce;
        g.decode_epoch = &de;
        g.decode_address.data = b->di.address;
        g.decode_address.len = b->di.address_len;
    }
    g.deadline_ms = 120000;
    env.body_case = EPD__ENVELOPE__BODY_GENERATE;
    env.generate = &g;
    st = epd_msg_encode(&env, b->txbuf, 1 << 20, &len);
    if (st != EPD_OK) {
        return st;
    }
    for (int tries = 0; tries < 10000; tries++) {
        st = epd_xport_send(ep, b->txbuf, len, 0);
        if (st != EPD_ERR_NO_RESOURCE) {
            return st;
        }
        epd_xport_progress(b->x);
    }
    return st;
}

/* One request, to completion.  0 or -1 (logged). */
static int ob_request(ob_t *b, const uint32_t *tokens, uint32_t n, int arm, int warmup)
{
    uint64_t id = b->next_id++;
    uint64_t end;
    epd_status_t st;
    ob_req_t *r;

    if (b->n_reqs >= OB_MAX_REQS) {
        fprintf(stderr, "overhead: too many requests in one configuration\n");
        return -1;
    }
    b->waiting_id = id;
    b->waiting_done = 0;
    b->waiting_status = EPD_OK;
    b->waiting_msg[0] = '\0';
    if (arm == 1) {
        st = ob_send_generate(b, b->ep_d, tokens, n, id, 0);
        if (st == EPD_OK) {
            st = ob_send_generate(b, b->ep_p, tokens, n, id, 0);
        }
    } else {
        st = ob_send_generate(b, b->ep_p, tokens, n, id, 1);
    }
    if (st != EPD_OK) {
        fprintf(stderr, "overhead: sending request %llu: %s\n", (unsigned long long)id,
                epd_status_string(st));
        return -1;
    }
    end = epd_time_now_ns() + 30ull * 1000000000ull;
    while (!b->waiting_done && epd_time_now_ns() < end) {
        epd_xport_poll(b->x, 5);
    }
    b->waiting_id = 0;
    if (!b->waiting_done || b->waiting_status != EPD_OK) {
        fprintf(stderr, "overhead: request %llu (%u tokens, %s) failed: %s %s\n",
                (unsigned long long)id, n, arm ? "B" : "A",
                b->waiting_done ? epd_status_string(b->waiting_status) : "no answer in 30 s",
                b->waiting_msg);
        return -1;
    }
    r = &b->reqs[b->n_reqs++];
    memset(r, 0, sizeof(*r));
    r->id = id;
    r->n_tokens = n;
    r->arm = arm;
    r->warmup = warmup;
    return 0;
}

/* --------------------------------------------------------------- traces */

static ob_req_t *ob_find(ob_t *b, uint64_t id)
{
    for (int i = 0; i < b->n_reqs; i++) {
        if (b->reqs[i].id == id) {
            return &b->reqs[i];
        }
    }
    return NULL;
}

/* Folds one daemon's trace into the requests.  Returns the root (owned by
 * the caller) or NULL. */
static json_t *ob_read_trace(ob_t *b, const char *path, int is_decode)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *evs, *e;
    size_t i;

    if (root == NULL) {
        fprintf(stderr, "overhead: trace %s: %s (line %d)\n", path, jerr.text, jerr.line);
        return NULL;
    }
    evs = json_object_get(root, "traceEvents");
    json_array_foreach(evs, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *args = json_object_get(e, "args");
        json_t *req = json_object_get(args, "req");
        double ts = json_number_value(json_object_get(e, "ts")) * 1000.0;
        double dur = json_number_value(json_object_get(e, "dur")) * 1000.0;
        ob_req_t *r;

        if (name == NULL || !json_is_integer(req)) {
            continue;
        }
        r = ob_find(b, (uint64_t)json_integer_value(req));
        if (r == NULL) {
            continue;
        }
        if (!is_decode) {
            if (strncmp(name, "GenerateRequest received", 24) == 0) {
                r->p_recv = ts;
            } else if (strcmp(name, "queued") == 0) {
                r->q_end = ts + dur;
            } else if (strcmp(name, "prefill") == 0) {
                r->c_start = ts;
                r->c_end = ts + dur;
            } else if (strcmp(name, "compute") == 0) {
                r->n_layers_seen++;
                if (ts + dur > r->last_layer_end) {
                    r->last_layer_end = ts + dur;
                }
            } else if (strcmp(name, "KV write") == 0) {
                r->n_writes_seen++;
            } else if (strcmp(name, "KvReservation received") == 0) {
                r->resv = ts;
            }
        } else {
            if (strcmp(name, "KV held") == 0) {
                r->d_held = ts;
            } else if (strcmp(name, "first decode step") == 0) {
                r->step1 = dur;
            } else if (strcmp(name, "verify KV") == 0) {
                r->verify_end = dur;
            } else if (strcmp(name, "verify layer") == 0 && ts >= r->verify_last_ts) {
                r->verify_last_ts = ts;
                r->verify_last = dur;
            }
        }
    }
    return root;
}

/* Writes request `id`'s events of both daemons (and their track names)
 * into one Chrome trace file. */
static int ob_write_merged(const char *out, json_t *p, json_t *d, uint64_t id)
{
    json_t *root = json_object();
    json_t *all = json_array();
    json_t *srcs[2] = {p, d};
    int rc;

    for (int s = 0; s < 2; s++) {
        json_t *evs = json_object_get(srcs[s], "traceEvents"), *e;
        size_t i;

        json_array_foreach(evs, i, e)
        {
            const char *ph = json_string_value(json_object_get(e, "ph"));
            json_t *req = json_object_get(json_object_get(e, "args"), "req");

            if ((ph != NULL && strcmp(ph, "M") == 0) ||
                (json_is_integer(req) && (uint64_t)json_integer_value(req) == id)) {
                json_array_append(all, e);
            }
        }
    }
    json_object_set_new(root, "displayTimeUnit", json_string("ns"));
    json_object_set_new(root, "traceEvents", all);
    rc = json_dump_file(root, out, JSON_COMPACT);
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------- stats */

static int ob_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of v[0..n) (sorted in place); NaN when empty. */
static double ob_pct(double *v, int n, double p)
{
    int k;

    if (n == 0) {
        return 0.0 / 0.0;
    }
    qsort(v, (size_t)n, sizeof(*v), ob_cmp);
    k = (int)(p * n + 0.999999) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

typedef enum {
    OB_A,
    OB_B,
    OB_QUEUE,
    OB_RESV,
    OB_COMPUTE,
    OB_TAIL,
    OB_VERIFY,
    OB_STEP1,
} ob_metric_t;

static int ob_collect(const ob_t *b, uint32_t len, ob_metric_t m, double *v)
{
    int n = 0;

    for (int i = 0; i < b->n_reqs; i++) {
        const ob_req_t *r = &b->reqs[i];

        if (r->n_tokens != len || r->warmup || !r->ok || r->arm != (m == OB_A ? 0 : 1)) {
            continue;
        }
        switch (m) {
        case OB_A:
            v[n++] = r->c_end - r->p_recv;
            break;
        case OB_B:
            v[n++] = r->d_held - r->p_recv;
            break;
        case OB_QUEUE:
            v[n++] = r->q_end - r->p_recv;
            break;
        case OB_RESV:
            v[n++] = r->resv - r->p_recv;
            break;
        case OB_COMPUTE:
            v[n++] = r->c_end - r->c_start;
            break;
        case OB_TAIL:
            v[n++] = r->d_held - r->c_end;
            break;
        case OB_VERIFY:
            v[n++] = r->verify_end + r->verify_last;
            break;
        case OB_STEP1:
            v[n++] = r->step1;
            break;
        }
    }
    return n;
}

static double ob_metric(const ob_t *b, uint32_t len, ob_metric_t m, double p, int *n_p)
{
    static double v[OB_MAX_REQS];
    int n = ob_collect(b, len, m, v);

    if (n_p != NULL) {
        *n_p = n;
    }
    return ob_pct(v, n, p) / 1e6; /* ms */
}

/* ------------------------------------------------------ one configuration */

static void ob_group_name(long long g, char *buf, size_t cap)
{
    if (g == OB_GROUP_DEFAULT) {
        snprintf(buf, cap, "default");
    } else if (g == 0) {
        snprintf(buf, cap, "per-layer");
    } else if (g % (1 << 20) == 0) {
        snprintf(buf, cap, "%lldM", g >> 20);
    } else if (g % 1024 == 0) {
        snprintf(buf, cap, "%lldK", g >> 10);
    } else {
        snprintf(buf, cap, "%lld", g);
    }
}

static int ob_model_dir(ob_t *b, const ob_engine_t *e, char *dir, size_t cap)
{
    if (e->profile == NULL) {
        if (b->ref_model != NULL) {
            snprintf(dir, cap, "%s", b->ref_model);
            return 0;
        }
        snprintf(dir, cap, "%s/ref-model", b->tmp);
        if (access(dir, F_OK) != 0) {
            char cmd[PATH_MAX * 2 + 128];

            /* small enough for a 2-core machine: 8 layers LLA, dim 256 */
            snprintf(cmd, sizeof(cmd), "'%s/epd-mkmodel' --out '%s' --max-context 40000 >/dev/null",
                     b->bindir, dir);
            if (system(cmd) != 0) {
                fprintf(stderr, "overhead: epd-mkmodel failed\n");
                return -1;
            }
        }
        return 0;
    } else {
        epd_sim_options_t o;
        char model[PATH_MAX], accel[PATH_MAX];
        epd_status_t st;

        snprintf(dir, cap, "%s/sim-%s", b->tmp, e->name);
        snprintf(model, sizeof(model), "%s/%s", b->profiles, e->profile);
        snprintf(accel, sizeof(accel), "%s/%s", b->profiles, e->accel);
        memset(&o, 0, sizeof(o));
        o.model = model;
        o.accel = accel;
        o.scale = e->scale;
        o.devices = e->devices;
        o.mode = EPD_SIM_SLEEP;
        o.seed = 1;
        o.vocab = 4096; /* the logits of step 0 are not what is measured */
        st = epd_sim_conf_write(dir, &o);
        if (st != EPD_OK) {
            fprintf(stderr, "overhead: sim.conf for %s from %s: %s\n", e->name, b->profiles,
                    epd_status_string(st));
            return -1;
        }
        return 0;
    }
}

/* Runs one daemon pair over `lengths` and prints its rows. */
static int ob_config(ob_t *b, const ob_engine_t *e, const ob_xport_t *xp, long long group,
                     const uint32_t *lengths, int n_lengths)
{
    char model[PATH_MAX], p_ready[PATH_MAX], d_ready[PATH_MAX], p_trace[PATH_MAX],
        d_trace[PATH_MAX], p_log[PATH_MAX], d_log[PATH_MAX], p_ctl[128], d_ctl[128];
    char pexe[PATH_MAX], dexe[PATH_MAX], gbuf[32], kvb_p[32], kvb_d[32], gname[32];
    uint32_t max_len = 0;
    pid_t pp = -1, pd = -1;
    epd_xport_config_t xc;
    json_t *pj = NULL, *dj = NULL;
    epd_rng_t rng;
    uint32_t *tokens = NULL;
    uint64_t trace_id = 0;
    int rc = -1;

    for (int i = 0; i < n_lengths; i++) {
        max_len = lengths[i] > max_len ? lengths[i] : max_len;
    }
    if (ob_model_dir(b, e, model, sizeof(model)) != 0) {
        return -1;
    }
    ob_group_name(group, gname, sizeof(gname));
    snprintf(p_ready, sizeof(p_ready), "%s/p.ready", b->tmp);
    snprintf(d_ready, sizeof(d_ready), "%s/d.ready", b->tmp);
    snprintf(p_trace, sizeof(p_trace), "%s/p.json", b->tmp);
    snprintf(d_trace, sizeof(d_trace), "%s/d.json", b->tmp);
    snprintf(p_log, sizeof(p_log), "%s/p-%s-%s-%s.log", b->tmp, e->name, xp->name, gname);
    snprintf(d_log, sizeof(d_log), "%s/d-%s-%s-%s.log", b->tmp, e->name, xp->name, gname);
    unlink(p_ready);
    unlink(d_ready);
    unlink(p_trace);
    unlink(d_trace);
    snprintf(pexe, sizeof(pexe), "%s/epd-prefill", b->bindir);
    snprintf(dexe, sizeof(dexe), "%s/epd-decode", b->bindir);
    /* prefill frees a request's blocks only after its last write completed
     * and the compute thread released it, which may be after decode already
     * answered: room for three prompts */
    snprintf(kvb_p, sizeof(kvb_p), "%u", 3 * (max_len / 16 + 1) + 8);
    snprintf(kvb_d, sizeof(kvb_d), "%u", max_len / 16 + 16);
    snprintf(gbuf, sizeof(gbuf), "%lld", group);
    {
        char *dargv[40], *pargv[40];
        int n = 0;

        dargv[n++] = dexe;
        dargv[n++] = "--engine";
        dargv[n++] = e->profile != NULL ? "sim" : "ref";
        dargv[n++] = "--model";
        dargv[n++] = model;
        dargv[n++] = "--transport";
        dargv[n++] = (char *)xp->backend;
        dargv[n++] = "--worker-id";
        dargv[n++] = "bench-decode";
        dargv[n++] = "--ready-file";
        dargv[n++] = d_ready;
        dargv[n++] = "--trace";
        dargv[n++] = d_trace;
        dargv[n++] = "--kv-blocks";
        dargv[n++] = kvb_d;
        dargv[n++] = "--state-slots";
        dargv[n++] = "8";
        dargv[n++] = "--max-batch";
        dargv[n++] = "4";
        dargv[n++] = "--lease-ms";
        dargv[n++] = "60000";
        dargv[n++] = "--peer-timeout-ms";
        dargv[n++] = "30000";
        dargv[n++] = "--log-level";
        dargv[n++] = getenv("EPD_BENCH_LOG_LEVEL") != NULL ? getenv("EPD_BENCH_LOG_LEVEL") : "warn";
        if (xp->provider != NULL) {
            dargv[n++] = "--provider";
            dargv[n++] = (char *)xp->provider;
        }
        dargv[n] = NULL;
        /* prefill takes decode's flags but --max-batch (a decode setting) */
        n = 0;
        for (int i = 0; dargv[i] != NULL; i++) {
            if (strcmp(dargv[i], "--max-batch") == 0) {
                i++;
                continue;
            }
            pargv[n++] = dargv[i];
        }
        pargv[n] = NULL;
        pargv[0] = pexe;
        pargv[8] = "bench-prefill";
        pargv[10] = p_ready;
        pargv[12] = p_trace;
        pargv[14] = kvb_p;
        n = 0;
        while (pargv[n] != NULL) {
            n++;
        }
        if (group != OB_GROUP_DEFAULT) {
            pargv[n++] = "--write-group-bytes";
            pargv[n++] = gbuf;
        }
        pargv[n] = NULL;
        pd = ob_spawn(dargv, xp, d_log);
        pp = ob_spawn(pargv, xp, p_log);
    }
    if (pd < 0 || pp < 0 || ob_wait_ready(d_ready, pd, d_ctl, sizeof(d_ctl)) != 0 ||
        ob_wait_ready(p_ready, pp, p_ctl, sizeof(p_ctl)) != 0) {
        fprintf(stderr, "overhead: daemons did not start (logs: %s, %s)\n", p_log, d_log);
        goto out;
    }
    {
        char err[256];

        if (epd_client_health(p_ctl, 10000, &b->pi, err, sizeof(err)) != EPD_OK ||
            epd_client_health(d_ctl, 10000, &b->di, err, sizeof(err)) != EPD_OK) {
            fprintf(stderr, "overhead: Health: %s\n", err);
            goto out;
        }
    }
    if (xp->provider != NULL) {
        setenv("FI_PROVIDER", xp->provider, 1);
    }
    if (xp->ucx_tls != NULL) {
        setenv("UCX_TLS", xp->ucx_tls, 1);
        setenv("UCX_NET_DEVICES", "lo", 1);
    }
    epd_xport_config_init(&xc);
    xc.backend = xp->backend;
    xc.provider = xp->provider;
    xc.max_msg_size = 64 * 1024; /* as the daemons */
    xc.peer_timeout_ms = 60000;
    xc.connect_timeout_ms = 10000;
    xc.msg_cb = ob_on_msg;
    xc.err_cb = ob_on_err;
    xc.cb_arg = b;
    if (epd_xport_create(&xc, &b->x) != EPD_OK) {
        fprintf(stderr, "overhead: cannot start the client transport %s\n", xp->name);
        goto out;
    }
    b->n_connected = 0;
    b->connect_failed = 0;
    if (epd_xport_connect(b->x, b->pi.address, b->pi.address_len, ob_on_connect, b, &b->ep_p) !=
            EPD_INPROGRESS ||
        epd_xport_connect(b->x, b->di.address, b->di.address_len, ob_on_connect, b, &b->ep_d) !=
            EPD_INPROGRESS) {
        fprintf(stderr, "overhead: cannot connect to the daemons\n");
        goto out;
    }
    {
        uint64_t end = epd_time_now_ns() + 15ull * 1000000000ull;

        while (b->n_connected < 2 && !b->connect_failed && epd_time_now_ns() < end) {
            epd_xport_poll(b->x, 5);
        }
    }
    if (b->n_connected < 2) {
        fprintf(stderr, "overhead: connecting to the daemons failed\n");
        goto out;
    }

    tokens = malloc(sizeof(*tokens) * (max_len + 1));
    if (tokens == NULL) {
        goto out;
    }
    epd_rng_seed(&rng, 42);
    b->n_reqs = 0;
    for (int li = 0; li < n_lengths; li++) {
        uint32_t len = lengths[li];
        int reps = e->profile == NULL ? b->reps_ref : len >= 16384 ? b->reps_long : b->reps;

        tokens[0] = 256; /* BOS of the byte tokenizer; an ordinary id for sim */
        for (uint32_t t = 1; t < len; t++) {
            /* below 128: one varint byte each, so 32k tokens fit a 64 KiB message */
            tokens[t] = 1 + (uint32_t)(epd_rng_next(&rng) % 127);
        }
        for (int w = 0; w < b->warmup; w++) {
            if (ob_request(b, tokens, len, 0, 1) != 0 || ob_request(b, tokens, len, 1, 1) != 0) {
                goto out;
            }
        }
        /* interleaved: A B B A A B ... so neither arm always goes first */
        for (int r = 0; r < reps; r++) {
            int first = r & 1;

            if (ob_request(b, tokens, len, first, 0) != 0 ||
                ob_request(b, tokens, len, !first, 0) != 0) {
                goto out;
            }
            if (len == b->trace_len || trace_id == 0) {
                trace_id = b->reqs[b->n_reqs - (first == 1 ? 2 : 1)].id; /* the B one */
            }
        }
    }
    rc = 0;
out:
    free(tokens);
    if (b->x != NULL) {
        epd_xport_ep_close(b->ep_p);
        epd_xport_ep_close(b->ep_d);
        epd_xport_destroy(b->x);
        b->x = NULL;
        b->ep_p = b->ep_d = NULL;
    }
    if (ob_stop(pp, 30000, p_log) != 0) {
        rc = -1;
    }
    if (ob_stop(pd, 30000, d_log) != 0) {
        rc = -1;
    }
    if (rc != 0) {
        return rc;
    }
    pj = ob_read_trace(b, p_trace, 0);
    dj = ob_read_trace(b, d_trace, 1);
    if (pj == NULL || dj == NULL) {
        json_decref(pj);
        json_decref(dj);
        return -1;
    }
    for (int i = 0; i < b->n_reqs; i++) {
        ob_req_t *r = &b->reqs[i];

        r->ok = r->p_recv > 0 && r->c_end > 0 && r->c_start > 0 &&
                (r->arm == 0 || (r->d_held > 0 && r->resv > 0));
    }
    if (b->trace_out != NULL && !b->trace_written && trace_id != 0) {
        if (ob_write_merged(b->trace_out, pj, dj, trace_id) == 0) {
            ob_req_t *r = ob_find(b, trace_id);

            printf("# trace of request %llu (%s, %s, %u tokens, %s, prefill + transfer) -> %s\n",
                   (unsigned long long)trace_id, e->name, xp->name, r != NULL ? r->n_tokens : 0,
                   gname, b->trace_out);
            b->trace_written = 1;
        } else {
            fprintf(stderr, "overhead: cannot write %s\n", b->trace_out);
        }
    }
    json_decref(pj);
    json_decref(dj);

    for (int li = 0; li < n_lengths; li++) {
        uint32_t len = lengths[li];
        int na, nb;
        double a50 = ob_metric(b, len, OB_A, 0.5, &na);
        double a90 = ob_metric(b, len, OB_A, 0.9, NULL);
        double b50 = ob_metric(b, len, OB_B, 0.5, &nb);
        double b90 = ob_metric(b, len, OB_B, 0.9, NULL);

        printf("%-11s %-7s %6u %-9s %3d/%-3d %9.3f %9.3f %9.3f %9.3f %7.2f%% | %7.3f %7.3f %9.3f "
               "%8.3f %7.3f %7.3f\n",
               e->name, xp->name, len, gname, na, nb, a50, a90, b50, b90, 100.0 * (b50 - a50) / a50,
               ob_metric(b, len, OB_QUEUE, 0.5, NULL), ob_metric(b, len, OB_RESV, 0.5, NULL),
               ob_metric(b, len, OB_COMPUTE, 0.5, NULL), ob_metric(b, len, OB_TAIL, 0.5, NULL),
               ob_metric(b, len, OB_VERIFY, 0.5, NULL), ob_metric(b, len, OB_STEP1, 0.5, NULL));
        fflush(stdout);
    }
    return 0;
}

/* ----------------------------------------------------------------- main */

static int ob_parse_u32_list(const char *s, uint32_t *out, int *n_p)
{
    int n = 0;

    while (*s != '\0') {
        char *end;
        unsigned long v = strtoul(s, &end, 10);

        if (end == s || n == OB_MAX_LIST) {
            return -1;
        }
        if (*end == 'k' || *end == 'K') {
            v *= 1024;
            end++;
        }
        if (v == 0 || v > 1u << 20) {
            return -1;
        }
        out[n++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') {
            return -1;
        }
    }
    *n_p = n;
    return n > 0 ? 0 : -1;
}

static int ob_parse_names(const char *s, int engines, ob_t *b)
{
    char buf[512];
    char *save = NULL;

    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int found = 0;

        if (engines) {
            for (size_t i = 0; i < sizeof(ob_engines) / sizeof(ob_engines[0]); i++) {
                if (strcmp(tok, ob_engines[i].name) == 0 && b->n_engines < OB_MAX_LIST) {
                    b->engines[b->n_engines++] = &ob_engines[i];
                    found = 1;
                }
            }
        } else {
            for (size_t i = 0; i < sizeof(ob_xports) / sizeof(ob_xports[0]); i++) {
                if (strcmp(tok, ob_xports[i].name) == 0 && b->n_xports < OB_MAX_LIST) {
                    b->xports[b->n_xports++] = &ob_xports[i];
                    found = 1;
                }
            }
        }
        if (!found) {
            fprintf(stderr, "overhead: unknown %s '%s'\n", engines ? "engine" : "transport", tok);
            return -1;
        }
    }
    return 0;
}

static int ob_parse_groups(const char *s, long long *groups, int *n_p)
{
    char buf[512];
    char *save = NULL;
    int n = 0;

    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        long long v;
        char *end;

        if (n == OB_MAX_LIST) {
            return -1;
        }
        if (strcmp(tok, "default") == 0) {
            v = OB_GROUP_DEFAULT;
        } else if (strcmp(tok, "per-layer") == 0) {
            v = 0;
        } else {
            v = strtoll(tok, &end, 10);
            if (*end == 'k' || *end == 'K') {
                v <<= 10;
                end++;
            } else if (*end == 'm' || *end == 'M') {
                v <<= 20;
                end++;
            }
            if (end == tok || *end != '\0' || v < 0) {
                return -1;
            }
        }
        groups[n++] = v;
    }
    *n_p = n;
    return n > 0 ? 0 : -1;
}

static void ob_usage(void)
{
    printf("usage: epd-bench overhead [options]\n"
           "  prefill-only (A) vs prefill + KV transfer into a live decode (B), interleaved\n"
           "  request by request against the same daemons; times from the daemons' traces.\n\n"
           "  --lengths LIST       prompt lengths for sim engines [128,1024,4096,16384,32768]\n"
           "  --ref-lengths LIST   prompt lengths for ref [128,1024]\n"
           "  --engines LIST       dense-70b,hybrid-320b,ref [all]\n"
           "  --transports LIST    ucx-shm,ucx-tcp,ofi-tcp [all]\n"
           "  --groups LIST        prefill --write-group-bytes of each row: default (the\n"
           "                       daemon's), per-layer (0) or bytes (64K, 1M) [default]\n"
           "  --compare-group G    without --groups: also rows with this grouping... [256K]\n"
           "  --compare-max N      ...for lengths <= N [1024]\n"
           "  --reps N             A/B pairs per length [12]\n"
           "  --reps-long N        A/B pairs for lengths >= 16k [6]\n"
           "  --reps-ref N         A/B pairs per length with ref (slow on a CPU) [6]\n"
           "  --warmup N           A/B pairs not counted, per length [1]\n"
           "  --trace FILE         one B request, prefill and decode merged (Chrome JSON)\n"
           "  --trace-length N     which length that request has [1024]\n"
           "  --profiles DIR       sim profiles [<repo>/engine/profiles]\n"
           "  --ref-model DIR      ref model [epd-mkmodel defaults, written to a temp dir]\n"
           "  --keep               keep the temp dir (daemon logs, traces)\n");
}

int epd_bench_overhead_main(int argc, char **argv)
{
    static ob_t b;
    char exe[1024];
    ssize_t n;
    int rc = 0;

    memset(&b, 0, sizeof(b));
    b.lengths[0] = 128;
    b.lengths[1] = 1024;
    b.lengths[2] = 4096;
    b.lengths[3] = 16384;
    b.lengths[4] = 32768;
    b.n_lengths = 5;
    b.ref_lengths[0] = 128;
    b.ref_lengths[1] = 1024;
    b.n_ref_lengths = 2;
    b.compare_max = 1024;
    b.compare_group = 256 * 1024;
    b.reps = 12;
    b.reps_long = 6;
    b.reps_ref = 6;
    b.warmup = 1;
    b.trace_len = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;

        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            ob_usage();
            return 0;
        }
        if (strcmp(a, "--keep") == 0) {
            b.keep = 1;
            continue;
        }
        if (v == NULL) {
            fprintf(stderr, "overhead: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--lengths") == 0) {
            bad = ob_parse_u32_list(v, b.lengths, &b.n_lengths);
        } else if (strcmp(a, "--ref-lengths") == 0) {
            bad = ob_parse_u32_list(v, b.ref_lengths, &b.n_ref_lengths);
        } else if (strcmp(a, "--engines") == 0) {
            bad = ob_parse_names(v, 1, &b);
        } else if (strcmp(a, "--transports") == 0) {
            bad = ob_parse_names(v, 0, &b);
        } else if (strcmp(a, "--groups") == 0) {
            bad = ob_parse_groups(v, b.groups, &b.n_groups);
            b.groups_given = 1;
        } else if (strcmp(a, "--compare-max") == 0) {
            b.compare_max = (uint32_t)atoi(v);
        } else if (strcmp(a, "--compare-group") == 0) {
            long long g[OB_MAX_LIST];
            int ng = 0;

            bad = ob_parse_groups(v, g, &ng) != 0 || ng != 1;
            b.compare_group = g[0];
        } else if (strcmp(a, "--reps") == 0) {
            b.reps = atoi(v);
            bad = b.reps < 1;
        } else if (strcmp(a, "--reps-ref") == 0) {
            b.reps_ref = atoi(v);
            bad = b.reps_ref < 1;
        } else if (strcmp(a, "--reps-long") == 0) {
            b.reps_long = atoi(v);
            bad = b.reps_long < 1;
        } else if (strcmp(a, "--warmup") == 0) {
            b.warmup = atoi(v);
            bad = b.warmup < 0;
        } else if (strcmp(a, "--trace") == 0) {
            b.trace_out = v;
        } else if (strcmp(a, "--trace-length") == 0) {
            b.trace_len = (uint32_t)atoi(v);
        } else if (strcmp(a, "--profiles") == 0) {
            b.profiles = v;
        } else if (strcmp(a, "--ref-model") == 0) {
            b.ref_model = v;
        } else {
            fprintf(stderr, "overhead: unknown option %s (see --help)\n", a);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "overhead: bad value for %s: '%s'\n", a, v);
            return 2;
        }
    }
    if (b.n_engines == 0) {
        ob_parse_names("dense-70b,hybrid-320b,ref", 1, &b);
    }
    if (b.n_xports == 0) {
        ob_parse_names("ucx-shm,ucx-tcp,ofi-tcp", 0, &b);
    }
    if (!b.groups_given) {
        b.groups[0] = OB_GROUP_DEFAULT;
        b.n_groups = 1;
    }
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        fprintf(stderr, "overhead: cannot find my own binary\n");
        return 1;
    }
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(b.bindir, sizeof(b.bindir), "%s", exe);
    {
        static char prof[PATH_MAX];

        if (b.profiles == NULL) {
            /* build/bin or build/san/bin */
            snprintf(prof, sizeof(prof), "%s/../../engine/profiles", b.bindir);
            if (access(prof, R_OK) != 0) {
                snprintf(prof, sizeof(prof), "%s/../../../engine/profiles", b.bindir);
            }
            if (access(prof, R_OK) != 0) {
                snprintf(prof, sizeof(prof), "engine/profiles");
            }
            b.profiles = prof;
        }
    }
    snprintf(b.tmp, sizeof(b.tmp), "/tmp/epd-overhead-XXXXXX");
    if (mkdtemp(b.tmp) == NULL) {
        fprintf(stderr, "overhead: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    b.txbuf = malloc(1 << 20);
    b.epoch_start = epd_time_wall_ns();
    b.epoch_nonce = epd_rng_entropy();
    b.next_id = ((uint64_t)(uint32_t)getpid() << 32) | 1;
    signal(SIGPIPE, SIG_IGN);

    printf("# epd-bench overhead: A = prefill only, B = prefill + KV transfer to a live decode,\n"
           "# interleaved per request on the same daemons; ms from prefill receiving the request\n"
           "# to A: compute done / B: decode holding all KV (PrefillComplete verified).\n"
           "# breakdown (medians of B): queue = wait for the compute thread, resv = reservation\n"
           "# received, compute = prefill span, tail = prefill compute done -> decode holds all\n"
           "# KV (verify = decode hashing on the tail: the last layer's check, plus layers not\n"
           "# checked as they landed), step1 = first decode step.  Load average at start: ");
    {
        FILE *f = fopen("/proc/loadavg", "r");
        char la[64] = "?";

        if (f != NULL) {
            if (fgets(la, sizeof(la), f) == NULL) {
                snprintf(la, sizeof(la), "?");
            }
            fclose(f);
        }
        la[strcspn(la, "\n")] = '\0';
        printf("%s, %ld CPUs\n", la, sysconf(_SC_NPROCESSORS_ONLN));
    }
    printf("%-11s %-7s %6s %-9s %7s %9s %9s %9s %9s %8s | %7s %7s %9s %8s %7s %7s\n", "engine",
           "xport", "tokens", "writes", "nA/nB", "A med", "A p90", "B med", "B p90", "ovh", "queue",
           "resv", "compute", "tail", "verify", "step1");
    for (int ei = 0; ei < b.n_engines; ei++) {
        const ob_engine_t *e = b.engines[ei];
        const uint32_t *lens = e->profile != NULL ? b.lengths : b.ref_lengths;
        int nl = e->profile != NULL ? b.n_lengths : b.n_ref_lengths;

        for (int xi = 0; xi < b.n_xports; xi++) {
            for (int gi = 0; gi < b.n_groups; gi++) {
                if (ob_config(&b, e, b.xports[xi], b.groups[gi], lens, nl) != 0) {
                    rc = 1;
                }
            }
            if (!b.groups_given && b.compare_max > 0) {
                uint32_t short_lens[OB_MAX_LIST];
                int ns = 0;

                for (int li = 0; li < nl; li++) {
                    if (lens[li] <= b.compare_max) {
                        short_lens[ns++] = lens[li];
                    }
                }
                if (ns > 0 &&
                    ob_config(&b, e, b.xports[xi], b.compare_group, short_lens, ns) != 0) {
                    rc = 1;
                }
            }
        }
    }
    if (b.keep || rc != 0) {
        /* a failure keeps them too: the daemons' logs say why */
        printf("# daemon logs and traces kept in %s\n", b.tmp);
    } else {
        char cmd[PATH_MAX + 32];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b.tmp);
        if (system(cmd) != 0) {
            fprintf(stderr, "overhead: could not remove %s\n", b.tmp);
        }
    }
    free(b.txbuf);
    return rc;
}
