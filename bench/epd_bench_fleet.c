/*
 * epd_bench_fleet.c — `epd-bench fleet`: what holding a fleet of workers
 * costs the router.
 *
 * The bench starts a real cluster (epd-router, one epd-prefill and one
 * epd-decode on the sim engine, a fresh 0600 cluster secret), then grows a
 * fleet of simulated workers in this process to each size asked for
 * (default 0, 10, 100, 1,000) and, at each size, measures the router:
 *   - its CPU per second of wall time while the fleet only heartbeats
 *     (utime + stime of the router process from /proc/PID/stat: every
 *     thread, those that exited included), and while requests run;
 *   - its resident memory (VmRSS);
 *   - the latency of the same small completion (POST /v1/completions, not
 *     streamed, 8 tokens), one at a time, served by the real prefill and
 *     decode pair; the ratio against the first size (0: no fleet) is the
 *     router's added latency.
 *
 * A simulated worker is what a real one is to the router's control plane
 * and registry: its own worker id and epoch, a RegisterWorker with the
 * model's KV layout, a Heartbeat at the interval the router asks for
 * (500 ms by default) carrying its load — each one is a daemon/epd_registrar
 * (its own thread and gRPC channel, every call signed with the cluster
 * secret), exactly the code a daemon runs.  Its data-plane address is that
 * of one real transport worker (UCX, authenticated) in this process, so the
 * router opens, handshakes and keeps alive one request-plane endpoint per
 * simulated worker, as it does per real one.
 *
 * What they do not do: serve.  Their heartbeats report a plausible but
 * heavy load (prefill: 64 Ki prompt tokens queued; decode: every batch slot
 * busy, 5 % of KV blocks free), so they are READY and scanned by every
 * pick, but the least-load policy (the router's default) never prefers them
 * to the idle real pair while requests go one at a time.  A request the
 * router nonetheless sends to one is counted ("strays") and shows up as a
 * timed-out sample.
 *
 * `--attach HOST:PORT --secret-file F` runs only the fleet against an
 * existing router for `--hold` seconds (no cluster, no table): for tests.
 *
 * Threads: the fleet lives on its own libuv loop thread (the transport and
 * the registrars' publish timers belong to it; epd_bench_fleet_sim.c); the
 * main thread measures (this file) and asks the fleet thread to grow or
 * stop (a mutex, a condition variable and uv_async_send).
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_fleet_int.h"
#include "epd_bench_http.h"
#include "epd_client.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_rpc.h"
#include "epd_secret.h"
#include "epd_time.h"

/* ---------------------------------------------------- the router's costs */

static double fl_rss_mib(pid_t pid)
{
    char path[64], line[256];
    double kib = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kib = strtod(line + 6, NULL);
        }
    }
    fclose(f);
    return kib / 1024.0;
}

/* Polls the router's Status until at least `want` workers are READY (the
 * READY count in *ready_p).  0, or -1 after timeout_s. */
static int fl_wait_ready(const fl_t *b, uint32_t want, double timeout_s, uint32_t *ready_p)
{
    epd_rpc_client_t *c = NULL;
    uint64_t end = epd_time_now_ns() + (uint64_t)(timeout_s * 1e9);
    uint32_t ready = 0;

    if (epd_rpc_client_create(b->router_ctl, &c) != EPD_OK) {
        return -1;
    }
    if (epd_rpc_client_set_auth(c, b->secret.bytes, b->secret.len) != EPD_OK) {
        epd_rpc_client_destroy(c);
        return -1;
    }
    for (;;) {
        void *resp = NULL;
        size_t len = 0;
        ProtobufCMessage *m = NULL;

        if (epd_rpc_call(c, EPD_RPC_STATUS, NULL, 0, 3000, &resp, &len, NULL, 0) == EPD_OK &&
            epd_proto_unpack(&epd__status_response__descriptor, resp, len, &m) == EPD_OK) {
            Epd__StatusResponse *s = (Epd__StatusResponse *)m;

            ready = 0;
            for (size_t i = 0; i < s->n_workers; i++) {
                ready += s->workers[i]->state == EPD__WORKER_STATE__WORKER_STATE_READY;
            }
            epd_proto_free(m);
        }
        epd_free(resp);
        if (ready >= want || epd_time_now_ns() > end) {
            break;
        }
        epd_time_sleep_ns(200 * EPD_NSEC_PER_MSEC);
    }
    epd_rpc_client_destroy(c);
    *ready_p = ready;
    return ready >= want ? 0 : -1;
}

/* One completion through the router (a fresh connection, not streamed).
 * Its latency in ms (connect to the answer's end), or a negative value
 * when it failed. */
static double fl_request(const fl_t *b)
{
    static const char prompt[] = "How much does a fleet of idle workers cost the router?";
    epd_bench_http_resp_t r;
    char body[512];
    uint64_t t0;
    int bl, ok;

    bl = snprintf(body, sizeof(body),
                  "{\"model\":\"sim\",\"prompt\":\"%s\",\"max_tokens\":%u,\"temperature\":0}",
                  prompt, b->max_tokens);
    t0 = epd_time_now_ns();
    if (epd_bench_http_request(b->router_http, "POST", "/v1/completions", body, (size_t)bl,
                               30000, 1 << 20, &r) != EPD_OK) {
        return -1;
    }
    ok = r.status == 200 && strstr(r.body, "\"choices\"") != NULL;
    epd_bench_http_resp_cleanup(&r);
    return ok ? (double)(epd_time_now_ns() - t0) / 1e6 : -1;
}

/* Grows the fleet to `size` and measures the router (one row). */
static int fl_measure(fl_t *b, uint32_t size, fl_row_t *row)
{
    uint64_t c0, c1, t0, t1, h0, h1, f0, f1, s0;
    double *lat;
    uint32_t n = 0, have;

    memset(row, 0, sizeof(*row));
    row->size = size;
    /* in steps of FL_STEP workers, each READY before the next: the one
     * transport worker behind every simulated one takes EPD_XPORT's bounded
     * number of handshakes at once, which a real fleet (a transport per
     * worker) would not meet */
    pthread_mutex_lock(&b->mu);
    have = b->have;
    pthread_mutex_unlock(&b->mu);
    while (have < size) {
        have = size - have > FL_STEP ? have + FL_STEP : size;
        if (epd__fl_grow(b, have) != 0) {
            return -1;
        }
        if (fl_wait_ready(b, have + 2, 120, &row->ready) != 0) {
            fprintf(stderr, "fleet: %u of %u workers READY at the router after 120 s\n",
                    row->ready, have + 2);
            return -1;
        }
    }
    if (fl_wait_ready(b, size + 2, 120, &row->ready) != 0) {
        fprintf(stderr, "fleet: %u of %u workers READY at the router after 120 s\n", row->ready,
                size + 2);
        return -1;
    }
    /* a full heartbeat round of every new worker before measuring */
    epd_time_sleep_ns(1500 * EPD_NSEC_PER_MSEC);
    /* heartbeats only */
    h0 = epd__fl_heartbeats(b, &f0);
    t0 = epd_time_now_ns();
    if (epd_bench_cpu_ns(b->pids[0], &c0) != 0) {
        return -1;
    }
    epd_time_sleep_ns((uint64_t)(b->idle_s * 1e9));
    t1 = epd_time_now_ns();
    if (epd_bench_cpu_ns(b->pids[0], &c1) != 0) {
        return -1;
    }
    h1 = epd__fl_heartbeats(b, &f1);
    row->cpu_idle = (double)(c1 - c0) / 1e6 / ((double)(t1 - t0) / 1e9);
    row->hb_per_s = (double)(h1 - h0) / ((double)(t1 - t0) / 1e9);
    row->hb_failed_per_s = (double)(f1 - f0) / ((double)(t1 - t0) / 1e9);
    /* requests, one at a time */
    lat = epd_calloc(b->requests > 0 ? b->requests : 1, sizeof(*lat));
    if (lat == NULL) {
        return -1;
    }
    /* not counted: the first requests of a run set up the router's
     * endpoints to the real pair and the pair's to each other */
    for (int i = 0; i < 3; i++) {
        (void)fl_request(b);
    }
    s0 = atomic_load(&b->strays);
    t0 = epd_time_now_ns();
    epd_bench_cpu_ns(b->pids[0], &c0);
    for (uint32_t i = 0; i < b->requests; i++) {
        double ms = fl_request(b);

        if (ms >= 0) {
            lat[n++] = ms;
        } else {
            row->failed++;
        }
    }
    t1 = epd_time_now_ns();
    epd_bench_cpu_ns(b->pids[0], &c1);
    row->cpu_req = (double)(c1 - c0) / 1e6 / ((double)(t1 - t0) / 1e9);
    row->strays = atomic_load(&b->strays) - s0;
    row->rss_mib = fl_rss_mib(b->pids[0]);
    epd_bench_sort(lat, n);
    row->ok = n;
    if (n > 0) { /* nearest rank, as every epd-bench table; 0 when none */
        row->p50 = epd_bench_pct(lat, n, 50);
        row->p90 = epd_bench_pct(lat, n, 90);
        row->p99 = epd_bench_pct(lat, n, 99);
    }
    epd_free(lat);
    fprintf(stderr, "fleet: size %u measured (%u READY, %.0f heartbeats/s)\n", size, row->ready,
            row->hb_per_s);
    return 0;
}

static void fl_print(const fl_t *b)
{
    const fl_row_t *base = &b->rows[0];
    double la[3];

    printf("\nepd-bench fleet: the router's cost of a fleet of simulated workers "
           "(heartbeat 500 ms; %u sequential requests of %u tokens per size)\n",
           b->requests, b->max_tokens);
    if (getloadavg(la, 3) == 3) {
        printf("load average %.2f %.2f %.2f, %ld CPUs online\n", la[0], la[1], la[2],
               sysconf(_SC_NPROCESSORS_ONLN));
    }
    printf("%6s %6s %6s %6s | %8s %8s %8s %9s | %7s %7s %7s %7s %7s | %6s\n", "fleet",
           "READY", "hb/s", "failed", "cpu", "added", "per hb", "cpu reqs", "RSS", "p50", "p99", "p50", "p50",
           "fail/");
    printf("%6s %6s %6s %6s | %8s %8s %8s %9s | %7s %7s %7s %7s %7s | %6s\n", "", "", "", "hb/s",
           "ms/s",
           "ms/s", "us", "ms/s", "MiB", "ms", "ms", "+ms", "ratio", "stray");
    for (int i = 0; i < b->n_sizes; i++) {
        const fl_row_t *r = &b->rows[i];
        double added = r->cpu_idle - base->cpu_idle;
        char fail[32];

        snprintf(fail, sizeof(fail), "%u/%llu", r->failed, (unsigned long long)r->strays);
        printf("%6u %6u %6.0f %6.1f | %8.1f %8.1f %8.1f %9.1f | %7.1f %7.2f %7.2f %+7.2f %7.2f | "
               "%6s\n",
               r->size, r->ready, r->hb_per_s, r->hb_failed_per_s, r->cpu_idle, added,
               r->hb_per_s > 0 ? added * 1000.0 / r->hb_per_s : 0.0, r->cpu_req, r->rss_mib,
               r->p50, r->p99, r->p50 - base->p50, base->p50 > 0 ? r->p50 / base->p50 : 0.0,
               fail);
    }
    printf("cpu: utime+stime of epd-router (/proc/PID/stat, every thread, %ld Hz ticks) over "
           "%.1f s of heartbeats only; added and per hb: above the first size's; cpu reqs: over "
           "the requests.  Latency: one request at a time through the router's HTTP port, "
           "served by the real prefill and decode pair; +ms and ratio against the first size.  "
           "READY includes that pair.\n",
           sysconf(_SC_CLK_TCK), b->idle_s);
}

/* ------------------------------------------------------------ the cluster */

/* The real prefill's layout and capacity (its Health, signed). */
static int fl_layout(fl_t *b)
{
    epd_rpc_client_t *c = NULL;
    void *resp = NULL;
    size_t len = 0;
    const char *why = "no answer";
    int rc = -1;

    if (epd_rpc_client_create(b->prefill_ctl, &c) == EPD_OK &&
        epd_rpc_client_set_auth(c, b->secret.bytes, b->secret.len) == EPD_OK &&
        epd_rpc_call(c, EPD_RPC_HEALTH, NULL, 0, 3000, &resp, &len, NULL, 0) == EPD_OK &&
        epd_client_health_parse(resp, len, &b->layout, &why) == EPD_OK) {
        rc = 0;
    } else {
        fprintf(stderr, "fleet: the prefill worker's Health: %s\n", why);
    }
    epd_free(resp);
    epd_rpc_client_destroy(c);
    return rc;
}

static int fl_cluster_start(fl_t *b)
{
    char rready[PATH_MAX + 16], pready[PATH_MAX + 16], dready[PATH_MAX + 16];
    char rlog[PATH_MAX + 16], plog[PATH_MAX + 16], dlog[PATH_MAX + 16];
    char exe[3][PATH_MAX + 32];

    snprintf(b->model_dir, sizeof(b->model_dir), "%s/sim", b->tmp);
    /* serve's sim model (4 attention layers, 1B-parameter timings, byte
     * tokenizer): the subject is the router, not compute */
    if (epd_bench_write_sim(b->model_dir) != 0) {
        fprintf(stderr, "fleet: cannot write the sim model into %s\n", b->model_dir);
        return -1;
    }
    snprintf(rready, sizeof(rready), "%s/router.ready", b->tmp);
    snprintf(pready, sizeof(pready), "%s/prefill.ready", b->tmp);
    snprintf(dready, sizeof(dready), "%s/decode.ready", b->tmp);
    snprintf(rlog, sizeof(rlog), "%s/router.log", b->tmp);
    snprintf(plog, sizeof(plog), "%s/prefill.log", b->tmp);
    snprintf(dlog, sizeof(dlog), "%s/decode.log", b->tmp);
    snprintf(exe[0], sizeof(exe[0]), "%s/epd-router", b->bindir);
    snprintf(exe[1], sizeof(exe[1]), "%s/epd-decode", b->bindir);
    snprintf(exe[2], sizeof(exe[2]), "%s/epd-prefill", b->bindir);
    {
        char *argv[] = {exe[0], "--listen", "127.0.0.1:0", "--control-addr", "127.0.0.1:0",
                        "--model", b->model_dir, "--engine", "sim", "--served-model-name",
                        "sim", "--ready-file", rready, "--cluster-secret-file", b->secret_file,
                        "--log-level", "warn", NULL};

        b->pids[0] = epd_bench_spawn(argv, rlog);
    }
    if (b->pids[0] < 0 ||
        epd_bench_wait_ready(rready, b->pids[0], "http", b->router_http, sizeof(b->router_http)) != 0 ||
        epd_bench_wait_ready(rready, b->pids[0], "control", b->router_ctl, sizeof(b->router_ctl)) != 0) {
        fprintf(stderr, "fleet: the router did not start (log: %s)\n", rlog);
        return -1;
    }
    {
        char *argv[] = {exe[1], "--model", b->model_dir, "--engine", "sim", "--worker-id",
                        "decode-0", "--router", b->router_ctl, "--ready-file", dready,
                        "--kv-blocks", "16384", "--max-batch", "256", "--cluster-secret-file",
                        b->secret_file, "--log-level", "warn", NULL};

        b->pids[1] = epd_bench_spawn(argv, dlog);
    }
    {
        char *argv[] = {exe[2], "--model", b->model_dir, "--engine", "sim", "--worker-id",
                        "prefill-0", "--router", b->router_ctl, "--ready-file", pready,
                        "--kv-blocks", "8192", "--cluster-secret-file", b->secret_file,
                        "--log-level", "warn", NULL};

        b->pids[2] = epd_bench_spawn(argv, plog);
    }
    if (b->pids[1] < 0 || b->pids[2] < 0 ||
        epd_bench_wait_ready(dready, b->pids[1], "control", b->decode_ctl, sizeof(b->decode_ctl)) != 0 ||
        epd_bench_wait_ready(pready, b->pids[2], "control", b->prefill_ctl, sizeof(b->prefill_ctl)) !=
            0) {
        fprintf(stderr, "fleet: a worker did not start (logs: %s, %s)\n", plog, dlog);
        return -1;
    }
    fprintf(stderr, "fleet: cluster up: router http=%s control=%s (pid %d), files in %s\n",
            b->router_http, b->router_ctl, (int)b->pids[0], b->tmp);
    return fl_layout(b);
}

static void fl_cluster_stop(fl_t *b)
{
    static const char *const names[3] = {"router", "decode", "prefill"};

    for (int i = 2; i >= 0; i--) {
        epd_bench_kill(b->pids[i], "fleet", names[i]);
        b->pids[i] = 0;
    }
}

/* ------------------------------------------------------------------ main */

static void fl_usage(FILE *out)
{
    fprintf(out,
            "usage: epd-bench fleet [options]\n"
            "  --sizes LIST        fleet sizes, ascending, comma-separated (default 0,10,100,1000;\n"
            "                      at most %d sizes, %d workers)\n"
            "  --idle-seconds S    window of heartbeats only per size (default 10)\n"
            "  --requests N        sequential requests per size (default 100)\n"
            "  --max-tokens N      tokens per request (default 8)\n"
            "  --keep              keep the cluster's folder (logs, secret) under $TMPDIR\n"
            "  --attach HOST:PORT  only run a fleet of the largest size against this router's\n"
            "                      control port (no cluster, no table), until --hold ends or\n"
            "                      SIGTERM / SIGINT; needs --like and --secret-file\n"
            "  --like HOST:PORT    with --attach: a prefill or decode worker's control port;\n"
            "                      the fleet copies its model's KV layout and capacity\n"
            "  --secret-file F     the cluster secret (with --attach)\n"
            "  --hold S            with --attach: seconds to hold the fleet (default 5)\n"
            "Simulated workers register and heartbeat like daemons but never serve (see\n"
            "docs/deploy/multihost.md).\n",
            FL_SIZES_MAX, FL_FLEET_MAX);
}

static int fl_parse_sizes(fl_t *b, const char *s)
{
    char *end;

    b->n_sizes = 0;
    while (*s != '\0') {
        unsigned long v = strtoul(s, &end, 10);

        if (end == s || v > FL_FLEET_MAX || b->n_sizes == FL_SIZES_MAX ||
            (b->n_sizes > 0 && v < b->sizes[b->n_sizes - 1])) {
            return -1;
        }
        b->sizes[b->n_sizes++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') {
            return -1;
        }
    }
    return b->n_sizes > 0 ? 0 : -1;
}

/* --attach: the fleet only, against a router someone else runs, until
 * --hold seconds passed or SIGTERM / SIGINT came. */
static int fl_attach(fl_t *b)
{
    char why[256];
    uint32_t size = b->sizes[b->n_sizes - 1];
    struct timespec ts;
    sigset_t set;
    uint64_t hb, failed;
    int sig;

    if (b->secret_path == NULL || b->like == NULL ||
        epd_secret_load(b->secret_path, &b->secret, why, sizeof(why)) != EPD_OK) {
        fprintf(stderr, "fleet: --attach needs --like and a readable --secret-file%s%s\n",
                b->secret_path != NULL ? ": " : "", b->secret_path != NULL ? why : "");
        return 2;
    }
    snprintf(b->router_ctl, sizeof(b->router_ctl), "%s", b->attach);
    snprintf(b->prefill_ctl, sizeof(b->prefill_ctl), "%s", b->like);
    if (fl_layout(b) != 0) {
        return 1;
    }
    /* blocked before any thread starts (ours, gRPC's), so that only the
     * sigtimedwait below takes them */
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    if (epd__fl_fleet_start(b) != 0 || epd__fl_grow(b, size) != 0) {
        epd__fl_fleet_stop(b);
        return 1;
    }
    printf("fleet: %u simulated workers started against %s\n", size, b->attach);
    fflush(stdout);
    ts.tv_sec = (time_t)b->hold_s;
    ts.tv_nsec = (long)((b->hold_s - (double)ts.tv_sec) * 1e9);
    do {
        sig = sigtimedwait(&set, NULL, &ts);
    } while (sig < 0 && errno == EINTR);
    hb = epd__fl_heartbeats(b, &failed);
    epd__fl_fleet_stop(b);
    printf("fleet: stopped (%s), %llu heartbeats accepted, %llu failed, %llu request-plane "
           "endpoints accepted, %llu messages to simulated workers\n",
           sig > 0 ? "signal" : "--hold ended", (unsigned long long)hb,
           (unsigned long long)failed, (unsigned long long)atomic_load(&b->accepted),
           (unsigned long long)atomic_load(&b->strays));
    return 0;
}

int epd_bench_fleet_main(int argc, char **argv)
{
    static fl_t b; /* large: the rows, the registrars' table */
    struct rlimit rl;
    const char *tmpdir = getenv("TMPDIR");
    int rc = 1;

    b.sizes[0] = 0;
    b.sizes[1] = 10;
    b.sizes[2] = 100;
    b.sizes[3] = 1000;
    b.n_sizes = 4;
    b.idle_s = 10;
    b.requests = 100;
    b.max_tokens = 8;
    b.hold_s = 5;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fl_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--keep") == 0) {
            b.keep = 1;
            continue;
        } else if (v == NULL) {
            fl_usage(stderr);
            return 2;
        } else if (strcmp(argv[i], "--sizes") == 0) {
            if (fl_parse_sizes(&b, v) != 0) {
                fprintf(stderr, "fleet: bad --sizes '%s'\n", v);
                return 2;
            }
        } else if (strcmp(argv[i], "--idle-seconds") == 0) {
            b.idle_s = strtod(v, NULL);
        } else if (strcmp(argv[i], "--requests") == 0) {
            b.requests = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(argv[i], "--max-tokens") == 0) {
            b.max_tokens = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(argv[i], "--attach") == 0) {
            b.attach = v;
        } else if (strcmp(argv[i], "--like") == 0) {
            b.like = v;
        } else if (strcmp(argv[i], "--secret-file") == 0) {
            b.secret_path = v;
        } else if (strcmp(argv[i], "--hold") == 0) {
            b.hold_s = strtod(v, NULL);
        } else {
            fl_usage(stderr);
            return 2;
        }
        i++;
    }
    if (b.idle_s <= 0 || b.idle_s > 3600 || b.hold_s < 0 || b.hold_s > 86400 ||
        b.max_tokens == 0 || b.max_tokens > 4096 || b.requests > 1000000) {
        fprintf(stderr, "fleet: an option is out of range\n");
        return 2;
    }
    /* a registrar is a thread and a gRPC channel; the router holds an
     * endpoint per worker: descriptors for both (children inherit) */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    /* one INFO line per endpoint the router opens would drown the table */
    epd_log_set_level(EPD_LOG_WARN);
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    if (b.attach != NULL) {
        return fl_attach(&b);
    }
    if (epd_bench_bindir(b.bindir, sizeof(b.bindir)) != 0) {
        fprintf(stderr, "fleet: cannot find my own binary\n");
        return 1;
    }
    snprintf(b.tmp, sizeof(b.tmp), "%s/epd-fleet.XXXXXX",
             tmpdir != NULL && tmpdir[0] != '\0' ? tmpdir : "/tmp");
    if (mkdtemp(b.tmp) == NULL) {
        fprintf(stderr, "fleet: cannot make a folder under %s: %s\n", b.tmp, strerror(errno));
        return 1;
    }
    if (epd_bench_make_secret(b.tmp, b.secret_file, sizeof(b.secret_file), &b.secret, "fleet") != 0 || fl_cluster_start(&b) != 0 || epd__fl_fleet_start(&b) != 0) {
        goto out;
    }
    for (int i = 0; i < b.n_sizes; i++) {
        if (fl_measure(&b, b.sizes[i], &b.rows[i]) != 0) {
            goto out;
        }
    }
    fl_print(&b);
    rc = 0;
out:
    epd__fl_fleet_stop(&b);
    fl_cluster_stop(&b);
    epd_secret_wipe(&b.secret);
    if (!b.keep && rc == 0) {
        char cmd[PATH_MAX + 32];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b.tmp);
        if (system(cmd) != 0) {
            fprintf(stderr, "fleet: could not remove %s\n", b.tmp);
        }
    } else {
        fprintf(stderr, "fleet: logs and the secret kept in %s\n", b.tmp);
    }
    return rc;
}

