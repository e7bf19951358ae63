/*
 * epd_http.h — a small HTTP/1.1 server on a libuv loop, the router's front
 * door (the OpenAI API on top of it lives in epd_openai.h).
 *
 * Design.  One listening uv_tcp_t; one connection object per accepted
 * socket, parsed by http-parser.  A connection serves one request at a time,
 * in order: when a request is complete the parser is paused and further
 * (pipelined) bytes stay buffered (at most EPD_HTTP_INBUF_BYTES; reading
 * stops when that buffer is full) until the response has been written out
 * completely; then parsing resumes.  Reading otherwise continues while the
 * application works on a request, so that a client that goes away (EOF or
 * error) is noticed at once and the application is told (abort callback).
 * A client that half-closes its socket after sending a request is treated
 * as gone, as nginx does.
 *
 * Limits, each with a clear answer: a request line that is not HTTP/1.0 or
 * HTTP/1.1 → 505; an HTTP/1.1 request without a Host header, or any request
 * with two → 400; a Transfer-Encoding other than a single `chunked` (gzip,
 * a list, identity) → 501; header bytes (request line + names + values)
 * over max_header_bytes or more than EPD_HTTP_MAX_HEADERS headers → 431;
 * a body over the body limit → 413, found from Content-Length, from a
 * chunk-size line, or as chunks add up; a connection beyond
 * max_connections → 503 with Retry-After; a request whose headers (resp.
 * body) do not arrive within header_timeout_ms (resp. body_timeout_ms) →
 * 408; malformed HTTP → 400.
 *
 * The per-address cap.  A client address (an IPv6 client's /64 counts as
 * one) may hold max_connections_per_addr connections.  One beyond it is
 * still accepted (it counts against max_connections like any other) and
 * its request head is read within header_timeout_ms; then it is answered
 * a complete 429 with Retry-After: 1 and OpenAI's rate-limit error body,
 * and closed gracefully (a lingering close that drops the body, below):
 * a client sending its request never sees a reset.  At most
 * EPD_HTTP_OVER_CAP such connections wait for their head at once; beyond
 * them (a flood of idle sockets from one address) a connection is
 * answered the same 429 at once, before its head.  The client address is
 * the TCP peer's, or with config.trusted_proxies and a peer among them,
 * the one X-Forwarded-For names (epd_http_forwarded_addr): a connection
 * from a trusted proxy is counted, per request, under the address of the
 * request it carries — from the end of its head until its answer is
 * written — so one proxy's connections are shared fairly by its clients,
 * and the proxy's own address is never capped.
 *
 * The body budget.  Request bodies are buffered whole before the
 * application sees them; max_buffered_body_bytes bounds the memory all of
 * them hold at once.  A body is charged for the memory it holds, grown as
 * its bytes arrive (doubling from 4 KiB, never past its declared length):
 * at most twice what was received (4 KiB at first), never what a header
 * only declares, so clients that send headers declaring large bodies and
 * then nothing take no budget.  One request may hold at most its
 * connection's share, a 1/EPD_HTTP_BODY_SHARES of the budget: the body
 * limit is the smaller of max_body_bytes and that share (beyond: 413), so
 * a few connections cannot take the whole budget either.  When the bytes
 * that did arrive would take the budget past max_buffered_body_bytes, that
 * request is answered 503 with Retry-After: 1 (the others go on).
 *
 * Each refusal closes the connection after the answer is written, and
 * (like any answer that ends its connection) closes it gracefully, a
 * lingering close as nginx does: the write side is shut down once the
 * answer is out, what the client still sends is read and dropped — until
 * its end of the stream, for at most EPD_HTTP_LINGER_MS (or
 * idle_timeout_ms when shorter) and EPD_HTTP_LINGER_BYTES — and only then
 * is the socket closed, so a client still sending its request reads the
 * whole answer instead of a TCP reset.  (Connections refused beyond the
 * caps linger too, at most EPD_HTTP_LINGER_REFUSED of them at once; the
 * rest are closed at once.)
 *
 * The header deadline of a connection's first request runs from the
 * accept, so a client that connects and sends nothing is closed (silently)
 * after header_timeout_ms; on a keep-alive connection a later request's
 * runs from its first byte, and between requests a connection may idle
 * for idle_timeout_ms, after which it is closed silently, as is one whose
 * full response is not taken by the client within idle_timeout_ms.  One uv
 * timer per connection enforces these deadlines, so a slow client
 * (slowloris) costs one small object and never blocks anyone else.
 *
 * Keys.  With config.keys set, every request whose path (the target
 * without its query, trailing slashes dropped) is not one of
 * config.open_paths must carry `Authorization: Bearer KEY` with KEY one of
 * the keys (epd_http_keys_check: constant time).  It is checked as soon
 * as the headers are complete, before any byte of the body is buffered:
 * without it the answer is 401 with `WWW-Authenticate: Bearer` and an
 * OpenAI error body (code "invalid_api_key"), and the connection closes.
 * The application never sees such a request.
 *
 * Responses.  The application answers each request exactly once, either
 * with a full response (epd_http_respond) or with a streaming one
 * (epd_http_stream_start, then any number of epd_http_stream_send, then
 * epd_http_stream_end): Server-Sent Events, `Content-Type:
 * text/event-stream`, `Cache-Control: no-cache`, chunked transfer encoding
 * (HTTP/1.0 clients get the raw stream and a close at its end).  Writes are
 * bounded: when a stream's unsent backlog (bytes libuv could not yet hand
 * to the kernel) would exceed max_stream_backlog, the connection is closed
 * and the application's abort callback fires — a slow reader can never make
 * the server buffer without bound.
 *
 * Threads: everything here belongs to the loop thread that created the
 * server; no function may be called from another thread.  No callback is
 * ever made from inside an epd_http_* call made by the application: the
 * handler runs from the loop's read callback, the abort callback from a
 * close callback.
 */
#ifndef EPD_HTTP_H
#define EPD_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "epd_status.h"

typedef struct epd_http_server epd_http_server_t;
typedef struct epd_http_req epd_http_req_t;
typedef struct epd_http_keys epd_http_keys_t;
typedef struct epd_http_proxies epd_http_proxies_t;

#define EPD_HTTP_MAX_HEADERS 64          /* more headers in one request → 431 */
#define EPD_HTTP_INBUF_BYTES (64 * 1024) /* per-connection read buffer */
/* a request's body may hold at most 1/this of max_buffered_body_bytes */
#define EPD_HTTP_BODY_SHARES 16
/* the lingering close after a refusal: at most this long (or
 * idle_timeout_ms when shorter) and this many bytes read and dropped */
#define EPD_HTTP_LINGER_MS 5000
#define EPD_HTTP_LINGER_BYTES ((size_t)64 << 20)
/* connections refused beyond the caps that may linger at once */
#define EPD_HTTP_LINGER_REFUSED 256
/* connections beyond max_connections_per_addr that may wait for their
 * request head at once (to answer it 429); beyond: 429 at once */
#define EPD_HTTP_OVER_CAP 256

/* The application's handler: a complete request has arrived on a
 * connection.  `req` is lent to the application from this call until it
 * finishes the request: epd_http_respond, epd_http_stream_end, or the
 * return of its abort callback (see epd_http_req_set_abort), whichever
 * comes first; the application must finish every request it is given,
 * inside the handler or later.  The accessors below (method, path,
 * headers, body) stay valid for that whole time.  Loop thread. */
typedef void (*epd_http_handler_cb_t)(epd_http_req_t *req, void *arg);

/* The client of `req` is gone (EOF, socket error, a timeout, a slow
 * reader past max_stream_backlog, or server destroy) before the
 * application finished the request.  Called once, from the loop (never
 * from inside an epd_http_* call); `req` is invalid once it returns and
 * the application must not finish it.  Loop thread. */
typedef void (*epd_http_abort_cb_t)(epd_http_req_t *req, void *arg);

typedef struct {
    const char *host;                  /* borrowed during create; IPv4 or IPv6 literal */
    uint16_t port;                     /* 0: an ephemeral port (see epd_http_server_port) */
    size_t max_header_bytes;           /* request line + header names and values → 431 */
    size_t max_body_bytes;             /* → 413 (the body limit: this, or the
                                        * budget's share when smaller) */
    unsigned max_connections;          /* beyond → 503 with Retry-After, and close */
    unsigned max_connections_per_addr; /* from one client address (IPv6: its /64) beyond
                                        * → 429 with Retry-After once the request head
                                        * is read, and close; 0: no cap */
    size_t max_buffered_body_bytes;    /* memory of request bodies buffered at once, all
                                        * connections together, charged as bytes arrive: a
                                        * body whose bytes would pass it → 503 with
                                        * Retry-After; one body holds at most 1/16 of it
                                        * (beyond: 413); 0: no budget, no share */
    uint64_t idle_timeout_ms;          /* between requests, and to flush a response */
    uint64_t header_timeout_ms;        /* accept (first request) or first byte (later ones on
                                        * a keep-alive connection) → end of its headers */
    uint64_t body_timeout_ms;          /* end of headers → end of body */
    size_t max_stream_backlog;         /* unsent bytes of a stream before the close */
    /* optional: the keys requests must carry (borrowed: it must outlive the
     * server); NULL: none needed */
    const epd_http_keys_t *keys;
    /* with keys: the paths served without one, a NULL-terminated array
     * (borrowed, like keys), e.g. {"/health", "/metrics", NULL}; NULL: none */
    const char *const *open_paths;
    /* optional: the peers whose X-Forwarded-For names the client address
     * the per-address cap counts (borrowed, like keys); NULL: none, the
     * header is ignored */
    const epd_http_proxies_t *trusted_proxies;
    epd_http_handler_cb_t handler; /* required */
    void *arg;                     /* handed to handler and closed */
    /* optional: after epd_http_server_destroy, called once from the loop
     * when the server has closed its last handle — every connection is
     * closed, every abort callback has run, its memory is freed — so an
     * application that must abort its requests upstream on shutdown knows
     * when that is done.  NULL: not told. */
    void (*closed)(void *arg);
} epd_http_config_t;

/* Fills `config` with defaults: 127.0.0.1:0, 16 KiB headers, 4 MiB body,
 * 1024 connections, 1024 per client address, 256 MiB of buffered bodies,
 * 60 s idle, 10 s headers, 30 s body, 1 MiB stream backlog, no keys, no
 * handler.  Any thread. */
void epd_http_config_init(epd_http_config_t *config);

/* Binds and listens on config->host:port on `loop` (borrowed; it must
 * outlive the server's handles).  On success *server_p is the caller's, to
 * destroy with epd_http_server_destroy.  EPD_ERR_INVALID_PARAM for a bad
 * config, EPD_ERR_BAD_ADDRESS for an unparsable host, EPD_ERR_EXISTS when
 * the address is in use, EPD_ERR_IO for another bind/listen failure,
 * EPD_ERR_NO_MEMORY.  Loop thread. */
epd_status_t epd_http_server_create(uv_loop_t *loop, const epd_http_config_t *config,
                                    epd_http_server_t **server_p);

/* The port actually bound (the ephemeral one when config->port was 0).
 * Loop thread. */
uint16_t epd_http_server_port(const epd_http_server_t *server);

/* Live connections (accepted, not yet closed, not counting those refused at
 * accept; counting those past the per-address cap waiting for their head).
 * Loop thread. */
unsigned epd_http_server_connections(const epd_http_server_t *server);

/* What the server refused and holds (counters since create). */
typedef struct {
    uint64_t accepted;            /* connections taken (counted against the caps) */
    uint64_t refused_max_conns;   /* 503: beyond max_connections */
    uint64_t refused_per_addr;    /* 429: beyond max_connections_per_addr */
    uint64_t refused_body_budget; /* 503: beyond max_buffered_body_bytes */
    uint64_t refused_body_size;   /* 413: a body over the body limit */
    uint64_t refused_header_size; /* 431: header bytes or count */
    uint64_t refused_version;     /* 505: not HTTP/1.0 or HTTP/1.1 */
    uint64_t refused_encoding;    /* 501: a Transfer-Encoding other than chunked */
    uint64_t refused_host;        /* 400: no Host header (HTTP/1.1), or two */
    uint64_t refused_malformed;   /* 400: HTTP the parser refuses */
    uint64_t auth_failures;       /* 401: no key, or not one of the keys */
    uint64_t header_timeouts;     /* closed or 408 before its headers were complete */
    size_t buffered_body_bytes;   /* now: bodies held, counted against the budget */
    unsigned connections;         /* now: as epd_http_server_connections */
} epd_http_stats_t;

/* Fills *stats_p (caller's storage).  Loop thread. */
void epd_http_server_stats(const epd_http_server_t *server, epd_http_stats_t *stats_p);

/* Stops listening and closes every connection; the abort callback of each
 * request the application still holds fires from the loop afterwards (a
 * request without one stays valid until the application finishes it).
 * Memory is released by close callbacks: the caller must run the loop
 * until it returns (every handle closed) before closing the loop; the
 * last of them calls config->closed.  No handler is called after this.
 * NULL is a no-op.  Loop thread. */
void epd_http_server_destroy(epd_http_server_t *server);

/* Request accessors.  Every pointer returned is owned by `req` and valid
 * until the request is finished.  Loop thread. */
const char *epd_http_req_method(const epd_http_req_t *req); /* "GET", "POST", ... */
const char *epd_http_req_path(const epd_http_req_t *req);   /* the request target as sent */
/* The value of the first header named `name` (case-insensitive), NUL
 * terminated, or NULL when absent. */
const char *epd_http_req_header(const epd_http_req_t *req, const char *name);
/* The body (chunked bodies de-chunked), NUL terminated for convenience;
 * *len_p gets its length (0 when there is none). */
const char *epd_http_req_body(const epd_http_req_t *req, size_t *len_p);

/* Registers `cb` (with `arg`) to hear that the client of `req` is gone;
 * replaces an earlier one; cb NULL removes it.  Without one, a request
 * whose client is gone stays valid (detached) until the application
 * finishes it, and the finishing call returns EPD_ERR_CONNECTION_RESET.
 * Loop thread. */
void epd_http_req_set_abort(epd_http_req_t *req, epd_http_abort_cb_t cb, void *arg);

/* Answers `req` with a full response and finishes it (req is invalid on
 * return, whatever the status); to a HEAD request only the headers go out.  `content_type` and
 * `body[0..len)` are borrowed during the call (copied).  `status` is 100 < status < 600 (an
 * out-of-range one becomes 500).  The connection stays open for the next
 * request when the client allows keep-alive.  EPD_OK (queued; written by
 * the loop), EPD_ERR_CONNECTION_RESET (the client is gone; nothing sent),
 * EPD_ERR_NO_MEMORY or EPD_ERR_TOO_LONG (a body of 1 GiB or more): the
 * connection is closed.  Loop thread. */
epd_status_t epd_http_respond(epd_http_req_t *req, int status, const char *content_type,
                              const void *body, size_t len);

/* epd_http_respond with extra header lines: `headers` (borrowed; NULL:
 * none) is zero or more complete lines, each "Name: value\r\n", made by
 * the application (e.g. "Retry-After: 1\r\n"), at most 200 bytes (longer:
 * left out). */
epd_status_t epd_http_respond_ex(epd_http_req_t *req, int status, const char *content_type,
                                 const char *headers, const void *body, size_t len);

/* Starts a streaming (SSE) answer to `req` with HTTP status `status`
 * (normally 200).  Afterwards only epd_http_stream_send and
 * epd_http_stream_end may be used on `req`.  EPD_OK, EPD_ERR_INVALID_PARAM
 * (already answered), EPD_ERR_CONNECTION_RESET (client gone: req stays
 * valid until finished), EPD_ERR_NO_MEMORY (the connection is closed).
 * Loop thread. */
epd_status_t epd_http_stream_start(epd_http_req_t *req, int status);

/* epd_http_stream_start with extra header lines (as epd_http_respond_ex). */
epd_status_t epd_http_stream_start_ex(epd_http_req_t *req, int status, const char *headers);

/* Sends data[0..len) (borrowed during the call; copied) as one chunk of the
 * stream; len 0 sends nothing.  EPD_OK (queued), EPD_ERR_CONNECTION_RESET
 * when the client is gone or when this data would take the unsent backlog
 * past max_stream_backlog (the connection is then closed and the abort
 * callback fires from the loop), EPD_ERR_INVALID_PARAM when no stream was
 * started, EPD_ERR_NO_MEMORY or EPD_ERR_TOO_LONG (1 GiB or more): the
 * connection is closed.  Loop thread. */
epd_status_t epd_http_stream_send(epd_http_req_t *req, const void *data, size_t len);

/* Ends the stream (the terminating chunk) and finishes `req` (invalid on
 * return, whatever the status).  EPD_OK, EPD_ERR_CONNECTION_RESET (the
 * client was gone), EPD_ERR_INVALID_PARAM (no stream was started: the
 * request is then answered 500 so it is still finished), EPD_ERR_NO_MEMORY.
 * Loop thread. */
epd_status_t epd_http_stream_end(epd_http_req_t *req);

/* The reason phrase of an HTTP status ("Not Found"); "Unknown" otherwise.
 * Any thread. */
const char *epd_http_status_text(int status);

/* ---- keys (epd_http_auth.c) ----
 *
 * A set of API keys, held as BLAKE2b-256 digests only: a presented key is
 * hashed and compared with every stored digest by sodium_memcmp, each
 * comparison made whatever the others gave, so neither a key's bytes nor
 * its length shape the time a check takes (the number of keys does).
 * Created once at start-up, then read-only: any thread may check. */

/* An empty set; *keys_p is the caller's (epd_http_keys_destroy).
 * EPD_ERR_NO_MEMORY. */
epd_status_t epd_http_keys_create(epd_http_keys_t **keys_p);

/* Adds key[0..len) (borrowed; only its digest is kept).  EPD_ERR_INVALID_PARAM
 * for an empty key or one holding a byte outside visible ASCII (space,
 * control characters and non-ASCII cannot travel in a Bearer token),
 * EPD_ERR_NO_MEMORY. */
epd_status_t epd_http_keys_add(epd_http_keys_t *keys, const char *key, size_t len);

/* Reads a key file: one key a line, surrounding blanks dropped, blank
 * lines and lines starting with '#' ignored.  Warns (once, in the log)
 * when the file is readable by its group or others.  EPD_OK: *keys_p is
 * the caller's.  Otherwise why[0..why_cap) says what is wrong (nothing is
 * logged): EPD_ERR_NOT_FOUND / EPD_ERR_IO (cannot open or read it),
 * EPD_ERR_TOO_LONG (over 1 MiB), EPD_ERR_INVALID_PARAM (a bad key, or no
 * key at all), EPD_ERR_NO_MEMORY.  Blocking file I/O: start-up only. */
epd_status_t epd_http_keys_load(const char *path, epd_http_keys_t **keys_p, char *why,
                                size_t why_cap);

/* Keys in the set. */
size_t epd_http_keys_count(const epd_http_keys_t *keys);

/* 1 when `authorization` (an Authorization header value, NUL terminated;
 * NULL when absent) is "Bearer KEY" (the scheme case-insensitive) with
 * KEY one of the set's keys; 0 otherwise.  Constant time in the key
 * (above).  Any thread. */
int epd_http_keys_check(const epd_http_keys_t *keys, const char *authorization);

/* NULL is a no-op. */
void epd_http_keys_destroy(epd_http_keys_t *keys);

/* ---- trusted proxies (epd_http_proxy.c) ----
 *
 * Addresses below are 16 bytes in network order: an IPv6 address, or an
 * IPv4 one as ::ffff:a.b.c.d.  A set is created once at start-up, then
 * read-only: any thread may read it. */

/* Parses "CIDR[,CIDR...]" (blanks around entries allowed): IPv4 or IPv6
 * blocks ADDR/BITS, or a single ADDR.  EPD_OK: *proxies_p is the caller's
 * (epd_http_proxies_destroy).  Otherwise why[0..why_cap) says which entry
 * is wrong and how (not an address, a prefix length out of range, bits
 * set past the prefix, an empty entry): EPD_ERR_INVALID_PARAM, or
 * EPD_ERR_NO_MEMORY. */
epd_status_t epd_http_proxies_parse(const char *list, epd_http_proxies_t **proxies_p, char *why,
                                    size_t why_cap);

/* Blocks in the set (0 for NULL). */
size_t epd_http_proxies_count(const epd_http_proxies_t *proxies);

/* 1 when addr[16] is in one of the set's blocks (0 for a NULL set). */
int epd_http_proxies_match(const epd_http_proxies_t *proxies, const unsigned char addr[16]);

/* The client address of a request from `peer` (16 bytes) that carried the
 * X-Forwarded-For values[0..n) (borrowed, in the order the headers came):
 * when peer is not in `proxies`, peer itself (the header is the client's
 * own claim).  Otherwise the entries are read from the right (the last
 * header's last entry first): each one a trusted proxy is passed over, and
 * the first that is not is the client; when every entry is trusted, the
 * left-most; when the list is empty, peer; an entry that is not an address
 * stops the walk and the last address reached (a trusted proxy's) is the
 * client.  This is nginx's real_ip_recursive.  Written to addr_p[16]. */
void epd_http_forwarded_addr(const epd_http_proxies_t *proxies, const unsigned char peer[16],
                             const char *const *values, size_t n, unsigned char addr_p[16]);

/* NULL is a no-op. */
void epd_http_proxies_destroy(epd_http_proxies_t *proxies);

#endif
