/*
 * epd_xport_ofi_msg.c — messages: receive slots, fragments and their
 * reassembly, the send path (gather, backlog) and send.
 */
#include "epd_xport_ofi_int.h"

void epd__ofi_post_recvs(epd__ofi_t *be)
{
    void *desc = epd__ofi_desc(be, be->rx_mr);

    if (be->rx_unposted == 0) {
        return;
    }
    for (unsigned i = 0; i < be->rx_count; i++) {
        epd__ofi_xfer_t *x = &be->rx[i];
        ssize_t ret;

        if (x->posted) {
            continue;
        }
        ret = fi_recv(be->ep, x->buf, be->frag_size, desc, FI_ADDR_UNSPEC, x);
        if (ret == -FI_EAGAIN) {
            return; /* retried from the next progress */
        }
        if (ret != 0) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_recv failed: %s", epd__fi.strerror((int)-ret));
            return;
        }
        x->posted = true;
        be->rx_unposted--;
    }
}

/* Copies bytes [off, off+n) of the message hdr ++ payload to dst. */
static void epd__ofi_gather(unsigned char *dst, const void *hdr, size_t hdr_len,
                            const void *payload, size_t off, size_t n)
{
    if (off < hdr_len) {
        size_t k = hdr_len - off < n ? hdr_len - off : n;

        memcpy(dst, (const unsigned char *)hdr + off, k);
        dst += k;
        off += k;
        n -= k;
    }
    if (n != 0) {
        memcpy(dst, (const unsigned char *)payload + (off - hdr_len), n);
    }
}

void epd__ofi_tx_put(epd__ofi_t *be, epd__ofi_xfer_t *x)
{
    x->ep = NULL;
    x->next_free = be->tx_free;
    be->tx_free = x;
    be->tx_nfree++;
}

/* Posts the fragments of ep's backlog in order until the provider pushes
 * back.  EPD_OK (empty), EPD_ERR_NO_RESOURCE, or the error that stopped it
 * (the rest is dropped: the peer would get a torn message, so the caller
 * fails the endpoint). */
epd_status_t epd__ofi_backlog_post(epd__ofi_t *be, epd__ofi_ep_t *ep)
{
    void *desc = epd__ofi_desc(be, be->tx_mr);
    epd__ofi_xfer_t *x;

    while ((x = ep->backlog) != NULL) {
        ssize_t ret = fi_send(be->ep, x->buf, x->len, desc, ep->addr, x);

        if (ret == -FI_EAGAIN) {
            return EPD_ERR_NO_RESOURCE;
        }
        ep->backlog = x->next_free;
        if (ep->backlog == NULL) {
            ep->backlog_tail = NULL;
        }
        x->next_free = NULL;
        if (ret != 0) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_send(%zu bytes) to %s failed: %s", x->len, ep->peer,
                          epd__fi.strerror((int)-ret));
            epd__ofi_tx_put(be, x);
            while ((x = ep->backlog) != NULL) {
                ep->backlog = x->next_free;
                epd__ofi_tx_put(be, x);
            }
            ep->backlog_tail = NULL;
            return epd__ofi_post_err(ret);
        }
        x->ep = ep;
        ep->inflight++;
    }
    return EPD_OK;
}

static epd__ofi_reasm_t *epd__ofi_reasm_find(epd__ofi_t *be, uint64_t stream, bool make)
{
    epd__ofi_reasm_t *victim = NULL;

    for (unsigned i = 0; i < EPD__OFI_REASM; i++) {
        epd__ofi_reasm_t *r = &be->reasm[i];

        if (r->active && r->stream == stream) {
            return r;
        }
        if (victim == NULL || (victim->active && (!r->active || r->last_use < victim->last_use))) {
            victim = r;
        }
    }
    if (!make) {
        return NULL;
    }
    if (victim->active) {
        epd_log_error(EPD__OFI_LOG, 0,
                      "more than %u messages in reassembly: dropping a partial one of %u bytes",
                      EPD__OFI_REASM, victim->total);
        victim->active = false;
    }
    if (victim->buf == NULL) {
        victim->buf = epd_malloc(be->max_total);
        if (victim->buf == NULL) {
            return NULL;
        }
    }
    return victim;
}

/* A fragment arrived in buf[0..len): deliver it, or the message it
 * completes.  Fragments of one stream arrive in order (they are all below
 * the provider's in-order size). */
void epd__ofi_recv_frag(epd__ofi_t *be, const unsigned char *buf, size_t len)
{
    epd__ofi_frag_t fh;
    epd__ofi_reasm_t *r;
    size_t n;

    if (len < sizeof(fh)) {
        epd_log_warn(EPD__OFI_LOG, 0, "dropped a %zu-byte message: no fragment header", len);
        return;
    }
    memcpy(&fh, buf, sizeof(fh));
    n = len - sizeof(fh);
    if (n == 0 || fh.total == 0 || fh.total > be->max_total || fh.offset >= fh.total ||
        n > fh.total - fh.offset) {
        epd_log_warn(EPD__OFI_LOG, 0, "dropped a malformed fragment (%zu bytes, at %u of %u)", len,
                     fh.offset, fh.total);
        return;
    }
    if (fh.offset == 0 && n == fh.total) {
        epd__xport_deliver(be->core, buf + sizeof(fh), n);
        return;
    }
    r = epd__ofi_reasm_find(be, fh.stream, fh.offset == 0);
    if (fh.offset == 0) {
        if (r == NULL) {
            epd_log_error(EPD__OFI_LOG, 0, "no memory to reassemble a %u-byte message", fh.total);
            return;
        }
        if (r->active) {
            epd_log_warn(EPD__OFI_LOG, 0, "dropped a partial %u-byte message (new one began)",
                         r->total);
        }
        r->stream = fh.stream;
        r->total = fh.total;
        r->got = 0;
        r->active = true;
    } else if (r == NULL || r->got != fh.offset || r->total != fh.total) {
        epd_log_warn(EPD__OFI_LOG, 0, "dropped a fragment out of sequence (at %u of %u)", fh.offset,
                     fh.total);
        if (r != NULL) {
            r->active = false;
        }
        return;
    }
    memcpy(r->buf + fh.offset, buf + sizeof(fh), n);
    r->got += (uint32_t)n;
    r->last_use = ++be->reasm_clock;
    if (r->got == r->total) {
        r->active = false;
        epd__xport_deliver(be->core, r->buf, r->total);
    }
}

epd_status_t epd__ofi_send(void *arg, const void *hdr, size_t hdr_len, const void *payload,
                           size_t len)
{
    epd__ofi_ep_t *ep = arg;
    epd__ofi_t *be;
    epd__ofi_xfer_t *first = NULL;
    epd__ofi_xfer_t *last = NULL;
    epd__ofi_frag_t fh;
    size_t total;
    size_t fpay;
    size_t nfrag;
    uint32_t inflight;
    epd_status_t status;
    ssize_t ret;

    if (ep == NULL || (hdr == NULL && hdr_len != 0) || (payload == NULL && len != 0)) {
        return EPD_ERR_INVALID_PARAM;
    }
    be = ep->be;
    status = epd__ofi_ep_state(ep);
    if (status != EPD_OK) {
        return status;
    }
    total = hdr_len + len;
    if (total < hdr_len || total > be->max_total) {
        return EPD_ERR_TOO_LONG;
    }
    if (total == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    fh.stream = ep->stream;
    fh.total = (uint32_t)total;
    fh.offset = 0;

    if (total + sizeof(fh) <= be->inject_size && ep->backlog == NULL) {
        memcpy(be->inject_buf, &fh, sizeof(fh));
        epd__ofi_gather(be->inject_buf + sizeof(fh), hdr, hdr_len, payload, 0, total);
        ret = fi_inject(be->ep, be->inject_buf, total + sizeof(fh), ep->addr);
        if (ret == 0) {
            return EPD_OK;
        }
        if (ret != -FI_EAGAIN) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_inject(%zu bytes) to %s failed: %s", total, ep->peer,
                          epd__fi.strerror((int)-ret));
            return epd__ofi_post_err(ret);
        }
        /* pushed back (rxm connects lazily): queue it in send slots */
    }

    fpay = be->frag_size - sizeof(fh);
    nfrag = (total + fpay - 1) / fpay;
    if (nfrag > be->tx_nfree) {
        epd__ofi_nudge(be);
        return EPD_ERR_NO_RESOURCE;
    }
    /* copy the whole message now (copy semantics), fragment by fragment */
    for (size_t off = 0; off < total; off += fpay) {
        epd__ofi_xfer_t *x = be->tx_free;
        size_t n = total - off < fpay ? total - off : fpay;

        be->tx_free = x->next_free;
        be->tx_nfree--;
        x->next_free = NULL;
        x->ep = NULL;
        fh.offset = (uint32_t)off;
        memcpy(x->buf, &fh, sizeof(fh));
        epd__ofi_gather(x->buf + sizeof(fh), hdr, hdr_len, payload, off, n);
        x->len = sizeof(fh) + n;
        if (last != NULL) {
            last->next_free = x;
        } else {
            first = x;
        }
        last = x;
    }

    if (ep->backlog != NULL) {
        /* earlier fragments wait: queue behind them to keep the order */
        ep->backlog_tail->next_free = first;
        ep->backlog_tail = last;
        return EPD_OK;
    }
    /*
     * The bytes are copied into slots of a bounded pool, so when the
     * provider pushes back (-FI_EAGAIN: rxm is still connecting, or its
     * queues are full) the fragments wait in the endpoint's backlog and go
     * out, in order, from progress; EPD_ERR_NO_RESOURCE is left for an
     * empty pool.
     */
    ep->backlog = first;
    ep->backlog_tail = last;
    inflight = ep->inflight;
    status = epd__ofi_backlog_post(be, ep);
    if (status == EPD_OK) {
        return EPD_OK;
    }
    if (status == EPD_ERR_NO_RESOURCE) {
        epd__ofi_nudge(be);
        return EPD_OK;
    }
    if (ep->inflight == inflight) {
        /* nothing of this message went out (the backlog dropped it): refuse */
        return status;
    }
    /* torn message: the endpoint is unusable; reported from progress */
    ep->failed = status;
    return EPD_OK;
}
