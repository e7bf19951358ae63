/*
 * epd_xport_uv.c — libuv driver of an epd_xport_t (see the header for the
 * scheme).  The four handles share one struct; it is freed when the last of
 * them has been closed.
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

struct epd_xport_uv {
    epd_xport_t *x;
    uv_poll_t poll;
    uv_prepare_t prepare;
    uv_idle_t idle;
    uv_timer_t timer;
    int has_fd;
    int open_handles;
    uint64_t armed;    /* loop passes that could sleep on the fd */
    uint64_t busy;     /* ... that found the library busy after EPD_XPORT_UV_ARM_TRIES */
    uint64_t busy_idle; /* busy passes whose progress then found nothing: a spin */
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

static void epd_xport_uv_on_poll(uv_poll_t *handle, int status, int events)
{
    (void)status;
    (void)events;
    epd_xport_uv_drain(handle->data);
}

static void epd_xport_uv_on_idle(uv_idle_t *handle)
{
    epd_xport_uv_t *uv = handle->data;

    if (epd_xport_uv_drain(uv) == 0) {
        uv->busy_idle++;
    }
}

static void epd_xport_uv_on_timer(uv_timer_t *handle)
{
    epd_xport_uv_drain(handle->data);
}

/* Just before the loop would block: sleep only when the library agrees. */
static void epd_xport_uv_on_prepare(uv_prepare_t *handle)
{
    epd_xport_uv_t *uv = handle->data;

    epd_xport_uv_drain(uv);
    if (!uv->has_fd) {
        return;
    }
    /* "busy" mostly means an event came in between the last progress and
     * the arm, or that the library still had wake-up signals queued (UCX
     * shared memory consumes one per arm): progress and arm again, a few
     * times, rather than turning the whole loop into a poller (uv_idle) at
     * the first refusal.  Measured with epd-bench overhead (dense-70b,
     * ucx-shm, 1k tokens): prefill's loop polled 4204 passes for nothing
     * with one try, 149 with 16 (the log line at stop counts them). */
    for (int i = 0; i < EPD_XPORT_UV_ARM_TRIES; i++) {
        if (epd_xport_arm(uv->x) == EPD_OK) {
            uv->armed++;
            uv_idle_stop(&uv->idle);
            return;
        }
        (void)epd_xport_uv_drain(uv);
    }
    uv->busy++;
    uv_idle_start(&uv->idle, epd_xport_uv_on_idle);
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
    uv->prepare.data = uv;
    uv->idle.data = uv;
    uv->timer.data = uv;
    uv->open_handles = 3;
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
                 "(busy), %llu of which found nothing to do",
                 (unsigned long long)uv->armed, (unsigned long long)uv->busy,
                 (unsigned long long)uv->busy_idle);
    uv_close((uv_handle_t *)&uv->prepare, epd_xport_uv_on_closed);
    uv_close((uv_handle_t *)&uv->idle, epd_xport_uv_on_closed);
    uv_close((uv_handle_t *)&uv->timer, epd_xport_uv_on_closed);
    if (uv->open_handles == 4) {
        uv_close((uv_handle_t *)&uv->poll, epd_xport_uv_on_closed);
    }
}
