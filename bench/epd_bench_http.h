/*
 * epd_bench_http.h — the blocking HTTP/1.1 client of epd-bench: one
 * request on a connection of its own (Connection: close), the whole
 * exchange (name lookup, connect, send, every read) under one deadline.
 * What the subcommands use to read a router's /metrics before and after a
 * run, and to send one completion at a time where the request itself is
 * what is timed (fleet).  The load generators' own paths (serve's libuv
 * SSE driver, burst's barrier, soak's aborts) stay theirs: they need
 * control between connect, send and read that one call cannot give.
 *
 * Any thread; no state between calls; nothing outlives a call but the
 * buffers it hands over.
 */
#ifndef EPD_BENCH_HTTP_H
#define EPD_BENCH_HTTP_H

#include <stddef.h>
#include <stdint.h>

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

#endif
