/*
 * epd_xport_uv.c — libuv driver of an epd_xport_t (see the header for the
 * scheme).  The four handles share one struct; it is freed when the last of
 * them has been closed.
 */
#include "epd_xport_uv.h"

#include "epd_alloc.h"
#include "epd_log.h"

/* Progress calls per loop callback: bounded work per event. */
#define EPD_XPORT_UV_BATCHES 32
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
};

static void epd_xport_uv_drain(epd_xport_uv_t *uv)
{
    for (int i = 0; i < EPD_XPORT_UV_BATCHES; i++) {
        if (epd_xport_progress(uv->x) == 0) {
            break;
        }
    }
}

static void epd_xport_uv_on_poll(uv_poll_t *handle, int status, int events)
{
    (void)status;
    (void)events;
    epd_xport_uv_drain(handle->data);
}

static void epd_xport_uv_on_idle(uv_idle_t *handle)
{
    epd_xport_uv_drain(handle->data);
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
    if (uv->has_fd && epd_xport_arm(uv->x) == EPD_OK) {
        uv_idle_stop(&uv->idle);
    } else if (uv->has_fd) {
        uv_idle_start(&uv->idle, epd_xport_uv_on_idle);
    }
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
    uv_close((uv_handle_t *)&uv->prepare, epd_xport_uv_on_closed);
    uv_close((uv_handle_t *)&uv->idle, epd_xport_uv_on_closed);
    uv_close((uv_handle_t *)&uv->timer, epd_xport_uv_on_closed);
    if (uv->open_handles == 4) {
        uv_close((uv_handle_t *)&uv->poll, epd_xport_uv_on_closed);
    }
}
