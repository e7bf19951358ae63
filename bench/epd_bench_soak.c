/*
 * epd_bench_soak.c — `epd-bench soak`: many requests through a real cluster
 * while it is hurt, every finished answer checked token for token.
 *
 * It starts its own cluster from build/bin — a router, two prefill workers
 * and one decode worker with a cluster secret, on a tiny `ref` model
 * (epd-mkmodel, written into a temp folder) — with EPD_XPORT_FAULTS=--faults
 * in the workers' environment (transport/epd_xport_faults.h; "" for none).
 * It computes the expected text of every distinct prompt once with
 * epd-generate (seeded sampling), then sends --requests completions from
 * --clients threads (prompts of mixed lengths, streaming and not, each on a
 * connection of its own), a --abort-ratio of them abandoned by the client
 * a few milliseconds after sending.  Meanwhile a chaos thread, every
 * --chaos-ms, stops a worker (SIGSTOP, 0.3-1.5 s, SIGCONT) or kills one
 * (SIGKILL) and starts it again.  Every request ends as: finished equal
 * to epd-generate, finished wrong, aborted by the client, a terminal error
 * (by kind: HTTP status, or the code of an error event in a stream), or
 * hung (no answer within --timeout-s).  At the end, once nothing is
 * stopped, the decode worker's free KV blocks (its heartbeat, in the
 * router's /metrics) must come back to its total: what stays short is
 * leaked.  It prints the counts, the late writes refused and blocks
 * quarantined (router /metrics), corruptions detected (the workers' logged
 * refusals of a frame by its MAC or of KV by its checksum), the faults
 * injected, and p50/p99 time to a terminal state.  Exit 1 when anything
 * finished wrong, leaked or hung.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_http.h"
#include "epd_config.h"
#include "epd_rng.h"
#include "epd_time.h"

#define SO_PROMPTS_MAX 64
#define SO_KINDS_MAX 32
#define SO_WORKERS_MAX 4 /* prefill-0, prefill-1, decode-0 [, decode-1] */
#define SO_BUF (1 << 20)
#define SO_ERR_SAMPLES 4

typedef struct {
    int64_t requests, clients, prompts, chaos_ms, timeout_s, seed, decode, no_worker_wait_ms;
    double abort_ratio;
    const char *faults, *bindir_opt, *router_log_level;
    int keep;
    char bindir[PATH_MAX];
    char tmp[PATH_MAX];
    char model[PATH_MAX + 16];
    char secret[PATH_MAX + 32];
    char ctl[64], http[64];
    struct sockaddr_in addr;
} so_opts_t;

typedef struct {
    char text[1024];
    int max_tokens;
    char *want; /* epd-generate's text (owned) */
    size_t want_len;
} so_prompt_t;

typedef struct {
    const char *name, *role;
    pid_t pid;
    int incarnation;
    int stopped;
} so_worker_t;

typedef struct {
    char kind[48];
    uint64_t n;
} so_kind_t;

typedef struct {
    so_opts_t *o;
    so_prompt_t prompt[SO_PROMPTS_MAX];
    so_worker_t w[SO_WORKERS_MAX];
    int n_workers;
    pthread_mutex_t lock;
    atomic_llong next;
    atomic_int done;
    uint64_t equal, wrong, aborted, hung, errors;
    so_kind_t kinds[SO_KINDS_MAX];
    int n_kinds;
    double *t_ms; /* [requests]: time to a terminal state (not aborted) */
    uint64_t n_t;
    double *wait_ms; /* [requests]: the router's epd-no-worker-wait-ms of those that waited */
    uint64_t n_wait, wait_served, wait_503;
    uint64_t early_503; /* "no worker" 503s before the router's wait bound */
    uint64_t stops, kills;
    char first_wrong[512];
    char err_sample[SO_ERR_SAMPLES][220]; /* the first answer of each error status */
} so_run_t;

static const char so_filler[] =
    "the soak sends the same prompts again and again while the cluster is hurt ";

static void so_kind_add(so_run_t *s, const char *kind)
{
    for (int i = 0; i < s->n_kinds; i++) {
        if (strcmp(s->kinds[i].kind, kind) == 0) {
            s->kinds[i].n++;
            return;
        }
    }
    if (s->n_kinds < SO_KINDS_MAX) {
        snprintf(s->kinds[s->n_kinds].kind, sizeof(s->kinds[0].kind), "%s", kind);
        s->kinds[s->n_kinds++].n = 1;
    }
}

/* ------------------------------------------------------------- processes */

static int so_start(so_run_t *s, int i)
{
    so_opts_t *o = s->o;
    so_worker_t *w = &s->w[i];
    char exe[PATH_MAX + 32], ready[PATH_MAX + 64], log[PATH_MAX + 64], ctl[64];

    w->incarnation++;
    snprintf(exe, sizeof(exe), "%s/epd-%s", o->bindir, w->role);
    snprintf(ready, sizeof(ready), "%s/%s.%d.ready", o->tmp, w->name, w->incarnation);
    snprintf(log, sizeof(log), "%s/%s.%d.log", o->tmp, w->name, w->incarnation);
    {
        char *argv[] = {exe, "--model", o->model, "--worker-id", (char *)w->name, "--router",
                        o->ctl, "--ready-file", ready, "--cluster-secret-file", o->secret,
                        "--kv-blocks", "512", "--state-slots", "64", "--peer-timeout-ms",
                        "1000", "--log-level", "warn", NULL};

        w->pid = epd_bench_spawn(argv, log);
    }
    w->stopped = 0;
    if (w->pid < 0 || epd_bench_wait_ready(ready, w->pid, "control", ctl, sizeof(ctl)) != 0) {
        fprintf(stderr, "soak: %s did not start (log: %s)\n", w->name, log);
        return -1;
    }
    return 0;
}

/* Runs epd-generate for prompt p; 0 or -1. */
static int so_expect(so_run_t *s, so_prompt_t *p)
{
    char cmd[PATH_MAX * 2 + 1200];
    char *buf = epd_malloc(SO_BUF);
    size_t len = 0, n;
    FILE *f;

    if (buf == NULL) {
        return -1;
    }
    snprintf(cmd, sizeof(cmd),
             "'%s/epd-generate' --model '%s' --prompt '%s' --max-tokens %d --temperature 0.8 "
             "--top-p 0.95 --seed 11",
             s->o->bindir, s->o->model, p->text, p->max_tokens);
    f = popen(cmd, "r");
    if (f == NULL) {
        epd_free(buf);
        return -1;
    }
    while ((n = fread(buf + len, 1, SO_BUF - 1 - len, f)) > 0) {
        len += n;
    }
    if (pclose(f) != 0 || len == 0 || buf[len - 1] != '\n') {
        fprintf(stderr, "soak: epd-generate failed for a prompt\n");
        epd_free(buf);
        return -1;
    }
    buf[--len] = '\0';
    p->want = buf;
    p->want_len = len;
    return 0;
}

/* ---------------------------------------------------------------- client */

/* The answer's text (appended to *out, owned by the caller) or a terminal
 * error's kind in kind[0..cap).  1: text; 0: error; -1: broken answer. */
static int so_parse(const char *body, int stream, char **out, size_t *out_len, char *kind,
                    size_t cap)
{
    json_error_t jerr;

    if (!stream) {
        json_t *j = json_loads(body, 0, &jerr);
        json_t *t = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text");
        int rc = -1;

        if (json_is_string(t)) {
            *out_len = json_string_length(t);
            *out = epd_malloc(*out_len + 1);
            if (*out != NULL) {
                memcpy(*out, json_string_value(t), *out_len + 1);
                rc = 1;
            }
        }
        json_decref(j);
        return rc;
    }
    {
        const char *p = body;
        size_t cap_out = 4096, len = 0;
        char *acc = epd_malloc(cap_out);
        int done = 0;

        while (acc != NULL && *p != '\0' && !done) {
            const char *end = strstr(p, "\n\n");
            json_t *j, *e, *t;

            if (end == NULL || strncmp(p, "data: ", 6) != 0) {
                break;
            }
            if (strncmp(p + 6, "[DONE]", 6) == 0) {
                done = 1;
                break;
            }
            j = json_loadb(p + 6, (size_t)(end - p - 6), 0, &jerr);
            e = json_object_get(j, "error");
            if (e != NULL) {
                json_t *c = json_object_get(e, "code");
                snprintf(kind, cap, "stream error %s",
                         json_is_string(c) ? json_string_value(c) : "(no code)");
                json_decref(j);
                epd_free(acc);
                return 0;
            }
            t = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text");
            if (json_is_string(t)) {
                size_t n = json_string_length(t);
                if (len + n + 1 > cap_out) {
                    char *bigger = epd_realloc(acc, (len + n + 1) * 2);
                    if (bigger == NULL) {
                        json_decref(j);
                        break;
                    }
                    acc = bigger;
                    cap_out = (len + n + 1) * 2;
                }
                memcpy(acc + len, json_string_value(t), n);
                len += n;
            }
            json_decref(j);
            p = end + 2;
        }
        if (!done) {
            epd_free(acc);
            return -1;
        }
        acc[len] = '\0';
        *out = acc;
        *out_len = len;
        return 1;
    }
}

static void so_one(so_run_t *s, uint64_t k, epd_rng_t *rng, char *buf)
{
    so_opts_t *o = s->o;
    uint32_t pi = (uint32_t)((k * 2654435761u) % (uint64_t)o->prompts);
    so_prompt_t *p = &s->prompt[pi];
    int stream = (int)((k / (uint64_t)o->prompts) % 2);
    int abort_it = epd_rng_uniform(rng) < o->abort_ratio;
    char body[2048], head[256], kind[64] = "";
    int fd, one = 1, hl, bl, status = 0;
    struct timeval tv = {.tv_sec = o->timeout_s, .tv_usec = 0};
    size_t len = 0;
    uint64_t t0, t1;
    char *got = NULL, *b;
    size_t got_len = 0;
    int rc = -1, hung = 0;

    bl = snprintf(body, sizeof(body),
                  "{\"model\":\"m\",\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0.8,"
                  "\"top_p\":0.95,\"seed\":11,\"stream\":%s}",
                  p->text, p->max_tokens, stream ? "true" : "false");
    hl = snprintf(head, sizeof(head),
                  "POST /v1/completions HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\n"
                  "Content-Length: %d\r\n\r\n",
                  o->http, bl);
    t0 = epd_time_now_ns();
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&o->addr, sizeof(o->addr)) != 0) {
        snprintf(kind, sizeof(kind), "connect: %s", strerror(errno));
        goto end;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl ||
        send(fd, body, (size_t)bl, MSG_NOSIGNAL) != bl) {
        snprintf(kind, sizeof(kind), "send failed");
        goto end;
    }
    if (abort_it) {
        epd_time_sleep_ns((uint64_t)(epd_rng_uniform(rng) * 30.0 * EPD_NSEC_PER_MSEC));
        close(fd);
        pthread_mutex_lock(&s->lock);
        s->aborted++;
        pthread_mutex_unlock(&s->lock);
        return;
    }
    for (;;) {
        ssize_t n = recv(fd, buf + len, SO_BUF - 1 - len, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            hung = 1;
            break;
        }
        if (n <= 0) {
            break;
        }
        len += (size_t)n;
        if (len >= SO_BUF - 1) {
            break;
        }
    }
    buf[len] = '\0';
    if (hung) {
        goto end;
    }
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1 || (b = strstr(buf, "\r\n\r\n")) == NULL) {
        snprintf(kind, sizeof(kind), "no HTTP answer");
        goto end;
    }
    {
        /* the router's epd-no-worker-wait-ms: it waited for a usable pair */
        static const char hdr[] = "\r\nepd-no-worker-wait-ms: ";
        const char *h = strstr(buf, hdr);
        double w = h != NULL && h < b ? strtod(h + sizeof(hdr) - 1, NULL) : -1;

        pthread_mutex_lock(&s->lock);
        if (w >= 0) {
            s->wait_ms[s->n_wait++] = w;
            s->wait_served += status == 200;
            s->wait_503 += status == 503;
        }
        if (status == 503 && strstr(b, "no prefill or decode worker") != NULL &&
            w < (double)o->no_worker_wait_ms) {
            s->early_503++;
        }
        pthread_mutex_unlock(&s->lock);
    }
    b += 4;
    if (status != 200) {
        /* by the status a worker reported, when the message names one */
        const char *e = strstr(b, "EPD_ERR_");
        size_t el = e != NULL ? strspn(e, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") : 0;

        snprintf(kind, sizeof(kind), "HTTP %d%s%.*s", status, el > 0 ? " " : "", (int)el,
                 e != NULL ? e : "");
        pthread_mutex_lock(&s->lock);
        for (int i = 0; i < SO_ERR_SAMPLES; i++) {
            if (s->err_sample[i][0] == '\0') {
                snprintf(s->err_sample[i], sizeof(s->err_sample[i]), "%d %.200s", status, b);
                break;
            }
            if (atoi(s->err_sample[i]) == status) {
                break; /* one per status */
            }
        }
        pthread_mutex_unlock(&s->lock);
        goto end;
    }
    rc = so_parse(b, stream, &got, &got_len, kind, sizeof(kind));
    if (rc < 0) {
        snprintf(kind, sizeof(kind), "%s", stream ? "stream cut without [DONE]" : "bad body");
    }
end:
    t1 = epd_time_now_ns();
    if (fd >= 0) {
        close(fd);
    }
    pthread_mutex_lock(&s->lock);
    if (hung) {
        s->hung++;
    } else {
        s->t_ms[s->n_t++] = (double)(t1 - t0) / 1e6;
        if (rc == 1 && got_len == p->want_len && memcmp(got, p->want, got_len) == 0) {
            s->equal++;
        } else if (rc == 1) {
            if (s->wrong++ == 0) {
                snprintf(s->first_wrong, sizeof(s->first_wrong),
                         "request %llu (prompt %u, stream %d): want '%.150s' got '%.150s'",
                         (unsigned long long)k, pi, stream, p->want, got);
            }
        } else {
            s->errors++;
            so_kind_add(s, kind);
        }
    }
    pthread_mutex_unlock(&s->lock);
    epd_free(got);
}

static void *so_client(void *arg)
{
    so_run_t *s = arg;
    char *buf = epd_malloc(SO_BUF);
    epd_rng_t rng;

    epd_rng_seed(&rng, (uint64_t)s->o->seed * 7919 + (uint64_t)(uintptr_t)&rng);
    for (;;) {
        long long k = atomic_fetch_add(&s->next, 1);
        if (k >= s->o->requests || buf == NULL) {
            break;
        }
        if (s->o->requests >= 20000 && k > 0 && k % (s->o->requests / 10) == 0) {
            fprintf(stderr, "soak: %lld of %lld sent\n", k, (long long)s->o->requests);
        }
        so_one(s, (uint64_t)k, &rng, buf);
    }
    epd_free(buf);
    return NULL;
}

/* ----------------------------------------------------------------- chaos */

static void *so_chaos(void *arg)
{
    so_run_t *s = arg;
    epd_rng_t rng;

    epd_rng_seed(&rng, (uint64_t)s->o->seed);
    while (!atomic_load(&s->done)) {
        uint64_t end = epd_time_now_ns() + (uint64_t)s->o->chaos_ms * EPD_NSEC_PER_MSEC;
        int i, what;

        while (!atomic_load(&s->done) && epd_time_now_ns() < end) {
            epd_time_sleep_ns(20 * EPD_NSEC_PER_MSEC);
        }
        if (atomic_load(&s->done)) {
            break;
        }
        i = (int)(epd_rng_next(&rng) % (uint64_t)s->n_workers);
        what = (int)(epd_rng_next(&rng) % 3); /* 2 of 3 stops, 1 of 3 kills */
        if (what < 2) {
            uint64_t ms = 300 + epd_rng_next(&rng) % 1200;
            kill(s->w[i].pid, SIGSTOP);
            s->w[i].stopped = 1;
            s->stops++;
            epd_time_sleep_ns(ms * EPD_NSEC_PER_MSEC);
            kill(s->w[i].pid, SIGCONT);
            s->w[i].stopped = 0;
        } else {
            int status;
            kill(s->w[i].pid, SIGKILL);
            (void)epd_bench_reap(s->w[i].pid, &status, 0);
            s->kills++;
            if (so_start(s, i) != 0) {
                atomic_store(&s->done, 2);
                break;
            }
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ the metrics */

/* The router's /metrics (GET, 5 s at most; owned by the caller), or NULL. */
static char *so_metrics(const so_opts_t *o)
{
    char *text = NULL;

    return epd_bench_http_get(o->http, "/metrics", 5000, &text, NULL) == EPD_OK ? text : NULL;
}

/* The sum of every series of metric `name` (any labels). */
static double so_metric_sum(const char *text, const char *name)
{
    size_t nl = strlen(name);
    double sum = 0;

    for (const char *p = text; p != NULL && *p != '\0';) {
        const char *eol = strchr(p, '\n');
        if (strncmp(p, name, nl) == 0 && (p[nl] == ' ' || p[nl] == '{')) {
            const char *v = strchr(p, ' ');
            if (v != NULL && (eol == NULL || v < eol)) {
                sum += strtod(v + 1, NULL);
            }
        }
        p = eol != NULL ? eol + 1 : NULL;
    }
    return sum;
}

/* Counts lines holding `what` in every log of the run; with last_number,
 * the sum over logs of the number after the ':' of the last such line
 * (the faults log their count at each power of two and when they stop). */
static uint64_t so_logs_count(const so_run_t *s, const char *what, int last_number)
{
    uint64_t total = 0;

    for (int i = 0; i < s->n_workers; i++) {
        for (int inc = 1; inc <= s->w[i].incarnation; inc++) {
            char path[PATH_MAX + 64], line[1024];
            uint64_t last = 0;
            FILE *f;

            snprintf(path, sizeof(path), "%s/%s.%d.log", s->o->tmp, s->w[i].name, inc);
            f = fopen(path, "r");
            if (f == NULL) {
                continue;
            }
            while (fgets(line, sizeof(line), f) != NULL) {
                const char *p = strstr(line, what);
                if (p == NULL) {
                    continue;
                }
                if (last_number) {
                    const char *c = strchr(p, ':');
                    last = c != NULL ? strtoull(c + 1, NULL, 10) : last;
                } else {
                    total++;
                }
            }
            total += last;
            fclose(f);
        }
    }
    return total;
}

/* $TMPDIR when set (an absolute path that leaves room for our names), else /tmp. */
static const char *so_tmpdir(void)
{
    const char *t = getenv("TMPDIR");

    return t != NULL && t[0] == '/' && strlen(t) < PATH_MAX - 64 ? t : "/tmp";
}

static int so_run_cmd(char *const argv[], const char *log)
{
    int status = 0;
    pid_t pid = epd_bench_spawn(argv, log);

    return pid > 0 && epd_bench_reap(pid, &status, 0) == pid && WIFEXITED(status) &&
                   WEXITSTATUS(status) == 0
               ? 0
               : -1;
}

int epd_bench_soak_main(int argc, char **argv)
{
    so_opts_t o = {
        .requests = 2000,
        .clients = 8,
        .prompts = 12,
        .chaos_ms = 1500,
        .timeout_s = 60,
        .seed = 1,
        .decode = 1,
        .no_worker_wait_ms = 5000,
        .abort_ratio = 0.05,
        .router_log_level = "warn",
        .faults = "drop=0.0005,delay=20:0.005,dup=0.0005,reorder=0.0005,corrupt=0.0005,"
                  "stall=200:0.0005",
    };
    const epd_opt_t opts[] = {
        {"requests", EPD_OPT_INT, &o.requests, 1, 100000000, "requests in all"},
        {"clients", EPD_OPT_INT, &o.clients, 1, 512, "concurrent clients"},
        {"prompts", EPD_OPT_INT, &o.prompts, 1, SO_PROMPTS_MAX, "distinct prompts"},
        {"chaos-ms", EPD_OPT_INT, &o.chaos_ms, 0, 3600000,
         "a worker stopped (SIGSTOP/SIGCONT) or killed and restarted this often (0: never)"},
        {"abort-ratio", EPD_OPT_DOUBLE, &o.abort_ratio, 0, 1, "requests the client abandons"},
        {"decode", EPD_OPT_INT, &o.decode, 1, SO_WORKERS_MAX - 2, "decode workers (1 or 2)"},
        {"no-worker-wait-ms", EPD_OPT_INT, &o.no_worker_wait_ms, 0, 3600000,
         "the router's --no-worker-wait-ms (0: a request without a usable pair is answered "
         "503 at once)"},
        {"faults", EPD_OPT_STRING, &o.faults, 0, 0,
         "EPD_XPORT_FAULTS of the workers (\"\": none)"},
        {"timeout-s", EPD_OPT_INT, &o.timeout_s, 1, 3600, "a request unanswered this long hangs"},
        {"seed", EPD_OPT_INT, &o.seed, 0, (double)INT64_MAX, "seed of the workload and chaos"},
        {"bin", EPD_OPT_STRING, &o.bindir_opt, 0, 0, "folder of the daemons (default: ours)"},
        {"keep", EPD_OPT_BOOL, &o.keep, 0, 0, "keep the temp folder (logs)"},
        {"router-log-level", EPD_OPT_STRING, &o.router_log_level, 0, 0,
         "the router's --log-level (info: every retry and its cause)"},
    };
    epd_opts_t eo = {.prog = "epd-bench soak",
                     .summary = "requests through a cluster under faults, stalls, kills and "
                                "aborts; every finished answer checked against epd-generate",
                     .opts = opts,
                     .n_opts = sizeof(opts) / sizeof(opts[0])};
    static so_run_t s;
    pthread_t *th = NULL, chaos;
    pid_t router = -1;
    epd_secret_t sec;
    char rexe[PATH_MAX + 32], rready[PATH_MAX + 32], rlog[PATH_MAX + 32], mlog[PATH_MAX + 32];
    char mk[PATH_MAX + 32];
    double free_b = -1, total_b = -1, late = 0, quar = 0, p50 = 0, p99 = 0;
    uint64_t t_start, corrupt, injected;
    int rc = 1, argi, have_secret = 0, chaos_on = 0;
    epd_status_t st;
    char *m;

    signal(SIGPIPE, SIG_IGN);
    st = epd_opts_parse(&eo, argc, argv, &argi);
    if (st != EPD_OK || argi != argc) {
        epd_opts_cleanup(&eo);
        return st == EPD_ERR_CANCELED ? 0 : 2;
    }
    if (o.bindir_opt != NULL) {
        snprintf(o.bindir, sizeof(o.bindir), "%s", o.bindir_opt);
    } else if (epd_bench_bindir(o.bindir, sizeof(o.bindir)) != 0) {
        o.bindir[0] = '\0';
    }
    s.o = &o;
    pthread_mutex_init(&s.lock, NULL);
    s.w[0] = (so_worker_t){.name = "prefill-0", .role = "prefill"};
    s.w[1] = (so_worker_t){.name = "prefill-1", .role = "prefill"};
    s.w[2] = (so_worker_t){.name = "decode-0", .role = "decode"};
    s.w[3] = (so_worker_t){.name = "decode-1", .role = "decode"};
    s.n_workers = 2 + (int)o.decode;
    s.t_ms = epd_calloc((size_t)o.requests, sizeof(*s.t_ms));
    s.wait_ms = epd_calloc((size_t)o.requests, sizeof(*s.wait_ms));
    th = epd_calloc((size_t)o.clients, sizeof(*th));
    snprintf(o.tmp, sizeof(o.tmp), "%s/epd-soak.XXXXXX", so_tmpdir());
    if (s.t_ms == NULL || s.wait_ms == NULL || th == NULL || mkdtemp(o.tmp) == NULL ||
        epd_bench_make_secret(o.tmp, o.secret, sizeof(o.secret), &sec, "soak") != 0) {
        goto out;
    }
    have_secret = 1;
    if (o.faults[0] != '\0') {
        setenv("EPD_XPORT_FAULTS", o.faults, 1); /* the children inherit it */
    }
    /* the tiny model of the integration tests */
    snprintf(o.model, sizeof(o.model), "%s/m", o.tmp);
    snprintf(mk, sizeof(mk), "%s/epd-mkmodel", o.bindir);
    snprintf(mlog, sizeof(mlog), "%s/mkmodel.log", o.tmp);
    {
        char *a[] = {mk, "--out", o.model, "--layers", "3", "--dim", "64", "--heads", "4",
                     "--kv-heads", "2", "--layer-pattern", "LLA", "--ffn", "128", "--vocab", "258",
                     "--vision", "0", "--max-context", "2048", "--seed", "7", NULL};
        if (so_run_cmd(a, mlog) != 0) {
            fprintf(stderr, "soak: epd-mkmodel failed (log: %s)\n", mlog);
            goto out;
        }
    }
    for (int64_t i = 0; i < o.prompts; i++) {
        so_prompt_t *p = &s.prompt[i];
        size_t n = 8 + (size_t)i * 37 % 300;

        snprintf(p->text, sizeof(p->text), "Soak %lld: ", (long long)i);
        for (size_t k = strlen(p->text); k < n && k < sizeof(p->text) - 1; k++) {
            p->text[k] = so_filler[(k * 7 + (size_t)i) % (sizeof(so_filler) - 1)];
            p->text[k + 1] = '\0';
        }
        p->max_tokens = 4 + (int)(i * 7 % 21);
        if (so_expect(&s, p) != 0) {
            goto out;
        }
    }
    /* the router (no faults of its own: EPD_XPORT_FAULTS is for the workers) */
    snprintf(rexe, sizeof(rexe), "%s/epd-router", o.bindir);
    snprintf(rready, sizeof(rready), "%s/router.ready", o.tmp);
    snprintf(rlog, sizeof(rlog), "%s/router.log", o.tmp);
    unsetenv("EPD_XPORT_FAULTS");
    {
        char nww[24];
        char *a[] = {rexe, "--listen", "127.0.0.1:0", "--control-addr", "127.0.0.1:0",
                     "--model", o.model, "--served-model-name", "m", "--ready-file", rready,
                     "--cluster-secret-file", o.secret, "--max-connections-per-addr", "0",
                     "--heartbeat-ms", "100", "--dead-after-ms", "1000", "--log-level",
                     (char *)o.router_log_level,
                     NULL, NULL, NULL};

        size_t n = sizeof(a) / sizeof(a[0]);

        snprintf(nww, sizeof(nww), "%lld", (long long)o.no_worker_wait_ms);
        a[n - 3] = "--no-worker-wait-ms";
        a[n - 2] = nww;
        router = epd_bench_spawn(a, rlog);
    }
    if (o.faults[0] != '\0') {
        setenv("EPD_XPORT_FAULTS", o.faults, 1);
    }
    if (router < 0 || epd_bench_wait_ready(rready, router, "http", o.http, sizeof(o.http)) != 0 ||
        epd_bench_wait_ready(rready, router, "control", o.ctl, sizeof(o.ctl)) != 0) {
        fprintf(stderr, "soak: the router did not start (log: %s)\n", rlog);
        goto out;
    }
    {
        const char *colon = strrchr(o.http, ':');
        o.addr.sin_family = AF_INET;
        o.addr.sin_port = htons((uint16_t)atoi(colon != NULL ? colon + 1 : "0"));
        o.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
    for (int i = 0; i < s.n_workers; i++) {
        if (so_start(&s, i) != 0) {
            goto out;
        }
    }
    if (epd_bench_wait_workers(o.ctl, &sec, s.n_workers) != 0) {
        fprintf(stderr, "soak: the workers did not register (logs in %s)\n", o.tmp);
        goto out;
    }
    fprintf(stderr, "soak: %lld requests from %lld clients (logs in %s)\n", (long long)o.requests,
            (long long)o.clients, o.tmp);
    t_start = epd_time_now_ns();
    if (o.chaos_ms > 0) {
        chaos_on = pthread_create(&chaos, NULL, so_chaos, &s) == 0;
    }
    for (int64_t i = 0; i < o.clients; i++) {
        if (pthread_create(&th[i], NULL, so_client, &s) != 0) {
            fprintf(stderr, "soak: cannot start client %lld\n", (long long)i);
            exit(1);
        }
    }
    for (int64_t i = 0; i < o.clients; i++) {
        pthread_join(th[i], NULL);
    }
    if (chaos_on) {
        if (atomic_load(&s.done) != 2) {
            atomic_store(&s.done, 1);
        }
        pthread_join(chaos, NULL);
    }
    for (int i = 0; i < s.n_workers; i++) {
        kill(s.w[i].pid, SIGCONT);
    }
    /* the leak check: the decode worker's free blocks back to its total
     * (its heartbeats carry them), 60 s at most */
    for (int i = 0; i < 600; i++) {
        m = so_metrics(&o);
        free_b = so_metric_sum(m, "epd_router_worker_kv_blocks_free");
        total_b = so_metric_sum(m, "epd_router_worker_kv_blocks");
        late = so_metric_sum(m, "epd_router_worker_late_writes_refused_total");
        quar = so_metric_sum(m, "epd_router_worker_quarantined");
        epd_free(m);
        if (total_b > 0 && free_b == total_b) {
            break;
        }
        epd_time_sleep_ns(100 * EPD_NSEC_PER_MSEC);
    }
    if (s.n_t > 0) {
        epd_bench_sort(s.t_ms, s.n_t);
        p50 = epd_bench_pct(s.t_ms, s.n_t, 50);
        p99 = epd_bench_pct(s.t_ms, s.n_t, 99);
    }
    for (int i = 0; i < s.n_workers; i++) {
        epd_bench_kill(s.w[i].pid, "soak", s.w[i].name);
        s.w[i].pid = -1;
    }
    epd_bench_kill(router, "soak", "router");
    router = -1;
    corrupt = so_logs_count(&s, "fails its MAC", 0) + so_logs_count(&s, "match its checksum", 0);
    injected = so_logs_count(&s, "xport faults injected", 1);
    printf("epd-bench soak: %lld requests, %lld clients, %lld prompts, ref model (tiny), router + "
           "2 prefill + %lld decode, ucx; faults \"%s\"; chaos every %lld ms; abort ratio %g; "
           "no-worker wait %lld ms; %.0f s\n",
           (long long)o.requests, (long long)o.clients, (long long)o.prompts, (long long)o.decode,
           o.faults, (long long)o.chaos_ms, o.abort_ratio, (long long)o.no_worker_wait_ms,
           (double)(epd_time_now_ns() - t_start) / 1e9);
    printf("  requests              %lld\n", (long long)o.requests);
    printf("  finished equal        %llu\n", (unsigned long long)s.equal);
    printf("  finished wrong        %llu\n", (unsigned long long)s.wrong);
    printf("  aborted (by client)   %llu\n", (unsigned long long)s.aborted);
    printf("  terminal errors       %llu\n", (unsigned long long)s.errors);
    for (int i = 0; i < s.n_kinds; i++) {
        printf("    %-28s %llu\n", s.kinds[i].kind, (unsigned long long)s.kinds[i].n);
    }
    printf("  hung (> %lld s)        %llu\n", (long long)o.timeout_s, (unsigned long long)s.hung);
    printf("  corruptions detected  %llu (frames refused by their MAC, KV by its checksum, as "
           "logged)\n",
           (unsigned long long)corrupt);
    printf("  late writes refused   %.0f\n", late);
    printf("  blocks quarantined    %.0f (at the end)\n", quar);
    printf("  blocks leaked         %.0f (decode free %.0f of %.0f)\n",
           total_b > 0 ? total_b - free_b : -1.0, free_b, total_b);
    printf("  stops / kills         %llu / %llu\n", (unsigned long long)s.stops,
           (unsigned long long)s.kills);
    printf("  faults injected       %llu (each worker incarnation's last logged count: its "
           "total when it stopped, at least half of it when killed)\n",
           (unsigned long long)injected);
    printf("  served                %.2f%% of the requests not aborted\n",
           o.requests > (int64_t)s.aborted
               ? 100.0 * (double)s.equal / (double)((uint64_t)o.requests - s.aborted)
               : 0.0);
    printf("  time to terminal      p50 %.1f ms, p99 %.1f ms\n", p50, p99);
    if (s.n_wait > 0) {
        epd_bench_sort(s.wait_ms, s.n_wait);
        printf("  waited for a worker   %llu (then served %llu, 503 %llu); wait p50 %.0f ms, p99 "
               "%.0f ms, max %.0f ms\n",
               (unsigned long long)s.n_wait, (unsigned long long)s.wait_served,
               (unsigned long long)s.wait_503, epd_bench_pct(s.wait_ms, s.n_wait, 50),
               epd_bench_pct(s.wait_ms, s.n_wait, 99),
               s.wait_ms[s.n_wait - 1]);
    } else {
        printf("  waited for a worker   0\n");
    }
    printf("  503 before the wait   %llu (\"no worker\" answers before --no-worker-wait-ms)\n",
           (unsigned long long)s.early_503);
    for (int i = 0; i < SO_ERR_SAMPLES && s.err_sample[i][0] != '\0'; i++) {
        printf("  first HTTP %s\n", s.err_sample[i]);
    }
    if (s.wrong > 0) {
        printf("  first wrong: %s\n", s.first_wrong);
    }
    rc = s.wrong > 0 || s.hung > 0 || total_b <= 0 || free_b != total_b || atomic_load(&s.done) == 2
             ? 1
             : 0;
out:
    for (int i = 0; i < s.n_workers; i++) {
        if (s.w[i].pid > 0) {
            kill(s.w[i].pid, SIGCONT);
            epd_bench_kill(s.w[i].pid, "soak", s.w[i].name);
        }
    }
    epd_bench_kill(router, "soak", "router");
    if (have_secret) {
        epd_secret_wipe(&sec);
    }
    if (!o.keep && rc == 0 && o.tmp[0] != '\0') {
        char rmcmd[PATH_MAX + 16];
        snprintf(rmcmd, sizeof(rmcmd), "rm -rf '%s'", o.tmp);
        (void)!system(rmcmd);
    } else if (o.tmp[0] != '\0') {
        fprintf(stderr, "soak: logs kept in %s\n", o.tmp);
    }
    for (int64_t i = 0; i < o.prompts; i++) {
        epd_free(s.prompt[i].want);
    }
    epd_free(s.t_ms);
    epd_free(s.wait_ms);
    epd_free(th);
    epd_opts_cleanup(&eo);
    return rc;
}
