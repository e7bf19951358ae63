/*
 * epd_trace.h — per-request, per-layer traces in Chrome trace JSON (opens in
 * Perfetto, ui.perfetto.dev, or chrome://tracing).
 *
 * Dense feedback: every slowdown must be attributable to a layer, a transfer
 * or a wait.  Daemons record spans (compute of layer L of request R, a write
 * posted → completed, a wait) and instants (message sent/received) into a
 * bounded, preallocated buffer; recording is lock-free and allocation-free
 * (one atomic increment claims a slot), so it can stay on in the compute and
 * transfer paths.  When the buffer is full, further events are counted as
 * dropped, never blocking.  Writing the JSON is file I/O: never on a loop
 * thread's hot path.
 *
 * Timestamps are CLOCK_MONOTONIC (epd_time_now_ns), which all processes of
 * one host share, so traces of a prefill and a decode daemon merged into one
 * file line up.  Each process is a Perfetto "process" (pid), each thread a
 * track named by epd_trace_thread_name.
 */
#ifndef EPD_TRACE_H
#define EPD_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

typedef struct epd_trace epd_trace_t;

/* Creates a recorder for at most `capacity` events, named `process_name`
 * (copied) in the viewer.  Owned by the caller (epd_trace_destroy). */
epd_status_t epd_trace_create(size_t capacity, const char *process_name, epd_trace_t **trace_p);

/* Frees the recorder; no thread may record concurrently.  NULL is a no-op. */
void epd_trace_destroy(epd_trace_t *trace);

/* Names the calling thread's track ("loop", "compute").  `name` must be a
 * static string.  Any thread; at most 64 threads are named. */
void epd_trace_thread_name(epd_trace_t *trace, const char *name);

/* Records a span [start_ns, end_ns).  `name` and `cat` must be static
 * strings.  req_id 0 and layer -1 mean "none".  Any thread, lock-free.
 * trace may be NULL (tracing off): then nothing happens. */
void epd_trace_span(epd_trace_t *trace, const char *name, const char *cat, uint64_t req_id,
                    int32_t layer, uint64_t start_ns, uint64_t end_ns);

/* Records an instant event at ts_ns (same rules as epd_trace_span). */
void epd_trace_instant(epd_trace_t *trace, const char *name, const char *cat, uint64_t req_id,
                       int32_t layer, uint64_t ts_ns);

/* Events recorded and events dropped (buffer full) so far. */
void epd_trace_counts(const epd_trace_t *trace, uint64_t *recorded_p, uint64_t *dropped_p);

/* One recorded event as epd_trace_read copies it (plain data; `name` is
 * the static string the recorder was given). */
typedef struct {
    const char *name;
    uint64_t req_id;
    int32_t layer; /* -1: none */
    int instant;   /* 1: an instant (dur_ns 0), 0: a span */
    uint64_t ts_ns;
    uint64_t dur_ns;
} epd_trace_rec_t;

/*
 * Copies into out[0..cap) the events of requests req_min..req_max found
 * from slot *cursor_p on, looking at `scan` slots at most (bounded work:
 * a loop thread answers a remote fetch with it).  It stops before a slot
 * still being written (a later call reads it) and when out is full;
 * *cursor_p moves past every slot it finished with.  Returns how many it
 * copied; *recorded_p (may be NULL) is the number of slots recorded so far
 * (at most the capacity): reading is done when *cursor_p reaches it.
 * Any thread, concurrently with recording.
 */
size_t epd_trace_read(const epd_trace_t *trace, uint64_t *cursor_p, uint64_t req_min,
                      uint64_t req_max, size_t scan, epd_trace_rec_t *out, size_t cap,
                      uint64_t *recorded_p);

/*
 * Writes every recorded event (only those of request `req_id` when it is
 * not 0) as a Chrome trace JSON object {"traceEvents": [...]} to `path`.
 * Safe while other threads keep recording (events still being written are
 * skipped).  EPD_ERR_IO when the file cannot be written.  Blocking I/O.
 */
epd_status_t epd_trace_write_json(epd_trace_t *trace, const char *path, uint64_t req_id);

#endif
