/*
 * epd_xport_ofi_mr.c — memory registration: regions and their keys, packed
 * keys, remote keys, and the fence's grants.
 */
#include "epd_xport_ofi_int.h"

/* A region that receives writes: remote write and nothing else remote (the
 * flush sink takes the reads of providers without delivery complete);
 * FI_WRITE because it may also be the source of this worker's writes. */
#define EPD__OFI_ACCESS_RECV (FI_WRITE | FI_REMOTE_WRITE)

static epd_status_t epd__ofi_mr_finish(epd__ofi_t *be, epd__ofi_mr_t *mr)
{
    mr->key = fi_mr_key(mr->mr);
    if ((be->mr_mode & FI_MR_RAW) != 0) {
        size_t raw_len = sizeof(mr->raw);
        int ret = fi_mr_raw_attr(mr->mr, &mr->raw_base, mr->raw, &raw_len, 0);

        if (ret != 0 || raw_len == 0 || raw_len > sizeof(mr->raw)) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_mr_raw_attr failed: %s (%zu bytes)",
                          epd__fi.strerror(-ret), raw_len);
            return EPD_ERR_TRANSPORT;
        }
        mr->raw_len = raw_len;
    } else if (mr->key == FI_KEY_NOTAVAIL) {
        epd_log_error(EPD__OFI_LOG, 0, "provider returned no key for a region");
        return EPD_ERR_TRANSPORT;
    }
    return EPD_OK;
}

epd_status_t epd__ofi_mr_reg(void *arg, void *addr, size_t size, unsigned access, void **be_mr_p)
{
    epd__ofi_t *be = arg;
    epd__ofi_mr_t *mr;
    epd_status_t status;

    if (be == NULL || addr == NULL || size == 0 || be_mr_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    mr = epd_calloc(1, sizeof(*mr));
    if (mr == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    mr->be = be;
    mr->addr = addr;
    mr->size = size;
    mr->remote_write = (access & EPD_XPORT_MR_REMOTE_WRITE) != 0;
    if (!mr->remote_write) {
        /* a source only: registered where the provider needs a descriptor
         * for local buffers, with local write-source access alone; without
         * FI_MR_LOCAL nothing is registered, so there is no key to guess */
        if ((be->mr_mode & FI_MR_LOCAL) != 0) {
            status = epd__ofi_reg(be, addr, size, FI_WRITE, &mr->mr);
            if (status != EPD_OK) {
                goto err_free;
            }
        }
        *be_mr_p = mr;
        return EPD_OK;
    }
    status = epd__ofi_reg(be, addr, size, EPD__OFI_ACCESS_RECV, &mr->mr);
    if (status != EPD_OK) {
        goto err_free;
    }
    status = epd__ofi_mr_finish(be, mr);
    if (status != EPD_OK) {
        goto err_close;
    }
    *be_mr_p = mr;
    return EPD_OK;

err_close:
    fi_close(&mr->mr->fid);
err_free:
    epd_free(mr);
    return status;
}

epd_status_t epd__ofi_mr_alloc(void *arg, size_t size, unsigned access, void **addr_p,
                               void **be_mr_p)
{
    epd__ofi_t *be = arg;
    void *mem;
    void *mr;
    epd_status_t status;

    if (be == NULL || size == 0 || addr_p == NULL || be_mr_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    mem = epd_calloc(1, size);
    if (mem == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    status = epd__ofi_mr_reg(be, mem, size, access, &mr);
    if (status != EPD_OK) {
        epd_free(mem);
        return status;
    }
    ((epd__ofi_mr_t *)mr)->alloc = mem;
    *addr_p = mem;
    *be_mr_p = mr;
    return EPD_OK;
}

void epd__ofi_mr_dereg(void *arg, void *be_mr)
{
    epd__ofi_mr_t *mr = be_mr;

    (void)arg;
    if (mr == NULL) {
        return;
    }
    if (mr->mr != NULL) {
        fi_close(&mr->mr->fid);
    }
    epd_free(mr->alloc);
    epd_free(mr);
}

epd_status_t epd__ofi_mr_pack(void *arg, void *be_mr, void *buf, size_t cap, size_t *len_p)
{
    epd__ofi_t *be = arg;
    epd__ofi_mr_t *mr = be_mr;
    epd__ofi_rkey_hdr_t hdr;
    size_t need;

    if (be == NULL || mr == NULL || buf == NULL || len_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (mr->mr == NULL) {
        return EPD_ERR_UNSUPPORTED; /* a local region never registered: no key exists */
    }
    if (!mr->remote_write) {
        /* tests only (epd__xport_mr_pack_any): the local registration's key */
        mr->key = fi_mr_key(mr->mr);
    }
    need = sizeof(hdr) + mr->raw_len + be->sink.raw_len;
    if (cap < need) {
        return EPD_ERR_NO_RESOURCE;
    }
    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = EPD__OFI_RKEY_MAGIC;
    hdr.version = EPD__OFI_RKEY_VERSION;
    hdr.hdr_len = sizeof(hdr);
    hdr.raw_len = (uint32_t)mr->raw_len;
    hdr.base = (be->mr_mode & FI_MR_VIRT_ADDR) != 0 ? (uint64_t)(uintptr_t)mr->addr : 0;
    hdr.size = mr->size;
    hdr.key = mr->key;
    hdr.raw_base = mr->raw_base;
    if (be->sink.mr != NULL) {
        hdr.has_sink = 1;
        hdr.sink_raw_len = (uint32_t)be->sink.raw_len;
        hdr.sink_addr =
            (be->mr_mode & FI_MR_VIRT_ADDR) != 0 ? (uint64_t)(uintptr_t)be->sink.buf : 0;
        hdr.sink_key = be->sink.key;
        hdr.sink_raw_base = be->sink.raw_base;
    }
    memcpy(buf, &hdr, sizeof(hdr));
    if (mr->raw_len != 0) {
        memcpy((unsigned char *)buf + sizeof(hdr), mr->raw, mr->raw_len);
    }
    if (be->sink.raw_len != 0) {
        memcpy((unsigned char *)buf + sizeof(hdr) + mr->raw_len, be->sink.raw, be->sink.raw_len);
    }
    hdr.check = epd__ofi_blob_check(&hdr, sizeof(hdr), (unsigned char *)buf + sizeof(hdr),
                                    need - sizeof(hdr));
    memcpy(buf, &hdr, sizeof(hdr));
    *len_p = need;
    return EPD_OK;
}

/* A grant is a registration of its own over the region's memory (its own
 * random or provider key), so that it can be closed alone. */
epd_status_t epd__ofi_grant_open(void *arg, void *be_mr, epd_xport_grant_t *core_grant,
                                 void **be_grant_p)
{
    epd__ofi_t *be = arg;
    epd__ofi_mr_t *region = be_mr;
    epd__ofi_mr_t *g;
    epd_status_t status;

    (void)core_grant; /* writes land without a check of ours: nothing to call */
    g = epd_calloc(1, sizeof(*g));
    if (g == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    g->be = be;
    g->addr = region->addr;
    g->size = region->size;
    g->remote_write = true;
    status = epd__ofi_reg(be, g->addr, g->size, EPD__OFI_ACCESS_RECV, &g->mr);
    if (status == EPD_OK) {
        status = epd__ofi_mr_finish(be, g);
        if (status != EPD_OK) {
            fi_close(&g->mr->fid);
        }
    }
    if (status != EPD_OK) {
        epd_free(g);
        return status;
    }
    *be_grant_p = g;
    return EPD_OK;
}

epd_status_t epd__ofi_grant_pack(void *arg, void *be_grant, void *buf, size_t cap, size_t *len_p)
{
    epd__ofi_mr_t *g = be_grant;

    if (g->mr == NULL) {
        return EPD_ERR_INVALID_PARAM; /* revoked */
    }
    return epd__ofi_mr_pack(arg, g, buf, cap, len_p);
}

epd_status_t epd__ofi_grant_revoke(void *arg, void *be_grant, int writer_same_host)
{
    epd__ofi_mr_t *g = be_grant;

    (void)arg;
    (void)writer_same_host;
    /* Closed: a write that starts after this finds no key and is refused
     * by the provider.  Not a proof that nothing lands: the providers here
     * check the key once per operation (tcp when a write's header arrives,
     * then its bytes go straight into the region as they come), so a write
     * under way when the key closes still lands — only the writer's end
     * (its process gone, or its own word) settles the grant. */
    if (g->mr != NULL) {
        fi_close(&g->mr->fid);
        g->mr = NULL;
    }
    return EPD_ERR_UNSUPPORTED;
}

int epd__ofi_grant_settled(void *arg, void *be_grant)
{
    (void)arg;
    (void)be_grant;
    return 0;
}

void epd__ofi_grant_close(void *arg, void *be_grant)
{
    epd__ofi_mr_t *g = be_grant;

    (void)arg;
    if (g->mr != NULL) {
        fi_close(&g->mr->fid);
    }
    epd_free(g);
}

epd_status_t epd__ofi_rkey_unpack(void *arg, const void *blob, size_t len, void **be_rkey_p,
                                  size_t *size_p)
{
    epd__ofi_ep_t *ep = arg;
    epd__ofi_t *be;
    epd__ofi_rkey_hdr_t hdr;
    epd__ofi_rkey_t *rkey;
    const unsigned char *raw;
    bool want_raw;
    int ret;

    if (ep == NULL || be_rkey_p == NULL || size_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    be = ep->be;
    want_raw = (be->mr_mode & FI_MR_RAW) != 0;
    if (blob == NULL || len < sizeof(hdr)) {
        return EPD_ERR_BAD_RKEY;
    }
    memcpy(&hdr, blob, sizeof(hdr));
    raw = (const unsigned char *)blob + sizeof(hdr);
    if (hdr.magic != EPD__OFI_RKEY_MAGIC || hdr.version != EPD__OFI_RKEY_VERSION ||
        hdr.hdr_len != sizeof(hdr) || hdr.raw_len > EPD__OFI_MAX_RAW_KEY ||
        hdr.sink_raw_len > EPD__OFI_MAX_RAW_KEY || hdr.has_sink > 1 ||
        (size_t)hdr.raw_len + hdr.sink_raw_len != len - sizeof(hdr) ||
        (hdr.raw_len != 0) != want_raw || (hdr.sink_raw_len != 0) != (want_raw && hdr.has_sink) ||
        (hdr.has_sink == 0 &&
         (hdr.sink_addr != 0 || hdr.sink_key != 0 || hdr.sink_raw_base != 0)) ||
        hdr.size == 0 || hdr.size > SIZE_MAX || hdr.base > UINT64_MAX - hdr.size ||
        hdr.check != epd__ofi_blob_check(&hdr, sizeof(hdr), raw, len - sizeof(hdr))) {
        epd_log_warn(EPD__OFI_LOG, 0, "remote key refused (%zu bytes): malformed", len);
        return EPD_ERR_BAD_RKEY;
    }
    if (!be->dc && !hdr.has_sink) {
        epd_log_warn(EPD__OFI_LOG, 0,
                     "remote key refused: its worker has no flush sink (it uses delivery "
                     "complete, this worker does not: a configuration mismatch)");
        return EPD_ERR_BAD_RKEY;
    }
    rkey = epd_calloc(1, sizeof(*rkey));
    if (rkey == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    rkey->be = be;
    rkey->ep = ep;
    rkey->base = hdr.base;
    rkey->size = hdr.size;
    rkey->key = hdr.key;
    rkey->sink_addr = hdr.sink_addr;
    rkey->sink_key = hdr.sink_key;
    if (want_raw) {
        ret = fi_mr_map_raw(be->domain, hdr.raw_base, (uint8_t *)raw, hdr.raw_len, &rkey->key, 0);
        if (ret != 0) {
            epd_log_warn(EPD__OFI_LOG, 0, "remote key refused: fi_mr_map_raw: %s",
                         epd__fi.strerror(-ret));
            epd_free(rkey);
            return EPD_ERR_BAD_RKEY;
        }
        rkey->mapped = true;
        if (hdr.has_sink && !be->dc) {
            ret = fi_mr_map_raw(be->domain, hdr.sink_raw_base, (uint8_t *)raw + hdr.raw_len,
                                hdr.sink_raw_len, &rkey->sink_key, 0);
            if (ret != 0) {
                epd_log_warn(EPD__OFI_LOG, 0, "remote key refused: fi_mr_map_raw (sink): %s",
                             epd__fi.strerror(-ret));
                (void)fi_mr_unmap_key(be->domain, rkey->key);
                epd_free(rkey);
                return EPD_ERR_BAD_RKEY;
            }
            rkey->sink_mapped = true;
        }
    }
    *be_rkey_p = rkey;
    *size_p = (size_t)hdr.size;
    return EPD_OK;
}

void epd__ofi_rkey_destroy(void *be_rkey)
{
    epd__ofi_rkey_t *rkey = be_rkey;

    if (rkey == NULL) {
        return;
    }
    if (rkey->mapped) {
        (void)fi_mr_unmap_key(rkey->be->domain, rkey->key);
    }
    if (rkey->sink_mapped) {
        (void)fi_mr_unmap_key(rkey->be->domain, rkey->sink_key);
    }
    epd_free(rkey);
}
