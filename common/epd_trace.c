/*
 * epd_trace.c — lock-free bounded trace buffer and Chrome trace JSON writer.
 *
 * A slot is claimed with one atomic fetch_add on `next`; the writer fills it
 * and then publishes it by storing `ready` with release order, so the JSON
 * writer (acquire) never reads a half-written event.  Names are pointers to
 * static strings, so an event is 64 bytes of plain data and recording costs
 * no allocation and no formatting.
 */
#include "epd_trace.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "epd_alloc.h"

#define EPD_TRACE_MAX_THREADS 64

typedef struct {
    atomic_int ready;
    char phase; /* 'X' span, 'i' instant */
    int32_t layer;
    uint32_t tid;
    const char *name;
    const char *cat;
    uint64_t req_id;
    uint64_t ts_ns;
    uint64_t dur_ns;
} epd_trace_event_t;

typedef struct {
    atomic_uint tid;
    const char *name;
} epd_trace_thread_t;

struct epd_trace {
    epd_trace_event_t *events; /* [capacity] */
    size_t capacity;
    atomic_size_t next;
    atomic_uint_fast64_t dropped;
    char *process_name;
    uint32_t pid;
    atomic_uint n_threads;
    epd_trace_thread_t threads[EPD_TRACE_MAX_THREADS];
};

static uint32_t epd_trace_tid(void)
{
    return (uint32_t)syscall(SYS_gettid);
}

epd_status_t epd_trace_create(size_t capacity, const char *process_name, epd_trace_t **trace_p)
{
    epd_trace_t *t;

    if (capacity == 0 || process_name == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    t = epd_calloc(1, sizeof(*t));
    if (t == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    t->events = epd_calloc(capacity, sizeof(*t->events));
    t->process_name = epd_strdup(process_name);
    if (t->events == NULL || t->process_name == NULL) {
        epd_free(t->events);
        epd_free(t->process_name);
        epd_free(t);
        return EPD_ERR_NO_MEMORY;
    }
    t->capacity = capacity;
    t->pid = (uint32_t)getpid();
    *trace_p = t;
    return EPD_OK;
}

void epd_trace_destroy(epd_trace_t *t)
{
    if (t == NULL) {
        return;
    }
    epd_free(t->events);
    epd_free(t->process_name);
    epd_free(t);
}

void epd_trace_thread_name(epd_trace_t *t, const char *name)
{
    unsigned i;

    if (t == NULL) {
        return;
    }
    i = atomic_fetch_add(&t->n_threads, 1);
    if (i >= EPD_TRACE_MAX_THREADS) {
        atomic_fetch_sub(&t->n_threads, 1);
        return;
    }
    t->threads[i].name = name;
    atomic_store_explicit(&t->threads[i].tid, epd_trace_tid(), memory_order_release);
}

static void epd_trace_record(epd_trace_t *t, char phase, const char *name, const char *cat,
                             uint64_t req_id, int32_t layer, uint64_t ts_ns, uint64_t dur_ns)
{
    size_t i;
    epd_trace_event_t *e;

    if (t == NULL) {
        return;
    }
    i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
    if (i >= t->capacity) {
        atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed);
        return;
    }
    e = &t->events[i];
    e->phase = phase;
    e->layer = layer;
    e->tid = epd_trace_tid();
    e->name = name;
    e->cat = cat;
    e->req_id = req_id;
    e->ts_ns = ts_ns;
    e->dur_ns = dur_ns;
    atomic_store_explicit(&e->ready, 1, memory_order_release);
}

void epd_trace_span(epd_trace_t *t, const char *name, const char *cat, uint64_t req_id,
                    int32_t layer, uint64_t start_ns, uint64_t end_ns)
{
    epd_trace_record(t, 'X', name, cat, req_id, layer, start_ns,
                     end_ns > start_ns ? end_ns - start_ns : 0);
}

void epd_trace_instant(epd_trace_t *t, const char *name, const char *cat, uint64_t req_id,
                       int32_t layer, uint64_t ts_ns)
{
    epd_trace_record(t, 'i', name, cat, req_id, layer, ts_ns, 0);
}

void epd_trace_counts(const epd_trace_t *t, uint64_t *recorded_p, uint64_t *dropped_p)
{
    size_t next = atomic_load(&((epd_trace_t *)t)->next);

    *recorded_p = next < t->capacity ? next : t->capacity;
    *dropped_p = atomic_load(&((epd_trace_t *)t)->dropped);
}

size_t epd_trace_read(const epd_trace_t *t, uint64_t *cursor_p, uint64_t req_min, uint64_t req_max,
                      size_t scan, epd_trace_rec_t *out, size_t cap, uint64_t *recorded_p)
{
    size_t next = atomic_load(&((epd_trace_t *)t)->next);
    uint64_t i = *cursor_p;
    size_t n = 0;

    if (next > t->capacity) {
        next = t->capacity;
    }
    for (; i < next && scan > 0 && n < cap; i++, scan--) {
        epd_trace_event_t *e = &t->events[i];

        if (!atomic_load_explicit(&e->ready, memory_order_acquire)) {
            break; /* claimed, not yet published: read it next time */
        }
        if (e->req_id < req_min || e->req_id > req_max) {
            continue;
        }
        out[n].name = e->name;
        out[n].req_id = e->req_id;
        out[n].layer = e->layer;
        out[n].instant = e->phase != 'X';
        out[n].ts_ns = e->ts_ns;
        out[n].dur_ns = e->dur_ns;
        n++;
    }
    *cursor_p = i;
    if (recorded_p != NULL) {
        *recorded_p = next;
    }
    return n;
}

/* Writes a JSON string with the escapes JSON requires. */
static void epd_trace_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;

        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

epd_status_t epd_trace_write_json(epd_trace_t *t, const char *path, uint64_t req_id)
{
    size_t n = atomic_load(&t->next);
    unsigned n_threads = atomic_load(&t->n_threads);
    char tmp[4096];
    int first = 1;
    FILE *f;

    /* written beside the target and renamed over it: a reader (a tool
     * polling for the file after SIGUSR1) never sees half a trace */
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp)) {
        return EPD_ERR_IO;
    }
    f = fopen(tmp, "w");
    if (f == NULL) {
        return EPD_ERR_IO;
    }
    if (n > t->capacity) {
        n = t->capacity;
    }
    fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,\"args\":{\"name\":",
            t->pid);
    epd_trace_json_string(f, t->process_name);
    fprintf(f, "}}");
    first = 0;
    for (unsigned i = 0; i < n_threads && i < EPD_TRACE_MAX_THREADS; i++) {
        unsigned tid = atomic_load_explicit(&t->threads[i].tid, memory_order_acquire);

        if (tid == 0) {
            continue;
        }
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":%u,\"args\":{\"name\":",
                t->pid, tid);
        epd_trace_json_string(f, t->threads[i].name);
        fprintf(f, "}}");
    }
    for (size_t i = 0; i < n; i++) {
        const epd_trace_event_t *e = &t->events[i];

        if (!atomic_load_explicit(&((epd_trace_event_t *)e)->ready, memory_order_acquire)) {
            continue;
        }
        if (req_id != 0 && e->req_id != req_id) {
            continue;
        }
        fprintf(f, "%s\n{\"name\":", first ? "" : ",");
        first = 0;
        epd_trace_json_string(f, e->name);
        fprintf(f, ",\"cat\":");
        epd_trace_json_string(f, e->cat);
        /* Chrome trace timestamps are microseconds; keep ns precision. */
        fprintf(f, ",\"ph\":\"%c\",\"ts\":%llu.%03u,\"pid\":%u,\"tid\":%u", e->phase,
                (unsigned long long)(e->ts_ns / 1000), (unsigned)(e->ts_ns % 1000), t->pid,
                e->tid);
        if (e->phase == 'X') {
            fprintf(f, ",\"dur\":%llu.%03u", (unsigned long long)(e->dur_ns / 1000),
                    (unsigned)(e->dur_ns % 1000));
        } else {
            fprintf(f, ",\"s\":\"t\"");
        }
        fprintf(f, ",\"args\":{\"req\":%llu", (unsigned long long)e->req_id);
        if (e->layer >= 0) {
            fprintf(f, ",\"layer\":%d", e->layer);
        }
        fprintf(f, "}}");
    }
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return EPD_ERR_IO;
    }
    return EPD_OK;
}
