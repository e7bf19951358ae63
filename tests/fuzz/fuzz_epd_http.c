/*
 * libFuzzer target for the HTTP request path (api/epd_http_*): the
 * input is the byte stream a client sends on one connection to a real
 * server — request lines, headers, Content-Length and chunked bodies,
 * pipelined requests, garbage — parsed by http-parser through the server's
 * callbacks with every limit small enough to be reached: header bytes,
 * body size, the buffered-body budget, API keys (an open path and a
 * protected one), 100-continue, HEAD, streams, and X-Forwarded-For (the
 * client is a trusted proxy: every request's header is walked for the
 * per-address cap, epd_http_proxy.c).  The application answers
 * every request at once (a full response, or a stream for /stream), so
 * the connection never waits on it.
 *
 * One server on 127.0.0.1 (ephemeral port) on a private loop, made once;
 * per input a client on the same loop connects, writes the input (and,
 * for an odd-sized input, half-closes), reads whatever comes back, and
 * once nothing has moved for a few loop turns closes; the loop then runs
 * until the server has finalized the connection.  No timer is waited for:
 * every step runs with UV_RUN_NOWAIT, and a connection the server fails
 * to let go of within 10 s aborts (a hang is a bug).  `make fuzz`; the
 * seeds in tests/fuzz/corpus/fuzz_epd_http/ are replayed by make check.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "epd_http_int.h"
#include "epd_log.h"
#include "epd_time.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct {
    int ready;
    uv_loop_t loop;
    epd_http_server_t *srv;
    epd_http_keys_t *keys;
    epd_http_proxies_t *proxies;
    uint16_t port;
} F;

typedef struct {
    uv_tcp_t tcp;
    uv_connect_t connect;
    uv_write_t write;
    uv_shutdown_t shutdown;
    uv_buf_t buf;
    int half_close;
    int moved; /* any client-side event since the last look */
    int written;
    int closed;
    size_t got;
    char rbuf[65536];
} client_t;

static void on_request(epd_http_req_t *req, void *arg)
{
    const char *path = epd_http_req_path(req);
    const char *auth = epd_http_req_header(req, "authorization");
    size_t len = 0;
    const char *body = epd_http_req_body(req, &len);
    char out[128];
    int n;

    (void)arg;
    if (strncmp(path, "/stream", 7) == 0) {
        if (epd_http_stream_start(req, 200) == EPD_OK) {
            (void)epd_http_stream_send(req, body, len);
            (void)epd_http_stream_send(req, "data: [DONE]\n\n", 14);
        }
        (void)epd_http_stream_end(req);
        return;
    }
    n = snprintf(out, sizeof(out), "%s %zu %d", epd_http_req_method(req), len, auth != NULL);
    (void)epd_http_respond(req, len % 7 == 3 ? 404 : 200, "text/plain", out, (size_t)n);
}

static int setup(void)
{
    static const char *const open_paths[] = {"/health", "/metrics", NULL};
    epd_http_config_t cfg;

    epd_log_set_level(EPD_LOG_ERROR);
    char why[128];

    if (uv_loop_init(&F.loop) != 0 || epd_http_keys_create(&F.keys) != EPD_OK ||
        epd_http_keys_add(F.keys, "sk-fuzz", 7) != EPD_OK ||
        epd_http_proxies_parse("127.0.0.0/8, ::1, 10.0.0.0/8", &F.proxies, why, sizeof(why)) !=
            EPD_OK) {
        return -1;
    }
    epd_http_config_init(&cfg);
    cfg.max_header_bytes = 2048;
    cfg.max_body_bytes = 8192;
    /* a connection's share of it, 4096, is the body limit: a declared 7000
     * fits max_body_bytes, not the share (one connection at a time cannot
     * reach the budget itself; tests/api/test_epd_http.c does) */
    cfg.max_buffered_body_bytes = 16 * 4096;
    cfg.max_connections = 8;
    cfg.max_connections_per_addr = 4;
    cfg.max_stream_backlog = 1 << 20;
    cfg.keys = F.keys;
    cfg.trusted_proxies = F.proxies;
    cfg.open_paths = open_paths;
    cfg.handler = on_request;
    if (epd_http_server_create(&F.loop, &cfg, &F.srv) != EPD_OK) {
        return -1;
    }
    F.port = epd_http_server_port(F.srv);
    F.ready = 1;
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (setup() != 0) {
        fprintf(stderr, "fuzz_epd_http: cannot start the server\n");
        abort();
    }
    return 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    client_t *c = h->data;

    (void)suggested;
    *buf = uv_buf_init(c->rbuf, sizeof(c->rbuf));
}

static void on_closed(uv_handle_t *h)
{
    client_t *c = h->data;

    c->closed = 1;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    client_t *c = s->data;

    (void)buf;
    c->moved = 1;
    if (nread > 0) {
        c->got += (size_t)nread;
    } else if (nread < 0) {
        uv_read_stop(s); /* the server closed: nothing more comes */
    }
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    client_t *c = req->data;

    (void)status;
    c->moved = 1;
}

static void on_write(uv_write_t *req, int status)
{
    client_t *c = req->data;

    (void)status;
    c->moved = 1;
    c->written = 1;
    if (c->half_close && status == 0 &&
        uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, on_shutdown) == 0) {
        c->shutdown.data = c;
    }
}

static void on_connect(uv_connect_t *req, int status)
{
    client_t *c = req->data;

    c->moved = 1;
    if (status != 0) {
        c->written = 1; /* nothing to wait for */
        return;
    }
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    c->write.data = c;
    if (uv_write(&c->write, (uv_stream_t *)&c->tcp, &c->buf, 1, on_write) != 0) {
        c->written = 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static client_t c;
    struct sockaddr_in sa;
    uint64_t deadline;
    int quiet = 0;

    if (!F.ready && setup() != 0) {
        abort();
    }
    memset(&c, 0, sizeof(c));
    c.buf = uv_buf_init(size > 0 ? (char *)data : (char *)"", (unsigned)size);
    c.half_close = size % 2 == 1;
    uv_tcp_init(&F.loop, &c.tcp);
    c.tcp.data = &c;
    c.connect.data = &c;
    uv_ip4_addr("127.0.0.1", F.port, &sa);
    if (uv_tcp_connect(&c.connect, &c.tcp, (const struct sockaddr *)&sa, on_connect) != 0) {
        abort();
    }
    deadline = epd_time_now_ns() + 10 * EPD_NSEC_PER_SEC;
    /* Until the input is written and nothing has moved for a while: each
     * answer the server writes shows up at the client within a turn or
     * two on loopback, and a request that stays incomplete moves nothing. */
    while (!c.written || quiet < 16) {
        c.moved = 0;
        uv_run(&F.loop, UV_RUN_NOWAIT);
        quiet = c.moved ? 0 : quiet + 1;
        if (epd_time_now_ns() > deadline) {
            fprintf(stderr, "fuzz_epd_http: the exchange did not settle in 10 s\n");
            abort();
        }
    }
    uv_close((uv_handle_t *)&c.tcp, on_closed);
    /* The server sees the close and lets the connection go. */
    while (!c.closed || F.srv->conns != NULL) {
        uv_run(&F.loop, UV_RUN_NOWAIT);
        if (epd_time_now_ns() > deadline) {
            fprintf(stderr, "fuzz_epd_http: the server held the connection after the client "
                            "left\n");
            abort();
        }
    }
    return 0;
}
