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
#include "epd_proc.h"
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
    epd_xport_grant_close(p->grant);
    epd_free(p->addr);
    epd_free(p);
}

/* Which process it is, from an endpoint whose handshake said so. */
static void epd_peer_learn_proc(epd_peer_t *peer, const epd_xport_ep_t *ep)
{
    if (!peer->proc_known && ep != NULL && epd_xport_ep_peer_proc(ep, &peer->proc) == EPD_OK) {
        peer->proc_known = 1;
    }
}

/*
 * May a retired incarnation be reached on a new link?  Only when its
 * process is known to live (on this host: its pid still names it) or to
 * run on another host: UCX 1.13.1 aborts the whole process (mm_posix.c
 * "length > 0") when it wires up shared memory to a worker address whose
 * process is gone, and a peer without a process block (no identity) could
 * be anything.
 */
static int epd_peer_reachable(const epd_peer_t *peer)
{
    epd_proc_id_t self;

    if (!peer->proc_known) {
        return 0;
    }
    if (epd_proc_self(&self) != EPD_OK || !epd_proc_same_host(&peer->proc, &self)) {
        return 1;
    }
    return !epd_proc_gone(&peer->proc, -1);
}

/* Every endpoint of the incarnation: our link's, then its own to us. */
static void epd_peer_bind_grant(epd_peer_t *peer)
{
    if (peer->link != NULL) {
        epd_peer_learn_proc(peer, peer->link->ep);
    }
    if (peer->grant == NULL) {
        return;
    }
    if (peer->link != NULL && peer->link->ep != NULL) {
        epd_xport_grant_bind(peer->grant, peer->link->ep);
    }
    for (epd_link_t *l = peer->in_links; l != NULL; l = l->peer_next) {
        if (l->ep != NULL) {
            epd_xport_grant_bind(peer->grant, l->ep);
        }
    }
}

void epd_peer_kill(epd_peer_t *peer, epd_status_t status, const char *why)
{
    epd_daemon_t *d = peer->d;

    if (peer->state == EPD_PEER_DEAD) {
        return;
    }
    if (peer->link != NULL && peer->link->ep != NULL) {
        peer->xid = epd_xport_ep_peer_id(peer->link->ep);
        epd_peer_learn_proc(peer, peer->link->ep);
    }
    if (peer->grant != NULL) {
        /* the fence: from now on no write of this incarnation starts
         * landing under its key; the grant settles when nothing of it can
         * land any more (a same-host writer that maps our memory: when its
         * process is gone) */
        epd_peer_bind_grant(peer);
        epd_xport_grant_revoke(peer->grant, NULL);
        epd_log_info(d->log, 0, "%s %s: its grant is revoked (%s)", peer->worker_id, why,
                     epd_xport_grant_state(peer->grant));
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
    p->addr = len > 0 ? epd_malloc(len) : NULL;
    if (p->addr == NULL) {
        epd_free(p);
        return EPD_ERR_NO_MEMORY;
    }
    memcpy(p->addr, addr, len);
    p->addr_len = len;
    p->d = d;
    snprintf(p->worker_id, sizeof(p->worker_id), "%s", worker_id);
    p->epoch = *epoch;
    p->role = role;
    p->state = EPD_PEER_CONNECTING;
    p->dead_status = EPD_OK;
    st = epd_link_connect(d, addr, len, &p->link);
    if (st != EPD_OK) {
        epd_free(p->addr);
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

/* ------------------------------------------------------------ the fence */

epd_status_t epd_peer_grant(epd_peer_t *peer, epd_xport_mr_t *mr, const void **key_p, size_t *len_p)
{
    epd_status_t st;

    if (peer->state == EPD_PEER_DEAD) {
        return EPD_ERR_PEER_DEAD;
    }
    if (peer->grant == NULL) {
        st = epd_xport_grant_open(mr, peer, &peer->grant);
        if (st != EPD_OK) {
            return st;
        }
        st = epd_xport_grant_pack(peer->grant, peer->gkey, sizeof(peer->gkey), &peer->gkey_len);
        if (st != EPD_OK) {
            epd_xport_grant_close(peer->grant);
            peer->grant = NULL;
            return st;
        }
        epd_peer_bind_grant(peer);
    }
    *key_p = peer->gkey;
    *len_p = peer->gkey_len;
    return EPD_OK;
}

int epd_peer_fenced(epd_peer_t *peer)
{
    return peer->state == EPD_PEER_DEAD && peer->closed &&
           (peer->grant == NULL || epd_xport_grant_settled(peer->grant));
}

const char *epd_peer_fence_state(const epd_peer_t *peer)
{
    return peer->grant != NULL ? epd_xport_grant_state(peer->grant) : "no grant";
}

/* A WritesQuiesced owed to a dead incarnation (epd_peer_owe_quiesced). */
struct epd_owed {
    struct epd_owed *next;
    epd_peer_t *peer; /* counted reference */
    uint64_t id;
    uint64_t since_ns;
};

static void epd_peer_owed_drop(epd_daemon_t *d, struct epd_owed **pp)
{
    struct epd_owed *o = *pp;

    *pp = o->next;
    d->n_owed--;
    epd_peer_unref(o->peer);
    epd_free(o);
}

void epd_peer_owe_quiesced(epd_peer_t *peer, uint64_t id)
{
    epd_daemon_t *d = peer->d;
    struct epd_owed *o, **pp;

    for (o = d->owed; o != NULL; o = o->next) {
        if (o->peer == peer && o->id == id) {
            return;
        }
    }
    if (d->n_owed >= EPD_PEER_OWED_MAX) {
        /* the oldest is at the end: its reader waits for our process to end */
        for (pp = &d->owed; (*pp)->next != NULL; pp = &(*pp)->next) {
        }
        epd_daemon_refuse_log(d, (*pp)->id,
                              "too many WritesQuiesced owed to dead peers: dropping the oldest "
                              "(its memory there stays quarantined until this process ends)");
        epd_peer_owed_drop(d, pp);
    }
    o = epd_calloc(1, sizeof(*o));
    if (o == NULL) {
        return; /* the reader waits for our process to end: safe, only slower */
    }
    o->peer = peer;
    epd_peer_ref(peer);
    o->id = id;
    o->since_ns = epd_time_now_ns();
    o->next = d->owed;
    d->owed = o;
    d->n_owed++;
}

void epd__peer_owed_flush(epd_daemon_t *d, uint64_t now)
{
    struct epd_owed **pp = &d->owed;

    while (*pp != NULL) {
        struct epd_owed *o = *pp;
        epd_peer_t *p = o->peer, *again = NULL;
        epd_status_t st;

        if (now - o->since_ns > (uint64_t)EPD_PEER_OWED_MS * EPD_NSEC_PER_MSEC) {
            epd_log_warn(d->log, o->id,
                         "giving up telling %s that this request's writes are quiesced: it "
                         "holds their memory until this process ends",
                         p->worker_id);
            epd_peer_owed_drop(d, pp);
            continue;
        }
        if (!epd_peer_reachable(p)) {
            /* its process is gone (nothing holds memory for us there) or
             * unknown: nothing to tell */
            epd_log_debug(d->log, o->id,
                          "not telling %s that this request's writes are quiesced: "
                          "its process is gone or unknown",
                          p->worker_id);
            epd_peer_owed_drop(d, pp);
            continue;
        }
        if (d->x == NULL || epd_xport_limbo(d->x, p->xid) > 0) {
            /* a write the library may still move: not yet true */
            pp = &o->next;
            continue;
        }
        /* the same incarnation, on a new link (the old one is closed) */
        st = epd_peer_get(d, p->role, p->worker_id, &p->epoch, p->addr, p->addr_len, &again);
        if (st == EPD_OK) {
            (void)epd_link_send_quiesced(epd_peer_link(again), o->id);
            epd_log_info(d->log, o->id,
                         "told %s, which declared this worker dead, that this request's writes "
                         "are quiesced",
                         p->worker_id);
            epd_peer_unref(again);
        } else {
            epd_log_debug(d->log, o->id, "cannot reach %s again to quiesce: %s", p->worker_id,
                          epd_status_string(st));
        }
        epd_peer_owed_drop(d, pp);
    }
}

epd_status_t epd_peer_ask_quiesced(epd_peer_t *peer, uint64_t id, const char *why)
{
    epd_daemon_t *d = peer->d;
    epd_peer_t *again = NULL;
    epd_status_t st;

    if (peer->state != EPD_PEER_DEAD) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (d->stopping) {
        return EPD_ERR_CANCELED;
    }
    if (!epd_peer_reachable(peer)) {
        return EPD_ERR_PEER_DEAD;
    }
    /* the same incarnation, on a new link (its old ones are closed) */
    st = epd_peer_get(d, peer->role, peer->worker_id, &peer->epoch, peer->addr, peer->addr_len,
                      &again);
    if (st != EPD_OK) {
        return st;
    }
    st = epd_link_send_abort(epd_peer_link(again), id, EPD_ERR_CANCELED, why);
    epd_peer_unref(again);
    return st;
}

int epd_peer_may_quiesce(epd_daemon_t *d, epd_link_t *from, const Epd__Envelope *env,
                         int reader_role)
{
    epd_peer_t *p = epd_peer_find(d, env->sender->worker_id);
    epd_xport_identity_t id;
    int authenticated = 0, role_ok;

    if (from == NULL || from->ep == NULL) {
        return 0;
    }
    if (p != NULL) {
        role_ok = p->role == reader_role;
    } else {
        /* a retired incarnation asking: the role it presented on this
         * endpoint (the daemon checked the envelope's sender against it
         * when a secret is configured) */
        role_ok = epd_xport_ep_identity(from->ep, &id, &authenticated) == EPD_OK &&
                  id.role == reader_role && strcmp(id.worker_id, env->sender->worker_id) == 0;
    }
    return role_ok && (d->x == NULL || epd_xport_limbo(d->x, epd_link_peer_xid(from)) == 0);
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

/* Is a dead record of exactly (worker_id, epoch) still held by someone? */
static int epd_peer_retired_held(epd_daemon_t *d, const char *worker_id,
                                 const epd_msg_epoch_t *epoch)
{
    for (epd_peer_t *p = d->peers; p != NULL; p = p->next) {
        if (p->state == EPD_PEER_DEAD && p->refs > 0 && strcmp(p->worker_id, worker_id) == 0 &&
            epd_msg_epoch_cmp(&p->epoch, epoch) == 0) {
            return 1;
        }
    }
    return 0;
}

int epd__peer_on_sender(epd_daemon_t *d, epd_link_t *from, const Epd__Envelope *env)
{
    epd_msg_epoch_t e = epd_msg_epoch_of(env->sender->epoch);
    epd_peer_t *p = epd_peer_find(d, env->sender->worker_id);
    int cmp;

    if (p == NULL) {
        return 0;
    }
    cmp = epd_msg_epoch_cmp(&e, &p->epoch);
    if (cmp < 0 && env->body_case == EPD__ENVELOPE__BODY_QUIESCED &&
        epd_peer_retired_held(d, env->sender->worker_id, &e)) {
        /* a retired incarnation whose record something still holds (its
         * quarantined memory) confirms that its writes are quiesced: the
         * fence's proof (rule 28) — it frees only memory held for that very
         * incarnation (the role matches it against its own record) */
        return 0;
    }
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
    epd_peer_learn_proc(p, from->ep);
    if (p->grant != NULL && from->ep != NULL) {
        /* which process it is, while it is surely alive */
        epd_xport_grant_bind(p->grant, from->ep);
    }
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

void epd__peer_close_grants(epd_daemon_t *d)
{
    for (epd_peer_t *p = d->peers; p != NULL; p = p->next) {
        epd_xport_grant_close(p->grant);
        p->grant = NULL;
    }
}

void epd__peer_free_all(epd_daemon_t *d)
{
    while (d->owed != NULL) {
        struct epd_owed *o = d->owed;

        d->owed = o->next;
        epd_free(o);
    }
    while (d->peers != NULL) {
        epd_peer_t *p = d->peers;

        d->peers = p->next;
        epd_free(p->addr);
        if (p->link != NULL) {
            p->link->peer = NULL;
        }
        for (epd_link_t *l = p->in_links; l != NULL; l = l->peer_next) {
            l->peer = NULL;
        }
        epd_free(p);
    }
}
