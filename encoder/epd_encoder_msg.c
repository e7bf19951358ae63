/*
 * epd_encoder_msg.c — the encoder's request plane (proto/README.md rules
 * 13–20, encoder side), on the loop thread, called from the transport
 * (messages, accepted endpoints, endpoint errors).
 *
 * Messages are identified by their Envelope.sender, never by the endpoint
 * they came in on: replies to a client go back on the endpoint its
 * EncodeRequest came in on; the write and every message about an admitted
 * image go on OUR endpoint to its prefill worker (one per worker id + epoch,
 * connected at the first EncodeRequest naming it), because the fence of
 * EmbedComplete / WritesQuiesced orders them behind the writes posted on
 * that endpoint.
 *
 * WritesQuiesced{request_id} speaks for every image of that request id, so
 * the one rule that keeps a prefill worker's slots safe is: once it was
 * sent (or decided), nothing of that id is ever written again.  Hence a
 * request id is ended as a whole here ("killed": epd__encoder_id_kill) before
 * any WritesQuiesced for it goes out — every live image of it fails, its
 * stashed reservations are answered, and a tombstone refuses what comes
 * later (EncodeRequest: EPD_ERR_CANCELED; EmbedReservation: Error and
 * WritesQuiesced at once).  That happens on an Abort or an Error from the
 * client or the prefill worker, on every failure this encoder reports to
 * the prefill worker (the prefill worker fails the whole request on it
 * anyway, rule 18/20), and on a reservation that cannot be served.  The
 * WritesQuiesced itself is sent fenced on our endpoint once no write of the
 * id is in flight there (epd_encoder_req.c), or at once on the sender's own
 * endpoint when no image of the id was ever bound to that prefill worker
 * here (then nothing of it can be in flight).
 *
 * Races the protocol allows and how they are handled:
 *   - the prefill worker's EmbedReservation may overtake the client's
 *     EncodeRequest (different senders, different endpoints): it is kept
 *     (bounded stash) and applied when the request arrives; one never
 *     claimed within its lease ends the id (Error EPD_ERR_NOT_FOUND +
 *     WritesQuiesced to the prefill worker);
 *   - an Abort may be answered before a late message of the same id
 *     arrives: the tombstone refuses it;
 *   - a newer epoch of a prefill worker retires the old endpoint: images
 *     bound to the old incarnation fail at once (client told
 *     EPD_ERR_PEER_DEAD); messages from an older epoch are refused
 *     (EPD_ERR_STALE_EPOCH).
 * An Error is never answered with an Error.  Replies that meet
 * backpressure wait in a bounded outbox, retried after progress.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_encoder_int.h"
#include "epd_log.h"
#include "epd_time.h"

#define EPD_ENCODER_LOG_BURST 20 /* rate-limited warnings per second */

int epd__encoder_log_allowed(epd_encoder_srv_t *srv)
{
    return epd_log_limit_ok(&srv->log_limit, EPD_ENCODER_LOG_BURST);
}

#define EPD_ENCODER_WARN(srv, req, ...)                                                            \
    do {                                                                                           \
        if (epd__encoder_log_allowed(srv)) {                                                       \
            epd_log_warn(EPD_ENCODER_LOG, req, __VA_ARGS__);                                       \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------------------ sends */

epd_status_t epd__encoder_send(epd_encoder_srv_t *srv, epd_xport_ep_t *ep,
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
        epd_log_error(EPD_ENCODER_LOG, 0, "cannot encode a message of kind %d: %s", (int)body_case,
                      epd_status_string(st));
        return st;
    }
    return epd_xport_send(ep, srv->tx_buf, len, flags);
}

epd_status_t epd__encoder_send_error(epd_encoder_srv_t *srv, epd_xport_ep_t *ep, uint64_t id,
                                     epd_status_t status, const char *msg)
{
    Epd__Error e = EPD__ERROR__INIT;
    char text[200];

    snprintf(text, sizeof(text), "%s", msg);
    e.request_id = id;
    e.status = (int32_t)status;
    e.message = text;
    return epd__encoder_send(srv, ep, EPD__ENVELOPE__BODY_ERROR, &e, 0);
}

epd_status_t epd__encoder_send_quiesced(epd_encoder_srv_t *srv, epd_xport_ep_t *ep, uint64_t id)
{
    Epd__WritesQuiesced q = EPD__WRITES_QUIESCED__INIT;

    q.request_id = id;
    return epd__encoder_send(srv, ep, EPD__ENVELOPE__BODY_QUIESCED, &q, EPD_XPORT_SEND_FENCE);
}

/* ----------------------------------------------------------------- outbox */

static epd_status_t epd_encoder_out_send(epd_encoder_srv_t *srv, const epd_encoder_out_t *o)
{
    if (o->kind == EPD__ENVELOPE__BODY_QUIESCED) {
        return epd__encoder_send_quiesced(srv, o->ep, o->id);
    }
    return epd__encoder_send_error(srv, o->ep, o->id, (epd_status_t)o->status, o->text);
}

void epd__encoder_outbox_flush(epd_encoder_srv_t *srv)
{
    while (srv->n_out > 0) {
        epd_encoder_out_t *o = &srv->outbox[srv->out_head];

        if (o->ep != NULL) {
            epd_status_t st = epd_encoder_out_send(srv, o);

            if (st == EPD_ERR_NO_RESOURCE) {
                return; /* still no room: the next tick or pump */
            }
            if (st != EPD_OK) {
                EPD_ENCODER_WARN(srv, o->id, "could not send a queued %s: %s",
                                 o->kind == EPD__ENVELOPE__BODY_QUIESCED ? "WritesQuiesced"
                                                                         : "Error",
                                 epd_status_string(st));
            }
        }
        srv->out_head = (srv->out_head + 1) % EPD_ENCODER_OUTBOX_MAX;
        srv->n_out--;
    }
}

/* A reply not tied to a live request: sent now, or queued (in order) behind
 * earlier ones that met backpressure.  Bounded: a full outbox drops with a
 * log line (the peer's own lease then ends its wait). */
static void epd_encoder_reply(epd_encoder_srv_t *srv, epd_xport_ep_t *ep,
                              Epd__Envelope__BodyCase kind, uint64_t id, epd_status_t status,
                              const char *text)
{
    epd_encoder_out_t o;
    epd_status_t st = EPD_ERR_NO_RESOURCE;

    if (ep == NULL) {
        return;
    }
    memset(&o, 0, sizeof(o));
    o.ep = ep;
    o.kind = kind;
    o.id = id;
    o.status = (int32_t)status;
    snprintf(o.text, sizeof(o.text), "%s", text != NULL ? text : "");
    if (srv->n_out == 0) {
        st = epd_encoder_out_send(srv, &o);
    }
    if (st == EPD_OK) {
        return;
    }
    if (st != EPD_ERR_NO_RESOURCE) {
        EPD_ENCODER_WARN(srv, id, "could not send a %s: %s",
                         kind == EPD__ENVELOPE__BODY_QUIESCED ? "WritesQuiesced" : "Error",
                         epd_status_string(st));
        return;
    }
    if (srv->n_out == EPD_ENCODER_OUTBOX_MAX) {
        EPD_ENCODER_WARN(srv, id, "outbox full (%u replies wait for transport room): dropping a %s",
                         srv->n_out,
                         kind == EPD__ENVELOPE__BODY_QUIESCED ? "WritesQuiesced" : "Error");
        return;
    }
    srv->outbox[(srv->out_head + srv->n_out) % EPD_ENCODER_OUTBOX_MAX] = o;
    srv->n_out++;
}

/* An endpoint is going away: queued replies to it are dropped. */
static void epd_encoder_outbox_forget(epd_encoder_srv_t *srv, const epd_xport_ep_t *ep)
{
    for (uint32_t i = 0; i < srv->n_out; i++) {
        epd_encoder_out_t *o = &srv->outbox[(srv->out_head + i) % EPD_ENCODER_OUTBOX_MAX];

        if (o->ep == ep) {
            o->ep = NULL;
        }
    }
}

/* Refuses a message: one (rate-limited) log line and an Error to whoever
 * sent it. */
static void epd_encoder_refuse(epd_encoder_srv_t *srv, epd_xport_ep_t *ep, uint64_t id,
                               epd_status_t status, const char *what)
{
    srv->refused++;
    EPD_ENCODER_WARN(srv, id, "refused: %s (%s)", what, epd_status_name(status));
    epd_encoder_reply(srv, ep, EPD__ENVELOPE__BODY_ERROR, id, status, what);
}

/* ------------------------------------------------------------- tombstones */

static uint64_t epd_encoder_tomb_ttl_ns(const epd_encoder_srv_t *srv)
{
    uint64_t ms = (uint64_t)srv->lease_ms * 10;

    return (ms < 60000 ? 60000 : ms) * EPD_NSEC_PER_MSEC;
}

void epd__encoder_tomb_add(epd_encoder_srv_t *srv, uint64_t id, uint32_t media,
                           epd_encoder_tomb_kind_t kind)
{
    struct epd_encoder_tomb *t = &srv->tombs[srv->tomb_next];

    t->id = id;
    t->media = media;
    t->kind = kind;
    t->expires_ns = epd_time_now_ns() + epd_encoder_tomb_ttl_ns(srv);
    srv->tomb_next = (srv->tomb_next + 1) % EPD_ENCODER_TOMB_MAX;
}

/* The tombstone of `id` (every media: an aborted id) or of (id, media);
 * 0 when none.  ABORTED wins. */
static int epd_encoder_tomb_find(const epd_encoder_srv_t *srv, uint64_t id, uint32_t media)
{
    uint64_t now = epd_time_now_ns();
    int kind = 0;

    for (uint32_t i = 0; i < EPD_ENCODER_TOMB_MAX; i++) {
        const struct epd_encoder_tomb *t = &srv->tombs[i];

        if (t->id != id || t->kind == 0 || t->expires_ns <= now) {
            continue;
        }
        if (t->media == EPD_ENCODER_MEDIA_ALL) {
            return EPD_ENCODER_TOMB_ABORTED;
        }
        if (t->media == media) {
            kind = EPD_ENCODER_TOMB_ENDED;
        }
    }
    return kind;
}

/* A new EncodeRequest of (id, media) was admitted: an older "ended"
 * tombstone of it must not refuse its reservation. */
static void epd_encoder_tomb_clear(epd_encoder_srv_t *srv, uint64_t id, uint32_t media)
{
    for (uint32_t i = 0; i < EPD_ENCODER_TOMB_MAX; i++) {
        struct epd_encoder_tomb *t = &srv->tombs[i];

        if (t->id == id && t->media == media && t->kind == EPD_ENCODER_TOMB_ENDED) {
            t->kind = 0;
        }
    }
}

static void epd_encoder_known_p_add(epd_encoder_srv_t *srv, const char *worker_id)
{
    if (worker_id == NULL || worker_id[0] == '\0' || strlen(worker_id) >= EPD_ENCODER_ID_MAX) {
        return;
    }
    for (uint32_t i = 0; i < EPD_ENCODER_KNOWN_P; i++) {
        if (strcmp(srv->known_p[i], worker_id) == 0) {
            return;
        }
    }
    snprintf(srv->known_p[srv->known_p_next], EPD_ENCODER_ID_MAX, "%s", worker_id);
    srv->known_p_next = (srv->known_p_next + 1) % EPD_ENCODER_KNOWN_P;
}

static int epd_encoder_known_p(const epd_encoder_srv_t *srv, const char *worker_id)
{
    for (uint32_t i = 0; i < EPD_ENCODER_KNOWN_P; i++) {
        if (srv->known_p[i][0] != '\0' && strcmp(srv->known_p[i], worker_id) == 0) {
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ stash */

static int epd_encoder_stash_find(const epd_encoder_srv_t *srv, uint64_t id, uint32_t media)
{
    for (uint32_t i = 0; i < srv->n_stash; i++) {
        const Epd__EmbedReservation *r = srv->stash[i].env->embed_reservation;

        if (r->request_id == id && (media == EPD_ENCODER_MEDIA_ALL || r->media_index == media)) {
            return (int)i;
        }
    }
    return -1;
}

/* Removes entry i; the caller takes its envelope. */
static Epd__Envelope *epd_encoder_stash_take(epd_encoder_srv_t *srv, uint32_t i,
                                             epd_xport_ep_t **ep_p)
{
    Epd__Envelope *env = srv->stash[i].env;

    *ep_p = srv->stash[i].ep;
    srv->stash[i] = srv->stash[--srv->n_stash];
    return env;
}

/* ------------------------------------------------------------------ peers */

int epd__encoder_peer_usable(const epd_encoder_peer_t *peer)
{
    return peer != NULL && peer->state != EPD_ENCODER_PEER_DEAD && peer->ep != NULL;
}

static void epd_encoder_on_connected(void *arg, epd_status_t status)
{
    epd_encoder_peer_t *peer = arg;

    if (status == EPD_OK && peer->state == EPD_ENCODER_PEER_CONNECTING) {
        peer->state = EPD_ENCODER_PEER_UP;
        epd_log_debug(EPD_ENCODER_LOG, 0, "connected to prefill '%s'", peer->worker_id);
    }
    /* failures arrive through the error callback right after */
}

/* Declares a peer dead: its images fail (the client is told), its endpoint
 * is closed by the pump.  Nested-safe. */
static void epd_encoder_peer_kill(epd_encoder_srv_t *srv, epd_encoder_peer_t *peer,
                                  epd_status_t status, const char *why)
{
    char msg[200];

    if (peer->state == EPD_ENCODER_PEER_DEAD) {
        return;
    }
    peer->state = EPD_ENCODER_PEER_DEAD;
    peer->dead_status = status;
    peer->listed = 0;
    snprintf(msg, sizeof(msg), "prefill worker '%.80s' %s", peer->worker_id, why);
    epd_log_warn(EPD_ENCODER_LOG, 0, "%s: failing its images", msg);
    for (epd_encoder_req_t *req = srv->all; req != NULL; req = req->all_next) {
        if (req->peer == peer) {
            epd__encoder_req_fail(srv, req, EPD_ERR_PEER_DEAD, msg, 1, 0, 0);
        }
    }
    epd__encoder_pump_start(srv); /* closes the endpoint even when nothing is bound */
}

static void epd_encoder_peer_free(epd_encoder_srv_t *srv, epd_encoder_peer_t *peer)
{
    epd_encoder_peer_t **pp = &srv->peers;

    while (*pp != NULL && *pp != peer) {
        pp = &(*pp)->next;
    }
    if (*pp == peer) {
        *pp = peer->next;
    }
    epd_free(peer);
}

void epd__encoder_peer_unref(epd_encoder_srv_t *srv, epd_encoder_peer_t *peer)
{
    if (peer == NULL) {
        return;
    }
    peer->n_refs--;
    if (peer->n_refs == 0 && peer->state == EPD_ENCODER_PEER_DEAD && peer->ep == NULL) {
        epd_encoder_peer_free(srv, peer);
    }
}

void epd__encoder_peers_reap(epd_encoder_srv_t *srv)
{
    epd_encoder_peer_t *peer = srv->peers;

    while (peer != NULL) {
        epd_encoder_peer_t *next = peer->next;

        if (peer->state == EPD_ENCODER_PEER_DEAD && peer->ep != NULL) {
            epd_xport_ep_t *ep = peer->ep;

            /* closing destroys the keys unpacked on the endpoint: forget them
             * first; the close completes the write still posted (its
             * callback only counts) */
            for (epd_encoder_req_t *req = srv->all; req != NULL; req = req->all_next) {
                if (req->peer == peer) {
                    req->rkey = NULL;
                }
            }
            peer->rkey = NULL;
            peer->ep = NULL;
            epd_encoder_outbox_forget(srv, ep);
            epd_xport_ep_close(ep);
        }
        if (peer->state == EPD_ENCODER_PEER_DEAD && peer->ep == NULL && peer->n_refs == 0) {
            epd_encoder_peer_free(srv, peer);
        }
        peer = next;
    }
}

/* The peer for (worker_id, epoch), connecting when new.  A newer epoch
 * retires the older one's endpoint.  EPD_ERR_STALE_EPOCH when a newer one
 * is already known; EPD_ERR_BAD_ADDRESS for an address that does not parse. */
static epd_status_t epd_encoder_peer_get(epd_encoder_srv_t *srv, const char *worker_id,
                                         const epd_encoder_epoch_t *epoch, const void *addr,
                                         size_t addr_len, epd_encoder_peer_t **peer_p)
{
    epd_encoder_peer_t *peer;
    epd_status_t st;

    for (peer = srv->peers; peer != NULL; peer = peer->next) {
        int cmp;

        if (!peer->listed || strcmp(peer->worker_id, worker_id) != 0) {
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
        epd_encoder_peer_kill(srv, peer, EPD_ERR_STALE_EPOCH, "restarted (newer epoch seen)");
    }
    peer = epd_calloc(1, sizeof(*peer));
    if (peer == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    snprintf(peer->worker_id, sizeof(peer->worker_id), "%s", worker_id);
    peer->epoch = *epoch;
    peer->state = EPD_ENCODER_PEER_CONNECTING;
    st = epd_xport_connect(srv->x, addr, addr_len, epd_encoder_on_connected, peer, &peer->ep);
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

/* Checks a message's sender against the prefill peers: refuses an older
 * epoch of a known worker, retires a known worker's older incarnation when
 * a newer one speaks.  Returns nonzero when the message must be dropped. */
static int epd_encoder_sender_stale(epd_encoder_srv_t *srv, epd_xport_ep_t *ep,
                                    const Epd__Envelope *env)
{
    epd_encoder_epoch_t epoch = epd_msg_epoch_of(env->sender->epoch);

    for (epd_encoder_peer_t *peer = srv->peers; peer != NULL; peer = peer->next) {
        int cmp;

        if (!peer->listed || strcmp(peer->worker_id, env->sender->worker_id) != 0) {
            continue;
        }
        cmp = epd_msg_epoch_cmp(&peer->epoch, &epoch);
        if (cmp > 0) {
            uint64_t id = epd_msg_request_id(env);

            EPD_ENCODER_WARN(srv, id, "refusing a %s from an older epoch of '%s'",
                             epd_msg_body_name(env), peer->worker_id);
            if (env->body_case != EPD__ENVELOPE__BODY_ERROR) {
                epd_encoder_reply(srv, ep, EPD__ENVELOPE__BODY_ERROR, id, EPD_ERR_STALE_EPOCH,
                                  "message from a stale epoch");
            }
            return 1;
        }
        if (cmp < 0) {
            epd_encoder_peer_kill(srv, peer, EPD_ERR_STALE_EPOCH, "restarted (newer epoch seen)");
        }
    }
    return 0;
}

/* Is `env`'s sender the prefill incarnation `peer` names? */
static int epd_encoder_is_peer(const epd_encoder_peer_t *peer, const Epd__Envelope *env)
{
    epd_encoder_epoch_t epoch = epd_msg_epoch_of(env->sender->epoch);

    return peer != NULL && strcmp(env->sender->worker_id, peer->worker_id) == 0 &&
           epd_msg_epoch_cmp(&epoch, &peer->epoch) == 0;
}

/* Is a live image of `id` bound to the prefill incarnation that sent
 * `env`, on an endpoint that still works?  Then its WritesQuiesced goes
 * fenced on that endpoint, never ahead of it on another. */
static int epd_encoder_id_bound_to(const epd_encoder_srv_t *srv, uint64_t id,
                                   const Epd__Envelope *env)
{
    for (const epd_encoder_req_t *req = srv->all; req != NULL; req = req->all_next) {
        if (req->id == id && epd__encoder_peer_usable(req->peer) &&
            epd_encoder_is_peer(req->peer, env)) {
            return 1;
        }
    }
    return 0;
}

/* -------------------------------------------------------------- id kill */

/*
 * Ends request `id` here as a whole (see the top of the file): a tombstone,
 * every live image of it fails with `status` (no Error: whoever caused this
 * knows; a WritesQuiesced for its prefill worker once its write is not in
 * flight), every stashed reservation of it gets Error(status, msg) and
 * WritesQuiesced on the endpoint it came from.  `p_env`/`p_ep`: a prefill
 * worker's message that asked for it (an Abort, Error or reservation): its
 * sender gets WritesQuiesced too — at once on p_ep when no live image of the
 * id is bound to it, else through those images.
 */
void epd__encoder_id_kill(epd_encoder_srv_t *srv, uint64_t id, epd_status_t status, const char *msg,
                          const Epd__Envelope *p_env, epd_xport_ep_t *p_ep)
{
    /* endpoints already given their WritesQuiesced here: one each (a client
     * and a prefill worker may share one); at most one per stashed media
     * plus the asker */
    epd_xport_ep_t *quiesced[EPD_ENCODER_MEDIA_MAX + 1];
    uint32_t n_quiesced = 0;
    int si;

    epd__encoder_tomb_add(srv, id, EPD_ENCODER_MEDIA_ALL, EPD_ENCODER_TOMB_ABORTED);
    for (epd_encoder_req_t *req = srv->all; req != NULL; req = req->all_next) {
        if (req->id == id) {
            epd__encoder_req_fail(srv, req, status, msg, 0, 0, 1);
        }
    }
    while ((si = epd_encoder_stash_find(srv, id, EPD_ENCODER_MEDIA_ALL)) >= 0) {
        epd_xport_ep_t *sep;
        Epd__Envelope *senv = epd_encoder_stash_take(srv, (uint32_t)si, &sep);
        int again = 0;

        EPD_ENCODER_WARN(srv, id, "dropping the early reservation of media %u from '%s': %s",
                         senv->embed_reservation->media_index, senv->sender->worker_id, msg);
        epd_encoder_reply(srv, sep, EPD__ENVELOPE__BODY_ERROR, id, status, msg);
        for (uint32_t i = 0; i < n_quiesced; i++) {
            again |= quiesced[i] == sep;
        }
        if (sep != NULL && !again && !epd_encoder_id_bound_to(srv, id, senv)) {
            epd_encoder_reply(srv, sep, EPD__ENVELOPE__BODY_QUIESCED, id, EPD_OK, NULL);
            if (n_quiesced < EPD_ENCODER_MEDIA_MAX) {
                quiesced[n_quiesced++] = sep;
            }
        }
        epd_msg_free(senv);
    }
    if (p_env != NULL && p_ep != NULL && !epd_encoder_id_bound_to(srv, id, p_env)) {
        int again = 0;

        for (uint32_t i = 0; i < n_quiesced; i++) {
            again |= quiesced[i] == p_ep;
        }
        if (!again) {
            epd_encoder_reply(srv, p_ep, EPD__ENVELOPE__BODY_QUIESCED, id, EPD_OK, NULL);
        }
    }
}

void epd__encoder_msg_tick(epd_encoder_srv_t *srv, uint64_t now)
{
    for (uint32_t i = 0; i < srv->n_stash;) {
        if (srv->stash[i].expires_ns <= now) {
            /* its Error and WritesQuiesced go out through the kill */
            epd__encoder_id_kill(
                srv, srv->stash[i].env->embed_reservation->request_id, EPD_ERR_NOT_FOUND,
                "no EncodeRequest for this image arrived within the lease", NULL, NULL);
            i = 0; /* the kill reordered the stash */
        } else {
            i++;
        }
    }
}

/* --------------------------------------------------------------- handlers */

void epd__encoder_apply_reservation(epd_encoder_srv_t *srv, epd_encoder_req_t *req,
                                    const Epd__EmbedReservation *r)
{
    epd_encoder_peer_t *peer = req->peer;
    char msg[200];
    epd_status_t st;

    if (r->bytes != srv->slot_bytes) {
        snprintf(msg, sizeof(msg),
                 "reservation refused: %llu bytes, an image's embeddings are %zu (%u x %u f32)",
                 (unsigned long long)r->bytes, srv->slot_bytes, srv->info->image_embeddings,
                 srv->info->embed_dim);
        epd__encoder_req_fail(srv, req, EPD_ERR_INVALID_PARAM, msg, 1, 1, 1);
        return;
    }
    if (r->offset > r->region_size || r->bytes > r->region_size - r->offset) {
        snprintf(msg, sizeof(msg),
                 "reservation refused: %llu bytes at offset %llu do not fit a region of %llu",
                 (unsigned long long)r->bytes, (unsigned long long)r->offset,
                 (unsigned long long)r->region_size);
        epd__encoder_req_fail(srv, req, EPD_ERR_OUT_OF_RANGE, msg, 1, 1, 1);
        return;
    }
    if (r->rkey.len == 0 || r->rkey.len > EPD_XPORT_RKEY_MAX) {
        snprintf(msg, sizeof(msg), "reservation refused: remote key of %zu bytes", r->rkey.len);
        epd__encoder_req_fail(srv, req, EPD_ERR_BAD_RKEY, msg, 1, 1, 1);
        return;
    }
    if (!epd__encoder_peer_usable(peer)) {
        epd__encoder_req_fail(srv, req, EPD_ERR_PEER_DEAD, "prefill worker is gone", 1, 0, 0);
        return;
    }
    if (peer->rkey != NULL && peer->rkey_len == r->rkey.len &&
        memcmp(peer->rkey_blob, r->rkey.data, r->rkey.len) == 0) {
        req->rkey = peer->rkey;
        req->rkey_shared = 1;
        st = EPD_OK;
    } else {
        st = epd_xport_rkey_unpack(peer->ep, r->rkey.data, r->rkey.len, &req->rkey);
        if (st == EPD_OK && peer->rkey == NULL &&
            epd_xport_rkey_size(req->rkey) >= r->region_size) {
            /* the first key of this prefill incarnation: keep it for the next */
            peer->rkey = req->rkey;
            memcpy(peer->rkey_blob, r->rkey.data, r->rkey.len);
            peer->rkey_len = r->rkey.len;
            req->rkey_shared = 1;
        }
    }
    if (st != EPD_OK) {
        req->rkey = NULL;
        snprintf(msg, sizeof(msg), "reservation refused: remote key does not unpack (%s)",
                 epd_status_string(st));
        epd__encoder_req_fail(srv, req, st == EPD_ERR_BAD_RKEY ? st : EPD_ERR_PEER_DEAD, msg, 1, 1,
                              1);
        return;
    }
    if (epd_xport_rkey_size(req->rkey) < r->region_size) {
        snprintf(msg, sizeof(msg), "reservation refused: region of %llu bytes, its key covers %zu",
                 (unsigned long long)r->region_size, epd_xport_rkey_size(req->rkey));
        if (!req->rkey_shared) {
            epd_xport_rkey_destroy(req->rkey);
        }
        req->rkey = NULL;
        req->rkey_shared = 0;
        epd__encoder_req_fail(srv, req, EPD_ERR_OUT_OF_RANGE, msg, 1, 1, 1);
        return;
    }
    req->offset = r->offset;
    req->bytes = r->bytes;
    req->region_size = r->region_size;
    req->have_resv = 1;
    epd_log_debug(EPD_ENCODER_LOG, req->id, "media %u: reservation at offset %llu (%s)",
                  req->media_index, (unsigned long long)r->offset,
                  req->ready_ns != 0 ? "embeddings ready" : "still encoding");
    epd__encoder_req_reserved(srv, req);
}

/* A reservation for a live image. */
static void epd_encoder_reservation_for(epd_encoder_srv_t *srv, epd_encoder_req_t *req,
                                        epd_xport_ep_t *ep, const Epd__Envelope *env)
{
    if (!epd_encoder_is_peer(req->peer, env)) {
        epd_encoder_refuse(srv, ep, req->id, EPD_ERR_INVALID_PARAM,
                           "sender is not the prefill worker this image is for");
        return;
    }
    if (req->failed) {
        return; /* its Error (and WritesQuiesced) are on their way */
    }
    if (req->have_resv) {
        epd_encoder_refuse(srv, ep, req->id, EPD_ERR_EXISTS, "a second reservation for this image");
        return;
    }
    epd__encoder_apply_reservation(srv, req, env->embed_reservation);
}

static void epd_encoder_on_encode(epd_encoder_srv_t *srv, epd_xport_ep_t *ep,
                                  const Epd__Envelope *env)
{
    const Epd__EncodeRequest *e = env->encode;
    uint64_t id = e->request_id;
    uint32_t media = e->media_index;
    epd_encoder_epoch_t want = epd_msg_epoch_of(e->encoder_epoch);
    epd_encoder_epoch_t p_epoch = epd_msg_epoch_of(e->prefill_epoch);
    epd_encoder_peer_t *peer = NULL;
    epd_encoder_req_t *req = NULL;
    uint64_t t_recv = epd_time_now_ns();
    char msg[200];
    epd_status_t st = EPD_OK;
    int si;

    srv->received++;
    epd_trace_instant(srv->trace, "EncodeRequest received", "msg", id, (int32_t)media, t_recv);
    if (srv->draining || srv->stopping) {
        st = EPD_ERR_DRAINING;
        snprintf(msg, sizeof(msg), "encoder worker '%.100s' is draining", srv->worker_id);
    } else if (e->encoder_epoch == NULL || epd_msg_epoch_cmp(&srv->epoch, &want) != 0) {
        st = EPD_ERR_STALE_EPOCH;
        snprintf(msg, sizeof(msg), "request names another epoch of encoder worker '%.100s'",
                 srv->worker_id);
    } else if (strlen(env->sender->worker_id) >= EPD_ENCODER_ID_MAX) {
        st = EPD_ERR_INVALID_PARAM;
        snprintf(msg, sizeof(msg), "sender id of %zu bytes (at most %d)",
                 strlen(env->sender->worker_id), EPD_ENCODER_ID_MAX - 1);
    } else if (media >= EPD_ENCODER_MEDIA_MAX) {
        st = EPD_ERR_INVALID_PARAM;
        snprintf(msg, sizeof(msg), "media index %u (at most %d media per request)", media,
                 EPD_ENCODER_MEDIA_MAX);
    } else if (e->image.len == 0) {
        st = EPD_ERR_INVALID_PARAM;
        snprintf(msg, sizeof(msg), "empty image");
    } else if (e->image.len > srv->max_image_bytes) {
        st = EPD_ERR_TOO_LONG;
        snprintf(msg, sizeof(msg), "image of %zu bytes exceeds the limit of %llu bytes",
                 e->image.len, (unsigned long long)srv->max_image_bytes);
    } else if (e->content_hash.len != EPD_CONTENT_HASH_BYTES) {
        st = EPD_ERR_INVALID_PARAM;
        snprintf(msg, sizeof(msg), "content_hash of %zu bytes, want %d (BLAKE2b-256)",
                 e->content_hash.len, EPD_CONTENT_HASH_BYTES);
    } else if (e->prefill_worker_id == NULL || e->prefill_worker_id[0] == '\0' ||
               strlen(e->prefill_worker_id) >= EPD_ENCODER_ID_MAX || e->prefill_epoch == NULL ||
               e->prefill_address.len == 0 || e->prefill_address.len > EPD_XPORT_ADDR_MAX) {
        st = EPD_ERR_INVALID_PARAM;
        snprintf(msg, sizeof(msg), "request names no (valid) prefill worker, epoch and address");
    } else if (epd__encoder_req_find(srv, id, media) != NULL) {
        st = EPD_ERR_EXISTS;
        snprintf(msg, sizeof(msg), "media %u of request %llu is already being encoded here", media,
                 (unsigned long long)id);
    } else if (epd_encoder_tomb_find(srv, id, media) == EPD_ENCODER_TOMB_ABORTED) {
        st = EPD_ERR_CANCELED;
        snprintf(msg, sizeof(msg), "request %llu was aborted or failed here",
                 (unsigned long long)id);
    } else if (srv->n_free_slots == 0) {
        st = EPD_ERR_NO_CAPACITY;
        snprintf(msg, sizeof(msg), "no free slot: %u images in flight", srv->slots);
    }
    if (st == EPD_OK) {
        st = epd_encoder_peer_get(srv, e->prefill_worker_id, &p_epoch, e->prefill_address.data,
                                  e->prefill_address.len, &peer);
        if (st != EPD_OK) {
            snprintf(msg, sizeof(msg), "prefill worker '%.60s': %s", e->prefill_worker_id,
                     st == EPD_ERR_STALE_EPOCH ? "a newer epoch of it is known"
                                               : epd_status_string(st));
        }
    }
    if (st == EPD_OK) {
        st = epd__encoder_req_admit(srv, e, ep, env->sender->worker_id, peer, t_recv, &req);
        if (st != EPD_OK) {
            snprintf(msg, sizeof(msg), "cannot admit the image: %s", epd_status_string(st));
        }
    }
    if (st != EPD_OK) {
        epd_encoder_refuse(srv, ep, id, st, msg);
        if (st != EPD_ERR_EXISTS) {
            /* its reservation (early or late) is answered at once */
            epd__encoder_tomb_add(srv, id, media, EPD_ENCODER_TOMB_ENDED);
            if (epd_encoder_stash_find(srv, id, media) >= 0) {
                epd__encoder_id_kill(srv, id, st, msg, NULL, NULL);
            }
        }
        return;
    }
    epd_encoder_known_p_add(srv, e->prefill_worker_id);
    epd_encoder_tomb_clear(srv, id, media);
    epd_log_debug(EPD_ENCODER_LOG, id,
                  "media %u admitted: %zu bytes into slot %u, for prefill '%s'", media,
                  e->image.len, req->slot, peer->worker_id);
    si = epd_encoder_stash_find(srv, id, media);
    if (si >= 0) {
        epd_xport_ep_t *sep;
        Epd__Envelope *senv = epd_encoder_stash_take(srv, (uint32_t)si, &sep);

        if (epd_encoder_is_peer(peer, senv)) {
            epd_encoder_reservation_for(srv, req, sep, senv);
        } else {
            /* someone else reserved for this image: refuse that, keep waiting */
            epd_encoder_refuse(srv, sep, id, EPD_ERR_INVALID_PARAM,
                               "sender is not the prefill worker this image is for");
        }
        epd_msg_free(senv);
    }
}

/* Returns nonzero when `env` was kept (the stash owns it now). */
static int epd_encoder_on_reservation(epd_encoder_srv_t *srv, epd_xport_ep_t *ep,
                                      Epd__Envelope *env)
{
    const Epd__EmbedReservation *r = env->embed_reservation;
    uint64_t id = r->request_id;
    uint32_t media = r->media_index;
    epd_encoder_req_t *req = epd__encoder_req_find(srv, id, media);
    uint64_t lease_ms;
    char msg[200];
    int tomb;

    epd_trace_instant(srv->trace, "EmbedReservation received", "msg", id, (int32_t)media,
                      epd_time_now_ns());
    epd_encoder_known_p_add(srv, env->sender->worker_id);
    if (req != NULL) {
        epd_encoder_reservation_for(srv, req, ep, env);
        return 0;
    }
    tomb = epd_encoder_tomb_find(srv, id, media);
    if (tomb != 0 || media >= EPD_ENCODER_MEDIA_MAX) {
        snprintf(msg, sizeof(msg), "no such image here (media %u of request %llu %s)", media,
                 (unsigned long long)id,
                 media >= EPD_ENCODER_MEDIA_MAX     ? "is out of range"
                 : tomb == EPD_ENCODER_TOMB_ABORTED ? "was aborted"
                                                    : "ended");
        EPD_ENCODER_WARN(srv, id, "reservation refused: %s", msg);
        epd_encoder_reply(srv, ep, EPD__ENVELOPE__BODY_ERROR, id, EPD_ERR_NOT_FOUND, msg);
        epd__encoder_id_kill(srv, id, EPD_ERR_NOT_FOUND, msg, env, ep);
        return 0;
    }
    if (epd_encoder_stash_find(srv, id, media) >= 0) {
        epd_encoder_refuse(srv, ep, id, EPD_ERR_EXISTS, "a second reservation for this image");
        return 0;
    }
    if (srv->n_stash == EPD_ENCODER_STASH_MAX) {
        snprintf(msg, sizeof(msg), "%d reservations already wait for their EncodeRequest",
                 EPD_ENCODER_STASH_MAX);
        EPD_ENCODER_WARN(srv, id, "reservation refused: %s", msg);
        epd_encoder_reply(srv, ep, EPD__ENVELOPE__BODY_ERROR, id, EPD_ERR_NO_CAPACITY, msg);
        epd__encoder_id_kill(srv, id, EPD_ERR_NO_CAPACITY, msg, env, ep);
        return 0;
    }
    /* may have overtaken the client's EncodeRequest: keep it for its lease */
    lease_ms = r->lease_ms != 0 ? r->lease_ms : srv->lease_ms;
    srv->stash[srv->n_stash].env = env;
    srv->stash[srv->n_stash].ep = ep;
    srv->stash[srv->n_stash].expires_ns = epd_time_now_ns() + lease_ms * EPD_NSEC_PER_MSEC;
    srv->n_stash++;
    epd_log_debug(EPD_ENCODER_LOG, id, "reservation of media %u before its EncodeRequest: kept",
                  media);
    return 1;
}

/* Abort or Error about `id` from its client or its prefill worker: the id
 * ends here (no Error back; the prefill worker gets WritesQuiesced). */
static void epd_encoder_on_stop(epd_encoder_srv_t *srv, epd_xport_ep_t *ep,
                                const Epd__Envelope *env, uint64_t id, const char *reason)
{
    const char *who = env->sender->worker_id;
    int live = 0, allowed = 0, from_p = 0;
    char msg[200];

    for (epd_encoder_req_t *req = srv->all; req != NULL; req = req->all_next) {
        if (req->id == id) {
            live = 1;
            if (strcmp(who, req->client_id) == 0) {
                allowed = 1;
            }
            if (epd_encoder_is_peer(req->peer, env)) {
                allowed = from_p = 1;
            }
        }
    }
    if (live && !allowed) {
        if (env->body_case == EPD__ENVELOPE__BODY_ABORT) {
            epd_encoder_refuse(srv, ep, id, EPD_ERR_NOT_FOUND,
                               "abort from neither the client nor the prefill worker of this "
                               "request");
        } else {
            EPD_ENCODER_WARN(srv, id, "ignoring an error from '%s', a stranger to this request",
                             who);
        }
        return;
    }
    snprintf(msg, sizeof(msg), "%s from '%.60s': %.100s",
             env->body_case == EPD__ENVELOPE__BODY_ABORT ? "abort" : "error", who,
             reason != NULL ? reason : "");
    epd_log_debug(EPD_ENCODER_LOG, id, "%s (%s)", msg, live ? "live here" : "not live here");
    /* a prefill worker's own endpoint gets WritesQuiesced when no image of
     * the id is bound to it here (nothing of it in flight); a client's
     * never does */
    epd__encoder_id_kill(srv, id, EPD_ERR_CANCELED, msg,
                         from_p || epd_encoder_known_p(srv, who) ? env : NULL, ep);
}

/* ------------------------------------------------------ transport upcalls */

void epd__encoder_on_msg(void *arg, epd_xport_ep_t *ep, const void *data, size_t len)
{
    epd_encoder_srv_t *srv = arg;
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
        EPD_ENCODER_WARN(srv, 0,
                         "dropping an undecodable request-plane frame (%zu bytes): %s "
                         "(%llu so far)",
                         len, why != NULL ? why : epd_status_string(st),
                         (unsigned long long)srv->bad_frames);
        return;
    }
    id = epd_msg_request_id(env);
    if (epd_encoder_sender_stale(srv, ep, env)) {
        epd_msg_free(env);
        return;
    }
    switch (env->body_case) {
    case EPD__ENVELOPE__BODY_ENCODE:
        epd_encoder_on_encode(srv, ep, env);
        break;
    case EPD__ENVELOPE__BODY_EMBED_RESERVATION:
        if (epd_encoder_on_reservation(srv, ep, env)) {
            return; /* stashed */
        }
        break;
    case EPD__ENVELOPE__BODY_ABORT:
        epd_encoder_on_stop(srv, ep, env, env->abort->request_id, env->abort->reason);
        break;
    case EPD__ENVELOPE__BODY_ERROR:
        epd_encoder_on_stop(srv, ep, env, env->error->request_id, env->error->message);
        break;
    default:
        epd_encoder_refuse(srv, ep, id, EPD_ERR_UNSUPPORTED,
                           "message kind not handled by an encoder worker");
        break;
    }
    epd_msg_free(env);
}

void epd__encoder_on_accept(void *arg, epd_xport_ep_t *ep)
{
    (void)arg;
    (void)ep;
    epd_log_debug(EPD_ENCODER_LOG, 0, "accepted a peer endpoint");
}

void epd__encoder_on_ep_error(void *arg, epd_xport_ep_t *ep, epd_status_t status)
{
    epd_encoder_srv_t *srv = arg;
    int ours = 0;

    for (epd_encoder_peer_t *peer = srv->peers; peer != NULL; peer = peer->next) {
        if (peer->ep == ep) {
            char why[96];

            snprintf(why, sizeof(why), "is unreachable (%s)", epd_status_string(status));
            epd_encoder_peer_kill(srv, peer, status, why);
            ours = 1;
        }
    }
    if (ours) {
        return; /* closed by the pump */
    }
    /* an accepted endpoint (a client's, or a prefill worker's own): forget
     * it, then close it */
    for (epd_encoder_req_t *req = srv->all; req != NULL; req = req->all_next) {
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
    epd_encoder_outbox_forget(srv, ep);
    if (!srv->stopping) {
        epd_log_debug(EPD_ENCODER_LOG, 0, "incoming endpoint failed: %s",
                      epd_status_string(status));
        epd_xport_ep_close(ep);
    }
}
