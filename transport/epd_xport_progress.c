/*
 * epd_xport_progress.c — progress: the timers (connect deadlines, keepalives,
 * peer silence, retries under backpressure), progress, the fd, poll.
 */
#include "epd_xport_core.h"

#include <errno.h>
#include <poll.h>
#include <string.h>

#include "epd_log.h"
#include "epd_time.h"

static int epd__timers(epd_xport_t *x, uint64_t now)
{
    uint64_t peer_ns = (uint64_t)x->cfg.peer_timeout_ms * EPD_NSEC_PER_MSEC;
    uint64_t ka_ns = peer_ns / 4;
    epd_xport_ep_t *ep, *next;
    int n = 0;

    for (ep = x->eps; ep != NULL; ep = next) {
        next = ep->next;
        if (ep->state == EPD__EP_CONNECTING && ep->hs_pending != 0 && now < ep->deadline_ns) {
            if (ep->hs_pending == EPD__FRAME_HELLO) {
                if (epd__xport_hello_send(ep) == EPD_OK) {
                    ep->hs_pending = 0;
                }
            } else if (epd__xport_fin_send(ep) == EPD_OK) {
                epd__xport_ep_connected(ep);
                n++;
            }
        } else if (ep->state == EPD__EP_ACCEPTING && now >= ep->deadline_ns) {
            EPD__LOG_LIMITED(x,
                             "peer %016llx (claims worker '%s') did not finish the handshake "
                             "within %u ms: half-open endpoint closed",
                             (unsigned long long)ep->peer_id, epd__xport_ep_who(ep),
                             x->cfg.connect_timeout_ms);
            epd_xport_ep_close(ep);
            n++;
        } else if (ep->state == EPD__EP_CONNECTING && now >= ep->deadline_ns) {
            epd_log_warn(EPD__XPORT_COMP, 0, "connect timed out after %u ms (nobody answered%s)",
                         x->cfg.connect_timeout_ms,
                         x->auth ? "; a worker with another cluster secret, or none, does not "
                                   "answer either"
                                 : "");
            epd__xport_ep_fail(ep, EPD_ERR_TIMEOUT);
            n++;
        } else if (ep->state == EPD__EP_CONNECTED) {
            if (now - ep->last_rx_ns > peer_ns) {
                epd_log_warn(EPD__XPORT_COMP, 0,
                             "peer %016llx silent for %llu ms (limit %u ms): declared dead",
                             (unsigned long long)ep->peer_id,
                             (unsigned long long)((now - ep->last_rx_ns) / EPD_NSEC_PER_MSEC),
                             x->cfg.peer_timeout_ms);
                epd__xport_ep_fail(ep, EPD_ERR_PEER_DEAD);
                n++;
            } else if (now - ep->last_tx_ns >= ka_ns) {
                (void)epd__xport_frame_send(ep, EPD__FRAME_KEEPALIVE, 0, NULL, 0);
            }
        }
        /* an endpoint closed by a callback above is parked on the zombie
         * list, so `next` was read before and stays valid: only the current
         * one could have been unlinked */
    }
    return n;
}

int epd_xport_progress(epd_xport_t *x)
{
    uint64_t now;
    int n;

    epd__xport_enter(x);
    n = x->ops->progress(x->be);
    if (x->pump != NULL) {
        n += epd__xport_pump_all(x);
    }
    now = epd_time_now_ns();
    if (now >= x->next_timer_ns) {
        x->next_timer_ns = now + x->timer_step_ns;
        n += epd__timers(x, now);
    }
    epd__xport_leave(x);
    return n;
}

epd_status_t epd_xport_get_fd(epd_xport_t *x, int *fd_p)
{
    return x->ops->get_fd(x->be, fd_p);
}

epd_status_t epd_xport_arm(epd_xport_t *x)
{
    if (x->pump != NULL) {
        return EPD_ERR_BUSY;
    }
    return x->ops->arm(x->be);
}

int epd_xport_poll(epd_xport_t *x, int timeout_ms)
{
    struct pollfd pfd;
    uint64_t now, wait_ns;
    int n, fd, ms;

    n = epd_xport_progress(x);
    if (n > 0 || timeout_ms <= 0) {
        return n;
    }
    now = epd_time_now_ns();
    wait_ns = x->next_timer_ns > now ? x->next_timer_ns - now : 0;
    if (wait_ns > (uint64_t)timeout_ms * EPD_NSEC_PER_MSEC) {
        wait_ns = (uint64_t)timeout_ms * EPD_NSEC_PER_MSEC;
    }
    if (epd_xport_get_fd(x, &fd) != EPD_OK) {
        /* no fd: nap briefly, never longer than the timer step */
        epd_time_sleep_ns(wait_ns < 50 * EPD_NSEC_PER_USEC ? wait_ns : 50 * EPD_NSEC_PER_USEC);
        return epd_xport_progress(x);
    }
    if (epd_xport_arm(x) != EPD_OK) {
        return epd_xport_progress(x);
    }
    ms = (int)((wait_ns + EPD_NSEC_PER_MSEC - 1) / EPD_NSEC_PER_MSEC);
    pfd.fd = fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (poll(&pfd, 1, ms) < 0 && errno != EINTR) {
        epd_log_warn(EPD__XPORT_COMP, 0, "poll on the transport fd failed: %s", strerror(errno));
    }
    return epd_xport_progress(x);
}
