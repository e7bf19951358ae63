/*
 * epd_xport_ucx_mr.c — memory registration: regions (mapped or registered,
 * random ids), packed keys and their envelope, remote keys, and the fence's
 * grants.
 */
#include "epd_xport_ucx_int.h"

epd__ucx_mr_t *epd__ucx_mr_find(epd__ucx_t *be, uint64_t id)
{
    for (epd__ucx_mr_t *mr = be->mrs; mr != NULL; mr = mr->next) {
        if (mr->id == id) {
            return mr;
        }
    }
    return NULL;
}

epd__ucx_grant_t *epd__ucx_grant_find(epd__ucx_t *be, uint64_t id)
{
    for (epd__ucx_grant_t *g = be->grants; g != NULL; g = g->next) {
        if (g->id == id) {
            return g;
        }
    }
    return NULL;
}

/* A fresh id for a region or a grant: random (nobody who was not given the
 * key can name it), never one in use. */
static uint64_t epd__ucx_new_id(epd__ucx_t *be)
{
    uint64_t id;

    do {
        randombytes_buf(&id, sizeof(id));
    } while (id == 0 || epd__ucx_mr_find(be, id) != NULL || epd__ucx_grant_find(be, id) != NULL);
    return id;
}

void epd__ucx_mr_unmap(epd__ucx_mr_t *mr)
{
    ucp_mem_unmap(mr->be->ctx, mr->memh);
    epd_free(mr->owned);
    epd_free(mr);
}

static epd_status_t epd__ucx_mr_new(epd__ucx_t *be, void *addr, size_t size, bool allocate,
                                    unsigned access, void **addr_p, void **be_mr_p)
{
    bool remote_write = (access & EPD_XPORT_MR_REMOTE_WRITE) != 0;
    ucp_mem_map_params_t mp;
    ucp_mem_attr_t attr;
    epd__ucx_mr_t *mr;
    ucs_status_t s;

    mr = epd_calloc(1, sizeof(*mr));
    if (mr == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    if (allocate && !remote_write) {
        /* a local region gains nothing from UCX's allocation (only a put's
         * target does), and a shared-memory segment is something another
         * process could map: plain zeroed memory instead */
        mr->owned = epd_calloc(1, size);
        if (mr->owned == NULL) {
            epd_free(mr);
            return EPD_ERR_NO_MEMORY;
        }
        addr = mr->owned;
        allocate = false;
    }
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.address = addr;
    mp.length = size;
    mp.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
    /* never remote read: a key to a receive region lets its holder write,
     * nothing more; a local region grants nothing remote */
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
              (remote_write ? UCP_MEM_MAP_PROT_REMOTE_WRITE : 0);
    s = ucp_mem_map(be->ctx, &mp, &mr->memh);
    if (s != UCS_OK) {
        epd_log_error(EPD__UCX_COMP, 0, "ucp_mem_map of %zu bytes failed: %s", size,
                      ucs_status_string(s));
        epd_free(mr->owned);
        epd_free(mr);
        return s == UCS_ERR_NO_MEMORY ? EPD_ERR_NO_MEMORY : EPD_ERR_TRANSPORT;
    }
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    s = ucp_mem_query(mr->memh, &attr);
    if (s != UCS_OK || attr.length < size) {
        ucp_mem_unmap(be->ctx, mr->memh);
        epd_free(mr->owned);
        epd_free(mr);
        return EPD_ERR_TRANSPORT;
    }
    mr->kind = EPD__UCX_KIND_MR;
    mr->be = be;
    mr->addr = allocate ? attr.address : addr;
    mr->size = size;
    mr->remote_write = remote_write;
    mr->allocated = allocate;
    /* what an AM write names: random, so that nobody who was not given the
     * key can name the region */
    mr->id = epd__ucx_new_id(be);
    /* No memset for allocated regions: UCX_ALLOC_PRIO tries sysv, posix,
     * huge pages, thp and mmap before heap, all fresh kernel pages (zero).
     * Whether to commit them at once is the owner's call (a KV pool is,
     * by default: --kv-prefault, epd_mem_prefault). */
    EPD_LIST_INSERT_HEAD(be->mrs, mr);
    if (addr_p != NULL) {
        *addr_p = mr->addr;
    }
    *be_mr_p = mr;
    return EPD_OK;
}

epd_status_t epd__ucx_mr_alloc(void *arg, size_t size, unsigned access, void **addr_p,
                               void **be_mr_p)
{
    return epd__ucx_mr_new(arg, NULL, size, true, access, addr_p, be_mr_p);
}

epd_status_t epd__ucx_mr_reg(void *arg, void *addr, size_t size, unsigned access, void **be_mr_p)
{
    return epd__ucx_mr_new(arg, addr, size, false, access, NULL, be_mr_p);
}

void epd__ucx_mr_dereg(void *arg, void *be_mr)
{
    epd__ucx_t *be = arg;
    epd__ucx_mr_t *mr = be_mr;

    EPD_LIST_REMOVE(be->mrs, mr);
    mr->prev = NULL;
    if (mr->recv_inflight == 0) {
        epd__ucx_mr_unmap(mr);
        return;
    }
    /* rendezvous receives still land in it: unmapped once they finished
     * (new writes are refused already, the region id is gone) */
    mr->dead = true;
    mr->next = be->dead_mrs;
    be->dead_mrs = mr;
}

/* The packed key of region `mr` under `id` (the region's own, or a grant's). */
static epd_status_t epd__ucx_pack(epd__ucx_t *be, epd__ucx_mr_t *mr, uint64_t id, void *buf,
                                  size_t cap, size_t *len_p)
{
    epd__ucx_rkey_wire_t w;
    void *rkey_buf;
    size_t rkey_len;
    ucs_status_t s;
    epd_status_t st = EPD_OK;

    s = ucp_rkey_pack(be->ctx, mr->memh, &rkey_buf, &rkey_len);
    if (s != UCS_OK) {
        epd_log_error(EPD__UCX_COMP, 0, "ucp_rkey_pack failed: %s", ucs_status_string(s));
        return EPD_ERR_TRANSPORT;
    }
    if (rkey_len > UINT16_MAX || sizeof(w) + rkey_len > EPD_XPORT_RKEY_MAX) {
        st = EPD_ERR_TRANSPORT;
        goto out;
    }
    if (sizeof(w) + rkey_len > cap) {
        st = EPD_ERR_NO_RESOURCE;
        goto out;
    }
    memset(&w, 0, sizeof(w));
    w.magic = EPD__UCX_RKEY_MAGIC;
    w.version = EPD__UCX_WIRE_VERSION;
    w.ucx_len = (uint16_t)rkey_len;
    w.region_id = id;
    w.base = (uint64_t)(uintptr_t)mr->addr;
    w.size = mr->size;
    w.hash = epd_hash64(rkey_buf, rkey_len, w.region_id ^ w.base ^ w.size ^ w.ucx_len);
    memcpy(buf, &w, sizeof(w));
    memcpy((char *)buf + sizeof(w), rkey_buf, rkey_len);
    *len_p = sizeof(w) + rkey_len;
out:
    ucp_rkey_buffer_release(rkey_buf);
    return st;
}

epd_status_t epd__ucx_mr_pack(void *arg, void *be_mr, void *buf, size_t cap, size_t *len_p)
{
    epd__ucx_mr_t *mr = be_mr;

    return epd__ucx_pack(arg, mr, mr->id, buf, cap, len_p);
}

epd_status_t epd__ucx_grant_open(void *arg, void *be_mr, epd_xport_grant_t *core_grant,
                                 void **be_grant_p)
{
    epd__ucx_t *be = arg;
    epd__ucx_grant_t *g = epd_calloc(1, sizeof(*g));

    if (g == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    g->kind = EPD__UCX_KIND_GRANT;
    g->mr = be_mr;
    g->core = core_grant;
    g->id = epd__ucx_new_id(be);
    EPD_LIST_INSERT_HEAD(be->grants, g);
    *be_grant_p = g;
    return EPD_OK;
}

epd_status_t epd__ucx_grant_pack(void *arg, void *be_grant, void *buf, size_t cap, size_t *len_p)
{
    epd__ucx_grant_t *g = be_grant;

    /* the region's UCX key (a same-host writer maps the region with it),
     * under the grant's id (what its AM writes name) */
    return epd__ucx_pack(arg, g->mr, g->id, buf, cap, len_p);
}

epd_status_t epd__ucx_grant_revoke(void *arg, void *be_grant, int writer_same_host)
{
    epd__ucx_t *be = arg;
    epd__ucx_grant_t *g = be_grant;

    g->revoked = true; /* AM writes under it are refused from now on */
    /* a same-host writer with a shared-memory transport may have mapped a
     * region UCX allocated (ucp_rkey_ptr) and put into it directly: no
     * check of ours sees those bytes */
    if (g->mr->allocated && be->maps_shm && writer_same_host) {
        return EPD_ERR_UNSUPPORTED;
    }
    return EPD_OK;
}

int epd__ucx_grant_settled(void *arg, void *be_grant)
{
    epd__ucx_grant_t *g = be_grant;

    (void)arg;
    return g->revoked && g->recv_inflight == 0;
}

void epd__ucx_grant_close(void *arg, void *be_grant)
{
    epd__ucx_t *be = arg;
    epd__ucx_grant_t *g = be_grant;

    EPD_LIST_REMOVE(be->grants, g);
    g->revoked = true;
    g->prev = NULL;
    if (g->recv_inflight == 0) {
        epd_free(g);
        return;
    }
    /* receives under it still land: freed once they finished (its id is
     * refused already: it is no longer in be->grants) */
    EPD_LIST_INSERT_HEAD(be->dead_grants, g);
}

epd_status_t epd__ucx_rkey_unpack(void *arg, const void *blob, size_t len, void **be_rkey_p,
                                  size_t *size_p)
{
    epd__ucx_ep_t *ep = arg;
    epd__ucx_rkey_wire_t w;
    const unsigned char *ucx_key;
    epd__ucx_rkey_t *rk;
    void *ptr;
    ucs_status_t s;

    if (blob == NULL || len < sizeof(w)) {
        return EPD_ERR_BAD_RKEY;
    }
    memcpy(&w, blob, sizeof(w));
    ucx_key = (const unsigned char *)blob + sizeof(w);
    if (w.magic != EPD__UCX_RKEY_MAGIC || w.version != EPD__UCX_WIRE_VERSION || w.ucx_len == 0 ||
        w.ucx_len != len - sizeof(w) || w.size == 0 || w.base + w.size < w.base ||
        epd_hash64(ucx_key, w.ucx_len, w.region_id ^ w.base ^ w.size ^ w.ucx_len) != w.hash) {
        epd_log_debug(EPD__UCX_COMP, 0, "refusing a malformed remote key of %zu bytes", len);
        return EPD_ERR_BAD_RKEY;
    }
    rk = epd_calloc(1, sizeof(*rk));
    if (rk == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    s = ucp_ep_rkey_unpack(ep->ep, ucx_key, &rk->rkey);
    if (s != UCS_OK) {
        epd_log_warn(EPD__UCX_COMP, 0, "ucp_ep_rkey_unpack failed: %s", ucs_status_string(s));
        epd_free(rk);
        return EPD_ERR_BAD_RKEY;
    }
    rk->ep = ep;
    rk->base = w.base;
    rk->size = w.size;
    rk->region_id = w.region_id;
    /* a shared-memory lane that can map the peer's region: put is a memcpy
     * into it, with no target involvement */
    rk->direct = ep->shm && ucp_rkey_ptr(rk->rkey, w.base, &ptr) == UCS_OK;
    epd_log_debug(EPD__UCX_COMP, 0, "remote key of region %016llx (%llu bytes): writes %s",
                  (unsigned long long)w.region_id, (unsigned long long)w.size,
                  rk->direct ? "put directly into the mapped region" : "by active message");
    *be_rkey_p = rk;
    *size_p = (size_t)w.size;
    return EPD_OK;
}

void epd__ucx_rkey_destroy(void *be_rkey)
{
    epd__ucx_rkey_t *rk = be_rkey;

    ucp_rkey_destroy(rk->rkey);
    epd_free(rk);
}
