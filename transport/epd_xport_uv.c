/*
 * epd_xport_uv.c — libuv driver of an epd_xport_t (see the header for the
 * scheme).  The five handles share one struct; it is freed when the last of
 * them has been closed.
 *
 * Spinning is bounded.  A library that keeps answering "busy" while
 * progress finds nothing to do would turn the loop into a poller for as
 * long as that lasts — for ever after a UCX shared-memory peer died with
 * its receive FIFO full (epd__ucx_arm says why): a router SIGKILLed
 * mid-stream left every worker that had sent to it, an idle encoder too,
 * at a full core until restarted.  So after EPD_XPORT_UV_SPIN_PASSES idle
 * passes in a row that found nothing, the loop polls on a back-off timer
 * instead (1 ms doubling up to EPD_XPORT_UV_BACKOFF_MAX_MS) and sleeps in between,
 * the fd unwatched; progress that does work goes back to spinning (and
 * watching the fd) at once.  Each back-off
 * since the library last armed halves the next spin (down to 1/64): a
 * library stuck busy is polled, not spun on after every arrival.
 */
#include "epd_xport_uv.h"

#include <stdint.h>

#include "epd_alloc.h"
#include "epd_log.h"

/* Progress calls per loop callback: bounded work per event. */
#define EPD_XPORT_UV_BATCHES 32
/* Arm attempts (each after a progress) before the loop polls instead of
 * sleeping (see epd_xport_uv_on_prepare). */
#define EPD_XPORT_UV_ARM_TRIES 16
/* Poll period where the provider has no fd to sleep on. */
#define EPD_XPORT_UV_NOFD_MS 1
/* Busy idle passes in a row that found nothing before the loop backs off
 * (about a millisecond of spinning: a FIFO that a live peer is draining
 * frees room well within it) ... */
#define EPD_XPORT_UV_SPIN_PASSES 1024u
/* ... and the longest back-off between polls then (from 1 ms, doubling
 * while polls find nothing): the most a send waiting for room may lag
 * once the peer makes room, or an arrival while the library refuses to
 * arm its fd — only after that long without any, since a poll that finds
 * work starts over.  Idle and stuck, ~60 polls a second. */
#define EPD_XPORT_UV_BACKOFF_MAX_MS 16

struct epd_xport_uv {
    epd_xport_t *x;
    uv_poll_t poll;
    uv_prepare_t prepare;
    uv_idle_t idle;
    uv_timer_t timer;
    uv_timer_t backoff; /* one-shot: the next poll while backing off */
    int has_fd;
    int open_handles;
    int worked;          /* a progress did work since the last prepare */
    uint32_t empty_run;  /* busy idle passes in a row that found nothing */
    uint32_t stuck;      /* back-offs since the library last armed */
    uint32_t backoff_ms; /* 0: not backing off (spinning or asleep) */
    uint64_t armed;     /* loop passes that could sleep on the fd */
    uint64_t busy;      /* ... that found the library busy after EPD_XPORT_UV_ARM_TRIES */
    uint64_t busy_idle; /* busy passes whose progress then found nothing: a spin */
    uint64_t backoffs;  /* times the spin was cut short by the back-off */
    uint64_t backoff_polls; /* polls on the back-off timer */
};

/* Progresses in bounded batches; returns the events handled. */
static int epd_xport_uv_drain(epd_xport_uv_t *uv)
{
    int n = 0;

    for (int i = 0; i < EPD_XPORT_UV_BATCHES; i++) {
        int k = epd_xport_progress(uv->x);

        n += k;
        if (k == 0) {
            break;
        }
    }
    return n;
}

static void epd_xport_uv_on_backoff(uv_timer_t *handle);
static void epd_xport_uv_on_poll(uv_poll_t *handle, int status, int events);

/* Leaves the back-off (the library armed, or work came): the loop spins
 * or sleeps as the next prepare decides. */
static void epd_xport_uv_backoff_end(epd_xport_uv_t *uv)
{
    if (uv->backoff_ms != 0) {
        uv_timer_stop(&uv->backoff);
        uv->backoff_ms = 0;
        uv_poll_start(&uv->poll, UV_READABLE, epd_xport_uv_on_poll);
    }
    uv->empty_run = 0;
}

static void epd_xport_uv_on_poll(uv_poll_t *handle, int status, int events)
{
    epd_xport_uv_t *uv = handle->data;

    (void)status;
    (void)events;
    if (epd_xport_uv_drain(uv) > 0) {
        uv->worked = 1; /* events came: ends a back-off */
    }
}

static void epd_xport_uv_on_idle(uv_idle_t *handle)
{
    epd_xport_uv_t *uv = handle->data;

    if (epd_xport_uv_drain(uv) > 0) {
        uv->empty_run = 0;
        return;
    }
    uv->busy_idle++;
    if (++uv->empty_run >= (EPD_XPORT_UV_SPIN_PASSES >> (uv->stuck < 6u ? uv->stuck : 6u))) {
        /* busy for nothing this long: poll on a timer, sleep between —
         * not on the fd: a library that refuses to arm may leave it
         * readable (UCX's shared-memory wake-up socket is read only by an
         * arm that gets that far), and a level-triggered poll would wake
         * the loop at once, every pass (3.8 M passes in 5 s, 70% of a
         * core, in test_router_kill_ucx_shm before this) */
        uv_idle_stop(&uv->idle);
        uv_poll_stop(&uv->poll);
        uv->backoffs++;
        uv->stuck++;
        uv->backoff_ms = 1;
        uv_timer_start(&uv->backoff, epd_xport_uv_on_backoff, uv->backoff_ms, 0);
    }
}

static void epd_xport_uv_on_backoff(uv_timer_t *handle)
{
    epd_xport_uv_t *uv = handle->data;

    uv->backoff_polls++;
    if (epd_xport_uv_drain(uv) > 0) {
        epd_xport_uv_backoff_end(uv); /* the next prepare spins again */
        return;
    }
    uv->backoff_ms = uv->backoff_ms * 2 > EPD_XPORT_UV_BACKOFF_MAX_MS ? EPD_XPORT_UV_BACKOFF_MAX_MS
                                                                      : uv->backoff_ms * 2;
    uv_timer_start(&uv->backoff, epd_xport_uv_on_backoff, uv->backoff_ms, 0);
}

/* The tick: what it progresses (keepalives, timeouts) does not end a
 * back-off, or a dead peer's keepalive schedule would restart the spin. */
static void epd_xport_uv_on_timer(uv_timer_t *handle)
{
    epd_xport_uv_drain(handle->data);
}

/* Just before the loop would block: sleep only when the library agrees. */
static void epd_xport_uv_on_prepare(uv_prepare_t *handle)
{
    epd_xport_uv_t *uv = handle->data;

    if (epd_xport_uv_drain(uv) > 0) {
        uv->worked = 1;
    }
    if (!uv->has_fd) {
        return;
    }
    /* "busy" mostly means an event came in between the last progress and
     * the arm, or that the library still had wake-up signals queued (UCX
     * shared memory consumes one per arm): progress and arm again, a few
     * times, rather than turning the whole loop into a poller (uv_idle) at
     * the first refusal.  Measured with epd-bench overhead (dense-70b,
     * ucx-shm, 1k tokens): prefill's loop polled 4204 passes for nothing
     * with one try, 149 with 16 (the log line at stop counts them).
     * Backing off, or since the library last stayed busy for nothing that
     * long (uv->stuck), one try: each try costs it a few syscalls, and a
     * pass of the spin runs this too (16 tries a pass were most of a stuck
     * worker's CPU under ASan). */
    for (int i = 0; i < (uv->backoff_ms != 0 || uv->stuck != 0 ? 1 : EPD_XPORT_UV_ARM_TRIES);
         i++) {
        if (epd_xport_arm(uv->x) == EPD_OK) {
            uv->armed++;
            uv->worked = 0;
            uv->stuck = 0;
            uv_idle_stop(&uv->idle);
            epd_xport_uv_backoff_end(uv);
            return;
        }
        if (epd_xport_uv_drain(uv) > 0) {
            uv->worked = 1;
        }
    }
    uv->busy++;
    if (uv->worked) {
        epd_xport_uv_backoff_end(uv); /* work came (through the fd, or found here): spin again */
    }
    uv->worked = 0;
    if (uv->backoff_ms == 0) {
        uv_idle_start(&uv->idle, epd_xport_uv_on_idle);
    }
    /* else: backing off, the timer (or the fd) wakes the loop */
}

static void epd_xport_uv_on_closed(uv_handle_t *handle)
{
    epd_xport_uv_t *uv = handle->data;

    if (--uv->open_handles == 0) {
        epd_free(uv);
    }
}

epd_status_t epd_xport_uv_start(uv_loop_t *loop, epd_xport_t *x, uint32_t tick_ms,
                                epd_xport_uv_t **uv_p)
{
    epd_xport_uv_t *uv = epd_calloc(1, sizeof(*uv));
    int fd = -1;

    if (uv == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    uv->x = x;
    uv->has_fd = epd_xport_get_fd(x, &fd) == EPD_OK;
    /* These inits cannot fail for a valid loop, except uv_poll_init on a bad
     * fd, which is checked. */
    uv_prepare_init(loop, &uv->prepare);
    uv_idle_init(loop, &uv->idle);
    uv_timer_init(loop, &uv->timer);
    uv_timer_init(loop, &uv->backoff);
    uv->prepare.data = uv;
    uv->idle.data = uv;
    uv->timer.data = uv;
    uv->backoff.data = uv;
    uv->open_handles = 4;
    if (uv->has_fd) {
        if (uv_poll_init(loop, &uv->poll, fd) != 0) {
            epd_log_error("xport", 0, "cannot watch the transport fd %d with libuv", fd);
            epd_xport_uv_stop(uv);
            return EPD_ERR_FATAL;
        }
        uv->poll.data = uv;
        uv->open_handles++;
        uv_poll_start(&uv->poll, UV_READABLE, epd_xport_uv_on_poll);
        uv_timer_start(&uv->timer, epd_xport_uv_on_timer, tick_ms, tick_ms);
    } else {
        epd_log_info("xport", 0, "transport has no wait fd: polling every %d ms",
                     EPD_XPORT_UV_NOFD_MS);
        uv_timer_start(&uv->timer, epd_xport_uv_on_timer, EPD_XPORT_UV_NOFD_MS,
                       EPD_XPORT_UV_NOFD_MS);
    }
    uv_prepare_start(&uv->prepare, epd_xport_uv_on_prepare);
    *uv_p = uv;
    return EPD_OK;
}

void epd_xport_uv_stop(epd_xport_uv_t *uv)
{
    if (uv == NULL) {
        return;
    }
    epd_log_info("xport", 0,
                 "transport driver: %llu loop passes slept on the library's fd, %llu polled on "
                 "(busy), %llu of which found nothing to do; backed off %llu times (%llu polls "
                 "on the back-off timer)",
                 (unsigned long long)uv->armed, (unsigned long long)uv->busy,
                 (unsigned long long)uv->busy_idle, (unsigned long long)uv->backoffs,
                 (unsigned long long)uv->backoff_polls);
    uv_close((uv_handle_t *)&uv->prepare, epd_xport_uv_on_closed);
    uv_close((uv_handle_t *)&uv->idle, epd_xport_uv_on_closed);
    uv_close((uv_handle_t *)&uv->timer, epd_xport_uv_on_closed);
    uv_close((uv_handle_t *)&uv->backoff, epd_xport_uv_on_closed);
    if (uv->open_handles == 5) {
        uv_close((uv_handle_t *)&uv->poll, epd_xport_uv_on_closed);
    }
}
