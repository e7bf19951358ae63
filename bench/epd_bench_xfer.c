/*
 * epd_bench_xfer.c — `epd-bench xfer`: transport bandwidth and latency of
 * epd_xport next to the libraries' own tools, in one table.
 *
 * For every compiled backend and transport configuration (UCX shared
 * memory, UCX tcp, libfabric tcp;ofi_rxm) and sizes 64 KiB, 256 KiB, 1 MiB,
 * 16 MiB: the write bandwidth of epd_xport between two processes (many
 * writes in flight from a registered buffer into a region the target
 * allocated through epd_xport_mr_alloc), the same sizes through the
 * reference tool on the same transport (ucx_perftest ucp_put_bw for UCX
 * shared memory, ucp_am_bw for UCX tcp — its put over tcp is not a usable
 * reference — and fi_pingpong for libfabric), the ratio, and memcpy of the
 * same size as the physical limit.  Then the 64-byte message latency (half
 * a ping-pong round trip, median) of both.
 *
 * Each configuration is measured in a forked process (the transport
 * libraries read their environment at start-up), against a peer that is
 * this program re-executed with `xfer --peer CONF FD`; address blob and key
 * travel over a socketpair, standing in for the control plane.  Results
 * come back over a pipe.  Reference tools run as server and client
 * processes on 127.0.0.1 with their own ports.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_log.h"
#include "epd_rng.h"
#include "epd_time.h"
#include "epd_xport.h"

#define XB_REGION ((size_t)64 << 20)
#define XB_MAX_SIZES 8
#define XB_LAT_SIZE 64
/* The host stops progressing while a reference tool runs (seconds): a
 * peer timeout far above that keeps the connection through it. */
#define XB_PEER_TIMEOUT_MS 600000

typedef struct {
    const char *name;
    const char *backend;
    const char *expect;
    const char *env[4];     /* for epd and for the reference tool */
    const char *ref_kind;   /* "perftest" or "fi_pingpong" */
    const char *ref_bw;     /* perftest test name / provider */
    const char *ref_lat;
} xb_conf_t;

static const xb_conf_t xb_confs[] = {
#if EPD_WITH_UCX
    {"ucx-shm", "ucx", "shm", {"UCX_TLS=posix,cma,tcp", "UCX_NET_DEVICES=lo", NULL},
     "perftest", "ucp_put_bw", "ucp_am_lat"},
    {"ucx-tcp", "ucx", "tcp", {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo", NULL},
     "perftest", "ucp_am_bw", "ucp_am_lat"},
#endif
#if EPD_WITH_OFI
    {"ofi-tcp", "ofi", "tcp", {"FI_PROVIDER=tcp;ofi_rxm", NULL},
     "fi_pingpong", "tcp;ofi_rxm", "tcp;ofi_rxm"},
#endif
};
#define XB_N_CONFS (sizeof(xb_confs) / sizeof(xb_confs[0]))

/* The reference tool's environment: perftest's own shm lanes without the
 * tcp that epd needs only for wire-up. */
static const char *const xb_ref_env_shm[] = {"UCX_TLS=posix,cma", "UCX_NET_DEVICES=lo", NULL};

/* Message sizes of the latency sweep (request-plane frames: a LayerDone is
 * ~60 B, a GenerateRequest with a long prompt several KiB). */
#define XB_N_LAT_SIZES 4
static const size_t xb_lat_sizes[XB_N_LAT_SIZES] = {64, 512, 4096, 65536};

typedef struct {
    double gbps[XB_MAX_SIZES];
    double ref_gbps[XB_MAX_SIZES];
    double lat_us;
    double ref_lat_us;
    double lat_sz_us[XB_N_LAT_SIZES];
    char lanes[256];
    int ok;
} xb_result_t;

/* The authenticated arm (a cluster secret on both ends: HELLO proof, a
 * Poly1305 tag on every frame) runs right after the plain one, in the same
 * configuration, without the reference tools. */
static int xb_auth;
static unsigned char xb_secret[32];

static size_t xb_sizes[XB_MAX_SIZES] = {64 << 10, 256 << 10, 1 << 20, 16 << 20};
static int xb_n_sizes = 4;
static double xb_secs = 0.45;
static int xb_lat_iters = 20000;
/* 0: every write to remote offset 0, like ucx_perftest's ucp_put_bw (one
 * source, one target buffer, cache-warm); 1 (--spread): rotate over the
 * whole 64 MiB region, as KV blocks would (DRAM-bound, compare to memcpy). */
static uint64_t xb_spread = 0;
static char xb_self[4096];

static int xb_write_all(int fd, const void *data, size_t len)
{
    const char *p = data;

    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int xb_read_all(int fd, void *data, size_t len)
{
    char *p = data;

    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int xb_send_blob(int fd, const void *blob, uint32_t len)
{
    return xb_write_all(fd, &len, sizeof(len)) || xb_write_all(fd, blob, len) ? -1 : 0;
}

static int xb_recv_blob(int fd, void *buf, uint32_t cap, uint32_t *len_p)
{
    uint32_t len;

    if (xb_read_all(fd, &len, sizeof(len)) != 0 || len > cap || xb_read_all(fd, buf, len) != 0) {
        return -1;
    }
    *len_p = len;
    return 0;
}

/* ------------------------------------------------------------- the peer */

static void xb_peer_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    (void)arg;
    /* ping-pong: echo at once (a send may be issued from a callback) */
    (void)epd_xport_send(ep, data, len, 0);
}

/* Sets cfg's secret and identity for the authenticated arm. */
static void xb_set_auth(epd_xport_config_t *cfg, const char *who)
{
    if (!xb_auth) {
        return;
    }
    cfg->secret = xb_secret;
    cfg->secret_len = sizeof(xb_secret);
    snprintf(cfg->identity.worker_id, sizeof(cfg->identity.worker_id), "%s", who);
    cfg->identity.epoch.start_time_ns = epd_time_wall_ns();
    cfg->identity.epoch.nonce = (uint64_t)getpid();
}

static int xb_peer_main(const xb_conf_t *c, int fd)
{
    epd_xport_config_t cfg;
    epd_xport_t *x;
    epd_xport_mr_t *mr;
    const void *blob;
    size_t blob_len, key_len;
    unsigned char key[EPD_XPORT_RKEY_MAX];
    uint64_t n = 0, last = 0;

    epd_xport_config_init(&cfg);
    cfg.backend = c->backend;
    cfg.msg_cb = xb_peer_msg;
    cfg.peer_timeout_ms = XB_PEER_TIMEOUT_MS;
    cfg.max_msg_size = 2 * xb_lat_sizes[XB_N_LAT_SIZES - 1];
    xb_set_auth(&cfg, "xfer-peer");
    if (epd_xport_create(&cfg, &x) != EPD_OK) {
        return 2;
    }
    if (epd_xport_mr_alloc(x, XB_REGION, &mr) != EPD_OK ||
        epd_xport_address(x, &blob, &blob_len) != EPD_OK ||
        epd_xport_mr_pack(mr, key, sizeof(key), &key_len) != EPD_OK ||
        xb_send_blob(fd, blob, (uint32_t)blob_len) != 0 ||
        xb_send_blob(fd, key, (uint32_t)key_len) != 0) {
        return 3;
    }
    /* busy progress while traffic flows (as a data-plane thread would), a
     * sleep on the transport fd after 200 ms without events: the reference
     * tools run on the same two cores between our measurements */
    for (;;) {
        uint64_t now;
        int slept = 0;
        if (epd_xport_progress(x) > 0) {
            last = epd_time_now_ns();
        } else if ((now = epd_time_now_ns()) - last > 200 * EPD_NSEC_PER_MSEC) {
            epd_xport_poll(x, 20);
            slept = 1;
        }
        /* the host closing its end is the stop: looked for every 1,024
         * busy passes, and at every idle one (idle passes take 20 ms: 1,024
         * of them kept the host waiting 20 s in waitpid per arm) */
        if ((++n & 1023) == 0 || slept) {
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            char ch;
            if (poll(&pfd, 1, 0) > 0 && read(fd, &ch, 1) <= 0) {
                break;
            }
        }
    }
    epd_xport_mr_dereg(mr);
    epd_xport_destroy(x);
    return 0;
}

/* ------------------------------------------------------------ the host */

typedef struct {
    uint64_t completed;
    uint64_t failed;
    int inflight;
    int pongs;
    epd_status_t err;   /* the endpoint failed: stop measuring */
} xb_host_t;

static void xb_host_err(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    xb_host_t *h = arg;

    (void)ep;
    h->err = status;
    fprintf(stderr, "xfer: endpoint failed: %s\n", epd_status_string(status));
}

static void xb_write_done(void *arg, epd_status_t status)
{
    xb_host_t *h = arg;

    h->completed++;
    h->inflight--;
    if (status != EPD_OK) {
        h->failed++;
    }
}

static void xb_flush_done(void *arg, epd_status_t status)
{
    int *flag = arg;

    (void)status;
    *flag = 1;
}

static void xb_host_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    xb_host_t *h = arg;

    (void)ep;
    (void)data;
    (void)len;
    h->pongs++;
}

static void xb_conn_done(void *arg, epd_status_t status)
{
    epd_status_t *st = arg;

    *st = status;
}

/* Many writes in flight from one registered buffer: a warm-up, then the
 * best of three runs of xb_secs/3 each (the machine is shared; the best run
 * is the one least disturbed, as the reference tools are run twice). */
static double xb_measure_bw(epd_xport_t *x, xb_host_t *h, epd_xport_ep_t *ep,
                            epd_xport_rkey_t *rk, epd_xport_mr_t *lmr, size_t size)
{
    int window = (int)((XB_REGION * 2) / size);
    uint64_t slots = XB_REGION / size;
    uint64_t posted = 0;
    double best = 0;

    if (window > 256) {
        window = 256;
    }
    if (window < 4) {
        window = 4;
    }
    for (int run = 0; run < 4; run++) {
        uint64_t start_done = h->completed;
        uint64_t t0 = epd_time_now_ns();
        uint64_t stop = t0 + (uint64_t)(xb_secs / (run == 0 ? 4 : 3) * 1e9);
        uint64_t t1;
        int flushed = 0;
        double gbps;

        for (;;) {
            uint64_t now = epd_time_now_ns();
            while (now < stop && h->inflight < window) {
                epd_status_t st = epd_xport_write(ep, epd_xport_mr_addr(lmr), size, lmr, rk,
                                                  (posted % slots) * size * xb_spread,
                                                  xb_write_done, h);
                if (st != EPD_INPROGRESS) {
                    break;
                }
                posted++;
                h->inflight++;
            }
            epd_xport_progress(x);
            if ((now >= stop || h->err != EPD_OK) && h->inflight == 0) {
                break;
            }
        }
        if (epd_xport_flush(ep, xb_flush_done, &flushed) == EPD_INPROGRESS) {
            while (!flushed) {
                epd_xport_progress(x);
            }
        }
        t1 = epd_time_now_ns();
        gbps = (double)(h->completed - start_done) * (double)size / (double)(t1 - t0);
        if (run > 0 && gbps > best) {
            best = gbps;
        }
    }
    return best;
}

static double xb_measure_lat(epd_xport_t *x, xb_host_t *h, epd_xport_ep_t *ep, size_t size)
{
    unsigned char *msg = epd_malloc(size);
    double *samples = epd_calloc((size_t)xb_lat_iters, sizeof(double));
    double med = -1;

    if (samples == NULL || msg == NULL) {
        goto out;
    }
    memset(msg, 0xab, size);
    for (int i = -1000; i < xb_lat_iters; i++) {
        int want = h->pongs + 1;
        uint64_t t0 = epd_time_now_ns();
        uint64_t deadline = t0 + 5 * EPD_NSEC_PER_SEC;

        epd_status_t st;

        while ((st = epd_xport_send(ep, msg, size, 0)) == EPD_ERR_NO_RESOURCE) {
            epd_xport_progress(x);
        }
        while (st == EPD_OK && h->pongs < want && epd_time_now_ns() < deadline) {
            epd_xport_progress(x);
        }
        if (st != EPD_OK || h->pongs < want) {
            med = -1;
            goto out;
        }
        if (i >= 0) {
            samples[i] = (double)(epd_time_now_ns() - t0) / 2e3; /* one way, µs */
        }
    }
    epd_bench_sort(samples, (size_t)xb_lat_iters);
    med = samples[xb_lat_iters / 2];
out:
    epd_free(samples);
    epd_free(msg);
    return med;
}

static double xb_ref_bw(const xb_conf_t *c, size_t size);
static double xb_ref_lat(const xb_conf_t *c);
static int xb_no_ref = 0;

static int xb_host_main(const xb_conf_t *c, xb_result_t *r)
{
    epd_xport_config_t cfg;
    epd_xport_t *x;
    epd_xport_ep_t *ep;
    epd_xport_rkey_t *rk;
    epd_xport_mr_t *lmr;
    xb_host_t h;
    unsigned char blob[EPD_XPORT_ADDR_MAX], key[EPD_XPORT_RKEY_MAX];
    uint32_t blob_len, key_len;
    epd_status_t conn = EPD_INPROGRESS;
    int sv[2], status;
    char fd_arg[16];
    pid_t pid;
    size_t max_size = 0;

    memset(&h, 0, sizeof(h));
    epd_bench_setenv(c->env, 1);
    epd_xport_config_init(&cfg);
    cfg.backend = c->backend;
    cfg.expect = c->expect;
    cfg.msg_cb = xb_host_msg;
    cfg.peer_timeout_ms = XB_PEER_TIMEOUT_MS;
    cfg.err_cb = xb_host_err;
    cfg.cb_arg = &h;
    cfg.max_msg_size = 2 * xb_lat_sizes[XB_N_LAT_SIZES - 1];
    xb_set_auth(&cfg, "xfer-host");
    if (epd_xport_create(&cfg, &x) != EPD_OK) {
        return -1;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        return -1;
    }
    snprintf(fd_arg, sizeof(fd_arg), "%d", sv[1]);
    pid = fork();
    if (pid == 0) {
        char hex[2 * sizeof(xb_secret) + 1];

        close(sv[0]);
        for (size_t i = 0; i < sizeof(xb_secret); i++) {
            snprintf(hex + 2 * i, 3, "%02x", xb_secret[i]);
        }
        execl(xb_self, xb_self, "xfer", "--peer", c->name, fd_arg, xb_auth ? hex : "-",
              (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    if (pid < 0 || xb_recv_blob(sv[0], blob, sizeof(blob), &blob_len) != 0 ||
        xb_recv_blob(sv[0], key, sizeof(key), &key_len) != 0) {
        fprintf(stderr, "xfer %s: the peer did not start\n", c->name);
        return -1;
    }
    if (epd_xport_connect(x, blob, blob_len, xb_conn_done, &conn, &ep) != EPD_INPROGRESS) {
        return -1;
    }
    while (conn == EPD_INPROGRESS) {
        epd_xport_poll(x, 1);
    }
    if (conn != EPD_OK || epd_xport_rkey_unpack(ep, key, key_len, &rk) != EPD_OK) {
        fprintf(stderr, "xfer %s: connect failed: %s\n", c->name, epd_status_string(conn));
        return -1;
    }
    epd_xport_ep_describe(ep, r->lanes, sizeof(r->lanes));
    for (int i = 0; i < xb_n_sizes; i++) {
        max_size = xb_sizes[i] > max_size ? xb_sizes[i] : max_size;
    }
    if (epd_xport_mr_alloc(x, max_size, &lmr) != EPD_OK) {
        return -1;
    }
    memset(epd_xport_mr_addr(lmr), 0x5a, max_size);
    for (int i = 0; i < XB_N_LAT_SIZES; i++) {
        r->lat_sz_us[i] = xb_measure_lat(x, &h, ep, xb_lat_sizes[i]);
    }
    r->lat_us = xb_measure_lat(x, &h, ep, XB_LAT_SIZE);
    r->ref_lat_us = xb_no_ref || xb_auth ? -1 : xb_ref_lat(c);
    /* epd and the reference alternate, twice, best of each: the machine is
     * shared, and alternating exposes both to the same disturbances */
    for (int i = 0; i < xb_n_sizes; i++) {
        r->ref_gbps[i] = -1;
        for (int round = 0; round < 2; round++) {
            double g = xb_measure_bw(x, &h, ep, rk, lmr, xb_sizes[i]);
            r->gbps[i] = g > r->gbps[i] ? g : r->gbps[i];
            if (!xb_no_ref && !xb_auth) {
                g = xb_ref_bw(c, xb_sizes[i]);
                r->ref_gbps[i] = g > r->ref_gbps[i] ? g : r->ref_gbps[i];
            }
        }
    }
    r->ok = h.failed == 0 && h.err == EPD_OK;
    epd_xport_rkey_destroy(rk);
    epd_xport_ep_close(ep);
    epd_xport_mr_dereg(lmr);
    epd_xport_destroy(x);
    close(sv[0]);
    waitpid(pid, &status, 0);
    return 0;
}

/* ------------------------------------------------------ reference tools */

/* Runs argv (looked up in PATH) with env set over ours, its stdout into
 * buf[0..cap) (the tail when longer; NUL-terminated), for at most
 * timeout_s; its wait status. */
static int xb_run_capture(char *const argv[], const char *const *env, char *buf, size_t cap,
                          int timeout_s)
{
    int pfd[2], status = -1;
    size_t used = 0;
    pid_t pid;
    uint64_t deadline = epd_time_now_ns() + (uint64_t)timeout_s * EPD_NSEC_PER_SEC;

    if (pipe(pfd) != 0) {
        return -1;
    }
    pid = epd_bench_spawn_ex(argv, &(epd_bench_spawn_t){.out_fd = pfd[1], .env = env});
    close(pfd[1]);
    for (;;) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        ssize_t n;
        if (poll(&p, 1, 100) > 0) {
            n = read(pfd[0], buf + used, cap - 1 - used);
            if (n <= 0) {
                break;
            }
            used += (size_t)n;
            if (used == cap - 1) {
                used = 0; /* keep the tail: the final line is what matters */
            }
        }
        if (epd_time_now_ns() > deadline) {
            kill(pid, SIGKILL);
            break;
        }
    }
    buf[used] = '\0';
    close(pfd[0]);
    epd_bench_reap(pid, &status, 0);
    return status;
}

static void xb_reap(pid_t server)
{
    int status;
    uint64_t deadline = epd_time_now_ns() + 3 * EPD_NSEC_PER_SEC;

    while (epd_bench_reap(server, &status, WNOHANG) == 0) {
        if (epd_time_now_ns() > deadline) {
            kill(server, SIGKILL);
            epd_bench_reap(server, &status, 0);
            return;
        }
        epd_time_sleep_ns(10 * EPD_NSEC_PER_MSEC);
    }
}

static int xb_port = 0;

/* ucx_perftest server + client; returns the "Final:" line's field `col`
 * (5: overall bandwidth in MiB/s, 1: median latency in µs) or -1. */
static double xb_perftest(const char *test, size_t size, long iters, const char *const *env,
                          int col)
{
    char port[16], sz[32], n[32], w[32];
    char out[65536];
    char *line, *last = NULL;
    char *srv_argv[] = {"ucx_perftest", "-p", port, NULL};
    char *cli_argv[] = {"ucx_perftest", "127.0.0.1", "-p", port, "-t", (char *)test, "-s", sz,
                        "-n", n, "-w", w, NULL};
    double v[8];
    pid_t server;

    snprintf(port, sizeof(port), "%d", xb_port++);
    snprintf(sz, sizeof(sz), "%zu", size);
    snprintf(n, sizeof(n), "%ld", iters);
    snprintf(w, sizeof(w), "%ld", iters / 10 + 1);
    server = epd_bench_spawn_ex(srv_argv, &(epd_bench_spawn_t){.out_fd = -1, .env = env});
    if (server < 0) {
        return -1;
    }
    epd_time_sleep_ns(250 * EPD_NSEC_PER_MSEC);
    (void)xb_run_capture(cli_argv, env, out, sizeof(out), 30);
    xb_reap(server);
    for (line = strstr(out, "Final:"); line != NULL; line = strstr(line + 1, "Final:")) {
        last = line;
    }
    if (last == NULL || sscanf(last, "Final: %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1],
                               &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) != 8) {
        return -1;
    }
    return v[col];
}

/* fi_pingpong server + client; returns MB/s (col 0) or usec/xfer (col 1). */
static double xb_fi_pingpong(const char *prov, size_t size, long iters, int col)
{
    char port[16], sz[32], n[32];
    char out[65536];
    char *srv_argv[] = {"fi_pingpong", "-p", (char *)prov, "-e", "rdm", "-S", sz, "-I", n,
                        "-B", port, NULL};
    char *cli_argv[] = {"fi_pingpong", "-p", (char *)prov, "-e", "rdm", "-S", sz, "-I", n,
                        "-P", port, "127.0.0.1", NULL};
    static const char *const no_env[] = {NULL};
    char *line, *save = NULL, *last = NULL;
    double mbps, usec;
    char a[32], b[32], c[32], d[32], e[32];
    pid_t server;

    snprintf(port, sizeof(port), "%d", xb_port++);
    snprintf(sz, sizeof(sz), "%zu", size);
    snprintf(n, sizeof(n), "%ld", iters);
    server = epd_bench_spawn_ex(srv_argv, &(epd_bench_spawn_t){.out_fd = -1, .env = no_env});
    if (server < 0) {
        return -1;
    }
    epd_time_sleep_ns(250 * EPD_NSEC_PER_MSEC);
    (void)xb_run_capture(cli_argv, no_env, out, sizeof(out), 30);
    xb_reap(server);
    /* "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec", one row */
    for (line = strtok_r(out, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        if (sscanf(line, "%31s %31s %31s %31s %31s %lf %lf", a, b, c, d, e, &mbps, &usec) == 7) {
            last = line;
            break;
        }
    }
    if (last == NULL) {
        return -1;
    }
    return col == 0 ? mbps : usec;
}

/* memcpy of `size` bytes between the same two buffers (as the reference
 * tools reuse theirs): best of five 20 ms runs. */
static double xb_memcpy_gbps(size_t size)
{
    unsigned char *src = epd_malloc(size), *dst = epd_malloc(size);
    double best = 0;

    if (src == NULL || dst == NULL) {
        epd_free(src);
        epd_free(dst);
        return 0;
    }
    memset(src, 1, size);
    memset(dst, 2, size);
    for (int run = 0; run < 5; run++) {
        uint64_t t0 = epd_time_now_ns(), t1, n = 0;
        do {
            memcpy(dst, src, size);
            __asm__ __volatile__("" : : "r"(dst) : "memory");
            n++;
            t1 = epd_time_now_ns();
        } while (t1 - t0 < 20 * EPD_NSEC_PER_MSEC);
        if ((double)n * (double)size / (double)(t1 - t0) > best) {
            best = (double)n * (double)size / (double)(t1 - t0);
        }
    }
    epd_free(src);
    epd_free(dst);
    return best;
}

/* The reference tool's bandwidth for `size` on c's transport, GB/s. */
static double xb_ref_bw(const xb_conf_t *c, size_t size)
{
    long iters = (long)(((size_t)1 << 30) / size);

    iters = iters < 100 ? 100 : iters > 10000 ? 10000 : iters;
    if (strcmp(c->ref_kind, "perftest") == 0) {
        const char *const *env = strcmp(c->expect, "shm") == 0 ? xb_ref_env_shm : c->env;
        double mib = xb_perftest(c->ref_bw, size, iters, env, 5);
        return mib > 0 ? mib * 1048576.0 / 1e9 : -1;
    } else {
        /* a ping-pong: few round trips (it blocks on its completion queue,
         * slow on a loaded machine) */
        long pp = (long)(((size_t)64 << 20) / size);
        double mb = xb_fi_pingpong(c->ref_bw, size, pp < 10 ? 10 : pp > 200 ? 200 : pp, 0);
        return mb > 0 ? mb / 1e3 : -1;
    }
}

static double xb_ref_lat(const xb_conf_t *c)
{
    if (strcmp(c->ref_kind, "perftest") == 0) {
        const char *const *env = strcmp(c->expect, "shm") == 0 ? xb_ref_env_shm : c->env;
        /* few iterations: perftest's am_lat over tcp is slow on average
         * (its median is what is compared) */
        return xb_perftest(c->ref_lat, XB_LAT_SIZE, 3000, env, 1);
    }
    return xb_fi_pingpong(c->ref_lat, XB_LAT_SIZE, 500, 1);
}

static void xb_size_name(size_t size, char *buf, size_t len)
{
    if (size >= (1u << 20) && size % (1u << 20) == 0) {
        snprintf(buf, len, "%zu MiB", size >> 20);
    } else if (size >= 1024 && size % 1024 == 0) {
        snprintf(buf, len, "%zu KiB", size >> 10);
    } else {
        snprintf(buf, len, "%zu B", size);
    }
}

static void xb_usage(void)
{
    printf("usage: epd-bench xfer [--conf NAME] [--secs S] [--lat-iters N] [--spread] [--no-ref]\n"
           "  write bandwidth (GB/s) and 64 B message latency (us) of epd_xport for every\n"
           "  backend configuration, next to ucx_perftest / fi_pingpong and memcpy.\n"
           "  configurations:");
    for (size_t i = 0; i < XB_N_CONFS; i++) {
        printf(" %s", xb_confs[i].name);
    }
    printf("\n");
}

/* One arm of one configuration in a child process (the transports keep
 * process-wide state): *r gets its figures, zeroed when it failed.  0, or
 * -1 when no child could be made. */
static int xb_run_arm(const xb_conf_t *c, xb_result_t *r)
{
    int pfd[2], status;
    pid_t pid;

    fprintf(stderr, "xfer: measuring %s%s ...\n", c->name, xb_auth ? " with a cluster secret" : "");
    if (pipe(pfd) != 0) {
        return -1;
    }
    fflush(stdout);
    pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        xb_result_t mine;
        memset(&mine, 0, sizeof(mine));
        close(pfd[0]);
        status = xb_host_main(c, &mine);
        if (status == 0) {
            (void)xb_write_all(pfd[1], &mine, sizeof(mine));
        }
        _exit(status == 0 ? 0 : 1);
    }
    close(pfd[1]);
    if (xb_read_all(pfd[0], r, sizeof(*r)) != 0) {
        memset(r, 0, sizeof(*r));
        fprintf(stderr, "xfer: %s failed\n", c->name);
    }
    close(pfd[0]);
    waitpid(pid, &status, 0);
    return 0;
}

int epd_bench_xfer_main(int argc, char **argv)
{
    const char *only = NULL;
    xb_result_t results[XB_N_CONFS > 0 ? XB_N_CONFS : 1];
    xb_result_t auth[XB_N_CONFS > 0 ? XB_N_CONFS : 1];
    double ref_bw[XB_N_CONFS > 0 ? XB_N_CONFS : 1][XB_MAX_SIZES];
    double ref_lat[XB_N_CONFS > 0 ? XB_N_CONFS : 1];
    double mc[XB_MAX_SIZES];
    ssize_t sl = readlink("/proc/self/exe", xb_self, sizeof(xb_self) - 1);

    if (sl <= 0) {
        return 1;
    }
    xb_self[sl] = '\0';
    signal(SIGPIPE, SIG_IGN);
    if (argc == 5 && strcmp(argv[1], "--peer") == 0) {
        if (strcmp(argv[4], "-") != 0) {
            if (strlen(argv[4]) != 2 * sizeof(xb_secret)) {
                return 2;
            }
            for (size_t i = 0; i < sizeof(xb_secret); i++) {
                unsigned v;
                if (sscanf(argv[4] + 2 * i, "%2x", &v) != 1) {
                    return 2;
                }
                xb_secret[i] = (unsigned char)v;
            }
            xb_auth = 1;
        }
        for (size_t i = 0; i < XB_N_CONFS; i++) {
            if (strcmp(xb_confs[i].name, argv[2]) == 0) {
                epd_bench_setenv(xb_confs[i].env, 1);
                return xb_peer_main(&xb_confs[i], atoi(argv[3]));
            }
        }
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--conf") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else if (strcmp(argv[i], "--secs") == 0 && i + 1 < argc) {
            xb_secs = atof(argv[++i]);
        } else if (strcmp(argv[i], "--lat-iters") == 0 && i + 1 < argc) {
            xb_lat_iters = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--spread") == 0) {
            xb_spread = 1;
        } else if (strcmp(argv[i], "--no-ref") == 0) {
            xb_no_ref = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            xb_usage();
            return 0;
        } else {
            xb_usage();
            return 2;
        }
    }
    if (xb_secs <= 0 || xb_secs > 10 || xb_lat_iters < 10 || xb_lat_iters > 10000000) {
        fprintf(stderr, "xfer: --secs must be in (0, 10], --lat-iters in [10, 1e7]\n");
        return 2;
    }
    if (getenv("EPD_LOG_LEVEL") == NULL) {
        epd_log_set_level(EPD_LOG_WARN);
        setenv("EPD_LOG_LEVEL", "warn", 1); /* for the peers too */
    }
    xb_port = 20000 + (int)(getpid() % 20000);
    memset(results, 0, sizeof(results));
    memset(auth, 0, sizeof(auth));
    /* the physical limit first, before any peer process exists */
    for (int s = 0; s < xb_n_sizes; s++) {
        mc[s] = xb_memcpy_gbps(xb_sizes[s]);
    }

    for (size_t i = 0; i < sizeof(xb_secret); i += 8) {
        uint64_t v = epd_rng_entropy();
        memcpy(xb_secret + i, &v, 8);
    }
    for (size_t c = 0; c < XB_N_CONFS; c++) {
        ref_lat[c] = -1;
        for (int s = 0; s < xb_n_sizes; s++) {
            ref_bw[c][s] = -1;
        }
        if (only != NULL && strcmp(only, xb_confs[c].name) != 0) {
            continue;
        }
        for (int arm = 0; arm < 2; arm++) {
            xb_auth = arm;
            if (xb_run_arm(&xb_confs[c], arm ? &auth[c] : &results[c]) != 0) {
                return 1;
            }
        }
        xb_auth = 0;
        ref_lat[c] = results[c].ref_lat_us;
        for (int s = 0; s < xb_n_sizes; s++) {
            ref_bw[c][s] = results[c].ref_gbps[s];
        }
    }
    printf("\nepd_xport write bandwidth (GB/s = 1e9 B/s; two processes on 127.0.0.1)\n");
    printf("%-8s %-8s %10s %10s %7s %10s  %s\n", "config", "size", "epd", "reference", "ratio",
           "memcpy", "reference tool");
    for (size_t c = 0; c < XB_N_CONFS; c++) {
        if (only != NULL && strcmp(only, xb_confs[c].name) != 0) {
            continue;
        }
        for (int s = 0; s < xb_n_sizes; s++) {
            char sz[32], ratio[16], ref[16];
            xb_size_name(xb_sizes[s], sz, sizeof(sz));
            if (ref_bw[c][s] > 0) {
                snprintf(ref, sizeof(ref), "%.2f", ref_bw[c][s]);
                snprintf(ratio, sizeof(ratio), "%.2f", results[c].gbps[s] / ref_bw[c][s]);
            } else {
                snprintf(ref, sizeof(ref), "n/a");
                snprintf(ratio, sizeof(ratio), "n/a");
            }
            printf("%-8s %-8s %10.2f %10s %7s %10.2f  %s %s\n", xb_confs[c].name, sz,
                   results[c].gbps[s], ref, ratio, mc[s], xb_confs[c].ref_kind,
                   xb_confs[c].ref_bw);
        }
    }
    printf("\n64 B message latency (us, one way = half the ping-pong round trip, median)\n");
    printf("%-8s %10s %10s %7s  %s\n", "config", "epd", "reference", "ratio", "reference tool");
    for (size_t c = 0; c < XB_N_CONFS; c++) {
        char ref[16], ratio[16];
        if (only != NULL && strcmp(only, xb_confs[c].name) != 0) {
            continue;
        }
        if (ref_lat[c] > 0) {
            snprintf(ref, sizeof(ref), "%.2f", ref_lat[c]);
            snprintf(ratio, sizeof(ratio), "%.2f", results[c].lat_us / ref_lat[c]);
        } else {
            snprintf(ref, sizeof(ref), "n/a");
            snprintf(ratio, sizeof(ratio), "n/a");
        }
        printf("%-8s %10.2f %10s %7s  %s %s\n", xb_confs[c].name, results[c].lat_us, ref, ratio,
               xb_confs[c].ref_kind, xb_confs[c].ref_lat);
    }
    printf("\nwhat the cluster secret costs: one-way message latency (us, median) and write\n"
           "bandwidth (GB/s) without and with it (HELLO proof + a Poly1305 tag per frame;\n"
           "one-sided writes carry no tag), measured one after the other\n");
    printf("%-8s %-10s %10s %10s %10s\n", "config", "what", "plain", "secret", "delta");
    for (size_t c = 0; c < XB_N_CONFS; c++) {
        if (only != NULL && strcmp(only, xb_confs[c].name) != 0) {
            continue;
        }
        for (int i = 0; i < XB_N_LAT_SIZES; i++) {
            char sz[32], what[48];
            xb_size_name(xb_lat_sizes[i], sz, sizeof(sz));
            snprintf(what, sizeof(what), "msg %s", sz);
            printf("%-8s %-10s %10.2f %10.2f %+10.2f\n", xb_confs[c].name, what,
                   results[c].lat_sz_us[i], auth[c].lat_sz_us[i],
                   auth[c].lat_sz_us[i] - results[c].lat_sz_us[i]);
        }
        for (int s = 0; s < xb_n_sizes; s++) {
            char sz[32], what[48];
            xb_size_name(xb_sizes[s], sz, sizeof(sz));
            snprintf(what, sizeof(what), "write %s", sz);
            printf("%-8s %-10s %10.2f %10.2f %+9.1f%%\n", xb_confs[c].name, what,
                   results[c].gbps[s], auth[c].gbps[s],
                   results[c].gbps[s] > 0
                       ? 100.0 * (auth[c].gbps[s] - results[c].gbps[s]) / results[c].gbps[s]
                       : 0.0);
        }
    }
    printf("\nlanes chosen per configuration (epd_xport_ep_describe)\n");
    for (size_t c = 0; c < XB_N_CONFS; c++) {
        if (only != NULL && strcmp(only, xb_confs[c].name) != 0) {
            continue;
        }
        printf("%-8s %s%s\n", xb_confs[c].name, results[c].lanes[0] ? results[c].lanes : "(failed)",
               results[c].ok ? "" : "  [some writes failed]");
    }
    return 0;
}
