/*
 * epd_prefill_msg.c — prefill's request plane (proto/README.md), on the
 * loop thread, called from the transport (messages, accepted endpoints,
 * endpoint errors).
 *
 * Messages are identified by their Envelope.sender, never by the endpoint
 * they came in on: replies to a client go back on the endpoint its
 * GenerateRequest came in on, everything for a decode worker goes on OUR
 * endpoint to it (one per worker id + epoch, connected at the first request
 * naming it), because the fence of PrefillComplete / WritesQuiesced orders
 * them behind the writes posted on that endpoint.
 *
 * Races the protocol allows and how they are handled:
 *   - decode's KvReservation (or KvRefused) may overtake the client's
 *     GenerateRequest (different senders, different endpoints): it is kept
 *     (bounded stash) and applied when the request arrives; one never
 *     claimed within the lease is answered Error + WritesQuiesced.
 *   - an Abort may be answered (WritesQuiesced) before a late message of
 *     the same id arrives: the id is remembered (tombstone) so a late
 *     GenerateRequest is refused — writing after "quiesced" is the very
 *     recycle race the protocol exists to prevent.
 *   - a newer epoch of a decode worker retires the old endpoint: requests
 *     bound to the old incarnation fail at once; messages from an older
 *     epoch are refused (EPD_ERR_STALE_EPOCH).
 * An Error is never answered with an Error.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_layout.h"
#include "epd_log.h"
#include "epd_prefill_int.h"
#include "epd_time.h"

#define EPD_PREFILL_LOG_BURST 20 /* rate-limited warnings per second */

int epd__prefill_log_allowed(epd_prefill_srv_t *srv)
{
    return epd_log_limit_ok(&srv->log_limit, EPD_PREFILL_LOG_BURST);
}

#define EPD_PREFILL_WARN(srv, req, ...)                                                            \
    do {                                                                                           \
        if (epd__prefill_log_allowed(srv)) {                                                       \
            epd_log_warn(EPD_PREFILL_LOG, req, __VA_ARGS__);                                       \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------------------ sends */

epd_status_t epd__prefill_send(epd_prefill_srv_t *srv, epd_xport_ep_t *ep,
                               Epd__Envelope__BodyCase body_case, void *body, unsigned flags)
{
    epd_status_t st;
    size_t len;

    if (ep == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    st = epd_msg_encode_body(srv->worker_id, &srv->epoch, ++srv->seq, body_case, body, srv->tx_buf,
                             srv->tx_cap, &len);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot encode a message of kind %d: %s", (int)body_case,
                      epd_status_string(st));
        return st;
    }
    return epd_xport_send(ep, srv->tx_buf, len, flags);
}

epd_status_t epd__prefill_send_error_by(epd_prefill_srv_t *srv, epd_xport_ep_t *ep, uint64_t id,
                                        epd_status_t status, const char *msg, const char *culprit)
{
    Epd__Error e = EPD__ERROR__INIT;
    char text[200];

    snprintf(text, sizeof(text), "%s", msg);
    e.request_id = id;
    e.status = (int32_t)status;
    e.message = text;
    if (culprit != NULL && culprit[0] != '\0') {
        e.culprit = (char *)culprit;
    }
    return epd__prefill_send(srv, ep, EPD__ENVELOPE__BODY_ERROR, &e, 0);
}

epd_status_t epd__prefill_send_error(epd_prefill_srv_t *srv, epd_xport_ep_t *ep, uint64_t id,
                                     epd_status_t status, const char *msg)
{
    return epd__prefill_send_error_by(srv, ep, id, status, msg, NULL);
}

static void epd_prefill_send_quiesced(epd_prefill_srv_t *srv, epd_xport_ep_t *ep, uint64_t id)
{
    Epd__WritesQuiesced q = EPD__WRITES_QUIESCED__INIT;

    q.request_id = id;
    if (epd__prefill_send(srv, ep, EPD__ENVELOPE__BODY_QUIESCED, &q, EPD_XPORT_SEND_FENCE) !=
        EPD_OK) {
        EPD_PREFILL_WARN(srv, id, "could not answer WritesQuiesced (nothing was in flight)");
    }
}

/* Refuses a request: one log line and an Error to whoever asked. */
static void epd_prefill_refuse(epd_prefill_srv_t *srv, epd_xport_ep_t *ep, uint64_t id,
                               epd_status_t status, const char *what)
{
    EPD_PREFILL_WARN(srv, id, "refused: %s (%s)", what, epd_status_name(status));
    if (epd__prefill_send_error(srv, ep, id, status, what) != EPD_OK) {
        EPD_PREFILL_WARN(srv, id, "could not send the refusal");
    }
}

/* ------------------------------------------------------------- tombstones */

static uint64_t epd_prefill_tomb_ttl_ns(const epd_prefill_srv_t *srv)
{
    uint64_t ms = (uint64_t)srv->lease_ms * 10;

    return (ms < 60000 ? 60000 : ms) * EPD_NSEC_PER_MSEC;
}

void epd__prefill_tomb_add(epd_prefill_srv_t *srv, uint64_t id)
{
    srv->tombs[srv->tomb_next].id = id;
    srv->tombs[srv->tomb_next].expires_ns = epd_time_now_ns() + epd_prefill_tomb_ttl_ns(srv);
    srv->tomb_next = (srv->tomb_next + 1) % EPD_PREFILL_TOMB_MAX;
}

static int epd_prefill_tomb_has(const epd_prefill_srv_t *srv, uint64_t id)
{
    uint64_t now = epd_time_now_ns();

    for (uint32_t i = 0; i < EPD_PREFILL_TOMB_MAX; i++) {
        if (srv->tombs[i].id == id && srv->tombs[i].expires_ns > now) {
            return 1;
        }
    }
    return 0;
}

static void epd_prefill_known_d_add(epd_prefill_srv_t *srv, const char *worker_id)
{
    for (uint32_t i = 0; i < 32; i++) {
        if (strcmp(srv->known_d[i], worker_id) == 0) {
            return;
        }
    }
    snprintf(srv->known_d[srv->known_d_next], EPD_PREFILL_ID_MAX, "%s", worker_id);
    srv->known_d_next = (srv->known_d_next + 1) % 32;
}

static int epd_prefill_known_d(const epd_prefill_srv_t *srv, const char *worker_id)
{
    for (uint32_t i = 0; i < 32; i++) {
        if (srv->known_d[i][0] != '\0' && strcmp(srv->known_d[i], worker_id) == 0) {
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ stash */

static int epd_prefill_stash_find(const epd_prefill_srv_t *srv, uint64_t id)
{
    for (uint32_t i = 0; i < srv->n_stash; i++) {
        if (epd_msg_request_id(srv->stash[i].env) == id) {
            return (int)i;
        }
    }
    return -1;
}

/* Removes entry i; the caller takes its envelope. */
static Epd__Envelope *epd_prefill_stash_take(epd_prefill_srv_t *srv, uint32_t i,
                                             epd_xport_ep_t **ep_p)
{
    Epd__Envelope *env = srv->stash[i].env;

    *ep_p = srv->stash[i].ep;
    srv->stash[i] = srv->stash[--srv->n_stash];
    return env;
}

/* A stashed decode message whose request will never run here: answer it
 * (reservation: Error + WritesQuiesced, so decode may recycle at once). */
static void epd_prefill_stash_answer(epd_prefill_srv_t *srv, Epd__Envelope *env, epd_xport_ep_t *ep,
                                     epd_status_t status, const char *why)
{
    uint64_t id = epd_msg_request_id(env);

    if (ep != NULL && env->body_case == EPD__ENVELOPE__BODY_RESERVATION) {
        (void)epd__prefill_send_error(srv, ep, id, status, why);
        epd_prefill_send_quiesced(srv, ep, id);
    }
    EPD_PREFILL_WARN(srv, id, "dropping an early %s from '%s': %s", epd_msg_body_name(env),
                     env->sender->worker_id, why);
    epd_msg_free(env);
}

void epd__prefill_msg_tick(epd_prefill_srv_t *srv, uint64_t now)
{
    for (uint32_t i = 0; i < srv->n_stash;) {
        if (srv->stash[i].expires_ns <= now) {
            epd_xport_ep_t *ep;
            Epd__Envelope *env = epd_prefill_stash_take(srv, i, &ep);

            epd_prefill_stash_answer(srv, env, ep, EPD_ERR_NOT_FOUND,
                                     "no GenerateRequest for this id arrived within the lease");
        } else {
            i++;
        }
    }
}

/* ------------------------------------------------------------------ peers */

static void epd_prefill_on_connected(void *arg, epd_status_t status)
{
    epd_prefill_peer_t *peer = arg;

    if (status == EPD_OK && peer->state == EPD_PREFILL_PEER_CONNECTING) {
        peer->state = EPD_PREFILL_PEER_UP;
        epd_log_debug(EPD_PREFILL_LOG, 0, "connected to decode '%s'", peer->worker_id);
    }
    /* failures arrive through the error callback right after */
}

/* Declares a peer dead: its requests fail (the client is told), its
 * endpoint is closed by the pump.  Nested-safe. */
static void epd_prefill_peer_kill(epd_prefill_srv_t *srv, epd_prefill_peer_t *peer,
                                  epd_status_t status, const char *why)
{
    char msg[200];

    if (peer->state == EPD_PREFILL_PEER_DEAD) {
        return;
    }
    peer->state = EPD_PREFILL_PEER_DEAD;
    peer->dead_status = status;
    peer->listed = 0;
    snprintf(msg, sizeof(msg), "%s worker '%s' %s",
             peer->role == EPD_PREFILL_ROLE_ENCODER ? "encoder" : "decode", peer->worker_id, why);
    epd_log_warn(EPD_PREFILL_LOG, 0, "%s: failing its requests", msg);
    for (epd_prefill_req_t *req = srv->all; req != NULL; req = req->all_next) {
        if (peer->role == EPD_PREFILL_ROLE_DECODE && req->peer == peer) {
            epd__prefill_req_fail(srv, req, EPD_ERR_PEER_DEAD, msg, 1, 0, 0);
            continue;
        }
        for (uint32_t i = 0; i < req->n_media; i++) {
            if (req->media[i].state == EPD_PREFILL_MEDIA_ENCODER && req->media[i].enc == peer) {
                /* before any token: the client may retry with another
                 * encoder (the Error names it) */
                if (!req->failed) {
                    snprintf(req->fail_culprit, sizeof(req->fail_culprit), "%s", peer->worker_id);
                }
                epd__prefill_req_fail(srv, req, EPD_ERR_PEER_DEAD, msg, 1, 1, 1);
                break;
            }
        }
    }
    /* the pump closes the endpoint even when no request is bound */
    if (!srv->pump_on && !srv->stopping) {
        srv->pump_on = 1;
        uv_idle_start(&srv->pump, epd__prefill_on_pump);
    }
}

static void epd_prefill_peer_free(epd_prefill_srv_t *srv, epd_prefill_peer_t *peer)
{
    epd_prefill_peer_t **pp = &srv->peers;

    while (*pp != NULL && *pp != peer) {
        pp = &(*pp)->next;
    }
    if (*pp == peer) {
        *pp = peer->next;
    }
    epd_free(peer);
}

void epd__prefill_peer_unref(epd_prefill_srv_t *srv, epd_prefill_peer_t *peer)
{
    if (peer == NULL) {
        return;
    }
    peer->n_reqs--;
    if (peer->n_reqs == 0 && peer->state == EPD_PREFILL_PEER_DEAD && peer->ep == NULL) {
        epd_prefill_peer_free(srv, peer);
    }
}

/* Drops every pointer to an accepted endpoint about to be closed. */
static void epd_prefill_forget_in_ep(epd_prefill_srv_t *srv, epd_xport_ep_t *ep)
{
    for (epd_prefill_req_t *req = srv->all; req != NULL; req = req->all_next) {
        if (req->client_ep == ep) {
            req->client_ep = NULL;
            req->tell_client = 0;
        }
    }
    for (uint32_t i = 0; i < srv->n_stash; i++) {
        if (srv->stash[i].ep == ep) {
            srv->stash[i].ep = NULL;
        }
    }
}

void epd__prefill_peers_reap(epd_prefill_srv_t *srv)
{
    epd_prefill_peer_t *peer = srv->peers;

    while (peer != NULL) {
        epd_prefill_peer_t *next = peer->next;

        if (peer->state == EPD_PREFILL_PEER_DEAD && peer->ep != NULL) {
            epd_xport_ep_t *ep = peer->ep;

            /* closing destroys the keys unpacked on the endpoint: forget them
             * first; the close completes the writes still posted (their
             * callbacks only count) */
            for (epd_prefill_req_t *req = srv->all; req != NULL; req = req->all_next) {
                if (req->peer == peer) {
                    req->rkey = NULL;
                }
            }
            peer->rkey = NULL;
            peer->ep = NULL;
            epd_xport_ep_close(ep);
            if (peer->role == EPD_PREFILL_ROLE_ENCODER) {
                /* the encoder's own endpoint to us too: nothing of that
                 * incarnation can land any more, so its quarantined slots
                 * are free */
                if (peer->in_ep != NULL) {
                    epd_xport_ep_t *in = peer->in_ep;

                    peer->in_ep = NULL;
                    epd_prefill_forget_in_ep(srv, in);
                    epd_xport_ep_close(in);
                }
                /* freeing its slots drops their references: hold one so
                 * that the peer is freed below, not inside */
                peer->n_reqs++;
                epd__prefill_media_encoder_gone(srv, peer);
                peer->n_reqs--;
            }
        }
        if (peer->state == EPD_PREFILL_PEER_DEAD && peer->ep == NULL && peer->n_reqs == 0) {
            epd_prefill_peer_free(srv, peer);
        }
        peer = next;
    }
}

epd_status_t epd__prefill_peer_get(epd_prefill_srv_t *srv, epd_prefill_role_t role,
                                   const char *worker_id, const epd_prefill_epoch_t *epoch,
                                   const void *addr, size_t addr_len, epd_prefill_peer_t **peer_p)
{
    epd_prefill_peer_t *peer;
    epd_status_t st;

    for (peer = srv->peers; peer != NULL; peer = peer->next) {
        int cmp;

        if (!peer->listed || peer->role != role || strcmp(peer->worker_id, worker_id) != 0) {
            continue;
        }
        cmp = epd_msg_epoch_cmp(&peer->epoch, epoch);
        if (cmp == 0) {
            *peer_p = peer;
            return EPD_OK;
        }
        if (cmp > 0) {
            return EPD_ERR_STALE_EPOCH;
        }
        epd_prefill_peer_kill(srv, peer, EPD_ERR_STALE_EPOCH, "restarted (newer epoch seen)");
    }
    peer = epd_calloc(1, sizeof(*peer));
    if (peer == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    snprintf(peer->worker_id, sizeof(peer->worker_id), "%s", worker_id);
    peer->epoch = *epoch;
    peer->role = role;
    peer->state = EPD_PREFILL_PEER_CONNECTING;
    st = epd_xport_connect(srv->x, addr, addr_len, epd_prefill_on_connected, peer, &peer->ep);
    if (st != EPD_INPROGRESS && st != EPD_OK) {
        epd_free(peer);
        return st;
    }
    peer->listed = 1;
    peer->next = srv->peers;
    srv->peers = peer;
    *peer_p = peer;
    return EPD_OK;
}

/* Checks a message's sender against the decode peers: refuses an older
 * epoch of a known worker, retires a known worker's older incarnation when
 * a newer one speaks.  Returns nonzero when the message must be dropped. */
static int epd_prefill_sender_stale(epd_prefill_srv_t *srv, epd_xport_ep_t *ep,
                                    const Epd__Envelope *env)
{
    epd_prefill_epoch_t epoch = epd_msg_epoch_of(env->sender->epoch);

    for (epd_prefill_peer_t *peer = srv->peers; peer != NULL; peer = peer->next) {
        int cmp;

        if (!peer->listed || strcmp(peer->worker_id, env->sender->worker_id) != 0) {
            continue;
        }
        cmp = epd_msg_epoch_cmp(&peer->epoch, &epoch);
        if (cmp > 0) {
            uint64_t id = epd_msg_request_id(env);

            EPD_PREFILL_WARN(srv, id, "refusing a %s from an older epoch of '%s'",
                             epd_msg_body_name(env), peer->worker_id);
            if (env->body_case != EPD__ENVELOPE__BODY_ERROR) {
                (void)epd__prefill_send_error(srv, ep, id, EPD_ERR_STALE_EPOCH,
                                              "message from a stale epoch");
            }
            return 1;
        }
        if (cmp < 0) {
            epd_prefill_peer_kill(srv, peer, EPD_ERR_STALE_EPOCH, "restarted (newer epoch seen)");
        }
    }
    return 0;
}

/* Is `env`'s sender the decode incarnation `req` is bound to? */
static int epd_prefill_from_decode(const epd_prefill_req_t *req, const Epd__Envelope *env)
{
    epd_prefill_epoch_t epoch = epd_msg_epoch_of(env->sender->epoch);

    if (req->peer == NULL) {
        return 0; /* prefill-only: no decode worker speaks about it */
    }
    return strcmp(env->sender->worker_id, req->peer->worker_id) == 0 &&
           epd_msg_epoch_cmp(&epoch, &req->peer->epoch) == 0;
}

/* --------------------------------------------------------------- handlers */

void epd__prefill_apply_reservation(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                    const Epd__KvReservation *r)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    epd_prefill_place_t place;
    const char *why = NULL;
    char msg[200];
    epd_status_t st;

    st = epd_layout_check(kv, r->layout, &why);
    if (st != EPD_OK) {
        snprintf(msg, sizeof(msg), "reservation refused: KV layout differs (%s)", why);
        epd__prefill_req_fail(srv, req, EPD_ERR_INVALID_PARAM, msg, 1, 1, 1);
        return;
    }
    memset(&place, 0, sizeof(place));
    place.block_ids = r->block_ids;
    place.n_blocks = r->n_block_ids > UINT32_MAX ? UINT32_MAX : (uint32_t)r->n_block_ids;
    place.state_slot = r->state_slot;
    place.pool_blocks = r->pool_blocks;
    place.pool_state_slots = r->pool_state_slots;
    st = epd_prefill_plan_check(kv, req->n_blocks, &place, r->region_size, &why);
    if (st != EPD_OK) {
        snprintf(msg, sizeof(msg),
                 "reservation refused: %s (%zu blocks, pool %u blocks/%u slots, "
                 "region %llu bytes)",
                 why, r->n_block_ids, r->pool_blocks, r->pool_state_slots,
                 (unsigned long long)r->region_size);
        epd__prefill_req_fail(srv, req, st == EPD_ERR_NO_MEMORY ? st : EPD_ERR_OUT_OF_RANGE, msg, 1,
                              1, 1);
        return;
    }
    if (req->peer->state == EPD_PREFILL_PEER_DEAD || req->peer->ep == NULL) {
        epd__prefill_req_fail(srv, req, EPD_ERR_PEER_DEAD, "decode worker is gone", 1, 0, 0);
        return;
    }
    if (req->peer->rkey != NULL && req->peer->rkey_len == r->rkey.len &&
        memcmp(req->peer->rkey_blob, r->rkey.data, r->rkey.len) == 0) {
        req->rkey = req->peer->rkey;
        req->rkey_shared = 1;
        st = EPD_OK;
    } else {
        st = epd_xport_rkey_unpack(req->peer->ep, r->rkey.data, r->rkey.len, &req->rkey);
        if (st == EPD_OK && req->peer->rkey == NULL && r->rkey.len <= EPD_XPORT_RKEY_MAX &&
            epd_xport_rkey_size(req->rkey) >= r->region_size) {
            /* the first key of this decode incarnation: keep it for the next */
            req->peer->rkey = req->rkey;
            memcpy(req->peer->rkey_blob, r->rkey.data, r->rkey.len);
            req->peer->rkey_len = r->rkey.len;
            req->rkey_shared = 1;
        }
    }
    if (st != EPD_OK) {
        req->rkey = NULL;
        snprintf(msg, sizeof(msg), "reservation refused: remote key does not unpack (%s)",
                 epd_status_string(st));
        epd__prefill_req_fail(srv, req, st == EPD_ERR_BAD_RKEY ? st : EPD_ERR_PEER_DEAD, msg, 1, 1,
                              1);
        return;
    }
    if (epd_xport_rkey_size(req->rkey) < r->region_size) {
        snprintf(msg, sizeof(msg), "reservation refused: region of %llu bytes, key covers %zu",
                 (unsigned long long)r->region_size, epd_xport_rkey_size(req->rkey));
        if (!req->rkey_shared) {
            epd_xport_rkey_destroy(req->rkey);
        }
        req->rkey = NULL;
        req->rkey_shared = 0;
        epd__prefill_req_fail(srv, req, EPD_ERR_OUT_OF_RANGE, msg, 1, 1, 1);
        return;
    }
    memcpy(req->remote_blocks, r->block_ids, (size_t)req->n_blocks * sizeof(uint32_t));
    req->remote = place;
    req->remote.block_ids = req->remote_blocks;
    req->region_size = r->region_size;
    req->d_lease_ms = r->lease_ms;
    req->have_resv = 1;
    epd_log_debug(EPD_PREFILL_LOG, req->id, "reservation: %u blocks, slot %u, after %u layers",
                  req->n_blocks, r->state_slot, req->layers_done);
    epd__prefill_req_reserved(srv, req);
}

/* A message from decode about a live request (reservation, refusal). */
static void epd_prefill_decode_msg(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                   epd_xport_ep_t *ep, const Epd__Envelope *env)
{
    if (!epd_prefill_from_decode(req, env)) {
        epd_prefill_refuse(srv, ep, req->id, EPD_ERR_INVALID_PARAM,
                           "sender is not the decode worker of this request");
        return;
    }
    if (env->body_case == EPD__ENVELOPE__BODY_REFUSED) {
        const Epd__KvRefused *rf = env->refused;
        epd_status_t st = rf->status < 0 ? (epd_status_t)rf->status : EPD_ERR_NO_CAPACITY;
        char msg[200];

        snprintf(msg, sizeof(msg), "decode '%s' refused the KV reservation: %s",
                 req->peer->worker_id, rf->reason != NULL ? rf->reason : "");
        epd__prefill_req_fail(srv, req, st, msg, 1, 0, 0);
        return;
    }
    if (req->failed) {
        return; /* its WritesQuiesced is (or was) on its way */
    }
    if (req->have_resv) {
        epd_prefill_refuse(srv, ep, req->id, EPD_ERR_EXISTS, "a second reservation");
        return;
    }
    epd__prefill_apply_reservation(srv, req, env->reservation);
}

static void epd_prefill_on_generate(epd_prefill_srv_t *srv, epd_xport_ep_t *ep,
                                    const Epd__Envelope *env)
{
    const Epd__GenerateRequest *g = env->generate;
    const epd_engine_info_t *info = srv->info;
    uint64_t id = g->request_id;
    epd_prefill_epoch_t own = srv->epoch;
    epd_prefill_epoch_t want = epd_msg_epoch_of(g->prefill_epoch);
    epd_prefill_epoch_t d_epoch = epd_msg_epoch_of(g->decode_epoch);
    epd_sample_params_t sp;
    epd_prefill_peer_t *peer = NULL;
    epd_prefill_req_t *req = NULL;
    uint64_t t_recv = epd_time_now_ns();
    int only = g->prefill_only != 0;
    char msg[200];
    epd_status_t st;
    int si;

    if (!only && g->decode_worker_id != NULL && g->decode_worker_id[0] != '\0') {
        epd_prefill_known_d_add(srv, g->decode_worker_id);
    }
    st = EPD_OK;
    if (srv->draining || srv->stopping) {
        st = EPD_ERR_DRAINING;
        snprintf(msg, sizeof(msg), "prefill worker '%s' is draining", srv->worker_id);
    } else if (g->prefill_epoch == NULL || epd_msg_epoch_cmp(&own, &want) != 0) {
        st = EPD_ERR_STALE_EPOCH;
        snprintf(msg, sizeof(msg), "request names another epoch of prefill worker '%s'",
                 srv->worker_id);
    } else if (g->prefill_worker_id != NULL && g->prefill_worker_id[0] != '\0' &&
               strcmp(g->prefill_worker_id, srv->worker_id) != 0) {
        st = EPD_ERR_NOT_FOUND;
        snprintf(msg, sizeof(msg), "request is for prefill worker '%.60s', this is '%.60s'",
                 g->prefill_worker_id, srv->worker_id);
    } else if (epd__prefill_req_find(srv, id) != NULL) {
        st = EPD_ERR_EXISTS;
        snprintf(msg, sizeof(msg), "request id %llu is already live", (unsigned long long)id);
    } else if (epd_prefill_tomb_has(srv, id)) {
        st = EPD_ERR_CANCELED;
        snprintf(msg, sizeof(msg), "request id %llu was aborted or failed here",
                 (unsigned long long)id);
    } else if (g->n_prompt_tokens == 0) {
        st = EPD_ERR_INVALID_PARAM;
        snprintf(msg, sizeof(msg), "empty prompt");
    } else if (g->n_prompt_tokens > info->max_context) {
        st = EPD_ERR_TOO_LONG;
        snprintf(msg, sizeof(msg), "prompt of %zu tokens exceeds the context limit of %u",
                 g->n_prompt_tokens, info->max_context);
    } else if (g->n_media > 0 &&
               (st = epd__prefill_media_check(srv, g, msg, sizeof(msg))) != EPD_OK) {
        /* msg says why */
    } else if (!only && (g->decode_worker_id == NULL || g->decode_worker_id[0] == '\0' ||
                         strlen(g->decode_worker_id) >= EPD_PREFILL_ID_MAX ||
                         g->decode_epoch == NULL || g->decode_address.len == 0)) {
        st = EPD_ERR_INVALID_PARAM;
        snprintf(msg, sizeof(msg), "request names no (valid) decode worker, epoch and address");
    }
    for (size_t i = 0; st == EPD_OK && i < g->n_prompt_tokens; i++) {
        if (g->prompt_tokens[i] >= info->vocab_size) {
            st = EPD_ERR_INVALID_PARAM;
            snprintf(msg, sizeof(msg), "prompt token %zu is %u, vocabulary has %u", i,
                     g->prompt_tokens[i], info->vocab_size);
        }
    }
    epd_sample_params_default(&sp);
    if (st == EPD_OK && g->sampling != NULL) {
        sp.temperature = g->sampling->temperature;
        sp.top_k = g->sampling->top_k;
        sp.top_p = g->sampling->top_p == 0.0f ? 1.0f : g->sampling->top_p;
        sp.seed = g->sampling->seed;
        if (epd_sample_params_check(&sp) != EPD_OK) {
            st = EPD_ERR_INVALID_PARAM;
            snprintf(msg, sizeof(msg), "bad sampling parameters (temperature %g, top_p %g)",
                     (double)sp.temperature, (double)sp.top_p);
        }
    }
    if (st == EPD_OK && !only) {
        st = epd__prefill_peer_get(srv, EPD_PREFILL_ROLE_DECODE, g->decode_worker_id, &d_epoch,
                                   g->decode_address.data, g->decode_address.len, &peer);
        if (st != EPD_OK) {
            snprintf(msg, sizeof(msg), "decode worker '%.60s': %s", g->decode_worker_id,
                     st == EPD_ERR_STALE_EPOCH ? "a newer epoch of it is known"
                                               : epd_status_string(st));
        }
    }
    if (st == EPD_OK) {
        st = epd__prefill_req_admit(srv, id, g->prompt_tokens, (uint32_t)g->n_prompt_tokens, &sp,
                                    (uint32_t)g->n_media, ep, env->sender->worker_id, peer, &req);
        if (st == EPD_ERR_NO_CAPACITY) {
            snprintf(msg, sizeof(msg),
                     "no local capacity for %zu tokens (%u blocks, %u slots free)",
                     g->n_prompt_tokens, srv->n_free_blocks, srv->n_free_slots);
        } else if (st != EPD_OK) {
            snprintf(msg, sizeof(msg), "cannot admit the request: %s", epd_status_string(st));
        }
    }
    si = epd_prefill_stash_find(srv, id);
    if (st != EPD_OK) {
        epd_prefill_refuse(srv, ep, id, st, msg);
        if (si >= 0) {
            epd_xport_ep_t *sep;
            Epd__Envelope *senv = epd_prefill_stash_take(srv, (uint32_t)si, &sep);

            epd_prefill_stash_answer(srv, senv, sep, st, msg);
        }
        return;
    }
    req->prefill_only = only;
    epd_trace_instant(srv->trace,
                      only ? "GenerateRequest received (prefill only)" : "GenerateRequest received",
                      "msg", id, -1, t_recv);
    epd_log_debug(EPD_PREFILL_LOG, id, "admitted: %u tokens, %u blocks, slot %u, decode '%s'",
                  req->n_tokens, req->n_blocks, req->slot,
                  peer != NULL ? peer->worker_id : "(none: prefill only)");
    if (g->n_media > 0) {
        epd__prefill_media_start(srv, req, g);
    }
    if (si >= 0) {
        epd_xport_ep_t *sep;
        Epd__Envelope *senv = epd_prefill_stash_take(srv, (uint32_t)si, &sep);

        if (epd_prefill_from_decode(req, senv)) {
            epd_prefill_decode_msg(srv, req, sep, senv);
        } else {
            epd_prefill_stash_answer(srv, senv, sep, EPD_ERR_INVALID_PARAM,
                                     "sender is not the decode worker of this request");
        }
        epd_msg_free(senv);
    }
}

/* Returns nonzero when `env` was kept (the stash owns it now). */
static int epd_prefill_on_reservation(epd_prefill_srv_t *srv, epd_xport_ep_t *ep,
                                      Epd__Envelope *env)
{
    uint64_t id = epd_msg_request_id(env);
    epd_prefill_req_t *req = epd__prefill_req_find(srv, id);

    if (req != NULL) {
        epd_prefill_decode_msg(srv, req, ep, env);
        return 0;
    }
    if (epd_prefill_tomb_has(srv, id) || epd_prefill_stash_find(srv, id) >= 0 ||
        srv->n_stash == EPD_PREFILL_STASH_MAX) {
        if (env->body_case == EPD__ENVELOPE__BODY_RESERVATION) {
            EPD_PREFILL_WARN(srv, id, "reservation for a request that is not live here");
            (void)epd__prefill_send_error(srv, ep, id, EPD_ERR_NOT_FOUND,
                                          "no such request on this prefill worker");
            epd_prefill_send_quiesced(srv, ep, id);
        }
        return 0;
    }
    /* may have overtaken the client's GenerateRequest: keep it for a lease */
    srv->stash[srv->n_stash].env = env;
    srv->stash[srv->n_stash].ep = ep;
    srv->stash[srv->n_stash].expires_ns =
        epd_time_now_ns() + (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    srv->n_stash++;
    epd_log_debug(EPD_PREFILL_LOG, id, "%s before its request: kept", epd_msg_body_name(env));
    return 1;
}

static void epd_prefill_on_abort(epd_prefill_srv_t *srv, epd_xport_ep_t *ep,
                                 const Epd__Envelope *env)
{
    uint64_t id = env->abort->request_id;
    epd_prefill_req_t *req = epd__prefill_req_find(srv, id);
    const char *who = env->sender->worker_id;
    char msg[200];
    int si;

    if (req == NULL) {
        /* nothing of it is in flight; remember the id so a late request or
         * reservation never starts writing after this answer */
        epd__prefill_tomb_add(srv, id);
        si = epd_prefill_stash_find(srv, id);
        if (si >= 0) {
            epd_xport_ep_t *sep;
            Epd__Envelope *senv = epd_prefill_stash_take(srv, (uint32_t)si, &sep);

            epd_prefill_stash_answer(srv, senv, sep, EPD_ERR_CANCELED, "aborted");
        } else if (epd_prefill_known_d(srv, who)) {
            epd_prefill_send_quiesced(srv, ep, id);
        }
        epd_log_debug(EPD_PREFILL_LOG, id, "abort from '%s' for a request not live here", who);
        return;
    }
    if (strcmp(who, req->client_id) != 0 && !epd_prefill_from_decode(req, env)) {
        epd_prefill_refuse(srv, ep, id, EPD_ERR_NOT_FOUND,
                           "abort from neither the client nor the decode worker of this request");
        return;
    }
    snprintf(msg, sizeof(msg), "abort from '%.60s': %.100s", who,
             env->abort->reason != NULL ? env->abort->reason : "");
    epd__prefill_req_fail(srv, req, EPD_ERR_CANCELED, msg, 0, 0, 1);
}

static void epd_prefill_on_error(epd_prefill_srv_t *srv, const Epd__Envelope *env)
{
    const Epd__Error *e = env->error;
    epd_prefill_req_t *req = epd__prefill_req_find(srv, e->request_id);
    epd_status_t st = e->status < 0 ? (epd_status_t)e->status : EPD_ERR_TRANSPORT;
    char msg[200];

    if (req == NULL) {
        epd_log_debug(EPD_PREFILL_LOG, e->request_id,
                      "error from '%s' about an unknown request: %s", env->sender->worker_id,
                      e->message != NULL ? e->message : "");
        return;
    }
    if (epd__prefill_media_from_encoder(req, env)) {
        /* an image of it failed on its encoder (which tells the client):
         * decode frees its reservation */
        snprintf(msg, sizeof(msg), "encoder '%.60s': %.120s", env->sender->worker_id,
                 e->message != NULL ? e->message : "");
        epd__prefill_req_fail(srv, req, st, msg, 0, 1, 1);
        return;
    }
    if (strcmp(env->sender->worker_id, req->client_id) != 0 && !epd_prefill_from_decode(req, env)) {
        EPD_PREFILL_WARN(srv, req->id, "ignoring an error from '%s', a stranger to this request",
                         env->sender->worker_id);
        return;
    }
    /* the sender tells the client itself; decode may have reserved blocks:
     * it gets WritesQuiesced once nothing is in flight */
    snprintf(msg, sizeof(msg), "'%.60s' failed the request: %.100s", env->sender->worker_id,
             e->message != NULL ? e->message : "");
    epd__prefill_req_fail(srv, req, st, msg, 0, 0, 1);
}

/* ------------------------------------------------------ transport upcalls */

void epd__prefill_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    epd_prefill_srv_t *srv = arg;
    Epd__Envelope *env = NULL;
    const char *why = NULL;
    epd_status_t st;
    uint64_t id;

    if (srv->stopping) {
        return;
    }
    st = epd_msg_decode(data, len, &env, &why);
    if (st != EPD_OK) {
        srv->bad_frames++;
        EPD_PREFILL_WARN(srv, 0,
                         "dropping an undecodable request-plane frame (%zu bytes): %s "
                         "(%llu so far)",
                         len, why != NULL ? why : epd_status_string(st),
                         (unsigned long long)srv->bad_frames);
        return;
    }
    id = epd_msg_request_id(env);
    if (epd_prefill_sender_stale(srv, ep, env)) {
        epd_msg_free(env);
        return;
    }
    switch (env->body_case) {
    case EPD__ENVELOPE__BODY_GENERATE:
        epd_prefill_on_generate(srv, ep, env);
        break;
    case EPD__ENVELOPE__BODY_RESERVATION:
    case EPD__ENVELOPE__BODY_REFUSED:
        if (epd_prefill_on_reservation(srv, ep, env)) {
            return; /* stashed */
        }
        break;
    case EPD__ENVELOPE__BODY_ABORT:
        epd_prefill_on_abort(srv, ep, env);
        break;
    case EPD__ENVELOPE__BODY_ERROR:
        epd_prefill_on_error(srv, env);
        break;
    case EPD__ENVELOPE__BODY_EMBED_COMPLETE:
        epd__prefill_media_on_complete(srv, ep, env);
        break;
    case EPD__ENVELOPE__BODY_QUIESCED:
        epd__prefill_media_on_quiesced(srv, ep, env);
        break;
    default:
        epd_prefill_refuse(srv, ep, id, EPD_ERR_UNSUPPORTED,
                           "message kind not handled by a prefill worker");
        break;
    }
    epd_msg_free(env);
}

void epd__prefill_on_accept(void *arg, epd_xport_ep_t *ep)
{
    (void)arg;
    (void)ep;
    epd_log_debug(EPD_PREFILL_LOG, 0, "accepted a peer endpoint");
}

void epd__prefill_on_ep_error(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    epd_prefill_srv_t *srv = arg;
    int ours = 0;

    for (epd_prefill_peer_t *peer = srv->peers; peer != NULL; peer = peer->next) {
        if (peer->ep == ep) {
            char why[96];

            snprintf(why, sizeof(why), "is unreachable (%s)", epd_status_string(status));
            epd_prefill_peer_kill(srv, peer, status, why);
            ours = 1;
        }
    }
    if (ours) {
        return; /* closed by the pump */
    }
    for (epd_prefill_peer_t *peer = srv->peers; peer != NULL; peer = peer->next) {
        if (peer->in_ep == ep) {
            /* an encoder's own endpoint: that encoder is gone */
            char why[96];

            peer->in_ep = NULL;
            snprintf(why, sizeof(why), "failed (%s)", epd_status_string(status));
            epd_prefill_peer_kill(srv, peer, status, why);
        }
    }
    /* an accepted endpoint (a client, or a decode worker's own): forget it,
     * then close it */
    for (epd_prefill_req_t *req = srv->all; req != NULL; req = req->all_next) {
        if (req->client_ep == ep) {
            req->client_ep = NULL;
            req->tell_client = 0;
        }
    }
    for (uint32_t i = 0; i < srv->n_stash; i++) {
        if (srv->stash[i].ep == ep) {
            srv->stash[i].ep = NULL;
        }
    }
    if (!srv->stopping) {
        epd_log_debug(EPD_PREFILL_LOG, 0, "incoming endpoint failed: %s",
                      epd_status_string(status));
        epd_xport_ep_close(ep);
    }
}
