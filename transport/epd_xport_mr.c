/*
 * epd_xport_mr.c — memory regions, remote keys and the fence's grants
 * (epd_xport.h "The fence").
 */
#include "epd_xport_core.h"

#include <string.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_proc.h"

static epd_status_t epd__mr_wrap(epd_xport_t *x, void *be_mr, void *addr, size_t size,
                                 epd_xport_mr_t **mr_p)
{
    epd_xport_mr_t *mr = epd_calloc(1, sizeof(*mr));

    if (mr == NULL) {
        x->ops->mr_dereg(x->be, be_mr);
        return EPD_ERR_NO_MEMORY;
    }
    mr->x = x;
    mr->be_mr = be_mr;
    mr->addr = addr;
    mr->size = size;
    EPD_LIST_INSERT_HEAD(x->mrs, mr);
    *mr_p = mr;
    return EPD_OK;
}

epd_status_t epd_xport_mr_alloc_ex(epd_xport_t *x, size_t size, unsigned access,
                                   epd_xport_mr_t **mr_p)
{
    void *addr, *be_mr;
    epd_status_t st;

    if (size == 0 || mr_p == NULL || (access & ~EPD_XPORT_MR_REMOTE_WRITE) != 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = x->ops->mr_alloc(x->be, size, access, &addr, &be_mr);
    if (st != EPD_OK) {
        return st;
    }
    st = epd__mr_wrap(x, be_mr, addr, size, mr_p);
    if (st == EPD_OK) {
        (*mr_p)->access = access;
    }
    return st;
}

epd_status_t epd_xport_mr_reg_ex(epd_xport_t *x, void *addr, size_t size, unsigned access,
                                 epd_xport_mr_t **mr_p)
{
    void *be_mr;
    epd_status_t st;

    if (addr == NULL || size == 0 || mr_p == NULL || (access & ~EPD_XPORT_MR_REMOTE_WRITE) != 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = x->ops->mr_reg(x->be, addr, size, access, &be_mr);
    if (st != EPD_OK) {
        return st;
    }
    st = epd__mr_wrap(x, be_mr, addr, size, mr_p);
    if (st == EPD_OK) {
        (*mr_p)->access = access;
    }
    return st;
}

epd_status_t epd_xport_mr_alloc(epd_xport_t *x, size_t size, epd_xport_mr_t **mr_p)
{
    return epd_xport_mr_alloc_ex(x, size, EPD_XPORT_MR_REMOTE_WRITE, mr_p);
}

epd_status_t epd_xport_mr_reg(epd_xport_t *x, void *addr, size_t size, epd_xport_mr_t **mr_p)
{
    return epd_xport_mr_reg_ex(x, addr, size, EPD_XPORT_MR_REMOTE_WRITE, mr_p);
}

void epd_xport_mr_dereg(epd_xport_mr_t *mr)
{
    epd_xport_t *x;

    if (mr == NULL) {
        return;
    }
    x = mr->x;
    while (mr->grants != NULL) {
        epd_xport_grant_close(mr->grants);
    }
    EPD_LIST_REMOVE(x->mrs, mr);
    x->ops->mr_dereg(x->be, mr->be_mr);
    epd_free(mr);
}

void *epd_xport_mr_addr(const epd_xport_mr_t *mr)
{
    return mr->addr;
}

size_t epd_xport_mr_size(const epd_xport_mr_t *mr)
{
    return mr->size;
}

epd_status_t epd_xport_mr_pack(epd_xport_mr_t *mr, void *buf, size_t cap, size_t *len_p)
{
    if (buf == NULL || len_p == NULL || (mr->access & EPD_XPORT_MR_REMOTE_WRITE) == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    return mr->x->ops->mr_pack(mr->x->be, mr->be_mr, buf, cap, len_p);
}

void epd_xport_mr_set_check(epd_xport_mr_t *mr, epd_xport_write_check_cb_t cb, void *arg)
{
    mr->check = cb;
    mr->check_arg = arg;
}

epd_status_t epd_xport_grant_open(epd_xport_mr_t *mr, void *user, epd_xport_grant_t **g_p)
{
    epd_xport_t *x;
    epd_xport_grant_t *g;
    epd_status_t st;

    if (mr == NULL || g_p == NULL || (mr->access & EPD_XPORT_MR_REMOTE_WRITE) == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    x = mr->x;
    g = epd_calloc(1, sizeof(*g));
    if (g == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    g->mr = mr;
    g->user = user;
    g->pidfd = -1;
    st = x->ops->grant_open(x->be, mr->be_mr, g, &g->be_grant);
    if (st != EPD_OK) {
        epd_free(g);
        return st;
    }
    EPD_LIST_INSERT_HEAD(mr->grants, g);
    *g_p = g;
    return EPD_OK;
}

epd_status_t epd_xport_grant_pack(epd_xport_grant_t *g, void *buf, size_t cap, size_t *len_p)
{
    epd_xport_t *x;

    if (g == NULL || buf == NULL || len_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    x = g->mr->x;
    return x->ops->grant_pack(x->be, g->be_grant, buf, cap, len_p);
}

static void epd__grant_settle(epd_xport_grant_t *g, const char *why)
{
    epd_xport_t *x = g->mr->x;

    if (g->state == EPD__GRANT_HELD) {
        x->grants_held--;
    }
    g->state = EPD__GRANT_SETTLED;
    g->why = why;
    if (g->pidfd >= 0) {
        close(g->pidfd);
        g->pidfd = -1;
    }
}

void epd_xport_grant_bind(epd_xport_grant_t *g, const epd_xport_ep_t *ep)
{
    if (g == NULL || g->proc_known || ep == NULL || !ep->handshaken || !ep->peer_proc_known) {
        return;
    }
    g->proc_known = true;
    g->proc.pid = ep->peer_proc.pid;
    g->proc.start_ticks = ep->peer_proc.start_ticks;
    g->proc.pidns_dev = ep->peer_proc.pidns_dev;
    g->proc.pidns_ino = ep->peer_proc.pidns_ino;
    memcpy(g->proc.boot_id, ep->peer_proc.boot_id, sizeof(g->proc.boot_id));
}

void epd_xport_grant_revoke(epd_xport_grant_t *g, const epd_xport_ep_t *ep)
{
    epd_xport_t *x;
    int same_host = 1;
    epd_status_t st;

    if (g == NULL) {
        return;
    }
    x = g->mr->x;
    epd_xport_grant_bind(g, ep);
    if (g->state != EPD__GRANT_OPEN) {
        return;
    }
    if (g->proc_known) {
        /* another boot or pid namespace: not this host's process (a pid
         * of ours would name someone else) */
        same_host = epd_proc_same_host(&g->proc, &x->self);
    }
    st = x->ops->grant_revoke(x->be, g->be_grant, same_host);
    if (st == EPD_OK) {
        g->state = EPD__GRANT_REVOKED;
        return;
    }
    /* bytes may still land without a check: only the writer's end proves
     * nothing more will — watch its process when it runs on this host */
    g->state = EPD__GRANT_HELD;
    x->grants_held++;
    if (g->proc_known && same_host && epd_proc_watch(&g->proc, &g->pidfd) == EPD_ERR_NOT_FOUND) {
        epd__grant_settle(g, "the writer's process ended");
    }
}

int epd_xport_grant_settled(epd_xport_grant_t *g)
{
    epd_xport_t *x;

    if (g == NULL) {
        return 1;
    }
    x = g->mr->x;
    switch (g->state) {
    case EPD__GRANT_REVOKED:
        if (x->ops->grant_settled(x->be, g->be_grant)) {
            epd__grant_settle(g, "revoked");
        }
        break;
    case EPD__GRANT_HELD:
        if (g->proc_known && epd_proc_same_host(&g->proc, &x->self) &&
            epd_proc_gone(&g->proc, g->pidfd)) {
            epd__grant_settle(g, "the writer's process ended");
        }
        break;
    default:
        break;
    }
    return g->state == EPD__GRANT_SETTLED;
}

const char *epd_xport_grant_state(const epd_xport_grant_t *g)
{
    switch (g->state) {
    case EPD__GRANT_OPEN:
        return "open";
    case EPD__GRANT_REVOKED:
        return "revoked, receives in flight";
    case EPD__GRANT_HELD:
        return g->proc_known ? "held: the writer may still write without a check until its "
                               "process ends or it confirms"
                             : "held: the writer may still write without a check until it "
                               "confirms";
    default:
        return g->why != NULL ? g->why : "settled";
    }
}

void epd_xport_grant_close(epd_xport_grant_t *g)
{
    epd_xport_mr_t *mr;
    epd_xport_t *x;

    if (g == NULL) {
        return;
    }
    mr = g->mr;
    x = mr->x;
    if (g->state == EPD__GRANT_HELD) {
        x->grants_held--;
    }
    if (g->pidfd >= 0) {
        close(g->pidfd);
    }
    EPD_LIST_REMOVE(mr->grants, g);
    x->ops->grant_close(x->be, g->be_grant);
    epd_free(g);
}

int epd__xport_grant_write(epd_xport_grant_t *g, uint64_t offset, uint64_t len)
{
    epd_xport_mr_t *mr = g->mr;
    epd_xport_t *x = mr->x;

    if (g->state != EPD__GRANT_OPEN) {
        /* a retired writer's late write: the fence */
        x->stats.writes_refused_late++;
        EPD__LOG_LIMITED(x,
                         "refusing a late write of %llu bytes at offset %llu: its grant was "
                         "revoked (%llu refused so far)",
                         (unsigned long long)len, (unsigned long long)offset,
                         (unsigned long long)x->stats.writes_refused_late);
        return 0;
    }
    if (mr->check != NULL && !mr->check(mr->check_arg, g->user, offset, len)) {
        x->stats.writes_refused_range++;
        EPD__LOG_LIMITED(x,
                         "refusing a write of %llu bytes at offset %llu: outside what its "
                         "grant allows now (%llu refused so far)",
                         (unsigned long long)len, (unsigned long long)offset,
                         (unsigned long long)x->stats.writes_refused_range);
        return 0;
    }
    return 1;
}

epd_status_t epd__xport_mr_pack_any(epd_xport_mr_t *mr, void *buf, size_t cap, size_t *len_p)
{
    if (mr == NULL || buf == NULL || len_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    return mr->x->ops->mr_pack(mr->x->be, mr->be_mr, buf, cap, len_p);
}

epd_status_t epd_xport_rkey_unpack(epd_xport_ep_t *ep, const void *blob, size_t len,
                                   epd_xport_rkey_t **rkey_p)
{
    epd_xport_rkey_t *rk;
    epd_status_t st;

    if (blob == NULL || len == 0 || len > EPD_XPORT_RKEY_MAX) {
        return EPD_ERR_BAD_RKEY;
    }
    if (rkey_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = epd__xport_ep_usable(ep);
    if (st != EPD_OK) {
        return st;
    }
    rk = epd_calloc(1, sizeof(*rk));
    if (rk == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    st = ep->x->ops->rkey_unpack(ep->be_ep, blob, len, &rk->be_rkey, &rk->size);
    if (st != EPD_OK) {
        epd_free(rk);
        return st;
    }
    rk->ep = ep;
    EPD_LIST_INSERT_HEAD(ep->rkeys, rk);
    *rkey_p = rk;
    return EPD_OK;
}

void epd_xport_rkey_destroy(epd_xport_rkey_t *rkey)
{
    epd_xport_ep_t *ep;

    if (rkey == NULL) {
        return;
    }
    ep = rkey->ep;
    if (ep != NULL) {
        EPD_LIST_REMOVE(ep->rkeys, rkey);
        if (rkey->be_rkey != NULL) {
            ep->x->ops->rkey_destroy(rkey->be_rkey);
        }
    }
    epd_free(rkey);
}

size_t epd_xport_rkey_size(const epd_xport_rkey_t *rkey)
{
    return rkey->size;
}
