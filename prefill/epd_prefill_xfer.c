/*
 * epd_prefill_xfer.c — one request's life on the prefill side, on the loop
 * thread.
 *
 *   admit ──▶ compute job queued at once (no wait for the reservation)
 *     │         │ LAYER l events (engine sink, compute thread)
 *     │         ▼
 *     │   post layer l's writes when the reservation is there; layers done
 *     │   before it arrived are posted when it arrives (one cursor:
 *     │   post_layer/post_idx walks layers in order, blocks in order, and the
 *     │   layer's streaming checksum follows the cursor)
 *     ▼
 *   DONE (first token sampled on the compute thread)
 *     └─▶ every layer posted ─▶ PrefillComplete, fenced behind the writes
 *   every write callback fired ─▶ release job (epd_engine_release on the
 *     compute thread) ─▶ RELEASED ─▶ local blocks and slot free, request freed
 *
 * Failure and abort share one path (epd__prefill_req_fail): the cancel flag
 * stops the engine at its next layer boundary, posting stops, pending
 * Errors go out, and once no write is in flight decode gets WritesQuiesced
 * (fenced) so it may recycle the reserved blocks.  The local blocks are
 * lent to the transport until the last write callback, and to the compute
 * thread until RELEASED: only then do they return to the free stacks.
 *
 * Backpressure: a write or send refused with EPD_ERR_NO_RESOURCE leaves the
 * request on the blocked list with its cursor where it was; the blocked
 * list is retried after the next write completion and on the periodic
 * tick.  Nothing is dropped and nothing waits.
 *
 * The per-write path computes offsets arithmetically (epd_prefill_plan) and
 * allocates nothing; every array a request needs is allocated at admission.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_prefill_int.h"
#include "epd_time.h"

enum { EPD_PREFILL_LIST_NONE = 0, EPD_PREFILL_LIST_DIRTY, EPD_PREFILL_LIST_BLOCKED };

/* ------------------------------------------------------------ bookkeeping */

static uint32_t epd_prefill_hash_id(const epd_prefill_srv_t *srv, uint64_t id)
{
    return (uint32_t)((id * 0x9E3779B97F4A7C15ull) >> 32) & (srv->table_size - 1);
}

epd_prefill_req_t *epd__prefill_req_find(epd_prefill_srv_t *srv, uint64_t id)
{
    epd_prefill_req_t *r;

    for (r = srv->table[epd_prefill_hash_id(srv, id)]; r != NULL; r = r->hnext) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

static void epd_prefill_list_remove(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    epd_prefill_req_t **head, **tail;

    if (req->list == EPD_PREFILL_LIST_NONE) {
        return;
    }
    head = req->list == EPD_PREFILL_LIST_DIRTY ? &srv->dirty_head : &srv->blocked_head;
    tail = req->list == EPD_PREFILL_LIST_DIRTY ? &srv->dirty_tail : &srv->blocked_tail;
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
    req->list = EPD_PREFILL_LIST_NONE;
}

static void epd_prefill_list_append(epd_prefill_srv_t *srv, epd_prefill_req_t *req, int which)
{
    epd_prefill_req_t **head =
        which == EPD_PREFILL_LIST_DIRTY ? &srv->dirty_head : &srv->blocked_head;
    epd_prefill_req_t **tail =
        which == EPD_PREFILL_LIST_DIRTY ? &srv->dirty_tail : &srv->blocked_tail;

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

static void epd_prefill_pump_start(epd_prefill_srv_t *srv)
{
    if (!srv->pump_on && !srv->stopping) {
        srv->pump_on = 1;
        uv_idle_start(&srv->pump, epd__prefill_on_pump);
    }
}

void epd__prefill_pump_kick(epd_prefill_srv_t *srv)
{
    epd_prefill_pump_start(srv);
}

void epd__prefill_req_dirty(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if (req->list == EPD_PREFILL_LIST_DIRTY) {
        return;
    }
    epd_prefill_list_remove(srv, req);
    epd_prefill_list_append(srv, req, EPD_PREFILL_LIST_DIRTY);
    epd_prefill_pump_start(srv);
}

static void epd_prefill_req_block(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if (!req->backpressured) {
        req->backpressured = 1;
        epd_log_debug(EPD_PREFILL_LOG, req->id,
                      "transport backpressure at layer %u write %u (%u in flight): retrying "
                      "after progress",
                      req->post_layer, req->post_idx, req->writes_inflight);
    }
    epd_prefill_list_remove(srv, req);
    epd_prefill_list_append(srv, req, EPD_PREFILL_LIST_BLOCKED);
}

/* Requests parked on backpressure go back to the dirty list. */
static void epd_prefill_unblock_all(epd_prefill_srv_t *srv)
{
    while (srv->blocked_head != NULL) {
        epd__prefill_req_dirty(srv, srv->blocked_head);
    }
}

static int epd_prefill_peer_usable(const epd_prefill_peer_t *peer)
{
    return peer != NULL && peer->state != EPD_PREFILL_PEER_DEAD && peer->ep != NULL;
}

/* A transport failure seen by one request: the decode worker is gone as far
 * as this request is concerned (the client is told so); a request-scope
 * refusal keeps its own code. */
static epd_status_t epd_prefill_peer_status(epd_status_t st)
{
    return epd_status_scope(st) >= EPD_SCOPE_CONNECTION ? EPD_ERR_PEER_DEAD : st;
}

/* -------------------------------------------------------------- admission */

static void epd_prefill_req_free(epd_prefill_req_t *req)
{
    for (uint32_t i = 0; i < req->n_media; i++) {
        epd_free(req->media[i].data);
        epd_free(req->media[i].enc_addr);
    }
    epd_free(req->media);
    epd_free(req->spans);
    epd_free(req->encode_jobs);
    epd_free(req->encode_evs);
    epd_free(req->lw);
    epd_free(req->checksums);
    epd_free(req->evs);
    epd_free(req->remote_blocks);
    epd_free(req->local_blocks);
    epd_free(req->tokens);
    epd_free(req);
}

epd_status_t epd__prefill_req_admit(epd_prefill_srv_t *srv, uint64_t id, const uint32_t *tokens,
                                    uint32_t n_tokens, const epd_sample_params_t *sample,
                                    uint32_t n_media, epd_xport_ep_t *client_ep,
                                    const char *client_id, epd_prefill_peer_t *peer,
                                    epd_prefill_req_t **req_p)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint32_t n_layers = kv->n_layers;
    uint32_t n_blocks = epd_prefill_plan_blocks(kv, n_tokens);
    epd_prefill_req_t *req;
    epd_status_t st;
    uint32_t h;

    if (srv->n_free_slots == 0 || srv->n_free_blocks < n_blocks) {
        return EPD_ERR_NO_CAPACITY;
    }
    req = epd_calloc(1, sizeof(*req));
    if (req == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    req->tokens = epd_calloc(n_tokens, sizeof(*req->tokens));
    req->local_blocks = epd_calloc(n_blocks + 1, sizeof(*req->local_blocks));
    req->remote_blocks = epd_calloc(n_blocks + 1, sizeof(*req->remote_blocks));
    req->evs = epd_calloc((size_t)n_layers + 2, sizeof(*req->evs));
    req->checksums = epd_calloc((size_t)n_layers + 1, sizeof(*req->checksums));
    req->lw = epd_calloc((size_t)n_layers + 1, sizeof(*req->lw));
    if (n_media > 0) {
        req->media = epd_calloc(n_media, sizeof(*req->media));
        req->spans = epd_calloc(n_media, sizeof(*req->spans));
        req->encode_jobs = epd_calloc(n_media, sizeof(*req->encode_jobs));
        req->encode_evs = epd_calloc(n_media, sizeof(*req->encode_evs));
        req->n_media = n_media;
    }
    if (req->tokens == NULL || req->local_blocks == NULL || req->remote_blocks == NULL ||
        req->evs == NULL || req->checksums == NULL || req->lw == NULL ||
        (n_media > 0 && (req->media == NULL || req->spans == NULL || req->encode_jobs == NULL ||
                         req->encode_evs == NULL))) {
        epd_prefill_req_free(req);
        return EPD_ERR_NO_MEMORY;
    }
    req->id = id;
    req->srv = srv;
    req->t_admit_ns = epd_time_now_ns();
    req->n_tokens = n_tokens;
    for (uint32_t i = 0; i < n_tokens; i++) {
        req->tokens[i] = (int32_t)tokens[i];
    }
    req->n_blocks = n_blocks;
    req->client_ep = client_ep;
    snprintf(req->client_id, sizeof(req->client_id), "%s", client_id);
    req->peer = peer;
    atomic_init(&req->cancel, 0);
    req->first_token = -1;
    for (uint32_t l = 0; l < n_layers; l++) {
        req->evs[l].kind = EPD_PREFILL_EV_LAYER;
        req->evs[l].layer = l;
        req->evs[l].owner = req;
        req->lw[l].req = req;
        req->lw[l].layer = l;
    }
    req->evs[n_layers].kind = EPD_PREFILL_EV_DONE;
    req->evs[n_layers].owner = req;
    req->evs[n_layers + 1].kind = EPD_PREFILL_EV_RELEASED;
    req->evs[n_layers + 1].owner = req;

    /* local placement: the pool is owned by this loop thread while free */
    req->slot = srv->free_slots[--srv->n_free_slots];
    for (uint32_t i = 0; i < n_blocks; i++) {
        req->local_blocks[i] = srv->free_blocks[--srv->n_free_blocks];
    }

    req->run_job.kind = EPD_PREFILL_JOB_RUN;
    req->run_job.seq.req_id = id;
    req->run_job.seq.block_table = req->local_blocks;
    req->run_job.seq.n_blocks = n_blocks;
    req->run_job.seq.state_slot = req->slot;
    req->run_job.tokens = req->tokens;
    req->run_job.n_tokens = n_tokens;
    req->run_job.sample = *sample;
    req->run_job.cancel = &req->cancel;
    req->run_job.layer_evs = req->evs;
    req->run_job.done_ev = &req->evs[n_layers];
    req->run_job.trace = srv->trace;
    /* with a decode worker, the compute thread checksums each layer as it
     * hands it over (prefill-only requests write nothing: no checksums) */
    req->run_job.layer_sums = peer != NULL ? req->checksums : NULL;
    if (n_media == 0) {
        st = epd_prefill_compute_submit(srv->compute, &req->run_job);
        if (st != EPD_OK) {
            srv->free_slots[srv->n_free_slots++] = req->slot;
            for (uint32_t i = n_blocks; i-- > 0;) {
                srv->free_blocks[srv->n_free_blocks++] = req->local_blocks[i];
            }
            epd_prefill_req_free(req);
            return EPD_ERR_NO_CAPACITY;
        }
        req->run_submitted = 1;
    }

    h = epd_prefill_hash_id(srv, id);
    req->hnext = srv->table[h];
    srv->table[h] = req;
    req->all_next = srv->all;
    if (srv->all != NULL) {
        srv->all->all_prev = req;
    }
    srv->all = req;
    srv->n_live++;
    if (peer != NULL) {
        peer->n_reqs++;
    }
    *req_p = req;
    return EPD_OK;
}

void epd__prefill_req_submit_run(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if (req->run_submitted || req->failed) {
        return;
    }
    for (uint32_t i = 0; i < req->n_media; i++) {
        const epd_prefill_media_t *m = &req->media[i];

        req->spans[i].pos = m->pos;
        req->spans[i].n = m->n;
        req->spans[i].data =
            (const float *)((const char *)epd_xport_mr_addr(srv->embed_mr) +
                            (uint64_t)m->slot->idx * srv->embed_slot_bytes);
    }
    req->run_job.embeds = req->n_media > 0 ? req->spans : NULL;
    req->run_job.n_embeds = req->n_media;
    if (epd_prefill_compute_submit(srv->compute, &req->run_job) != EPD_OK) {
        epd__prefill_req_fail(srv, req, EPD_ERR_NO_CAPACITY, "compute queue full", 1, 1, 1);
        return;
    }
    req->run_submitted = 1;
    epd_trace_instant(srv->trace, "images ready", "wait", req->id, -1, epd_time_now_ns());
}

/* ---------------------------------------------------------------- failure */

void epd__prefill_req_fail(epd_prefill_srv_t *srv, epd_prefill_req_t *req, epd_status_t status,
                           const char *msg, int tell_client, int tell_d, int quiesce)
{
    if (!req->failed) {
        req->failed = 1;
        req->fail_status = status;
        snprintf(req->fail_msg, sizeof(req->fail_msg), "%s", msg);
        atomic_store_explicit(&req->cancel, 1, memory_order_release);
        req->tell_client = tell_client;
        req->tell_d = tell_d;
        srv->failed_reqs++;
        epd__prefill_tomb_add(srv, req->id);
        if (status == EPD_ERR_CANCELED) {
            epd_log_debug(EPD_PREFILL_LOG, req->id, "aborted: %s", msg);
        } else {
            epd_log_warn(EPD_PREFILL_LOG, req->id, "failed: %s (%s)", msg, epd_status_name(status));
        }
    }
    if (quiesce) {
        req->need_quiesced = 1;
    }
    if (req->n_media > 0) {
        epd__prefill_media_release(srv, req, 0);
        epd__prefill_media_settle(srv, req);
    }
    epd__prefill_req_dirty(srv, req);
}

/* ----------------------------------------------------------------- writes */

/* Write completion (loop thread, possibly nested in a transport call): only
 * bookkeeping; the pump does the rest. */
/* The layer's last write completed after its last post: its trace span. */
static void epd_prefill_lw_done(epd_prefill_srv_t *srv, epd_prefill_lw_t *lw)
{
    if (lw->landed) {
        return;
    }
    lw->landed = 1;
    if (!lw->failed) {
        srv->kv_bytes_sent += lw->bytes;
    }
    if (srv->trace != NULL) {
        epd_trace_span(srv->trace, "KV write", "xfer", lw->req->id, (int32_t)lw->layer,
                       lw->posted_ns, epd_time_now_ns());
    }
}

static void epd_prefill_on_write(void *arg, epd_status_t status)
{
    epd_prefill_lw_t *lw = arg;
    epd_prefill_req_t *req = lw->req;
    epd_prefill_srv_t *srv = req->srv;

    req->writes_inflight--;
    lw->inflight--;
    if (status != EPD_OK) {
        lw->failed = 1;
    }
    if (lw->inflight == 0 && lw->all_posted) {
        epd_prefill_lw_done(srv, lw);
    }
    if (status != EPD_OK && !req->failed) {
        char msg[160];

        snprintf(msg, sizeof(msg), "a KV write to decode '%.80s' failed: %s", req->peer->worker_id,
                 epd_status_string(status));
        epd__prefill_req_fail(srv, req, epd_prefill_peer_status(status), msg, 1, 1, 1);
    }
    if (req->writes_inflight == 0) {
        epd__prefill_req_dirty(srv, req);
    }
    if (srv->blocked_head != NULL) {
        srv->room = 1;
        epd_prefill_pump_start(srv);
    }
}

/* Keep-alive for decode's lease while a long prefill runs: at most one
 * LayerDone per lease_ms/4 per request, after a layer's writes are posted
 * and, during a long layer, again for the last posted layer (from the
 * tick); optional, so a refusal (backpressure) is simply skipped. */
static void epd_prefill_maybe_layer_done(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                         uint32_t layer)
{
    uint64_t now = epd_time_now_ns();
    uint32_t lease_ms = req->d_lease_ms != 0 ? req->d_lease_ms : srv->lease_ms;
    Epd__LayerDone ld = EPD__LAYER_DONE__INIT;

    if (now - req->last_d_msg_ns < (uint64_t)lease_ms * EPD_NSEC_PER_MSEC / 4) {
        return;
    }
    ld.request_id = req->id;
    ld.layer = layer;
    ld.checksum = req->checksums[layer];
    if (epd__prefill_send(srv, req->peer->ep, EPD__ENVELOPE__BODY_LAYER_DONE, &ld, 0) == EPD_OK) {
        req->last_d_msg_ns = now;
        epd_trace_instant(srv->trace, "LayerDone sent", "msg", req->id, (int32_t)layer, now);
    }
}

/* Per-layer verification: a LayerDone for `layer` (landed = true) fenced
 * behind every write posted so far, i.e. behind the whole layer, so that
 * decode may hash that layer as soon as it arrives, while the next layers
 * still compute, instead of hashing the whole prompt after PrefillComplete
 * (that pass was most of the transfer tail on shared memory).  Optional:
 * refused for backpressure, the layer is simply verified at the end. */
static void epd_prefill_layer_landed(epd_prefill_srv_t *srv, epd_prefill_req_t *req,
                                     uint32_t layer)
{
    Epd__LayerDone ld = EPD__LAYER_DONE__INIT;
    uint64_t now = epd_time_now_ns();

    ld.request_id = req->id;
    ld.layer = layer;
    ld.checksum = req->checksums[layer];
    ld.landed = 1;
    if (epd__prefill_send(srv, req->peer->ep, EPD__ENVELOPE__BODY_LAYER_DONE, &ld,
                          EPD_XPORT_SEND_FENCE) == EPD_OK) {
        req->last_d_msg_ns = now;
        srv->layer_notices++;
        epd_trace_instant(srv->trace, "LayerDone sent", "msg", req->id, (int32_t)layer, now);
    } else {
        srv->layer_notices_skipped++;
    }
}

/* Bytes one layer writes for this request. */
static uint64_t epd_prefill_layer_bytes(const epd_kv_layout_t *kv, uint32_t layer,
                                        uint32_t n_blocks)
{
    return kv->kind[layer] == EPD_LAYER_ATTENTION ? (uint64_t)n_blocks * kv->block_bytes
                                                  : kv->state_bytes;
}

/* Write grouping: while compute runs, finished layers wait until at least
 * write_group_bytes of them are ready, so that a short prompt (whose layers
 * are a few KiB each) does not pay a wake-up, a batch of posts and their
 * completions per layer while the compute thread is still busy with the
 * next one.  A layer whose writes have started always continues; once
 * compute is done (or failed: nothing is posted then) everything goes. */
static int epd_prefill_group_ready(const epd_prefill_srv_t *srv, const epd_prefill_req_t *req)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint64_t pending = 0;

    if (srv->write_group_bytes == 0 || req->compute_done || req->post_idx > 0) {
        return 1;
    }
    for (uint32_t l = req->post_layer; l < req->layers_done; l++) {
        pending += epd_prefill_layer_bytes(kv, l, req->n_blocks);
        if (pending >= srv->write_group_bytes) {
            return 1;
        }
    }
    return 0;
}

/* Posts every write that is ready, in layer order then block order (the
 * order of the compute thread's checksum of each layer).  Neighbouring
 * blocks that are contiguous on both sides (consecutive ids in both block
 * tables: the usual case, both pools hand out their lowest free ids first)
 * go as one write: the bytes, their order and so the checksum are the same.
 * Returns 0, or -1 when backpressure parked the request on the blocked
 * list. */
static int epd_prefill_post_writes(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    const epd_prefill_place_t local = {
        .block_ids = req->local_blocks,
        .n_blocks = req->n_blocks,
        .state_slot = req->slot,
        .pool_blocks = srv->kv_blocks,
        .pool_state_slots = srv->state_slots,
    };
    char *base = srv->pool.base;

    if (!epd_prefill_group_ready(srv, req)) {
        return 0;
    }
    while (req->post_layer < req->layers_done) {
        uint32_t layer = req->post_layer;
        uint32_t n = epd_prefill_plan_layer_writes(kv, layer, req->n_blocks);

        epd_prefill_lw_t *lw = &req->lw[layer];

        while (req->post_idx < n) {
            epd_prefill_write_t w, next;
            uint32_t span = 1;
            epd_status_t st;

            st = epd_prefill_plan_write(kv, &local, &req->remote, req->region_size, layer,
                                        req->post_idx, &w);
            if (st != EPD_OK) {
                epd__prefill_req_fail(srv, req, st, "write plan outside a pool", 1, 1, 1);
                return 0;
            }
            while (req->post_idx + span < n &&
                   epd_prefill_plan_write(kv, &local, &req->remote, req->region_size, layer,
                                          req->post_idx + span, &next) == EPD_OK &&
                   next.local_off == w.local_off + w.len &&
                   next.remote_off == w.remote_off + w.len) {
                w.len += next.len;
                span++;
            }
            if (lw->inflight == 0 && req->post_idx == 0) {
                lw->posted_ns = epd_time_now_ns();
            }
            st = epd_xport_write(req->peer->ep, base + w.local_off, (size_t)w.len, srv->pool_mr,
                                 req->rkey, w.remote_off, epd_prefill_on_write, lw);
            if (st == EPD_ERR_NO_RESOURCE) {
                epd_prefill_req_block(srv, req);
                return -1;
            }
            if (st != EPD_INPROGRESS && st != EPD_OK) {
                char msg[160];

                snprintf(msg, sizeof(msg), "posting a KV write to decode '%.80s': %s",
                         req->peer->worker_id, epd_status_string(st));
                epd__prefill_req_fail(srv, req, epd_prefill_peer_status(st), msg, 1, 1, 1);
                return 0;
            }
            req->writes_inflight++;
            lw->inflight++;
            lw->bytes += w.len;
            req->writes_posted++;
            req->writes_coalesced += span - 1;
            req->post_idx += span;
        }
        /* req->checksums[layer] was written by the compute thread before it
         * handed the layer over (the event queue orders it before us) */
        req->post_layer++;
        req->post_idx = 0;
        lw->all_posted = 1;
        if (lw->inflight == 0 && n > 0) {
            epd_prefill_lw_done(srv, lw); /* completed while we were posting */
        }
        if (srv->layer_notify && n > 0) {
            epd_prefill_layer_landed(srv, req, layer);
        } else {
            epd_prefill_maybe_layer_done(srv, req, layer);
        }
    }
    return 0;
}

static void epd_prefill_send_complete(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    Epd__PrefillComplete pc = EPD__PREFILL_COMPLETE__INIT;
    epd_status_t st;

    pc.request_id = req->id;
    pc.first_token = (uint32_t)req->first_token;
    pc.n_prompt_tokens = req->n_tokens;
    pc.n_layer_checksums = srv->info->kv.n_layers;
    pc.layer_checksums = req->checksums;
    /* fenced: decode sees it only after every write of this request landed */
    st = epd__prefill_send(srv, req->peer->ep, EPD__ENVELOPE__BODY_PREFILL_COMPLETE, &pc,
                           EPD_XPORT_SEND_FENCE);
    if (st == EPD_OK) {
        req->complete_sent = 1;
        req->t_complete_ns = epd_time_now_ns();
        srv->served++;
        epd_trace_instant(srv->trace, "PrefillComplete sent", "msg", req->id, -1,
                          req->t_complete_ns);
    } else if (st == EPD_ERR_NO_RESOURCE) {
        epd_prefill_req_block(srv, req);
    } else {
        char msg[160];

        snprintf(msg, sizeof(msg), "sending PrefillComplete to decode '%.80s': %s",
                 req->peer->worker_id, epd_status_string(st));
        epd__prefill_req_fail(srv, req, epd_prefill_peer_status(st), msg, 1, 0, 0);
    }
}

/* Prefill-only: the first token to the client, and the request is done
 * (nothing was written anywhere). */
static void epd_prefill_send_first_token(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    Epd__TokenChunk tc = EPD__TOKEN_CHUNK__INIT;
    uint32_t tok = (uint32_t)req->first_token;
    epd_status_t st = EPD_OK;

    tc.request_id = req->id;
    tc.index = 0;
    tc.n_tokens = 1;
    tc.tokens = &tok;
    tc.finish = EPD__FINISH_REASON__FINISH_LENGTH;
    if (req->client_ep != NULL) {
        st = epd__prefill_send(srv, req->client_ep, EPD__ENVELOPE__BODY_TOKENS, &tc, 0);
    }
    if (st == EPD_ERR_NO_RESOURCE) {
        epd_prefill_req_block(srv, req);
        return;
    }
    if (st != EPD_OK) {
        if (epd__prefill_log_allowed(srv)) {
            epd_log_warn(EPD_PREFILL_LOG, req->id, "cannot answer the client: %s",
                         epd_status_string(st));
        }
    }
    /* a client that is gone loses its answer; the request is over either way */
    req->complete_sent = 1;
    req->t_complete_ns = epd_time_now_ns();
    srv->served++;
    epd_trace_instant(srv->trace, "first token sent", "msg", req->id, -1, req->t_complete_ns);
}

/* Sends what a failed request still owes; returns -1 when parked on
 * backpressure. */
static int epd_prefill_send_failure(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    epd_status_t st;

    if (req->tell_client) {
        if (req->client_ep == NULL) {
            req->tell_client = 0;
        } else {
            st = epd__prefill_send_error_by(srv, req->client_ep, req->id, req->fail_status,
                                            req->fail_msg, req->fail_culprit);
            if (st == EPD_ERR_NO_RESOURCE) {
                epd_prefill_req_block(srv, req);
                return -1;
            }
            req->tell_client = 0;
        }
    }
    if (!epd_prefill_peer_usable(req->peer)) {
        req->tell_d = 0;
        req->need_quiesced = 0;
        return 0;
    }
    if (req->tell_d) {
        st = epd__prefill_send_error(srv, req->peer->ep, req->id, req->fail_status, req->fail_msg);
        if (st == EPD_ERR_NO_RESOURCE) {
            epd_prefill_req_block(srv, req);
            return -1;
        }
        req->tell_d = 0;
    }
    if (req->need_quiesced && req->writes_inflight == 0) {
        Epd__WritesQuiesced q = EPD__WRITES_QUIESCED__INIT;

        q.request_id = req->id;
        st = epd__prefill_send(srv, req->peer->ep, EPD__ENVELOPE__BODY_QUIESCED, &q,
                               EPD_XPORT_SEND_FENCE);
        if (st == EPD_ERR_NO_RESOURCE) {
            epd_prefill_req_block(srv, req);
            return -1;
        }
        req->need_quiesced = 0;
        epd_log_debug(EPD_PREFILL_LOG, req->id, "writes quiesced (%llu posted)",
                      (unsigned long long)req->writes_posted);
    }
    return 0;
}

/* Moves a request forward as far as it can go without freeing it. */
static int epd_prefill_advance(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if (!req->failed && req->have_resv && !epd_prefill_peer_usable(req->peer)) {
        epd__prefill_req_fail(srv, req, EPD_ERR_PEER_DEAD, "decode worker is gone", 1, 0, 0);
    }
    if (!req->failed && req->have_resv) {
        if (epd_prefill_post_writes(srv, req) != 0) {
            return -1;
        }
    }
    if (!req->failed && req->prefill_only && req->compute_done && req->compute_status == EPD_OK &&
        !req->complete_sent) {
        epd_prefill_send_first_token(srv, req);
        if (req->list == EPD_PREFILL_LIST_BLOCKED) {
            return -1;
        }
    }
    if (!req->failed && req->compute_done && req->compute_status == EPD_OK && req->have_resv &&
        req->post_layer == srv->info->kv.n_layers && !req->complete_sent) {
        epd_prefill_send_complete(srv, req);
        if (req->list == EPD_PREFILL_LIST_BLOCKED) {
            return -1;
        }
    }
    if (req->failed) {
        return epd_prefill_send_failure(srv, req);
    }
    return 0;
}

static void epd_prefill_req_destroy(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    epd_prefill_req_t **pp = &srv->table[epd_prefill_hash_id(srv, req->id)];

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
    epd_prefill_list_remove(srv, req);
    if (req->n_media > 0) {
        epd__prefill_media_release(srv, req, 1);
    }
    srv->free_slots[srv->n_free_slots++] = req->slot;
    for (uint32_t i = req->n_blocks; i-- > 0;) {
        srv->free_blocks[srv->n_free_blocks++] = req->local_blocks[i];
    }
    srv->n_live--;
    if (req->rkey != NULL && !req->rkey_shared) {
        epd_xport_rkey_destroy(req->rkey);
    }
    epd__prefill_peer_unref(srv, req->peer);
    epd_prefill_req_free(req);
}

/* Release when the compute thread and the transport hold nothing of the
 * request and nothing is owed to anyone.  Pump only (may free). */
static void epd_prefill_maybe_finish(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    if (!req->compute_done || req->writes_inflight > 0) {
        return;
    }
    if (!req->failed && !req->complete_sent) {
        return; /* waiting for the reservation or for posting */
    }
    if (req->failed && (req->tell_client || req->tell_d || req->need_quiesced)) {
        return;
    }
    if (!req->release_queued) {
        req->release_job.kind = EPD_PREFILL_JOB_RELEASE;
        req->release_job.seq = req->run_job.seq;
        req->release_job.done_ev = &req->evs[srv->info->kv.n_layers + 1];
        if (epd_prefill_compute_submit(srv->compute, &req->release_job) != EPD_OK) {
            return; /* logged; retried on the next tick */
        }
        req->release_queued = 1;
        return;
    }
    if (req->released) {
        if (req->complete_sent && req->peer != NULL && epd_log_enabled(EPD_LOG_DEBUG)) {
            uint64_t now = epd_time_now_ns();
            uint64_t start = req->t_start_ns;

            /* queued: admission to the start of the run; compute: the run,
             * sampling included; completion after compute: what of the
             * transfer posting was not hidden behind compute; released
             * after compute: until the last write landed and the compute
             * thread released the request */
            epd_log_debug(
                EPD_PREFILL_LOG, req->id,
                "done: %u tokens, first token %d, %llu writes to '%.80s'; queued %.3f ms, "
                "compute %.3f ms, reservation %+.3f ms after admission, completion "
                "%.3f ms after compute, released %.3f ms after compute",
                req->n_tokens, req->first_token, (unsigned long long)req->writes_posted,
                req->peer->worker_id, (double)(start - req->t_admit_ns) / 1e6,
                (double)(req->compute_done_ns - start) / 1e6,
                ((double)req->t_resv_ns - (double)req->t_admit_ns) / 1e6,
                ((double)req->t_complete_ns - (double)req->compute_done_ns) / 1e6,
                (double)(now - req->compute_done_ns) / 1e6);
        }
        epd_prefill_req_destroy(srv, req);
    }
}

void epd__prefill_req_reserved(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    req->last_d_msg_ns = epd_time_now_ns();
    req->t_resv_ns = req->last_d_msg_ns;
    epd_trace_instant(srv->trace, "KvReservation received", "msg", req->id, -1, req->t_resv_ns);
    if (req->layers_done > 0) {
        /* finished layers waited for somewhere to write them */
        epd_trace_span(srv->trace, "reservation wait", "wait", req->id, -1, req->t_first_layer_ns,
                       req->t_resv_ns);
    }
    (void)epd_prefill_advance(srv, req);
    epd__prefill_req_dirty(srv, req);
}

/* ----------------------------------------------------------------- events */

void epd__prefill_on_event(void *arg, epd_prefill_ev_t *ev)
{
    epd_prefill_srv_t *srv = arg;
    epd_prefill_req_t *req = ev->owner;

    switch (ev->kind) {
    case EPD_PREFILL_EV_LAYER:
        req->layers_done = ev->layer + 1;
        if (ev->layer == 0) {
            req->t_first_layer_ns = epd_time_now_ns();
        }
        /* the lean path: post this layer's writes right here, at the top of
         * the loop, while the compute thread runs the next layer */
        if (!req->failed && req->have_resv && req->list != EPD_PREFILL_LIST_BLOCKED) {
            (void)epd_prefill_advance(srv, req);
        }
        break;
    case EPD_PREFILL_EV_DONE:
        req->compute_done = 1;
        req->compute_status = ev->status;
        req->first_token = ev->first_token;
        req->compute_done_ns = epd_time_now_ns();
        req->t_start_ns = ev->started_ns;
        if (srv->trace != NULL) {
            epd_trace_span(srv->trace, "queued", "wait", req->id, -1, req->t_admit_ns,
                           ev->started_ns);
            epd_trace_span(srv->trace, "prefill", "compute", req->id, -1, ev->started_ns,
                           ev->finished_ns);
            if (ev->layer_end_ns != 0 && ev->finished_ns > ev->layer_end_ns) {
                epd_trace_span(srv->trace, "sample first token", "compute", req->id, -1,
                               ev->layer_end_ns, ev->finished_ns);
            }
        }
        if (ev->status != EPD_OK && !req->failed) {
            char msg[160];

            snprintf(msg, sizeof(msg), "prefill failed on the compute thread: %s",
                     epd_status_string(ev->status));
            epd__prefill_req_fail(srv, req, ev->status, msg, 1, 1, 1);
        }
        if (req->n_media > 0) {
            /* the engine read the embeddings: they are cache entries now */
            epd__prefill_media_release(srv, req, 1);
        }
        epd__prefill_req_dirty(srv, req);
        break;
    case EPD_PREFILL_EV_ENCODED:
        epd__prefill_media_on_encoded(srv, req, ev->layer, ev->status);
        epd__prefill_req_dirty(srv, req);
        break;
    case EPD_PREFILL_EV_RELEASED:
        req->released = 1;
        epd__prefill_req_dirty(srv, req);
        break;
    }
}

/* -------------------------------------------------------------------- pump */

void epd__prefill_on_pump(uv_idle_t *idle)
{
    epd_prefill_srv_t *srv = idle->data;
    epd_prefill_req_t *req;

    if (srv->room) {
        srv->room = 0;
        epd_prefill_unblock_all(srv);
    }
    for (;;) {
        if (srv->embed_room) {
            srv->embed_room = 0;
            epd__prefill_media_unpark(srv);
        }
        while ((req = srv->dirty_head) != NULL) {
            epd_prefill_list_remove(srv, req);
            if (epd_prefill_advance(srv, req) == 0) {
                epd_prefill_maybe_finish(srv, req);
            }
        }
        epd__prefill_peers_reap(srv);
        if (srv->dirty_head == NULL && !srv->embed_room) {
            break;
        }
    }
    if (srv->dirty_head == NULL && !srv->room) {
        srv->pump_on = 0;
        uv_idle_stop(&srv->pump);
    }
}

void epd__prefill_tick(epd_prefill_srv_t *srv, uint64_t now)
{
    uint64_t lease_ns = (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;

    for (epd_prefill_req_t *req = srv->all; req != NULL; req = req->all_next) {
        if (!req->failed && !req->prefill_only && req->compute_done &&
            req->compute_status == EPD_OK && !req->have_resv &&
            now - req->compute_done_ns > lease_ns) {
            char msg[160];

            snprintf(msg, sizeof(msg), "no KV reservation from decode '%.80s' within %u ms",
                     req->peer->worker_id, srv->lease_ms);
            epd__prefill_req_fail(srv, req, EPD_ERR_TIMEOUT, msg, 1, 1, 1);
        } else if (!req->failed && req->have_resv && !req->complete_sent && req->post_layer > 0 &&
                   epd_prefill_peer_usable(req->peer)) {
            /* a long layer: repeat the last LayerDone (still true) so that
             * decode's lease does not run out while this one computes */
            epd_prefill_maybe_layer_done(srv, req, req->post_layer - 1);
        } else if (req->release_queued == 0 && req->compute_done && req->writes_inflight == 0 &&
                   (req->failed || req->complete_sent)) {
            epd__prefill_req_dirty(srv, req); /* a release submit to retry */
        }
    }
    epd__prefill_msg_tick(srv, now);
    epd__prefill_media_tick(srv, now);
    if (srv->blocked_head != NULL) {
        epd_prefill_unblock_all(srv);
    }
}

void epd__prefill_reqs_free_all(epd_prefill_srv_t *srv)
{
    while (srv->all != NULL) {
        epd_prefill_req_t *req = srv->all;

        srv->all = req->all_next;
        epd_prefill_req_free(req);
    }
    srv->dirty_head = srv->dirty_tail = NULL;
    srv->blocked_head = srv->blocked_tail = NULL;
}
