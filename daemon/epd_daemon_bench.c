/*
 * epd_daemon_bench.c — what every daemon answers a benchmark on another
 * host (proto/README.md rule 39): its clock (ClockProbe -> ClockReply) and
 * the events its trace recorder holds (TraceFetch -> TraceEvents).
 *
 * epd-bench overhead --attach-* measures daemons that someone else started
 * on other hosts: it cannot read their trace files, and their clocks are
 * not its own.  Both answers travel on the request plane, so they are
 * authenticated as every other message (the cluster secret's HELLO names
 * both ends).  They are answered at once, on the loop thread, with bounded
 * work: one fetch looks at EPD_DAEMON_BENCH_SCAN trace slots at most and
 * answers with what fits one message; the client fetches again from the
 * cursor it gets back.
 */
#include <stdio.h>

#include "epd_daemon_int.h"
#include "epd_time.h"
#include "epd_trace.h"

/* Trace slots one fetch looks at (64 bytes each: ~4 MB of memory read) */
#define EPD_DAEMON_BENCH_SCAN (64u * 1024u)
/* Events one answer carries at most: ~100 bytes each encoded (a name of
 * up to ~40 characters, six varints), well inside a 64 KiB message */
#define EPD_DAEMON_BENCH_EVENTS 400u
/* What the answer's body may take of the smaller of the two ends' message
 * limits (the client's is 64 KiB): the rest is the frame and envelope */
#define EPD_DAEMON_BENCH_BYTES (48u * 1024u)

static void epd_daemon_bench_clock(epd_daemon_t *d, epd_link_t *from, const Epd__ClockProbe *p)
{
    Epd__ClockReply r = EPD__CLOCK_REPLY__INIT;
    epd_status_t st;

    r.request_id = p->request_id;
    r.monotonic_ns = epd_time_now_ns();
    r.wall_ns = epd_time_wall_ns();
    st = epd_link_send(from, EPD__ENVELOPE__BODY_CLOCK_REPLY, &r, 0);
    if (st != EPD_OK) {
        epd_log_debug(d->log, p->request_id, "ClockReply not sent: %s", epd_status_string(st));
    }
}

static void epd_daemon_bench_trace(epd_daemon_t *d, epd_link_t *from, const Epd__TraceFetch *f)
{
    /* ~43 KB on the loop thread's stack: an answer allocates nothing */
    epd_trace_rec_t recs[EPD_DAEMON_BENCH_EVENTS];
    Epd__TraceEvent evs[EPD_DAEMON_BENCH_EVENTS];
    Epd__TraceEvent *ptrs[EPD_DAEMON_BENCH_EVENTS];
    Epd__TraceEvents r = EPD__TRACE_EVENTS__INIT;
    uint64_t cursor = f->cursor, recorded = 0, dropped = 0;
    size_t limit = d->tx_cap < 64u * 1024u ? d->tx_cap : 64u * 1024u;
    size_t n = 0;
    epd_status_t st;

    limit = limit > EPD_DAEMON_BENCH_BYTES ? EPD_DAEMON_BENCH_BYTES : limit / 2;
    r.request_id = f->request_id;
    r.tracing = d->trace != NULL;
    if (d->trace != NULL) {
        n = epd_trace_read(d->trace, &cursor, f->req_min, f->req_max, EPD_DAEMON_BENCH_SCAN, recs,
                           EPD_DAEMON_BENCH_EVENTS, &recorded);
        epd_trace_counts(d->trace, &recorded, &dropped);
    }
    for (size_t i = 0; i < n; i++) {
        epd__trace_event__init(&evs[i]);
        evs[i].name = (char *)recs[i].name;
        evs[i].req_id = recs[i].req_id;
        evs[i].layer = recs[i].layer;
        evs[i].ts_ns = recs[i].ts_ns;
        evs[i].dur_ns = recs[i].dur_ns;
        evs[i].instant = recs[i].instant != 0;
        ptrs[i] = &evs[i];
    }
    r.events = ptrs;
    r.n_events = n;
    r.next_cursor = cursor;
    /* long names could overflow the message: give back the tail (the
     * client fetches it again from the cursor) */
    while (r.n_events > 0 && epd__trace_events__get_packed_size(&r) > limit) {
        r.n_events /= 2;
    }
    if (r.n_events < n) {
        /* the cursor of the first event not sent: its slot, found again
         * by reading the same range up to it */
        uint64_t c = f->cursor;
        size_t want = r.n_events + 1, got;

        got = epd_trace_read(d->trace, &c, f->req_min, f->req_max, EPD_DAEMON_BENCH_SCAN, recs,
                             want, NULL);
        /* the (n_events+1)-th event is at slot c - 1 */
        r.next_cursor = got == want ? c - 1 : c;
    }
    r.recorded = recorded;
    r.dropped = dropped;
    st = epd_link_send(from, EPD__ENVELOPE__BODY_TRACE_EVENTS, &r, 0);
    if (st != EPD_OK) {
        epd_log_debug(d->log, f->request_id, "TraceEvents not sent: %s", epd_status_string(st));
    }
}

int epd__daemon_bench_on_msg(epd_daemon_t *d, epd_link_t *from, const Epd__Envelope *env)
{
    switch (env->body_case) {
    case EPD__ENVELOPE__BODY_CLOCK_PROBE:
        epd_daemon_bench_clock(d, from, env->clock_probe);
        return 1;
    case EPD__ENVELOPE__BODY_TRACE_FETCH:
        epd_daemon_bench_trace(d, from, env->trace_fetch);
        return 1;
    default:
        return 0;
    }
}
