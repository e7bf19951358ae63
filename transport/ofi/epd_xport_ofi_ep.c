/*
 * epd_xport_ofi_ep.c — endpoints: an address in the AV (shm peers checked
 * first), destruction (ops given back, the address kept while the provider
 * holds any), description, and the writes in limbo.
 */
#include "epd_xport_ofi_int.h"

/*
 * Whether the shm segment named by a shm address ("fi_shm://PID:..." or
 * "PID:...") exists.  shm 1.17 crashes in fi_av_insert when the peer is an
 * endpoint of this process that was closed (it keeps a stale entry in its
 * process-wide name list), and an exited peer unlinks its segment; so an
 * address without a segment is refused before libfabric sees it.
 */
static bool epd__ofi_shm_peer_exists(const unsigned char *name, size_t len)
{
    char buf[256];
    const char *n = buf;
    int fd;

    if (len == 0 || len >= sizeof(buf)) {
        return false;
    }
    memcpy(buf, name, len);
    buf[len] = '\0';
    if (strncmp(n, "fi_shm://", 9) == 0) {
        n += 9;
    }
    if (*n == '\0' || strchr(n, '/') != NULL) {
        return false;
    }
    fd = shm_open(n, O_RDONLY, 0);
    if (fd < 0) {
        return false;
    }
    close(fd);
    return true;
}

epd_status_t epd__ofi_ep_create(void *arg, const void *blob, size_t len, epd_xport_ep_t *core_ep,
                                void **be_ep_p)
{
    epd__ofi_t *be = arg;
    epd__ofi_addr_hdr_t hdr;
    const unsigned char *name;
    epd__ofi_av_entry_t *e;
    epd__ofi_ep_t *ep;
    size_t straddr_len;
    int ret;

    if (be == NULL || be_ep_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (blob == NULL || len < sizeof(hdr)) {
        epd_log_warn(EPD__OFI_LOG, 0, "address blob refused: %zu bytes, header needs %zu", len,
                     sizeof(hdr));
        return EPD_ERR_BAD_ADDRESS;
    }
    memcpy(&hdr, blob, sizeof(hdr));
    if (hdr.magic != EPD__OFI_ADDR_MAGIC || hdr.version != EPD__OFI_WIRE_VERSION ||
        hdr.hdr_len != sizeof(hdr) || hdr.name_len == 0 || hdr.name_len > EPD__OFI_MAX_NAME ||
        (size_t)hdr.name_len != len - sizeof(hdr) ||
        hdr.check != epd__ofi_blob_check(&hdr, sizeof(hdr),
                                         (const unsigned char *)blob + sizeof(hdr), hdr.name_len)) {
        epd_log_warn(EPD__OFI_LOG, 0,
                     "address blob refused: not an intact ofi address of this version "
                     "(%zu bytes)",
                     len);
        return EPD_ERR_BAD_ADDRESS;
    }
    if (hdr.addr_format != be->info->addr_format ||
        memchr(hdr.prov, '\0', sizeof(hdr.prov)) == NULL ||
        strncmp(hdr.prov, epd__ofi_prov(be), sizeof(hdr.prov)) != 0) {
        epd_log_warn(EPD__OFI_LOG, 0,
                     "address blob refused: peer uses provider %.*s (address format %u), "
                     "this worker %s (%u)",
                     (int)sizeof(hdr.prov), hdr.prov, hdr.addr_format, epd__ofi_prov(be),
                     be->info->addr_format);
        return EPD_ERR_BAD_ADDRESS;
    }
    name = (const unsigned char *)blob + sizeof(hdr);

    ep = epd_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    ep->be = be;
    ep->core_ep = core_ep;
    ep->stream = be->nonce + ++be->ep_serial;
    for (e = be->av_entries; e != NULL; e = e->next) {
        if (e->name_len == hdr.name_len && memcmp(e->name, name, e->name_len) == 0) {
            break;
        }
    }
    if (e == NULL && epd__ofi_is_shm(epd__ofi_prov(be)) &&
        !epd__ofi_shm_peer_exists(name, hdr.name_len)) {
        epd_log_warn(EPD__OFI_LOG, 0, "shm peer %.*s is gone (no segment)", (int)hdr.name_len,
                     (const char *)name);
        epd_free(ep);
        return EPD_ERR_UNREACHABLE;
    }
    if (e == NULL) {
        e = epd_malloc(sizeof(*e) + hdr.name_len);
        if (e == NULL) {
            epd_free(ep);
            return EPD_ERR_NO_MEMORY;
        }
        e->name_len = hdr.name_len;
        memcpy(e->name, name, hdr.name_len);
        e->refs = 0;
        ret = fi_av_insert(be->av, e->name, 1, &e->addr, 0, NULL);
        if (ret != 1) {
            epd_log_warn(EPD__OFI_LOG, 0, "address blob refused: fi_av_insert: %s",
                         ret < 0 ? epd__fi.strerror(-ret) : "address not inserted");
            epd_free(e);
            epd_free(ep);
            return EPD_ERR_BAD_ADDRESS;
        }
        e->next = be->av_entries;
        be->av_entries = e;
    }
    e->refs++;
    ep->av = e;
    ep->addr = e->addr;
    straddr_len = sizeof(ep->peer);
    if (fi_av_straddr(be->av, e->name, ep->peer, &straddr_len) == NULL) {
        snprintf(ep->peer, sizeof(ep->peer), "fi_addr %llu", (unsigned long long)ep->addr);
    }
    EPD_LIST_INSERT_HEAD(be->eps, ep);
    *be_ep_p = ep;
    return EPD_OK;
}

void epd__ofi_ep_destroy(void *arg)
{
    epd__ofi_ep_t *ep = arg;
    epd__ofi_t *be;
    epd__ofi_req_t *done = NULL;
    epd__ofi_req_t *req;

    if (ep == NULL) {
        return;
    }
    be = ep->be;
    ep->closing = true;

    /* Detach everything first; the upcalls below may re-enter. */
    EPD_LIST_REMOVE(be->eps, ep);
    while (ep->backlog != NULL) {
        epd__ofi_xfer_t *x = ep->backlog;

        ep->backlog = x->next_free;
        epd__ofi_tx_put(be, x);
    }
    while ((req = ep->writes) != NULL || (req = ep->flushes) != NULL) {
        if (req->kind == EPD__OFI_REQ_WRITE) {
            epd__ofi_list_remove(&ep->writes, &ep->writes_tail, req);
        } else {
            epd__ofi_list_remove(&ep->flushes, &ep->flushes_tail, req);
        }
        req->ep = NULL;
        req->next = done;
        done = req;
    }
    if (ep->inflight == 0) {
        epd__ofi_ep_free(be, ep);
    } else {
        EPD_LIST_INSERT_HEAD(be->zombies, ep);
    }

    while ((req = done) != NULL) {
        epd__xport_op_t *op = req->op;

        done = req->next;
        req->next = NULL;
        req->op = NULL;
        if (req->parts_out == 0) {
            epd__ofi_req_put(be, req);
        } else {
            /* an orphan, freed when the provider returns its parts: its
             * bytes may still move meanwhile (limbo) */
            req->peer_xid = epd__xport_ep_peer(ep->core_ep);
            be->n_orphans++;
        }
        if (op != NULL) {
            epd__xport_op_done(op, EPD_ERR_CANCELED);
        }
    }
}

void epd__ofi_ep_describe(void *arg, char *buf, size_t len, const char **class_p)
{
    epd__ofi_ep_t *ep = arg;
    const char *cls = "other";
    char core_prov[32];
    size_t n;

    if (ep == NULL) {
        return;
    }
    n = strcspn(epd__ofi_prov(ep->be), ";");
    snprintf(core_prov, sizeof(core_prov), "%.*s", (int)n, epd__ofi_prov(ep->be));
    if (strcmp(core_prov, "shm") == 0) {
        cls = "shm";
    } else if (strcmp(core_prov, "tcp") == 0 || strcmp(core_prov, "net") == 0 ||
               strcmp(core_prov, "sockets") == 0 || strcmp(core_prov, "ofi_rxm") == 0) {
        cls = "tcp";
    } else if (strcmp(core_prov, "verbs") == 0 || strcmp(core_prov, "efa") == 0 ||
               strncmp(core_prov, "psm", 3) == 0 || strcmp(core_prov, "opx") == 0 ||
               strcmp(core_prov, "cxi") == 0) {
        cls = "rdma";
    }
    if (buf != NULL && len != 0) {
        snprintf(buf, len, "ofi %s fabric %s domain %s peer %s", epd__ofi_prov(ep->be),
                 ep->be->info->fabric_attr->name, ep->be->info->domain_attr->name, ep->peer);
    }
    if (class_p != NULL) {
        *class_p = cls;
    }
}

uint32_t epd__ofi_limbo(void *arg, uint64_t peer_xid)
{
    epd__ofi_t *be = arg;
    uint32_t n = 0;

    if (peer_xid == 0 || be->n_orphans == 0) {
        return be->n_orphans;
    }
    for (size_t i = 0; i < be->req_count; i++) {
        const epd__ofi_req_t *r = &be->reqs[i];

        n += r->op == NULL && r->parts_out > 0 && r->peer_xid == peer_xid;
    }
    return n;
}
