/*
 * epd_xport_write.c — writes and flushes, and their completions (the op_done
 * upcall).
 */
#include "epd_xport_core.h"

#include <unistd.h>

#include "epd_alloc.h"

void epd__xport_op_done(epd__xport_op_t *bop, epd_status_t status)
{
    epd__core_op_t *op = (epd__core_op_t *)bop;
    epd_xport_t *x = op->ep->x;

    if (x->hook != NULL && x->hook->op_done(x->hook_ip, bop, &status)) {
        return; /* held: completed later through epd__xport_op_done_now */
    }
    epd__xport_op_done_now(bop, status);
}

void epd__xport_op_done_now(epd__xport_op_t *bop, epd_status_t status)
{
    epd__core_op_t *op = (epd__core_op_t *)bop;
    epd_xport_ep_t *ep = op->ep;
    epd_xport_t *x = ep->x;
    epd_xport_comp_cb_t cb = op->cb;
    void *arg = op->arg;
    int kind = op->kind;
    uint64_t seq = op->seq;

    epd__xport_enter(x);
    ep->ops_held--;
    if (status != EPD_OK && status != EPD_ERR_CANCELED &&
        epd_status_scope(status) >= EPD_SCOPE_CONNECTION &&
        (ep->state == EPD__EP_CONNECTING || ep->state == EPD__EP_CONNECTED)) {
        /* this op revealed that the endpoint is broken: the error callback
         * runs first, then every op (this one last) completes with it */
        epd__xport_ep_fail(ep, status);
    }
    if (status == EPD_ERR_CANCELED && ep->fail_status != EPD_OK) {
        status = ep->fail_status;
    }
    if (kind == EPD__OP_WRITE) {
        EPD_TLIST_REMOVE(ep->wr_head, ep->wr_tail, op);
    } else if (status == EPD_OK && seq > ep->flushed_seq) {
        ep->flushed_seq = seq;
    }
    if (kind == EPD__OP_FENCE) {
        ep->fence_state = EPD__FENCE_NONE;
    }
    epd__xport_op_put(x, op);
    if (cb != NULL) {
        cb(arg, status);
    }
    if (ep->state == EPD__EP_CONNECTED && ep->held_head != NULL) {
        if (!epd__xport_ep_pump(ep)) {
            epd__xport_pump_schedule(ep);
        }
    }
    epd__xport_leave(x);
}

epd_status_t epd_xport_write(epd_xport_ep_t *ep, const void *local, size_t len,
                             epd_xport_mr_t *local_mr, epd_xport_rkey_t *rkey,
                             uint64_t remote_offset, epd_xport_comp_cb_t cb, void *arg)
{
    epd_xport_t *x;
    epd__core_op_t *op;
    epd_status_t st;

    if (ep == NULL || local == NULL || len == 0 || rkey == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = epd__xport_ep_usable(ep);
    if (st != EPD_OK) {
        return st;
    }
    if (rkey->ep != ep) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (remote_offset > rkey->size || len > rkey->size - remote_offset) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    x = ep->x;
    if (local_mr != NULL && ((const char *)local < (const char *)local_mr->addr ||
                             len > local_mr->size ||
                             (size_t)((const char *)local - (const char *)local_mr->addr) >
                                 local_mr->size - len)) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    op = epd__xport_op_get(x, true);
    if (op == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    op->kind = EPD__OP_WRITE;
    op->ep = ep;
    op->cb = cb;
    op->arg = arg;
    op->seq = ep->wr_seq + 1;
    st = x->ops->write(ep->be_ep, local, len, local_mr != NULL ? local_mr->be_mr : NULL,
                       rkey->be_rkey, remote_offset, &op->be);
    if (st != EPD_INPROGRESS) {
        epd__xport_op_put(x, op);
        if (st == EPD_OK) {
            st = EPD_ERR_FATAL; /* contract: a backend never completes a write inline */
        } else if (st != EPD_ERR_NO_RESOURCE && epd_status_scope(st) >= EPD_SCOPE_CONNECTION) {
            epd__xport_ep_fail(ep, st);
        }
        return st;
    }
    ep->wr_seq++;
    if (!op->be.delivers) {
        ep->nd_seq = ep->wr_seq; /* a fence behind it flushes */
    }
    ep->ops_held++;
    EPD_TLIST_INSERT_TAIL(ep->wr_head, ep->wr_tail, op);
    return EPD_INPROGRESS;
}

epd_status_t epd_xport_flush(epd_xport_ep_t *ep, epd_xport_comp_cb_t cb, void *arg)
{
    epd_xport_t *x;
    epd__core_op_t *op;
    epd_status_t st;

    if (ep == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = epd__xport_ep_usable(ep);
    if (st != EPD_OK) {
        return st;
    }
    x = ep->x;
    op = epd__xport_op_get(x, true);
    if (op == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    op->kind = EPD__OP_FLUSH;
    op->ep = ep;
    op->cb = cb;
    op->arg = arg;
    op->seq = ep->wr_seq;
    st = x->ops->flush(ep->be_ep, &op->be);
    if (st != EPD_INPROGRESS) {
        epd__xport_op_put(x, op);
        if (st == EPD_OK) {
            st = EPD_ERR_FATAL;
        } else if (st != EPD_ERR_NO_RESOURCE && epd_status_scope(st) >= EPD_SCOPE_CONNECTION) {
            epd__xport_ep_fail(ep, st);
        }
        return st;
    }
    ep->ops_held++;
    return EPD_INPROGRESS;
}
