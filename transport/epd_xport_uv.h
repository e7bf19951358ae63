/*
 * epd_xport_uv.h — drive an epd_xport_t from a libuv loop.
 *
 * Daemons keep their transport progressing on their loop thread whatever
 * their compute thread is doing (on TCP and shared memory even a "one-sided"
 * write into this process needs this process to progress).  The loop:
 *   - sleeps on the transport's fd (uv_poll) when the library says it may
 *     (epd_xport_arm == EPD_OK, checked in a uv_prepare just before the loop
 *     blocks);
 *   - keeps progressing without sleeping (uv_idle) while the library reports
 *     pending events (EPD_ERR_BUSY) — but after ~1000 such passes in a row
 *     that found nothing (fewer once it happened since the last arm), polls
 *     on a back-off timer (1 ms doubling to 16 ms) and sleeps in between (the fd
 *     unwatched: it may stay readable), until progress finds work again;
 *   - polls on a short timer where the provider has no fd;
 *   - runs progress at least every tick_ms (uv_timer), which drives the
 *     transport's keepalives, connect deadlines and peer timeouts.
 * Progress happens in bounded batches, so one busy peer cannot starve the
 * loop's other work.  Loop thread only.
 */
#ifndef EPD_XPORT_UV_H
#define EPD_XPORT_UV_H

#include <stdint.h>

#include <uv.h>

#include "epd_xport.h"

typedef struct epd_xport_uv epd_xport_uv_t;

/* Starts driving `x` (borrowed; it must outlive the driver) from `loop`.
 * *uv_p is owned by the caller (epd_xport_uv_stop). */
epd_status_t epd_xport_uv_start(uv_loop_t *loop, epd_xport_t *x, uint32_t tick_ms,
                                epd_xport_uv_t **uv_p);

/* Stops driving: closes the handles; the memory is freed by their close
 * callbacks, so the loop must run once more.  NULL is a no-op. */
void epd_xport_uv_stop(epd_xport_uv_t *uv);

#endif
