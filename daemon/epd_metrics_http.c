/*
 * epd_metrics_http.c — a worker's /metrics listener (see epd_metrics_http.h).
 *
 * One connection: read until the end of the request head (or its limit),
 * answer once, half-close, drop what the client still sends until its EOF
 * (or the deadline), close.  Every handle is counted in `handles` (the listener,
 * and two per connection: its socket and its deadline timer); the server's
 * memory goes when it is stopping and the last close callback ran, so no
 * callback ever sees freed memory.
 */
#include "epd_metrics_http.h"

#include <stdio.h>
#include <string.h>

#include "epd_addr.h"
#include "epd_alloc.h"
#include "epd_log.h"

typedef struct epd_metrics_conn epd_metrics_conn_t;

struct epd_metrics_http {
    uv_loop_t *loop;
    uv_tcp_t listener;
    const char *log;
    epd_metrics_render_cb_t render;
    void *arg;
    uint16_t port;
    int stopping;
    unsigned handles; /* open or closing handles, the listener's included */
    unsigned n_conns;
    unsigned n_closing; /* of those, closing (their handles not closed yet) */
    uint64_t scrapes;
    epd_metrics_conn_t *conns;
};

struct epd_metrics_conn {
    epd_metrics_http_t *srv;
    epd_metrics_conn_t *next, **prev_p;
    uv_tcp_t tcp;
    uv_timer_t deadline;
    uv_write_t wr;
    uv_shutdown_t sd;
    char head[EPD_METRICS_HTTP_HEAD];
    size_t len;
    int answered; /* a response was queued: what comes now is read and dropped */
    int closing;
    int writing;   /* the answer's write is posted */
    int eof;       /* the client half-closed (or failed) while it was */
    unsigned open; /* of its two handles, those not closed yet */
    char *resp;    /* epd_malloc'ed, lent to the write */
};

static void epd_metrics_maybe_free(epd_metrics_http_t *srv)
{
    if (srv->stopping && srv->handles == 0) {
        epd_free(srv);
    }
}

static void epd_metrics_on_conn_closed(uv_handle_t *h)
{
    epd_metrics_conn_t *c = h->data;
    epd_metrics_http_t *srv = c->srv;

    srv->handles--;
    if (--c->open == 0) {
        epd_free(c->resp);
        epd_free(c);
        srv->n_conns--;
        srv->n_closing--;
    }
    epd_metrics_maybe_free(srv);
}

static void epd_metrics_close(epd_metrics_conn_t *c)
{
    if (c->closing) {
        return;
    }
    c->closing = 1;
    c->srv->n_closing++;
    *c->prev_p = c->next;
    if (c->next != NULL) {
        c->next->prev_p = c->prev_p;
    }
    uv_close((uv_handle_t *)&c->tcp, epd_metrics_on_conn_closed);
    uv_close((uv_handle_t *)&c->deadline, epd_metrics_on_conn_closed);
}

static void epd_metrics_on_deadline(uv_timer_t *t)
{
    epd_metrics_close(t->data);
}

static void epd_metrics_on_shutdown(uv_shutdown_t *sd, int status)
{
    (void)sd;
    (void)status; /* the client's EOF (on_read) or the deadline closes it */
}

/*
 * The answer is out: half-close and wait for the client's EOF before the
 * socket closes (a lingering close).  Closing at once with unread bytes of
 * an oversized head in the kernel's buffer would send a reset that can
 * destroy the answer before the client read it.
 */
static void epd_metrics_on_written(uv_write_t *wr, int status)
{
    epd_metrics_conn_t *c = wr->data;

    c->writing = 0;
    if (status != 0 || c->closing || c->eof ||
        uv_shutdown(&c->sd, (uv_stream_t *)&c->tcp, epd_metrics_on_shutdown) != 0) {
        epd_metrics_close(c);
    }
}

/* Queues `status line + headers + body` (body may be NULL); then the
 * lingering close (epd_metrics_on_written). */
static void epd_metrics_answer(epd_metrics_conn_t *c, const char *status, const char *body,
                               size_t body_len, int head_only)
{
    epd_prom_text_t t = {0};
    uv_buf_t buf;

    c->answered = 1;
    epd_prom_printf(&t,
                    "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                    "Connection: close\r\n\r\n",
                    status,
                    body != NULL && status[0] == '2' ? "text/plain; version=0.0.4; charset=utf-8"
                                                     : "text/plain; charset=utf-8",
                    body_len);
    if (!head_only && body_len > 0) {
        epd_prom_printf(&t, "%.*s", (int)body_len, body);
    }
    if (t.failed || t.data == NULL) {
        epd_prom_text_cleanup(&t);
        epd_metrics_close(c);
        return;
    }
    c->resp = t.data; /* lent to the write until it completes */
    buf = uv_buf_init(c->resp, (unsigned)t.len);
    c->wr.data = c;
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &buf, 1, epd_metrics_on_written) != 0) {
        epd_metrics_close(c);
        return;
    }
    c->writing = 1;
}

size_t epd_metrics_http_head_end(const char *buf, size_t from, size_t len)
{
    for (size_t i = from; i < len; i++) {
        if (buf[i] == '\n' && ((i >= 1 && buf[i - 1] == '\n') ||
                               (i >= 3 && memcmp(buf + i - 3, "\r\n\r\n", 4) == 0))) {
            return i + 1;
        }
    }
    return 0;
}

epd_metrics_route_t epd_metrics_http_route(const char *head, size_t len)
{
    const char *sp1 = memchr(head, ' ', len);
    const char *path, *sp2;
    size_t mlen, plen, rest;

    if (sp1 == NULL) {
        return EPD_METRICS_ROUTE_BAD;
    }
    mlen = (size_t)(sp1 - head);
    path = sp1 + 1;
    rest = len - (size_t)(path - head);
    sp2 = memchr(path, ' ', rest);
    if (sp2 == NULL || rest - (size_t)(sp2 - path) < 8 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0) {
        return EPD_METRICS_ROUTE_BAD;
    }
    plen = (size_t)(sp2 - path);
    if (!(mlen == 3 && memcmp(head, "GET", 3) == 0) &&
        !(mlen == 4 && memcmp(head, "HEAD", 4) == 0)) {
        return EPD_METRICS_ROUTE_METHOD;
    }
    /* /metrics, with or without a query (Prometheus may add one) */
    if (!(plen >= 8 && memcmp(path, "/metrics", 8) == 0 && (plen == 8 || path[8] == '?'))) {
        return EPD_METRICS_ROUTE_NOT_FOUND;
    }
    return mlen == 4 ? EPD_METRICS_ROUTE_HEAD : EPD_METRICS_ROUTE_GET;
}

static void epd_metrics_respond(epd_metrics_conn_t *c)
{
    epd_metrics_http_t *srv = c->srv;
    epd_metrics_route_t route = epd_metrics_http_route(c->head, c->len);
    epd_prom_text_t t = {0};

    switch (route) {
    case EPD_METRICS_ROUTE_BAD:
        epd_metrics_answer(c, "400 Bad Request", "bad request line\n", 17, 0);
        return;
    case EPD_METRICS_ROUTE_METHOD:
        epd_metrics_answer(c, "405 Method Not Allowed", "only GET /metrics\n", 18, 0);
        return;
    case EPD_METRICS_ROUTE_NOT_FOUND:
        epd_metrics_answer(c, "404 Not Found", "only GET /metrics\n", 18, 0);
        return;
    case EPD_METRICS_ROUTE_GET:
    case EPD_METRICS_ROUTE_HEAD:
        break;
    }
    srv->render(srv->arg, &t);
    if (t.failed) {
        epd_metrics_answer(c, "500 Internal Server Error", "out of memory\n", 14, 0);
    } else {
        srv->scrapes++;
        epd_metrics_answer(c, "200 OK", t.data != NULL ? t.data : "", t.len,
                           route == EPD_METRICS_ROUTE_HEAD);
    }
    epd_prom_text_cleanup(&t);
}

static void epd_metrics_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    epd_metrics_conn_t *c = h->data;

    (void)suggested;
    if (c->answered) {
        c->len = 0; /* after the answer: bytes to drop */
    }
    *buf = uv_buf_init(c->head + c->len, (unsigned)(sizeof(c->head) - c->len));
}

static void epd_metrics_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    epd_metrics_conn_t *c = s->data;

    (void)buf;
    if (n < 0) {
        if (c->writing) {
            c->eof = 1; /* a client may half-close after its request: answer it */
            uv_read_stop(s);
        } else {
            epd_metrics_close(c);
        }
        return;
    }
    if (c->answered || c->closing) {
        return; /* dropped: the answer is out or going */
    }
    {
        /* the head ends at an empty line (CRLF CRLF, or LF LF as HTTP
         * tolerates); look again only where the new bytes may finish one */
        size_t from = c->len >= 3 ? c->len - 3 : 0;

        c->len += (size_t)n;
        if (epd_metrics_http_head_end(c->head, from, c->len) != 0) {
            epd_metrics_respond(c);
            return;
        }
    }
    if (c->len == sizeof(c->head)) {
        epd_metrics_answer(c, "431 Request Header Fields Too Large", "request head too large\n", 23,
                           0);
    }
}

static void epd_metrics_on_connection(uv_stream_t *l, int status)
{
    epd_metrics_http_t *srv = l->data;
    epd_metrics_conn_t *c;

    if (status != 0 || srv->stopping) {
        return;
    }
    c = epd_calloc(1, sizeof(*c));
    if (c == NULL) {
        return; /* the connection waits in the backlog; the next accept takes it */
    }
    c->srv = srv;
    uv_tcp_init(srv->loop, &c->tcp);
    uv_timer_init(srv->loop, &c->deadline);
    c->tcp.data = c;
    c->deadline.data = c;
    c->open = 2;
    srv->handles += 2;
    srv->n_conns++;
    c->next = srv->conns;
    c->prev_p = &srv->conns;
    if (srv->conns != NULL) {
        srv->conns->prev_p = &c->next;
    }
    srv->conns = c;
    if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0) {
        epd_metrics_close(c);
        return;
    }
    if (srv->n_conns - srv->n_closing > EPD_METRICS_HTTP_CONNS) {
        /* full: the oldest goes (the list is newest first), so sockets left
         * idle cannot lock a scraper out; it would lose its slot within
         * the deadline anyway */
        epd_metrics_conn_t *old = c;

        while (old->next != NULL) {
            old = old->next;
        }
        epd_metrics_close(old);
    }
    uv_timer_start(&c->deadline, epd_metrics_on_deadline, EPD_METRICS_HTTP_DEADLINE_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, epd_metrics_alloc, epd_metrics_on_read) != 0) {
        epd_metrics_close(c);
    }
}

static void epd_metrics_on_listener_closed(uv_handle_t *h)
{
    epd_metrics_http_t *srv = h->data;

    srv->handles--;
    epd_metrics_maybe_free(srv);
}

epd_status_t epd_metrics_http_start(uv_loop_t *loop, const char *bind, const char *log,
                                    epd_metrics_render_cb_t render, void *arg,
                                    epd_metrics_http_t **srv_p)
{
    char host[EPD_ADDR_HOST_MAX];
    struct sockaddr_storage addr, bound;
    int namelen = (int)sizeof(bound);
    epd_metrics_http_t *srv;
    uint16_t port;
    epd_status_t status;
    int rc;

    if (epd_addr_split(bind, host, sizeof(host), &port, NULL) != EPD_OK ||
        (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) != 0 &&
         uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr) != 0)) {
        epd_log_error(log, 0, "--metrics-addr %s: not a numeric HOST:PORT", bind);
        return EPD_ERR_INVALID_PARAM;
    }
    srv = epd_calloc(1, sizeof(*srv));
    if (srv == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    srv->loop = loop;
    srv->log = log;
    srv->render = render;
    srv->arg = arg;
    rc = uv_tcp_init(loop, &srv->listener);
    if (rc != 0) {
        status = EPD_ERR_IO;
        goto err_free_srv;
    }
    srv->listener.data = srv;
    srv->handles = 1;
    rc = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0) {
        rc = uv_listen((uv_stream_t *)&srv->listener, 64, epd_metrics_on_connection);
    }
    if (rc == 0) {
        rc = uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&bound, &namelen);
    }
    if (rc != 0) {
        epd_log_error(log, 0, "cannot serve /metrics on %s: %s", bind, uv_strerror(rc));
        status = rc == UV_EADDRINUSE ? EPD_ERR_EXISTS : EPD_ERR_IO;
        goto err_close_listener;
    }
    srv->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                  : ((struct sockaddr_in *)&bound)->sin_port);
    *srv_p = srv;
    return EPD_OK;

err_close_listener:
    /* the handle lives inside srv: its close callback frees it */
    srv->stopping = 1;
    uv_close((uv_handle_t *)&srv->listener, epd_metrics_on_listener_closed);
    return status;
err_free_srv:
    epd_free(srv);
    return status;
}

uint16_t epd_metrics_http_port(const epd_metrics_http_t *srv)
{
    return srv->port;
}

uint64_t epd_metrics_http_scrapes(const epd_metrics_http_t *srv)
{
    return srv->scrapes;
}

void epd_metrics_http_stop(epd_metrics_http_t *srv)
{
    if (srv == NULL || srv->stopping) {
        return;
    }
    srv->stopping = 1;
    while (srv->conns != NULL) {
        epd_metrics_close(srv->conns);
    }
    uv_close((uv_handle_t *)&srv->listener, epd_metrics_on_listener_closed);
}
