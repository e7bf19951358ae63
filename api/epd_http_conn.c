/*
 * epd_http_conn.c — the core of an HTTP connection (see epd_http_int.h):
 * its writes (bounded only by what the caller asks; each one copied into a
 * single uv_write), its one deadline timer, its close and finalization —
 * where the application hears through the abort callback that a client it
 * still serves is gone — and the requests it hands out, with their
 * accessors; and the two shared budgets a connection gives back when it
 * ends: its client address's count of live connections (a small hash
 * table) and the bytes of its request's body; and the lingering close of
 * a connection whose answer said close.
 *
 * Apart from the parser (epd_http_server.c) and the answers
 * (epd_http_respond.c) because both stand on it: this file calls neither.
 * When an answer has been written out it resumes parsing the pipelined
 * bytes through server->resume.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <sodium.h>

#include "epd_alloc.h"
#include "epd_http_int.h"
#include "epd_log.h"

static void epd_http_on_timer(uv_timer_t *timer);
static void epd_http_conn_linger(epd_http_conn_t *conn);

void epd__http_conn_timer(epd_http_conn_t *conn, uint64_t ms)
{
    uv_timer_start(&conn->timer, epd_http_on_timer, ms, 0);
}

/* ------------------------------------------------------------ helpers */

const char *epd_http_status_text(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 411:
        return "Length Required";
    case 413:
        return "Payload Too Large";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Entity";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 499:
        return "Client Closed Request";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Unknown";
    }
}

void epd_http_config_init(epd_http_config_t *config)
{
    memset(config, 0, sizeof(*config));
    config->host = "127.0.0.1";
    config->port = 0;
    config->max_header_bytes = 16 * 1024;
    config->max_body_bytes = 4 * 1024 * 1024;
    config->max_connections = 1024;
    /* above the bursts one gateway sends (300 and more at once): those
     * are queued like anyone's; max_connections and the header deadline
     * bound what idle sockets hold */
    config->max_connections_per_addr = 1024;
    config->max_buffered_body_bytes = (size_t)256 << 20;
    config->idle_timeout_ms = 60000;
    config->header_timeout_ms = 10000;
    config->body_timeout_ms = 30000;
    config->max_stream_backlog = 1024 * 1024;
}

void epd__http_req_uncharge(epd_http_server_t *server, epd_http_req_t *req)
{
    server->body_bytes -= req->charged;
    req->charged = 0;
}

void epd__http_req_free(epd_http_req_t *req)
{
    if (req == NULL) {
        return;
    }
    if (req->conn != NULL) {
        epd__http_req_uncharge(req->conn->server, req);
    }
    epd_free(req->hbuf);
    epd_free(req->body);
    epd_free(req);
}

epd_http_req_t *epd__http_req_create(const epd_http_config_t *config)
{
    epd_http_req_t *req = epd_calloc(1, sizeof(*req));

    if (req == NULL) {
        return NULL;
    }
    /* Every byte counted plus one NUL per URL, name and value. */
    req->hcap = config->max_header_bytes + 2 * EPD_HTTP_MAX_HEADERS + 2;
    req->hbuf = epd_malloc(req->hcap);
    if (req->hbuf == NULL) {
        epd_free(req);
        return NULL;
    }
    req->phase = EPD_HTTP_PHASE_URL;
    return req;
}

/* ------------------------------------------------------------ writes */

static void epd_http_on_write(uv_write_t *uv, int status)
{
    epd_http_write_t *w = (epd_http_write_t *)uv;
    epd_http_conn_t *conn = w->conn;

    epd_free(w);
    conn->nwrites--;
    if (status < 0) {
        if (!conn->closing) {
            epd_log_debug(EPD_HTTP_LOG, 0, "write failed: %s", uv_strerror(status));
            epd__http_conn_close(conn);
        }
        return;
    }
    if (conn->closing || conn->state != EPD_HTTP_CONN_FLUSH || conn->nwrites > 0) {
        return;
    }
    /* The answer is out: next request, or close. */
    if (conn->close_after) {
        epd_http_conn_linger(conn);
        return;
    }
    if (conn->trusted) {
        /* a proxy's connection counts for the client of each request,
         * while that request is in progress: its next one may be anyone's */
        epd__http_addr_release(conn->server, conn);
    }
    conn->state = EPD_HTTP_CONN_IDLE;
    epd__http_conn_timer(conn, conn->server->config.idle_timeout_ms);
    http_parser_pause(&conn->parser, 0);
    conn->server->resume(conn);
}

/* Queues the concatenation of up to three pieces as one write.  On failure
 * the connection is closed. */
epd_status_t epd__http_conn_write(epd_http_conn_t *conn, const void *a, size_t alen, const void *b,
                                  size_t blen, const void *c, size_t clen)
{
    epd_http_write_t *w;
    uv_buf_t buf;
    int rc;

    if (conn->closing) {
        return EPD_ERR_CONNECTION_RESET;
    }
    if (alen > UINT32_MAX / 4 || blen > UINT32_MAX / 4 || clen > UINT32_MAX / 4) {
        /* A uv_buf_t length is an unsigned int. */
        epd_log_error(EPD_HTTP_LOG, 0, "refusing a %zu-byte write: closing the connection",
                      alen + blen + clen);
        epd__http_conn_close(conn);
        return EPD_ERR_TOO_LONG;
    }
    w = epd_malloc(sizeof(*w) + alen + blen + clen);
    if (w == NULL) {
        epd_log_error(EPD_HTTP_LOG, 0, "no memory for a %zu-byte write: closing the connection",
                      alen + blen + clen);
        epd__http_conn_close(conn);
        return EPD_ERR_NO_MEMORY;
    }
    w->conn = conn;
    w->len = alen + blen + clen;
    if (alen > 0) {
        memcpy(w->data, a, alen);
    }
    if (blen > 0) {
        memcpy(w->data + alen, b, blen);
    }
    if (clen > 0) {
        memcpy(w->data + alen + blen, c, clen);
    }
    buf = uv_buf_init(w->data, (unsigned)w->len);
    rc = uv_write(&w->uv, (uv_stream_t *)&conn->tcp, &buf, 1, epd_http_on_write);
    if (rc != 0) {
        epd_log_debug(EPD_HTTP_LOG, 0, "uv_write: %s", uv_strerror(rc));
        epd_free(w);
        epd__http_conn_close(conn);
        return EPD_ERR_CONNECTION_RESET;
    }
    conn->nwrites++;
    return EPD_OK;
}

/* The answer to the current request has been queued: wait for it to be
 * written, then go on (epd_http_on_write). */
void epd__http_conn_answered(epd_http_conn_t *conn)
{
    conn->state = EPD_HTTP_CONN_FLUSH;
    epd__http_conn_timer(conn, conn->server->config.idle_timeout_ms);
}

/* Answers a request the server refuses itself (an OpenAI-shaped JSON error
 * body, which every JSON client understands) and closes afterwards. */
void epd__http_conn_fail(epd_http_conn_t *conn, int status, const char *message)
{
    epd__http_conn_refuse(conn, status, message, NULL, NULL);
}

void epd__http_conn_refuse(epd_http_conn_t *conn, int status, const char *message, const char *code,
                           const char *header)
{
    char head[512];
    char body[512];
    int blen;
    int hlen;

    if (conn->closing) {
        return;
    }
    if (conn->req != NULL) {
        /* Never held by the application: the failure is in parsing. */
        epd__http_req_free(conn->req);
        conn->req = NULL;
    }
    /* message and code are the server's own strings: nothing to escape */
    blen =
        snprintf(body, sizeof(body),
                 "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,"
                 "\"code\":%s%s%s}}",
                 message,
                 status >= 500   ? "server_error"
                 : status == 429 ? "requests" /* OpenAI's rate-limit error */
                                 : "invalid_request_error",
                 code != NULL ? "\"" : "", code != NULL ? code : "null", code != NULL ? "\"" : "");
    hlen = snprintf(head, sizeof(head),
                    "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                    "Content-Length: %d\r\n%s%sConnection: close\r\n\r\n",
                    status, epd_http_status_text(status), blen, header != NULL ? header : "",
                    header != NULL ? "\r\n" : "");
    conn->close_after = 1;
    if (conn->reading) {
        uv_read_stop((uv_stream_t *)&conn->tcp);
        conn->reading = 0;
    }
    if (epd__http_conn_write(conn, head, (size_t)hlen, body, (size_t)blen, NULL, 0) != EPD_OK) {
        return;
    }
    epd__http_conn_answered(conn);
}

/* ------------------------------------------------------------ lingering close */

/* Why linger: closing a socket whose receive queue still holds bytes makes
 * the kernel send a reset instead of a FIN and drop what it had not sent
 * yet — a client still sending the request we refused (a 413 body, the
 * rest of a 431's headers, pipelined requests) would read ECONNRESET, not
 * our answer.  So the write side is shut down (a FIN after the answer) and
 * the input read and dropped until the client closes, within bounds. */

static void epd_http_on_linger_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    epd_http_conn_t *conn = handle->data;

    (void)suggested;
    *buf = uv_buf_init(conn->inbuf, (unsigned)sizeof(conn->inbuf));
}

static void epd_http_on_linger_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    epd_http_conn_t *conn = stream->data;

    (void)buf;
    if (conn->closing || nread == 0) {
        return;
    }
    if (nread < 0) {
        epd__http_conn_close(conn); /* the client's EOF (or reset): done */
        return;
    }
    conn->linger_bytes += (size_t)nread;
    if (conn->linger_bytes > EPD_HTTP_LINGER_BYTES) {
        epd_log_debug(EPD_HTTP_LOG, 0, "still sending after %zu bytes dropped: closing",
                      conn->linger_bytes);
        epd__http_conn_close(conn);
    }
}

static void epd_http_on_shutdown(uv_shutdown_t *shutdown, int status)
{
    epd_http_conn_t *conn = shutdown->data;

    /* UV_ECANCELED: closed meanwhile (the close callback has not run yet) */
    if (status < 0 && !conn->closing) {
        epd__http_conn_close(conn);
    }
}

/* The answer that said close is out: shut down the write side and drop
 * what the client still sends until its EOF, the linger deadline or
 * EPD_HTTP_LINGER_BYTES; then close. */
static void epd_http_conn_linger(epd_http_conn_t *conn)
{
    epd_http_server_t *server = conn->server;
    uint64_t ms = server->config.idle_timeout_ms < EPD_HTTP_LINGER_MS
                      ? server->config.idle_timeout_ms
                      : EPD_HTTP_LINGER_MS;

    if (conn->peer_eof || (conn->refused && server->lingering_refused >= EPD_HTTP_LINGER_REFUSED)) {
        /* nothing more can come; or too many refused ones hold sockets */
        epd__http_conn_close(conn);
        return;
    }
    if (conn->reading) {
        uv_read_stop((uv_stream_t *)&conn->tcp);
        conn->reading = 0;
    }
    conn->shutdown.data = conn;
    if (uv_shutdown(&conn->shutdown, (uv_stream_t *)&conn->tcp, epd_http_on_shutdown) != 0) {
        epd__http_conn_close(conn);
        return;
    }
    conn->state = EPD_HTTP_CONN_LINGER;
    conn->in_off = conn->in_len = 0; /* pipelined bytes: never served */
    if (conn->refused) {
        server->lingering_refused++;
        conn->linger_counted = 1;
    }
    epd__http_conn_timer(conn, ms);
    if (uv_read_start((uv_stream_t *)&conn->tcp, epd_http_on_linger_alloc,
                      epd_http_on_linger_read) != 0) {
        epd__http_conn_close(conn);
        return;
    }
    conn->reading = 1;
}

/* ------------------------------------------------------------ client addresses */

int epd__http_addr_full(const struct sockaddr_storage *sa, unsigned char full[16])
{
    memset(full, 0, 16);
    if (sa->ss_family == AF_INET) {
        full[10] = 0xff;
        full[11] = 0xff;
        memcpy(full + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 0;
    }
    if (sa->ss_family == AF_INET6) {
        memcpy(full, ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr, 16);
        return 0;
    }
    return -1;
}

void epd__http_addr_key(const unsigned char full[16], unsigned char key[16])
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

    /* an IPv4-mapped address is that IPv4 client; any other IPv6 client
     * holds at least a /64, which counts as one address */
    memset(key, 0, 16);
    memcpy(key, full, memcmp(full, mapped, sizeof(mapped)) == 0 ? 16 : 8);
}

static size_t epd_http_addr_home(const epd_http_server_t *server, const unsigned char key[16])
{
    unsigned char h[crypto_shorthash_BYTES];
    uint64_t v;

    crypto_shorthash(h, key, 16, server->addrs_key);
    memcpy(&v, h, sizeof(v));
    return (size_t)v & server->addrs_mask;
}

int epd__http_addr_acquire(epd_http_server_t *server, epd_http_conn_t *conn)
{
    size_t i = epd_http_addr_home(server, conn->addr);

    /* never full: at most n_live < max_connections keys in at least twice
     * as many slots */
    while (server->addrs[i].count != 0 && memcmp(server->addrs[i].key, conn->addr, 16) != 0) {
        i = (i + 1) & server->addrs_mask;
    }
    if (server->addrs[i].count >= server->config.max_connections_per_addr) {
        return -1;
    }
    if (server->addrs[i].count == 0) {
        memcpy(server->addrs[i].key, conn->addr, 16);
    }
    server->addrs[i].count++;
    conn->counted = 1;
    return 0;
}

/* One live connection of conn->addr fewer; its slot is freed at zero
 * (linear probing's backward shift: no tombstones). */
void epd__http_addr_release(epd_http_server_t *server, epd_http_conn_t *conn)
{
    const unsigned char *key = conn->addr;
    size_t mask = server->addrs_mask;
    size_t i;
    size_t j;

    if (!conn->counted) {
        return;
    }
    conn->counted = 0;
    i = epd_http_addr_home(server, key);
    while (server->addrs[i].count != 0 && memcmp(server->addrs[i].key, key, 16) != 0) {
        i = (i + 1) & mask;
    }
    if (server->addrs[i].count == 0) {
        return; /* not counted: cannot happen while conn->counted is honest */
    }
    if (--server->addrs[i].count > 0) {
        return;
    }
    /* Move back each later entry of the run whose home is not in (i, j]. */
    for (j = (i + 1) & mask; server->addrs[j].count != 0; j = (j + 1) & mask) {
        size_t home = epd_http_addr_home(server, server->addrs[j].key);

        if (((j - home) & mask) >= ((j - i) & mask)) {
            server->addrs[i] = server->addrs[j];
            server->addrs[j].count = 0;
            i = j;
        }
    }
}

/* ------------------------------------------------------------ closing */

void epd__http_server_maybe_free(epd_http_server_t *server)
{
    if (server->closing && server->listener_closed && server->conns == NULL && !server->drop_busy) {
        void (*closed)(void *) = server->destroyed ? server->config.closed : NULL;
        void *arg = server->config.arg;

        epd_free(server->addrs);
        epd_free(server);
        /* last: the callback may free what `arg` points to */
        if (closed != NULL) {
            closed(arg);
        }
    }
}

static void epd_http_conn_finalize(epd_http_conn_t *conn)
{
    epd_http_server_t *server = conn->server;
    epd_http_req_t *req = conn->req;

    if (conn->prev != NULL) {
        conn->prev->next = conn->next;
    } else {
        server->conns = conn->next;
    }
    if (conn->next != NULL) {
        conn->next->prev = conn->prev;
    }
    if (!conn->refused) {
        server->n_live--;
    }
    epd__http_addr_release(server, conn);
    if (conn->linger_counted) {
        server->lingering_refused--;
    }
    if (conn->over_cap) {
        server->over_cap--;
    }
    if (req != NULL) {
        /* its body leaves the budget now: a detached request may outlive
         * the server */
        epd__http_req_uncharge(server, req);
    }
    epd_free(conn);

    if (req != NULL) {
        req->conn = NULL;
        if (!req->held) {
            epd__http_req_free(req);
        } else if (req->abort_cb != NULL) {
            req->abort_cb(req, req->abort_arg);
            epd__http_req_free(req);
        }
        /* else: detached, the application finishes it later. */
    }
    epd__http_server_maybe_free(server);
}

static void epd_http_on_conn_closed(uv_handle_t *handle)
{
    epd_http_conn_t *conn = handle->data;

    if (--conn->handles_open == 0) {
        epd_http_conn_finalize(conn);
    }
}

void epd__http_conn_close(epd_http_conn_t *conn)
{
    if (conn->closing) {
        return;
    }
    conn->closing = 1;
    if (conn->reading) {
        uv_read_stop((uv_stream_t *)&conn->tcp);
        conn->reading = 0;
    }
    uv_timer_stop(&conn->timer);
    uv_close((uv_handle_t *)&conn->timer, epd_http_on_conn_closed);
    uv_close((uv_handle_t *)&conn->tcp, epd_http_on_conn_closed);
}

static void epd_http_on_timer(uv_timer_t *timer)
{
    epd_http_conn_t *conn = timer->data;

    switch (conn->state) {
    case EPD_HTTP_CONN_HEAD:
        conn->server->stats.header_timeouts++;
        epd_log_debug(EPD_HTTP_LOG, 0, "request headers not complete in %llu ms: 408",
                      (unsigned long long)conn->server->config.header_timeout_ms);
        epd__http_conn_fail(conn, 408, "request headers not received in time");
        break;
    case EPD_HTTP_CONN_BODY:
        epd_log_debug(EPD_HTTP_LOG, 0, "request body not complete in %llu ms: 408",
                      (unsigned long long)conn->server->config.body_timeout_ms);
        epd__http_conn_fail(conn, 408, "request body not received in time");
        break;
    case EPD_HTTP_CONN_LINGER:
        epd__http_conn_close(conn); /* the client did not close in time */
        break;
    case EPD_HTTP_CONN_IDLE:
    case EPD_HTTP_CONN_FLUSH:
    case EPD_HTTP_CONN_BUSY:
        /* Connected and silent past the header deadline, idle between
         * requests, or a client not taking its answer. */
        if (conn->fresh) {
            conn->server->stats.header_timeouts++;
        }
        epd__http_conn_close(conn);
        break;
    }
}

/* ------------------------------------------------------------ requests */

const char *epd_http_req_method(const epd_http_req_t *req)
{
    return req->method;
}

const char *epd_http_req_path(const epd_http_req_t *req)
{
    return req->hbuf;
}

const char *epd_http_req_header(const epd_http_req_t *req, const char *name)
{
    unsigned i;

    for (i = 0; i < req->n_hdr; i++) {
        if (strcasecmp(req->hbuf + req->hdr[i].name_off, name) == 0) {
            /* A header without a value callback points at its name's NUL. */
            if (req->hdr[i].val_off == req->hdr[i].name_off) {
                return "";
            }
            return req->hbuf + req->hdr[i].val_off;
        }
    }
    return NULL;
}

const char *epd_http_req_body(const epd_http_req_t *req, size_t *len_p)
{
    *len_p = req->body_len;
    return req->body != NULL ? req->body : "";
}

void epd_http_req_set_abort(epd_http_req_t *req, epd_http_abort_cb_t cb, void *arg)
{
    req->abort_cb = cb;
    req->abort_arg = arg;
}

/* Detaches `req` from its connection and frees it (the application is
 * done with it). */
void epd__http_req_finish(epd_http_req_t *req)
{
    if (req->conn != NULL && req->conn->req == req) {
        req->conn->req = NULL;
    }
    epd__http_req_free(req);
}
