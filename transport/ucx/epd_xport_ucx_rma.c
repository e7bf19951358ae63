/*
 * epd_xport_ucx_rma.c — RMA: writes (a put into mapped memory, or an active
 * message validated and received into the region) and flushes, and the handler
 * of arriving writes.
 */
#include "epd_xport_ucx_int.h"

ucs_status_t epd__ucx_am_write(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    epd__ucx_t *be = arg;
    epd__ucx_wr_hdr_t hdr;
    epd__ucx_grant_t *g = NULL;
    epd__ucx_mr_t *mr;
    ucp_request_param_t p;
    void *req;

    if (header_length != sizeof(hdr)) {
        epd_log_warn(EPD__UCX_COMP, 0, "dropping a write with a %zu-byte header", header_length);
        return UCS_OK;
    }
    memcpy(&hdr, header, sizeof(hdr));
    mr = epd__ucx_mr_find(be, hdr.region_id);
    if (mr == NULL) {
        /* a writer's own key: the fence checks it (epd_xport.h) */
        g = epd__ucx_grant_find(be, hdr.region_id);
        mr = g != NULL ? g->mr : NULL;
    }
    if (mr == NULL || !mr->remote_write || hdr.offset > mr->size ||
        length > mr->size - hdr.offset) {
        epd_log_warn(EPD__UCX_COMP, 0,
                     "refusing a write of %zu bytes at offset %llu into region %016llx: %s", length,
                     (unsigned long long)hdr.offset, (unsigned long long)hdr.region_id,
                     mr == NULL          ? "no such region"
                     : !mr->remote_write ? "a local region (no remote access)"
                                         : "out of range");
        return UCS_OK;
    }
    if (g != NULL && !epd__xport_grant_write(g->core, hdr.offset, length)) {
        /* revoked (a retired writer's late write), or outside what the
         * region's owner allows now: dropped, counted by the core; a
         * rendezvous is answered as refused without a byte moving */
        return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        memset(&p, 0, sizeof(p));
        p.op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
        p.cb.recv_am = epd__ucx_recv_cb;
        p.user_data = g != NULL ? (void *)g : (void *)mr;
        p.memh = mr->memh;
        req = ucp_am_recv_data_nbx(be->worker, data, (char *)mr->addr + hdr.offset, length, &p);
        if (UCS_PTR_IS_ERR(req)) {
            epd_log_warn(EPD__UCX_COMP, 0, "cannot receive a write: %s",
                         ucs_status_string(UCS_PTR_STATUS(req)));
        } else if (req != NULL) {
            /* lands after this returns: a revocation waits for it */
            mr->recv_inflight++;
            if (g != NULL) {
                g->recv_inflight++;
            }
        }
        return UCS_OK;
    }
    if (length > 0) {
        memcpy((char *)mr->addr + hdr.offset, data, length);
    }
    return UCS_OK;
}

static epd_status_t epd__ucx_post_result(epd__ucx_ep_t *ep, epd__xport_op_t *op, epd__ucx_wr_t *wr,
                                         void *req)
{
    if (UCS_PTR_IS_ERR(req)) {
        epd__ucx_wr_put(ep->be, wr);
        return epd__ucx_status(UCS_PTR_STATUS(req));
    }
    if (req == NULL) {
        /* finished inline: the completion still runs from progress */
        epd__ucx_wr_put(ep->be, wr);
        epd__ucx_done_add(ep->be, op, EPD_OK);
    } else {
        wr->op = op;
        wr->req = req;
        EPD__UCX_OP(op)->wr = wr;
        epd__ucx_out_add(ep, op);
    }
    return EPD_INPROGRESS;
}

epd_status_t epd__ucx_write(void *arg, const void *local, size_t len, void *be_local_mr,
                            void *be_rkey, uint64_t remote_offset, epd__xport_op_t *op)
{
    epd__ucx_ep_t *ep = arg;
    epd__ucx_rkey_t *rk = be_rkey;
    epd__ucx_mr_t *lmr = be_local_mr;
    epd__ucx_op_t *o = EPD__UCX_OP(op);
    ucp_request_param_t p;
    epd__ucx_wr_t *wr;
    void *req;

    if (rk == NULL || rk->ep != ep) {
        return EPD_ERR_INVALID_PARAM;
    }
    wr = epd__ucx_wr_get(ep->be);
    if (wr == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    memset(o, 0, sizeof(*o));
    o->ep = ep;
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = epd__ucx_op_cb;
    p.user_data = wr;
    if (rk->direct) {
        /* a put reads the source here (a memcpy into the mapped peer region):
         * the region's handle exposes nothing */
        if (lmr != NULL) {
            p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            p.memh = lmr->memh;
        }
        req = ucp_put_nbx(ep->ep, local, len, rk->base + remote_offset, rk->rkey, &p);
        /* a copy into memory the peer maps (posix/sysv, or cma's
         * process_vm_writev): done means there */
        op->delivers = 1;
    } else {
        /* A rendezvous may hand the receiver a key to fetch the source
         * from (get-based rendezvous).  On RDMA lanes a key made from the
         * region's handle would span the whole region — every request's KV
         * in the pool — and the region is mapped without remote read, so
         * the HCA would refuse the get: there UCX gets no handle and
         * registers just this buffer's pages itself (data the receiver gets
         * in any case).  On shared memory and tcp no registration limits
         * what a peer reads (cma reads by pid, tcp has no keys), so the
         * handle only saves UCX a registration-cache lookup per write. */
        if (lmr != NULL && (ep->shm || strcmp(ep->cls, "tcp") == 0)) {
            p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            p.memh = lmr->memh;
        }
        wr->hdr.region_id = rk->region_id;
        wr->hdr.offset = remote_offset;
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = len >= EPD__UCX_RNDV_MIN ? UCP_AM_SEND_FLAG_RNDV : 0;
        req = ucp_am_send_nbx(ep->ep, EPD__UCX_AM_WRITE, &wr->hdr, sizeof(wr->hdr), local, len, &p);
    }
    return epd__ucx_post_result(ep, op, wr, req);
}

epd_status_t epd__ucx_flush(void *arg, epd__xport_op_t *op)
{
    epd__ucx_ep_t *ep = arg;
    epd__ucx_op_t *o = EPD__UCX_OP(op);
    ucp_request_param_t p;
    epd__ucx_wr_t *wr = epd__ucx_wr_get(ep->be);

    if (wr == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    memset(o, 0, sizeof(*o));
    o->ep = ep;
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = epd__ucx_op_cb;
    p.user_data = wr;
    return epd__ucx_post_result(ep, op, wr, ucp_ep_flush_nbx(ep->ep, &p));
}
