/*
 * epd_http_server.c — the HTTP server's intake (see epd_http_int.h): the
 * listener and accepting (max_connections and max_connections_per_addr, a
 * spare handle to shed a connection when out of memory), reading into a
 * connection's input buffer, and the http-parser callbacks that build a
 * request and hand it to the application's handler — one request per
 * connection at a time, pipelined bytes held back until its answer is
 * flushed.  What a request must pass before its body is buffered is
 * checked when its headers are complete: its HTTP version, its Host
 * header, its transfer coding, its key (config.keys) and the declared
 * body size; a chunk's size is checked at its size line.  The server-wide
 * body budget is charged as the body's bytes arrive, never on what a
 * header declares.
 *
 * Stands on epd_http_conn.c (writes, timers, closing) and calls nothing
 * of epd_http_respond.c: answering is the application's business.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <sodium.h>

#include "epd_alloc.h"
#include "epd_http_int.h"
#include "epd_log.h"

static void epd_http_conn_process(epd_http_conn_t *conn);
static void epd_http_on_listener_closed(uv_handle_t *handle);

/* The 429 beyond max_connections_per_addr (in OpenAI's rate-limit words) */
static const char epd_http_per_addr_message[] =
    "Too many connections from your address: please retry after the Retry-After delay.";

/* ------------------------------------------------------------ parser callbacks */

static epd_http_conn_t *epd_http_conn_of(http_parser *parser)
{
    return parser->data;
}

/* Sets up the refusal of the request being parsed (the strings static; a
 * NULL message: by status) and counts it in `counter` (NULL: none). */
static int epd_http_refuse(epd_http_conn_t *conn, int status, const char *message,
                           uint64_t *counter)
{
    conn->fail_status = status;
    conn->fail_message = message;
    if (counter != NULL) {
        (*counter)++;
    }
    return -1;
}

/* How epd_http_hbuf_append treats its bytes: bytes of the wire count against
 * max_header_bytes; the NUL terminators the collector adds do not. */
#define EPD_HTTP_HBUF_WIRE 0x1u
#define EPD_HTTP_HBUF_ADDED 0x0u

/* Appends header bytes to the request (`how`: EPD_HTTP_HBUF_*). */
static int epd_http_hbuf_append(epd_http_conn_t *conn, const char *at, size_t len, unsigned how)
{
    epd_http_req_t *req = conn->req;

    if ((how & EPD_HTTP_HBUF_WIRE) != 0) {
        req->header_bytes += len;
        if (req->header_bytes > conn->server->config.max_header_bytes) {
            return epd_http_refuse(conn, 431, NULL, &conn->server->stats.refused_header_size);
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
static int epd_http_req_phase(epd_http_conn_t *conn, epd_http_hdr_phase_t phase)
{
    epd_http_req_t *req = conn->req;

    if (req->phase == phase) {
        return 0;
    }
    if (epd_http_hbuf_append(conn, "", 1, EPD_HTTP_HBUF_ADDED) != 0) {
        return -1;
    }
    if (phase == EPD_HTTP_PHASE_FIELD) {
        if (req->n_hdr == EPD_HTTP_MAX_HEADERS) {
            return epd_http_refuse(conn, 431, NULL, &conn->server->stats.refused_header_size);
        }
        req->hdr[req->n_hdr].name_off = req->hlen;
        req->hdr[req->n_hdr].val_off = req->hlen; /* until a value starts */
        req->n_hdr++;
    } else if (phase == EPD_HTTP_PHASE_VALUE) {
        req->hdr[req->n_hdr - 1].val_off = req->hlen;
    }
    req->phase = phase;
    return 0;
}

static int epd_http_on_message_begin(http_parser *parser)
{
    epd_http_conn_t *conn = epd_http_conn_of(parser);

    conn->req = epd__http_req_create(&conn->server->config);
    if (conn->req == NULL) {
        epd_log_error(EPD_HTTP_LOG, 0, "no memory for a request");
        conn->fail_status = 503;
        return -1;
    }
    conn->req->conn = conn;
    conn->state = EPD_HTTP_CONN_HEAD;
    if (conn->fresh) {
        /* the first request: its deadline has run since the accept */
        conn->fresh = 0;
    } else {
        epd__http_conn_timer(conn, conn->server->config.header_timeout_ms);
    }
    return 0;
}

static int epd_http_on_url(http_parser *parser, const char *at, size_t len)
{
    return epd_http_hbuf_append(epd_http_conn_of(parser), at, len, EPD_HTTP_HBUF_WIRE);
}

static int epd_http_on_header_field(http_parser *parser, const char *at, size_t len)
{
    epd_http_conn_t *conn = epd_http_conn_of(parser);

    if (epd_http_req_phase(conn, EPD_HTTP_PHASE_FIELD) != 0) {
        return -1;
    }
    /* http-parser takes "Transfer-Encoding : chunked" as the header it
     * names, while the name collected here would keep the blank: RFC 9112
     * 5.1 says refuse whitespace before the colon (400), so both agree */
    if (memchr(at, ' ', len) != NULL || memchr(at, '\t', len) != NULL) {
        return epd_http_refuse(conn, 400, "whitespace in a header name",
                               &conn->server->stats.refused_malformed);
    }
    /* ": " and CRLF count too, so the limit matches the bytes on the wire. */
    return epd_http_hbuf_append(conn, at, len, EPD_HTTP_HBUF_WIRE);
}

static int epd_http_on_header_value(http_parser *parser, const char *at, size_t len)
{
    epd_http_conn_t *conn = epd_http_conn_of(parser);

    if (conn->req->phase != EPD_HTTP_PHASE_VALUE) {
        if (epd_http_req_phase(conn, EPD_HTTP_PHASE_VALUE) != 0) {
            return -1;
        }
        conn->req->header_bytes += 4;
    }
    return epd_http_hbuf_append(conn, at, len, EPD_HTTP_HBUF_WIRE);
}

/* 1 when the request target `url` names one of config->open_paths (its
 * path without the query, trailing slashes dropped, as the application
 * routes it). */
static int epd_http_path_open(const epd_http_config_t *config, const char *url)
{
    size_t len = strcspn(url, "?#");

    while (len > 1 && url[len - 1] == '/') {
        len--;
    }
    for (const char *const *p = config->open_paths; p != NULL && *p != NULL; p++) {
        if (strlen(*p) == len && memcmp(*p, url, len) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Counts `bytes` more of buffered body against the server's budget: 0, or
 * -1 (a 503 set up) when it would pass max_buffered_body_bytes.  Called
 * only as a body's bytes arrive: what is charged is memory held. */
static int epd_http_body_charge(epd_http_conn_t *conn, size_t bytes)
{
    epd_http_server_t *server = conn->server;
    size_t budget = server->config.max_buffered_body_bytes;

    if (budget != 0 && (bytes > budget || server->body_bytes > budget - bytes)) {
        server->stats.refused_body_budget++;
        epd_log_warn(EPD_HTTP_LOG, 0,
                     "request refused: %zu more body bytes would pass the %zu-byte budget "
                     "(%zu buffered)",
                     bytes, budget, server->body_bytes);
        conn->fail_status = 503;
        conn->fail_message = "the server is buffering too many request bodies: retry shortly";
        conn->fail_header = "Retry-After: 1";
        return -1;
    }
    server->body_bytes += bytes;
    conn->req->charged += bytes;
    return 0;
}

/* The number of headers named `name` and the first one's value (NULL:
 * none). */
static unsigned epd_http_req_header_count(const epd_http_req_t *req, const char *name,
                                          const char **value_p)
{
    unsigned n = 0;

    *value_p = epd_http_req_header(req, name);
    for (unsigned i = 0; i < req->n_hdr; i++) {
        n += strcasecmp(req->hbuf + req->hdr[i].name_off, name) == 0;
    }
    return n;
}

/* 1 when `value` is the token `token`, case-insensitive, blanks around it
 * allowed. */
static int epd_http_value_is(const char *value, const char *token)
{
    size_t len;

    value += strspn(value, " \t");
    len = strlen(value);
    while (len > 0 && (value[len - 1] == ' ' || value[len - 1] == '\t')) {
        len--;
    }
    return len == strlen(token) && strncasecmp(value, token, len) == 0;
}

/* The checks of the request line and headers that need no application:
 * version, Host, transfer coding.  0, or -1 with the refusal set up. */
static int epd_http_check_framing(epd_http_conn_t *conn, const http_parser *parser)
{
    epd_http_stats_t *stats = &conn->server->stats;
    const char *value;
    unsigned n;

    if (parser->http_major != 1 || parser->http_minor > 1) {
        return epd_http_refuse(conn, 505, "HTTP version not supported: send HTTP/1.1 or HTTP/1.0",
                               &stats->refused_version);
    }
    /* RFC 9112 3.2: a server must answer 400 to an HTTP/1.1 request without
     * a Host header and to any request with more than one */
    n = epd_http_req_header_count(conn->req, "host", &value);
    if (n > 1) {
        return epd_http_refuse(conn, 400, "more than one Host header", &stats->refused_host);
    }
    if (n == 0 && parser->http_minor == 1) {
        return epd_http_refuse(conn, 400, "an HTTP/1.1 request needs a Host header",
                               &stats->refused_host);
    }
    /* Only chunked, alone, is decoded: another coding (gzip, a list ending
     * in chunked, identity) would reach the application still encoded, or
     * be framed differently by a proxy in front (smuggling) */
    n = epd_http_req_header_count(conn->req, "transfer-encoding", &value);
    if (n > 1 || (n == 1 && !epd_http_value_is(value, "chunked"))) {
        return epd_http_refuse(conn, 501,
                               "transfer coding not supported: send the body with "
                               "Content-Length or Transfer-Encoding: chunked alone",
                               &stats->refused_encoding);
    }
    return 0;
}

/* The per-address cap at the end of a request head: a connection over
 * the cap since its accept is refused now; one from a trusted proxy is
 * counted under its request's client address (X-Forwarded-For).  0, or -1
 * with the 429 set up. */
static int epd_http_check_addr(epd_http_conn_t *conn)
{
    epd_http_server_t *server = conn->server;
    const epd_http_req_t *req = conn->req;
    const char *xff[EPD_HTTP_MAX_HEADERS];
    unsigned char client[16];
    size_t n = 0;

    if (conn->trusted && server->config.max_connections_per_addr != 0) {
        for (unsigned i = 0; i < req->n_hdr; i++) {
            if (strcasecmp(req->hbuf + req->hdr[i].name_off, "x-forwarded-for") == 0 &&
                req->hdr[i].val_off != req->hdr[i].name_off) {
                xff[n++] = req->hbuf + req->hdr[i].val_off;
            }
        }
        epd_http_forwarded_addr(server->config.trusted_proxies, conn->peer, xff, n, client);
        /* released when the answer is out (epd_http_on_write): none held now */
        epd__http_addr_release(server, conn);
        epd__http_addr_key(client, conn->addr);
        if (epd__http_addr_acquire(server, conn) != 0) {
            conn->over_cap = 1;
            server->over_cap++;
        }
    }
    if (!conn->over_cap) {
        return 0;
    }
    conn->fail_code = "rate_limit_exceeded";
    conn->fail_header = "Retry-After: 1";
    return epd_http_refuse(conn, 429, epd_http_per_addr_message, &server->stats.refused_per_addr);
}

static int epd_http_on_headers_complete(http_parser *parser)
{
    epd_http_conn_t *conn = epd_http_conn_of(parser);
    epd_http_req_t *req = conn->req;
    const epd_http_config_t *config = &conn->server->config;
    const char *expect;

    if (epd_http_req_phase(conn, EPD_HTTP_PHASE_DONE) != 0) {
        return -1;
    }
    snprintf(req->method, sizeof(req->method), "%s",
             http_method_str((enum http_method)parser->method));
    req->http_minor = parser->http_major == 1 ? parser->http_minor : 0;
    req->keep_alive = http_should_keep_alive(parser) && !parser->upgrade;
    if (epd_http_check_framing(conn, parser) != 0 || epd_http_check_addr(conn) != 0) {
        return -1;
    }

    /* the key first: a client without one gets nothing buffered */
    if (config->keys != NULL && !epd_http_path_open(config, req->hbuf) &&
        !epd_http_keys_check(config->keys, epd_http_req_header(req, "authorization"))) {
        conn->server->stats.auth_failures++;
        conn->fail_status = 401;
        conn->fail_code = "invalid_api_key";
        conn->fail_header = "WWW-Authenticate: Bearer";
        conn->fail_message =
            epd_http_req_header(req, "authorization") == NULL
                ? "You didn't provide an API key. You need to provide your API key in an "
                  "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
                : "Incorrect API key provided.";
        return -1;
    }
    req->declared = parser->content_length;
    if (parser->content_length != ULLONG_MAX && parser->content_length > conn->server->body_limit) {
        return epd_http_refuse(conn, 413, NULL, &conn->server->stats.refused_body_size);
    }
    /* Nothing is allocated or charged here: the body's buffer grows as its
     * bytes arrive (epd_http_on_body), so a declared length costs nothing */
    expect = epd_http_req_header(req, "expect");
    if (expect != NULL && strcasecmp(expect, "100-continue") == 0 &&
        ((parser->flags & F_CHUNKED) ||
         (parser->content_length != ULLONG_MAX && parser->content_length > 0))) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (epd__http_conn_write(conn, cont, sizeof(cont) - 1, NULL, 0, NULL, 0) != EPD_OK) {
            conn->fail_status = 503;
            return -1;
        }
    }
    conn->state = EPD_HTTP_CONN_BODY;
    epd__http_conn_timer(conn, config->body_timeout_ms);
    return 0;
}

/* A chunk-size line is complete (parser->content_length: the chunk's
 * size): a chunk that would take the body past the limit is refused now,
 * before its data. */
static int epd_http_on_chunk_header(http_parser *parser)
{
    epd_http_conn_t *conn = epd_http_conn_of(parser);
    size_t limit = conn->server->body_limit;

    if (parser->content_length > limit || conn->req->body_len > limit - parser->content_length) {
        return epd_http_refuse(conn, 413, NULL, &conn->server->stats.refused_body_size);
    }
    return 0;
}

static int epd_http_on_body(http_parser *parser, const char *at, size_t len)
{
    epd_http_conn_t *conn = epd_http_conn_of(parser);
    epd_http_req_t *req = conn->req;
    size_t max = conn->server->body_limit;

    if (len > max || req->body_len > max - len) {
        return epd_http_refuse(conn, 413, NULL, &conn->server->stats.refused_body_size);
    }
    if (req->body_len + len + 1 > req->body_cap) {
        /* Grow geometrically as bytes arrive, never past the declared
         * length nor the limit: the memory held (and charged) stays within
         * twice what was received. */
        size_t cap = req->body_cap < 4096 ? 4096 : req->body_cap * 2;
        size_t ceiling = req->declared != ULLONG_MAX ? (size_t)req->declared + 1 : max + 1;
        char *body;

        if (cap < req->body_len + len + 1) {
            cap = req->body_len + len + 1;
        }
        if (cap > ceiling) {
            cap = ceiling;
        }
        if (epd_http_body_charge(conn, cap - req->body_cap) != 0) {
            return -1;
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

static int epd_http_on_message_complete(http_parser *parser)
{
    epd_http_conn_t *conn = epd_http_conn_of(parser);

    if (parser->upgrade) {
        conn->req->keep_alive = 0; /* the bytes after it are another protocol */
    }
    conn->state = EPD_HTTP_CONN_BUSY;
    uv_timer_stop(&conn->timer);
    http_parser_pause(parser, 1);
    return 0;
}

/* ------------------------------------------------------------ reading */

static void epd_http_on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    epd_http_conn_t *conn = handle->data;

    (void)suggested;
    *buf = uv_buf_init(conn->inbuf + conn->in_len, (unsigned)(sizeof(conn->inbuf) - conn->in_len));
}

static void epd_http_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

static void epd_http_conn_read_start(epd_http_conn_t *conn)
{
    if (conn->closing || conn->reading || conn->in_len == sizeof(conn->inbuf)) {
        return;
    }
    if (uv_read_start((uv_stream_t *)&conn->tcp, epd_http_on_alloc, epd_http_on_read) == 0) {
        conn->reading = 1;
    } else {
        epd__http_conn_close(conn);
    }
}

static void epd_http_conn_dispatch(epd_http_conn_t *conn)
{
    epd_http_req_t *req = conn->req;

    if (req->body == NULL) {
        req->body = epd_malloc(1);
        if (req->body == NULL) {
            epd__http_conn_fail(conn, 503, "out of memory");
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
static void epd_http_conn_process(epd_http_conn_t *conn)
{
    while (!conn->closing && conn->state <= EPD_HTTP_CONN_BODY && conn->in_off < conn->in_len) {
        size_t avail = conn->in_len - conn->in_off;
        size_t n = http_parser_execute(&conn->parser, &conn->server->settings,
                                       conn->inbuf + conn->in_off, avail);
        enum http_errno err = HTTP_PARSER_ERRNO(&conn->parser);

        conn->in_off += n;
        if (err == HPE_PAUSED) {
            break;
        }
        if (err != HPE_OK || conn->fail_status != 0) {
            if (conn->fail_message != NULL) {
                epd__http_conn_refuse(conn, conn->fail_status, conn->fail_message, conn->fail_code,
                                      conn->fail_header);
            } else if (conn->fail_status == 413) {
                epd__http_conn_fail(conn, 413, conn->server->too_large);
            } else if (conn->fail_status == 431 || err == HPE_HEADER_OVERFLOW) {
                if (conn->fail_status != 431) {
                    conn->server->stats.refused_header_size++; /* http-parser's own bound */
                }
                epd__http_conn_fail(conn, 431, "request header fields too large");
            } else if (conn->fail_status != 0) {
                epd__http_conn_fail(conn, conn->fail_status, "out of memory");
            } else {
                conn->server->stats.refused_malformed++;
                epd_log_debug(EPD_HTTP_LOG, 0, "malformed request: %s",
                              http_errno_description(err));
                epd__http_conn_fail(conn, 400, "malformed HTTP request");
            }
            return;
        }
        if (n < avail) {
            /* An upgrade stops the parser short of the data; not served. */
            epd__http_conn_fail(conn, 400, "protocol upgrade not supported");
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
    if (conn->state == EPD_HTTP_CONN_BUSY && conn->req != NULL && !conn->req->held) {
        epd_http_conn_dispatch(conn);
    }
    if (conn->closing) {
        return;
    }
    if (conn->state == EPD_HTTP_CONN_FLUSH && conn->close_after) {
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
    epd_http_conn_read_start(conn);
}

static void epd_http_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    epd_http_conn_t *conn = stream->data;

    (void)buf;
    if (nread == 0 || conn->closing) {
        return;
    }
    if (nread < 0) {
        if (conn->state == EPD_HTTP_CONN_FLUSH && nread == UV_EOF) {
            /* The answer is complete; let it go out, then close. */
            conn->close_after = 1;
            conn->peer_eof = 1;
            uv_read_stop(stream);
            conn->reading = 0;
            return;
        }
        if (nread != UV_EOF) {
            epd_log_debug(EPD_HTTP_LOG, 0, "read: %s", uv_strerror((int)nread));
        }
        epd__http_conn_close(conn);
        return;
    }
    conn->in_len += (size_t)nread;
    if (conn->state <= EPD_HTTP_CONN_BODY) {
        epd_http_conn_process(conn);
    } else if (conn->in_len == sizeof(conn->inbuf)) {
        uv_read_stop(stream);
        conn->reading = 0;
    }
}

/* ------------------------------------------------------------ accepting */

static void epd_http_on_drop_closed(uv_handle_t *handle)
{
    epd_http_server_t *server = handle->data;

    server->drop_busy = 0;
    epd__http_server_maybe_free(server);
}

static void epd_http_on_connection(uv_stream_t *listener, int status)
{
    epd_http_server_t *server = listener->data;
    epd_http_conn_t *conn;

    if (status < 0) {
        epd_log_warn(EPD_HTTP_LOG, 0, "accept: %s", uv_strerror(status));
        return;
    }
    conn = epd_calloc(1, sizeof(*conn));
    if (conn == NULL) {
        /* libuv stops watching the listener until the pending connection
         * is accepted: take it off with the spare handle and close it. */
        epd_log_error(EPD_HTTP_LOG, 0, "no memory for a connection: dropping it");
        if (!server->drop_busy && uv_tcp_init(server->loop, &server->drop) == 0) {
            server->drop_busy = 1;
            server->drop.data = server;
            uv_accept(listener, (uv_stream_t *)&server->drop);
            uv_close((uv_handle_t *)&server->drop, epd_http_on_drop_closed);
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
        epd__http_conn_close(conn);
        return;
    }
    uv_tcp_nodelay(&conn->tcp, 1);
    if (server->n_live >= server->config.max_connections) {
        conn->refused = 1;
        server->stats.refused_max_conns++;
        epd_log_warn(EPD_HTTP_LOG, 0, "connection refused: %u connections open (the limit)",
                     server->n_live);
        epd__http_conn_refuse(conn, 503, "too many connections: retry shortly", NULL,
                              "Retry-After: 1");
        return;
    }
    {
        struct sockaddr_storage peer;
        int namelen = sizeof(peer);

        /* a peer whose address cannot be read (gone already, or not IP)
         * is not counted: the global cap still holds it */
        conn->has_peer = uv_tcp_getpeername(&conn->tcp, (struct sockaddr *)&peer, &namelen) == 0 &&
                         epd__http_addr_full(&peer, conn->peer) == 0;
    }
    if (conn->has_peer && epd_http_proxies_match(server->config.trusted_proxies, conn->peer)) {
        /* counted per request, under the address its X-Forwarded-For
         * names (epd_http_on_headers_complete) */
        conn->trusted = 1;
    } else if (conn->has_peer && server->config.max_connections_per_addr != 0) {
        epd__http_addr_key(conn->peer, conn->addr);
        if (epd__http_addr_acquire(server, conn) != 0) {
            /* one line per burst would be better; debug keeps a flood
             * from one address out of the log */
            epd_log_debug(EPD_HTTP_LOG, 0,
                          "%u connections open from a connection's address (the limit): its "
                          "request gets 429",
                          server->config.max_connections_per_addr);
            if (server->over_cap >= EPD_HTTP_OVER_CAP) {
                /* a flood of sockets from few addresses: answered now,
                 * without holding a slot for their heads */
                conn->refused = 1;
                server->stats.refused_per_addr++;
                epd__http_conn_refuse(conn, 429, epd_http_per_addr_message, "rate_limit_exceeded",
                                      "Retry-After: 1");
                return;
            }
            conn->over_cap = 1;
            server->over_cap++;
        }
    }
    server->n_live++;
    server->stats.accepted++;
    conn->state = EPD_HTTP_CONN_IDLE;
    conn->fresh = 1;
    /* the first request's headers are due this long after the accept: a
     * connection that sends nothing holds its slot no longer */
    epd__http_conn_timer(conn, server->config.header_timeout_ms);
    epd_http_conn_read_start(conn);
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
        config->max_body_bytes > (size_t)1 << 40 || config->max_header_bytes > (size_t)1 << 24 ||
        config->max_connections > (1u << 24)) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (uv_ip4_addr(config->host, config->port, (struct sockaddr_in *)&addr) != 0 &&
        uv_ip6_addr(config->host, config->port, (struct sockaddr_in6 *)&addr) != 0) {
        epd_log_error(EPD_HTTP_LOG, 0, "cannot parse listen host '%s' (an IP literal)",
                      config->host);
        return EPD_ERR_BAD_ADDRESS;
    }
    server = epd_calloc(1, sizeof(*server));
    if (server == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    server->loop = loop;
    server->config = *config;
    server->config.host = NULL; /* borrowed only during create */
    server->body_limit = config->max_body_bytes;
    if (config->max_buffered_body_bytes != 0 &&
        config->max_buffered_body_bytes / EPD_HTTP_BODY_SHARES < server->body_limit) {
        server->body_limit = config->max_buffered_body_bytes / EPD_HTTP_BODY_SHARES;
    }
    snprintf(server->too_large, sizeof(server->too_large),
             "request body too large: at most %zu bytes", server->body_limit);
    if (config->max_connections_per_addr != 0) {
        size_t slots = 16;

        while (slots < 2 * (size_t)config->max_connections) {
            slots *= 2;
        }
        server->addrs = epd_calloc(slots, sizeof(*server->addrs));
        if (server->addrs == NULL || sodium_init() < 0) {
            status = EPD_ERR_NO_MEMORY;
            goto err_free_server;
        }
        server->addrs_mask = slots - 1;
        randombytes_buf(server->addrs_key, sizeof(server->addrs_key));
    }
    server->resume = epd_http_conn_process;
    http_parser_settings_init(&server->settings);
    server->settings.on_message_begin = epd_http_on_message_begin;
    server->settings.on_url = epd_http_on_url;
    server->settings.on_header_field = epd_http_on_header_field;
    server->settings.on_header_value = epd_http_on_header_value;
    server->settings.on_headers_complete = epd_http_on_headers_complete;
    server->settings.on_chunk_header = epd_http_on_chunk_header;
    server->settings.on_body = epd_http_on_body;
    server->settings.on_message_complete = epd_http_on_message_complete;

    rc = uv_tcp_init(loop, &server->listener);
    if (rc != 0) {
        status = EPD_ERR_IO;
        goto err_free_server;
    }
    server->listener.data = server;
    rc = uv_tcp_bind(&server->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0) {
        rc = uv_listen((uv_stream_t *)&server->listener, 511, epd_http_on_connection);
    }
    if (rc != 0) {
        epd_log_error(EPD_HTTP_LOG, 0, "cannot listen on %s:%u: %s", config->host, config->port,
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
    epd_log_info(EPD_HTTP_LOG, 0, "listening on %s:%u", config->host, server->port);
    *server_p = server;
    return EPD_OK;

err_close_listener:
    /* The handle lives inside server: the close callback frees it. */
    server->closing = 1;
    uv_close((uv_handle_t *)&server->listener, epd_http_on_listener_closed);
    return status;
err_free_server:
    epd_free(server->addrs);
    epd_free(server);
    return status;
}

static void epd_http_on_listener_closed(uv_handle_t *handle)
{
    epd_http_server_t *server = handle->data;

    server->listener_closed = 1;
    epd__http_server_maybe_free(server);
}

uint16_t epd_http_server_port(const epd_http_server_t *server)
{
    return server->port;
}

unsigned epd_http_server_connections(const epd_http_server_t *server)
{
    return server->n_live;
}

void epd_http_server_stats(const epd_http_server_t *server, epd_http_stats_t *stats_p)
{
    *stats_p = server->stats;
    stats_p->buffered_body_bytes = server->body_bytes;
    stats_p->connections = server->n_live;
}

void epd_http_server_destroy(epd_http_server_t *server)
{
    epd_http_conn_t *conn;
    epd_http_conn_t *next;

    if (server == NULL || server->closing) {
        return;
    }
    server->closing = 1;
    server->destroyed = 1;
    uv_close((uv_handle_t *)&server->listener, epd_http_on_listener_closed);
    for (conn = server->conns; conn != NULL; conn = next) {
        next = conn->next;
        epd__http_conn_close(conn);
    }
}
