/*
 * epd_peer.c — peers by incarnation, and the epoch rule (see epd_peer.h,
 * proto/README.md rule 10).
 *
 * Why a dead peer's links close from the pump and not at once: death is
 * often noticed inside a message handler (a newer epoch speaks) or a
 * transport callback, where the role's state is mid-change.  The role
 * records the death (on_peer_dead), and at the top of the loop every
 * endpoint of the incarnation closes — writes still posted complete with
 * EPD_ERR_CANCELED — before on_peer_closed tells the role that nothing of
 * it can land any more.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_daemon_int.h"
#include "epd_time.h"

static void epd_peer_unlist(epd_peer_t *p)
{
    epd_peer_t **pp = &p->d->peers;

    while (*pp != NULL && *pp != p) {
        pp = &(*pp)->next;
    }
    if (*pp == p) {
        *pp = p->next;
    }
}

static void epd_peer_free(epd_peer_t *p)
{
    epd_peer_unlist(p);
    epd_free(p);
}

void epd_peer_kill(epd_peer_t *peer, epd_status_t status, const char *why)
{
    epd_daemon_t *d = peer->d;

    if (peer->state == EPD_PEER_DEAD) {
        return;
    }
    peer->state = EPD_PEER_DEAD;
    peer->dead_status = status != EPD_OK ? status : EPD_ERR_PEER_DEAD;
    peer->listed = 0;
    d->ops.on_peer_dead(d->cfg.arg, peer, peer->dead_status, why);
    d->peers_dirty = 1;
    epd__daemon_pump_kick(d);
}

void epd__peer_link_down(epd_peer_t *peer, epd_status_t status)
{
    char why[96];

    snprintf(why, sizeof(why), "is unreachable (%s)", epd_status_string(status));
    epd_peer_kill(peer, status, why);
}

epd_peer_t *epd_peer_find(epd_daemon_t *d, const char *worker_id)
{
    for (epd_peer_t *p = d->peers; p != NULL; p = p->next) {
        if (p->listed && strcmp(p->worker_id, worker_id) == 0) {
            return p;
        }
    }
    return NULL;
}

epd_status_t epd_peer_get(epd_daemon_t *d, int role, const char *worker_id,
                          const epd_msg_epoch_t *epoch, const void *addr, size_t len,
                          epd_peer_t **peer_p)
{
    epd_peer_t *p = epd_peer_find(d, worker_id);
    epd_status_t st;

    if (strlen(worker_id) >= EPD_WORKER_ID_MAX || worker_id[0] == '\0') {
        return EPD_ERR_INVALID_PARAM;
    }
    if (p != NULL) {
        int cmp = epd_msg_epoch_cmp(&p->epoch, epoch);

        if (cmp > 0) {
            return EPD_ERR_STALE_EPOCH;
        }
        if (cmp == 0 && p->role == role) {
            p->refs++;
            *peer_p = p;
            return EPD_OK;
        }
        epd_peer_kill(p, EPD_ERR_STALE_EPOCH,
                      cmp < 0 ? "restarted (newer epoch seen)" : "changed its role");
    }
    p = epd_calloc(1, sizeof(*p));
    if (p == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    p->d = d;
    snprintf(p->worker_id, sizeof(p->worker_id), "%s", worker_id);
    p->epoch = *epoch;
    p->role = role;
    p->state = EPD_PEER_CONNECTING;
    p->dead_status = EPD_OK;
    st = epd_link_connect(d, addr, len, &p->link);
    if (st != EPD_OK) {
        epd_free(p);
        return st;
    }
    p->link->peer = p;
    p->listed = 1;
    p->refs = 1; /* the caller's */
    p->next = d->peers;
    d->peers = p;
    epd_log_debug(d->log, 0, "connecting to %s", p->worker_id);
    *peer_p = p;
    return EPD_OK;
}

void epd_peer_ref(epd_peer_t *peer)
{
    peer->refs++;
}

void epd_peer_unref(epd_peer_t *peer)
{
    if (peer == NULL) {
        return;
    }
    peer->refs--;
    if (peer->refs == 0 && peer->state == EPD_PEER_DEAD) {
        peer->d->peers_dirty = 1; /* the pump frees it once closed */
        epd__daemon_pump_kick(peer->d);
    }
}

const char *epd_peer_id(const epd_peer_t *peer)
{
    return peer->worker_id;
}

epd_msg_epoch_t epd_peer_epoch(const epd_peer_t *peer)
{
    return peer->epoch;
}

int epd_peer_role(const epd_peer_t *peer)
{
    return peer->role;
}

epd_peer_state_t epd_peer_state(const epd_peer_t *peer)
{
    if (peer->state == EPD_PEER_CONNECTING && peer->link != NULL &&
        epd_link_connected(peer->link)) {
        return EPD_PEER_UP;
    }
    return peer->state;
}

epd_status_t epd_peer_dead_status(const epd_peer_t *peer)
{
    return peer->dead_status;
}

int epd_peer_usable(const epd_peer_t *peer)
{
    return peer != NULL && peer->state != EPD_PEER_DEAD && epd_link_usable(peer->link);
}

epd_link_t *epd_peer_link(const epd_peer_t *peer)
{
    return peer->link;
}

int epd_peer_is_sender(const epd_peer_t *peer, const Epd__Envelope *env)
{
    epd_msg_epoch_t e;

    if (peer == NULL || env->sender == NULL || env->sender->worker_id == NULL ||
        strcmp(env->sender->worker_id, peer->worker_id) != 0) {
        return 0;
    }
    e = epd_msg_epoch_of(env->sender->epoch);
    return epd_msg_epoch_cmp(&e, &peer->epoch) == 0;
}

uint64_t epd_peer_heard_ns(const epd_peer_t *peer)
{
    return peer->heard_ns;
}

epd_status_t epd_peer_rkey(epd_peer_t *peer, const void *blob, size_t len,
                           epd_xport_rkey_t **rkey_p, int *shared_p)
{
    epd_xport_ep_t *ep = peer->link != NULL ? epd_link_ep(peer->link) : NULL;
    epd_xport_rkey_t *rk;
    epd_status_t st;

    if (peer->state == EPD_PEER_DEAD || ep == NULL) {
        return EPD_ERR_PEER_DEAD;
    }
    if (peer->rkey != NULL && peer->rkey_len == len && memcmp(peer->rkey_blob, blob, len) == 0) {
        *rkey_p = peer->rkey;
        *shared_p = 1;
        return EPD_OK;
    }
    st = epd_xport_rkey_unpack(ep, blob, len, &rk);
    if (st != EPD_OK) {
        return st;
    }
    if (peer->rkey == NULL && len <= sizeof(peer->rkey_blob)) {
        /* the first key of this incarnation: kept for the next requests */
        peer->rkey = rk;
        memcpy(peer->rkey_blob, blob, len);
        peer->rkey_len = len;
        *shared_p = 1;
    } else {
        *shared_p = 0;
    }
    *rkey_p = rk;
    return EPD_OK;
}

void epd_peer_set_user(epd_peer_t *peer, void *user)
{
    peer->user = user;
}

void *epd_peer_user(const epd_peer_t *peer)
{
    return peer->user;
}

/* ------------------------------------------------------------ epoch rule */

int epd__peer_on_sender(epd_daemon_t *d, epd_link_t *from, const Epd__Envelope *env)
{
    epd_msg_epoch_t e = epd_msg_epoch_of(env->sender->epoch);
    epd_peer_t *p = epd_peer_find(d, env->sender->worker_id);
    int cmp;

    if (p == NULL) {
        return 0;
    }
    cmp = epd_msg_epoch_cmp(&e, &p->epoch);
    if (cmp < 0) {
        uint64_t id = epd_msg_request_id(env);

        epd_daemon_refuse_log(d, id, "%s from %s: stale epoch", epd_msg_body_name(env),
                              env->sender->worker_id);
        if (env->body_case != EPD__ENVELOPE__BODY_ERROR) {
            (void)epd_link_send_error(from, id, EPD_ERR_STALE_EPOCH, "message from a stale epoch",
                                      NULL);
        }
        return 1;
    }
    if (cmp > 0) {
        epd_peer_kill(p, EPD_ERR_STALE_EPOCH, "restarted (newer epoch seen)");
        return 0;
    }
    p->heard_ns = epd_time_now_ns();
    if (from->kind == EPD_LINK_IN && from->peer == NULL) {
        /* its own endpoint to us: it closes with this incarnation */
        from->peer = p;
        from->peer_next = p->in_links;
        p->in_links = from;
        epd_link_ref(from);
    }
    return 0;
}

uint32_t epd_peer_adopt_strays(epd_peer_t *peer)
{
    uint64_t xid = peer->link != NULL ? epd_link_peer_xid(peer->link) : 0;
    uint32_t n = 0;

    if (xid == 0 || peer->closed) {
        return 0;
    }
    for (epd_link_t *l = peer->d->links; l != NULL; l = l->next) {
        if (l->kind == EPD_LINK_IN && l->peer == NULL && !l->closed && l->ep != NULL &&
            epd_link_peer_xid(l) == xid) {
            l->peer = peer;
            l->peer_next = peer->in_links;
            peer->in_links = l;
            epd_link_ref(l);
            n++;
        }
    }
    return n;
}

/* ----------------------------------------------------------------- reaping */

static void epd_peer_close(epd_peer_t *p)
{
    epd_daemon_t *d = p->d;

    /* its endpoints to us it wrote on but never spoke on close too */
    (void)epd_peer_adopt_strays(p);
    p->rkey = NULL; /* dies with the endpoint */
    p->rkey_len = 0;
    if (p->link != NULL) {
        epd_link_t *l = p->link;

        p->link = NULL;
        l->peer = NULL;
        epd__link_shut(l, p->dead_status);
        l->down_reported = 1; /* the role heard of it as the peer's death */
        epd_link_unref(l);
    }
    while (p->in_links != NULL) {
        epd_link_t *l = p->in_links;

        p->in_links = l->peer_next;
        l->peer_next = NULL;
        l->peer = NULL;
        /* its messages and writes travel on it: closed now; the role drops
         * what it holds of it in on_link_down (next pump pass) */
        epd__link_shut(l, p->dead_status);
        epd_link_unref(l);
    }
    p->closed = 1;
    d->ops.on_peer_closed(d->cfg.arg, p);
}

int epd__peer_reap(epd_daemon_t *d)
{
    epd_peer_t *p = d->peers;
    int did = 0;

    d->peers_dirty = 0;
    while (p != NULL) {
        epd_peer_t *next = p->next;

        if (p->state == EPD_PEER_DEAD && !p->closed) {
            epd_peer_close(p);
            did = 1;
        }
        if (p->state == EPD_PEER_DEAD && p->closed && p->refs == 0) {
            epd_peer_free(p);
            did = 1;
        }
        p = next;
    }
    return did;
}

void epd__peer_free_all(epd_daemon_t *d)
{
    while (d->peers != NULL) {
        epd_peer_t *p = d->peers;

        d->peers = p->next;
        if (p->link != NULL) {
            p->link->peer = NULL;
        }
        for (epd_link_t *l = p->in_links; l != NULL; l = l->peer_next) {
            l->peer = NULL;
        }
        epd_free(p);
    }
}
