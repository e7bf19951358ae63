/*
 * epd_bench_burst.c — `epd-bench burst`: a burst of requests at once, the
 * decode KV reserved up front vs grown on demand, side by side.
 *
 * For each mode (--modes, in order, --rounds times) the benchmark starts its
 * own cluster from build/bin — router, one prefill and one decode worker
 * (--kv-blocks, --max-batch, --kv-reserve MODE), engine `sim` (a small
 * 1B-parameter H200 timing model written into a temp folder, whose decode
 * steps cost what a real accelerator's would: a step reads the weights
 * once, whatever the batch) unless --engine ref — and sends --requests
 * chat requests at once: every one on its own connection, released
 * together.  By default they carry no max_tokens (a chat request reserves
 * the whole remaining context up front, which is the case KV on demand
 * exists for) and end at a stop string (--stop: the first time the model
 * writes it, as a model would end at its EOS), sampled at temperature 1
 * with a seed of their own.  Every answer is counted: 200 (its completion
 * tokens), 429 with Retry-After, anything else (by kind).
 *
 * Goodput = requests answered 200 per second of the burst (first send to
 * last answer); tokens/s = their completion tokens per second.  The
 * router's /metrics after the burst give the decode worker's preemptions
 * and recomputed tokens, the router's capacity retries and the prompt
 * tokens prefill computed for requests no decode worker took.  It prints
 * a table; it never judges.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_http.h"
#include "epd_config.h"
#include "epd_time.h"

#define BU_MAX_MODES 4
#define BU_BODY_MAX 8192

typedef struct {
    /* options */
    int64_t requests, rounds, kv_blocks, max_batch, max_tokens, max_queue, queue_timeout_ms;
    int64_t seed;
    double temperature;
    const char *modes, *engine, *model, *prompt_len, *stop, *bindir_opt;
    int keep;
    int no_hold; /* prefill --no-hold-under-pressure */
    /* derived */
    char *mode[BU_MAX_MODES];
    int n_modes;
    char modes_buf[256];
    uint32_t plo, phi;
    char bindir[PATH_MAX];
    char root[PATH_MAX]; /* the temp folder of the whole run (the ref model) */
    char model_dir[PATH_MAX + 32];
} bu_opts_t;

typedef struct {
    int status;        /* HTTP status; 0: no answer */
    int retry_after;   /* 429: its Retry-After header had a value >= 1 */
    uint32_t tokens;   /* 200: usage.completion_tokens */
    uint64_t t_send, t_end;
    char why[96];      /* not 200 / 429: what came */
} bu_res_t;

typedef struct {
    const bu_opts_t *o;
    struct sockaddr_in addr;
    char host[64];
    pthread_barrier_t start;
    bu_res_t *res;
    char **body;
} bu_burst_t;

typedef struct {
    bu_burst_t *b;
    uint32_t i;
} bu_arg_t;

typedef struct {
    const char *mode;
    uint32_t ok, rejected, other;
    char other_example[120];
    double wall_s, goodput, tok_s, mean_tokens, e2e_p50, e2e_p99;
    double preemptions, recomputed, cap_retries, wasted;
} bu_row_t;

/* ------------------------------------------------------------- one burst */

static int bu_read_all(int fd, char *buf, size_t cap, size_t *len_p)
{
    size_t len = 0;

    for (;;) {
        ssize_t n;
        char *hdr_end;

        if (len + 1 >= cap) {
            return -1;
        }
        n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n <= 0) {
            break;
        }
        len += (size_t)n;
        buf[len] = '\0';
        hdr_end = strstr(buf, "\r\n\r\n");
        if (hdr_end != NULL) {
            const char *cl = strcasestr(buf, "\r\ncontent-length:");

            if (cl != NULL && cl < hdr_end &&
                len >= (size_t)(hdr_end + 4 - buf) + strtoull(cl + 17, NULL, 10)) {
                break; /* the whole body */
            }
        }
    }
    buf[len] = '\0';
    *len_p = len;
    return len > 0 ? 0 : -1;
}

static void *bu_client(void *arg)
{
    bu_arg_t *a = arg;
    bu_burst_t *b = a->b;
    bu_res_t *r = &b->res[a->i];
    size_t body_len = strlen(b->body[a->i]), len = 0;
    char *buf = epd_malloc(1 << 20);
    char head[256];
    int one = 1, fd, hl;
    const char *p;

    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (buf == NULL || fd < 0 || connect(fd, (struct sockaddr *)&b->addr, sizeof(b->addr)) != 0) {
        snprintf(r->why, sizeof(r->why), "connect: %s", strerror(errno));
        pthread_barrier_wait(&b->start);
        goto out;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    hl = snprintf(head, sizeof(head),
                  "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n"
                  "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                  b->host, body_len);
    pthread_barrier_wait(&b->start); /* every connection is open: all go at once */
    r->t_send = epd_time_now_ns();
    if (send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl ||
        send(fd, b->body[a->i], body_len, MSG_NOSIGNAL) != (ssize_t)body_len ||
        bu_read_all(fd, buf, 1 << 20, &len) != 0 ||
        sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
        snprintf(r->why, sizeof(r->why), "no answer");
        r->status = 0;
        goto out;
    }
    r->t_end = epd_time_now_ns();
    if (r->status == 200 && (p = strstr(buf, "\"completion_tokens\":")) != NULL) {
        r->tokens = (uint32_t)strtoul(p + 20, NULL, 10);
    } else if (r->status == 429) {
        p = strcasestr(buf, "\r\nretry-after:");
        r->retry_after = p != NULL && atoi(p + 14) >= 1;
    } else {
        p = strstr(buf, "\r\n\r\n");
        snprintf(r->why, sizeof(r->why), "HTTP %d %.80s", r->status, p != NULL ? p + 4 : "");
    }
out:
    if (fd >= 0) {
        close(fd);
    }
    epd_free(buf);
    return NULL;
}

/* The value of one series of /metrics (0 when absent). */
static double bu_metric(const char *text, const char *name)
{
    double v = 0.0;

    return text != NULL && epd_bench_metric(text, name, &v) ? v : 0.0;
}

/* The bodies: chat requests of --prompt-len random bytes (a seeded
 * alphabet without quotes), temperature, a seed each, the stop string,
 * max_tokens only when asked. */
static char **bu_bodies(const bu_opts_t *o)
{
    static const char chars[] = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPRSTUVWXYZ.,;0123456789";
    char **body = epd_calloc((size_t)o->requests, sizeof(*body));
    uint64_t s = (uint64_t)o->seed * 0x9e3779b97f4a7c15ull + 1;

    for (int64_t i = 0; body != NULL && i < o->requests; i++) {
        char text[4096];
        uint32_t n;
        char mt[48] = "", stop[96] = "";

        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        n = o->plo + (uint32_t)(s % (o->phi - o->plo + 1));
        for (uint32_t k = 0; k < n; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            text[k] = chars[s % (sizeof(chars) - 1)];
        }
        text[n] = '\0';
        if (o->max_tokens > 0) {
            snprintf(mt, sizeof(mt), ",\"max_tokens\":%lld", (long long)o->max_tokens);
        }
        if (o->stop[0] != '\0') {
            snprintf(stop, sizeof(stop), ",\"stop\":[\"%s\"]", o->stop);
        }
        body[i] = epd_malloc(BU_BODY_MAX);
        if (body[i] == NULL) {
            return body; /* the caller frees and gives up */
        }
        snprintf(body[i], BU_BODY_MAX,
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],"
                 "\"temperature\":%g,\"seed\":%lld%s%s}",
                 text, o->temperature, (long long)(o->seed * 100000 + i), mt, stop);
    }
    return body;
}

/* One burst at the router on http://127.0.0.1:port; fills the row. */
static int bu_burst(const bu_opts_t *o, const char *http, bu_row_t *row)
{
    bu_burst_t b;
    bu_arg_t *args;
    pthread_t *th;
    pthread_attr_t attr;
    double *lat;
    uint64_t t0 = UINT64_MAX, t1 = 0, tokens = 0;
    uint32_t n_lat = 0;
    const char *colon = strrchr(http, ':');
    char *metrics;
    int rc = -1;

    memset(&b, 0, sizeof(b));
    b.o = o;
    snprintf(b.host, sizeof(b.host), "%s", http);
    b.addr.sin_family = AF_INET;
    b.addr.sin_port = htons((uint16_t)atoi(colon != NULL ? colon + 1 : "0"));
    b.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    b.res = epd_calloc((size_t)o->requests, sizeof(*b.res));
    b.body = bu_bodies(o);
    args = epd_calloc((size_t)o->requests, sizeof(*args));
    th = epd_calloc((size_t)o->requests, sizeof(*th));
    lat = epd_calloc((size_t)o->requests, sizeof(*lat));
    if (b.res == NULL || b.body == NULL || args == NULL || th == NULL || lat == NULL ||
        pthread_barrier_init(&b.start, NULL, (unsigned)o->requests) != 0) {
        goto out;
    }
    for (int64_t i = 0; i < o->requests; i++) {
        if (b.body[i] == NULL) {
            goto out_barrier;
        }
    }
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    for (int64_t i = 0; i < o->requests; i++) {
        args[i].b = &b;
        args[i].i = (uint32_t)i;
        if (pthread_create(&th[i], &attr, bu_client, &args[i]) != 0) {
            fprintf(stderr, "burst: cannot start client thread %lld\n", (long long)i);
            exit(1); /* the others wait at the barrier forever otherwise */
        }
    }
    pthread_attr_destroy(&attr);
    for (int64_t i = 0; i < o->requests; i++) {
        pthread_join(th[i], NULL);
    }
    for (int64_t i = 0; i < o->requests; i++) {
        bu_res_t *r = &b.res[i];

        t0 = r->t_send != 0 && r->t_send < t0 ? r->t_send : t0;
        t1 = r->t_end > t1 ? r->t_end : t1;
        if (r->status == 200) {
            row->ok++;
            tokens += r->tokens;
            lat[n_lat++] = (double)(r->t_end - r->t_send) / 1e6;
        } else if (r->status == 429 && r->retry_after) {
            row->rejected++;
        } else {
            if (row->other == 0) {
                snprintf(row->other_example, sizeof(row->other_example), "%s",
                         r->status == 429 ? "429 without Retry-After" : r->why);
            }
            row->other++;
        }
    }
    row->wall_s = t1 > t0 ? (double)(t1 - t0) / 1e9 : 0;
    row->goodput = row->wall_s > 0 ? row->ok / row->wall_s : 0;
    row->tok_s = row->wall_s > 0 ? (double)tokens / row->wall_s : 0;
    row->mean_tokens = row->ok > 0 ? (double)tokens / row->ok : 0;
    if (n_lat > 0) {
        epd_bench_sort(lat, n_lat);
        row->e2e_p50 = epd_bench_pct(lat, n_lat, 50);
        row->e2e_p99 = epd_bench_pct(lat, n_lat, 99);
    }
    /* the workers' heartbeats (every 100 ms) carry their counters */
    epd_time_sleep_ns(400 * EPD_NSEC_PER_MSEC);
    if (epd_bench_http_get(http, "/metrics", 10000, &metrics, NULL) != EPD_OK) {
        metrics = NULL; /* every counter reads 0 */
    }
    row->preemptions = bu_metric(metrics, "epd_router_decode_preemptions_total");
    row->recomputed = bu_metric(metrics, "epd_router_decode_recomputed_tokens_total");
    row->cap_retries = bu_metric(metrics, "epd_router_capacity_retries_total");
    row->wasted = bu_metric(metrics, "epd_router_prefill_wasted_tokens_total");
    epd_free(metrics);
    rc = 0;
out_barrier:
    pthread_barrier_destroy(&b.start);
out:
    for (int64_t i = 0; b.body != NULL && i < o->requests; i++) {
        epd_free(b.body[i]);
    }
    epd_free(b.body);
    epd_free(b.res);
    epd_free(args);
    epd_free(th);
    epd_free(lat);
    return rc;
}

/* ----------------------------------------------------------- the cluster */

/* $TMPDIR when set (an absolute path that leaves room for our names), else /tmp. */
static const char *bu_tmpdir(void)
{
    const char *t = getenv("TMPDIR");

    return t != NULL && t[0] == '/' && strlen(t) < PATH_MAX - 64 ? t : "/tmp";
}

/* Router, prefill and decode (`mode`) in a fresh temp folder; the burst;
 * everything stopped.  0 or -1. */
static int bu_run(const bu_opts_t *o, const char *mode, bu_row_t *row)
{
    char tmp[PATH_MAX], secret[PATH_MAX + 32], http[64], ctl[64], pctl[64], dctl[64];
    char rr[PATH_MAX + 32], pr[PATH_MAX + 32], dr[PATH_MAX + 32];
    char rl[PATH_MAX + 32], pl[PATH_MAX + 32], dl[PATH_MAX + 32];
    char rexe[PATH_MAX + 32], pexe[PATH_MAX + 32], dexe[PATH_MAX + 32];
    char blocks[24], batch[24], queue[24], qto[24], rmcmd[PATH_MAX + 16];
    pid_t pids[3] = {0, 0, 0};
    epd_secret_t sec;
    int rc = -1;

    snprintf(tmp, sizeof(tmp), "%s/epd-burst.XXXXXX", bu_tmpdir());
    if (mkdtemp(tmp) == NULL ||
        epd_bench_make_secret(tmp, secret, sizeof(secret), &sec, "burst") != 0) {
        return -1;
    }
    snprintf(rexe, sizeof(rexe), "%s/epd-router", o->bindir);
    snprintf(pexe, sizeof(pexe), "%s/epd-prefill", o->bindir);
    snprintf(dexe, sizeof(dexe), "%s/epd-decode", o->bindir);
    snprintf(rr, sizeof(rr), "%s/router.ready", tmp);
    snprintf(pr, sizeof(pr), "%s/prefill.ready", tmp);
    snprintf(dr, sizeof(dr), "%s/decode.ready", tmp);
    snprintf(rl, sizeof(rl), "%s/router.log", tmp);
    snprintf(pl, sizeof(pl), "%s/prefill.log", tmp);
    snprintf(dl, sizeof(dl), "%s/decode.log", tmp);
    snprintf(blocks, sizeof(blocks), "%lld", (long long)o->kv_blocks);
    snprintf(batch, sizeof(batch), "%lld", (long long)o->max_batch);
    snprintf(queue, sizeof(queue), "%lld", (long long)o->max_queue);
    snprintf(qto, sizeof(qto), "%lld", (long long)o->queue_timeout_ms);
    {
        char *argv[] = {rexe, "--listen", "127.0.0.1:0", "--control-addr", "127.0.0.1:0",
                        "--model", (char *)o->model_dir, "--engine", (char *)o->engine,
                        "--served-model-name", "m", "--ready-file", rr, "--cluster-secret-file",
                        secret, "--max-connections-per-addr", "0", "--heartbeat-ms", "100",
                        "--max-queue", queue, "--queue-timeout-ms", qto, "--log-level", "warn",
                        NULL};

        pids[0] = epd_bench_spawn(argv, rl);
    }
    if (pids[0] < 0 || epd_bench_wait_ready(rr, pids[0], "http", http, sizeof(http)) != 0 ||
        epd_bench_wait_ready(rr, pids[0], "control", ctl, sizeof(ctl)) != 0) {
        fprintf(stderr, "burst: the router did not start (log: %s)\n", rl);
        goto out;
    }
    {
        char *argv[] = {pexe, "--model", (char *)o->model_dir, "--engine", (char *)o->engine,
                        "--worker-id", "prefill-0", "--router", ctl, "--ready-file", pr,
                        "--cluster-secret-file", secret, "--state-slots", "512", "--kv-blocks",
                        "16384", "--log-level", "warn",
                        o->no_hold ? "--no-hold-under-pressure" : NULL, NULL};

        pids[1] = epd_bench_spawn(argv, pl);
    }
    {
        char *argv[] = {dexe, "--model", (char *)o->model_dir, "--engine", (char *)o->engine,
                        "--worker-id", "decode-0", "--router", ctl, "--ready-file", dr,
                        "--cluster-secret-file", secret, "--kv-blocks", blocks, "--max-batch",
                        batch, "--state-slots", "1024", "--kv-reserve", (char *)mode,
                        "--log-level", "warn", NULL};

        pids[2] = epd_bench_spawn(argv, dl);
    }
    if (pids[1] < 0 || pids[2] < 0 ||
        epd_bench_wait_ready(pr, pids[1], "control", pctl, sizeof(pctl)) != 0 ||
        epd_bench_wait_ready(dr, pids[2], "control", dctl, sizeof(dctl)) != 0 ||
        epd_bench_wait_workers(ctl, &sec, 2) != 0) {
        fprintf(stderr, "burst: the workers did not start or register (logs in %s)\n", tmp);
        goto out;
    }
    row->mode = mode;
    fprintf(stderr, "burst: %s: %lld requests at once (logs in %s)\n", mode,
            (long long)o->requests, tmp);
    rc = bu_burst(o, http, row);
out:
    for (int i = 2; i >= 0; i--) {
        static const char *const names[3] = {"router", "prefill", "decode"};

        epd_bench_kill(pids[i], "burst", names[i]);
    }
    epd_secret_wipe(&sec);
    if (!o->keep && rc == 0) {
        snprintf(rmcmd, sizeof(rmcmd), "rm -rf '%s'", tmp);
        if (system(rmcmd) != 0) {
            fprintf(stderr, "burst: could not remove %s\n", tmp);
        }
    }
    return rc;
}

/* The model: the sim profile, or the ref default (epd-mkmodel), in the
 * run's temp folder, unless --model names one. */
static int bu_model(bu_opts_t *o)
{
    snprintf(o->root, sizeof(o->root), "%s/epd-burst-model.XXXXXX", bu_tmpdir());
    if (o->model != NULL) {
        snprintf(o->model_dir, sizeof(o->model_dir), "%s", o->model);
        return 0;
    }
    if (mkdtemp(o->root) == NULL) {
        return -1;
    }
    snprintf(o->model_dir, sizeof(o->model_dir), "%s/model", o->root);
    if (strcmp(o->engine, "sim") == 0) {
        return epd_bench_write_sim(o->model_dir);
    }
    {
        char mk[PATH_MAX + 32], log[PATH_MAX + 32];
        int status = 0;
        pid_t pid;

        snprintf(mk, sizeof(mk), "%s/epd-mkmodel", o->bindir);
        snprintf(log, sizeof(log), "%s/mkmodel.log", o->root);
        {
            char *argv[] = {mk, "--out", o->model_dir, NULL};

            pid = epd_bench_spawn(argv, log);
        }
        if (pid < 0 || epd_bench_reap(pid, &status, 0) != pid || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            fprintf(stderr, "burst: epd-mkmodel failed (log: %s)\n", log);
            return -1;
        }
    }
    return 0;
}

int epd_bench_burst_main(int argc, char **argv)
{
    bu_opts_t o = {
        .requests = 300,
        .rounds = 1,
        .kv_blocks = 4096,
        .max_batch = 32,
        .max_tokens = 0,
        .max_queue = 1024,
        .queue_timeout_ms = 120000,
        .seed = 1,
        .temperature = 1.0,
        .modes = "upfront,on-demand",
        .engine = "sim",
        .model = NULL,
        .prompt_len = "32:96",
        .stop = "Q",
        .bindir_opt = NULL,
    };
    const epd_opt_t opts[] = {
        {"requests", EPD_OPT_INT, &o.requests, 1, 2000, "requests sent at once"},
        {"modes", EPD_OPT_STRING, &o.modes, 0, 0,
         "decode --kv-reserve modes, comma-separated, run in this order each round"},
        {"rounds", EPD_OPT_INT, &o.rounds, 1, 100, "times every mode runs (alternating)"},
        {"engine", EPD_OPT_STRING, &o.engine, 0, 0,
         "sim (a 1B model's H200 timing: a decode step costs one weight read whatever the "
         "batch) or ref (the CPU transformer: a step costs each row)"},
        {"model", EPD_OPT_STRING, &o.model, 0, 0,
         "model folder (default: a sim profile, or epd-mkmodel's default model for ref)"},
        {"kv-blocks", EPD_OPT_INT, &o.kv_blocks, 1, 1 << 24, "decode KV blocks (16 tokens each)"},
        {"max-batch", EPD_OPT_INT, &o.max_batch, 1, 4096, "decode batch"},
        {"prompt-len", EPD_OPT_STRING, &o.prompt_len, 0, 0, "prompt bytes: N or A:B (uniform)"},
        {"max-tokens", EPD_OPT_INT, &o.max_tokens, 0, 1 << 20,
         "max_tokens of each request (0: none: the whole remaining context)"},
        {"stop", EPD_OPT_STRING, &o.stop, 0, 0,
         "stop string ending each answer (\"\": none; the ref model ends at its EOS)"},
        {"temperature", EPD_OPT_DOUBLE, &o.temperature, 0, 100, "sampling temperature"},
        {"max-queue", EPD_OPT_INT, &o.max_queue, 1, 1 << 20, "router --max-queue"},
        {"queue-timeout-ms", EPD_OPT_INT, &o.queue_timeout_ms, 1, 3600000,
         "router --queue-timeout-ms"},
        {"seed", EPD_OPT_INT, &o.seed, 0, (double)INT64_MAX, "workload seed"},
        {"bin", EPD_OPT_STRING, &o.bindir_opt, 0, 0, "folder of the daemons (default: ours)"},
        {"keep", EPD_OPT_BOOL, &o.keep, 0, 0, "keep the clusters' temp folders (logs)"},
        {"no-hold", EPD_OPT_BOOL, &o.no_hold, 0, 0,
         "prefill computes at once even when a decode worker refused lately "
         "(--no-hold-under-pressure: the old behaviour)"},
    };
    epd_opts_t eo = {.prog = "epd-bench burst",
                     .summary = "a burst of requests at once: decode KV reserved up front vs "
                                "grown on demand, side by side (goodput, 429s, preemptions)",
                     .opts = opts,
                     .n_opts = sizeof(opts) / sizeof(opts[0])};
    static bu_row_t rows[BU_MAX_MODES * 100];
    int n_rows = 0, rc = 0, argi;
    char *save = NULL, *tok;
    epd_status_t st;

    signal(SIGPIPE, SIG_IGN);
    st = epd_opts_parse(&eo, argc, argv, &argi);
    if (st != EPD_OK || argi != argc) {
        epd_opts_cleanup(&eo);
        return st == EPD_ERR_CANCELED ? 0 : 2;
    }
    if (sscanf(o.prompt_len, "%u:%u", &o.plo, &o.phi) != 2) {
        o.plo = o.phi = (uint32_t)atoi(o.prompt_len);
    }
    if (o.plo == 0 || o.phi < o.plo || o.phi > 3000 || strchr(o.stop, '"') != NULL ||
        strchr(o.stop, '\\') != NULL || strlen(o.stop) > 32) {
        fprintf(stderr, "burst: --prompt-len A:B within 1..3000, --stop of at most 32 plain "
                        "characters\n");
        epd_opts_cleanup(&eo);
        return 2;
    }
    snprintf(o.modes_buf, sizeof(o.modes_buf), "%s", o.modes);
    for (tok = strtok_r(o.modes_buf, ",", &save); tok != NULL && o.n_modes < BU_MAX_MODES;
         tok = strtok_r(NULL, ",", &save)) {
        o.mode[o.n_modes++] = tok;
    }
    if (o.bindir_opt != NULL) {
        snprintf(o.bindir, sizeof(o.bindir), "%s", o.bindir_opt);
    } else if (epd_bench_bindir(o.bindir, sizeof(o.bindir)) != 0) {
        o.bindir[0] = '\0';
    }
    if (o.n_modes == 0 || bu_model(&o) != 0) {
        fprintf(stderr, "burst: no modes, or no model\n");
        epd_opts_cleanup(&eo);
        return 1;
    }
    for (int64_t round = 0; round < o.rounds && rc == 0; round++) {
        for (int m = 0; m < o.n_modes && rc == 0; m++) {
            memset(&rows[n_rows], 0, sizeof(rows[n_rows]));
            if (bu_run(&o, o.mode[m], &rows[n_rows]) != 0) {
                rc = 1;
                break;
            }
            n_rows++;
        }
    }
    if (o.model == NULL && !o.keep) {
        char rmcmd[PATH_MAX + 16];

        snprintf(rmcmd, sizeof(rmcmd), "rm -rf '%s'", o.root);
        (void)!system(rmcmd);
    }
    printf("epd-bench burst: %lld requests at once, engine %s, decode %lld blocks x 16 tokens, "
           "batch %lld, prompts %s bytes, max_tokens %s, stop \"%s\", router queue %lld / %lld "
           "ms\n",
           (long long)o.requests, o.engine, (long long)o.kv_blocks, (long long)o.max_batch,
           o.prompt_len, o.max_tokens > 0 ? "set" : "none", o.stop, (long long)o.max_queue,
           (long long)o.queue_timeout_ms);
    if (o.max_tokens > 0) {
        printf("  (max_tokens %lld)\n", (long long)o.max_tokens);
    }
    printf("%-10s %5s %5s %5s | %7s %9s %9s %8s | %8s %8s | %7s %10s %7s %7s\n", "kv", "200",
           "429", "other", "wall_s", "goodput/s", "tokens/s", "tok/req", "e2e_p50", "e2e_p99",
           "preempt", "recomputed", "cap_rtr", "wasted");
    for (int i = 0; i < n_rows; i++) {
        const bu_row_t *r = &rows[i];

        printf("%-10s %5u %5u %5u | %7.2f %9.1f %9.0f %8.1f | %8.0f %8.0f | %7.0f %10.0f %7.0f "
               "%7.0f\n",
               r->mode, r->ok, r->rejected, r->other, r->wall_s, r->goodput, r->tok_s,
               r->mean_tokens, r->e2e_p50, r->e2e_p99, r->preemptions, r->recomputed,
               r->cap_retries, r->wasted);
        if (r->other > 0) {
            printf("  %s: first other answer: %s\n", r->mode, r->other_example);
        }
    }
    printf("(goodput: 200 answers per second from the first send to the last answer; e2e in "
           "ms; cap_rtr: attempts refused for room and sent again; wasted: prompt tokens prefill "
           "computed for nothing)\n");
    epd_opts_cleanup(&eo);
    return rc;
}
