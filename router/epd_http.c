/*
 * epd_http.c — HTTP/1.1 server on libuv + http-parser (design: epd_http.h).
 *
 * A connection moves through these states:
 *
 *   IDLE  waiting for the first byte of a request     timer: idle_timeout
 *   HEAD  request line and headers arriving           timer: header_timeout
 *   BODY  body arriving                               timer: body_timeout
 *   BUSY  the application holds the request           no timer
 *   FLUSH the answer is complete, writes in flight    timer: idle_timeout
 *
 * and back to IDLE once every write of the answer has completed (or it is
 * closed, when the answer said so).  The parser is paused from
 * on_message_complete, so http_parser_execute stops right after a request
 * and the pipelined bytes behind it stay in the connection's input buffer
 * until FLUSH ends.  Deadlines are measured from the start of a phase and
 * are never pushed back by incoming bytes: a client sending a byte a
 * second still runs out of time.
 *
 * A request is the unit handed to the application.  It owns its header
 * bytes and body, so that it outlives its connection when the client goes
 * away while the application still holds it (a detached request).  The
 * connection and its request point at each other until either ends.
 */
#include "epd_http.h"

#include <http_parser.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "epd_alloc.h"
#include "epd_log.h"

#define HTTP_LOG "http"

typedef enum {
    CONN_IDLE = 0,
    CONN_HEAD,
    CONN_BODY,
    CONN_BUSY,
    CONN_FLUSH,
} conn_state_t;

typedef struct epd_http_conn epd_http_conn_t;

typedef enum {
    PHASE_URL = 0,
    PHASE_FIELD,
    PHASE_VALUE,
    PHASE_DONE,
} hdr_phase_t;

typedef struct {
    size_t name_off;
    size_t val_off;
} hdr_entry_t;

struct epd_http_req {
    epd_http_conn_t *conn; /* NULL once detached (client gone) */
    char method[24];
    /* hbuf: URL NUL name NUL value NUL name NUL value NUL ... */
    char *hbuf;
    size_t hlen;
    size_t hcap;
    size_t header_bytes; /* counted against max_header_bytes */
    hdr_entry_t hdr[EPD_HTTP_MAX_HEADERS];
    unsigned n_hdr;
    hdr_phase_t phase;
    char *body;
    size_t body_len;
    size_t body_cap;
    int http_minor;
    int keep_alive;
    int held;      /* handed to the application */
    int streaming; /* epd_http_stream_start succeeded */
    int chunked;   /* the stream uses chunked encoding */
    epd_http_abort_cb_t abort_cb;
    void *abort_arg;
};

struct epd_http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    epd_http_server_t *server;
    epd_http_conn_t *prev;
    epd_http_conn_t *next;
    http_parser parser;
    conn_state_t state;
    epd_http_req_t *req; /* being parsed, or held by the application */
    int handles_open;    /* of tcp and timer, until both close callbacks ran */
    int closing;
    int reading;
    int close_after; /* close once the answer is flushed */
    int refused;     /* a 503 connection beyond max_connections */
    int fail_status; /* set by a parser callback that refuses the request */
    size_t nwrites;  /* uv_write requests in flight */
    size_t in_off;   /* inbuf[in_off..in_len) not parsed yet */
    size_t in_len;
    char inbuf[EPD_HTTP_INBUF_BYTES];
};

struct epd_http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    epd_http_config_t config;
    http_parser_settings settings;
    epd_http_conn_t *conns; /* every connection not yet finalized */
    unsigned n_live;        /* counted against max_connections */
    uv_tcp_t drop;          /* takes a connection off the backlog when out of memory */
    int drop_busy;
    uint16_t port;
    int closing;
    int listener_closed;
};

typedef struct {
    uv_write_t uv;
    epd_http_conn_t *conn;
    size_t len;
    char data[];
} http_write_t;

static void conn_close(epd_http_conn_t *conn);
static void conn_process(epd_http_conn_t *conn);
static void on_timer(uv_timer_t *timer);
static void on_listener_closed(uv_handle_t *handle);

static void conn_timer(epd_http_conn_t *conn, uint64_t ms)
{
    uv_timer_start(&conn->timer, on_timer, ms, 0);
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
    config->idle_timeout_ms = 60000;
    config->header_timeout_ms = 10000;
    config->body_timeout_ms = 30000;
    config->max_stream_backlog = 1024 * 1024;
}

static void req_free(epd_http_req_t *req)
{
    if (req == NULL) {
        return;
    }
    epd_free(req->hbuf);
    epd_free(req->body);
    epd_free(req);
}

static epd_http_req_t *req_create(const epd_http_config_t *config)
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
    req->phase = PHASE_URL;
    return req;
}

/* ------------------------------------------------------------ writes */

static void on_write(uv_write_t *uv, int status)
{
    http_write_t *w = (http_write_t *)uv;
    epd_http_conn_t *conn = w->conn;

    epd_free(w);
    conn->nwrites--;
    if (status < 0) {
        if (!conn->closing) {
            epd_log_debug(HTTP_LOG, 0, "write failed: %s", uv_strerror(status));
            conn_close(conn);
        }
        return;
    }
    if (conn->closing || conn->state != CONN_FLUSH || conn->nwrites > 0) {
        return;
    }
    /* The answer is out: next request, or close. */
    if (conn->close_after) {
        conn_close(conn);
        return;
    }
    conn->state = CONN_IDLE;
    conn_timer(conn, conn->server->config.idle_timeout_ms);
    http_parser_pause(&conn->parser, 0);
    conn_process(conn);
}

/* Queues the concatenation of up to three pieces as one write.  On failure
 * the connection is closed. */
static epd_status_t conn_write(epd_http_conn_t *conn, const void *a, size_t alen, const void *b,
                               size_t blen, const void *c, size_t clen)
{
    http_write_t *w;
    uv_buf_t buf;
    int rc;

    if (conn->closing) {
        return EPD_ERR_CONNECTION_RESET;
    }
    if (alen > UINT32_MAX / 4 || blen > UINT32_MAX / 4 || clen > UINT32_MAX / 4) {
        /* A uv_buf_t length is an unsigned int. */
        epd_log_error(HTTP_LOG, 0, "refusing a %zu-byte write: closing the connection",
                      alen + blen + clen);
        conn_close(conn);
        return EPD_ERR_TOO_LONG;
    }
    w = epd_malloc(sizeof(*w) + alen + blen + clen);
    if (w == NULL) {
        epd_log_error(HTTP_LOG, 0, "no memory for a %zu-byte write: closing the connection",
                      alen + blen + clen);
        conn_close(conn);
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
    rc = uv_write(&w->uv, (uv_stream_t *)&conn->tcp, &buf, 1, on_write);
    if (rc != 0) {
        epd_log_debug(HTTP_LOG, 0, "uv_write: %s", uv_strerror(rc));
        epd_free(w);
        conn_close(conn);
        return EPD_ERR_CONNECTION_RESET;
    }
    conn->nwrites++;
    return EPD_OK;
}

/* The answer to the current request has been queued: wait for it to be
 * written, then go on (on_write). */
static void conn_answered(epd_http_conn_t *conn)
{
    conn->state = CONN_FLUSH;
    conn_timer(conn, conn->server->config.idle_timeout_ms);
}

/* Answers a request the server refuses itself (an OpenAI-shaped JSON error
 * body, which every JSON client understands) and closes afterwards. */
static void conn_fail(epd_http_conn_t *conn, int status, const char *message)
{
    char head[256];
    char body[512];
    int blen;
    int hlen;

    if (conn->closing) {
        return;
    }
    if (conn->req != NULL) {
        /* Never held by the application: the failure is in parsing. */
        req_free(conn->req);
        conn->req = NULL;
    }
    blen = snprintf(body, sizeof(body),
                    "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":null}}",
                    message, status >= 500 ? "server_error" : "invalid_request_error");
    hlen = snprintf(head, sizeof(head),
                    "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                    "Content-Length: %d\r\nConnection: close\r\n\r\n",
                    status, epd_http_status_text(status), blen);
    conn->close_after = 1;
    if (conn->reading) {
        uv_read_stop((uv_stream_t *)&conn->tcp);
        conn->reading = 0;
    }
    if (conn_write(conn, head, (size_t)hlen, body, (size_t)blen, NULL, 0) != EPD_OK) {
        return;
    }
    conn_answered(conn);
}

/* ------------------------------------------------------------ closing */

static void server_maybe_free(epd_http_server_t *server)
{
    if (server->closing && server->listener_closed && server->conns == NULL && !server->drop_busy) {
        epd_free(server);
    }
}

static void conn_finalize(epd_http_conn_t *conn)
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
    epd_free(conn);

    if (req != NULL) {
        req->conn = NULL;
        if (!req->held) {
            req_free(req);
        } else if (req->abort_cb != NULL) {
            req->abort_cb(req, req->abort_arg);
            req_free(req);
        }
        /* else: detached, the application finishes it later. */
    }
    server_maybe_free(server);
}

static void on_conn_handle_closed(uv_handle_t *handle)
{
    epd_http_conn_t *conn = handle->data;

    if (--conn->handles_open == 0) {
        conn_finalize(conn);
    }
}

static void conn_close(epd_http_conn_t *conn)
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
    uv_close((uv_handle_t *)&conn->timer, on_conn_handle_closed);
    uv_close((uv_handle_t *)&conn->tcp, on_conn_handle_closed);
}

static void on_timer(uv_timer_t *timer)
{
    epd_http_conn_t *conn = timer->data;

    switch (conn->state) {
    case CONN_HEAD:
        epd_log_debug(HTTP_LOG, 0, "request headers not complete in %llu ms: 408",
                      (unsigned long long)conn->server->config.header_timeout_ms);
        conn_fail(conn, 408, "request headers not received in time");
        break;
    case CONN_BODY:
        epd_log_debug(HTTP_LOG, 0, "request body not complete in %llu ms: 408",
                      (unsigned long long)conn->server->config.body_timeout_ms);
        conn_fail(conn, 408, "request body not received in time");
        break;
    case CONN_IDLE:
    case CONN_FLUSH:
    case CONN_BUSY:
        /* Idle between requests, or a client not taking its answer. */
        conn_close(conn);
        break;
    }
}

/* ------------------------------------------------------------ parser callbacks */

static epd_http_conn_t *conn_of(http_parser *parser)
{
    return parser->data;
}

/* Appends header bytes to the request, counting them against the limit. */
static int req_hbuf_append(epd_http_conn_t *conn, const char *at, size_t len, int counted)
{
    epd_http_req_t *req = conn->req;

    if (counted) {
        req->header_bytes += len;
        if (req->header_bytes > conn->server->config.max_header_bytes) {
            conn->fail_status = 431;
            return -1;
        }
    }
    if (req->hlen + len > req->hcap) {
        conn->fail_status = 431; /* unreachable while the counts hold */
        return -1;
    }
    memcpy(req->hbuf + req->hlen, at, len);
    req->hlen += len;
    return 0;
}

/* Moves the header collector to `phase`, terminating the string in
 * progress. */
static int req_phase(epd_http_conn_t *conn, hdr_phase_t phase)
{
    epd_http_req_t *req = conn->req;

    if (req->phase == phase) {
        return 0;
    }
    if (req_hbuf_append(conn, "", 1, 0) != 0) {
        return -1;
    }
    if (phase == PHASE_FIELD) {
        if (req->n_hdr == EPD_HTTP_MAX_HEADERS) {
            conn->fail_status = 431;
            return -1;
        }
        req->hdr[req->n_hdr].name_off = req->hlen;
        req->hdr[req->n_hdr].val_off = req->hlen; /* until a value starts */
        req->n_hdr++;
    } else if (phase == PHASE_VALUE) {
        req->hdr[req->n_hdr - 1].val_off = req->hlen;
    }
    req->phase = phase;
    return 0;
}

static int on_message_begin(http_parser *parser)
{
    epd_http_conn_t *conn = conn_of(parser);

    conn->req = req_create(&conn->server->config);
    if (conn->req == NULL) {
        epd_log_error(HTTP_LOG, 0, "no memory for a request");
        conn->fail_status = 503;
        return -1;
    }
    conn->req->conn = conn;
    conn->state = CONN_HEAD;
    conn_timer(conn, conn->server->config.header_timeout_ms);
    return 0;
}

static int on_url(http_parser *parser, const char *at, size_t len)
{
    return req_hbuf_append(conn_of(parser), at, len, 1);
}

static int on_header_field(http_parser *parser, const char *at, size_t len)
{
    epd_http_conn_t *conn = conn_of(parser);

    if (req_phase(conn, PHASE_FIELD) != 0) {
        return -1;
    }
    /* ": " and CRLF count too, so the limit matches the bytes on the wire. */
    return req_hbuf_append(conn, at, len, 1);
}

static int on_header_value(http_parser *parser, const char *at, size_t len)
{
    epd_http_conn_t *conn = conn_of(parser);

    if (conn->req->phase != PHASE_VALUE) {
        if (req_phase(conn, PHASE_VALUE) != 0) {
            return -1;
        }
        conn->req->header_bytes += 4;
    }
    return req_hbuf_append(conn, at, len, 1);
}

static int on_headers_complete(http_parser *parser)
{
    epd_http_conn_t *conn = conn_of(parser);
    epd_http_req_t *req = conn->req;
    const epd_http_config_t *config = &conn->server->config;
    const char *expect;

    if (req_phase(conn, PHASE_DONE) != 0) {
        return -1;
    }
    snprintf(req->method, sizeof(req->method), "%s",
             http_method_str((enum http_method)parser->method));
    req->http_minor = parser->http_major == 1 ? parser->http_minor : 0;
    req->keep_alive = http_should_keep_alive(parser) && !parser->upgrade;

    if (parser->content_length != ULLONG_MAX && parser->content_length > config->max_body_bytes) {
        conn->fail_status = 413;
        return -1;
    }
    if (parser->content_length != ULLONG_MAX && parser->content_length > 0) {
        req->body_cap = (size_t)parser->content_length + 1;
        req->body = epd_malloc(req->body_cap);
        if (req->body == NULL) {
            conn->fail_status = 503;
            return -1;
        }
    }
    expect = epd_http_req_header(req, "expect");
    if (expect != NULL && strcasecmp(expect, "100-continue") == 0 &&
        ((parser->flags & F_CHUNKED) ||
         (parser->content_length != ULLONG_MAX && parser->content_length > 0))) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (conn_write(conn, cont, sizeof(cont) - 1, NULL, 0, NULL, 0) != EPD_OK) {
            conn->fail_status = 503;
            return -1;
        }
    }
    conn->state = CONN_BODY;
    conn_timer(conn, config->body_timeout_ms);
    return 0;
}

static int on_body(http_parser *parser, const char *at, size_t len)
{
    epd_http_conn_t *conn = conn_of(parser);
    epd_http_req_t *req = conn->req;
    size_t max = conn->server->config.max_body_bytes;

    if (len > max || req->body_len > max - len) {
        conn->fail_status = 413;
        return -1;
    }
    if (req->body_len + len + 1 > req->body_cap) {
        /* Chunked: grow geometrically, never past the limit. */
        size_t cap = req->body_cap < 4096 ? 4096 : req->body_cap * 2;
        char *body;

        if (cap < req->body_len + len + 1) {
            cap = req->body_len + len + 1;
        }
        if (cap > max + 1) {
            cap = max + 1;
        }
        body = epd_realloc(req->body, cap);
        if (body == NULL) {
            conn->fail_status = 503;
            return -1;
        }
        req->body = body;
        req->body_cap = cap;
    }
    memcpy(req->body + req->body_len, at, len);
    req->body_len += len;
    return 0;
}

static int on_message_complete(http_parser *parser)
{
    epd_http_conn_t *conn = conn_of(parser);

    if (parser->upgrade) {
        conn->req->keep_alive = 0; /* the bytes after it are another protocol */
    }
    conn->state = CONN_BUSY;
    uv_timer_stop(&conn->timer);
    http_parser_pause(parser, 1);
    return 0;
}

/* ------------------------------------------------------------ reading */

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    epd_http_conn_t *conn = handle->data;

    (void)suggested;
    *buf = uv_buf_init(conn->inbuf + conn->in_len, (unsigned)(sizeof(conn->inbuf) - conn->in_len));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

static void conn_read_start(epd_http_conn_t *conn)
{
    if (conn->closing || conn->reading || conn->in_len == sizeof(conn->inbuf)) {
        return;
    }
    if (uv_read_start((uv_stream_t *)&conn->tcp, on_alloc, on_read) == 0) {
        conn->reading = 1;
    } else {
        conn_close(conn);
    }
}

static void conn_dispatch(epd_http_conn_t *conn)
{
    epd_http_req_t *req = conn->req;

    if (req->body == NULL) {
        req->body = epd_malloc(1);
        if (req->body == NULL) {
            conn_fail(conn, 503, "out of memory");
            return;
        }
        req->body_cap = 1;
    }
    req->body[req->body_len] = '\0';
    if (!req->keep_alive) {
        conn->close_after = 1;
    }
    req->held = 1;
    conn->server->config.handler(req, conn->server->config.arg);
}

/* Parses what is buffered, up to the end of one request, and hands a
 * complete request to the application. */
static void conn_process(epd_http_conn_t *conn)
{
    while (!conn->closing && conn->state <= CONN_BODY && conn->in_off < conn->in_len) {
        size_t avail = conn->in_len - conn->in_off;
        size_t n = http_parser_execute(&conn->parser, &conn->server->settings,
                                       conn->inbuf + conn->in_off, avail);
        enum http_errno err = HTTP_PARSER_ERRNO(&conn->parser);

        conn->in_off += n;
        if (err == HPE_PAUSED) {
            break;
        }
        if (err != HPE_OK || conn->fail_status != 0) {
            if (conn->fail_status == 413) {
                conn_fail(conn, 413, "request body too large");
            } else if (conn->fail_status == 431 || err == HPE_HEADER_OVERFLOW) {
                conn_fail(conn, 431, "request header fields too large");
            } else if (conn->fail_status != 0) {
                conn_fail(conn, conn->fail_status, "out of memory");
            } else {
                epd_log_debug(HTTP_LOG, 0, "malformed request: %s", http_errno_description(err));
                conn_fail(conn, 400, "malformed HTTP request");
            }
            return;
        }
        if (n < avail) {
            /* An upgrade stops the parser short of the data; not served. */
            conn_fail(conn, 400, "protocol upgrade not supported");
            return;
        }
    }
    if (conn->in_off == conn->in_len) {
        conn->in_off = conn->in_len = 0;
    } else if (conn->in_off > 0) {
        memmove(conn->inbuf, conn->inbuf + conn->in_off, conn->in_len - conn->in_off);
        conn->in_len -= conn->in_off;
        conn->in_off = 0;
    }
    if (conn->closing) {
        return;
    }
    if (conn->state == CONN_BUSY && conn->req != NULL && !conn->req->held) {
        conn_dispatch(conn);
    }
    if (conn->closing) {
        return;
    }
    if (conn->state == CONN_FLUSH && conn->close_after) {
        return; /* reading is pointless now */
    }
    if (conn->in_len == sizeof(conn->inbuf)) {
        /* Full of pipelined bytes: stop until this request is answered. */
        if (conn->reading) {
            uv_read_stop((uv_stream_t *)&conn->tcp);
            conn->reading = 0;
        }
        return;
    }
    conn_read_start(conn);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    epd_http_conn_t *conn = stream->data;

    (void)buf;
    if (nread == 0 || conn->closing) {
        return;
    }
    if (nread < 0) {
        if (conn->state == CONN_FLUSH && nread == UV_EOF) {
            /* The answer is complete; let it go out, then close. */
            conn->close_after = 1;
            uv_read_stop(stream);
            conn->reading = 0;
            return;
        }
        if (nread != UV_EOF) {
            epd_log_debug(HTTP_LOG, 0, "read: %s", uv_strerror((int)nread));
        }
        conn_close(conn);
        return;
    }
    conn->in_len += (size_t)nread;
    if (conn->state <= CONN_BODY) {
        conn_process(conn);
    } else if (conn->in_len == sizeof(conn->inbuf)) {
        uv_read_stop(stream);
        conn->reading = 0;
    }
}

/* ------------------------------------------------------------ accepting */

static void on_drop_closed(uv_handle_t *handle)
{
    epd_http_server_t *server = handle->data;

    server->drop_busy = 0;
    server_maybe_free(server);
}

static void on_connection(uv_stream_t *listener, int status)
{
    epd_http_server_t *server = listener->data;
    epd_http_conn_t *conn;

    if (status < 0) {
        epd_log_warn(HTTP_LOG, 0, "accept: %s", uv_strerror(status));
        return;
    }
    conn = epd_calloc(1, sizeof(*conn));
    if (conn == NULL) {
        /* libuv stops watching the listener until the pending connection
         * is accepted: take it off with the spare handle and close it. */
        epd_log_error(HTTP_LOG, 0, "no memory for a connection: dropping it");
        if (!server->drop_busy && uv_tcp_init(server->loop, &server->drop) == 0) {
            server->drop_busy = 1;
            server->drop.data = server;
            uv_accept(listener, (uv_stream_t *)&server->drop);
            uv_close((uv_handle_t *)&server->drop, on_drop_closed);
        }
        return;
    }
    conn->server = server;
    uv_tcp_init(server->loop, &conn->tcp);
    uv_timer_init(server->loop, &conn->timer);
    conn->tcp.data = conn;
    conn->timer.data = conn;
    conn->handles_open = 2;
    http_parser_init(&conn->parser, HTTP_REQUEST);
    conn->parser.data = conn;
    conn->next = server->conns;
    if (server->conns != NULL) {
        server->conns->prev = conn;
    }
    server->conns = conn;

    if (uv_accept(listener, (uv_stream_t *)&conn->tcp) != 0) {
        conn->refused = 1; /* never counted */
        conn_close(conn);
        return;
    }
    uv_tcp_nodelay(&conn->tcp, 1);
    if (server->n_live >= server->config.max_connections) {
        conn->refused = 1;
        epd_log_warn(HTTP_LOG, 0, "connection refused: %u connections open (the limit)",
                     server->n_live);
        conn_fail(conn, 503, "too many connections");
        return;
    }
    server->n_live++;
    conn->state = CONN_IDLE;
    conn_timer(conn, server->config.idle_timeout_ms);
    conn_read_start(conn);
}

/* ------------------------------------------------------------ server */

epd_status_t epd_http_server_create(uv_loop_t *loop, const epd_http_config_t *config,
                                    epd_http_server_t **server_p)
{
    epd_http_server_t *server;
    struct sockaddr_storage addr;
    struct sockaddr_storage bound;
    int namelen = sizeof(bound);
    epd_status_t status;
    int rc;

    if (loop == NULL || config == NULL || server_p == NULL || config->handler == NULL ||
        config->host == NULL || config->max_header_bytes == 0 || config->max_connections == 0 ||
        config->idle_timeout_ms == 0 || config->header_timeout_ms == 0 ||
        config->body_timeout_ms == 0 || config->max_stream_backlog == 0 ||
        config->max_body_bytes > (size_t)1 << 40 || config->max_header_bytes > (size_t)1 << 24) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (uv_ip4_addr(config->host, config->port, (struct sockaddr_in *)&addr) != 0 &&
        uv_ip6_addr(config->host, config->port, (struct sockaddr_in6 *)&addr) != 0) {
        epd_log_error(HTTP_LOG, 0, "cannot parse listen host '%s' (an IP literal)", config->host);
        return EPD_ERR_BAD_ADDRESS;
    }
    server = epd_calloc(1, sizeof(*server));
    if (server == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    server->loop = loop;
    server->config = *config;
    server->config.host = NULL; /* borrowed only during create */
    http_parser_settings_init(&server->settings);
    server->settings.on_message_begin = on_message_begin;
    server->settings.on_url = on_url;
    server->settings.on_header_field = on_header_field;
    server->settings.on_header_value = on_header_value;
    server->settings.on_headers_complete = on_headers_complete;
    server->settings.on_body = on_body;
    server->settings.on_message_complete = on_message_complete;

    rc = uv_tcp_init(loop, &server->listener);
    if (rc != 0) {
        status = EPD_ERR_IO;
        goto err_free_server;
    }
    server->listener.data = server;
    rc = uv_tcp_bind(&server->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0) {
        rc = uv_listen((uv_stream_t *)&server->listener, 511, on_connection);
    }
    if (rc != 0) {
        epd_log_error(HTTP_LOG, 0, "cannot listen on %s:%u: %s", config->host, config->port,
                      uv_strerror(rc));
        status = rc == UV_EADDRINUSE ? EPD_ERR_EXISTS : EPD_ERR_IO;
        goto err_close_listener;
    }
    rc = uv_tcp_getsockname(&server->listener, (struct sockaddr *)&bound, &namelen);
    if (rc != 0) {
        status = EPD_ERR_IO;
        goto err_close_listener;
    }
    server->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                     : ((struct sockaddr_in *)&bound)->sin_port);
    epd_log_info(HTTP_LOG, 0, "listening on %s:%u", config->host, server->port);
    *server_p = server;
    return EPD_OK;

err_close_listener:
    /* The handle lives inside server: the close callback frees it. */
    server->closing = 1;
    uv_close((uv_handle_t *)&server->listener, on_listener_closed);
    return status;
err_free_server:
    epd_free(server);
    return status;
}

static void on_listener_closed(uv_handle_t *handle)
{
    epd_http_server_t *server = handle->data;

    server->listener_closed = 1;
    server_maybe_free(server);
}

uint16_t epd_http_server_port(const epd_http_server_t *server)
{
    return server->port;
}

unsigned epd_http_server_connections(const epd_http_server_t *server)
{
    return server->n_live;
}

void epd_http_server_destroy(epd_http_server_t *server)
{
    epd_http_conn_t *conn;
    epd_http_conn_t *next;

    if (server == NULL || server->closing) {
        return;
    }
    server->closing = 1;
    uv_close((uv_handle_t *)&server->listener, on_listener_closed);
    for (conn = server->conns; conn != NULL; conn = next) {
        next = conn->next;
        conn_close(conn);
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
static void req_finish(epd_http_req_t *req)
{
    if (req->conn != NULL && req->conn->req == req) {
        req->conn->req = NULL;
    }
    req_free(req);
}

static int header_value_ok(const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '\r' || *s == '\n') {
            return 0;
        }
    }
    return 1;
}

epd_status_t epd_http_respond(epd_http_req_t *req, int status, const char *content_type,
                              const void *body, size_t len)
{
    epd_http_conn_t *conn = req->conn;
    char head[512];
    int hlen;
    int is_head = strcmp(req->method, "HEAD") == 0;
    epd_status_t st;

    if (req->streaming) {
        return epd_http_stream_end(req) == EPD_OK ? EPD_ERR_INVALID_PARAM
                                                  : EPD_ERR_CONNECTION_RESET;
    }
    if (conn == NULL || conn->closing) {
        req_finish(req);
        return EPD_ERR_CONNECTION_RESET;
    }
    if (status <= 100 || status >= 600) {
        status = 500;
    }
    if (content_type == NULL || !header_value_ok(content_type) || strlen(content_type) > 200) {
        epd_log_error(HTTP_LOG, 0, "refusing a bad content type: answering 500");
        content_type = "text/plain";
        status = 500;
        body = NULL;
        len = 0;
    }
    hlen = snprintf(head, sizeof(head),
                    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s\r\n", status,
                    epd_http_status_text(status), content_type, len,
                    conn->close_after      ? "Connection: close\r\n"
                    : req->http_minor == 0 ? "Connection: keep-alive\r\n"
                                           : "");
    req_finish(req);
    /* HEAD: the headers of the answer without its body. */
    st = conn_write(conn, head, (size_t)hlen, body, is_head ? 0 : len, NULL, 0);
    if (st != EPD_OK) {
        return st;
    }
    conn_answered(conn);
    return EPD_OK;
}

epd_status_t epd_http_stream_start(epd_http_req_t *req, int status)
{
    epd_http_conn_t *conn = req->conn;
    char head[256];
    int hlen;
    epd_status_t st;

    if (req->streaming) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (conn == NULL || conn->closing) {
        return EPD_ERR_CONNECTION_RESET;
    }
    if (status <= 100 || status >= 600) {
        status = 500;
    }
    req->chunked = req->http_minor >= 1;
    if (!req->chunked) {
        conn->close_after = 1; /* HTTP/1.0: the end of the stream is the close */
    }
    hlen = snprintf(head, sizeof(head),
                    "HTTP/1.1 %d %s\r\nContent-Type: text/event-stream\r\n"
                    "Cache-Control: no-cache\r\n%s\r\n",
                    status, epd_http_status_text(status),
                    req->chunked
                        ? (conn->close_after ? "Transfer-Encoding: chunked\r\nConnection: close\r\n"
                                             : "Transfer-Encoding: chunked\r\n")
                        : "Connection: close\r\n");
    st = conn_write(conn, head, (size_t)hlen, NULL, 0, NULL, 0);
    if (st != EPD_OK) {
        return st;
    }
    req->streaming = 1;
    return EPD_OK;
}

epd_status_t epd_http_stream_send(epd_http_req_t *req, const void *data, size_t len)
{
    epd_http_conn_t *conn = req->conn;
    size_t backlog;
    char size[24];
    int slen = 0;

    if (!req->streaming) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (conn == NULL || conn->closing) {
        return EPD_ERR_CONNECTION_RESET;
    }
    if (len == 0) {
        return EPD_OK;
    }
    backlog = uv_stream_get_write_queue_size((uv_stream_t *)&conn->tcp);
    if (len > conn->server->config.max_stream_backlog ||
        backlog > conn->server->config.max_stream_backlog - len) {
        epd_log_warn(HTTP_LOG, 0,
                     "slow reader: %zu unsent bytes + %zu would pass the %zu-byte limit: closing",
                     backlog, len, conn->server->config.max_stream_backlog);
        conn_close(conn);
        return EPD_ERR_CONNECTION_RESET;
    }
    if (req->chunked) {
        slen = snprintf(size, sizeof(size), "%zx\r\n", len);
    }
    return conn_write(conn, size, (size_t)slen, data, len, "\r\n", req->chunked ? 2 : 0);
}

epd_status_t epd_http_stream_end(epd_http_req_t *req)
{
    epd_http_conn_t *conn = req->conn;
    int chunked = req->chunked;
    epd_status_t st = EPD_OK;

    if (!req->streaming) {
        epd_http_respond(req, 500, "text/plain", NULL, 0);
        return EPD_ERR_INVALID_PARAM;
    }
    if (conn == NULL || conn->closing) {
        req_finish(req);
        return EPD_ERR_CONNECTION_RESET;
    }
    req_finish(req);
    if (chunked) {
        st = conn_write(conn, "0\r\n\r\n", 5, NULL, 0, NULL, 0);
    }
    if (st != EPD_OK) {
        return st;
    }
    conn_answered(conn);
    return EPD_OK;
}
