/*
 * epd_xport_ucx_ep.c — endpoints: creation from a checked address blob, the
 * lanes UCX chose and their class, destruction (every op held completes
 * first), and the writes in limbo.
 */
#include "epd_xport_ucx_int.h"

static const char *epd__ucx_tl_class(const char *tl)
{
    static const char *const shm[] = {"posix", "sysv", "cma", "knem", "xpmem", "self"};
    static const char *const rdma[] = {"rc", "dc", "ud", "ib", "gga", "srd", "efa"};

    for (size_t i = 0; i < sizeof(shm) / sizeof(shm[0]); i++) {
        if (strncmp(tl, shm[i], strlen(shm[i])) == 0) {
            return "shm";
        }
    }
    if (strncmp(tl, "tcp", 3) == 0) {
        return "tcp";
    }
    for (size_t i = 0; i < sizeof(rdma) / sizeof(rdma[0]); i++) {
        if (strncmp(tl, rdma[i], strlen(rdma[i])) == 0) {
            return "rdma";
        }
    }
    return "other";
}

/* Parses ucp_ep_print_info: lines like
 *   "#   lane[0]:  1:posix/memory.0 md[1]  -> md[1]/posix/sysdev[255] am am_bw#0"
 * into "posix/memory.0(am,am_bw#0) cma/memory.0(rma_bw#0)" and the class of
 * the lane carrying active messages (messages and non-direct writes). */
static void epd__ucx_ep_lanes(epd__ucx_ep_t *ep)
{
    char *text = NULL, *line, *save = NULL;
    size_t text_len = 0, used = 0;
    char am_tl[64] = "";
    FILE *f = open_memstream(&text, &text_len);

    ep->desc[0] = '\0';
    ep->cls = "other";
    if (f == NULL) {
        return;
    }
    ucp_ep_print_info(ep->ep, f);
    fclose(f);
    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *p = strstr(line, "lane[");
        char tl[64], tags[128];
        char *arrow, *tok, *tsave = NULL;
        size_t tused = 0;
        bool am = false;
        int n;

        if (p == NULL || (p = strchr(p, ':')) == NULL) {
            continue;
        }
        /* "  1:posix/memory.0 md[1] ..." : the resource after "N:" */
        while (*++p == ' ') {
        }
        p = strchr(p, ':');
        if (p == NULL || sscanf(p + 1, "%63s", tl) != 1) {
            continue;
        }
        tags[0] = '\0';
        arrow = strstr(p, "->");
        if (arrow != NULL) {
            tok = strtok_r(arrow + 2, " ", &tsave); /* md[1]/posix/sysdev[255] */
            while ((tok = strtok_r(NULL, " ", &tsave)) != NULL) {
                n = snprintf(tags + tused, sizeof(tags) - tused, "%s%s", tused ? "," : "", tok);
                if (n < 0 || (size_t)n >= sizeof(tags) - tused) {
                    break;
                }
                tused += (size_t)n;
                if (strcmp(tok, "am") == 0) {
                    am = true;
                }
            }
        }
        if (am && am_tl[0] == '\0') {
            snprintf(am_tl, sizeof(am_tl), "%s", tl);
        }
        n = snprintf(ep->desc + used, sizeof(ep->desc) - used, "%s%s(%s)", used ? " " : "", tl,
                     tags);
        if (n < 0 || (size_t)n >= sizeof(ep->desc) - used) {
            break;
        }
        used += (size_t)n;
    }
    free(text);
    if (am_tl[0] != '\0') {
        ep->cls = epd__ucx_tl_class(am_tl);
    }
    ep->shm = strcmp(ep->cls, "shm") == 0;
    if (used < sizeof(ep->desc)) {
        snprintf(ep->desc + used, sizeof(ep->desc) - used, "; class %s; writes: %s", ep->cls,
                 ep->shm ? "put into ucx-allocated regions, else am-rndv" : "am-rndv");
    }
}

epd_status_t epd__ucx_ep_create(void *arg, const void *blob, size_t len, epd_xport_ep_t *core_ep,
                                void **be_ep_p)
{
    epd__ucx_t *be = arg;
    epd__ucx_addr_wire_t w;
    const unsigned char *ucx_addr;
    ucp_ep_params_t ep_params;
    epd__ucx_ep_t *ep;
    ucs_status_t s;

    if (blob == NULL || len < sizeof(w)) {
        return EPD_ERR_BAD_ADDRESS;
    }
    memcpy(&w, blob, sizeof(w));
    ucx_addr = (const unsigned char *)blob + sizeof(w);
    if (w.magic != EPD__UCX_ADDR_MAGIC || w.version != EPD__UCX_WIRE_VERSION || w.ucx_len == 0 ||
        w.ucx_len != len - sizeof(w) || epd_hash64(ucx_addr, w.ucx_len, w.ucx_len) != w.hash) {
        epd_log_debug(EPD__UCX_COMP, 0, "refusing a malformed address blob of %zu bytes", len);
        return EPD_ERR_BAD_ADDRESS;
    }
    ep = epd_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    ep->be = be;
    ep->core_ep = core_ep;
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep_params.address = (const ucp_address_t *)ucx_addr;
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    s = ucp_ep_create(be->worker, &ep_params, &ep->ep);
    if (s != UCS_OK) {
        epd_log_warn(EPD__UCX_COMP, 0, "ucp_ep_create failed: %s", ucs_status_string(s));
        epd_free(ep);
        /* the blob passed its checksum: it is a real address of a worker
         * that cannot be reached (gone, or no common transport) */
        return EPD_ERR_UNREACHABLE;
    }
    epd__ucx_ep_lanes(ep);
    EPD_LIST_INSERT_HEAD(be->eps, ep);
    *be_ep_p = ep;
    return EPD_OK;
}

void epd__ucx_ep_destroy(void *arg)
{
    epd__ucx_ep_t *ep = arg;
    epd__ucx_t *be = ep->be;
    epd__xport_op_t *mine = NULL, *op, *next;
    ucp_request_param_t p;
    bool flushed = true;
    void *req;

    /* A bounded flush first: it completes only once the wire-up of every
     * lane did (a half-wired tcp lane next to posix/sysv left to
     * ucp_worker_destroy aborts UCX 1.13.1 at ucp_request.c:684, "got REQ
     * message").  Writes that land meanwhile complete with EPD_OK. */
    memset(&p, 0, sizeof(p));
    req = ucp_ep_flush_nbx(ep->ep, &p);
    if (UCS_PTR_IS_PTR(req)) {
        uint64_t deadline = epd_time_now_ns() + EPD__UCX_FLUSH_WAIT_NS;
        while (ucp_request_check_status(req) == UCS_INPROGRESS && epd_time_now_ns() < deadline) {
            ucp_worker_progress(be->worker);
        }
        if (ucp_request_check_status(req) == UCS_INPROGRESS) {
            /* a dead or stopped peer: wire-up may never finish */
            be->half_wired = true;
            flushed = false;
        }
        ucp_request_free(req);
    }
    /* Then a flushing close (flags 0).  A forced close is refused with
     * UCS_ERR_INVALID_PARAM for endpoints of UCP_ERR_HANDLING_MODE_NONE
     * (ucp_ep.c, ucp_ep_close_nbx) and closes nothing: the endpoint stayed
     * connected until ucp_worker_destroy, and a put acknowledgement the peer
     * still sent to it tripped tcp_ep.c:939 (PUT_TX_WAITING_ACK) in the
     * conformance suite.  After a flush that completed the close completes
     * at once; after one that did not (the peer is stopped or gone) it is
     * not waited for — it completes when the peer answers or fails, or is
     * purged with the worker — so a closing loop thread never blocks past
     * the flush bound. */
    memset(&p, 0, sizeof(p));
    req = ucp_ep_close_nbx(ep->ep, &p);
    if (UCS_PTR_IS_ERR(req)) {
        /* a lane failed earlier (the peer died): the endpoint is
         * disconnected all the same, the status only repeats the failure */
        epd_log_debug(EPD__UCX_COMP, 0, "ucx endpoint closed after a transport error: %s",
                      ucs_status_string(UCS_PTR_STATUS(req)));
    } else if (UCS_PTR_IS_PTR(req)) {
        uint64_t deadline = epd_time_now_ns() + (flushed ? EPD__UCX_CLOSE_WAIT_NS : 0);

        while (ucp_request_check_status(req) == UCS_INPROGRESS && epd_time_now_ns() < deadline) {
            ucp_worker_progress(be->worker);
        }
        ucp_request_free(req);
    }
    /* what UCX did not complete in the close: each op is completed here,
     * exactly once; the request stays UCX's (its header and source may
     * still be read) as an orphan until its callback — not freed, which
     * would only suppress that callback */
    while (ep->out_head != NULL) {
        epd__ucx_wr_t *wr;

        op = ep->out_head;
        epd__ucx_out_remove(op);
        wr = EPD__UCX_OP(op)->wr;
        EPD__UCX_OP(op)->wr = NULL;
        if (wr != NULL) {
            wr->op = NULL;
            wr->peer_xid = epd__xport_ep_peer(ep->core_ep);
            EPD_LIST_INSERT_HEAD(be->orphans, wr);
            be->n_orphans++;
        }
        epd__ucx_done_add(be, op, EPD_ERR_CANCELED);
    }
    /* send copies UCX still holds stay UCX's until their callback (which
     * frees them): orphans of the backend, not of this endpoint */
    while (ep->tx_head != NULL) {
        epd__ucx_tx_t *tx = ep->tx_head;

        epd__ucx_tx_unlink(tx);
        tx->ep = NULL;
        EPD_LIST_INSERT_HEAD(be->tx_orphans, tx);
    }
    /* take this endpoint's finished ops off the shared done list first:
     * completing them runs user callbacks that may add to it */
    for (op = be->done_head; op != NULL; op = next) {
        next = EPD__UCX_OP(op)->next;
        if (EPD__UCX_OP(op)->ep == ep) {
            epd__ucx_done_remove(be, op);
            EPD__UCX_OP(op)->next = mine;
            mine = op;
        }
    }
    if (ep->fail_listed) {
        epd__ucx_ep_t **pp = &be->fail_list;
        while (*pp != NULL && *pp != ep) {
            pp = &(*pp)->fail_next;
        }
        if (*pp == ep) {
            *pp = ep->fail_next;
        }
    }
    EPD_LIST_REMOVE(be->eps, ep);
    epd_free(ep);
    while (mine != NULL) {
        op = mine;
        mine = EPD__UCX_OP(op)->next;
        EPD__UCX_OP(op)->next = NULL;
        epd__xport_op_done(op, (epd_status_t)EPD__UCX_OP(op)->status);
    }
}

void epd__ucx_ep_describe(void *arg, char *buf, size_t len, const char **class_p)
{
    epd__ucx_ep_t *ep = arg;

    snprintf(buf, len, "%s", ep->desc);
    *class_p = ep->cls;
}

uint32_t epd__ucx_limbo(void *arg, uint64_t peer_xid)
{
    epd__ucx_t *be = arg;
    uint32_t n = 0;

    if (peer_xid == 0) {
        return be->n_orphans;
    }
    for (const epd__ucx_wr_t *wr = be->orphans; wr != NULL; wr = wr->next) {
        n += wr->peer_xid == peer_xid;
    }
    return n;
}
