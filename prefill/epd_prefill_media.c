/*
 * epd_prefill_media.c — the images of multimodal requests on the prefill
 * side (proto/README.md rules 13-20), on the loop thread.
 *
 * The embedding region is one registered region of embed_slots slots, each
 * one image's embeddings ([image_embeddings][embed_dim] f32, as the
 * engine's encode_image writes them).  It is at once the landing zone of
 * the encoders' one-sided writes and the embedding cache: a slot whose
 * embeddings were verified keeps them, under the image's content hash
 * (BLAKE2b-256, computed by the client), until it is taken for another
 * image — the least recently used of the unpinned ones, when no slot is
 * free.  So a repeated image costs nothing: no encoder, no write.
 *
 * Per image of a request, in the order of MediaRef's doc (rule 15): a
 * cache hit pins the slot; else an encoder named by the client gets an
 * EmbedReservation for a slot taken now (it writes, then sends a fenced
 * EmbedComplete that we verify); else the image came inline and our own
 * compute thread encodes it into the slot (a cluster without encoders);
 * else the request fails with EPD_ERR_NOT_FOUND, which tells the client to
 * send it again with an encoder.  The request's run is queued when the last
 * image is READY.
 *
 * Safe recycle mirrors decode's KV blocks: a slot an encoder may still
 * write is never handed out again before that encoder said it is done
 * (EmbedComplete or WritesQuiesced for the request) or was declared dead
 * and both its endpoints were closed.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_prefill_int.h"
#include "epd_time.h"

#define EPD_PREFILL_MEDIA_LOG EPD_PREFILL_LOG

/* ------------------------------------------------------------------ region */

epd_status_t epd__prefill_media_init(epd_prefill_srv_t *srv)
{
    const epd_engine_info_t *info = srv->info;
    epd_status_t st;

    if (info->image_embeddings == 0 || srv->embed_slots == 0) {
        srv->embed_slots = 0;
        return EPD_OK;
    }
    srv->embed_slot_bytes = (uint64_t)info->image_embeddings * info->embed_dim * sizeof(float);
    srv->eslots = epd_calloc(srv->embed_slots, sizeof(*srv->eslots));
    if (srv->eslots == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    st = epd_xport_mr_alloc(srv->x, (size_t)(srv->embed_slot_bytes * srv->embed_slots),
                            &srv->embed_mr);
    if (st == EPD_OK) {
        st = epd_xport_mr_pack(srv->embed_mr, srv->embed_rkey, sizeof(srv->embed_rkey),
                               &srv->embed_rkey_len);
    }
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_MEDIA_LOG, 0, "cannot register the embedding region: %s",
                      epd_status_string(st));
        epd__prefill_media_cleanup(srv);
        return st;
    }
    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        srv->eslots[i].idx = i;
        srv->eslots[i].state = EPD_PREFILL_ES_FREE;
    }
    epd_log_info(EPD_PREFILL_MEDIA_LOG, 0,
                 "embedding region: %u slots of %u x %u f32 (%llu bytes), the image cache",
                 srv->embed_slots, info->image_embeddings, info->embed_dim,
                 (unsigned long long)(srv->embed_slot_bytes * srv->embed_slots));
    return EPD_OK;
}

void epd__prefill_media_cleanup(epd_prefill_srv_t *srv)
{
    /* the region itself goes with the transport (epd_xport_destroy), or
     * here when start-up fails half way */
    if (srv->embed_mr != NULL && srv->x != NULL) {
        epd_xport_mr_dereg(srv->embed_mr);
    }
    srv->embed_mr = NULL;
    epd_free(srv->eslots);
    srv->eslots = NULL;
    srv->embed_slots = 0;
}

static unsigned char *epd_prefill_slot_data(const epd_prefill_srv_t *srv,
                                            const epd_prefill_eslot_t *slot)
{
    return (unsigned char *)epd_xport_mr_addr(srv->embed_mr) +
           (uint64_t)slot->idx * srv->embed_slot_bytes;
}

static void epd_prefill_slot_set_enc(epd_prefill_srv_t *srv, epd_prefill_eslot_t *slot,
                                     epd_prefill_peer_t *enc)
{
    if (slot->enc == enc) {
        return;
    }
    if (slot->enc != NULL) {
        epd__prefill_peer_unref(srv, slot->enc);
    }
    slot->enc = enc;
    if (enc != NULL) {
        enc->n_reqs++;
    }
}

/* A slot came free or evictable: requests waiting for slots get a look
 * from the pump (never placed from here: callers may be iterating). */
static void epd_prefill_embed_room(epd_prefill_srv_t *srv)
{
    if (srv->park_head != NULL) {
        srv->embed_room = 1;
        epd__prefill_pump_kick(srv);
    }
}

static void epd_prefill_slot_free(epd_prefill_srv_t *srv, epd_prefill_eslot_t *slot)
{
    epd_prefill_slot_set_enc(srv, slot, NULL);
    slot->state = EPD_PREFILL_ES_FREE;
    slot->pins = 0;
    slot->req_id = 0;
    epd_prefill_embed_room(srv);
}

/* A READY slot holding `hash`, or NULL. */
static epd_prefill_eslot_t *epd_prefill_cache_find(epd_prefill_srv_t *srv,
                                                   const unsigned char *hash)
{
    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        epd_prefill_eslot_t *s = &srv->eslots[i];

        if (s->state == EPD_PREFILL_ES_READY && memcmp(s->hash, hash, 32) == 0) {
            return s;
        }
    }
    return NULL;
}

/* A slot to fill: a FREE one, else the least recently used READY one that
 * nobody pins (its cached image is forgotten).  NULL: every slot is busy. */
static epd_prefill_eslot_t *epd_prefill_slot_take(epd_prefill_srv_t *srv)
{
    epd_prefill_eslot_t *lru = NULL;

    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        epd_prefill_eslot_t *s = &srv->eslots[i];

        if (s->state == EPD_PREFILL_ES_FREE) {
            return s;
        }
        if (s->state == EPD_PREFILL_ES_READY && s->pins == 0 &&
            (lru == NULL || s->used_ns < lru->used_ns)) {
            lru = s;
        }
    }
    return lru;
}

/* ---------------------------------------------------------------- checks */

epd_status_t epd__prefill_media_check(const epd_prefill_srv_t *srv, const Epd__GenerateRequest *g,
                                      char *msg, size_t cap)
{
    const epd_engine_info_t *info = srv->info;
    uint32_t covered = 0;
    uint64_t prev_end = 0;

    if (info->image_embeddings == 0 || srv->embed_slots == 0) {
        snprintf(msg, cap, "this prefill worker's model has no vision encoder (images refused)");
        return EPD_ERR_UNSUPPORTED;
    }
    if (g->n_media > EPD_PREFILL_MEDIA_MAX) {
        snprintf(msg, cap, "%zu images in one request, at most %d", g->n_media,
                 EPD_PREFILL_MEDIA_MAX);
        return EPD_ERR_TOO_LONG;
    }
    if (g->n_media > srv->embed_slots) {
        snprintf(msg, cap, "%zu images, this worker holds %u at once", g->n_media,
                 srv->embed_slots);
        return EPD_ERR_NO_CAPACITY;
    }
    for (size_t i = 0; i < g->n_media; i++) {
        const Epd__MediaRef *m = g->media[i];
        int has_enc = m->encoder_worker_id != NULL && m->encoder_worker_id[0] != '\0';

        if (m->kind != NULL && m->kind[0] != '\0' && strcmp(m->kind, "image") != 0) {
            snprintf(msg, cap, "media %zu is a '%.40s', only images are supported", i, m->kind);
            return EPD_ERR_UNSUPPORTED;
        }
        if (m->content_hash.len != 32) {
            snprintf(msg, cap, "media %zu: content hash of %zu bytes, want 32 (BLAKE2b-256)", i,
                     m->content_hash.len);
            return EPD_ERR_INVALID_PARAM;
        }
        if (m->n_embeddings != info->image_embeddings) {
            snprintf(msg, cap, "media %zu: %u embeddings, this model makes %u per image", i,
                     m->n_embeddings, info->image_embeddings);
            return EPD_ERR_INVALID_PARAM;
        }
        if ((uint64_t)m->placeholder_pos < prev_end ||
            (uint64_t)m->placeholder_pos + m->n_embeddings > g->n_prompt_tokens) {
            snprintf(msg, cap, "media %zu: placeholders [%u, %llu) overlap or leave the prompt of "
                               "%zu tokens",
                     i, m->placeholder_pos,
                     (unsigned long long)m->placeholder_pos + m->n_embeddings,
                     g->n_prompt_tokens);
            return EPD_ERR_INVALID_PARAM;
        }
        for (uint32_t p = m->placeholder_pos; p < m->placeholder_pos + m->n_embeddings; p++) {
            if ((int32_t)g->prompt_tokens[p] != info->image_token) {
                snprintf(msg, cap, "media %zu: prompt position %u is not the image token %d", i, p,
                         info->image_token);
                return EPD_ERR_INVALID_PARAM;
            }
        }
        if (has_enc && (strlen(m->encoder_worker_id) >= EPD_PREFILL_ID_MAX ||
                        m->encoder_epoch == NULL || m->encoder_address.len == 0)) {
            snprintf(msg, cap, "media %zu names an encoder without a (valid) epoch and address",
                     i);
            return EPD_ERR_INVALID_PARAM;
        }
        prev_end = (uint64_t)m->placeholder_pos + m->n_embeddings;
        covered += m->n_embeddings;
    }
    /* and no image token anywhere else */
    {
        uint32_t n_tok = 0;

        for (size_t p = 0; p < g->n_prompt_tokens; p++) {
            n_tok += (int32_t)g->prompt_tokens[p] == info->image_token;
        }
        if (n_tok != covered) {
            snprintf(msg, cap, "the prompt holds %u image tokens, its images cover %u", n_tok,
                     covered);
            return EPD_ERR_INVALID_PARAM;
        }
    }
    return EPD_OK;
}

/* ---------------------------------------------------------------- sources */

static void epd_prefill_media_ready(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                    epd_prefill_media_t *m)
{
    m->state = EPD_PREFILL_MEDIA_READY;
    if (--req->media_pending == 0) {
        epd__prefill_req_submit_run(srv, req);
    }
}

static epd_status_t epd_prefill_send_embed_reservation(epd_prefill_srv_t *srv,
                                                       epd_prefill_req_t *req, uint32_t index)
{
    const epd_prefill_media_t *m = &req->media[index];
    Epd__EmbedReservation er = EPD__EMBED_RESERVATION__INIT;

    er.request_id = req->id;
    er.media_index = index;
    er.rkey.data = srv->embed_rkey;
    er.rkey.len = srv->embed_rkey_len;
    er.region_size = srv->embed_slot_bytes * srv->embed_slots;
    er.offset = (uint64_t)m->slot->idx * srv->embed_slot_bytes;
    er.bytes = srv->embed_slot_bytes;
    er.lease_ms = srv->lease_ms;
    return epd__prefill_send(srv, m->enc->ep, EPD__ENVELOPE__BODY_EMBED_RESERVATION, &er, 0);
}

/* Do the free and evictable slots cover req's uncached images?  Cached
 * ones are not pinned here: a waiting request holds nothing. */
static int epd_prefill_media_fits(epd_prefill_srv_t *srv, const epd_prefill_req_t *req)
{
    uint32_t misses = 0, avail = 0;

    for (uint32_t i = 0; i < req->n_media; i++) {
        misses += epd_prefill_cache_find(srv, req->media[i].hash) == NULL;
    }
    if (misses == 0) {
        return 1;
    }
    for (uint32_t j = 0; j < srv->embed_slots && avail < misses; j++) {
        const epd_prefill_eslot_t *s = &srv->eslots[j];
        int mine = 0;

        if (s->state == EPD_PREFILL_ES_FREE) {
            avail++;
            continue;
        }
        if (s->state != EPD_PREFILL_ES_READY || s->pins > 0) {
            continue;
        }
        for (uint32_t i = 0; i < req->n_media && !mine; i++) {
            mine = memcmp(s->hash, req->media[i].hash, 32) == 0;
        }
        avail += !mine; /* one of ours is a hit, not a slot to evict */
    }
    return avail >= misses;
}

static void epd_prefill_park_remove(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    epd_prefill_req_t **pp = &srv->park_head;
    epd_prefill_req_t *prev = NULL;

    if (!req->parked) {
        return;
    }
    while (*pp != NULL && *pp != req) {
        prev = *pp;
        pp = &(*pp)->park_next;
    }
    if (*pp == req) {
        *pp = req->park_next;
        if (srv->park_tail == req) {
            srv->park_tail = prev;
        }
    }
    req->park_next = NULL;
    req->parked = 0;
}

/* Places every image of req (fits() said the slots are there): hits
 * pinned, reservations sent, local encodes queued; the run is submitted
 * when nothing is pending.  May fail the request. */
static void epd_prefill_media_place(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    uint64_t now = epd_time_now_ns();
    uint32_t hits = 0;
    char msg[200];

    /* every image counts as pending until placed; the cached ones are
     * subtracted at the end, so the run cannot start half way through */
    req->media_pending = req->n_media;
    /* hits first: pinned, so that a miss below cannot evict one of them */
    for (uint32_t i = 0; i < req->n_media; i++) {
        epd_prefill_media_t *m = &req->media[i];
        epd_prefill_eslot_t *slot = epd_prefill_cache_find(srv, m->hash);

        m->t_start_ns = now;
        if (slot != NULL) {
            slot->pins++;
            m->slot = slot;
            m->hit = 1;
            m->state = EPD_PREFILL_MEDIA_READY;
            hits++;
            srv->embed_hits++;
            epd_trace_instant(srv->trace, "image cached", "wait", req->id, (int32_t)i, now);
        }
    }
    for (uint32_t i = 0; i < req->n_media; i++) {
        epd_prefill_media_t *m = &req->media[i];
        epd_prefill_eslot_t *slot;
        epd_status_t st;

        if (m->hit) {
            continue;
        }
        if (m->enc_addr == NULL && m->data == NULL) {
            /* cached when it arrived, evicted while it waited for slots */
            snprintf(msg, sizeof(msg),
                     "image %u is not cached here and the request names no encoder for it", i);
            epd__prefill_req_fail(srv, req, EPD_ERR_NOT_FOUND, msg, 1, 1, 1);
            return;
        }
        slot = epd_prefill_slot_take(srv);
        if (slot == NULL) {
            snprintf(msg, sizeof(msg), "every one of the %u embedding slots is in use",
                     srv->embed_slots);
            epd__prefill_req_fail(srv, req, EPD_ERR_NO_CAPACITY, msg, 1, 1, 1);
            return;
        }
        slot->state = EPD_PREFILL_ES_WAITING;
        slot->pins = 0;
        slot->req_id = req->id;
        slot->media_index = i;
        m->slot = slot;
        if (m->enc_addr != NULL) {
            epd_prefill_peer_t *enc = NULL;

            st = epd__prefill_peer_get(srv, EPD_PREFILL_ROLE_ENCODER, m->enc_id, &m->enc_epoch,
                                       m->enc_addr, m->enc_addr_len, &enc);
            if (st != EPD_OK) {
                slot->state = EPD_PREFILL_ES_FREE;
                m->slot = NULL;
                snprintf(msg, sizeof(msg), "encoder '%.60s': %s", m->enc_id,
                         st == EPD_ERR_STALE_EPOCH ? "a newer epoch of it is known"
                                                   : epd_status_string(st));
                epd__prefill_req_fail(srv, req, st == EPD_ERR_STALE_EPOCH ? st : EPD_ERR_PEER_DEAD,
                                      msg, 1, 1, 1);
                return;
            }
            m->state = EPD_PREFILL_MEDIA_ENCODER;
            m->enc = enc;
            enc->n_reqs++;
            epd_prefill_slot_set_enc(srv, slot, enc);
            srv->embed_misses++;
            st = epd_prefill_send_embed_reservation(srv, req, i);
            if (st != EPD_OK) {
                snprintf(msg, sizeof(msg), "cannot send the embedding reservation to '%.60s': %s",
                         enc->worker_id, epd_status_string(st));
                snprintf(req->fail_culprit, sizeof(req->fail_culprit), "%s", enc->worker_id);
                epd__prefill_req_fail(srv, req,
                                      st == EPD_ERR_NO_RESOURCE ? EPD_ERR_NO_RESOURCE
                                                                : EPD_ERR_PEER_DEAD,
                                      msg, 1, 1, 1);
                return;
            }
            epd_trace_instant(srv->trace, "EmbedReservation sent", "msg", req->id, (int32_t)i,
                              now);
        } else {
            epd_prefill_job_t *job = &req->encode_jobs[i];
            epd_prefill_ev_t *ev = &req->encode_evs[i];

            memset(job, 0, sizeof(*job));
            memset(ev, 0, sizeof(*ev));
            ev->kind = EPD_PREFILL_EV_ENCODED;
            ev->layer = i;
            ev->owner = req;
            job->kind = EPD_PREFILL_JOB_ENCODE;
            job->seq.req_id = req->id;
            job->image = m->data;
            job->image_len = m->data_len;
            job->max_pixels = srv->max_image_pixels;
            job->embed_out = (float *)epd_prefill_slot_data(srv, slot);
            job->done_ev = ev;
            job->trace = srv->trace;
            m->state = EPD_PREFILL_MEDIA_LOCAL;
            if (epd_prefill_compute_submit(srv->compute, job) != EPD_OK) {
                slot->state = EPD_PREFILL_ES_FREE;
                m->slot = NULL;
                m->state = EPD_PREFILL_MEDIA_GONE;
                epd__prefill_req_fail(srv, req, EPD_ERR_NO_CAPACITY, "compute queue full", 1, 1,
                                      1);
                return;
            }
            req->encodes_inflight++;
            srv->embed_local++;
        }
    }
    /* the run goes as soon as the last image is READY: now, when all of
     * them were cached */
    req->media_pending -= hits;
    if (req->media_pending == 0) {
        epd__prefill_req_submit_run(srv, req);
    }
}

void epd__prefill_media_start(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                              const Epd__GenerateRequest *g)
{
    char msg[200];

    /* copy every image's source: placing may come later */
    for (uint32_t i = 0; i < req->n_media; i++) {
        const Epd__MediaRef *mr = g->media[i];
        epd_prefill_media_t *m = &req->media[i];

        m->pos = mr->placeholder_pos;
        m->n = mr->n_embeddings;
        memcpy(m->hash, mr->content_hash.data, 32);
        if (mr->encoder_worker_id != NULL && mr->encoder_worker_id[0] != '\0') {
            snprintf(m->enc_id, sizeof(m->enc_id), "%s", mr->encoder_worker_id);
            m->enc_epoch = epd_msg_epoch_of(mr->encoder_epoch);
            m->enc_addr = epd_malloc(mr->encoder_address.len);
            if (m->enc_addr == NULL) {
                epd__prefill_req_fail(srv, req, EPD_ERR_NO_MEMORY,
                                      "out of memory for an encoder address", 1, 1, 1);
                return;
            }
            memcpy(m->enc_addr, mr->encoder_address.data, mr->encoder_address.len);
            m->enc_addr_len = mr->encoder_address.len;
        } else if (mr->data.len > 0) {
            m->data = epd_malloc(mr->data.len);
            if (m->data == NULL) {
                epd__prefill_req_fail(srv, req, EPD_ERR_NO_MEMORY, "out of memory for an image",
                                      1, 1, 1);
                return;
            }
            memcpy(m->data, mr->data.data, mr->data.len);
            m->data_len = mr->data.len;
        } else if (epd_prefill_cache_find(srv, m->hash) == NULL) {
            snprintf(msg, sizeof(msg),
                     "image %u is not cached here and the request names no encoder for it", i);
            epd__prefill_req_fail(srv, req, EPD_ERR_NOT_FOUND, msg, 1, 1, 1);
            return;
        }
    }
    if (srv->park_head == NULL && epd_prefill_media_fits(srv, req)) {
        epd_prefill_media_place(srv, req);
        return;
    }
    /* every slot is busy (or others wait already, first come first
     * served): wait, holding nothing, until requests before us finish */
    req->parked = 1;
    req->t_park_ns = epd_time_now_ns();
    req->park_next = NULL;
    if (srv->park_tail != NULL) {
        srv->park_tail->park_next = req;
    } else {
        srv->park_head = req;
    }
    srv->park_tail = req;
    srv->embed_parked++;
    epd_trace_instant(srv->trace, "waiting for embedding slots", "wait", req->id, -1,
                      req->t_park_ns);
    epd_log_debug(EPD_PREFILL_MEDIA_LOG, req->id, "%u images: every embedding slot is busy, waiting",
                  req->n_media);
}

void epd__prefill_media_unpark(epd_prefill_srv_t *srv)
{
    epd_prefill_req_t *req;

    while ((req = srv->park_head) != NULL && epd_prefill_media_fits(srv, req)) {
        epd_prefill_park_remove(srv, req);
        epd_trace_span(srv->trace, "wait for embedding slots", "wait", req->id, -1,
                       req->t_park_ns, epd_time_now_ns());
        epd_prefill_media_place(srv, req);
        epd__prefill_req_dirty(srv, req);
    }
}

/* --------------------------------------------------------------- releases */

void epd__prefill_media_release(epd_prefill_srv_t *srv, epd_prefill_req_t *req, int final)
{
    uint64_t now = epd_time_now_ns();

    epd_prefill_park_remove(srv, req); /* failed while it waited for slots */

    for (uint32_t i = 0; i < req->n_media; i++) {
        epd_prefill_media_t *m = &req->media[i];

        if (m->slot == NULL) {
            if (m->state == 0) {
                m->state = EPD_PREFILL_MEDIA_GONE; /* never placed */
            }
            continue;
        }
        if (m->state == EPD_PREFILL_MEDIA_ENCODER) {
            /* its encoder may still write into the slot: quarantine it and
             * ask the encoder to stop (rule 19) */
            Epd__Abort ab = EPD__ABORT__INIT;

            m->slot->state = EPD_PREFILL_ES_QUARANTINED;
            if (m->enc != NULL && m->enc->state != EPD_PREFILL_PEER_DEAD && m->enc->ep != NULL) {
                ab.request_id = req->id;
                ab.status = EPD_ERR_CANCELED;
                ab.reason = req->fail_msg;
                (void)epd__prefill_send(srv, m->enc->ep, EPD__ENVELOPE__BODY_ABORT, &ab, 0);
            }
            m->slot = NULL;
            m->state = EPD_PREFILL_MEDIA_GONE;
        } else if (m->state == EPD_PREFILL_MEDIA_READY && final) {
            if (m->slot->pins > 0 && --m->slot->pins == 0) {
                epd_prefill_embed_room(srv);
            }
            m->slot->used_ns = now;
            m->slot = NULL;
            m->state = EPD_PREFILL_MEDIA_GONE;
        }
        /* LOCAL: lent to the compute thread until its ENCODED event */
    }
    if (final) {
        for (uint32_t i = 0; i < req->n_media; i++) {
            if (req->media[i].enc != NULL && req->media[i].state == EPD_PREFILL_MEDIA_GONE) {
                epd__prefill_peer_unref(srv, req->media[i].enc);
                req->media[i].enc = NULL;
            }
        }
    }
}

void epd__prefill_media_settle(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if (req->failed && !req->run_submitted && req->encodes_inflight == 0 && !req->compute_done) {
        req->compute_done = 1;
        req->compute_status = EPD_ERR_CANCELED;
        req->compute_done_ns = epd_time_now_ns();
        epd__prefill_req_dirty(srv, req);
    }
}

/* ----------------------------------------------------------------- events */

void epd__prefill_media_on_encoded(epd_prefill_srv_t *srv, epd_prefill_req_t *req, uint32_t index,
                                   epd_status_t status)
{
    epd_prefill_media_t *m = index < req->n_media ? &req->media[index] : NULL;

    req->encodes_inflight--;
    if (m == NULL || m->slot == NULL) {
        epd__prefill_media_settle(srv, req);
        return;
    }
    epd_free(m->data);
    m->data = NULL;
    if (req->failed || status != EPD_OK) {
        /* the compute thread is done with the slot: nothing else writes it */
        epd_prefill_slot_free(srv, m->slot);
        m->slot = NULL;
        m->state = EPD_PREFILL_MEDIA_GONE;
        if (!req->failed) {
            char msg[200];

            snprintf(msg, sizeof(msg), "image %u: %s", index,
                     status == EPD_ERR_UNSUPPORTED ? "not a PNG or JPEG image"
                     : status == EPD_ERR_TOO_LONG  ? "image larger than the pixel limit"
                     : status == EPD_ERR_MALFORMED ? "the image does not decode"
                                                   : epd_status_string(status));
            epd__prefill_req_fail(srv, req, status, msg, 1, 1, 1);
        }
        epd__prefill_media_settle(srv, req);
        return;
    }
    m->slot->state = EPD_PREFILL_ES_READY;
    memcpy(m->slot->hash, m->hash, 32);
    m->slot->pins = 1;
    m->slot->req_id = 0;
    epd_prefill_media_ready(srv, req, m);
}

int epd__prefill_media_from_encoder(const epd_prefill_req_t *req, const Epd__Envelope *env)
{
    epd_prefill_epoch_t e = epd_msg_epoch_of(env->sender->epoch);

    for (uint32_t i = 0; i < req->n_media; i++) {
        const epd_prefill_peer_t *enc = req->media[i].enc;

        if (enc != NULL && strcmp(enc->worker_id, env->sender->worker_id) == 0 &&
            epd_msg_epoch_cmp(&enc->epoch, &e) == 0) {
            return 1;
        }
    }
    return 0;
}

static int epd_prefill_is_peer(const epd_prefill_peer_t *peer, const Epd__Envelope *env)
{
    epd_prefill_epoch_t e = epd_msg_epoch_of(env->sender->epoch);

    return peer != NULL && strcmp(peer->worker_id, env->sender->worker_id) == 0 &&
           epd_msg_epoch_cmp(&peer->epoch, &e) == 0;
}

/* A message from `ep` is from encoder `enc`: remember its endpoint (closed
 * with it when it dies). */
static void epd_prefill_note_in_ep(epd_prefill_peer_t *enc, epd_xport_ep_t *ep)
{
    if (enc != NULL && enc->in_ep == NULL && enc->state != EPD_PREFILL_PEER_DEAD) {
        enc->in_ep = ep;
    }
}

void epd__prefill_media_on_complete(epd_prefill_srv_t *srv, epd_xport_ep_t *ep,
                                    const Epd__Envelope *env)
{
    const Epd__EmbedComplete *ec = env->embed_complete;
    epd_prefill_req_t *req = epd__prefill_req_find(srv, ec->request_id);
    epd_prefill_media_t *m = NULL;
    char msg[200];

    if (req != NULL && ec->media_index < req->n_media) {
        m = &req->media[ec->media_index];
    }
    if (m != NULL && m->state == EPD_PREFILL_MEDIA_ENCODER && epd_prefill_is_peer(m->enc, env)) {
        uint64_t sum;

        epd_prefill_note_in_ep(m->enc, ep);
        epd_trace_span(srv->trace, "embeddings wait", "wait", req->id, (int32_t)ec->media_index,
                       m->t_start_ns, epd_time_now_ns());
        /* fenced behind the write: the bytes are final (rule 18) */
        sum = epd_hash64(epd_prefill_slot_data(srv, m->slot), srv->embed_slot_bytes, 0);
        if (ec->n_embeddings != srv->info->image_embeddings ||
            ec->embed_dim != srv->info->embed_dim || sum != ec->checksum) {
            /* the write landed and nothing else follows: the slot is free */
            epd_prefill_slot_free(srv, m->slot);
            m->slot = NULL;
            m->state = EPD_PREFILL_MEDIA_GONE;
            snprintf(msg, sizeof(msg), "image %u from encoder '%.60s': %s", ec->media_index,
                     env->sender->worker_id,
                     sum != ec->checksum ? "embeddings do not match their checksum"
                                         : "embeddings of the wrong shape");
            epd_log_error(EPD_PREFILL_MEDIA_LOG, req->id, "%s", msg);
            epd__prefill_req_fail(srv, req,
                                  sum != ec->checksum ? EPD_ERR_CORRUPT : EPD_ERR_INVALID_PARAM,
                                  msg, 1, 1, 1);
            return;
        }
        epd_prefill_slot_set_enc(srv, m->slot, NULL);
        m->slot->state = EPD_PREFILL_ES_READY;
        memcpy(m->slot->hash, m->hash, 32);
        m->slot->pins = 1;
        m->slot->req_id = 0;
        epd_prefill_media_ready(srv, req, m);
        return;
    }
    /* a late one for a slot we quarantined: the encoder is done with it */
    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        epd_prefill_eslot_t *s = &srv->eslots[i];

        if (s->state == EPD_PREFILL_ES_QUARANTINED && s->req_id == ec->request_id &&
            s->media_index == ec->media_index && epd_prefill_is_peer(s->enc, env)) {
            epd_log_debug(EPD_PREFILL_MEDIA_LOG, ec->request_id,
                          "late EmbedComplete: quarantined slot %u free", s->idx);
            epd_prefill_slot_free(srv, s);
            return;
        }
    }
    epd_log_debug(EPD_PREFILL_MEDIA_LOG, ec->request_id,
                  "EmbedComplete from '%s' for no image waiting here", env->sender->worker_id);
}

void epd__prefill_media_on_quiesced(epd_prefill_srv_t *srv, epd_xport_ep_t *ep,
                                    const Epd__Envelope *env)
{
    uint64_t id = env->quiesced->request_id;
    epd_prefill_req_t *req = epd__prefill_req_find(srv, id);
    uint32_t freed = 0;

    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        epd_prefill_eslot_t *s = &srv->eslots[i];

        if (s->state == EPD_PREFILL_ES_QUARANTINED && s->req_id == id &&
            epd_prefill_is_peer(s->enc, env)) {
            epd_prefill_slot_free(srv, s);
            freed++;
        }
    }
    if (req != NULL && !req->failed && epd__prefill_media_from_encoder(req, env)) {
        char msg[200];

        for (uint32_t i = 0; i < req->n_media; i++) {
            if (req->media[i].state == EPD_PREFILL_MEDIA_ENCODER &&
                epd_prefill_is_peer(req->media[i].enc, env)) {
                epd_prefill_note_in_ep(req->media[i].enc, ep);
            }
        }
        /* the encoder gave up on it (and tells the client why) */
        snprintf(msg, sizeof(msg), "encoder '%.60s' stopped the request", env->sender->worker_id);
        epd__prefill_req_fail(srv, req, EPD_ERR_CANCELED, msg, 1, 1, 1);
        /* nothing of it is in flight: the slots just quarantined are free */
        for (uint32_t i = 0; i < srv->embed_slots; i++) {
            epd_prefill_eslot_t *s = &srv->eslots[i];

            if (s->state == EPD_PREFILL_ES_QUARANTINED && s->req_id == id &&
                epd_prefill_is_peer(s->enc, env)) {
                epd_prefill_slot_free(srv, s);
                freed++;
            }
        }
    }
    if (freed > 0) {
        epd_log_debug(EPD_PREFILL_MEDIA_LOG, id, "encoder '%s' quiesced: %u slots free",
                      env->sender->worker_id, freed);
    }
}

void epd__prefill_media_encoder_gone(epd_prefill_srv_t *srv, epd_prefill_peer_t *peer)
{
    uint32_t freed = 0;

    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        epd_prefill_eslot_t *s = &srv->eslots[i];

        if (s->state == EPD_PREFILL_ES_QUARANTINED && s->enc == peer) {
            epd_prefill_slot_free(srv, s);
            freed++;
        }
    }
    if (freed > 0) {
        epd_log_info(EPD_PREFILL_MEDIA_LOG, 0,
                     "encoder '%s' is gone and its endpoints closed: %u quarantined slots free",
                     peer->worker_id, freed);
    }
}

void epd__prefill_media_tick(epd_prefill_srv_t *srv, uint64_t now)
{
    uint64_t lease_ns = (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;

    /* in arrival order: only the first ones can have waited that long */
    while (srv->park_head != NULL && now - srv->park_head->t_park_ns > lease_ns) {
        epd_prefill_req_t *req = srv->park_head;
        char msg[200];

        snprintf(msg, sizeof(msg),
                 "no embedding slot came free within %u ms (all %u busy with other requests)",
                 srv->lease_ms, srv->embed_slots);
        epd__prefill_req_fail(srv, req, EPD_ERR_NO_CAPACITY, msg, 1, 1, 1); /* unparks it */
    }

    for (epd_prefill_req_t *req = srv->all; req != NULL; req = req->all_next) {
        if (req->failed) {
            continue;
        }
        for (uint32_t i = 0; i < req->n_media; i++) {
            const epd_prefill_media_t *m = &req->media[i];

            if (m->state == EPD_PREFILL_MEDIA_ENCODER && now - m->t_start_ns > lease_ns) {
                char msg[200];

                snprintf(msg, sizeof(msg), "no embeddings from encoder '%.60s' within %u ms",
                         m->enc->worker_id, srv->lease_ms);
                snprintf(req->fail_culprit, sizeof(req->fail_culprit), "%s", m->enc->worker_id);
                epd__prefill_req_fail(srv, req, EPD_ERR_TIMEOUT, msg, 1, 1, 1);
                break;
            }
        }
    }
}
