/*
 * epd_metrics_http.h — a worker daemon's own /metrics (--metrics-addr): a
 * tiny HTTP/1.x listener on the daemon's loop that answers
 * `GET /metrics` (and HEAD) with the Prometheus text a render callback
 * writes, 404 for another path, 405 for another method, then closes.
 *
 * Why not api/epd_http: it lives above daemon/ (tests/tree/test_layers.sh
 * and the Makefile's include paths forbid the upward use), and a scrape
 * needs none of its keep-alive, bodies, API keys or OpenAI routes.  What it
 * keeps of its defences: at most EPD_METRICS_HTTP_CONNS connections (a new
 * one beyond closes the oldest), a request head of at most EPD_METRICS_HTTP_HEAD
 * bytes, and EPD_METRICS_HTTP_DEADLINE_MS for the whole exchange (a client
 * that sends slowly or reads slowly is cut off): an idle socket holds a
 * slot for seconds, never forever.
 *
 * Threads: the loop thread only (render runs there).
 */
#ifndef EPD_METRICS_HTTP_H
#define EPD_METRICS_HTTP_H

#include <stdint.h>
#include <uv.h>

#include "epd_prom.h"
#include "epd_status.h"

#define EPD_METRICS_HTTP_CONNS 32
#define EPD_METRICS_HTTP_HEAD 4096
#define EPD_METRICS_HTTP_DEADLINE_MS 10000

typedef struct epd_metrics_http epd_metrics_http_t;

/* Appends the whole exposition to `out` (loop thread). */
typedef void (*epd_metrics_render_cb_t)(void *arg, epd_prom_text_t *out);

/*
 * Listens on `bind` (numeric "HOST:PORT" or "[HOST]:PORT"; port 0:
 * ephemeral) on `loop`.  *srv_p owned by the caller: epd_metrics_http_stop.
 * EPD_OK; EPD_ERR_EXISTS (port in use), EPD_ERR_IO, EPD_ERR_INVALID_PARAM or
 * EPD_ERR_NO_MEMORY (logged under `log`).
 */
epd_status_t epd_metrics_http_start(uv_loop_t *loop, const char *bind, const char *log,
                                    epd_metrics_render_cb_t render, void *arg,
                                    epd_metrics_http_t **srv_p);

/* What a request head asks for (epd_metrics_http_route). */
typedef enum {
    EPD_METRICS_ROUTE_GET = 0,   /* GET /metrics[?...] */
    EPD_METRICS_ROUTE_HEAD,      /* HEAD /metrics[?...] */
    EPD_METRICS_ROUTE_BAD,       /* no "METHOD SP PATH SP HTTP/1.x" request line: 400 */
    EPD_METRICS_ROUTE_NOT_FOUND, /* another path: 404 */
    EPD_METRICS_ROUTE_METHOD,    /* another method: 405 */
} epd_metrics_route_t;

/* The offset just past the empty line ending a request head in
 * buf[0..len) (CRLF CRLF, or LF LF), looking at line ends from `from` on
 * (from = where the previous look stopped, less 3), or 0 when there is
 * none yet.  Pure: reads buf[0..len) only. */
size_t epd_metrics_http_head_end(const char *buf, size_t from, size_t len);

/* The route of the request head head[0..len) (its request line).  Pure. */
epd_metrics_route_t epd_metrics_http_route(const char *head, size_t len);

/* The bound port. */
uint16_t epd_metrics_http_port(const epd_metrics_http_t *srv);

/* Scrapes answered 200 since start. */
uint64_t epd_metrics_http_scrapes(const epd_metrics_http_t *srv);

/* Closes the listener and every connection; the memory goes once the loop
 * ran their close callbacks.  NULL: no-op. */
void epd_metrics_http_stop(epd_metrics_http_t *srv);

#endif
