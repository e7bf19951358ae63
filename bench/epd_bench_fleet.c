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
 * the registrars' publish timers belong to it); the main thread measures
 * and asks the fleet thread to grow or stop (a mutex, a condition variable
 * and uv_async_send).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_bench_http.h"
#include "epd_client.h"
#include "epd_log.h"
#include "epd_msg.h"
#include "epd_registrar.h"
#include "epd_rng.h"
#include "epd_rpc.h"
#include "epd_secret.h"
#include "epd_time.h"
#include "epd_xport.h"
#include "epd_xport_uv.h"

#define FL_SIZES_MAX 8
#define FL_FLEET_MAX 10000
#define FL_STEP 100 /* workers started at once */

typedef struct {
    uint32_t size;
    uint32_t ready;      /* READY workers at the router (the real pair included) */
    double hb_per_s;     /* accepted heartbeats of the fleet per second */
    double hb_failed_per_s; /* refused or timed-out heartbeats per second */
    double cpu_idle;     /* router CPU ms per s, heartbeats only */
    double cpu_req;      /* router CPU ms per s, while requests run */
    double rss_mib;      /* router VmRSS after the window */
    double p50, p90, p99; /* request latency, ms */
    uint32_t ok, failed;
    uint64_t strays; /* request-plane messages that reached a simulated worker */
} fl_row_t;

typedef struct {
    /* options */
    uint32_t sizes[FL_SIZES_MAX];
    int n_sizes;
    double idle_s;
    uint32_t requests;
    uint32_t max_tokens;
    const char *attach;
    const char *secret_path;
    const char *like; /* --attach: a worker whose layout the fleet copies */
    double hold_s;
    int keep;
    /* the cluster */
    char bindir[PATH_MAX];
    char tmp[PATH_MAX];
    char secret_file[PATH_MAX + 32];
    epd_secret_t secret;
    pid_t pids[3]; /* router, decode, prefill */
    char router_http[128], router_ctl[128], prefill_ctl[128], decode_ctl[128];
    char model_dir[PATH_MAX + 16];
    epd_client_worker_info_t layout; /* the real prefill's layout and capacity */
    /* the fleet thread */
    pthread_t thread;
    int thread_started;
    uv_loop_t loop;
    uv_async_t async;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t want;  /* mu: the size asked for */
    uint32_t have;  /* mu: registrars started */
    int stop;       /* mu: stop every registrar and the loop */
    int started;    /* mu: 1 once the transport is up, -1 when it failed */
    int failed;     /* mu: a registrar did not start */
    epd_xport_t *x;
    epd_xport_uv_t *xuv;
    const void *addr;
    size_t addr_len;
    epd_registrar_t **regs; /* [FL_FLEET_MAX] */
    _Atomic uint64_t strays;
    _Atomic uint64_t accepted;
    fl_row_t rows[FL_SIZES_MAX];
} fl_t;

/* ------------------------------------------------------------ the fleet */

static void fl_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    fl_t *b = arg;

    (void)ep;
    (void)data;
    (void)len;
    atomic_fetch_add(&b->strays, 1);
}

static void fl_on_accept(void *arg, epd_xport_ep_t *ep)
{
    fl_t *b = arg;

    (void)ep; /* the transport keeps it; closed at destroy */
    atomic_fetch_add(&b->accepted, 1);
}

/* Heavy but plausible loads (see the top of the file); loop thread. */
static void fl_load_prefill(void *arg, epd_registrar_load_t *load_p)
{
    const fl_t *b = arg;

    memset(load_p, 0, sizeof(*load_p));
    load_p->queue_depth = 8;
    load_p->queued_tokens = 65536;
    load_p->running_requests = 4;
    load_p->kv_blocks_free = b->layout.kv_blocks_total / 4;
    load_p->state_slots_free = b->layout.state_slots_total / 4;
    load_p->links[EPD_REGISTRAR_LINK_TCP] = 1;
}

static void fl_load_decode(void *arg, epd_registrar_load_t *load_p)
{
    const fl_t *b = arg;

    memset(load_p, 0, sizeof(*load_p));
    load_p->queue_depth = 2;
    load_p->running_requests = 256;
    load_p->kv_blocks_free = 16384 / 20;
    load_p->state_slots_free = b->layout.state_slots_total / 20;
}

/* Starts simulated worker `i` (even: prefill, odd: decode).  Loop thread. */
static epd_status_t fl_worker_start(fl_t *b, uint32_t i)
{
    Epd__RegisterRequest r = EPD__REGISTER_REQUEST__INIT;
    Epd__WorkerIdentity id = EPD__WORKER_IDENTITY__INIT;
    Epd__Epoch ep = EPD__EPOCH__INIT;
    Epd__Capacity cap = EPD__CAPACITY__INIT;
    Epd__KvLayout kv = EPD__KV_LAYOUT__INIT;
    epd_registrar_config_t cfg;
    char wid[64], ctl[64];
    int decode = (i & 1u) != 0;
    epd_status_t st;
    size_t n;
    void *buf;

    snprintf(wid, sizeof(wid), "sim-%s-%u", decode ? "decode" : "prefill", i);
    /* never called: the router reaches workers' control ports only for
     * operators' Drain and Status calls through it */
    snprintf(ctl, sizeof(ctl), "127.0.0.1:%u", 1u + i % 1000u);
    ep.start_time_ns = epd_time_wall_ns();
    ep.nonce = epd_rng_entropy();
    id.worker_id = wid;
    id.role = decode ? EPD__ROLE__ROLE_DECODE : EPD__ROLE__ROLE_PREFILL;
    id.model = b->layout.model;
    id.epoch = &ep;
    cap.kv_blocks_total = decode ? 16384 : b->layout.kv_blocks_total;
    cap.block_tokens = b->layout.block_tokens;
    cap.state_slots_total = b->layout.state_slots_total;
    cap.max_batch = decode ? 256 : b->layout.max_batch;
    cap.max_context = b->layout.max_context;
    kv.n_layers = b->layout.n_layers;
    kv.layer_pattern = b->layout.layer_pattern;
    kv.block_tokens = b->layout.block_tokens;
    kv.n_kv_heads = b->layout.n_kv_heads;
    kv.head_dim = b->layout.head_dim;
    kv.dtype = (Epd__KvDtype)b->layout.kv_dtype;
    /* the real prefill's KV dtype map: the router admits only workers whose
     * map is its own (without it a sim worker reads as f32 beside bf16) */
    kv.kv_dtype_map = b->layout.kv_dtype_map;
    kv.block_bytes = b->layout.block_bytes;
    kv.state_bytes = b->layout.state_bytes;
    r.worker = &id;
    r.transport = "ucx";
    r.data_plane_address.data = (uint8_t *)(uintptr_t)b->addr;
    r.data_plane_address.len = b->addr_len;
    r.control_address = ctl;
    r.data_address = "127.0.0.1";
    r.capacity = &cap;
    r.kv_layout = &kv;
    n = protobuf_c_message_get_packed_size(&r.base);
    buf = epd_malloc(n);
    if (buf == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    protobuf_c_message_pack(&r.base, buf);
    memset(&cfg, 0, sizeof(cfg));
    cfg.router = b->router_ctl;
    cfg.request = buf;
    cfg.request_len = n;
    cfg.load_cb = decode ? fl_load_decode : fl_load_prefill;
    cfg.cb_arg = b;
    cfg.log_component = "fleet";
    cfg.secret = b->secret.bytes;
    cfg.secret_len = b->secret.len;
    st = epd_registrar_start(&b->loop, &cfg, &b->regs[i]);
    epd_free(buf);
    return st;
}

static void fl_on_async(uv_async_t *h)
{
    fl_t *b = h->data;
    uint32_t want, have;
    int stop;

    pthread_mutex_lock(&b->mu);
    want = b->want;
    have = b->have;
    stop = b->stop;
    pthread_mutex_unlock(&b->mu);
    if (stop) {
        for (uint32_t i = 0; i < have; i++) {
            epd_registrar_stop(b->regs[i]);
            b->regs[i] = NULL;
        }
        epd_xport_uv_stop(b->xuv);
        b->xuv = NULL;
        uv_close((uv_handle_t *)&b->async, NULL);
        pthread_mutex_lock(&b->mu);
        b->have = 0;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
        return;
    }
    while (have < want) {
        epd_status_t st = fl_worker_start(b, have);

        if (st != EPD_OK) {
            fprintf(stderr, "fleet: simulated worker %u did not start: %s\n", have,
                    epd_status_string(st));
            pthread_mutex_lock(&b->mu);
            b->failed = 1;
            pthread_mutex_unlock(&b->mu);
            break;
        }
        have++;
    }
    pthread_mutex_lock(&b->mu);
    b->have = have;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static void *fl_thread(void *arg)
{
    fl_t *b = arg;
    epd_xport_config_t xc;
    epd_status_t st;
    int ok = 0;

    epd_xport_config_init(&xc);
    xc.backend = "ucx";
    xc.msg_cb = fl_on_msg;
    xc.accept_cb = fl_on_accept;
    xc.cb_arg = b;
    xc.peer_timeout_ms = 3000; /* the daemons' default */
    xc.connect_timeout_ms = 3000;
    xc.secret = b->secret.bytes;
    xc.secret_len = b->secret.len;
    snprintf(xc.identity.worker_id, sizeof(xc.identity.worker_id), "sim-fleet");
    xc.identity.role = EPD__ROLE__ROLE_DECODE;
    xc.identity.epoch.start_time_ns = epd_time_wall_ns();
    xc.identity.epoch.nonce = epd_rng_entropy();
    if (uv_loop_init(&b->loop) != 0) {
        pthread_mutex_lock(&b->mu);
        b->started = -1;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
        return NULL;
    }
    st = epd_xport_create(&xc, &b->x);
    if (st == EPD_OK) {
        st = epd_xport_address(b->x, &b->addr, &b->addr_len);
    }
    if (st == EPD_OK) {
        st = epd_xport_uv_start(&b->loop, b->x, 50, &b->xuv);
    }
    if (st == EPD_OK && uv_async_init(&b->loop, &b->async, fl_on_async) == 0) {
        b->async.data = b;
        ok = 1;
    } else {
        fprintf(stderr, "fleet: the simulated workers' transport did not start: %s\n",
                epd_status_string(st));
        epd_xport_uv_stop(b->xuv);
        b->xuv = NULL;
    }
    pthread_mutex_lock(&b->mu);
    b->started = ok ? 1 : -1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    uv_run(&b->loop, UV_RUN_DEFAULT); /* until fl_on_async closed every handle */
    epd_xport_destroy(b->x);
    b->x = NULL;
    uv_loop_close(&b->loop);
    return NULL;
}

/* Asks the fleet thread for `size` simulated workers and waits until they
 * were started (registration goes on in their threads).  0 or -1. */
static int fl_grow(fl_t *b, uint32_t size)
{
    int rc;

    pthread_mutex_lock(&b->mu);
    b->want = size;
    uv_async_send(&b->async);
    while (b->have < size && !b->failed) {
        pthread_cond_wait(&b->cv, &b->mu);
    }
    rc = b->failed ? -1 : 0;
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int fl_fleet_start(fl_t *b)
{
    int started;

    b->regs = epd_calloc(FL_FLEET_MAX, sizeof(*b->regs));
    if (b->regs == NULL || pthread_create(&b->thread, NULL, fl_thread, b) != 0) {
        return -1;
    }
    b->thread_started = 1;
    pthread_mutex_lock(&b->mu);
    while (b->started == 0) {
        pthread_cond_wait(&b->cv, &b->mu);
    }
    started = b->started;
    pthread_mutex_unlock(&b->mu);
    return started == 1 ? 0 : -1;
}

static void fl_fleet_stop(fl_t *b)
{
    if (b->thread_started) {
        pthread_mutex_lock(&b->mu);
        b->stop = 1;
        if (b->started == 1) {
            uv_async_send(&b->async);
        }
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->thread, NULL);
        b->thread_started = 0;
    }
    epd_free(b->regs);
    b->regs = NULL;
}

/* Accepted heartbeats of the whole fleet so far; failed ones (refused or
 * timed out) into *failed_p. */
static uint64_t fl_heartbeats(fl_t *b, uint64_t *failed_p)
{
    uint64_t n = 0, failed = 0;
    uint32_t have;

    pthread_mutex_lock(&b->mu);
    have = b->have;
    for (uint32_t i = 0; i < have; i++) {
        epd_registrar_counts_t c;

        epd_registrar_counts(b->regs[i], &c);
        n += c.heartbeats_ok;
        failed += c.heartbeats_failed;
    }
    pthread_mutex_unlock(&b->mu);
    *failed_p = failed;
    return n;
}

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
        if (fl_grow(b, have) != 0) {
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
    h0 = fl_heartbeats(b, &f0);
    t0 = epd_time_now_ns();
    if (epd_bench_cpu_ns(b->pids[0], &c0) != 0) {
        return -1;
    }
    epd_time_sleep_ns((uint64_t)(b->idle_s * 1e9));
    t1 = epd_time_now_ns();
    if (epd_bench_cpu_ns(b->pids[0], &c1) != 0) {
        return -1;
    }
    h1 = fl_heartbeats(b, &f1);
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
    if (fl_fleet_start(b) != 0 || fl_grow(b, size) != 0) {
        fl_fleet_stop(b);
        return 1;
    }
    printf("fleet: %u simulated workers started against %s\n", size, b->attach);
    fflush(stdout);
    ts.tv_sec = (time_t)b->hold_s;
    ts.tv_nsec = (long)((b->hold_s - (double)ts.tv_sec) * 1e9);
    do {
        sig = sigtimedwait(&set, NULL, &ts);
    } while (sig < 0 && errno == EINTR);
    hb = fl_heartbeats(b, &failed);
    fl_fleet_stop(b);
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
    if (epd_bench_make_secret(b.tmp, b.secret_file, sizeof(b.secret_file), &b.secret, "fleet") != 0 || fl_cluster_start(&b) != 0 || fl_fleet_start(&b) != 0) {
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
    fl_fleet_stop(&b);
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
