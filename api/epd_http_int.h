/*
 * epd_http_int.h — the HTTP server's internals, shared by its files (the
 * API and its design are in epd_http.h):
 *
 *   epd_http_conn.c     a connection's core: its writes, its deadline
 *                       timer, closing and finalizing (the abort callback),
 *                       the per-address connection counts and the body
 *                       budget it gives back, the requests it hands out
 *                       and their accessors
 *   epd_http_server.c   the listener, accepting (the connection caps),
 *                       reading and the parser callbacks that turn bytes
 *                       into requests (the key check, the body budget)
 *   epd_http_respond.c  the application's answers: a full response or a
 *                       Server-Sent Events stream
 *   epd_http_auth.c     the API keys (digests) and the Authorization check
 *   epd_http_proxy.c    trusted proxies (CIDR blocks) and the
 *                       X-Forwarded-For rule
 *
 * Calls go one way: epd_http_server.c and epd_http_respond.c call
 * epd_http_conn.c, never each other, and epd_http_conn.c calls neither: it
 * goes back to parsing after an answer is flushed through the `resume`
 * callback the server stores at create.  epd_http_auth.c calls none of
 * them; epd_http_server.c checks keys with it.  epd_http_proxy.c calls none
of them either; epd_http_server.c asks it for a request's client address.
 *
 * A connection moves through these states:
 *
 *   IDLE  waiting for the first byte of a request     timer: idle_timeout
 *         (a new connection: header_timeout from the accept, which the
 *         first request's headers must complete within)
 *   HEAD  request line and headers arriving           timer: header_timeout
 *   BODY  body arriving                               timer: body_timeout
 *   BUSY  the application holds the request           no timer
 *   FLUSH the answer is complete, writes in flight    timer: idle_timeout
 *   LINGER the answer said close and is out: the     timer: EPD_HTTP_LINGER_MS
 *         write side is shut down, input is read      (or idle_timeout when
 *         and dropped until the client's EOF           shorter)
 *
 * and back to IDLE once every write of the answer has completed (or to
 * LINGER, then closed, when the answer said close).  The parser is paused from
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
 *
 * Threads: the loop thread that created the server, only.
 */
#ifndef EPD_HTTP_INT_H
#define EPD_HTTP_INT_H

#include <http_parser.h>

#include "epd_http.h"

#define EPD_HTTP_LOG "http"

typedef enum {
    EPD_HTTP_CONN_IDLE = 0,
    EPD_HTTP_CONN_HEAD,
    EPD_HTTP_CONN_BODY,
    EPD_HTTP_CONN_BUSY,
    EPD_HTTP_CONN_FLUSH,
    EPD_HTTP_CONN_LINGER,
} epd_http_conn_state_t;

typedef struct epd_http_conn epd_http_conn_t;

/* One client address with live connections (count 0: a free slot). */
typedef struct {
    unsigned char key[16];
    uint32_t count;
} epd_http_addr_slot_t;

typedef enum {
    EPD_HTTP_PHASE_URL = 0,
    EPD_HTTP_PHASE_FIELD,
    EPD_HTTP_PHASE_VALUE,
    EPD_HTTP_PHASE_DONE,
} epd_http_hdr_phase_t;

typedef struct {
    size_t name_off;
    size_t val_off;
} epd_http_hdr_t;

struct epd_http_req {
    epd_http_conn_t *conn; /* NULL once detached (client gone) */
    char method[24];
    /* hbuf: URL NUL name NUL value NUL name NUL value NUL ... */
    char *hbuf;
    size_t hlen;
    size_t hcap;
    size_t header_bytes; /* counted against max_header_bytes */
    epd_http_hdr_t hdr[EPD_HTTP_MAX_HEADERS];
    unsigned n_hdr;
    epd_http_hdr_phase_t phase;
    char *body;
    size_t body_len;
    size_t body_cap;
    int http_minor;
    int keep_alive;
    /* Content-Length, or ULLONG_MAX (chunked, or none): the body's buffer
     * never grows past it */
    unsigned long long declared;
    size_t charged; /* body bytes counted in server->body_bytes (0 once given back) */
    int held;       /* handed to the application */
    int streaming;  /* epd_http_stream_start succeeded */
    int chunked;    /* the stream uses chunked encoding */
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
    epd_http_conn_state_t state;
    epd_http_req_t *req; /* being parsed, or held by the application */
    int handles_open;    /* of tcp and timer, until both close callbacks ran */
    int closing;
    int reading;
    int close_after;        /* close once the answer is flushed */
    int refused;            /* refused at accept: beyond max_connections, or a 429 beyond
                             * max_connections_per_addr when EPD_HTTP_OVER_CAP wait */
    int over_cap;           /* beyond max_connections_per_addr: its head gets a 429
                             * (counted in server->over_cap) */
    int trusted;            /* the peer is a trusted proxy: counted per request under
                             * the address X-Forwarded-For names */
    int fresh;              /* no request began yet: the header deadline runs from the accept */
    int counted;            /* addr counted in server->addrs (given back at finalize) */
    int peer_eof;           /* the client's end of the stream was read */
    int linger_counted;     /* a refused one counted in server->lingering_refused */
    size_t linger_bytes;    /* read and dropped while lingering */
    uv_shutdown_t shutdown; /* of the write side, when lingering */
    unsigned char addr[16]; /* the client's address key (epd__http_addr_key) */
    unsigned char peer[16]; /* the peer's address, 16-byte form (epd__http_addr_parse) */
    int has_peer;           /* peer was read */
    int fail_status;        /* set by a parser callback that refuses the request */
    /* with fail_status, what the refusal says (static strings; NULL: by status) */
    const char *fail_message;
    const char *fail_code;
    const char *fail_header;
    size_t nwrites; /* uv_write requests in flight */
    size_t in_off;  /* inbuf[in_off..in_len) not parsed yet */
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
    /* live connections per client address: open addressing, linear
     * probing, SipHash under a random key (a client cannot aim collisions);
     * at most n_live keys in 2 * max_connections slots or more */
    epd_http_addr_slot_t *addrs;
    size_t addrs_mask; /* slots - 1 (a power of two) */
    unsigned char addrs_key[16];
    size_t body_bytes;          /* request bodies buffered now (max_buffered_body_bytes) */
    size_t body_limit;          /* the most body one request may hold (→ 413) */
    char too_large[96];         /* the 413's message, naming body_limit */
    unsigned lingering_refused; /* refused connections lingering (EPD_HTTP_LINGER_REFUSED) */
    unsigned over_cap;          /* over_cap connections open (EPD_HTTP_OVER_CAP) */
    epd_http_stats_t stats;
    uv_tcp_t drop; /* takes a connection off the backlog when out of memory */
    int drop_busy;
    uint16_t port;
    int closing;
    int destroyed; /* by epd_http_server_destroy (not a failed create) */
    int listener_closed;
    /* epd_http_server.c's parser, resumed once an answer is flushed (the
     * one call from the core back up, stored at create) */
    void (*resume)(epd_http_conn_t *conn);
};

typedef struct {
    uv_write_t uv;
    epd_http_conn_t *conn;
    size_t len;
    char data[];
} epd_http_write_t;

/* ---- epd_http_conn.c ---- */

/* (Re)starts the connection's one timer: `ms` from now it fails or closes
 * the connection, by its state (408 while parsing, a silent close
 * otherwise). */
void epd__http_conn_timer(epd_http_conn_t *conn, uint64_t ms);
/* Queues the concatenation of up to three pieces (borrowed; copied) as one
 * write.  EPD_OK; on any failure the connection is closed. */
epd_status_t epd__http_conn_write(epd_http_conn_t *conn, const void *a, size_t alen, const void *b,
                                  size_t blen, const void *c, size_t clen);
/* The answer to the current request has been queued: wait for it to be
 * written (FLUSH), then go on. */
void epd__http_conn_answered(epd_http_conn_t *conn);
/* Answers a request the server refuses itself (an OpenAI-shaped JSON
 * error, `message` borrowed) and closes afterwards. */
void epd__http_conn_fail(epd_http_conn_t *conn, int status, const char *message);
/* The same with the error's `code` (NULL: null) and one more header line
 * `header` ("Name: value" without CRLF; NULL: none), all borrowed. */
void epd__http_conn_refuse(epd_http_conn_t *conn, int status, const char *message, const char *code,
                           const char *header);
/* The 16-byte form of a socket address (IPv4 as ::ffff:a.b.c.d).  0, or
 * -1 for another family. */
int epd__http_addr_full(const struct sockaddr_storage *sa, unsigned char full[16]);
/* The key a 16-byte address is counted under: an IPv4 address as it is,
 * an IPv6 one its /64 (the rest zero). */
void epd__http_addr_key(const unsigned char full[16], unsigned char key[16]);
/* Counts one more live connection of conn->addr: 0 (conn->counted set),
 * or -1 when that address already has max_connections_per_addr. */
int epd__http_addr_acquire(epd_http_server_t *server, epd_http_conn_t *conn);
/* Gives back the count conn->addr holds (when conn->counted). */
void epd__http_addr_release(epd_http_server_t *server, epd_http_conn_t *conn);

/* ---- epd_http_proxy.c ---- */

/* 1 when s[0..len) is an IPv4 or IPv6 literal, written to out[16] in the
 * 16-byte form; 0 otherwise. */
int epd__http_addr_parse(const char *s, size_t len, unsigned char out[16]);
/* Gives back the body bytes `req` holds against the budget (its
 * connection's server must be alive). */
void epd__http_req_uncharge(epd_http_server_t *server, epd_http_req_t *req);
/* Closes both handles; the last close callback finalizes the connection
 * (the held request's abort callback, the server's memory).  Idempotent. */
void epd__http_conn_close(epd_http_conn_t *conn);
/* A request being parsed (owned by its connection until handed out). */
epd_http_req_t *epd__http_req_create(const epd_http_config_t *config);
void epd__http_req_free(epd_http_req_t *req);
/* The application is done with `req`: detached from its connection and
 * freed. */
void epd__http_req_finish(epd_http_req_t *req);
/* Frees a destroyed server once its listener, spare handle and every
 * connection are closed (and tells config.closed). */
void epd__http_server_maybe_free(epd_http_server_t *server);

#endif
