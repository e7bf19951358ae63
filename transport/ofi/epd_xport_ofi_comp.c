/*
 * epd_xport_ofi_comp.c — completions: the CQ read and what each completion
 * means (a part done, a fragment received, an error), endpoint references, and
 * progress.
 */
#include "epd_xport_ofi_int.h"

static void epd__ofi_part_done(epd__ofi_t *be, epd__ofi_xfer_t *x, epd_status_t status)
{
    epd__ofi_req_t *req = x->req;

    epd__ofi_part_put(be, x);
    req->parts_out--;
    if (status != EPD_OK && req->status == EPD_OK) {
        req->status = status;
    }
    if (req->parts_out != 0) {
        return;
    }
    if (req->op == NULL) {
        /* orphan: its op completed when its endpoint was destroyed */
        be->n_orphans--;
        epd__ofi_req_put(be, req);
        return;
    }
    if (req->kind == EPD__OFI_REQ_FLUSH) {
        epd__ofi_flush_finish(be, req, req->status);
        return;
    }
    if (!req->queued) {
        epd__ofi_write_finish(be, req);
    } else if (req->status != EPD_OK && req->ep != NULL) {
        /* an error while parts remain: give up on the rest */
        req->posted = req->len;
        req->queued = false;
        req->ep->unposted--;
        epd__ofi_write_finish(be, req);
    }
}

/* Drops an endpoint's reference on its address; the last one removes the
 * address from the AV (once per distinct address: shm's fi_av_remove drops
 * the peer on the first remove, whatever the insert count). */
static void epd__ofi_av_unref(epd__ofi_t *be, epd__ofi_av_entry_t *e)
{
    epd__ofi_av_entry_t **pp;
    int ret;

    if (--e->refs != 0) {
        return;
    }
    if (be->av != NULL) {
        ret = fi_av_remove(be->av, &e->addr, 1, 0);
        if (ret != 0) {
            epd_log_warn(EPD__OFI_LOG, 0, "fi_av_remove(fi_addr %llu): %s",
                         (unsigned long long)e->addr, epd__fi.strerror(-ret));
        }
    }
    for (pp = &be->av_entries; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    epd_free(e);
}

/* Frees a destroyed endpoint (already unlinked). */
void epd__ofi_ep_free(epd__ofi_t *be, epd__ofi_ep_t *ep)
{
    epd__ofi_av_unref(be, ep->av);
    epd_free(ep);
}

/* Drops the reference of a completed send or part on its endpoint. */
static void epd__ofi_ep_unref(epd__ofi_t *be, epd__ofi_ep_t *ep)
{
    if (ep == NULL) {
        return;
    }
    ep->inflight--;
    if (ep->closing && ep->inflight == 0) {
        EPD_LIST_REMOVE(be->zombies, ep);
        epd__ofi_ep_free(be, ep);
    }
}

static void epd__ofi_handle(epd__ofi_t *be, void *ctx, size_t len, epd_status_t status,
                            bool peer_gone)
{
    epd__ofi_xfer_t *x = ctx;
    epd__ofi_ep_t *ep;

    switch (x->kind) {
    case EPD__OFI_X_RECV:
        x->posted = false;
        be->rx_unposted++;
        if (status == EPD_OK) {
            epd__ofi_recv_frag(be, x->buf, len);
        }
        return;
    case EPD__OFI_X_SEND:
        ep = x->ep;
        if (status != EPD_OK && peer_gone && ep != NULL) {
            /* may destroy the endpoint: it then lives on as a zombie, as
             * this send still holds a reference */
            epd__ofi_ep_fail(ep, status);
        }
        epd__ofi_tx_put(be, x);
        epd__ofi_ep_unref(be, ep);
        return;
    case EPD__OFI_X_PART:
        ep = x->ep;
        if (status == EPD_OK && x->req->ep != NULL &&
            (be->dc || x->req->kind == EPD__OFI_REQ_FLUSH)) {
            /* the peer placed the data (or answered the read): alive */
            epd__xport_ep_alive(x->req->ep->core_ep);
        }
        if (status != EPD_OK && peer_gone && x->req->ep != NULL) {
            /* may destroy the endpoint; x->req survives (parts_out > 0) */
            epd__ofi_ep_fail(x->req->ep, status);
        }
        epd__ofi_part_done(be, x, status);
        epd__ofi_ep_unref(be, ep);
        return;
    }
}

static int epd__ofi_read_cq(epd__ofi_t *be)
{
    struct fi_cq_data_entry entries[EPD__OFI_CQ_BATCH];
    int handled = 0;
    int empty = 0;

    while (handled < EPD__OFI_CQ_BUDGET) {
        ssize_t n = fi_cq_read(be->cq, entries, EPD__OFI_CQ_BATCH);

        if (n == -FI_EAGAIN) {
            if (++empty >= EPD__OFI_CQ_EMPTY_TRIES) {
                break;
            }
            continue;
        }
        empty = 0;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err;
            char text[256];
            epd_status_t status;
            bool gone;

            memset(&err, 0, sizeof(err));
            n = fi_cq_readerr(be->cq, &err, 0);
            if (n != 1) {
                break;
            }
            handled++;
            status = epd__ofi_map_err(err.err, &gone);
            if (err.op_context == NULL) {
                epd_log_warn(
                    EPD__OFI_LOG, 0, "completion error without context: %s (%s)",
                    epd__fi.strerror(err.err),
                    fi_cq_strerror(be->cq, err.prov_errno, err.err_data, text, sizeof(text)));
                continue;
            }
            if (((epd__ofi_xfer_t *)err.op_context)->kind != EPD__OFI_X_RECV ||
                err.err != FI_ECANCELED) {
                epd_log_debug(
                    EPD__OFI_LOG, 0, "completion error: %s (%s)", epd__fi.strerror(err.err),
                    fi_cq_strerror(be->cq, err.prov_errno, err.err_data, text, sizeof(text)));
            }
            epd__ofi_handle(be, err.op_context, 0, status, gone);
            continue;
        }
        if (n < 0) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_cq_read failed: %s", epd__fi.strerror((int)-n));
            break;
        }
        for (ssize_t i = 0; i < n; i++) {
            if (entries[i].op_context != NULL) {
                epd__ofi_handle(be, entries[i].op_context, entries[i].len, EPD_OK, false);
            }
        }
        handled += (int)n;
    }
    return handled;
}

int epd__ofi_progress(void *arg)
{
    epd__ofi_t *be = arg;
    int n;

    if (be == NULL) {
        return 0;
    }
    n = epd__ofi_read_cq(be);
    epd__ofi_post_recvs(be);
    n += epd__ofi_sweep(be);
    return n;
}

epd_status_t epd__ofi_get_fd(void *arg, int *fd_p)
{
    epd__ofi_t *be = arg;

    if (be == NULL || fd_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (be->wait_fd < 0) {
        return EPD_ERR_UNSUPPORTED;
    }
    *fd_p = be->wait_fd;
    return EPD_OK;
}

epd_status_t epd__ofi_arm(void *arg)
{
    epd__ofi_t *be = arg;
    struct fid *fids[1];
    int ret;

    if (be == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (be->wait_fd < 0) {
        return EPD_ERR_UNSUPPORTED;
    }
    /* queued work of ours is invisible to the fd */
    if (be->rx_unposted != 0) {
        return EPD_ERR_BUSY;
    }
    for (const epd__ofi_ep_t *ep = be->eps; ep != NULL; ep = ep->next) {
        if (epd__ofi_ep_has_work(be, ep)) {
            return EPD_ERR_BUSY;
        }
    }
    fids[0] = &be->cq->fid;
    ret = fi_trywait(be->fabric, fids, 1);
    if (ret == 0) {
        return EPD_OK;
    }
    if (ret == -FI_EAGAIN) {
        return EPD_ERR_BUSY;
    }
    epd_log_error(EPD__OFI_LOG, 0, "fi_trywait failed: %s", epd__fi.strerror(-ret));
    return EPD_ERR_TRANSPORT;
}
