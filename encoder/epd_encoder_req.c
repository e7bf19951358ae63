/*
 * epd_encoder_req.c — the encoder's request layer: one image's life, and a
 * request id as a whole, on the loop thread (encoder/README.md tells the
 * story; proto/README.md rules 13-20 the protocol).
 *
 *   ENCODING  admitted: a slot, a copy of the bytes, the job queued at once
 *   READY     the job came back: embeddings in the slot, checksum computed
 *   WRITING   reservation applied (key unpacked once per prefill
 *             incarnation): one write slot -> prefill's region, EmbedComplete
 *             fenced behind it on the same link
 *   DONE      write completed: the slot is free, the image is freed
 *   FAILED    failure, abort, lease or peer death: waits until the compute
 *             thread and the transport gave the slot back and what it owes
 *             (EPD_ENCODER_TELL_*) went out, then DONE
 *
 * Every transition is made by epd_encoder_req_step (one switch) from the
 * facts events record.  WritesQuiesced{request_id} speaks for every image
 * of that id, so an id is ended as a whole (epd_encoder_id_kill) before any
 * WritesQuiesced for it goes out: every live image fails, its early
 * reservations (daemon/epd_stash) are answered, and a tombstone
 * (daemon/epd_tomb) refuses what comes later.  WritesQuiesced goes fenced
 * on our link to the prefill worker once no write of the id is in flight
 * there, or at once on the asker's link when no image of the id was bound
 * to it.  Messages never wait (the links queue them in order); a write
 * refused for room parks the image on the blocked list, retried after the
 * next write completion and on the tick.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_encoder_int.h"
#include "epd_fault.h"
#include "epd_image.h"
#include "epd_log.h"
#include "epd_time.h"

#define EPD_ENCODER_WARN(srv, req, ...) epd_daemon_refuse_log((srv)->d, req, __VA_ARGS__)

/* Refuses a message: one rate-limited line and an Error to its sender. */
static void epd_encoder_refuse(epd_encoder_srv_t *srv, epd_link_t *to, uint64_t id,
                               epd_status_t status, const char *msg)
{
    epd_daemon_counts(srv->d)->refused++;
    epd_link_refuse(to, id, status, msg);
}

static void epd_encoder_id_kill(epd_encoder_srv_t *srv, uint64_t id, epd_status_t status,
                                const char *msg, const Epd__Envelope *asker_env, epd_link_t *asker);

/* ------------------------------------------------------------ bookkeeping */

/* Marks an image for a step at the top of the loop. */
static void epd_encoder_dirty(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    if (epd_reqtab_dirty(&srv->reqs, &req->ent)) {
        epd_daemon_kick(srv->d);
    }
}

/* Every live image of request `id`: one of them changed what the others'
 * WritesQuiesced waits for. */
static void epd_encoder_dirty_id(epd_encoder_srv_t *srv, uint64_t id)
{
    for (epd_encoder_req_t *r = epd_reqtab_first_req(&srv->reqs); r != NULL;
         r = epd_reqtab_next_req(&srv->reqs, r)) {
        if (r->id == id) {
            epd_encoder_dirty(srv, r);
        }
    }
}

static void epd_encoder_block(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    if (!req->backpressured) {
        req->backpressured = 1;
        epd_log_debug(EPD_ENCODER_LOG, req->id,
                      "media %u: transport backpressure on the embedding write: retrying after "
                      "progress",
                      req->media_index);
    }
    epd_reqtab_block(&srv->reqs, &req->ent);
}

static void epd_encoder_unblock_all(epd_encoder_srv_t *srv)
{
    if (epd_reqtab_unblock_all(&srv->reqs)) {
        epd_daemon_kick(srv->d);
    }
}

/* A transport failure seen by one image: the prefill worker is gone as far
 * as this image is concerned; a request-scope refusal keeps its own code. */
static epd_status_t epd_encoder_peer_status(epd_status_t st)
{
    return epd_status_scope(st) >= EPD_SCOPE_CONNECTION ? EPD_ERR_PEER_DEAD : st;
}

/* ---------------------------------------------------------------- failure */

/*
 * Fails (or aborts) one image: the first call wins the status and message;
 * `tell` says what it owes (EPD_ENCODER_TELL_*, EPD_ENCODER_QUIESCE); later
 * calls only add QUIESCE.  The step function does the rest.  An image that
 * owes its prefill worker an Error ends its request id here as a whole.
 * Nested-safe: frees nothing.
 */
static void epd_encoder_fail(epd_encoder_srv_t *srv, epd_encoder_req_t *req, epd_status_t status,
                             const char *msg, unsigned tell)
{
    int first = req->fail_status == EPD_OK;

    if (req->state == EPD_ENCODER_REQ_DONE) {
        return;
    }
    if (first) {
        req->fail_status = status != EPD_OK ? status : EPD_ERR_FATAL;
        snprintf(req->fail_msg, sizeof(req->fail_msg), "%s", msg);
        atomic_store_explicit(&req->job.cancel, 1, memory_order_release);
        req->owe |= tell & (EPD_ENCODER_TELL_CLIENT | EPD_ENCODER_TELL_PREFILL);
        epd_daemon_counts(srv->d)->failed++;
        if (status == EPD_ERR_CANCELED) {
            epd_log_debug(EPD_ENCODER_LOG, req->id, "media %u stopped: %s", req->media_index, msg);
        } else {
            EPD_ENCODER_WARN(srv, req->id, "media %u failed: %s (%s)", req->media_index, msg,
                             epd_status_name(status));
        }
    }
    req->owe |= tell & EPD_ENCODER_QUIESCE;
    epd_encoder_dirty(srv, req);
    if (first && (tell & EPD_ENCODER_TELL_PREFILL) != 0) {
        char why[200];

        /* the prefill worker fails the whole request on this Error: end the
         * id here too, so that its WritesQuiesced can go out */
        snprintf(why, sizeof(why), "media %u of this request failed: %.150s", req->media_index,
                 msg);
        epd_encoder_id_kill(srv, req->id, EPD_ERR_CANCELED, why, NULL, NULL);
    }
}

/* ----------------------------------------------------------------- writes */

/* Write completion (loop thread, possibly nested in a transport call): only
 * bookkeeping; the step at the top of the loop does the rest. */
static void epd_encoder_on_write(void *arg, epd_status_t status)
{
    epd_encoder_req_t *req = arg;
    epd_encoder_srv_t *srv = req->srv;

    req->write_inflight = 0;
    req->t_written_ns = epd_time_now_ns();
    epd_trace_span(srv->trace, "embed write", "xfer", req->id, (int32_t)req->media_index,
                   req->t_posted_ns, req->t_written_ns);
    if (status == EPD_OK) {
        srv->bytes_written += srv->slot_bytes;
        epd_prom_histo_observe_ns(&srv->hist.write, req->t_written_ns - req->t_posted_ns);
    } else {
        char msg[200];

        snprintf(msg, sizeof(msg), "the embedding write to prefill '%.80s' failed: %s",
                 epd_peer_id(req->peer), epd_status_string(status));
        epd_encoder_fail(srv, req, epd_encoder_peer_status(status), msg,
                         EPD_ENCODER_TELL_CLIENT | EPD_ENCODER_TELL_PREFILL | EPD_ENCODER_QUIESCE);
    }
    epd_encoder_dirty_id(srv, req->id);
    if (epd_reqtab_has_blocked(&srv->reqs)) {
        srv->room = 1;
        epd_daemon_kick(srv->d);
    }
}

/* Is a WritesQuiesced for req's id to req's prefill worker true now: every
 * image of the id bound to that worker here will post nothing more, has no
 * write in flight and no Error still to send ahead of it? */
static int epd_encoder_quiesce_ready(const epd_encoder_srv_t *srv, const epd_encoder_req_t *req)
{
    for (const epd_encoder_req_t *r = epd_reqtab_first_req(&srv->reqs); r != NULL;
         r = epd_reqtab_next_req(&srv->reqs, r)) {
        if (r->id != req->id || r->peer != req->peer) {
            continue;
        }
        if (r->write_inflight || (r->owe & EPD_ENCODER_TELL_PREFILL) != 0 ||
            (r->fail_status == EPD_OK && !r->complete_sent)) {
            return 0;
        }
    }
    return 1;
}

/* Sends what a failed image still owes (messages never wait: the links
 * queue them in order). */
static void epd_encoder_send_owed(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    epd_link_t *plink = epd_peer_link(req->peer);

    if ((req->owe & EPD_ENCODER_TELL_CLIENT) != 0) {
        (void)epd_link_send_error(req->client, req->id, req->fail_status, req->fail_msg, NULL);
        req->owe &= ~EPD_ENCODER_TELL_CLIENT;
    }
    if (!epd_peer_usable(req->peer)) {
        /* its links are gone.  It may still hold the slot in quarantine (a
         * retired writer's one-sided write is not stopped by closing
         * endpoints): once our write for this image completed, the daemon
         * tells that incarnation so on a new link (rule 28) */
        req->owe &= ~EPD_ENCODER_TELL_PREFILL;
        if ((req->owe & EPD_ENCODER_QUIESCE) != 0 && epd_encoder_quiesce_ready(srv, req)) {
            /* it speaks for every image of the id bound to that worker */
            epd_peer_owe_quiesced(req->peer, req->id);
            for (epd_encoder_req_t *r = epd_reqtab_first_req(&srv->reqs); r != NULL;
                 r = epd_reqtab_next_req(&srv->reqs, r)) {
                if (r->id == req->id && r->peer == req->peer) {
                    r->owe &= ~EPD_ENCODER_QUIESCE;
                    epd_encoder_dirty(srv, r);
                }
            }
        }
        return;
    }
    if ((req->owe & EPD_ENCODER_TELL_PREFILL) != 0) {
        (void)epd_link_send_error(plink, req->id, req->fail_status, req->fail_msg, NULL);
        req->owe &= ~EPD_ENCODER_TELL_PREFILL;
        epd_encoder_dirty_id(srv, req->id); /* siblings' WritesQuiesced waited for it */
    }
    if ((req->owe & EPD_ENCODER_QUIESCE) != 0 && epd_encoder_quiesce_ready(srv, req)) {
        /* fenced on our link: behind every write posted on it */
        (void)epd_link_send_quiesced(plink, req->id);
        for (epd_encoder_req_t *r = epd_reqtab_first_req(&srv->reqs); r != NULL;
             r = epd_reqtab_next_req(&srv->reqs, r)) {
            if (r->id == req->id && r->peer == req->peer) {
                r->owe &= ~EPD_ENCODER_QUIESCE;
                epd_encoder_dirty(srv, r);
            }
        }
        epd_log_debug(EPD_ENCODER_LOG, req->id, "writes quiesced towards prefill '%s'",
                      epd_peer_id(req->peer));
    }
}

/* Posts the write; returns -1 when parked on backpressure. */
static int epd_encoder_post_write(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    char msg[200];
    epd_status_t st;

    if (!epd_peer_usable(req->peer) || req->rkey == NULL) {
        epd_encoder_fail(srv, req, EPD_ERR_PEER_DEAD, "prefill worker is gone",
                         EPD_ENCODER_TELL_CLIENT);
        return 0;
    }
    if (epd_fault_any() && epd_fault_once("encoder.pause_before_write")) {
        /* the fence tests: stopped with the embeddings and the reservation
         * in hand; continued, the write goes out before the loop hears
         * anything of the prefill worker (common/epd_fault.h) */
        epd_log_warn(EPD_ENCODER_LOG, req->id,
                     "fault point encoder.pause_before_write: stopping before image %u's write",
                     req->media_index);
        epd_fault_pause("encoder.pause_before_write");
    }
    st = epd_xport_write(epd_link_ep(epd_peer_link(req->peer)), req->out, srv->slot_bytes,
                         srv->region, req->rkey, req->offset, epd_encoder_on_write, req);
    if (st == EPD_ERR_NO_RESOURCE) {
        epd_encoder_block(srv, req);
        return -1;
    }
    if (st != EPD_INPROGRESS && st != EPD_OK) {
        snprintf(msg, sizeof(msg), "posting the embedding write to prefill '%.80s': %s",
                 epd_peer_id(req->peer), epd_status_string(st));
        epd_encoder_fail(srv, req, epd_encoder_peer_status(st), msg,
                         EPD_ENCODER_TELL_CLIENT | EPD_ENCODER_TELL_PREFILL | EPD_ENCODER_QUIESCE);
        return 0;
    }
    req->write_inflight = 1;
    req->t_posted_ns = epd_time_now_ns();
    return 0;
}

/* EmbedComplete, fenced: the prefill worker sees it only after the write
 * landed. */
static void epd_encoder_send_complete(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    Epd__EmbedComplete ec = EPD__EMBED_COMPLETE__INIT;
    char msg[200];
    epd_status_t st;

    ec.request_id = req->id;
    ec.media_index = req->media_index;
    ec.n_embeddings = srv->info->image_embeddings;
    ec.embed_dim = srv->info->embed_dim;
    ec.checksum = req->job.checksum;
    st = epd_link_send(epd_peer_link(req->peer), EPD__ENVELOPE__BODY_EMBED_COMPLETE, &ec,
                       EPD_XPORT_SEND_FENCE);
    if (st != EPD_OK) {
        snprintf(msg, sizeof(msg), "sending EmbedComplete to prefill '%.80s': %s",
                 epd_peer_id(req->peer), epd_status_string(st));
        epd_encoder_fail(srv, req, epd_encoder_peer_status(st), msg, EPD_ENCODER_TELL_CLIENT);
        return;
    }
    req->complete_sent = 1;
    epd_daemon_counts(srv->d)->served++;
    epd_trace_instant(srv->trace, "EmbedComplete sent", "msg", req->id, (int32_t)req->media_index,
                      epd_time_now_ns());
}

/* ------------------------------------------------------------------- step */

/*
 * Moves an image as far as its facts allow: the only place its state
 * changes.  Returns -1 when the write waits for transport room (the image
 * is on the blocked list), 0 otherwise.
 */
static int epd_encoder_req_step(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    for (;;) {
        epd_encoder_req_state_t from = req->state;

        if (req->fail_status != EPD_OK && from != EPD_ENCODER_REQ_DONE) {
            req->state = EPD_ENCODER_REQ_FAILED;
        }
        switch (req->state) {
        case EPD_ENCODER_REQ_ENCODING:
            if (req->compute_done) {
                req->state = EPD_ENCODER_REQ_READY; /* a failed job failed the image */
            }
            break;
        case EPD_ENCODER_REQ_READY:
            if (req->have_resv) {
                if (epd_encoder_post_write(srv, req) != 0) {
                    return -1;
                }
                if (req->write_inflight) {
                    req->state = EPD_ENCODER_REQ_WRITING;
                }
            }
            break;
        case EPD_ENCODER_REQ_WRITING:
            if (!req->complete_sent) {
                epd_encoder_send_complete(srv, req);
            }
            if (req->complete_sent && !req->write_inflight) {
                req->state = EPD_ENCODER_REQ_DONE;
            }
            break;
        case EPD_ENCODER_REQ_FAILED:
            epd_encoder_send_owed(srv, req);
            if (req->compute_done && !req->write_inflight && req->owe == 0) {
                req->state = EPD_ENCODER_REQ_DONE;
            }
            break;
        case EPD_ENCODER_REQ_DONE:
            break;
        }
        if (req->state == from && (req->fail_status == EPD_OK || from == EPD_ENCODER_REQ_FAILED ||
                                   from == EPD_ENCODER_REQ_DONE)) {
            return 0; /* nothing more to do until the next event */
        }
    }
}

/* ----------------------------------------------------------------- freeing */

static void epd_encoder_req_free(epd_encoder_req_t *req)
{
    epd_link_unref(req->client);
    epd_free(req->image);
    epd_free(req);
}

/* A DONE image: out of every list, its slot back, freed.  Pump only. */
static void epd_encoder_req_destroy(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    if (req->fail_status == EPD_OK && epd_log_enabled(EPD_LOG_DEBUG)) {
        const epd_encoder_job_t *j = &req->job;

        epd_log_debug(EPD_ENCODER_LOG, req->id,
                      "media %u done: %ux%u %s, %zu bytes; queued %.3f ms, hash + decode %.3f ms, "
                      "encode %.3f ms, reservation %+.3f ms after ready, write %.3f ms",
                      req->media_index, j->width, j->height,
                      epd_image_format_name((epd_image_format_t)j->format), req->image_len,
                      (double)(j->started_ns - req->t_recv_ns) / 1e6,
                      (double)(j->decoded_ns - j->started_ns) / 1e6,
                      (double)(j->finished_ns - j->decoded_ns) / 1e6,
                      ((double)req->t_resv_ns - (double)req->ready_ns) / 1e6,
                      (double)(req->t_written_ns - req->t_posted_ns) / 1e6);
    }
    epd_reqtab_remove(&srv->reqs, &req->ent);
    /* a late or second reservation of it is answered at once */
    epd_tombs_add(srv->tombs, req->id, req->media_index, EPD_ENCODER_TOMB_ENDED);
    srv->free_slots[srv->n_free_slots++] = req->slot;
    if (req->rkey != NULL && !req->rkey_shared) {
        epd_xport_rkey_destroy(req->rkey);
    }
    epd_peer_unref(req->peer);
    epd_encoder_req_free(req);
}

/* Steps one image and frees it when it is done. */
static void epd_encoder_advance(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    if (epd_encoder_req_step(srv, req) == 0 && req->state == EPD_ENCODER_REQ_DONE) {
        epd_encoder_req_destroy(srv, req);
    }
}

/* -------------------------------------------------------------- the id */

/* Is a live image of `id` bound to the prefill incarnation that sent
 * `env`, on a link that still works?  Then its WritesQuiesced goes fenced
 * on that link, never ahead of it on another. */
static int epd_encoder_id_bound_to(const epd_encoder_srv_t *srv, uint64_t id,
                                   const Epd__Envelope *env)
{
    for (const epd_encoder_req_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        if (req->id == id && epd_peer_usable(req->peer) && epd_peer_is_sender(req->peer, env)) {
            return 1;
        }
    }
    return 0;
}

/*
 * Ends request `id` here as a whole (see the top of the file): a tombstone,
 * every live image of it fails with `status` (no Error: whoever caused this
 * knows; a WritesQuiesced for its prefill worker once its write is not in
 * flight), every stashed reservation of it gets Error(status, msg) and
 * WritesQuiesced on the link it came on.  `asker_env` / `asker`: a prefill
 * worker's message that asked for it (an Abort, Error or reservation): its
 * sender gets WritesQuiesced too — at once on `asker` when no live image of
 * the id is bound to it, else through those images.  Nested-safe.
 */
static void epd_encoder_id_kill(epd_encoder_srv_t *srv, uint64_t id, epd_status_t status,
                                const char *msg, const Epd__Envelope *asker_env, epd_link_t *asker)
{
    /* links already given their WritesQuiesced here: one each (a client and
     * a prefill worker may share one); at most one per stashed media plus
     * the asker */
    epd_link_t *quiesced[EPD_ENCODER_MEDIA_MAX + 1];
    uint32_t n_quiesced = 0;
    Epd__Envelope *senv;
    epd_link_t *sl;

    epd_tombs_add(srv->tombs, id, EPD_TOMB_ALL, EPD_ENCODER_TOMB_ABORTED);
    for (epd_encoder_req_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        if (req->id == id) {
            epd_encoder_fail(srv, req, status, msg, EPD_ENCODER_QUIESCE);
        }
    }
    while ((senv = epd_stash_take_any(srv->stash, id, &sl)) != NULL) {
        int again = 0;

        EPD_ENCODER_WARN(srv, id, "dropping the early reservation of media %u from '%s': %s",
                         senv->embed_reservation->media_index, senv->sender->worker_id, msg);
        (void)epd_link_send_error(sl, id, status, msg, NULL);
        for (uint32_t i = 0; i < n_quiesced; i++) {
            again |= quiesced[i] == sl;
        }
        if (sl != NULL && !again && !epd_encoder_id_bound_to(srv, id, senv)) {
            (void)epd_link_send_quiesced(sl, id);
            if (n_quiesced < EPD_ENCODER_MEDIA_MAX) {
                quiesced[n_quiesced++] = sl;
            }
        }
        epd_msg_free(senv);
        epd_link_unref(sl);
    }
    if (asker_env != NULL && asker != NULL && !epd_encoder_id_bound_to(srv, id, asker_env)) {
        int again = 0;

        for (uint32_t i = 0; i < n_quiesced; i++) {
            again |= quiesced[i] == asker;
        }
        if (!again) {
            (void)epd_link_send_quiesced(asker, id);
        }
    }
}

/* -------------------------------------------------------------- admission */

/* Admits a checked EncodeRequest: a slot, a copy of the image, the compute
 * job.  On success *req_p is live (in the table); EPD_ERR_NO_CAPACITY or
 * EPD_ERR_NO_MEMORY otherwise (nothing kept). */
static epd_status_t epd_encoder_admit(epd_encoder_srv_t *srv, const Epd__EncodeRequest *e,
                                      epd_link_t *client, const char *client_id, epd_peer_t *peer,
                                      uint64_t t_recv_ns, epd_encoder_req_t **req_p)
{
    epd_encoder_req_t *req;

    if (srv->n_free_slots == 0) {
        return EPD_ERR_NO_CAPACITY;
    }
    req = epd_calloc(1, sizeof(*req));
    if (req == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    req->image = epd_malloc(e->image.len);
    if (req->image == NULL) {
        epd_free(req);
        return EPD_ERR_NO_MEMORY;
    }
    memcpy(req->image, e->image.data, e->image.len);
    req->image_len = e->image.len;
    memcpy(req->content_hash, e->content_hash.data, sizeof(req->content_hash));
    req->id = e->request_id;
    req->media_index = e->media_index;
    req->state = EPD_ENCODER_REQ_ENCODING;
    req->fail_status = EPD_OK;
    req->srv = srv;
    req->client = client;
    epd_link_ref(client);
    snprintf(req->client_id, sizeof(req->client_id), "%s", client_id);
    req->peer = peer; /* the caller's reference becomes the image's */
    req->t_recv_ns = t_recv_ns;
    if (e->deadline_ms != 0) {
        uint64_t ms = e->deadline_ms > 86400000ull ? 86400000ull : e->deadline_ms;

        req->deadline_ns = t_recv_ns + ms * EPD_NSEC_PER_MSEC;
    }
    /* the slot: the loop owns it while free */
    req->slot = srv->free_slots[--srv->n_free_slots];
    req->out =
        (float *)((char *)epd_xport_mr_addr(srv->region) + (size_t)req->slot * srv->slot_stride);
    req->job.image = req->image;
    req->job.image_len = req->image_len;
    req->job.content_hash = req->content_hash;
    req->job.max_pixels = srv->max_pixels;
    req->job.out = req->out;
    req->job.out_bytes = srv->slot_bytes;
    req->job.req_id = req->id;
    req->job.media_index = req->media_index;
    req->job.trace = srv->trace;
    req->job.owner = req;
    atomic_init(&req->job.cancel, 0);
    if (epd_encoder_compute_submit(srv->compute, &req->job) != EPD_OK) {
        srv->free_slots[srv->n_free_slots++] = req->slot;
        req->peer = NULL;
        epd_encoder_req_free(req);
        return EPD_ERR_NO_CAPACITY;
    }
    req->ent.id = req->id;
    req->ent.sub = req->media_index;
    epd_reqtab_insert(&srv->reqs, &req->ent);
    *req_p = req;
    return EPD_OK;
}

/* ------------------------------------------------------------ reservation */

/* Applies a checked EmbedReservation to `req`; fails req when it cannot be
 * served (epd_encoder_resv.c says why). */
static void epd_encoder_apply_reservation(epd_encoder_srv_t *srv, epd_encoder_req_t *req,
                                          const Epd__EmbedReservation *r)
{
    char msg[200];
    epd_status_t st;

    st = epd__encoder_resv_take(srv, req->peer, r, &req->rkey, &req->rkey_shared, msg, sizeof(msg));
    if (st != EPD_OK) {
        epd_encoder_fail(srv, req, st, msg,
                         st == EPD_ERR_PEER_DEAD && epd_peer_state(req->peer) == EPD_PEER_DEAD
                             ? EPD_ENCODER_TELL_CLIENT
                             : EPD_ENCODER_TELL_CLIENT | EPD_ENCODER_TELL_PREFILL |
                                   EPD_ENCODER_QUIESCE);
        return;
    }
    req->offset = r->offset;
    req->bytes = r->bytes;
    req->region_size = r->region_size;
    req->have_resv = 1;
    req->t_resv_ns = epd_time_now_ns();
    epd_log_debug(EPD_ENCODER_LOG, req->id, "media %u: reservation at offset %llu (%s)",
                  req->media_index, (unsigned long long)r->offset,
                  req->ready_ns != 0 ? "embeddings ready" : "still encoding");
    if (req->ready_ns != 0) {
        /* the embeddings waited for somewhere to go */
        epd_trace_span(srv->trace, "reservation wait", "wait", req->id, (int32_t)req->media_index,
                       req->ready_ns, req->t_resv_ns);
    }
    if (!epd_reqtab_is_blocked(&req->ent)) {
        epd_encoder_advance(srv, req); /* the lean path: post the write right here */
    }
}

/* A reservation for a live image. */
static void epd_encoder_reservation_for(epd_encoder_srv_t *srv, epd_encoder_req_t *req,
                                        epd_link_t *from, const Epd__Envelope *env)
{
    if (!epd_peer_is_sender(req->peer, env)) {
        epd_encoder_refuse(srv, from, req->id, EPD_ERR_INVALID_PARAM,
                           "sender is not the prefill worker this image is for");
        return;
    }
    if (req->fail_status != EPD_OK) {
        return; /* its Error (and WritesQuiesced) are on their way */
    }
    if (req->have_resv) {
        epd_encoder_refuse(srv, from, req->id, EPD_ERR_EXISTS,
                           "a second reservation for this image");
        return;
    }
    epd_encoder_apply_reservation(srv, req, env->embed_reservation);
}

/* ------------------------------------------------------ from the messages */

void epd__encoder_req_refused(epd_encoder_srv_t *srv, uint64_t id, uint32_t media,
                              epd_status_t status, const char *msg)
{
    epd_daemon_counts(srv->d)->refused++;
    if (status == EPD_ERR_EXISTS) {
        return; /* the live image keeps its reservation */
    }
    epd_tombs_add(srv->tombs, id, media, EPD_ENCODER_TOMB_ENDED);
    if (epd_stash_has(srv->stash, id, media)) {
        epd_encoder_id_kill(srv, id, status, msg, NULL, NULL);
    }
}

void epd__encoder_req_encode(epd_encoder_srv_t *srv, epd_link_t *from, const Epd__Envelope *env)
{
    const Epd__EncodeRequest *e = env->encode;
    uint64_t id = e->request_id;
    uint32_t media = e->media_index;
    epd_msg_epoch_t p_epoch = epd_msg_epoch_of(e->prefill_epoch);
    epd_peer_t *peer = NULL;
    epd_encoder_req_t *req = NULL;
    uint64_t t_recv = epd_time_now_ns();
    Epd__Envelope *senv;
    epd_link_t *sl;
    char msg[200];
    epd_status_t st = EPD_OK;

    epd_daemon_counts(srv->d)->received++;
    if (epd_reqtab_find_req(&srv->reqs, id, media) != NULL) {
        st = EPD_ERR_EXISTS;
        snprintf(msg, sizeof(msg), "media %u of request %llu is already being encoded here", media,
                 (unsigned long long)id);
    } else if (epd_tombs_find(srv->tombs, id, media) == EPD_ENCODER_TOMB_ABORTED) {
        st = EPD_ERR_CANCELED;
        snprintf(msg, sizeof(msg), "request %llu was aborted or failed here",
                 (unsigned long long)id);
    } else if (srv->n_free_slots == 0) {
        st = EPD_ERR_NO_CAPACITY;
        snprintf(msg, sizeof(msg), "no free slot: %u images in flight", srv->slots);
    }
    if (st == EPD_OK) {
        st = epd_peer_get(srv->d, EPD__ROLE__ROLE_PREFILL, e->prefill_worker_id, &p_epoch,
                          e->prefill_address.data, e->prefill_address.len, &peer);
        if (st != EPD_OK) {
            snprintf(msg, sizeof(msg), "prefill worker '%.60s': %s", e->prefill_worker_id,
                     st == EPD_ERR_STALE_EPOCH ? "a newer epoch of it is known"
                                               : epd_status_string(st));
        }
    }
    if (st == EPD_OK) {
        st = epd_encoder_admit(srv, e, from, env->sender->worker_id, peer, t_recv, &req);
        if (st != EPD_OK) {
            epd_peer_unref(peer);
            snprintf(msg, sizeof(msg), "cannot admit the image: %s", epd_status_string(st));
        }
    }
    if (st != EPD_OK) {
        epd_daemon_refuse_log(srv->d, id, "%s (%s)", msg, epd_status_name(st));
        (void)epd_link_send_error(from, id, st, msg, NULL);
        epd__encoder_req_refused(srv, id, media, st, msg);
        return;
    }
    epd_tombs_clear(srv->tombs, id, media);
    epd_log_debug(EPD_ENCODER_LOG, id,
                  "media %u admitted: %zu bytes into slot %u, for prefill '%s'", media,
                  e->image.len, req->slot, epd_peer_id(peer));
    senv = epd_stash_take(srv->stash, id, media, &sl);
    if (senv != NULL) {
        if (epd_peer_is_sender(peer, senv)) {
            epd_encoder_reservation_for(srv, req, sl, senv);
        } else {
            /* someone else reserved for this image: refuse that, keep waiting */
            epd_encoder_refuse(srv, sl, id, EPD_ERR_INVALID_PARAM,
                               "sender is not the prefill worker this image is for");
        }
        epd_msg_free(senv);
        epd_link_unref(sl);
    }
}

int epd__encoder_req_reservation(epd_encoder_srv_t *srv, epd_link_t *from, Epd__Envelope *env)
{
    const Epd__EmbedReservation *r = env->embed_reservation;
    uint64_t id = r->request_id;
    uint32_t media = r->media_index;
    epd_encoder_req_t *req = epd_reqtab_find_req(&srv->reqs, id, media);
    uint64_t lease_ms;
    char msg[200];
    int tomb;

    if (req != NULL) {
        epd_encoder_reservation_for(srv, req, from, env);
        return 0;
    }
    tomb = epd_tombs_find(srv->tombs, id, media);
    if (tomb != 0 || media >= EPD_ENCODER_MEDIA_MAX) {
        snprintf(msg, sizeof(msg), "no such image here (media %u of request %llu %s)", media,
                 (unsigned long long)id,
                 media >= EPD_ENCODER_MEDIA_MAX     ? "is out of range"
                 : tomb == EPD_ENCODER_TOMB_ABORTED ? "was aborted"
                                                    : "ended");
        EPD_ENCODER_WARN(srv, id, "reservation refused: %s", msg);
        (void)epd_link_send_error(from, id, EPD_ERR_NOT_FOUND, msg, NULL);
        epd_encoder_id_kill(srv, id, EPD_ERR_NOT_FOUND, msg, env, from);
        return 0;
    }
    if (epd_stash_has(srv->stash, id, media)) {
        epd_encoder_refuse(srv, from, id, EPD_ERR_EXISTS, "a second reservation for this image");
        return 0;
    }
    /* may have overtaken the client's EncodeRequest: keep it for its lease */
    lease_ms = r->lease_ms != 0 ? r->lease_ms : srv->lease_ms;
    if (epd_stash_put(srv->stash, env, from, id, media,
                      epd_time_now_ns() + lease_ms * EPD_NSEC_PER_MSEC) != EPD_OK) {
        snprintf(msg, sizeof(msg), "%d reservations already wait for their EncodeRequest",
                 EPD_ENCODER_STASH_MAX);
        EPD_ENCODER_WARN(srv, id, "reservation refused: %s", msg);
        (void)epd_link_send_error(from, id, EPD_ERR_NO_CAPACITY, msg, NULL);
        epd_encoder_id_kill(srv, id, EPD_ERR_NO_CAPACITY, msg, env, from);
        return 0;
    }
    epd_log_debug(EPD_ENCODER_LOG, id, "reservation of media %u before its EncodeRequest: kept",
                  media);
    return 1;
}

void epd__encoder_req_stop(epd_encoder_srv_t *srv, epd_link_t *from, const Epd__Envelope *env,
                           uint64_t id, const char *reason)
{
    const char *who = env->sender->worker_id;
    int live = 0, allowed = 0, from_p = 0;
    char msg[200];

    for (epd_encoder_req_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        if (req->id == id) {
            live = 1;
            if (strcmp(who, req->client_id) == 0) {
                allowed = 1;
            }
            if (epd_peer_is_sender(req->peer, env)) {
                allowed = from_p = 1;
            }
        }
    }
    if (live && !allowed) {
        if (env->body_case == EPD__ENVELOPE__BODY_ABORT) {
            epd_encoder_refuse(srv, from, id, EPD_ERR_NOT_FOUND,
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
    /* a prefill worker's own link gets WritesQuiesced when no image of the
     * id is bound to it here (nothing of it in flight) — also one that
     * retired us and asks before reusing a slot (the fence); a client's
     * never does */
    epd_encoder_id_kill(
        srv, id, EPD_ERR_CANCELED, msg,
        from_p || epd_peer_may_quiesce(srv->d, from, env, EPD__ROLE__ROLE_PREFILL) ? env : NULL,
        from);
}

/* ------------------------------------------------------------ compute back */

void epd__encoder_req_on_job(void *arg, epd_encoder_job_t *job)
{
    epd_encoder_srv_t *srv = arg;
    epd_encoder_req_t *req = job->owner;
    char msg[200];

    req->compute_done = 1;
    epd_free(req->image); /* the compute thread is done reading it */
    req->image = NULL;
    req->job.image = NULL;
    epd_trace_span(srv->trace, "queued", "wait", req->id, (int32_t)req->media_index, req->t_recv_ns,
                   job->started_ns);
    if (job->started_ns != 0) { /* it ran (0: canceled before it started) */
        epd_prom_histo_observe_ns(&srv->hist.queue, job->started_ns > req->t_recv_ns
                                                        ? job->started_ns - req->t_recv_ns
                                                        : 0);
        epd_prom_histo_observe_ns(&srv->hist.encode, job->finished_ns > job->started_ns
                                                         ? job->finished_ns - job->started_ns
                                                         : 0);
    }
    if (req->fail_status != EPD_OK) {
        /* aborted or failed meanwhile: the embeddings (if any) are discarded */
    } else if (job->status == EPD_OK) {
        req->ready_ns = epd_time_now_ns();
        if (req->have_resv && !epd_reqtab_is_blocked(&req->ent)) {
            /* the lean path: post the write right here, at the top of the loop */
            epd_encoder_advance(srv, req);
            return;
        }
    } else {
        epd_encoder_job_describe(job, srv->max_pixels, msg, sizeof(msg));
        epd_encoder_fail(srv, req, job->status, msg,
                         EPD_ENCODER_TELL_CLIENT | EPD_ENCODER_TELL_PREFILL | EPD_ENCODER_QUIESCE);
    }
    epd_encoder_dirty(srv, req);
}

/* --------------------------------------------------------- daemon upcalls */

void epd__encoder_req_on_peer_dead(void *arg, epd_peer_t *peer, epd_status_t status,
                                   const char *why)
{
    epd_encoder_srv_t *srv = arg;
    char msg[200];

    (void)status;
    snprintf(msg, sizeof(msg), "prefill worker '%.80s' %s", epd_peer_id(peer), why);
    epd_log_warn(EPD_ENCODER_LOG, 0, "%s: failing its images", msg);
    for (epd_encoder_req_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        if (req->peer == peer) {
            /* keys unpacked on its link die when the link closes */
            req->rkey = NULL;
            req->rkey_shared = 0;
            epd_encoder_fail(srv, req, EPD_ERR_PEER_DEAD, msg,
                             EPD_ENCODER_TELL_CLIENT | EPD_ENCODER_QUIESCE);
        }
    }
}

int epd__encoder_req_on_pump(void *arg)
{
    epd_encoder_srv_t *srv = arg;
    epd_encoder_req_t *req;

    if (srv->room) {
        srv->room = 0;
        epd_encoder_unblock_all(srv);
    }
    while ((req = epd_reqtab_pop_dirty_req(&srv->reqs)) != NULL) {
        epd_encoder_advance(srv, req);
    }
    return srv->room;
}

void epd__encoder_req_on_tick(void *arg, uint64_t now)
{
    epd_encoder_srv_t *srv = arg;
    uint64_t lease_ns = (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    const unsigned all = EPD_ENCODER_TELL_CLIENT | EPD_ENCODER_TELL_PREFILL | EPD_ENCODER_QUIESCE;
    Epd__Envelope *senv;
    epd_link_t *sl;
    char msg[200];

    for (epd_encoder_req_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        if (req->fail_status != EPD_OK) {
            if (req->owe != 0) {
                epd_encoder_dirty(srv, req); /* a safety net for what it waits on */
            }
            continue;
        }
        if (!req->complete_sent && req->deadline_ns != 0 && now >= req->deadline_ns) {
            snprintf(msg, sizeof(msg), "the request's deadline of %llu ms passed (%s)",
                     (unsigned long long)((req->deadline_ns - req->t_recv_ns) / EPD_NSEC_PER_MSEC),
                     !req->compute_done ? "still encoding"
                     : !req->have_resv  ? "no reservation yet"
                                        : "writing");
            epd_encoder_fail(srv, req, EPD_ERR_TIMEOUT, msg, all);
        } else if (req->ready_ns != 0 && !req->have_resv && now - req->ready_ns > lease_ns) {
            snprintf(msg, sizeof(msg),
                     "no EmbedReservation from prefill '%.80s' within %u ms of the embeddings "
                     "being ready",
                     epd_peer_id(req->peer), srv->lease_ms);
            epd_encoder_fail(srv, req, EPD_ERR_TIMEOUT, msg, all);
        }
    }
    while ((senv = epd_stash_take_expired(srv->stash, now, &sl)) != NULL) {
        uint64_t id = senv->embed_reservation->request_id;

        /* back in, so that the kill answers it with the rest of its id */
        if (epd_stash_put(srv->stash, senv, sl, id, senv->embed_reservation->media_index, 0) !=
            EPD_OK) {
            epd_msg_free(senv);
        }
        epd_link_unref(sl);
        epd_encoder_id_kill(srv, id, EPD_ERR_NOT_FOUND,
                            "no EncodeRequest for this image arrived within the lease", NULL, NULL);
    }
    epd_encoder_unblock_all(srv);
}

void epd__encoder_req_load(void *arg, epd_daemon_load_t *load_p)
{
    epd_encoder_srv_t *srv = arg;
    uint32_t queued = srv->compute != NULL ? epd_encoder_compute_backlog(srv->compute) : 0;

    if (queued > epd_reqtab_count(&srv->reqs)) {
        queued = epd_reqtab_count(&srv->reqs);
    }
    load_p->queue_depth = queued;
    load_p->running_requests = epd_reqtab_count(&srv->reqs) - queued;
}

void epd__encoder_req_on_stop(void *arg)
{
    epd_encoder_srv_t *srv = arg;

    for (epd_encoder_req_t *req = epd_reqtab_first_req(&srv->reqs); req != NULL;
         req = epd_reqtab_next_req(&srv->reqs, req)) {
        atomic_store(&req->job.cancel, 1);
    }
}

/* ------------------------------------------------------------------- life */

epd_status_t epd__encoder_reqs_init(epd_encoder_srv_t *srv)
{
    uint64_t ttl_ms = (uint64_t)srv->lease_ms * 10;
    epd_status_t st;

    st = epd_reqtab_init(&srv->reqs, srv->slots, offsetof(epd_encoder_req_t, ent));
    if (st != EPD_OK) {
        return st;
    }
    srv->free_slots = epd_calloc(srv->slots, sizeof(*srv->free_slots));
    if (srv->free_slots == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < srv->slots; i++) {
        srv->free_slots[i] = srv->slots - 1 - i; /* lowest on top */
    }
    srv->n_free_slots = srv->slots;
    st = epd_stash_create(EPD_ENCODER_STASH_MAX, &srv->stash);
    if (st != EPD_OK) {
        return st;
    }
    /* a tombstone outlives every lease a late message could still be under */
    return epd_tombs_create(EPD_ENCODER_TOMB_MAX,
                            (ttl_ms < 60000 ? 60000 : ttl_ms) * EPD_NSEC_PER_MSEC, &srv->tombs);
}

void epd__encoder_reqs_cleanup(epd_encoder_srv_t *srv)
{
    epd_encoder_req_t *req;

    if (srv->reqs.table_ != NULL) {
        while ((req = epd_reqtab_first_req(&srv->reqs)) != NULL) {
            epd_reqtab_remove(&srv->reqs, &req->ent);
            epd_peer_unref(req->peer);
            epd_encoder_req_free(req);
        }
    }
    epd_reqtab_cleanup(&srv->reqs);
    epd_stash_destroy(srv->stash);
    srv->stash = NULL;
    epd_tombs_destroy(srv->tombs);
    srv->tombs = NULL;
    epd_free(srv->free_slots);
    srv->free_slots = NULL;
}
