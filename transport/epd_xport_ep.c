/*
 * epd_xport_ep.c — endpoints: creation, failure, close, the pump of held
 * messages (fences), the endpoint accessors and epd_xport_send.
 */
#include "epd_xport_core.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_proc.h"
#include "epd_time.h"

static void epd__held_drop(epd_xport_ep_t *ep)
{
    while (ep->held_head != NULL) {
        epd__held_t *h = ep->held_head;
        ep->held_head = h->next;
        epd__xport_held_put(ep->x, h);
    }
    ep->held_tail = NULL;
}

void epd__xport_ep_release_backend(epd_xport_ep_t *ep)
{
    epd_xport_t *x = ep->x;

    while (ep->rkeys != NULL) {
        epd_xport_rkey_t *rk = ep->rkeys;
        ep->rkeys = rk->next;
        if (rk->be_rkey != NULL) {
            x->ops->rkey_destroy(rk->be_rkey);
        }
        epd_free(rk);
    }
    if (ep->be_ep != NULL) {
        void *be_ep = ep->be_ep;
        /* cleared first: the completions ep_destroy runs may call back into
         * the core, which must not see a half-destroyed backend endpoint */
        ep->be_ep = NULL;
        x->ops->ep_destroy(be_ep);
        /* contract: ep_destroy completes every op it held */
        assert(ep->ops_held == 0);
    }
    epd__held_drop(ep);
}

/* Marks the endpoint failed: connect callback (if still connecting), then the
 * error callback, then every op it holds completes with `status`.  A
 * half-open accepted endpoint (the user never saw it) is closed quietly. */
void epd__xport_ep_fail(epd_xport_ep_t *ep, epd_status_t status)
{
    epd_xport_t *x = ep->x;
    bool connecting = ep->state == EPD__EP_CONNECTING;

    if (ep->state == EPD__EP_FAILED || ep->state == EPD__EP_CLOSED) {
        return;
    }
    if (ep->state == EPD__EP_ACCEPTING) {
        epd_log_debug(EPD__XPORT_COMP, 0, "half-open endpoint of peer %016llx failed: %s",
                      (unsigned long long)ep->peer_id, epd_status_string(status));
        epd_xport_ep_close(ep);
        return;
    }
    ep->state = EPD__EP_FAILED;
    ep->fail_status = status;
    epd__xport_enter(x);
    if (connecting && ep->conn_cb != NULL) {
        epd_xport_comp_cb_t cb = ep->conn_cb;
        ep->conn_cb = NULL;
        cb(ep->conn_arg, status);
    }
    if (ep->state == EPD__EP_FAILED && x->cfg.err_cb != NULL) {
        x->cfg.err_cb(x->cfg.cb_arg, ep, status);
    }
    if (ep->state == EPD__EP_FAILED) {
        /* rkeys stay (the user owns them) but the backend endpoint goes:
         * its ops complete now, with `status` (see epd__xport_op_done) */
        void *be_ep = ep->be_ep;
        if (be_ep != NULL) {
            /* the user still owns the rkeys (freed by rkey_destroy or
             * ep_close); only their backend halves go with the endpoint */
            for (epd_xport_rkey_t *rk = ep->rkeys; rk != NULL; rk = rk->next) {
                if (rk->be_rkey != NULL) {
                    x->ops->rkey_destroy(rk->be_rkey);
                    rk->be_rkey = NULL;
                }
            }
            ep->be_ep = NULL; /* before: completions may re-enter (close) */
            x->ops->ep_destroy(be_ep);
            assert(ep->ops_held == 0);
        }
        epd__held_drop(ep);
    }
    epd__xport_leave(x);
}

void epd__xport_pump_schedule(epd_xport_ep_t *ep)
{
    if (!ep->pump_listed) {
        ep->pump_listed = true;
        ep->pump_next = ep->x->pump;
        ep->x->pump = ep;
    }
}

/* Sends held messages whose turn came.  Returns true when the queue is
 * empty or waiting on an event that will pump again (a write or flush
 * completion), false when it should be retried from progress. */
bool epd__xport_ep_pump(epd_xport_ep_t *ep)
{
    epd_xport_t *x = ep->x;

    while (ep->state == EPD__EP_CONNECTED && ep->held_head != NULL) {
        epd__held_t *h = ep->held_head;
        epd_status_t st;

        if (h->fenced) {
            if (ep->fence_state == EPD__FENCE_FLUSHING) {
                return true; /* the flush completion pumps */
            }
            if (ep->wr_head != NULL && ep->wr_head->seq <= h->fence_target) {
                return true; /* an earlier write is still in flight */
            }
            if (ep->flushed_seq < h->fence_target && ep->nd_seq > ep->flushed_seq) {
                epd__core_op_t *op = epd__xport_op_get(x, false);
                if (op == NULL) {
                    return false;
                }
                op->kind = EPD__OP_FENCE;
                op->ep = ep;
                op->seq = ep->wr_seq;
                st = x->ops->flush(ep->be_ep, &op->be);
                if (st == EPD_ERR_NO_RESOURCE) {
                    epd__xport_op_put(x, op);
                    return false;
                }
                if (st != EPD_INPROGRESS && st != EPD_OK) {
                    epd__xport_op_put(x, op);
                    epd__xport_ep_fail(ep, st);
                    return true;
                }
                ep->ops_held++;
                ep->fence_state = EPD__FENCE_FLUSHING;
                return true;
            }
        }
        st = epd__xport_frame_send(ep, EPD__FRAME_MSG, 0, h->buf, h->len);
        if (st == EPD_ERR_NO_RESOURCE) {
            return false;
        }
        if (st != EPD_OK) {
            epd__xport_ep_fail(ep, st);
            return true;
        }
        ep->held_head = h->next;
        if (ep->held_head == NULL) {
            ep->held_tail = NULL;
        }
        epd__xport_held_put(x, h);
    }
    return true;
}

int epd__xport_pump_all(epd_xport_t *x)
{
    epd_xport_ep_t *list = x->pump;
    int n = 0;

    x->pump = NULL;
    while (list != NULL) {
        epd_xport_ep_t *ep = list;
        list = ep->pump_next;
        ep->pump_listed = false;
        if (ep->state == EPD__EP_CLOSED) {
            continue;
        }
        n++;
        if (!epd__xport_ep_pump(ep)) {
            epd__xport_pump_schedule(ep);
        }
    }
    return n;
}

void epd__xport_ep_failed(epd_xport_ep_t *core_ep, epd_status_t status)
{
    epd_log_warn(EPD__XPORT_COMP, 0, "endpoint to peer %016llx failed: %s",
                 (unsigned long long)core_ep->peer_id, epd_status_string(status));
    epd__xport_ep_fail(core_ep, status);
}

int epd__xport_ep_live(const epd_xport_ep_t *core_ep)
{
    return core_ep->state == EPD__EP_CONNECTED && core_ep->be_ep != NULL;
}

void epd__xport_ep_alive(epd_xport_ep_t *core_ep)
{
    core_ep->last_rx_ns = epd_time_now_ns();
}

const char *epd__xport_class_ok(epd_xport_ep_t *ep)
{
    const char *cls = "other";

    ep->x->ops->ep_describe(ep->be_ep, ep->desc, sizeof(ep->desc), &cls);
    if (ep->x->expect[0] == '\0' || strcmp(ep->x->expect, cls) == 0) {
        return NULL;
    }
    return cls;
}

epd_status_t epd__xport_ep_new(epd_xport_t *x, const void *blob, size_t len, epd_xport_ep_t **ep_p)
{
    epd_xport_ep_t *ep;
    epd_status_t st;

    ep = epd_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    ep->x = x;
    st = epd__xport_slot_alloc(x, ep);
    if (st != EPD_OK) {
        goto err_free;
    }
    st = x->ops->ep_create(x->be, blob, len, ep, &ep->be_ep);
    if (st != EPD_OK) {
        goto err_slot;
    }
    ep->last_rx_ns = ep->last_tx_ns = epd_time_now_ns();
    EPD_LIST_INSERT_HEAD(x->eps, ep);
    *ep_p = ep;
    return EPD_OK;

err_slot:
    epd__xport_slot_release(x, ep);
err_free:
    epd_free(ep);
    return st;
}

uint64_t epd__xport_ep_peer(const epd_xport_ep_t *core_ep)
{
    return core_ep->peer_id;
}

void epd_xport_ep_close(epd_xport_ep_t *ep)
{
    epd_xport_t *x;

    if (ep == NULL || ep->state == EPD__EP_CLOSED) {
        return;
    }
    x = ep->x;
    epd__xport_enter(x);
    if (ep->state == EPD__EP_CONNECTED) {
        (void)epd__xport_frame_send(ep, EPD__FRAME_BYE, 0, NULL, 0);
    }
    if (ep->state == EPD__EP_ACCEPTING) {
        x->half_open--;
    }
    if (ep->state == EPD__EP_CONNECTING && ep->conn_cb != NULL) {
        /* the connect completes, like every other pending operation */
        epd_xport_comp_cb_t cb = ep->conn_cb;
        ep->conn_cb = NULL;
        ep->state = EPD__EP_CLOSED;
        cb(ep->conn_arg, EPD_ERR_CANCELED);
    }
    ep->state = EPD__EP_CLOSED;
    ep->conn_cb = NULL;
    epd__xport_ep_release_backend(ep);
    epd__xport_slot_release(x, ep);
    EPD_LIST_REMOVE(x->eps, ep);
    /* the pump list may still point at it: parked until the stack unwinds,
     * and epd__xport_pump_all skips closed endpoints */
    if (ep->pump_listed) {
        epd_xport_ep_t **pp = &x->pump;
        while (*pp != NULL && *pp != ep) {
            pp = &(*pp)->pump_next;
        }
        if (*pp == ep) {
            *pp = ep->pump_next;
        }
        ep->pump_listed = false;
    }
    ep->prev = NULL;
    ep->next = x->zombies;
    x->zombies = ep;
    epd__xport_leave(x);
}

uint64_t epd_xport_ep_peer_id(const epd_xport_ep_t *ep)
{
    return ep->state == EPD__EP_CONNECTING ? 0 : ep->peer_id;
}

epd_status_t epd_xport_ep_identity(const epd_xport_ep_t *ep, epd_xport_identity_t *id_p,
                                   int *authenticated_p)
{
    if (ep == NULL || id_p == NULL || authenticated_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (!ep->handshaken) {
        return EPD_INPROGRESS;
    }
    if (ep->peer_presented) {
        *id_p = ep->peer_ident;
    } else {
        memset(id_p, 0, sizeof(*id_p));
    }
    *authenticated_p = ep->authed ? 1 : 0;
    return EPD_OK;
}

epd_status_t epd_xport_ep_peer_proc(const epd_xport_ep_t *ep, epd_proc_id_t *proc_p)
{
    if (ep == NULL || proc_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (!ep->handshaken || !ep->peer_proc_known) {
        return EPD_ERR_NOT_FOUND;
    }
    memset(proc_p, 0, sizeof(*proc_p));
    proc_p->pid = ep->peer_proc.pid;
    proc_p->start_ticks = ep->peer_proc.start_ticks;
    proc_p->pidns_dev = ep->peer_proc.pidns_dev;
    proc_p->pidns_ino = ep->peer_proc.pidns_ino;
    memcpy(proc_p->boot_id, ep->peer_proc.boot_id, sizeof(proc_p->boot_id));
    return EPD_OK;
}

void epd_xport_ep_describe(epd_xport_ep_t *ep, char *buf, size_t len)
{
    const char *cls = "other";

    if (len == 0) {
        return;
    }
    if (ep->be_ep != NULL) {
        ep->x->ops->ep_describe(ep->be_ep, ep->desc, sizeof(ep->desc), &cls);
    }
    snprintf(buf, len, "%s", ep->desc[0] != '\0' ? ep->desc : "(closed)");
}

const char *epd_xport_ep_class(epd_xport_ep_t *ep)
{
    const char *cls = "other";

    if (ep == NULL || ep->be_ep == NULL) {
        return "";
    }
    ep->x->ops->ep_describe(ep->be_ep, ep->desc, sizeof(ep->desc), &cls);
    return cls;
}

void epd_xport_ep_set_user(epd_xport_ep_t *ep, void *user)
{
    ep->user = user;
}

void *epd_xport_ep_user(const epd_xport_ep_t *ep)
{
    return ep->user;
}

epd_status_t epd__xport_ep_usable(const epd_xport_ep_t *ep)
{
    if (ep->state == EPD__EP_FAILED) {
        return ep->fail_status;
    }
    if (ep->state == EPD__EP_CLOSED) {
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

epd_status_t epd_xport_send(epd_xport_ep_t *ep, const void *buf, size_t len, unsigned flags)
{
    epd_xport_t *x;
    epd__held_t *h;
    epd_status_t st;
    bool fenced;

    if (ep == NULL || buf == NULL || len == 0 || (flags & ~EPD_XPORT_SEND_FENCE) != 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    x = ep->x;
    if (len > x->cfg.max_msg_size) {
        return EPD_ERR_TOO_LONG;
    }
    st = epd__xport_ep_usable(ep);
    if (st != EPD_OK) {
        return st;
    }
    fenced = (flags & EPD_XPORT_SEND_FENCE) != 0;
    if (ep->state == EPD__EP_CONNECTED && ep->held_head == NULL &&
        (!fenced || (ep->wr_head == NULL &&
                     (ep->flushed_seq >= ep->wr_seq || ep->nd_seq <= ep->flushed_seq)))) {
        st = epd__xport_frame_send(ep, EPD__FRAME_MSG, 0, buf, len);
        if (st != EPD_OK && st != EPD_ERR_NO_RESOURCE) {
            epd__xport_ep_fail(ep, st);
        }
        return st;
    }
    h = epd__xport_held_get(x, len);
    if (h == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    memcpy(h->buf, buf, len);
    h->len = len;
    h->fenced = fenced;
    h->fence_target = ep->wr_seq;
    h->next = NULL;
    if (ep->held_tail != NULL) {
        ep->held_tail->next = h;
    } else {
        ep->held_head = h;
    }
    ep->held_tail = h;
    if (ep->state == EPD__EP_CONNECTED && ep->held_head == h && !epd__xport_ep_pump(ep)) {
        epd__xport_pump_schedule(ep);
    }
    return EPD_OK;
}
