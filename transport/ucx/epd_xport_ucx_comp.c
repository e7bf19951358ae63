/*
 * epd_xport_ucx_comp.c — completions: UCX status mapping, the lists of ops out
 * and done, the write and tx pools, the UCX callbacks that only queue, and
 * progress, which hands what they queued to the core.
 */
#include "epd_xport_ucx_int.h"

epd_status_t epd__ucx_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:
        return EPD_OK;
    case UCS_INPROGRESS:
        return EPD_INPROGRESS;
    case UCS_ERR_NO_RESOURCE:
        return EPD_ERR_NO_RESOURCE;
    case UCS_ERR_NO_MEMORY:
        return EPD_ERR_NO_MEMORY;
    case UCS_ERR_INVALID_PARAM:
        return EPD_ERR_INVALID_PARAM;
    case UCS_ERR_CANCELED:
        return EPD_ERR_CANCELED;
    case UCS_ERR_UNREACHABLE:
        return EPD_ERR_UNREACHABLE;
    case UCS_ERR_CONNECTION_RESET:
        return EPD_ERR_CONNECTION_RESET;
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return EPD_ERR_PEER_DEAD;
    case UCS_ERR_TIMED_OUT:
        return EPD_ERR_TIMEOUT;
    case UCS_ERR_UNSUPPORTED:
        return EPD_ERR_UNSUPPORTED;
    default:
        return EPD_ERR_TRANSPORT;
    }
}

void epd__ucx_out_remove(epd__xport_op_t *op)
{
    epd__ucx_op_t *o = EPD__UCX_OP(op);

    EPD_LIST_REMOVE_N(EPD__UCX_OP, o->ep->out_head, op);
    o->prev = o->next = NULL;
    o->where = EPD__UCX_OP_NONE;
}

void epd__ucx_out_add(epd__ucx_ep_t *ep, epd__xport_op_t *op)
{
    epd__ucx_op_t *o = EPD__UCX_OP(op);

    EPD_LIST_INSERT_HEAD_N(EPD__UCX_OP, ep->out_head, op);
    o->where = EPD__UCX_OP_OUT;
}

void epd__ucx_done_add(epd__ucx_t *be, epd__xport_op_t *op, epd_status_t status)
{
    epd__ucx_op_t *o = EPD__UCX_OP(op);

    o->status = status;
    EPD_TLIST_INSERT_TAIL_N(EPD__UCX_OP, be->done_head, be->done_tail, op);
    o->where = EPD__UCX_OP_DONE;
}

void epd__ucx_done_remove(epd__ucx_t *be, epd__xport_op_t *op)
{
    epd__ucx_op_t *o = EPD__UCX_OP(op);

    EPD_TLIST_REMOVE_N(EPD__UCX_OP, be->done_head, be->done_tail, op);
    o->prev = o->next = NULL;
    o->where = EPD__UCX_OP_NONE;
}

static void epd__ucx_note_fail(epd__ucx_ep_t *ep, epd_status_t st)
{
    if (ep->pending_fail == EPD_OK) {
        ep->pending_fail = st;
    }
    if (!ep->fail_listed) {
        ep->fail_listed = true;
        ep->fail_next = ep->be->fail_list;
        ep->be->fail_list = ep;
    }
}

/* A request record (NULL: out of memory). */
epd__ucx_wr_t *epd__ucx_wr_get(epd__ucx_t *be)
{
    epd__ucx_wr_t *wr = be->wr_free;

    if (wr != NULL) {
        be->wr_free = wr->next;
    } else {
        wr = epd_malloc(sizeof(*wr));
        if (wr == NULL) {
            return NULL;
        }
    }
    memset(wr, 0, sizeof(*wr));
    wr->be = be;
    return wr;
}

void epd__ucx_wr_put(epd__ucx_t *be, epd__ucx_wr_t *wr)
{
    wr->next = be->wr_free;
    be->wr_free = wr;
}

static void epd__ucx_orphan_unlink(epd__ucx_t *be, epd__ucx_wr_t *wr)
{
    EPD_LIST_REMOVE(be->orphans, wr);
    be->n_orphans--;
}

/* Completion of a put, AM write or flush (UCX callback context: queue only). */
void epd__ucx_op_cb(void *request, ucs_status_t status, void *user_data)
{
    epd__ucx_wr_t *wr = user_data;
    epd__ucx_t *be = wr->be;
    epd__xport_op_t *op = wr->op;
    epd__ucx_op_t *o;

    ucp_request_free(request);
    if (op == NULL) {
        /* an orphan: UCX is done with its header and source at last */
        epd__ucx_orphan_unlink(be, wr);
        epd__ucx_wr_put(be, wr);
        return;
    }
    o = EPD__UCX_OP(op);
    epd__ucx_out_remove(op);
    o->wr = NULL;
    epd__ucx_wr_put(be, wr);
    epd__ucx_done_add(be, op, epd__ucx_status(status));
}

/* A send copy for `len` bytes (epd_bufpool: small ones pooled, so the
 * steady state allocates nothing; a large one, an image, sized to itself
 * and freed when UCX is done with it). */
epd__ucx_tx_t *epd__ucx_tx_get(epd__ucx_t *be, size_t len)
{
    return epd_bufpool_get(&be->tx, len);
}

void epd__ucx_tx_put(epd__ucx_t *be, epd__ucx_tx_t *tx)
{
    epd_bufpool_put(&be->tx, tx);
}

void epd__ucx_tx_unlink(epd__ucx_tx_t *tx)
{
    if (tx->ep != NULL) {
        tx->ep->n_tx--;
    }
    /* on its endpoint's list, or (the endpoint gone) the backend's orphans */
    EPD_LIST_REMOVE(*(tx->ep != NULL ? &tx->ep->tx_head : &tx->be->tx_orphans), tx);
    tx->prev = tx->next = NULL;
}

void epd__ucx_tx_cb(void *request, ucs_status_t status, void *user_data)
{
    epd__ucx_tx_t *tx = user_data;
    epd__ucx_ep_t *ep = tx->ep;
    epd__ucx_t *be = tx->be;

    epd__ucx_tx_unlink(tx);
    epd__ucx_tx_put(be, tx);
    ucp_request_free(request);
    if (ep != NULL && status != UCS_OK && status != UCS_ERR_CANCELED) {
        epd__ucx_note_fail(ep, epd__ucx_status(status));
    }
}

void epd__ucx_reap(epd__ucx_t *be)
{
    epd__ucx_mr_t **pp = &be->dead_mrs;
    epd__ucx_grant_t *g, *gnext;

    for (g = be->dead_grants; g != NULL; g = gnext) {
        gnext = g->next;
        if (g->recv_inflight == 0) {
            EPD_LIST_REMOVE(be->dead_grants, g);
            epd_free(g);
        }
    }

    while (*pp != NULL) {
        epd__ucx_mr_t *mr = *pp;
        if (mr->recv_inflight == 0) {
            *pp = mr->next;
            epd__ucx_mr_unmap(mr);
        } else {
            pp = &mr->next;
        }
    }
}

int epd__ucx_progress(void *arg)
{
    epd__ucx_t *be = arg;
    uint32_t n_done = 0, n_rx;
    int n = 0;

    for (int i = 0; i < 4; i++) {
        unsigned c;
        if (EPD__UCX_RING - be->ring_count < EPD__UCX_RING_SLACK) {
            break;
        }
        c = ucp_worker_progress(be->worker);
        n += (int)c;
        if (c == 0) {
            break;
        }
    }
    /* bounded: only what was done before we started handing it out */
    for (epd__xport_op_t *op = be->done_head; op != NULL; op = EPD__UCX_OP(op)->next) {
        n_done++;
    }
    while (n_done-- > 0 && be->done_head != NULL) {
        epd__xport_op_t *op = be->done_head;
        epd__ucx_done_remove(be, op);
        epd__xport_op_done(op, (epd_status_t)EPD__UCX_OP(op)->status);
        n++;
    }
    n_rx = be->ring_count;
    while (n_rx-- > 0 && be->ring_count > 0) {
        epd__ucx_rx_t *rx = &be->ring[be->ring_head];
        void *data = rx->data;
        size_t len = rx->len;
        bool held = rx->held;

        /* the slot stays untouched while its bytes are delivered: the ring
         * only grows at the tail during a nested progress, and has slack */
        epd__xport_deliver(be->core, data, len);
        if (held) {
            ucp_am_data_release(be->worker, data);
        }
        be->ring_head = (be->ring_head + 1) % EPD__UCX_RING;
        be->ring_count--;
        n++;
    }
    while (be->fail_list != NULL) {
        epd__ucx_ep_t *ep = be->fail_list;
        be->fail_list = ep->fail_next;
        ep->fail_listed = false;
        /* may destroy ep */
        epd__xport_ep_failed(ep->core_ep, ep->pending_fail);
        n++;
    }
    if (be->dead_mrs != NULL || be->dead_grants != NULL) {
        epd__ucx_reap(be);
    }
    return n;
}

epd_status_t epd__ucx_get_fd(void *arg, int *fd_p)
{
    epd__ucx_t *be = arg;
    ucs_status_t s;

    if (be->efd < 0) {
        s = ucp_worker_get_efd(be->worker, &be->efd);
        if (s != UCS_OK) {
            be->efd = -1;
            return EPD_ERR_UNSUPPORTED;
        }
    }
    *fd_p = be->efd;
    return EPD_OK;
}

epd_status_t epd__ucx_arm(void *arg)
{
    epd__ucx_t *be = arg;
    ucs_status_t s;

    if (be->done_head != NULL || be->ring_count > 0 || be->fail_list != NULL) {
        return EPD_ERR_BUSY;
    }
    /* UCS_ERR_BUSY may last for ever: the shared-memory transports refuse
     * to arm while a send waits in their pending queue for room in a
     * peer's receive FIFO, and a peer that died with its FIFO full never
     * makes room — nor can such a send be dropped: an endpoint of
     * UCP_ERR_HANDLING_MODE_NONE never fails, ucp_ep_close_nbx refuses
     * UCP_EP_CLOSE_FLAG_FORCE for it, and our flushing close of a dead
     * peer's endpoint is not waited for (epd__ucx_ep_destroy), so the send
     * stays queued until ucp_worker_destroy.  (Waking for arrivals only,
     * UCP_WAKEUP_RX, lets the arm succeed then, but UCP stops progressing
     * an interface it arms, so sends queued for a live but busy peer
     * stalled until the next arrival: requests timed out in
     * test_router_retry.)  The libuv driver bounds the polling this
     * causes (epd_xport_uv.c, the back-off). */
    s = ucp_worker_arm(be->worker);
    if (s == UCS_OK) {
        return EPD_OK;
    }
    return EPD_ERR_BUSY; /* UCS_ERR_BUSY, or no wakeup support: keep polling */
}
