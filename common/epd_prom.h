/*
 * epd_prom.h — Prometheus text exposition (format 0.0.4) for the worker
 * daemons' /metrics (daemon/epd_metrics_http.h serves it).
 *
 * A histogram has fixed upper bounds (one of the EPD_PROM_* sets below), so
 * observing is a short scan and three relaxed atomic additions: no
 * allocation, no lock, no syscall on the path that observes.  Each
 * histogram has ONE writer thread (the loop, or a compute thread); any
 * thread may render it.  A render reads the buckets first and prints
 * _count as their total, so _count always equals the +Inf bucket even
 * while the writer runs (the _sum may then lag by one observation).
 *
 * Label values are escaped (backslash, double quote, newline) as the
 * format asks.
 */
#ifndef EPD_PROM_H
#define EPD_PROM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

#define EPD_PROM_BUCKETS_MAX 24

/* Bound sets (upper bounds, ascending; the +Inf bucket is implicit). */
typedef enum {
    EPD_PROM_SECONDS = 0, /* 100 µs .. 60 s (the router's latency buckets) */
    EPD_PROM_COUNT,       /* 1, 2, 4, .. 2048: batch sizes, blocks */
    EPD_PROM_TOKENS,      /* 16, 64, .. 1M (powers of 4): prompt lengths */
    EPD_PROM_BOUND_SETS
} epd_prom_bounds_t;

typedef struct {
    epd_prom_bounds_t bounds;
    atomic_uint_least64_t counts[EPD_PROM_BUCKETS_MAX + 1]; /* not cumulative; last: +Inf */
    _Atomic double sum;
} epd_prom_histo_t;

/* Zeroes `h` with the bound set `b` (the caller's storage). */
void epd_prom_histo_init(epd_prom_histo_t *h, epd_prom_bounds_t b);

/* Adds one observation (seconds, a count, tokens: the bound set's unit).
 * The histogram's one writer thread only. */
void epd_prom_histo_observe(epd_prom_histo_t *h, double v);

/* The same, with a duration in nanoseconds observed in seconds. */
void epd_prom_histo_observe_ns(epd_prom_histo_t *h, uint64_t ns);

/* A growable text buffer (epd_malloc'ed `data`, NUL terminated once
 * anything was appended; `failed` once an append ran out of memory:
 * the caller answers 500 then). */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
    int failed;
} epd_prom_text_t;

void epd_prom_printf(epd_prom_text_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void epd_prom_text_cleanup(epd_prom_text_t *t);

/* `s` as a label value (escaped, without the quotes). */
void epd_prom_label(epd_prom_text_t *t, const char *s);

/*
 * One metric family's "# HELP" and "# TYPE" lines (type "counter",
 * "gauge" or "histogram"); then its samples with epd_prom_sample or
 * epd_prom_histo.  Names follow the Prometheus rules (the caller's
 * constants); a counter's name ends in _total.
 */
void epd_prom_family(epd_prom_text_t *t, const char *name, const char *type, const char *help);

/* One sample `name{model="MODEL"[,EXTRA]} value`; extra is a preformatted
 * label list (`kind="x"`, escaped by the caller) or NULL. */
void epd_prom_sample(epd_prom_text_t *t, const char *name, const char *model, const char *extra,
                     double value);

/* The same with an integer value (counters, exact above 2^53). */
void epd_prom_sample_u64(epd_prom_text_t *t, const char *name, const char *model, const char *extra,
                         uint64_t value);

/* A histogram's _bucket, _sum and _count samples (after its family). */
void epd_prom_histo(epd_prom_text_t *t, const char *name, const char *model, const char *extra,
                    const epd_prom_histo_t *h);

/* A whole counter family of one sample (family + sample). */
void epd_prom_counter(epd_prom_text_t *t, const char *name, const char *help, const char *model,
                      uint64_t value);

/* A whole gauge family of one sample. */
void epd_prom_gauge(epd_prom_text_t *t, const char *name, const char *help, const char *model,
                    double value);

#endif
