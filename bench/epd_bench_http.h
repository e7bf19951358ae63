/*
 * epd_bench_http.h — the blocking HTTP/1.1 client of epd-bench: one
 * request on a connection of its own (Connection: close), the whole
 * exchange (name lookup, connect, send, every read) under one deadline.
 * What the subcommands use to read a router's /metrics before and after a
 * run, and to send one completion at a time where the request itself is
 * what is timed (fleet).  Any thread; no state between calls; nothing
 * outlives a call but the buffers it hands over.
 *
 * Below it, epd_bench_sse.c: many streaming requests at once on a libuv
 * loop (serve's router path).  burst's barrier and soak's aborts keep
 * sockets of their own: they need control between connect, send and read
 * that neither gives.
 */
#ifndef EPD_BENCH_HTTP_H
#define EPD_BENCH_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <uv.h>

#include "epd_status.h"

/* One answer.  buf holds the whole response (status line, headers, then
 * the body, de-chunked when it came chunked), NUL-terminated; body points
 * into it (also NUL-terminated).  Owned by the caller:
 * epd_bench_http_resp_cleanup. */
typedef struct {
    int status; /* the status line's code */
    char *buf;
    size_t len;
    char *body;
    size_t body_len;
} epd_bench_http_resp_t;

/* Sends `method path` to `hostport` ("127.0.0.1:8080", "[::1]:80", a name)
 * with `body` (borrowed; NULL: none; sent as application/json with its
 * Content-Length), and reads the answer to its end (Content-Length,
 * the last chunk, or the server's close) within `timeout_ms` of the call.
 * At most `max_bytes` of response.  EPD_OK with *resp_p filled (any
 * status: the caller judges it); EPD_ERR_TIMEOUT, EPD_ERR_UNREACHABLE
 * (lookup or connect failed), EPD_ERR_IO, EPD_ERR_TOO_LONG,
 * EPD_ERR_MALFORMED (no status line, a bad chunk), EPD_ERR_NO_MEMORY,
 * EPD_ERR_INVALID_PARAM (a bad hostport); *resp_p is written only on
 * success. */
epd_status_t epd_bench_http_request(const char *hostport, const char *method, const char *path,
                                    const char *body, size_t body_len, uint32_t timeout_ms,
                                    size_t max_bytes, epd_bench_http_resp_t *resp_p);

/* Frees what resp holds and zeroes it; a zeroed resp is a no-op. */
void epd_bench_http_resp_cleanup(epd_bench_http_resp_t *resp);

/* GET `path` from `hostport` within `timeout_ms` (at most 16 MiB): the
 * body of a 200 answer, NUL-terminated, into *body_p (taken by the caller:
 * epd_free) and its length into *len_p (may be NULL).  Another status is
 * EPD_ERR_NOT_FOUND (404) or EPD_ERR_IO; other errors as
 * epd_bench_http_request.  Outputs written only on success. */
epd_status_t epd_bench_http_get(const char *hostport, const char *path, uint32_t timeout_ms,
                                char **body_p, size_t *len_p);

/* ---- epd_bench_sse.c: streaming requests on a libuv loop ---- */

/* Requests to one address over kept-alive connections: a request takes an
 * idle one or opens another (unbounded: the caller bounds what it has in
 * flight), its answer is parsed as it arrives and each SSE `data:` event
 * handed over at once.  One thread: the loop's; every callback runs on it. */
typedef struct epd_bench_sse epd_bench_sse_t;

/* How one request ended. */
typedef struct {
    int status;        /* HTTP status; 0 with `lost` */
    int saw_done;      /* a `data: [DONE]` event came */
    const char *error; /* the data of the stream's `{"error"...}` event, or NULL */
    const char *body;  /* status != 200: the answer's body, or NULL */
    const char *lost;  /* no whole answer: "connection lost", "bad HTTP response",
                        * "out of memory"; NULL otherwise */
} epd_bench_sse_end_t;

/* Pointers in the arguments are borrowed for the call.  A callback may
 * call epd_bench_sse_start and epd_bench_sse_close_all. */
typedef struct {
    /* request `user`'s bytes go to the socket now (after the connect, when
     * it needed a new connection); may be NULL */
    void (*on_send)(void *arg, void *user, uint64_t now);
    /* one `data:` payload of request `user`'s stream (NUL-terminated),
     * other than [DONE] and an error event; `now`: when its bytes came */
    void (*on_data)(void *arg, void *user, const char *data, uint64_t now);
    /* request `user` ended: once for every request started */
    void (*on_end)(void *arg, void *user, const epd_bench_sse_end_t *end, uint64_t now);
    /* a connection closed (the server's close or an error); may be NULL */
    void (*on_close)(void *arg);
    void *arg;
} epd_bench_sse_cbs_t;

/* A client of the server at addr[0..addr_len) on `loop` (borrowed; it
 * must outlive the client).  EPD_OK with *sse_p, EPD_ERR_NO_MEMORY or
 * EPD_ERR_INVALID_PARAM (on_data or on_end NULL). */
epd_status_t epd_bench_sse_create(uv_loop_t *loop, const struct sockaddr *addr, size_t addr_len,
                                  const epd_bench_sse_cbs_t *cbs, epd_bench_sse_t **sse_p);
/* Sends the whole HTTP request req[0..len) (epd_malloc'd; taken) as
 * request `user`; its end comes through on_end (at once when nothing
 * could be sent). */
void epd_bench_sse_start(epd_bench_sse_t *sse, char *req, size_t len, void *user);
/* Closes every connection (a request in flight ends "connection lost");
 * they are freed as the loop runs their close callbacks. */
void epd_bench_sse_close_all(epd_bench_sse_t *sse);
/* Frees the client, once the loop ran the closes of epd_bench_sse_close_all
 * (the loop has no handle of it left); NULL is a no-op. */
void epd_bench_sse_destroy(epd_bench_sse_t *sse);

#endif
