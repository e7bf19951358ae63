/*
 * epd_encoder_req.c — one image's life on the encoder, on the loop thread.
 *
 *   EncodeRequest admitted: a slot, a copy of the bytes, the compute job
 *     queued at once (no wait for the reservation)
 *     │                                   EmbedReservation (before or after)
 *     ▼                                     │ validated, key unpacked once
 *   job back: embeddings in the slot,       │ per prefill incarnation
 *     checksum computed ───────────┬────────┘
 *                                  ▼
 *            one epd_xport_write slot -> prefill's region at `offset`,
 *            then EmbedComplete fenced behind it on the same endpoint
 *                                  ▼
 *            write callback: the slot is free, the request is freed
 *
 * Failure and abort share one path (epd__encoder_req_fail): the job's
 * cancel flag (an encode already running finishes and is discarded),
 * nothing more is posted, pending Errors go out, and WritesQuiesced goes to
 * the prefill worker once no write of the request id is in flight there.
 * The slot is lent to the compute thread until the job came back and to
 * the transport until the write callback: only then does it return to the
 * free stack.
 *
 * Leases: an image whose embeddings are ready and whose reservation has not
 * come within lease_ms fails (EPD_ERR_TIMEOUT to client and prefill); the
 * EncodeRequest's deadline_ms bounds the whole of it (EPD_ERR_TIMEOUT).
 *
 * Backpressure: a write or send refused with EPD_ERR_NO_RESOURCE leaves the
 * request on the blocked list where it was; the blocked list is retried
 * after the next write completion and on the periodic tick.  Nothing is
 * dropped and nothing waits.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_encoder_int.h"
#include "epd_image.h"
#include "epd_log.h"
#include "epd_time.h"

enum { EPD_ENCODER_LIST_NONE = 0, EPD_ENCODER_LIST_DIRTY, EPD_ENCODER_LIST_BLOCKED };

/* ------------------------------------------------------------ bookkeeping */

static uint32_t epd_encoder_hash_key(const epd_encoder_srv_t *srv, uint64_t id, uint32_t media)
{
    uint64_t h = (id ^ ((uint64_t)media << 56)) * 0x9E3779B97F4A7C15ull;

    return (uint32_t)(h >> 32) & (srv->table_size - 1);
}

epd_encoder_req_t *epd__encoder_req_find(epd_encoder_srv_t *srv, uint64_t id, uint32_t media)
{
    epd_encoder_req_t *r;

    for (r = srv->table[epd_encoder_hash_key(srv, id, media)]; r != NULL; r = r->hnext) {
        if (r->id == id && r->media_index == media) {
            return r;
        }
    }
    return NULL;
}

static void epd_encoder_list_remove(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    epd_encoder_req_t **head, **tail;

    if (req->list == EPD_ENCODER_LIST_NONE) {
        return;
    }
    head = req->list == EPD_ENCODER_LIST_DIRTY ? &srv->dirty_head : &srv->blocked_head;
    tail = req->list == EPD_ENCODER_LIST_DIRTY ? &srv->dirty_tail : &srv->blocked_tail;
    if (req->lprev != NULL) {
        req->lprev->lnext = req->lnext;
    } else {
        *head = req->lnext;
    }
    if (req->lnext != NULL) {
        req->lnext->lprev = req->lprev;
    } else {
        *tail = req->lprev;
    }
    req->lprev = req->lnext = NULL;
    req->list = EPD_ENCODER_LIST_NONE;
}

static void epd_encoder_list_append(epd_encoder_srv_t *srv, epd_encoder_req_t *req, int which)
{
    epd_encoder_req_t **head =
        which == EPD_ENCODER_LIST_DIRTY ? &srv->dirty_head : &srv->blocked_head;
    epd_encoder_req_t **tail =
        which == EPD_ENCODER_LIST_DIRTY ? &srv->dirty_tail : &srv->blocked_tail;

    req->lprev = *tail;
    req->lnext = NULL;
    if (*tail != NULL) {
        (*tail)->lnext = req;
    } else {
        *head = req;
    }
    *tail = req;
    req->list = which;
}

void epd__encoder_pump_start(epd_encoder_srv_t *srv)
{
    if (!srv->pump_on && !srv->stopping) {
        srv->pump_on = 1;
        uv_idle_start(&srv->pump, epd__encoder_on_pump);
    }
}

void epd__encoder_req_dirty(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    if (req->list == EPD_ENCODER_LIST_DIRTY) {
        return;
    }
    epd_encoder_list_remove(srv, req);
    epd_encoder_list_append(srv, req, EPD_ENCODER_LIST_DIRTY);
    epd__encoder_pump_start(srv);
}

/* Every live image of request `id`: one of them changed what the others'
 * WritesQuiesced waits for. */
static void epd_encoder_dirty_id(epd_encoder_srv_t *srv, uint64_t id)
{
    for (epd_encoder_req_t *r = srv->all; r != NULL; r = r->all_next) {
        if (r->id == id) {
            epd__encoder_req_dirty(srv, r);
        }
    }
}

static void epd_encoder_req_block(epd_encoder_srv_t *srv, epd_encoder_req_t *req, const char *what)
{
    if (!req->backpressured) {
        req->backpressured = 1;
        epd_log_debug(EPD_ENCODER_LOG, req->id,
                      "media %u: transport backpressure on %s: retrying after progress",
                      req->media_index, what);
    }
    epd_encoder_list_remove(srv, req);
    epd_encoder_list_append(srv, req, EPD_ENCODER_LIST_BLOCKED);
}

/* Requests parked on backpressure go back to the dirty list. */
static void epd_encoder_unblock_all(epd_encoder_srv_t *srv)
{
    while (srv->blocked_head != NULL) {
        epd__encoder_req_dirty(srv, srv->blocked_head);
    }
}

/* A transport failure seen by one image: the prefill worker is gone as far
 * as this image is concerned; a request-scope refusal keeps its own code. */
static epd_status_t epd_encoder_peer_status(epd_status_t st)
{
    return epd_status_scope(st) >= EPD_SCOPE_CONNECTION ? EPD_ERR_PEER_DEAD : st;
}

/* -------------------------------------------------------------- admission */

static void epd_encoder_req_free(epd_encoder_req_t *req)
{
    epd_free(req->image);
    epd_free(req);
}

epd_status_t epd__encoder_req_admit(epd_encoder_srv_t *srv, const Epd__EncodeRequest *e,
                                    epd_xport_ep_t *client_ep, const char *client_id,
                                    epd_encoder_peer_t *peer, uint64_t t_recv_ns,
                                    epd_encoder_req_t **req_p)
{
    epd_encoder_req_t *req;
    uint32_t h;

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
    req->srv = srv;
    req->client_ep = client_ep;
    snprintf(req->client_id, sizeof(req->client_id), "%s", client_id);
    req->peer = peer;
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
        epd_encoder_req_free(req);
        return EPD_ERR_NO_CAPACITY;
    }

    h = epd_encoder_hash_key(srv, req->id, req->media_index);
    req->hnext = srv->table[h];
    srv->table[h] = req;
    req->all_next = srv->all;
    if (srv->all != NULL) {
        srv->all->all_prev = req;
    }
    srv->all = req;
    srv->n_live++;
    peer->n_refs++;
    *req_p = req;
    return EPD_OK;
}

/* ---------------------------------------------------------------- failure */

void epd__encoder_req_fail(epd_encoder_srv_t *srv, epd_encoder_req_t *req, epd_status_t status,
                           const char *msg, int tell_client, int tell_p, int quiesce)
{
    int first = !req->failed;

    if (first) {
        req->failed = 1;
        req->fail_status = status;
        snprintf(req->fail_msg, sizeof(req->fail_msg), "%s", msg);
        atomic_store_explicit(&req->job.cancel, 1, memory_order_release);
        req->tell_client = tell_client && req->client_ep != NULL;
        req->tell_p = tell_p;
        srv->failed_reqs++;
        if (status == EPD_ERR_CANCELED) {
            epd_log_debug(EPD_ENCODER_LOG, req->id, "media %u stopped: %s", req->media_index, msg);
        } else if (epd__encoder_log_allowed(srv)) {
            epd_log_warn(EPD_ENCODER_LOG, req->id, "media %u failed: %s (%s)", req->media_index,
                         msg, epd_status_name(status));
        }
    }
    if (quiesce) {
        req->need_quiesced = 1;
    }
    epd__encoder_req_dirty(srv, req);
    if (first && tell_p) {
        char why[200];

        /* the prefill worker fails the whole request on this Error: end the
         * id here too, so that its WritesQuiesced can go out (it speaks for
         * every image of the id) */
        snprintf(why, sizeof(why), "media %u of this request failed: %.150s", req->media_index,
                 msg);
        epd__encoder_id_kill(srv, req->id, EPD_ERR_CANCELED, why, NULL, NULL);
    }
}

/* ----------------------------------------------------------------- writes */

/* Write completion (loop thread, possibly nested in a transport call): only
 * bookkeeping; the pump does the rest. */
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
    } else if (!req->failed) {
        char msg[200];

        snprintf(msg, sizeof(msg), "the embedding write to prefill '%.80s' failed: %s",
                 req->peer->worker_id, epd_status_string(status));
        epd__encoder_req_fail(srv, req, epd_encoder_peer_status(status), msg, 1, 1, 1);
    }
    epd_encoder_dirty_id(srv, req->id);
    if (srv->blocked_head != NULL) {
        srv->room = 1;
        epd__encoder_pump_start(srv);
    }
}

/* Is a WritesQuiesced for req's id to req's prefill worker true now: every
 * image of the id bound to that worker here will post nothing more, has no
 * write in flight and no Error still to send ahead of it? */
static int epd_encoder_quiesce_ready(const epd_encoder_srv_t *srv, const epd_encoder_req_t *req)
{
    for (const epd_encoder_req_t *r = srv->all; r != NULL; r = r->all_next) {
        if (r->id != req->id || r->peer != req->peer) {
            continue;
        }
        if (r->write_inflight || r->tell_p || !(r->failed || r->complete_sent)) {
            return 0;
        }
    }
    return 1;
}

/* Sends what a failed image still owes; returns -1 when parked on
 * backpressure. */
static int epd_encoder_send_failure(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    epd_status_t st;

    if (req->tell_client) {
        if (req->client_ep != NULL) {
            st = epd__encoder_send_error(srv, req->client_ep, req->id, req->fail_status,
                                         req->fail_msg);
            if (st == EPD_ERR_NO_RESOURCE) {
                epd_encoder_req_block(srv, req, "an Error to the client");
                return -1;
            }
        }
        req->tell_client = 0;
    }
    if (!epd__encoder_peer_usable(req->peer)) {
        req->tell_p = 0;
        req->need_quiesced = 0;
        return 0;
    }
    if (req->tell_p) {
        st = epd__encoder_send_error(srv, req->peer->ep, req->id, req->fail_status, req->fail_msg);
        if (st == EPD_ERR_NO_RESOURCE) {
            epd_encoder_req_block(srv, req, "an Error to the prefill worker");
            return -1;
        }
        req->tell_p = 0;
        epd_encoder_dirty_id(srv, req->id); /* siblings' WritesQuiesced waited for it */
    }
    if (req->need_quiesced && epd_encoder_quiesce_ready(srv, req)) {
        /* fenced on our endpoint: behind every write posted on it */
        st = epd__encoder_send_quiesced(srv, req->peer->ep, req->id);
        if (st == EPD_ERR_NO_RESOURCE) {
            epd_encoder_req_block(srv, req, "WritesQuiesced");
            return -1;
        }
        for (epd_encoder_req_t *r = srv->all; r != NULL; r = r->all_next) {
            if (r->id == req->id && r->peer == req->peer) {
                r->need_quiesced = 0;
                epd__encoder_req_dirty(srv, r);
            }
        }
        epd_log_debug(EPD_ENCODER_LOG, req->id, "writes quiesced towards prefill '%s'",
                      req->peer->worker_id);
    }
    return 0;
}

/* Moves an image forward as far as it can go without freeing it. */
static int epd_encoder_advance(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    Epd__EmbedComplete ec = EPD__EMBED_COMPLETE__INIT;
    char msg[200];
    epd_status_t st;

    if (req->failed) {
        return epd_encoder_send_failure(srv, req);
    }
    if (!req->compute_done || req->job.status != EPD_OK || !req->have_resv) {
        return 0;
    }
    if (!epd__encoder_peer_usable(req->peer) || req->rkey == NULL) {
        epd__encoder_req_fail(srv, req, EPD_ERR_PEER_DEAD, "prefill worker is gone", 1, 0, 0);
        return epd_encoder_send_failure(srv, req);
    }
    if (!req->write_posted) {
        st = epd_xport_write(req->peer->ep, req->out, srv->slot_bytes, srv->region, req->rkey,
                             req->offset, epd_encoder_on_write, req);
        if (st == EPD_ERR_NO_RESOURCE) {
            epd_encoder_req_block(srv, req, "the embedding write");
            return -1;
        }
        if (st != EPD_INPROGRESS && st != EPD_OK) {
            snprintf(msg, sizeof(msg), "posting the embedding write to prefill '%.80s': %s",
                     req->peer->worker_id, epd_status_string(st));
            epd__encoder_req_fail(srv, req, epd_encoder_peer_status(st), msg, 1, 1, 1);
            return epd_encoder_send_failure(srv, req);
        }
        req->write_posted = 1;
        req->write_inflight = 1;
        req->t_posted_ns = epd_time_now_ns();
    }
    if (!req->complete_sent) {
        ec.request_id = req->id;
        ec.media_index = req->media_index;
        ec.n_embeddings = srv->info->image_embeddings;
        ec.embed_dim = srv->info->embed_dim;
        ec.checksum = req->job.checksum;
        /* fenced: the prefill worker sees it only after the write landed */
        st = epd__encoder_send(srv, req->peer->ep, EPD__ENVELOPE__BODY_EMBED_COMPLETE, &ec,
                               EPD_XPORT_SEND_FENCE);
        if (st == EPD_ERR_NO_RESOURCE) {
            epd_encoder_req_block(srv, req, "EmbedComplete");
            return -1;
        }
        if (st != EPD_OK) {
            snprintf(msg, sizeof(msg), "sending EmbedComplete to prefill '%.80s': %s",
                     req->peer->worker_id, epd_status_string(st));
            epd__encoder_req_fail(srv, req, epd_encoder_peer_status(st), msg, 1, 0, 0);
            return epd_encoder_send_failure(srv, req);
        }
        req->complete_sent = 1;
        srv->served++;
        epd_trace_instant(srv->trace, "EmbedComplete sent", "msg", req->id,
                          (int32_t)req->media_index, epd_time_now_ns());
    }
    return 0;
}

static void epd_encoder_req_destroy(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    epd_encoder_req_t **pp = &srv->table[epd_encoder_hash_key(srv, req->id, req->media_index)];

    while (*pp != NULL && *pp != req) {
        pp = &(*pp)->hnext;
    }
    if (*pp == req) {
        *pp = req->hnext;
    }
    if (req->all_prev != NULL) {
        req->all_prev->all_next = req->all_next;
    } else {
        srv->all = req->all_next;
    }
    if (req->all_next != NULL) {
        req->all_next->all_prev = req->all_prev;
    }
    epd_encoder_list_remove(srv, req);
    /* a late or second reservation of it is answered at once */
    epd__encoder_tomb_add(srv, req->id, req->media_index, EPD_ENCODER_TOMB_ENDED);
    srv->free_slots[srv->n_free_slots++] = req->slot;
    srv->n_live--;
    if (req->rkey != NULL && !req->rkey_shared) {
        epd_xport_rkey_destroy(req->rkey);
    }
    epd__encoder_peer_unref(srv, req->peer);
    epd_encoder_req_free(req);
}

/* Frees an image when neither the compute thread nor the transport holds
 * anything of it and nothing is owed to anyone.  Pump only. */
static void epd_encoder_maybe_finish(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    if (!req->compute_done || req->write_inflight || req->tell_client || req->tell_p ||
        req->need_quiesced) {
        return;
    }
    if (!req->failed && !req->complete_sent) {
        return; /* waiting for the reservation or for room to post */
    }
    if (req->complete_sent && !req->failed && epd_log_enabled(EPD_LOG_DEBUG)) {
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
    epd_encoder_req_destroy(srv, req);
}

void epd__encoder_req_reserved(epd_encoder_srv_t *srv, epd_encoder_req_t *req)
{
    req->t_resv_ns = epd_time_now_ns();
    if (req->ready_ns != 0) {
        /* the embeddings waited for somewhere to go */
        epd_trace_span(srv->trace, "reservation wait", "wait", req->id, (int32_t)req->media_index,
                       req->ready_ns, req->t_resv_ns);
    }
    if (req->list != EPD_ENCODER_LIST_BLOCKED) {
        (void)epd_encoder_advance(srv, req);
    }
    epd__encoder_req_dirty(srv, req);
}

/* ------------------------------------------------------------ compute back */

/* The Error text of a compute failure: what was wrong with the image. */
static void epd_encoder_job_message(const epd_encoder_srv_t *srv, const epd_encoder_job_t *j,
                                    char *msg, size_t cap)
{
    const char *fmt =
        j->format != 0 ? epd_image_format_name((epd_image_format_t)j->format) : "PNG/JPEG";

    if (j->bad_hash) {
        snprintf(msg, cap, "content_hash is not the BLAKE2b-256 of the image (%zu bytes)",
                 j->image_len);
        return;
    }
    switch (j->status) {
    case EPD_ERR_MALFORMED:
        snprintf(msg, cap, "image does not decode: corrupt or truncated %s data (%zu bytes)", fmt,
                 j->image_len);
        break;
    case EPD_ERR_UNSUPPORTED:
        snprintf(msg, cap,
                 "image is not PNG or JPEG (or a JPEG kind the decoder lacks: lossless, "
                 "arithmetic coding, 12-bit)");
        break;
    case EPD_ERR_TOO_LONG:
        snprintf(msg, cap, "%s image of %u x %u pixels exceeds the limit of %llu pixels", fmt,
                 j->width, j->height, (unsigned long long)srv->max_pixels);
        break;
    case EPD_ERR_NO_MEMORY:
        snprintf(msg, cap, "out of memory decoding or encoding a %u x %u %s image", j->width,
                 j->height, fmt);
        break;
    default:
        snprintf(msg, cap, "encoding the image failed: %s", epd_status_string(j->status));
        break;
    }
}

void epd__encoder_on_job(void *arg, epd_encoder_job_t *job)
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
    if (req->failed) {
        /* aborted or failed meanwhile: the embeddings (if any) are discarded */
    } else if (job->status == EPD_OK) {
        req->ready_ns = epd_time_now_ns();
        if (req->have_resv && req->list != EPD_ENCODER_LIST_BLOCKED) {
            /* the lean path: post the write right here, at the top of the loop */
            (void)epd_encoder_advance(srv, req);
        }
    } else {
        epd_encoder_job_message(srv, job, msg, sizeof(msg));
        epd__encoder_req_fail(srv, req, job->status, msg, 1, 1, 1);
    }
    epd__encoder_req_dirty(srv, req);
}

/* -------------------------------------------------------------------- pump */

void epd__encoder_on_pump(uv_idle_t *idle)
{
    epd_encoder_srv_t *srv = idle->data;
    epd_encoder_req_t *req;

    if (srv->room) {
        srv->room = 0;
        epd_encoder_unblock_all(srv);
    }
    for (;;) {
        while ((req = srv->dirty_head) != NULL) {
            epd_encoder_list_remove(srv, req);
            if (epd_encoder_advance(srv, req) == 0) {
                epd_encoder_maybe_finish(srv, req);
            }
        }
        epd__encoder_peers_reap(srv);
        epd__encoder_outbox_flush(srv);
        if (srv->dirty_head == NULL) {
            break;
        }
    }
    if (srv->dirty_head == NULL && !srv->room) {
        srv->pump_on = 0;
        uv_idle_stop(&srv->pump);
    }
}

void epd__encoder_tick(epd_encoder_srv_t *srv, uint64_t now)
{
    uint64_t lease_ns = (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    char msg[200];

    for (epd_encoder_req_t *req = srv->all; req != NULL; req = req->all_next) {
        if (!req->failed && !req->complete_sent && req->deadline_ns != 0 &&
            now >= req->deadline_ns) {
            snprintf(msg, sizeof(msg), "the request's deadline of %llu ms passed (%s)",
                     (unsigned long long)((req->deadline_ns - req->t_recv_ns) / EPD_NSEC_PER_MSEC),
                     !req->compute_done ? "still encoding"
                     : !req->have_resv  ? "no reservation yet"
                                        : "writing");
            epd__encoder_req_fail(srv, req, EPD_ERR_TIMEOUT, msg, 1, 1, 1);
        } else if (!req->failed && req->ready_ns != 0 && !req->have_resv &&
                   now - req->ready_ns > lease_ns) {
            snprintf(msg, sizeof(msg),
                     "no EmbedReservation from prefill '%.80s' within %u ms of the embeddings "
                     "being ready",
                     req->peer->worker_id, srv->lease_ms);
            epd__encoder_req_fail(srv, req, EPD_ERR_TIMEOUT, msg, 1, 1, 1);
        } else if (req->failed && (req->need_quiesced || req->tell_client || req->tell_p)) {
            epd__encoder_req_dirty(srv, req); /* a safety net for what it waits on */
        }
    }
    epd__encoder_msg_tick(srv, now);
    epd__encoder_outbox_flush(srv);
    if (srv->blocked_head != NULL) {
        epd_encoder_unblock_all(srv);
    }
}

void epd__encoder_reqs_free_all(epd_encoder_srv_t *srv)
{
    while (srv->all != NULL) {
        epd_encoder_req_t *req = srv->all;

        srv->all = req->all_next;
        epd_encoder_req_free(req);
    }
    srv->dirty_head = srv->dirty_tail = NULL;
    srv->blocked_head = srv->blocked_tail = NULL;
    srv->n_live = 0;
}
