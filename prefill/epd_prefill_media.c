/*
 * epd_prefill_media.c — the embedding region of a prefill worker
 * (proto/README.md rules 13-20): a role part below the request layer.
 *
 * The region is one registered region of embed_slots slots, each one
 * image's embeddings ([image_embeddings][embed_dim] f32, as the engine's
 * encode_image writes them).  It is at once the landing zone of the
 * encoders' one-sided writes and the embedding cache: a slot whose
 * embeddings were verified keeps them, under the image's content hash
 * (BLAKE2b-256, computed by the client), until it is taken for another
 * image — the least recently used of the unpinned ones, when no slot is
 * free.  So a repeated image costs nothing: no encoder, no write.
 *
 * Safe recycle mirrors decode's KV blocks (DESIGN.md "The fence",
 * proto/README.md "Late writes: the fence"): each encoder incarnation
 * writes under a grant of its own (epd_peer_grant, in EmbedReservation),
 * and a write that reaches our check lands only in a WAITING slot taken
 * for that incarnation (epd_prefill_embed_check).  A slot an encoder may
 * still write is never handed out again before that encoder said it is
 * done (EmbedComplete or WritesQuiesced for the request), or it was
 * declared dead, every endpoint of that incarnation was closed and its
 * grant settled (epd_peer_fenced: revoked where the transport checks
 * every write, its process ended where it cannot).
 *
 * What happens to a request because of an image (it waits, it fails) is
 * the request layer's: this file answers with return values and keeps the
 * slots; a slot that comes free sets srv->embed_room and kicks the pump,
 * where the request layer places the requests waiting for slots.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_prefill_int.h"
#include "epd_time.h"

/* ------------------------------------------------------------------ region */

/* The region's write check (epd_xport_mr_set_check; may run inside the
 * transport's progress, reads the slot table only): a write lands only
 * inside one slot WAITING for an image of the writer's incarnation (the
 * grant's user pointer is its peer record). */
static int epd_prefill_embed_check(void *arg, void *grant_user, uint64_t off, uint64_t len)
{
    const epd_prefill_srv_t *srv = arg;
    const epd_prefill_eslot_t *s;
    uint64_t idx;

    if (len == 0 || srv->embed_slot_bytes == 0) {
        return 0;
    }
    idx = off / srv->embed_slot_bytes;
    if (idx >= srv->embed_slots || len > (idx + 1) * srv->embed_slot_bytes - off) {
        return 0;
    }
    s = &srv->eslots[idx];
    return s->state == EPD_PREFILL_ES_WAITING && s->enc != NULL && s->enc == grant_user;
}

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
    /* freed with the transport (it owns what it registered) */
    /* the encoders' landing zone: remote write only */
    st = epd_xport_mr_alloc_ex(epd_daemon_xport(srv->d),
                               (size_t)(srv->embed_slot_bytes * srv->embed_slots),
                               EPD_XPORT_MR_REMOTE_WRITE, &srv->embed_mr);
    if (st == EPD_OK) {
        /* the fence: writes that reach our check land only in a slot
         * waiting for their writer; each encoder gets a key of its own */
        epd_xport_mr_set_check(srv->embed_mr, epd_prefill_embed_check, srv);
    }
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot register the embedding region: %s",
                      epd_status_string(st));
        return st;
    }
    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        srv->eslots[i].idx = i;
        srv->eslots[i].state = EPD_PREFILL_ES_FREE;
    }
    epd_log_info(EPD_PREFILL_LOG, 0,
                 "embedding region: %u slots of %u x %u f32 (%llu bytes), the image cache",
                 srv->embed_slots, info->image_embeddings, info->embed_dim,
                 (unsigned long long)(srv->embed_slot_bytes * srv->embed_slots));
    return EPD_OK;
}

void epd__prefill_media_cleanup(epd_prefill_srv_t *srv)
{
    if (srv->eslots != NULL) {
        for (uint32_t i = 0; i < srv->embed_slots; i++) {
            epd_peer_unref(srv->eslots[i].enc);
        }
    }
    epd_free(srv->eslots);
    srv->eslots = NULL;
    srv->embed_mr = NULL; /* went with the transport */
}

static unsigned char *epd_prefill_slot_data(const epd_prefill_srv_t *srv,
                                            const epd_prefill_eslot_t *slot)
{
    return (unsigned char *)epd_xport_mr_addr(srv->embed_mr) +
           (uint64_t)slot->idx * srv->embed_slot_bytes;
}

void epd__prefill_media_spans(const epd_prefill_srv_t *srv, const epd_prefill_media_t *m,
                              uint32_t n, epd_embed_span_t *spans)
{
    for (uint32_t i = 0; i < n; i++) {
        spans[i].pos = m[i].pos;
        spans[i].n = m[i].n;
        spans[i].data = (const float *)(const void *)epd_prefill_slot_data(srv, m[i].slot);
    }
}

static void epd_prefill_slot_set_enc(epd_prefill_eslot_t *slot, epd_peer_t *enc)
{
    if (slot->enc == enc) {
        return;
    }
    epd_peer_unref(slot->enc);
    slot->enc = enc;
    if (enc != NULL) {
        epd_peer_ref(enc);
    }
}

/* A slot came free or evictable: requests waiting for slots get a look
 * from the pump (never placed from here: callers may be iterating). */
static void epd_prefill_embed_room(epd_prefill_srv_t *srv)
{
    srv->embed_room = 1;
    epd_daemon_kick(srv->d);
}

static void epd_prefill_slot_free(epd_prefill_srv_t *srv, epd_prefill_eslot_t *slot)
{
    epd_prefill_slot_set_enc(slot, NULL);
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

        if (s->state == EPD_PREFILL_ES_READY && memcmp(s->hash, hash, sizeof(s->hash)) == 0) {
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

/* The slot of m holds m's image now: READY, cached, pinned by its request. */
static void epd_prefill_slot_ready(epd_prefill_media_t *m)
{
    epd_prefill_slot_set_enc(m->slot, NULL);
    m->slot->state = EPD_PREFILL_ES_READY;
    memcpy(m->slot->hash, m->hash, sizeof(m->hash));
    m->slot->pins = 1;
    m->slot->req_id = 0;
    m->state = EPD_PREFILL_MEDIA_READY;
}

/* ------------------------------------------------------------- placement */

epd_status_t epd__prefill_media_copy(epd_prefill_srv_t *srv, epd_prefill_media_t *m, uint32_t i,
                                     const Epd__MediaRef *mr, char *msg, size_t cap)
{
    m->pos = mr->placeholder_pos;
    m->n = mr->n_embeddings;
    memcpy(m->hash, mr->content_hash.data, sizeof(m->hash));
    if (mr->encoder_worker_id != NULL && mr->encoder_worker_id[0] != '\0') {
        snprintf(m->enc_id, sizeof(m->enc_id), "%s", mr->encoder_worker_id);
        m->enc_epoch = epd_msg_epoch_of(mr->encoder_epoch);
        m->enc_addr = epd_malloc(mr->encoder_address.len);
        if (m->enc_addr == NULL) {
            snprintf(msg, cap, "out of memory for an encoder address");
            return EPD_ERR_NO_MEMORY;
        }
        memcpy(m->enc_addr, mr->encoder_address.data, mr->encoder_address.len);
        m->enc_addr_len = mr->encoder_address.len;
    } else if (mr->data.len > 0) {
        m->data = epd_malloc(mr->data.len);
        if (m->data == NULL) {
            snprintf(msg, cap, "out of memory for an image");
            return EPD_ERR_NO_MEMORY;
        }
        memcpy(m->data, mr->data.data, mr->data.len);
        m->data_len = mr->data.len;
    } else if (epd_prefill_cache_find(srv, m->hash) == NULL) {
        snprintf(msg, cap, "image %u is not cached here and the request names no encoder for it",
                 i);
        return EPD_ERR_NOT_FOUND;
    }
    return EPD_OK;
}

/* Do the free and evictable slots cover the uncached ones of m[0..n)? */
static int epd_prefill_slots_cover(epd_prefill_srv_t *srv, const epd_prefill_media_t *m, uint32_t n)
{
    uint32_t misses = 0, avail = 0;

    for (uint32_t i = 0; i < n; i++) {
        misses += epd_prefill_cache_find(srv, m[i].hash) == NULL;
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
        for (uint32_t i = 0; i < n && !mine; i++) {
            mine = memcmp(s->hash, m[i].hash, sizeof(s->hash)) == 0;
        }
        avail += !mine; /* one of ours is a hit, not a slot to evict */
    }
    return avail >= misses;
}

int epd__prefill_media_fits(epd_prefill_srv_t *srv, const epd_prefill_media_t *m, uint32_t n)
{
    return srv->wait_head == NULL && epd_prefill_slots_cover(srv, m, n);
}

void epd__prefill_media_wait(epd_prefill_srv_t *srv, epd_prefill_waiter_t *w)
{
    w->waiting = 1;
    w->since_ns = epd_time_now_ns();
    w->next = NULL;
    if (srv->wait_tail != NULL) {
        srv->wait_tail->next = w;
    } else {
        srv->wait_head = w;
    }
    srv->wait_tail = w;
    srv->embed_parked++;
    epd_trace_instant(srv->trace, "waiting for embedding slots", "wait", w->id, -1, w->since_ns);
    epd_log_debug(EPD_PREFILL_LOG, w->id, "%u images: every embedding slot is busy, waiting", w->n);
}

void epd__prefill_media_unwait(epd_prefill_srv_t *srv, epd_prefill_waiter_t *w)
{
    epd_prefill_waiter_t **pp = &srv->wait_head;
    epd_prefill_waiter_t *prev = NULL;

    if (!w->waiting) {
        return;
    }
    while (*pp != NULL && *pp != w) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp == w) {
        *pp = w->next;
        if (srv->wait_tail == w) {
            srv->wait_tail = prev;
        }
        if (prev == NULL && srv->wait_head != NULL) {
            epd_prefill_embed_room(srv); /* the next one may fit now */
        }
    }
    w->next = NULL;
    w->waiting = 0;
}

epd_prefill_waiter_t *epd__prefill_media_next_fit(epd_prefill_srv_t *srv)
{
    epd_prefill_waiter_t *w = srv->wait_head;

    if (w == NULL || !epd_prefill_slots_cover(srv, w->media, w->n)) {
        return NULL;
    }
    epd__prefill_media_unwait(srv, w);
    epd_trace_span(srv->trace, "wait for embedding slots", "wait", w->id, -1, w->since_ns,
                   epd_time_now_ns());
    return w;
}

epd_prefill_waiter_t *epd__prefill_media_overdue(epd_prefill_srv_t *srv, uint64_t now_ns)
{
    /* in arrival order: only the first ones can have waited that long */
    epd_prefill_waiter_t *w = srv->wait_head;

    return w != NULL && now_ns - w->since_ns > (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC ? w
                                                                                           : NULL;
}

const epd_prefill_media_t *epd__prefill_media_silent(const epd_prefill_srv_t *srv,
                                                     const epd_prefill_media_t *m, uint32_t n,
                                                     uint64_t now_ns)
{
    for (uint32_t i = 0; i < n; i++) {
        if (m[i].state == EPD_PREFILL_MEDIA_ENCODER &&
            now_ns - m[i].t_start_ns > (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC) {
            return &m[i];
        }
    }
    return NULL;
}

/* EmbedReservation{slot of m} to m's encoder, on our link to it. */
static epd_status_t epd_prefill_send_embed_reservation(epd_prefill_srv_t *srv,
                                                       const epd_prefill_media_t *m, uint64_t id,
                                                       uint32_t index)
{
    Epd__EmbedReservation er = EPD__EMBED_RESERVATION__INIT;
    const void *key;
    size_t key_len;
    epd_status_t st;

    /* the key of this encoder incarnation's own grant, revoked when it is
     * retired — never the region's own key */
    st = epd_peer_grant(m->enc, srv->embed_mr, &key, &key_len);
    if (st != EPD_OK) {
        return st;
    }
    er.request_id = id;
    er.media_index = index;
    er.rkey.data = (uint8_t *)(uintptr_t)key;
    er.rkey.len = key_len;
    er.region_size = srv->embed_slot_bytes * srv->embed_slots;
    er.offset = (uint64_t)m->slot->idx * srv->embed_slot_bytes;
    er.bytes = srv->embed_slot_bytes;
    er.lease_ms = srv->lease_ms;
    return epd_link_send(epd_peer_link(m->enc), EPD__ENVELOPE__BODY_EMBED_RESERVATION, &er, 0);
}

/* Places one uncached image `index`: a slot taken for it, then its encoder
 * (`enc`, counted reference taken) gets an EmbedReservation (ENCODER), or
 * our own encode is submitted (LOCAL, job and event lent to the compute
 * thread until ENCODED).  EPD_OK or the failure with msg. */
static epd_status_t epd_prefill_place_one(epd_prefill_srv_t *srv, epd_prefill_media_t *m,
                                          uint64_t id, uint32_t index, epd_peer_t *enc, void *owner,
                                          char *msg, size_t cap)
{
    epd_prefill_eslot_t *slot = epd_prefill_slot_take(srv);
    epd_status_t st;

    m->t_start_ns = epd_time_now_ns();
    if (slot == NULL) {
        epd_peer_unref(enc);
        snprintf(msg, cap, "every one of the %u embedding slots is in use", srv->embed_slots);
        return EPD_ERR_NO_CAPACITY;
    }
    slot->state = EPD_PREFILL_ES_WAITING;
    slot->pins = 0;
    slot->req_id = id;
    slot->media_index = index;
    m->slot = slot;
    if (enc != NULL) {
        /* from here on the encoder may write the slot: a failure
         * quarantines it (epd__prefill_media_give_back) */
        m->state = EPD_PREFILL_MEDIA_ENCODER;
        m->enc = enc;
        epd_prefill_slot_set_enc(slot, enc);
        srv->embed_misses++;
        st = epd_prefill_send_embed_reservation(srv, m, id, index);
        if (st != EPD_OK) {
            snprintf(msg, cap, "cannot send the embedding reservation to '%.60s': %s", m->enc_id,
                     epd_status_string(st));
            return EPD_ERR_PEER_DEAD;
        }
        epd_trace_instant(srv->trace, "EmbedReservation sent", "msg", id, (int32_t)index,
                          m->t_start_ns);
        return EPD_OK;
    }
    memset(&m->job, 0, sizeof(m->job));
    memset(&m->ev, 0, sizeof(m->ev));
    m->ev.kind = EPD_PREFILL_EV_ENCODED;
    m->ev.layer = index;
    m->ev.owner = owner;
    m->job.kind = EPD_PREFILL_JOB_ENCODE;
    m->job.seq.req_id = id;
    m->job.image = m->data;
    m->job.image_len = m->data_len;
    m->job.content_hash = m->hash;
    m->job.max_pixels = srv->max_image_pixels;
    m->job.embed_out = (float *)(void *)epd_prefill_slot_data(srv, slot);
    m->job.done_ev = &m->ev;
    m->job.trace = srv->trace;
    m->state = EPD_PREFILL_MEDIA_LOCAL;
    if (epd_prefill_compute_submit(srv->compute, &m->job) != EPD_OK) {
        epd__prefill_media_encoded(srv, m, EPD_ERR_NO_CAPACITY, msg, cap);
        snprintf(msg, cap, "compute queue full");
        return EPD_ERR_NO_CAPACITY;
    }
    srv->embed_local++;
    return EPD_OK;
}

epd_status_t epd__prefill_media_place(epd_prefill_srv_t *srv, epd_prefill_media_t *m, uint32_t n,
                                      uint64_t id, void *owner, const epd_status_t *failed,
                                      uint32_t *pending_p, uint32_t *encodes_p, char *msg,
                                      size_t cap, const char **culprit_p)
{
    epd_status_t st;

    *pending_p = 0;
    *encodes_p = 0;
    *culprit_p = NULL;
    /* hits first, pinned, so that a miss below cannot evict one of them */
    for (uint32_t i = 0; i < n; i++) {
        epd_prefill_eslot_t *slot = epd_prefill_cache_find(srv, m[i].hash);

        if (slot != NULL) {
            slot->pins++;
            m[i].slot = slot;
            m[i].hit = 1;
            m[i].state = EPD_PREFILL_MEDIA_READY;
            srv->embed_hits++;
            epd_trace_instant(srv->trace, "image cached", "wait", id, (int32_t)i,
                              epd_time_now_ns());
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        epd_peer_t *enc = NULL;

        if (m[i].state == EPD_PREFILL_MEDIA_READY) {
            continue;
        }
        if (m[i].enc_addr == NULL && m[i].data == NULL) {
            /* cached when it arrived, evicted while it waited for slots */
            snprintf(msg, cap,
                     "image %u is not cached here and the request names no encoder for it", i);
            return EPD_ERR_NOT_FOUND;
        }
        if (m[i].enc_addr != NULL) {
            /* one link per encoder incarnation; a newer epoch retires the
             * older one (its requests fail: maybe this one, see `failed`) */
            st = epd_peer_get(srv->d, EPD__ROLE__ROLE_ENCODER, m[i].enc_id, &m[i].enc_epoch,
                              m[i].enc_addr, m[i].enc_addr_len, &enc);
            if (st != EPD_OK) {
                snprintf(msg, cap, "encoder '%.60s': %s", m[i].enc_id,
                         st == EPD_ERR_STALE_EPOCH ? "a newer epoch of it is known"
                                                   : epd_status_string(st));
                *culprit_p = m[i].enc_id;
                return st == EPD_ERR_STALE_EPOCH ? st : EPD_ERR_PEER_DEAD;
            }
            if (*failed != EPD_OK) {
                epd_peer_unref(enc);
                return *failed;
            }
        }
        st = epd_prefill_place_one(srv, &m[i], id, i, enc, owner, msg, cap);
        if (st != EPD_OK) {
            /* a reservation that cannot reach its encoder names it */
            *culprit_p = st == EPD_ERR_PEER_DEAD ? m[i].enc_id : NULL;
            return st;
        }
        *encodes_p += m[i].state == EPD_PREFILL_MEDIA_LOCAL;
        ++*pending_p;
    }
    return EPD_OK;
}

/* ---------------------------------------------------------------- results */

void epd__prefill_media_encoded(epd_prefill_srv_t *srv, epd_prefill_media_t *m, epd_status_t status,
                                char *msg, size_t cap)
{
    epd_free(m->data);
    m->data = NULL;
    if (status != EPD_OK) {
        snprintf(msg, cap, "image %u: %s", m->ev.layer,
                 status == EPD_ERR_UNSUPPORTED ? "not a PNG or JPEG image"
                 : status == EPD_ERR_TOO_LONG  ? "image larger than the pixel limit"
                 : status == EPD_ERR_MALFORMED ? "the image does not decode"
                 : status == EPD_ERR_CORRUPT
                     ? "its content_hash is not the BLAKE2b-256 of its bytes: nothing cached"
                     : epd_status_string(status));
        /* the compute thread is done with the slot: nothing else writes it */
        epd_prefill_slot_free(srv, m->slot);
        m->slot = NULL;
        m->state = EPD_PREFILL_MEDIA_GONE;
        return;
    }
    epd_prefill_slot_ready(m);
}

epd_status_t epd__prefill_media_verify(epd_prefill_srv_t *srv, epd_prefill_media_t *m,
                                       const Epd__EmbedComplete *ec, char *msg, size_t cap)
{
    /* fenced behind the write: the bytes are final (rule 18) */
    uint64_t sum = epd_hash64(epd_prefill_slot_data(srv, m->slot), srv->embed_slot_bytes, 0);

    if (ec->n_embeddings != srv->info->image_embeddings || ec->embed_dim != srv->info->embed_dim ||
        sum != ec->checksum) {
        /* the write landed and nothing else follows: the slot is free */
        epd_prefill_slot_free(srv, m->slot);
        m->slot = NULL;
        m->state = EPD_PREFILL_MEDIA_GONE;
        snprintf(msg, cap, "image %u from encoder '%.60s': %s", ec->media_index, m->enc_id,
                 sum != ec->checksum ? "embeddings do not match their checksum"
                                     : "embeddings of the wrong shape");
        return sum != ec->checksum ? EPD_ERR_CORRUPT : EPD_ERR_INVALID_PARAM;
    }
    epd_prefill_slot_ready(m);
    return EPD_OK;
}

void epd__prefill_media_give_back(epd_prefill_srv_t *srv, epd_prefill_media_t *m, uint64_t id,
                                  const char *reason, int final)
{
    if (m->slot == NULL) {
        if (m->state == EPD_PREFILL_MEDIA_UNPLACED) {
            m->state = EPD_PREFILL_MEDIA_GONE; /* never placed */
        }
        return;
    }
    if (m->state == EPD_PREFILL_MEDIA_ENCODER) {
        /* its encoder may still write into the slot: quarantine it and ask
         * the encoder to stop (rule 19) */
        m->slot->state = EPD_PREFILL_ES_QUARANTINED;
        if (epd_peer_usable(m->enc)) {
            (void)epd_link_send_abort(epd_peer_link(m->enc), id, EPD_ERR_CANCELED, reason);
        }
        m->slot = NULL;
        m->state = EPD_PREFILL_MEDIA_GONE;
    } else if (m->state == EPD_PREFILL_MEDIA_READY && final) {
        if (m->slot->pins > 0 && --m->slot->pins == 0) {
            epd_prefill_embed_room(srv);
        }
        m->slot->used_ns = epd_time_now_ns();
        m->slot = NULL;
        m->state = EPD_PREFILL_MEDIA_GONE;
    }
    /* LOCAL: lent to the compute thread until its ENCODED event */
}

/* ------------------------------------------------------- encoders' words */

int epd__prefill_media_from(const epd_prefill_media_t *m, const Epd__Envelope *env)
{
    return m->enc != NULL && epd_peer_is_sender(m->enc, env);
}

uint32_t epd__prefill_media_quiesced(epd_prefill_srv_t *srv, uint64_t id, const Epd__Envelope *env)
{
    uint32_t freed = 0;

    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        epd_prefill_eslot_t *s = &srv->eslots[i];

        if (s->state == EPD_PREFILL_ES_QUARANTINED && s->req_id == id && s->enc != NULL &&
            epd_peer_is_sender(s->enc, env)) {
            epd_prefill_slot_free(srv, s);
            freed++;
        }
    }
    return freed;
}

int epd__prefill_media_late(epd_prefill_srv_t *srv, const Epd__EmbedComplete *ec,
                            const Epd__Envelope *env)
{
    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        epd_prefill_eslot_t *s = &srv->eslots[i];

        if (s->state == EPD_PREFILL_ES_QUARANTINED && s->req_id == ec->request_id &&
            s->media_index == ec->media_index && s->enc != NULL &&
            epd_peer_is_sender(s->enc, env)) {
            epd_log_debug(EPD_PREFILL_LOG, ec->request_id,
                          "late EmbedComplete: quarantined slot %u free", s->idx);
            epd_prefill_slot_free(srv, s);
            return 1;
        }
    }
    return 0;
}

void epd__prefill_media_encoder_gone(epd_prefill_srv_t *srv, epd_peer_t *peer)
{
    uint32_t freed = 0, held = 0;

    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        epd_prefill_eslot_t *s = &srv->eslots[i];

        if (s->state != EPD_PREFILL_ES_QUARANTINED || s->enc != peer) {
            continue;
        }
        if (epd_peer_fenced(peer)) {
            epd_prefill_slot_free(srv, s);
            freed++;
        } else {
            held++;
        }
    }
    if (freed > 0 || held > 0) {
        epd_log_info(EPD_PREFILL_LOG, 0,
                     "encoder '%s' is gone and its endpoints closed: %u quarantined slots free, "
                     "%u held until nothing it was granted can land (%s)",
                     epd_peer_id(peer), freed, held, epd_peer_fence_state(peer));
    }
}

void epd__prefill_media_tick(epd_prefill_srv_t *srv, uint64_t now_ns)
{
    uint64_t ask = (uint64_t)epd_daemon_flags(srv->d)->peer_timeout_ms * EPD_NSEC_PER_MSEC;

    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        epd_prefill_eslot_t *s = &srv->eslots[i];

        if (s->state != EPD_PREFILL_ES_QUARANTINED || s->enc == NULL ||
            epd_peer_state(s->enc) != EPD_PEER_DEAD) {
            continue;
        }
        /* a retired encoder's slot: its fence settles on its own (the last
         * receive under its grant landing, its process ending) — or that
         * incarnation confirms, asked on a new link once per its silence
         * limit (rule 28) */
        if (epd_peer_fenced(s->enc)) {
            epd_log_info(EPD_PREFILL_LOG, s->req_id,
                         "encoder '%s': nothing it was granted can land any more (%s): "
                         "quarantined slot %u free",
                         epd_peer_id(s->enc), epd_peer_fence_state(s->enc), s->idx);
            epd_prefill_slot_free(srv, s);
        } else if (now_ns - s->asked_ns > ask) {
            s->asked_ns = now_ns;
            (void)epd_peer_ask_quiesced(s->enc, s->req_id,
                                        "retired: confirm no write of this request can land");
        }
    }
}

uint32_t epd__prefill_media_quarantined(const epd_prefill_srv_t *srv)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < srv->embed_slots; i++) {
        n += srv->eslots[i].state == EPD_PREFILL_ES_QUARANTINED;
    }
    return n;
}
