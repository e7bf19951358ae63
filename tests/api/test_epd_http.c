/*
 * Tests of api/epd_http_*.c: a real server on 127.0.0.1 (ephemeral port)
 * runs on a libuv loop in the test's main thread, and a client thread
 * speaks raw HTTP to it over blocking sockets (each read has a timeout).
 * The client records what it saw; the main thread asserts once the loop
 * has stopped.  Covered: keep-alive, pipelining in order, chunked request
 * bodies, 413 / 431 / 400 / 503, idle / header / body timeouts while
 * another client is served, SSE streams as chunked events in order, a
 * client leaving mid-stream (and while its request is held) firing the
 * abort callback, and a slow reader closed at the backlog limit.  The
 * front door's limits: the header deadline from the accept (a silent
 * connection is closed; keep-alive idling is not), the per-address
 * connection cap (429 with Retry-After once the head is read; other
 * addresses of 127.0.0.0/8 still served, the address table emptied and
 * refilled), the budget of buffered bodies (503
 * with Retry-After, given back when a held request goes), and API keys
 * (none, wrong, right; open paths; checked before the body; the key file
 * reader).  Only behaviour is asserted, never a speed.
 */
#include "epd_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uv.h>

#include "epd_alloc.h"
#include "epd_http.h"
#include "epd_time.h"

/* ------------------------------------------------------------ fixture */

typedef struct fx fx_t;
typedef void (*client_fn_t)(fx_t *fx);

#define MAX_NOTES 256

struct fx {
    uv_loop_t loop;
    uv_async_t done;
    epd_http_server_t *srv;
    uint16_t port;
    client_fn_t client;
    pthread_t thread;
    /* set by the loop thread, read by the client */
    atomic_int aborts;      /* abort callbacks fired */
    atomic_int holds;       /* /hold requests the application holds */
    atomic_int flood_reset; /* stream_send refused a slow reader */
    atomic_int streams_ended;
    atomic_int late_status; /* what a late epd_http_respond returned, + 1000 */
    epd_http_req_t *late;
    uv_timer_t late_timer;
    int closed;           /* config.closed calls */
    int aborts_at_closed; /* abort callbacks that had fired by then */
    /* set by the client thread, checked after join */
    int ok[MAX_NOTES];
    char note[MAX_NOTES][512];
    int n_notes;
};

/* The client records a named check; the main thread asserts them all. */
static void check(fx_t *fx, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(fx_t *fx, int ok, const char *fmt, ...)
{
    va_list ap;
    int i = fx->n_notes;

    if (i == MAX_NOTES) {
        i = MAX_NOTES - 1;
        ok = 0;
    } else {
        fx->n_notes++;
    }
    fx->ok[i] = ok;
    va_start(ap, fmt);
    vsnprintf(fx->note[i], sizeof(fx->note[i]), fmt, ap);
    va_end(ap);
}

/* --- server side (loop thread) --- */

typedef struct {
    fx_t *fx;
    epd_http_req_t *req;
    uv_timer_t timer;
    int count;
    int limit;
    int mode; /* 0 /stream, 1 /forever, 2 /flood */
} streamer_t;

static void streamer_closed(uv_handle_t *h)
{
    free(h->data);
}

static void streamer_stop(streamer_t *st)
{
    uv_timer_stop(&st->timer);
    uv_close((uv_handle_t *)&st->timer, streamer_closed);
}

static void on_stream_abort(epd_http_req_t *req, void *arg)
{
    streamer_t *st = arg;

    (void)req;
    atomic_fetch_add(&st->fx->aborts, 1);
    streamer_stop(st);
}

static void on_hold_abort(epd_http_req_t *req, void *arg)
{
    fx_t *fx = arg;

    (void)req;
    atomic_fetch_add(&fx->aborts, 1);
}

static void on_stream_tick(uv_timer_t *timer)
{
    streamer_t *st = timer->data;
    char ev[64];
    int n;

    if (st->mode == 2) {
        static char big[64 * 1024];
        int i;

        memset(big, 'x', sizeof(big));
        for (i = 0; i < 16; i++) {
            if (epd_http_stream_send(st->req, big, sizeof(big)) != EPD_OK) {
                atomic_store(&st->fx->flood_reset, 1);
                uv_timer_stop(&st->timer); /* the abort callback follows */
                return;
            }
        }
        return;
    }
    n = snprintf(ev, sizeof(ev), "data: %d\n\n", st->count);
    if (epd_http_stream_send(st->req, ev, (size_t)n) != EPD_OK) {
        if (st->mode == 0) {
            /* No abort callback: the application finishes the request. */
            epd_http_stream_end(st->req);
            streamer_stop(st);
        } else {
            uv_timer_stop(&st->timer); /* the abort callback follows */
        }
        return;
    }
    st->count++;
    if (st->mode == 0 && st->count == st->limit) {
        epd_http_stream_end(st->req);
        atomic_fetch_add(&st->fx->streams_ended, 1);
        streamer_stop(st);
    }
}

static void start_streamer(fx_t *fx, epd_http_req_t *req, int mode)
{
    streamer_t *st = calloc(1, sizeof(*st));

    assert_non_null(st);
    st->fx = fx;
    st->req = req;
    st->mode = mode;
    st->limit = 5;
    uv_timer_init(&fx->loop, &st->timer);
    st->timer.data = st;
    if (epd_http_stream_start(req, 200) != EPD_OK) {
        epd_http_stream_end(req);
        uv_close((uv_handle_t *)&st->timer, streamer_closed);
        return;
    }
    if (mode != 0) {
        epd_http_req_set_abort(req, on_stream_abort, st);
    }
    uv_timer_start(&st->timer, on_stream_tick, mode == 2 ? 1 : 5, mode == 2 ? 1 : 5);
}

static void on_late(uv_timer_t *timer)
{
    fx_t *fx = timer->data;

    atomic_store(&fx->late_status, 1000 + epd_http_respond(fx->late, 200, "text/plain", "late", 4));
    fx->late = NULL;
}

static void handler(epd_http_req_t *req, void *arg)
{
    fx_t *fx = arg;
    const char *path = epd_http_req_path(req);
    const char *ct = epd_http_req_header(req, "content-type");
    const char *accept = epd_http_req_header(req, "ACCEPT");
    const char *body;
    size_t len;
    char out[4096];
    int n;

    if (strcmp(path, "/stream") == 0) {
        start_streamer(fx, req, 0);
        return;
    }
    if (strcmp(path, "/forever") == 0) {
        start_streamer(fx, req, 1);
        return;
    }
    if (strcmp(path, "/flood") == 0) {
        start_streamer(fx, req, 2);
        return;
    }
    if (strcmp(path, "/late") == 0) {
        /* No abort callback: answered 200 ms later, after the client left. */
        fx->late = req;
        uv_timer_start(&fx->late_timer, on_late, 200, 0);
        return;
    }
    if (strcmp(path, "/hold") == 0) {
        atomic_fetch_add(&fx->holds, 1);
        epd_http_req_set_abort(req, on_hold_abort, fx);
        return; /* never answered: the client leaves */
    }
    body = epd_http_req_body(req, &len);
    n = snprintf(out, sizeof(out), "%s %s ct=%s accept=%s len=%zu body=%.*s",
                 epd_http_req_method(req), path, ct != NULL ? ct : "-",
                 accept != NULL ? accept : "-", len, (int)(len < 1000 ? len : 1000), body);
    epd_http_respond(req, 200, "text/plain", out, (size_t)n);
}

static void *client_main(void *arg)
{
    fx_t *fx = arg;

    fx->client(fx);
    uv_async_send(&fx->done);
    return NULL;
}

/* config.closed: the server's last close callback ran. */
static void on_closed(void *arg)
{
    fx_t *fx = arg;

    fx->closed++;
    fx->aborts_at_closed = atomic_load(&fx->aborts);
}

/* The server's counts just before it was destroyed (the last run's). */
static epd_http_stats_t last_stats;

static void on_done(uv_async_t *async)
{
    fx_t *fx = async->data;

    epd_http_server_stats(fx->srv, &last_stats);
    epd_http_server_destroy(fx->srv);
    uv_close((uv_handle_t *)async, NULL);
    uv_close((uv_handle_t *)&fx->late_timer, NULL);
}

/* Runs `client` against a fresh server configured by `cfg` (handler and
 * arg are filled in). */
static void run(epd_http_config_t *cfg, client_fn_t client)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    epd_alloc_stats_t before;
    epd_alloc_stats_t after;
    int i;

    assert_non_null(fx);
    epd_alloc_stats(&before);
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    assert_int_equal(uv_async_init(&fx->loop, &fx->done, on_done), 0);
    fx->done.data = fx;
    assert_int_equal(uv_timer_init(&fx->loop, &fx->late_timer), 0);
    fx->late_timer.data = fx;
    cfg->handler = handler;
    cfg->closed = on_closed;
    cfg->arg = fx;
    assert_int_equal(epd_http_server_create(&fx->loop, cfg, &fx->srv), EPD_OK);
    fx->port = epd_http_server_port(fx->srv);
    assert_true(fx->port != 0);
    fx->client = client;
    assert_int_equal(pthread_create(&fx->thread, NULL, client_main, fx), 0);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    pthread_join(fx->thread, NULL);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
    /* told once that the server is gone, after every abort callback */
    assert_int_equal(fx->closed, 1);
    assert_int_equal(fx->aborts_at_closed, atomic_load(&fx->aborts));
    for (i = 0; i < fx->n_notes; i++) {
        if (!fx->ok[i]) {
            print_error("client check failed: %s\n", fx->note[i]);
        }
    }
    for (i = 0; i < fx->n_notes; i++) {
        assert_true(fx->ok[i]);
    }
    epd_alloc_stats(&after);
    assert_int_equal(after.live_blocks, before.live_blocks); /* everything freed */
    free(fx);
}

static void config_short(epd_http_config_t *cfg)
{
    epd_http_config_init(cfg);
    cfg->idle_timeout_ms = 5000;
    cfg->header_timeout_ms = 5000;
    cfg->body_timeout_ms = 5000;
}

/* --- client side (its own thread, blocking sockets) --- */

typedef struct {
    int fd;
    char buf[1 << 20];
    size_t len;
} cl_t;

typedef struct {
    int status;
    char head[4096];
    char *body; /* malloc'd, de-chunked, NUL terminated */
    size_t body_len;
} resp_t;

/* A connection to the server from source address `from` (an address of
 * 127.0.0.0/8; NULL: the kernel's choice, 127.0.0.1). */
static cl_t *cl_connect_from(fx_t *fx, const char *from, int rcvbuf)
{
    cl_t *c = calloc(1, sizeof(*c));
    struct sockaddr_in sa;
    struct timeval tv = {5, 0};

    assert_non_null(c);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) {
        setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    }
    if (from != NULL) {
        struct sockaddr_in src;

        memset(&src, 0, sizeof(src));
        src.sin_family = AF_INET;
        inet_pton(AF_INET, from, &src.sin_addr);
        if (bind(c->fd, (struct sockaddr *)&src, sizeof(src)) != 0) {
            check(fx, 0, "bind %s: %s", from, strerror(errno));
        }
    }
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons(fx->port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        check(fx, 0, "connect: %s", strerror(errno));
    }
    return c;
}

static cl_t *cl_connect(fx_t *fx, int rcvbuf)
{
    return cl_connect_from(fx, NULL, rcvbuf);
}

static void cl_close(cl_t *c)
{
    close(c->fd);
    free(c);
}

static int cl_send(cl_t *c, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = send(c->fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) {
            return -1;
        }
        s += k;
        n -= (size_t)k;
    }
    return 0;
}

static int cl_sends(cl_t *c, const char *s)
{
    return cl_send(c, s, strlen(s));
}

/* Reads more bytes; 0 on EOF, -1 on error or timeout. */
static int cl_fill(cl_t *c)
{
    ssize_t k;

    if (c->len == sizeof(c->buf)) {
        return -1;
    }
    k = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
    if (k <= 0) {
        return k == 0 ? 0 : -1;
    }
    c->len += (size_t)k;
    return 1;
}

static void cl_consume(cl_t *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

static char *cl_find(cl_t *c, const char *pat)
{
    size_t pl = strlen(pat);
    size_t i;

    for (i = 0; i + pl <= c->len; i++) {
        if (memcmp(c->buf + i, pat, pl) == 0) {
            return c->buf + i;
        }
    }
    return NULL;
}

static const char *head_value(const char *head, const char *name)
{
    const char *p = head;
    size_t nl = strlen(name);

    while ((p = strstr(p, "\r\n")) != NULL) {
        p += 2;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            p += nl + 1;
            while (*p == ' ') {
                p++;
            }
            return p;
        }
    }
    return NULL;
}

/* Reads one complete response (Content-Length or chunked); -1 when the
 * connection ends or times out first. */
static int cl_response(cl_t *c, resp_t *r)
{
    char *end;
    size_t hlen;
    const char *cl;
    const char *te;

    memset(r, 0, sizeof(*r));
    while ((end = cl_find(c, "\r\n\r\n")) == NULL) {
        if (cl_fill(c) <= 0) {
            return -1;
        }
    }
    hlen = (size_t)(end - c->buf) + 4;
    snprintf(r->head, sizeof(r->head), "%.*s", (int)hlen, c->buf);
    cl_consume(c, hlen);
    r->status = atoi(r->head + 9);
    if (r->status == 100) {
        return cl_response(c, r);
    }
    cl = head_value(r->head, "Content-Length");
    te = head_value(r->head, "Transfer-Encoding");
    r->body = calloc(1, sizeof(c->buf) + 1);
    if (cl != NULL) {
        size_t n = (size_t)strtoul(cl, NULL, 10);
        while (c->len < n) {
            if (cl_fill(c) <= 0) {
                return -1;
            }
        }
        memcpy(r->body, c->buf, n);
        r->body_len = n;
        cl_consume(c, n);
        return 0;
    }
    if (te != NULL && strncasecmp(te, "chunked", 7) == 0) {
        for (;;) {
            size_t size;
            char *crlf;

            while ((crlf = cl_find(c, "\r\n")) == NULL) {
                if (cl_fill(c) <= 0) {
                    return -1;
                }
            }
            size = (size_t)strtoul(c->buf, NULL, 16);
            cl_consume(c, (size_t)(crlf - c->buf) + 2);
            while (c->len < size + 2) {
                if (cl_fill(c) <= 0) {
                    return -1;
                }
            }
            memcpy(r->body + r->body_len, c->buf, size);
            r->body_len += size;
            cl_consume(c, size + 2);
            if (size == 0) {
                return 0;
            }
        }
    }
    /* Read until close (HTTP/1.0 style). */
    while (cl_fill(c) > 0) {
    }
    memcpy(r->body, c->buf, c->len);
    r->body_len = c->len;
    c->len = 0;
    return 0;
}

static void resp_free(resp_t *r)
{
    free(r->body);
    r->body = NULL;
}

/* 1 when the server closes the connection (EOF or reset) within the
 * receive timeout, whatever it sent before. */
static int cl_closed(cl_t *c)
{
    for (;;) {
        int k;
        c->len = 0;
        k = cl_fill(c);
        if (k == 0) {
            return 1;
        }
        if (k < 0) {
            return errno == ECONNRESET;
        }
    }
}

/* Expects one response with `status` whose body contains `want`. */
static void expect(fx_t *fx, cl_t *c, int status, const char *want, const char *what)
{
    resp_t r;
    int rc = cl_response(c, &r);

    check(fx, rc == 0 && r.status == status && strstr(r.body, want) != NULL,
          "%s: rc %d status %d (want %d) body '%.200s' (want '%s')", what, rc, r.status, status,
          r.body != NULL ? r.body : "", want);
    resp_free(&r);
}

/* ------------------------------------------------------------ tests */

static void client_keepalive(fx_t *fx)
{
    cl_t *c = cl_connect(fx, 0);

    cl_sends(c, "GET /one HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n");
    expect(fx, c, 200, "GET /one ct=- accept=text/plain len=0", "first");
    cl_sends(c, "POST /two HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: 11\r\n\r\n{\"a\": true}");
    expect(fx, c, 200, "POST /two ct=application/json accept=- len=11 body={\"a\": true}",
           "second");
    cl_sends(c, "GET /three?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, c, 200, "GET /three?x=1", "third on the same connection");
    /* HEAD: headers only, and the connection stays in step. */
    cl_sends(c, "HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n");
    {
        char *end;
        while ((end = cl_find(c, "\r\n\r\n")) == NULL && cl_fill(c) > 0) {
        }
        check(fx, end != NULL && strncmp(c->buf, "HTTP/1.1 200 OK\r\n", 17) == 0, "HEAD answered");
        if (end != NULL) {
            cl_consume(c, (size_t)(end - c->buf) + 4);
        }
    }
    /* Connection: close is honoured. */
    cl_sends(c, "GET /four HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    expect(fx, c, 200, "GET /four", "fourth");
    check(fx, cl_closed(c), "closed after Connection: close");
    cl_close(c);
}

static void test_keepalive(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    run(&cfg, client_keepalive);
}

static void client_pipelined(fx_t *fx)
{
    cl_t *c = cl_connect(fx, 0);

    cl_sends(
        c, "GET /p1 HTTP/1.1\r\nHost: x\r\n\r\n"
           "POST /p2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
           "POST /p3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxy\r\n0\r\n\r\n"
           "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"
           "GET /p5 HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, c, 200, "GET /p1 ", "pipelined 1");
    expect(fx, c, 200, "POST /p2 ct=- accept=- len=3 body=abc", "pipelined 2");
    expect(fx, c, 200, "POST /p3 ct=- accept=- len=2 body=xy", "pipelined 3");
    expect(fx, c, 200, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n",
           "pipelined 4 (a stream)");
    expect(fx, c, 200, "GET /p5 ", "pipelined 5 after the stream");
    cl_close(c);
}

static void test_pipelined(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    run(&cfg, client_pipelined);
}

static void client_chunked(fx_t *fx)
{
    cl_t *c = cl_connect(fx, 0);

    /* Chunks split across writes, with an extension and a trailer. */
    cl_sends(c, "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                "Content-Type: application/json\r\n\r\n5\r\nhel");
    usleep(20000);
    cl_sends(c, "lo\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n");
    expect(fx, c, 200, "POST /c ct=application/json accept=- len=11 body=hello world",
           "chunked body");
    /* Expect: 100-continue gets its interim answer first. */
    cl_sends(c, "POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
    {
        char *end;
        while ((end = cl_find(c, "\r\n\r\n")) == NULL && cl_fill(c) > 0) {
        }
        check(fx, end != NULL && strncmp(c->buf, "HTTP/1.1 100 Continue\r\n", 23) == 0,
              "100 Continue before the body");
        if (end != NULL) {
            cl_consume(c, (size_t)(end - c->buf) + 4);
        }
    }
    cl_sends(c, "ok");
    expect(fx, c, 200, "len=2 body=ok", "body after 100 Continue");
    cl_close(c);
}

static void test_chunked_body(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    run(&cfg, client_chunked);
}

static void client_limits(fx_t *fx)
{
    cl_t *c;
    char *big;
    int i;

    /* Declared body over the limit: 413 before the body is read. */
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n");
    expect(fx, c, 413, "request body too large", "413 by Content-Length");
    check(fx, cl_closed(c), "closed after 413");
    cl_close(c);

    /* Chunked body growing past the limit. */
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    big = malloc(4096);
    memset(big, 'z', 4096);
    cl_sends(c, "400\r\n");
    cl_send(c, big, 1024);
    cl_sends(c, "\r\n1\r\nz\r\n");
    expect(fx, c, 413, "\"type\":\"invalid_request_error\"", "413 by chunks");
    cl_close(c);

    /* Headers over max_header_bytes. */
    c = cl_connect(fx, 0);
    cl_sends(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: ");
    for (i = 0; i < 3; i++) {
        cl_send(c, big, 4096);
    }
    cl_sends(c, "\r\n\r\n");
    expect(fx, c, 431, "header", "431 by bytes");
    check(fx, cl_closed(c), "closed after 431");
    cl_close(c);

    /* Too many headers. */
    c = cl_connect(fx, 0);
    cl_sends(c, "GET / HTTP/1.1\r\nHost: x\r\n");
    for (i = 0; i < EPD_HTTP_MAX_HEADERS + 1; i++) {
        char h[32];
        snprintf(h, sizeof(h), "X-%d: v\r\n", i);
        cl_sends(c, h);
    }
    cl_sends(c, "\r\n");
    expect(fx, c, 431, "header", "431 by count");
    cl_close(c);

    /* Malformed requests. */
    c = cl_connect(fx, 0);
    cl_sends(c, "THIS IS NOT HTTP\r\n\r\n");
    expect(fx, c, 400, "malformed", "400 garbage");
    check(fx, cl_closed(c), "closed after 400");
    cl_close(c);
    c = cl_connect(fx, 0);
    cl_sends(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 12x\r\n\r\n");
    expect(fx, c, 400, "malformed", "400 bad Content-Length");
    cl_close(c);
    c = cl_connect(fx, 0);
    cl_sends(c, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    expect(fx, c, 400, "malformed", "400 bad chunk size");
    cl_close(c);
    free(big);
}

static void test_limits(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    cfg.max_body_bytes = 1024;
    cfg.max_header_bytes = 8192;
    run(&cfg, client_limits);
}

static void client_max_conns(fx_t *fx)
{
    cl_t *a = cl_connect(fx, 0);
    cl_t *b = cl_connect(fx, 0);
    cl_t *c;
    uint64_t deadline;
    int served = 0;

    cl_sends(a, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, a, 200, "GET /a", "first connection");
    cl_sends(b, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, b, 200, "GET /b", "second connection");
    c = cl_connect(fx, 0);
    expect(fx, c, 503, "too many connections", "third refused with 503");
    check(fx, cl_closed(c), "refused connection closed");
    cl_close(c);
    /* Once one leaves, a new one is served. */
    cl_close(a);
    deadline = epd_time_now_ns() + 5 * EPD_NSEC_PER_SEC;
    while (!served && epd_time_now_ns() < deadline) {
        resp_t r;
        c = cl_connect(fx, 0);
        cl_sends(c, "GET /again HTTP/1.1\r\nHost: x\r\n\r\n");
        served = cl_response(c, &r) == 0 && r.status == 200;
        resp_free(&r);
        cl_close(c);
        if (!served) {
            usleep(20000);
        }
    }
    check(fx, served, "served again after a connection closed");
    cl_close(b);
}

static void test_max_connections(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    cfg.max_connections = 2;
    run(&cfg, client_max_conns);
}

static void client_timeouts(fx_t *fx)
{
    cl_t *idle = cl_connect(fx, 0);
    cl_t *busy = cl_connect(fx, 0);
    cl_t *slow;
    cl_t *body;
    int got408 = 0;
    int i;

    /* Served while the idle one waits. */
    cl_sends(busy, "GET /served HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, busy, 200, "GET /served", "served while another idles");
    /* The idle one is closed without an answer. */
    check(fx, cl_closed(idle) && idle->len == 0, "idle connection closed silently");

    /* Slowloris: a header byte every 50 ms never completes in time.  (Each
     * connection opens just before use: an unused one would idle out.) */
    slow = cl_connect(fx, 0);
    cl_sends(slow, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ");
    for (i = 0; i < 200 && !got408; i++) {
        struct pollfd p = {slow->fd, POLLIN, 0};
        if (poll(&p, 1, 50) > 0) {
            resp_t r;
            got408 = cl_response(slow, &r) == 0 && r.status == 408;
            resp_free(&r);
            break;
        }
        cl_sends(slow, "a");
    }
    check(fx, got408, "slow headers answered 408");
    check(fx, cl_closed(slow), "slow client closed");

    /* A body that stops arriving. */
    body = cl_connect(fx, 0);
    cl_sends(body, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc");
    expect(fx, body, 408, "body not received in time", "slow body answered 408");

    /* Keep-alive idle after a request closes too. */
    cl_close(busy);
    busy = cl_connect(fx, 0);
    cl_sends(busy, "GET /again HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, busy, 200, "GET /again", "again");
    check(fx, cl_closed(busy), "idle after a request: closed");
    cl_close(idle);
    cl_close(busy);
    cl_close(slow);
    cl_close(body);
}

static void test_timeouts(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    epd_http_config_init(&cfg);
    cfg.idle_timeout_ms = 300;
    cfg.header_timeout_ms = 300;
    cfg.body_timeout_ms = 300;
    run(&cfg, client_timeouts);
}

static void client_stream(fx_t *fx)
{
    cl_t *c = cl_connect(fx, 0);
    resp_t r;
    int rc;

    cl_sends(c, "GET /stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n");
    rc = cl_response(c, &r);
    check(fx, rc == 0 && r.status == 200, "stream answered 200 (rc %d, status %d)", rc, r.status);
    check(fx,
          head_value(r.head, "Content-Type") != NULL &&
              strncmp(head_value(r.head, "Content-Type"), "text/event-stream", 17) == 0,
          "text/event-stream: %s", r.head);
    check(fx,
          head_value(r.head, "Cache-Control") != NULL &&
              strncmp(head_value(r.head, "Cache-Control"), "no-cache", 8) == 0,
          "no-cache");
    check(fx,
          head_value(r.head, "Transfer-Encoding") != NULL &&
              strncmp(head_value(r.head, "Transfer-Encoding"), "chunked", 7) == 0,
          "chunked");
    check(fx,
          r.body != NULL &&
              strcmp(r.body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n") == 0,
          "events in order: '%s'", r.body != NULL ? r.body : "");
    resp_free(&r);
    /* The connection is still good. */
    cl_sends(c, "GET /after HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, c, 200, "GET /after", "request after a stream");
    cl_close(c);

    /* HTTP/1.0: no chunking; the end of the stream is the close. */
    c = cl_connect(fx, 0);
    cl_sends(c, "GET /stream HTTP/1.0\r\n\r\n");
    rc = cl_response(c, &r);
    check(fx,
          rc == 0 && r.status == 200 && r.body != NULL &&
              strcmp(r.body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n") == 0 &&
              head_value(r.head, "Transfer-Encoding") == NULL,
          "HTTP/1.0 stream: '%s'", r.body != NULL ? r.body : "");
    resp_free(&r);
    cl_close(c);
}

static void test_stream(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    run(&cfg, client_stream);
}

static int wait_atomic(atomic_int *v, int want)
{
    uint64_t deadline = epd_time_now_ns() + 10 * EPD_NSEC_PER_SEC;

    while (atomic_load(v) < want) {
        if (epd_time_now_ns() > deadline) {
            return 0;
        }
        usleep(5000);
    }
    return 1;
}

static void client_disconnect(fx_t *fx)
{
    cl_t *c = cl_connect(fx, 0);

    /* Mid-stream: read the head and at least one event, then leave. */
    cl_sends(c, "GET /forever HTTP/1.1\r\nHost: x\r\n\r\n");
    while (cl_find(c, "data: 1") == NULL && cl_fill(c) > 0) {
    }
    check(fx, cl_find(c, "text/event-stream") != NULL && cl_find(c, "data: 0") != NULL,
          "stream started");
    cl_close(c);
    check(fx, wait_atomic(&fx->aborts, 1), "abort callback after a mid-stream disconnect");

    /* While the application holds a plain request. */
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx");
    usleep(50000);
    cl_close(c);
    check(fx, wait_atomic(&fx->aborts, 2), "abort callback for a held request");

    /* Without an abort callback the request outlives its connection until
     * the application answers it; the answer reports the client gone. */
    c = cl_connect(fx, 0);
    cl_sends(c, "GET /late HTTP/1.1\r\nHost: x\r\n\r\n");
    usleep(20000);
    cl_close(c);
    check(fx, wait_atomic(&fx->late_status, 1), "late answer made");
    check(fx, atomic_load(&fx->late_status) == 1000 + EPD_ERR_CONNECTION_RESET,
          "late answer to a gone client: %d", atomic_load(&fx->late_status) - 1000);
}

static void test_disconnect(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    run(&cfg, client_disconnect);
}

static void client_slow_reader(fx_t *fx)
{
    cl_t *c = cl_connect(fx, 4096);

    cl_sends(c, "GET /flood HTTP/1.1\r\nHost: x\r\n\r\n");
    /* Read nothing: the server must give up on us, not buffer forever. */
    check(fx, wait_atomic(&fx->flood_reset, 1), "stream_send refused past the backlog");
    check(fx, wait_atomic(&fx->aborts, 1), "abort callback for the slow reader");
    check(fx, cl_closed(c), "slow reader's connection closed");
    cl_close(c);
}

static void test_slow_reader(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    cfg.max_stream_backlog = 256 * 1024;
    run(&cfg, client_slow_reader);
}

static void client_destroy_mid_stream(fx_t *fx)
{
    cl_t *c = cl_connect(fx, 0);

    cl_sends(c, "GET /forever HTTP/1.1\r\nHost: x\r\n\r\n");
    while (cl_find(c, "data: 0") == NULL && cl_fill(c) > 0) {
    }
    check(fx, cl_find(c, "data: 0") != NULL, "stream started");
    /* Returning stops the server with the stream live (on_done). */
    cl_close(c);
}

static void test_destroy_mid_stream(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    run(&cfg, client_destroy_mid_stream);
    /* (run: the stream's abort callback ran before config.closed) */
}

static void client_alloc_failures(fx_t *fx)
{
    long n;
    int answered = 0;

    /* Fail the server's Nth allocation from here on, for each N: every
     * request gets 200 or 503 or a close, never a hang, and run() checks
     * that nothing leaked. */
    for (n = 0; n < 12; n++) {
        cl_t *c = cl_connect(fx, 0);
        resp_t r;
        int rc;

        epd_alloc_fail_after(n);
        cl_sends(c, "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                    "chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
        rc = cl_response(c, &r);
        epd_alloc_fail_after(-1);
        if (rc == 0) {
            check(fx, r.status == 200 || r.status == 503, "n=%ld: status %d", n, r.status);
            answered += r.status == 200;
        }
        resp_free(&r);
        cl_close(c);
    }
    check(fx, answered > 0, "some requests got through");
}

static void test_alloc_failures(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    run(&cfg, client_alloc_failures);
}

static void count_closed(void *arg)
{
    (*(int *)arg)++;
}

static void test_create_refusals(void **state)
{
    uv_loop_t loop;
    epd_http_config_t cfg;
    epd_http_server_t *srv = (epd_http_server_t *)0x1;
    epd_http_server_t *first = NULL;
    int closed = 0;

    (void)state;
    assert_int_equal(uv_loop_init(&loop), 0);
    epd_http_config_init(&cfg);
    cfg.closed = count_closed;
    cfg.arg = &closed;
    assert_int_equal(epd_http_server_create(&loop, &cfg, &srv),
                     EPD_ERR_INVALID_PARAM); /* no handler */
    cfg.handler = handler;
    cfg.host = "not-an-ip";
    assert_int_equal(epd_http_server_create(&loop, &cfg, &srv), EPD_ERR_BAD_ADDRESS);
    assert_ptr_equal(srv, (epd_http_server_t *)0x1);
    cfg.host = "127.0.0.1";
    assert_int_equal(epd_http_server_create(&loop, &cfg, &first), EPD_OK);
    cfg.port = epd_http_server_port(first);
    assert_int_equal(epd_http_server_create(&loop, &cfg, &srv), EPD_ERR_EXISTS);
    assert_ptr_equal(srv, (epd_http_server_t *)0x1);
    epd_http_server_destroy(first);
    epd_http_server_destroy(NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(closed, 1); /* `first` only: a failed create says nothing */
    assert_string_equal(epd_http_status_text(413), "Payload Too Large");
}

/* ------------------------------------------------------------ the front door */

/* Sends one GET and expects a 200 (the server still serves). */
static void served(fx_t *fx, const char *from, const char *what)
{
    cl_t *c = cl_connect_from(fx, from, 0);

    cl_sends(c, "GET /still HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, c, 200, "GET /still", what);
    cl_close(c);
}

static void client_header_deadline(fx_t *fx)
{
    cl_t *silent = cl_connect(fx, 0);
    cl_t *kept;

    /* Connected and silent: closed at the header deadline, from the accept,
     * although the idle timeout is far longer (and no answer: nothing was
     * asked). */
    served(fx, NULL, "served while a silent one waits");
    check(fx, cl_closed(silent) && silent->len == 0,
          "a connection that sends nothing is closed at the header deadline");
    cl_close(silent);

    /* A keep-alive connection between requests has the idle timeout. */
    kept = cl_connect(fx, 0);
    cl_sends(kept, "GET /first HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, kept, 200, "GET /first", "first on a kept connection");
    usleep(700 * 1000); /* past the header deadline, well inside the idle one */
    cl_sends(kept, "GET /second HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, kept, 200, "GET /second", "second after idling past the header deadline");
    cl_close(kept);
}

static void test_header_deadline_from_accept(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    epd_http_config_init(&cfg);
    cfg.idle_timeout_ms = 60000;
    cfg.header_timeout_ms = 300;
    cfg.body_timeout_ms = 5000;
    run(&cfg, client_header_deadline);
    assert_true(last_stats.header_timeouts >= 1);
}

/* Expects the per-address cap's answer: 429, Retry-After, OpenAI's
 * rate-limit error, Connection: close. */
static void expect_429(fx_t *fx, cl_t *c, const char *what)
{
    resp_t r;
    int rc = cl_response(c, &r);
    const char *retry = rc == 0 ? head_value(r.head, "Retry-After") : NULL;
    const char *conn = rc == 0 ? head_value(r.head, "Connection") : NULL;

    check(fx,
          rc == 0 && r.status == 429 && retry != NULL && atoi(retry) >= 1 && conn != NULL &&
              strncasecmp(conn, "close", 5) == 0 && strstr(r.body, "from your address") != NULL &&
              strstr(r.body, "\"rate_limit_exceeded\"") != NULL,
          "%s: rc %d status %d (want 429 with Retry-After, close) head '%.300s' body '%.200s'",
          what, rc, r.status, r.head, r.body != NULL ? r.body : "");
    resp_free(&r);
}

static void client_per_addr(fx_t *fx)
{
    cl_t *a = cl_connect(fx, 0);
    cl_t *b = cl_connect(fx, 0);
    cl_t *c;
    cl_t *many[80];
    uint64_t deadline;
    int ok = 0;
    int i;

    cl_sends(a, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, a, 200, "GET /a", "first from 127.0.0.1");
    cl_sends(b, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, b, 200, "GET /b", "second from 127.0.0.1");
    c = cl_connect(fx, 0);
    /* beyond the cap: the head is read, then a complete 429 with
     * Retry-After (the body the client sends is drained, never a reset) */
    cl_sends(c, "POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    expect_429(fx, c, "third from 127.0.0.1");
    check(fx, cl_closed(c), "the refused connection is closed");
    cl_close(c);
    /* another address is not affected */
    served(fx, "127.0.0.2", "served from 127.0.0.2 while 127.0.0.1 is at its cap");

    /* Many addresses at their cap fill and empty the address table. */
    for (i = 0; i < 80; i++) {
        char from[32];

        snprintf(from, sizeof(from), "127.0.0.%d", 10 + i / 2);
        many[i] = cl_connect_from(fx, from, 0);
        cl_sends(many[i], "GET /m HTTP/1.1\r\nHost: x\r\n\r\n");
        expect(fx, many[i], 200, "GET /m", "one of two from an address");
    }
    c = cl_connect_from(fx, "127.0.0.30", 0);
    cl_sends(c, "GET /c HTTP/1.1\r\nHost: x\r\n\r\n");
    expect_429(fx, c, "a third from 127.0.0.30");
    cl_close(c);
    for (i = 0; i < 80; i++) {
        cl_close(many[i]);
    }
    cl_close(a);
    cl_close(b);
    /* once they are gone every address gets its two again */
    deadline = epd_time_now_ns() + 5 * EPD_NSEC_PER_SEC;
    while (ok < 4 && epd_time_now_ns() < deadline) {
        static const char *const from[4] = {"127.0.0.1", "127.0.0.1", "127.0.0.10", "127.0.0.49"};
        cl_t *x[4];
        resp_t r;

        ok = 0;
        for (i = 0; i < 4; i++) {
            x[i] = cl_connect_from(fx, from[i], 0);
            cl_sends(x[i], "GET /again HTTP/1.1\r\nHost: x\r\n\r\n");
            ok += cl_response(x[i], &r) == 0 && r.status == 200;
            resp_free(&r);
        }
        for (i = 0; i < 4; i++) {
            cl_close(x[i]);
        }
        if (ok < 4) {
            usleep(20000);
        }
    }
    check(fx, ok == 4, "addresses served again after their connections closed (%d of 4)", ok);
}

static void test_per_addr_cap(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    cfg.max_connections = 128;
    cfg.max_connections_per_addr = 2;
    run(&cfg, client_per_addr);
    assert_true(last_stats.refused_per_addr >= 2);
    assert_int_equal(last_stats.refused_max_conns, 0);
}

/* The budget below: 64 KiB, so a connection's share (the body limit) is
 * 4 KiB. */
#define BUDGET (64 * 1024)

static void client_body_budget(fx_t *fx)
{
    cl_t *idle[32];
    cl_t *hold[16];
    cl_t *c;
    char body[4096];
    resp_t r;
    int rc;
    int i;

    memset(body, 'b', sizeof(body));
    /* Headers declaring bodies that never come: 32 x 4000 declared bytes,
     * twice the budget, take none of it */
    for (i = 0; i < 32; i++) {
        idle[i] = cl_connect(fx, 0);
        cl_sends(idle[i], "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n\r\n");
    }
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 3000\r\n\r\n");
    cl_send(c, body, 3000);
    expect(fx, c, 200, "len=3000", "a body while 32 others only declared theirs: served");
    cl_close(c);

    /* a body over the connection's share: 413, naming the limit */
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4097\r\n\r\n");
    expect(fx, c, 413, "at most 4096 bytes", "over the share by Content-Length: 413");
    cl_close(c);

    /* bodies that did arrive, held by the application: 16 x 4001 bytes
     * (a buffer each), 1520 of the budget left */
    for (i = 0; i < 16; i++) {
        hold[i] = cl_connect(fx, 0);
        cl_sends(hold[i], "POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n\r\n");
        cl_send(hold[i], body, 4000);
    }
    check(fx, wait_atomic(&fx->holds, 16), "16 bodies are held");

    c = cl_connect(fx, 0);
    cl_sends(c, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n");
    cl_send(c, body, 2000);
    rc = cl_response(c, &r);
    check(fx,
          rc == 0 && r.status == 503 && head_value(r.head, "Retry-After") != NULL &&
              strstr(r.body, "\"type\":\"server_error\"") != NULL,
          "its bytes would pass the budget: 503 with Retry-After (rc %d, status %d, head '%s')", rc,
          r.status, r.head);
    resp_free(&r);
    check(fx, cl_closed(c), "closed after the 503");
    cl_close(c);

    /* chunks growing past what is left */
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n7d0\r\n");
    cl_send(c, body, 2000);
    cl_sends(c, "\r\n0\r\n\r\n");
    expect(fx, c, 503, "too many request bodies", "over the budget by chunks: 503");
    cl_close(c);

    /* what fits is served meanwhile */
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n");
    cl_send(c, body, 500);
    expect(fx, c, 200, "len=500", "a body that fits: served");
    cl_close(c);

    /* a held request goes: its bytes come back */
    cl_close(hold[0]);
    check(fx, wait_atomic(&fx->aborts, 1), "the held request aborted");
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n");
    cl_send(c, body, 2000);
    expect(fx, c, 200, "len=2000", "2000 bytes once a held body is gone");
    cl_close(c);
    for (i = 1; i < 16; i++) {
        cl_close(hold[i]);
    }
    /* the server's count is read when this returns: wait until it saw every
     * held request go (on a loaded machine it had not, 3 of 15 once) */
    check(fx, wait_atomic(&fx->aborts, 16), "every held request aborted");
    for (i = 0; i < 32; i++) {
        cl_close(idle[i]);
    }
}

static void test_body_budget(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    cfg.max_buffered_body_bytes = BUDGET;
    run(&cfg, client_body_budget);
    assert_int_equal(last_stats.refused_body_budget, 2);
    assert_int_equal(last_stats.refused_body_size, 1);
    assert_int_equal(last_stats.buffered_body_bytes, 0);
}

/* Sends `head` and then `junk` more bytes without reading, as a client
 * still sending its request does, and expects one complete answer with
 * `status` whose body holds `want`, then the server's end of the stream —
 * never a reset (the lingering close). */
static void expect_graceful(fx_t *fx, const char *head, size_t junk, int status, const char *want,
                            const char *what)
{
    cl_t *c = cl_connect(fx, 0);
    struct timeval tv = {5, 0};
    static char filler[64 * 1024];
    size_t sent = 0;
    resp_t r;
    int rc;
    int eof = 0;
    int reset = 0;
    int send_errno = 0;

    memset(filler, 'j', sizeof(filler));
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    cl_sends(c, head);
    while (sent < junk) {
        size_t n = junk - sent < sizeof(filler) ? junk - sent : sizeof(filler);
        ssize_t k = send(c->fd, filler, n, MSG_NOSIGNAL);

        if (k <= 0) {
            /* reset (the bug: closed with our bytes unread), or the
             * server stopped reading */
            send_errno = errno;
            break;
        }
        sent += (size_t)k;
    }
    rc = cl_response(c, &r);
    if (rc != 0) {
        reset = errno == ECONNRESET;
    }
    for (;;) {
        int k;

        c->len = 0;
        k = cl_fill(c);
        if (k == 0) {
            eof = 1;
            break;
        }
        if (k < 0) {
            reset = reset || errno == ECONNRESET;
            break;
        }
    }
    check(fx,
          rc == 0 && r.status == status && strstr(r.body, want) != NULL && eof && !reset &&
              sent == junk,
          "%s: rc %d status %d (want %d) body '%.200s' eof %d reset %d, %zu of %zu more bytes "
          "sent (%s)",
          what, rc, r.status, status, r.body != NULL ? r.body : "", eof, reset, sent, junk,
          send_errno != 0 ? strerror(send_errno) : "no send error");
    resp_free(&r);
    cl_close(c);
}

static void client_graceful(fx_t *fx)
{
    char *big = malloc(12 * 1024 + 64);

    memcpy(big, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: ", 33);
    memset(big + 33, 'h', 12 * 1024);
    strcpy(big + 33 + 12 * 1024, "\r\n\r\n");
    expect_graceful(fx, big, 1 << 20, 431, "header fields too large", "431");
    free(big);
    expect_graceful(fx, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", 1 << 20,
                    413, "too large", "413 by Content-Length");
    expect_graceful(fx,
                    "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n100000\r\n",
                    1 << 20, 413, "too large", "413 at the chunk-size line");
    expect_graceful(fx, "THIS IS NOT HTTP\r\n\r\n", 1 << 20, 400, "malformed", "400");
    expect_graceful(fx, "POST /x HTTP/9.9\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n", 1 << 20,
                    505, "version", "505");
    /* a client that sends nothing more: the same */
    expect_graceful(fx, "GET / HTTP/1.1\r\n\r\n", 0, 400, "Host", "400 without more bytes");
    served(fx, NULL, "served after the refusals");
}

static void test_graceful_close(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    cfg.max_body_bytes = 1024;
    cfg.max_header_bytes = 8192;
    run(&cfg, client_graceful);
}

static void client_framing(fx_t *fx)
{
    static const struct {
        const char *req;
        int status;
        const char *want;
    } cases[] = {
        {"GET /v HTTP/9.9\r\nHost: x\r\n\r\n", 505, "HTTP version not supported"},
        {"GET /v HTTP/2.0\r\nHost: x\r\n\r\n", 505, "HTTP version not supported"},
        {"GET /v HTTP/1.2\r\nHost: x\r\n\r\n", 505, "HTTP version not supported"},
        {"GET /v HTTP/0.9\r\nHost: x\r\n\r\n", 505, "HTTP version not supported"},
        {"GET /v HTTP/1.1\r\n\r\n", 400, "needs a Host header"},
        {"GET /v HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "more than one Host header"},
        {"GET /v HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n", 400, "more than one Host header"},
        {"POST /v HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
         "2\r\nxy\r\n0\r\n\r\n",
         501, "transfer coding not supported"},
        {"POST /v HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n", 501,
         "transfer coding not supported"},
        {"POST /v HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n"
         "Transfer-Encoding: chunked\r\n\r\n2\r\nxy\r\n0\r\n\r\n",
         501, "transfer coding not supported"},
        {"POST /v HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
         "Transfer-Encoding: chunked\r\n\r\n2\r\nxy\r\n0\r\n\r\n",
         501, "transfer coding not supported"},
        /* smuggling: both framings */
        {"POST /v HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
         "2\r\nxy\r\n0\r\n\r\n",
         400, "malformed"},
        {"POST /v HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400,
         "malformed"},
        /* a blank before the colon: http-parser would read the header */
        {"POST /v HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400,
         "whitespace in a header name"},
        {"POST /v HTTP/1.1\r\nHost: x\r\nContent-Length\t: 3\r\n\r\nabc", 400, "malformed"},
        {"GET /v HTTP/1.1\r\nHost : x\r\n\r\n", 400, "whitespace in a header name"},
        /* what is served */
        {"GET /v HTTP/1.0\r\n\r\n", 200, "GET /v "},
        {"POST /v HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  Chunked \r\n\r\n2\r\nxy\r\n0\r\n\r\n",
         200, "len=2 body=xy"},
    };
    size_t i;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cl_t *c = cl_connect(fx, 0);
        char what[128];

        snprintf(what, sizeof(what), "case %zu (%.40s)", i, cases[i].req);
        cl_sends(c, cases[i].req);
        expect(fx, c, cases[i].status, cases[i].want, what);
        if (cases[i].status != 200) {
            check(fx, cl_closed(c), "%s: closed", what);
        }
        cl_close(c);
    }
}

static void test_framing(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    run(&cfg, client_framing);
    assert_int_equal(last_stats.refused_version, 4);
    assert_int_equal(last_stats.refused_host, 3);
    assert_int_equal(last_stats.refused_encoding, 4);
    assert_int_equal(last_stats.refused_malformed, 5);
}

static void client_chunk_line(fx_t *fx)
{
    cl_t *c = cl_connect(fx, 0);

    /* 16 MiB + 1 in one chunk, announced and not sent: refused at its size
     * line, without waiting for its data (the body deadline is far) */
    cl_sends(c, "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                "1000001\r\n");
    expect(fx, c, 413, "at most 16777216 bytes", "a chunk over the limit at its size line");
    cl_close(c);
    /* a chunk that fits after another one does not */
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                "3\r\nabc\r\nfffffe\r\n");
    expect(fx, c, 413, "too large", "chunks adding up past the limit at the size line");
    cl_close(c);
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                "3\r\nabc\r\n0\r\n\r\n");
    expect(fx, c, 200, "len=3 body=abc", "a chunked body within the limit");
    cl_close(c);
}

static void test_chunk_size_line(void **state)
{
    epd_http_config_t cfg;

    (void)state;
    config_short(&cfg);
    cfg.body_timeout_ms = 60000; /* the 413 must not wait for it */
    cfg.max_body_bytes = (size_t)16 << 20;
    run(&cfg, client_chunk_line);
    assert_int_equal(last_stats.refused_body_size, 2);
}

/* Expects a 401 with the OpenAI error body and the Bearer challenge, and
 * the connection closed. */
static void expect_401(fx_t *fx, cl_t *c, const char *what)
{
    resp_t r;
    int rc = cl_response(c, &r);
    const char *www = rc == 0 ? head_value(r.head, "WWW-Authenticate") : NULL;

    check(fx,
          rc == 0 && r.status == 401 && www != NULL && strncmp(www, "Bearer", 6) == 0 &&
              strstr(r.body, "\"type\":\"invalid_request_error\"") != NULL &&
              strstr(r.body, "\"param\":null") != NULL &&
              strstr(r.body, "\"code\":\"invalid_api_key\"") != NULL,
          "%s: rc %d status %d head '%.200s' body '%.300s'", what, rc, r.status, r.head,
          r.body != NULL ? r.body : "");
    resp_free(&r);
    check(fx, cl_closed(c), "%s: closed", what);
}

static void client_keys(fx_t *fx)
{
    static const char *const bad[] = {
        "", /* no header */
        "Authorization: Bearer sk-wrong\r\n",
        "Authorization: Bearer sk-righ\r\n",   /* a prefix */
        "Authorization: Bearer sk-rightt\r\n", /* longer */
        "Authorization: Basic sk-right\r\n",   /* another scheme */
        "Authorization: Bearer\r\n",
        "Authorization: sk-right\r\n",
    };
    cl_t *c;
    size_t i;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char req[256];

        c = cl_connect(fx, 0);
        snprintf(req, sizeof(req), "GET /v1/models HTTP/1.1\r\nHost: x\r\n%s\r\n", bad[i]);
        cl_sends(c, req);
        expect_401(fx, c, bad[i][0] != '\0' ? bad[i] : "no Authorization header");
        cl_close(c);
    }
    /* refused before the body: no 100 Continue, nothing buffered */
    c = cl_connect(fx, 0);
    cl_sends(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                "Content-Length: 100000\r\n\r\n");
    expect_401(fx, c, "a body without a key");
    cl_close(c);

    /* the right keys, on one kept connection, any case of the scheme */
    c = cl_connect(fx, 0);
    cl_sends(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-right\r\n\r\n");
    expect(fx, c, 200, "GET /v1/models", "the right key");
    cl_sends(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nauthorization: bearer  second-key \r\n"
                "Content-Length: 2\r\n\r\n{}");
    expect(fx, c, 200, "POST /v1/completions ct=- accept=- len=2 body={}", "the other key");
    /* open paths need none, whatever the query or a trailing slash */
    cl_sends(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, c, 200, "GET /health", "/health without a key");
    cl_sends(c, "GET /health/?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(fx, c, 200, "GET /health/?verbose=1", "/health/?query without a key");
    cl_close(c);
    /* a path merely starting like an open one is not open */
    c = cl_connect(fx, 0);
    cl_sends(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    expect_401(fx, c, "/healthz");
    cl_close(c);
    served(fx, NULL, "an open path, after the refusals");
}

static void test_keys(void **state)
{
    static const char *const open_paths[] = {"/health", "/still", NULL};
    epd_http_keys_t *keys = NULL;
    epd_http_config_t cfg;

    (void)state;
    assert_int_equal(epd_http_keys_create(&keys), EPD_OK);
    assert_int_equal(epd_http_keys_add(keys, "sk-right", 8), EPD_OK);
    assert_int_equal(epd_http_keys_add(keys, "second-key", 10), EPD_OK);
    config_short(&cfg);
    cfg.keys = keys;
    cfg.open_paths = open_paths;
    run(&cfg, client_keys);
    assert_int_equal(last_stats.auth_failures, 9);
    epd_http_keys_destroy(keys);
}

static void test_keys_check(void **state)
{
    epd_http_keys_t *keys = NULL;
    char *longkey = malloc(10001);

    (void)state;
    assert_non_null(longkey);
    memset(longkey, 'k', 10000);
    longkey[10000] = '\0';
    assert_int_equal(epd_http_keys_create(&keys), EPD_OK);
    assert_int_equal(epd_http_keys_count(keys), 0);
    assert_int_equal(epd_http_keys_check(keys, "Bearer anything"), 0); /* no key matches */
    assert_int_equal(epd_http_keys_add(keys, "k", 1), EPD_OK);
    assert_int_equal(epd_http_keys_add(keys, longkey, 10000), EPD_OK);
    assert_int_equal(epd_http_keys_add(keys, "", 0), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_http_keys_add(keys, "a b", 3), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_http_keys_add(keys, "caf\xc3\xa9", 5), EPD_ERR_INVALID_PARAM);
    assert_int_equal(epd_http_keys_count(keys), 2);
    /* every comparison goes through fixed-length digests: a 1-byte key and
     * a 10,000-byte one check alike; near misses of either length fail */
    assert_int_equal(epd_http_keys_check(keys, "Bearer k"), 1);
    assert_int_equal(epd_http_keys_check(keys, "BEARER k \t"), 1);
    assert_int_equal(epd_http_keys_check(keys, "Bearer kk"), 0);
    assert_int_equal(epd_http_keys_check(keys, "Bearer K"), 0);
    assert_int_equal(epd_http_keys_check(keys, "Bearer "), 0);
    assert_int_equal(epd_http_keys_check(keys, "k"), 0);
    assert_int_equal(epd_http_keys_check(keys, NULL), 0);
    assert_int_equal(epd_http_keys_check(NULL, "Bearer k"), 0);
    {
        char *hdr = malloc(10008);

        assert_non_null(hdr);
        snprintf(hdr, 10008, "Bearer %s", longkey);
        assert_int_equal(epd_http_keys_check(keys, hdr), 1);
        hdr[7 + 9999] = 'x'; /* the last byte differs */
        assert_int_equal(epd_http_keys_check(keys, hdr), 0);
        hdr[7 + 9999] = '\0'; /* one byte short */
        assert_int_equal(epd_http_keys_check(keys, hdr), 0);
        free(hdr);
    }
    epd_http_keys_destroy(keys);
    epd_http_keys_destroy(NULL);
    free(longkey);
}

/* Writes `text` to a fresh file with `mode`; returns its path (static). */
static const char *key_file(const char *text, mode_t mode)
{
    static char path[64];
    int fd;

    snprintf(path, sizeof(path), "/tmp/epd-test-keys.XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(fchmod(fd, mode), 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void test_keys_load(void **state)
{
    epd_http_keys_t *keys = (epd_http_keys_t *)0x1;
    char why[256];
    const char *path;

    (void)state;
    path = key_file("# the keys of the team\n\n  sk-one  \r\nsk-two\n# sk-commented\n\t\nsk-three",
                    0600);
    assert_int_equal(epd_http_keys_load(path, &keys, why, sizeof(why)), EPD_OK);
    assert_int_equal(epd_http_keys_count(keys), 3);
    assert_int_equal(epd_http_keys_check(keys, "Bearer sk-one"), 1);
    assert_int_equal(epd_http_keys_check(keys, "Bearer sk-two"), 1);
    assert_int_equal(epd_http_keys_check(keys, "Bearer sk-three"), 1);
    assert_int_equal(epd_http_keys_check(keys, "Bearer sk-commented"), 0);
    assert_int_equal(epd_http_keys_check(keys, "Bearer # the keys of the team"), 0);
    epd_http_keys_destroy(keys);
    unlink(path);

    /* readable by others: loaded (with a warning in the log) */
    path = key_file("sk-one\n", 0644);
    keys = NULL;
    assert_int_equal(epd_http_keys_load(path, &keys, why, sizeof(why)), EPD_OK);
    assert_int_equal(epd_http_keys_count(keys), 1);
    epd_http_keys_destroy(keys);
    unlink(path);

    /* no key at all: refused, saying so */
    path = key_file("# nothing yet\n\n   \n", 0600);
    keys = (epd_http_keys_t *)0x1;
    assert_int_equal(epd_http_keys_load(path, &keys, why, sizeof(why)), EPD_ERR_INVALID_PARAM);
    assert_ptr_equal(keys, (epd_http_keys_t *)0x1);
    assert_non_null(strstr(why, "no key"));
    unlink(path);

    /* a key with a space in it, and the key stays out of the message */
    path = key_file("sk-good\nsk secret\n", 0600);
    assert_int_equal(epd_http_keys_load(path, &keys, why, sizeof(why)), EPD_ERR_INVALID_PARAM);
    assert_non_null(strstr(why, "line 2"));
    assert_null(strstr(why, "secret"));
    unlink(path);

    /* missing */
    assert_int_equal(epd_http_keys_load("/nonexistent/epd-keys", &keys, why, sizeof(why)),
                     EPD_ERR_NOT_FOUND);
    assert_non_null(strstr(why, "cannot open"));
    assert_ptr_equal(keys, (epd_http_keys_t *)0x1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_refusals),
        cmocka_unit_test(test_keepalive),
        cmocka_unit_test(test_pipelined),
        cmocka_unit_test(test_chunked_body),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_max_connections),
        cmocka_unit_test(test_timeouts),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_disconnect),
        cmocka_unit_test(test_slow_reader),
        cmocka_unit_test(test_destroy_mid_stream),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_header_deadline_from_accept),
        cmocka_unit_test(test_per_addr_cap),
        cmocka_unit_test(test_body_budget),
        cmocka_unit_test(test_graceful_close),
        cmocka_unit_test(test_framing),
        cmocka_unit_test(test_chunk_size_line),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_keys_check),
        cmocka_unit_test(test_keys_load),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
