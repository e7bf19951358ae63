/*
 * epd_xport_ofi_util.c — the backend's base: blob envelopes, provider names,
 * error mapping, registration helpers, the request and part pools and their
 * lists, endpoint state and failure.
 */
#include "epd_xport_ofi_int.h"

/* libfabric's entry points, filled by epd__fi_load (epd_xport_ofi.c). */
epd__fi_api_t epd__fi;

/* Checksum of a blob: its header (whose last 8 bytes, the check field,
 * count as zero) then its body.  Catches torn or corrupted blobs that would
 * otherwise parse (a flipped bit in a size or key). */
uint64_t epd__ofi_blob_check(const void *hdr, size_t hdr_len, const void *body, size_t body_len)
{
    uint64_t h = epd_hash64(hdr, hdr_len - sizeof(uint64_t), EPD__OFI_CHECK_SEED);

    return epd_hash64(body, body_len, h);
}

const char *epd__ofi_prov(const epd__ofi_t *be)
{
    return be->info->fabric_attr->prov_name != NULL ? be->info->fabric_attr->prov_name : "?";
}

void epd__ofi_mr_mode_str(uint64_t mode, char *buf, size_t len)
{
    static const struct {
        uint64_t bit;
        const char *name;
    } bits[] = {
        {FI_MR_LOCAL, "LOCAL"},
        {FI_MR_RAW, "RAW"},
        {FI_MR_VIRT_ADDR, "VIRT_ADDR"},
        {FI_MR_ALLOCATED, "ALLOCATED"},
        {FI_MR_PROV_KEY, "PROV_KEY"},
        {FI_MR_ENDPOINT, "ENDPOINT"},
        {FI_MR_MMU_NOTIFY, "MMU_NOTIFY"},
        {FI_MR_RMA_EVENT, "RMA_EVENT"},
        {FI_MR_HMEM, "HMEM"},
    };
    size_t off = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++) {
        if ((mode & bits[i].bit) != 0 && off < len) {
            int n = snprintf(buf + off, len - off, "%s%s", off != 0 ? "|" : "", bits[i].name);
            if (n > 0) {
                off += (size_t)n;
            }
        }
    }
    if (off == 0) {
        snprintf(buf, len, "0");
    }
}

/* Maps a libfabric error (positive FI_E* value) to a status, and says
 * whether it means the peer is gone. */
epd_status_t epd__ofi_map_err(int err, bool *peer_gone_p)
{
    *peer_gone_p = false;
    switch (err) {
    case FI_ECONNREFUSED:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_EADDRNOTAVAIL:
    case FI_ETIMEDOUT:
    case FI_EHOSTDOWN:
    case FI_ENETDOWN:
        *peer_gone_p = true;
        return EPD_ERR_UNREACHABLE;
    case FI_ECONNRESET:
    case FI_ENOTCONN:
    case FI_ECONNABORTED:
    case EPIPE:
    case FI_ESHUTDOWN:
    case FI_ECANCELED:
    case FI_EIO:
        *peer_gone_p = true;
        return EPD_ERR_PEER_DEAD;
    case FI_ETRUNC:
    case FI_EMSGSIZE:
        return EPD_ERR_TOO_LONG;
    case FI_EAGAIN:
        return EPD_ERR_NO_RESOURCE;
    case FI_ENOMEM:
        return EPD_ERR_NO_MEMORY;
    default:
        return EPD_ERR_TRANSPORT;
    }
}

/* A status for a negative return of a posting call other than -FI_EAGAIN. */
epd_status_t epd__ofi_post_err(ssize_t ret)
{
    bool gone;

    return epd__ofi_map_err((int)-ret, &gone);
}

epd_status_t epd__ofi_reg(epd__ofi_t *be, void *addr, size_t size, uint64_t access,
                          struct fid_mr **mr_p)
{
    struct fid_mr *mr = NULL;
    uint64_t key = 0;
    int ret;

    for (int tries = 0;; tries++) {
        if ((be->mr_mode & FI_MR_PROV_KEY) == 0) {
            randombytes_buf(&key, sizeof(key));
            key &= be->key_mask;
        }
        ret = fi_mr_reg(be->domain, addr, size, access, 0, key, 0, &mr, NULL);
        if (ret != -FI_ENOKEY || (be->mr_mode & FI_MR_PROV_KEY) != 0 ||
            tries + 1 >= EPD__OFI_KEY_TRIES) {
            break;
        }
    }
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_mr_reg(%zu bytes) failed: %s", size,
                      epd__fi.strerror(-ret));
        return ret == -FI_ENOMEM ? EPD_ERR_NO_MEMORY : EPD_ERR_TRANSPORT;
    }
    if ((be->mr_mode & FI_MR_ENDPOINT) != 0) {
        ret = fi_mr_bind(mr, &be->ep->fid, 0);
        if (ret == 0) {
            ret = fi_mr_enable(mr);
        }
        if (ret != 0) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_mr_bind/enable failed: %s", epd__fi.strerror(-ret));
            fi_close(&mr->fid);
            return EPD_ERR_TRANSPORT;
        }
    }
    *mr_p = mr;
    return EPD_OK;
}

void *epd__ofi_desc(const epd__ofi_t *be, struct fid_mr *mr)
{
    return ((be->mr_mode & FI_MR_LOCAL) != 0 && mr != NULL) ? fi_mr_desc(mr) : NULL;
}

/* Progresses the provider without consuming completions (no upcall runs):
 * util-based CQs run their progress function on every read. */
void epd__ofi_nudge(epd__ofi_t *be)
{
    (void)fi_cq_read(be->cq, NULL, 0);
}

epd__ofi_req_t *epd__ofi_req_get(epd__ofi_t *be)
{
    epd__ofi_req_t *req = be->req_free;

    if (req != NULL) {
        be->req_free = req->next;
        memset(req, 0, sizeof(*req));
    }
    return req;
}

void epd__ofi_req_put(epd__ofi_t *be, epd__ofi_req_t *req)
{
    if (req->tmp_mr != NULL) {
        fi_close(&req->tmp_mr->fid);
        req->tmp_mr = NULL;
    }
    req->op = NULL;
    req->ep = NULL;
    req->next = be->req_free;
    be->req_free = req;
}

epd__ofi_xfer_t *epd__ofi_part_get(epd__ofi_t *be, epd__ofi_req_t *req)
{
    epd__ofi_xfer_t *x = be->parts_free;

    if (x != NULL) {
        be->parts_free = x->next_free;
        x->req = req;
    }
    return x;
}

void epd__ofi_part_put(epd__ofi_t *be, epd__ofi_xfer_t *x)
{
    x->req = NULL;
    x->ep = NULL;
    x->next_free = be->parts_free;
    be->parts_free = x;
}

/* Doubly linked request lists (head/tail). */
void epd__ofi_list_append(epd__ofi_req_t **head, epd__ofi_req_t **tail, epd__ofi_req_t *req)
{
    EPD_TLIST_INSERT_TAIL(*head, *tail, req);
}

void epd__ofi_list_remove(epd__ofi_req_t **head, epd__ofi_req_t **tail, epd__ofi_req_t *req)
{
    EPD_TLIST_REMOVE(*head, *tail, req);
    req->prev = NULL;
    req->next = NULL;
}

/* Reports the failure of `ep` once.  The core may destroy the endpoint from
 * inside the upcall: callers must not touch `ep` afterwards. */
void epd__ofi_ep_fail(epd__ofi_ep_t *ep, epd_status_t status)
{
    if (ep->failed == EPD_OK) {
        ep->failed = status;
    }
    if (!ep->fail_reported) {
        ep->fail_reported = true;
        if (ep->closing) {
            return;
        }
        epd_log_warn(EPD__OFI_LOG, 0, "endpoint to %s failed: %s", ep->peer,
                     epd_status_string(status));
        epd__xport_ep_failed(ep->core_ep, status);
    }
}

/* Whether a provider name ("shm", "shm;ofi_...") has shm as its core. */
bool epd__ofi_is_shm(const char *prov)
{
    return prov != NULL && strncmp(prov, "shm", 3) == 0 && (prov[3] == '\0' || prov[3] == ';');
}

/* The status an endpoint refuses new work with, EPD_OK when usable. */
epd_status_t epd__ofi_ep_state(const epd__ofi_ep_t *ep)
{
    if (ep->closing) {
        return EPD_ERR_CANCELED;
    }
    return ep->failed;
}
