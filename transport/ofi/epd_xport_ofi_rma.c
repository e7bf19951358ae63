/*
 * epd_xport_ofi_rma.c — RMA: writes and flushes, posted in parts, retried
 * under backpressure by the sweep of each endpoint.
 */
#include "epd_xport_ofi_int.h"

/* The lowest write ordinal still outstanding on ep. */
static uint64_t epd__ofi_oldest_write(const epd__ofi_ep_t *ep)
{
    return ep->writes != NULL ? ep->writes->seq : ep->write_seq;
}

/* Finishes a write whose parts are all done: unlinks, frees, completes.
 * Runs an upcall. */
void epd__ofi_write_finish(epd__ofi_t *be, epd__ofi_req_t *req)
{
    epd__xport_op_t *op = req->op;
    epd_status_t status = req->status;
    epd__ofi_ep_t *ep = req->ep;

    if (ep != NULL) {
        epd__ofi_list_remove(&ep->writes, &ep->writes_tail, req);
    }
    epd__ofi_req_put(be, req);
    if (op != NULL) {
        epd__xport_op_done(op, status);
    }
}

void epd__ofi_flush_finish(epd__ofi_t *be, epd__ofi_req_t *req, epd_status_t status)
{
    epd__xport_op_t *op = req->op;
    epd__ofi_ep_t *ep = req->ep;

    if (ep != NULL) {
        epd__ofi_list_remove(&ep->flushes, &ep->flushes_tail, req);
    }
    epd__ofi_req_put(be, req);
    if (op != NULL) {
        epd__xport_op_done(op, status);
    }
}

/* Posts as many remaining parts of `req` as the provider takes.  Returns
 * EPD_OK (all posted), EPD_ERR_NO_RESOURCE (some remain: retry later) or an
 * error (posting stopped; req->status set). */
static epd_status_t epd__ofi_write_post(epd__ofi_t *be, epd__ofi_req_t *req)
{
    uint64_t flags = FI_COMPLETION | (be->dc ? FI_DELIVERY_COMPLETE : 0);

    while (req->posted < req->len) {
        size_t chunk = req->len - req->posted;
        epd__ofi_xfer_t *x;
        struct iovec iov;
        struct fi_rma_iov riov;
        struct fi_msg_rma msg;
        ssize_t ret;

        if (chunk > be->write_chunk) {
            chunk = be->write_chunk;
        }
        x = epd__ofi_part_get(be, req);
        if (x == NULL) {
            return EPD_ERR_NO_RESOURCE;
        }
        iov.iov_base = (void *)(req->local + req->posted);
        iov.iov_len = chunk;
        riov.addr = req->raddr + req->posted;
        riov.len = chunk;
        riov.key = req->key;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = &iov;
        msg.desc = &req->desc;
        msg.iov_count = 1;
        msg.addr = req->ep->addr;
        msg.rma_iov = &riov;
        msg.rma_iov_count = 1;
        msg.context = x;
        ret = fi_writemsg(be->ep, &msg, flags);
        if (ret != 0) {
            epd__ofi_part_put(be, x);
            if (ret == -FI_EAGAIN) {
                epd_log_trace(EPD__OFI_LOG, 0, "fi_writemsg(%zu bytes) to %s: pushed back", chunk,
                              req->ep->peer);
                return EPD_ERR_NO_RESOURCE;
            }
            epd_log_error(EPD__OFI_LOG, 0, "fi_writemsg(%zu bytes) to %s failed: %s", chunk,
                          req->ep->peer, epd__fi.strerror((int)-ret));
            if (req->status == EPD_OK) {
                req->status = epd__ofi_post_err(ret);
            }
            return req->status;
        }
        req->parts_out++;
        req->posted += chunk;
        x->ep = req->ep;
        req->ep->inflight++;
        if (!be->dc) {
            req->ep->have_flush_target = true;
            req->ep->flush_raddr = req->sink_addr;
            req->ep->flush_key = req->sink_key;
        }
    }
    return EPD_OK;
}

/* Posts the ordering read of a flush (non-DC providers). */
static epd_status_t epd__ofi_flush_read(epd__ofi_t *be, epd__ofi_req_t *req)
{
    epd__ofi_ep_t *ep = req->ep;
    epd__ofi_xfer_t *x = epd__ofi_part_get(be, req);
    ssize_t ret;

    if (x == NULL) {
        return EPD_ERR_NO_RESOURCE;
    }
    ret = fi_read(be->ep, be->scratch, 1, epd__ofi_desc(be, be->scratch_mr), ep->addr,
                  ep->flush_raddr, ep->flush_key, x);
    if (ret != 0) {
        epd__ofi_part_put(be, x);
        if (ret == -FI_EAGAIN) {
            return EPD_ERR_NO_RESOURCE;
        }
        epd_log_error(EPD__OFI_LOG, 0, "fi_read (flush) from %s failed: %s", ep->peer,
                      epd__fi.strerror((int)-ret));
        return epd__ofi_post_err(ret);
    }
    req->parts_out++;
    req->reading = true;
    x->ep = ep;
    ep->inflight++;
    return EPD_OK;
}

/* Does the queued work of one endpoint: posts pending write parts, retires
 * ready flushes.  Returns true after running an upcall (the endpoint list
 * may have changed: the caller restarts its walk). */
static bool epd__ofi_ep_sweep(epd__ofi_t *be, epd__ofi_ep_t *ep)
{
    if (ep->backlog != NULL) {
        epd_status_t status = ep->failed;

        if (status == EPD_OK) {
            status = epd__ofi_backlog_post(be, ep);
        }
        if (status != EPD_OK && status != EPD_ERR_NO_RESOURCE) {
            epd__ofi_xfer_t *x;

            while ((x = ep->backlog) != NULL) {
                ep->backlog = x->next_free;
                epd__ofi_tx_put(be, x);
            }
            ep->backlog_tail = NULL;
            if (ep->failed == EPD_OK) {
                ep->failed = status;
            }
        }
    }
    if (ep->failed != EPD_OK && !ep->fail_reported) {
        epd__ofi_ep_fail(ep, ep->failed);
        return true;
    }
    if (ep->unposted != 0) {
        for (epd__ofi_req_t *req = ep->writes; req != NULL; req = req->next) {
            epd_status_t status;

            if (!req->queued) {
                continue;
            }
            if (ep->failed != EPD_OK) {
                status = ep->failed;
                if (req->status == EPD_OK) {
                    req->status = status;
                }
            } else {
                status = epd__ofi_write_post(be, req);
                if (status == EPD_ERR_NO_RESOURCE) {
                    break;
                }
            }
            /* all posted, or posting stopped for good */
            if (status != EPD_OK) {
                req->posted = req->len;
            }
            req->queued = false;
            ep->unposted--;
            if (req->parts_out == 0) {
                epd__ofi_write_finish(be, req);
                return true;
            }
        }
    }

    if (ep->flushes != NULL) {
        epd__ofi_req_t *req = ep->flushes;

        if (ep->failed != EPD_OK && !req->reading) {
            epd__ofi_flush_finish(be, req, ep->failed);
            return true;
        }
        if (req->reading || epd__ofi_oldest_write(ep) < req->seq) {
            return false;
        }
        if (!be->dc && ep->have_flush_target) {
            epd_status_t status = epd__ofi_flush_read(be, req);

            if (status == EPD_OK || status == EPD_ERR_NO_RESOURCE) {
                return false;
            }
            epd__ofi_flush_finish(be, req, status);
            return true;
        }
        epd__ofi_flush_finish(be, req, EPD_OK);
        return true;
    }
    return false;
}

bool epd__ofi_ep_has_work(const epd__ofi_t *be, const epd__ofi_ep_t *ep)
{
    const epd__ofi_req_t *req = ep->flushes;

    if (ep->unposted != 0 || ep->backlog != NULL || (ep->failed != EPD_OK && !ep->fail_reported)) {
        return true;
    }
    if (req == NULL || req->reading) {
        return false;
    }
    (void)be;
    return ep->failed != EPD_OK || epd__ofi_oldest_write(ep) >= req->seq;
}

int epd__ofi_sweep(epd__ofi_t *be)
{
    int n = 0;

again:
    for (epd__ofi_ep_t *ep = be->eps; ep != NULL && n < EPD__OFI_SWEEP_BUDGET; ep = ep->next) {
        if (!epd__ofi_ep_has_work(be, ep)) {
            continue;
        }
        if (epd__ofi_ep_sweep(be, ep)) {
            n++;
            goto again;
        }
    }
    return n;
}

epd_status_t epd__ofi_write(void *arg, const void *local, size_t len, void *be_local_mr,
                            void *be_rkey, uint64_t remote_offset, epd__xport_op_t *op)
{
    epd__ofi_ep_t *ep = arg;
    epd__ofi_mr_t *lmr = be_local_mr;
    epd__ofi_rkey_t *rkey = be_rkey;
    epd__ofi_t *be;
    epd__ofi_req_t *req;
    epd_status_t status;

    if (ep == NULL || op == NULL || rkey == NULL || (local == NULL && len != 0)) {
        return EPD_ERR_INVALID_PARAM;
    }
    be = ep->be;
    status = epd__ofi_ep_state(ep);
    if (status != EPD_OK) {
        return status;
    }
    if (rkey->ep != ep) {
        epd_log_error(EPD__OFI_LOG, 0, "write to %s with a key unpacked on another endpoint",
                      ep->peer);
        return EPD_ERR_INVALID_PARAM;
    }
    if (remote_offset > rkey->size || len > rkey->size - remote_offset) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    req = epd__ofi_req_get(be);
    if (req == NULL) {
        epd__ofi_nudge(be);
        return EPD_ERR_NO_RESOURCE;
    }
    req->kind = EPD__OFI_REQ_WRITE;
    req->op = op;
    req->ep = ep;
    req->local = local;
    req->len = len;
    req->raddr = rkey->base + remote_offset;
    req->key = rkey->key;
    req->sink_addr = rkey->sink_addr;
    req->sink_key = rkey->sink_key;
    req->status = EPD_OK;
    /* delivery complete: the completion comes once the target placed the
     * bytes, so a fence behind this write needs no flush */
    op->delivers = be->dc ? 1 : 0;

    if ((be->mr_mode & FI_MR_LOCAL) != 0 && len != 0) {
        uintptr_t lo = (uintptr_t)local;

        if (lmr != NULL && lmr->be == be && lo >= (uintptr_t)lmr->addr && len <= lmr->size &&
            lo - (uintptr_t)lmr->addr <= lmr->size - len) {
            req->desc = fi_mr_desc(lmr->mr);
        } else {
            status = epd__ofi_reg(be, (void *)local, len, FI_WRITE, &req->tmp_mr);
            if (status != EPD_OK) {
                epd__ofi_req_put(be, req);
                return status;
            }
            req->desc = fi_mr_desc(req->tmp_mr);
        }
    }

    if (ep->unposted == 0) {
        status = epd__ofi_write_post(be, req);
        if (status != EPD_OK && status != EPD_ERR_NO_RESOURCE && req->parts_out == 0) {
            /* nothing posted: refuse, nothing queued */
            epd__ofi_req_put(be, req);
            return status;
        }
        if (status == EPD_ERR_NO_RESOURCE) {
            /* the provider pushed back: the rest is posted from progress
             * (the request pool bounds what waits) */
            epd__ofi_nudge(be);
        } else if (status != EPD_OK) {
            /* failed after some parts: finishes when they come back */
            req->posted = req->len;
        }
    }
    req->seq = ep->write_seq++;
    if (req->posted < req->len || req->parts_out == 0) {
        /* the rest is posted from progress (a zero-length write completes there) */
        req->queued = true;
        ep->unposted++;
    }
    epd__ofi_list_append(&ep->writes, &ep->writes_tail, req);
    return EPD_INPROGRESS;
}

epd_status_t epd__ofi_flush(void *arg, epd__xport_op_t *op)
{
    epd__ofi_ep_t *ep = arg;
    epd__ofi_req_t *req;
    epd_status_t status;

    if (ep == NULL || op == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    status = epd__ofi_ep_state(ep);
    if (status != EPD_OK) {
        return status;
    }
    req = epd__ofi_req_get(ep->be);
    if (req == NULL) {
        epd__ofi_nudge(ep->be);
        return EPD_ERR_NO_RESOURCE;
    }
    req->kind = EPD__OFI_REQ_FLUSH;
    req->op = op;
    req->ep = ep;
    req->seq = ep->write_seq; /* every write before this one */
    req->status = EPD_OK;
    epd__ofi_list_append(&ep->flushes, &ep->flushes_tail, req);
    return EPD_INPROGRESS;
}
