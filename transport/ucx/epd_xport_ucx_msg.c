/*
 * epd_xport_ucx_msg.c — messages: the active-message handler that queues what
 * arrives (copied, or received into a ring slot) and send.
 */
#include "epd_xport_ucx_int.h"

ucs_status_t epd__ucx_am_msg(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    epd__ucx_t *be = arg;
    epd__ucx_rx_t *rx;

    (void)header;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) == 0 || header_length != 0 || length == 0 ||
        length > be->msg_cap || be->ring_count == EPD__UCX_RING) {
        /* we send messages eager and whole; anything else is not ours (or
         * the ring overflowed, which the slack makes impossible in practice) */
        if (be->dropped++ % 1000 == 0) {
            epd_log_warn(EPD__UCX_COMP, 0,
                         "dropping a message: %zu bytes, header %zu, attr %#lx, ring %u/%u", length,
                         header_length, (unsigned long)param->recv_attr, be->ring_count,
                         EPD__UCX_RING);
        }
        return UCS_OK;
    }
    rx = &be->ring[(be->ring_head + be->ring_count) % EPD__UCX_RING];
    rx->len = length;
    be->ring_count++;
    if (length <= EPD__UCX_RX_INLINE) {
        /* a copy is cheaper than keeping the transport's buffer */
        memcpy(rx->inl, data, length);
        rx->data = rx->inl;
        rx->held = false;
        return UCS_OK;
    }
    rx->data = data;
    rx->held = true;
    return UCS_INPROGRESS; /* held until delivered, then ucp_am_data_release */
}

void epd__ucx_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    epd__ucx_mr_t *mr = user_data;

    (void)length;
    if (*(const int *)user_data == EPD__UCX_KIND_GRANT) {
        epd__ucx_grant_t *g = user_data;

        g->recv_inflight--;
        mr = g->mr;
    }
    mr->recv_inflight--;
    if (status != UCS_OK && status != UCS_ERR_CANCELED) {
        epd_log_warn(EPD__UCX_COMP, 0, "a write into region %016llx failed: %s",
                     (unsigned long long)mr->id, ucs_status_string(status));
    }
    ucp_request_free(request);
}

epd_status_t epd__ucx_send(void *arg, const void *hdr, size_t hdr_len, const void *payload,
                           size_t len)
{
    epd__ucx_ep_t *ep = arg;
    epd__ucx_t *be = ep->be;
    ucp_request_param_t p;
    epd__ucx_tx_t *tx;
    void *req;

    if (hdr_len + len > be->msg_cap) {
        return EPD_ERR_TOO_LONG;
    }
    if (ep->n_tx >= EPD__UCX_EP_TX_MAX) {
        return EPD_ERR_NO_RESOURCE; /* this peer takes nothing now: retry after progress */
    }
    tx = epd__ucx_tx_get(be, hdr_len + len);
    if (tx == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    /* one contiguous copy: the receiver hands the core one buffer, and the
     * caller's buffer is free again on return */
    memcpy(tx->data, hdr, hdr_len);
    if (len > 0) {
        memcpy(tx->data + hdr_len, payload, len);
    }
    memset(&p, 0, sizeof(p));
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = epd__ucx_tx_cb;
    p.user_data = tx;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    tx->ep = ep;
    tx->be = be;
    req = ucp_am_send_nbx(ep->ep, EPD__UCX_AM_MSG, NULL, 0, tx->data, hdr_len + len, &p);
    if (req == NULL) {
        epd__ucx_tx_put(be, tx);
        return EPD_OK;
    }
    if (UCS_PTR_IS_ERR(req)) {
        epd__ucx_tx_put(be, tx);
        return epd__ucx_status(UCS_PTR_STATUS(req));
    }
    tx->req = req;
    EPD_LIST_INSERT_HEAD(ep->tx_head, tx);
    ep->n_tx++;
    return EPD_OK;
}
