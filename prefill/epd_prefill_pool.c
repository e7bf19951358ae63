/*
 * epd_prefill_pool.c — the local KV pool and what a request holds: a role
 * part below the request layer.
 *
 * The pool is one registered region ([layer][block][2][kv_head][tok][dim]
 * blocks and [layer][slot] recurrent states, epd_kv_pool_t) that the
 * compute thread computes into and the writes go out of without bouncing.
 * Its blocks and state slots are handed out from two stacks, lowest ids on
 * top, so that a request's blocks are mostly consecutive and neighbouring
 * writes coalesce.  Each admitted request holds ceil(prompt /
 * block_tokens) blocks and one slot from admission until its release job
 * came back (they are lent to the transport and the compute thread until
 * then).
 *
 * A request's memory is made here in one piece at admission (every array
 * the per-layer path needs: nothing is allocated per write) and freed here;
 * its state is the request layer's.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_kv_stamp.h"
#include "epd_log.h"
#include "epd_prefill_int.h"
#include "epd_time.h"

epd_status_t epd__prefill_pool_init(epd_prefill_srv_t *srv, epd_engine_t *engine)
{
    uint64_t bytes = epd_kv_pool_bytes(&srv->info->kv, srv->kv_blocks, srv->state_slots);
    epd_status_t st;

    if (bytes == 0) {
        epd_log_error(EPD_PREFILL_LOG, 0, "KV pool of %u blocks and %u slots is empty or overflows",
                      srv->kv_blocks, srv->state_slots);
        return EPD_ERR_CONFIG;
    }
    /* freed with the transport (it owns what it registered) */
    /* the writes' source: registered for local access only (no peer may
     * read or write it, whatever key it holds or guesses) */
    st = epd_xport_mr_alloc_ex(epd_daemon_xport(srv->d), (size_t)bytes, EPD_XPORT_MR_LOCAL,
                               &srv->pool_mr);
    if (st != EPD_OK) {
        epd_log_error(EPD_PREFILL_LOG, 0, "cannot allocate a %llu-byte KV pool: %s",
                      (unsigned long long)bytes, epd_status_string(st));
        return st;
    }
    srv->pool.base = epd_xport_mr_addr(srv->pool_mr);
    srv->pool.bytes = bytes;
    epd_daemon_kv_prefault(srv->kv_prefault, EPD_PREFILL_LOG, srv->pool.base, bytes);
    srv->pool.n_blocks = srv->kv_blocks;
    srv->pool.n_state_slots = srv->state_slots;
    st = epd_engine_check_pool(engine, &srv->pool);
    if (st != EPD_OK) {
        return st;
    }
    srv->free_blocks = epd_calloc(srv->kv_blocks, sizeof(*srv->free_blocks));
    srv->free_slots = epd_calloc(srv->state_slots, sizeof(*srv->free_slots));
    if (srv->free_blocks == NULL || srv->free_slots == NULL) {
        epd_log_error(EPD_PREFILL_LOG, 0, "out of memory");
        return EPD_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < srv->kv_blocks; i++) {
        srv->free_blocks[i] = srv->kv_blocks - 1 - i;
    }
    srv->n_free_blocks = srv->kv_blocks;
    for (uint32_t i = 0; i < srv->state_slots; i++) {
        srv->free_slots[i] = srv->state_slots - 1 - i;
    }
    srv->n_free_slots = srv->state_slots;
    return EPD_OK;
}

void epd__prefill_pool_cleanup(epd_prefill_srv_t *srv)
{
    epd_free(srv->free_blocks);
    epd_free(srv->free_slots);
    srv->free_blocks = srv->free_slots = NULL;
    srv->pool_mr = NULL; /* went with the transport */
}

/* Frees a request's memory and drops its references. */
static void epd_prefill_req_free(epd_prefill_req_t *req)
{
    for (uint32_t i = 0; i < req->n_media; i++) {
        epd_peer_unref(req->media[i].enc);
        epd_free(req->media[i].data);
        epd_free(req->media[i].enc_addr);
    }
    epd__prefill_xfer_cleanup(&req->xfer);
    epd_peer_unref(req->peer);
    epd_link_unref(req->client);
    epd_free(req->media);
    epd_free(req->spans);
    epd_free(req->evs);
    epd_free(req->local_blocks);
    epd_free(req->keys);
    epd_free(req->ckpts);
    epd_free(req->ckpt_slots);
    epd_free(req->tokens);
    epd_free(req);
}

epd_status_t epd__prefill_pool_admit(epd_prefill_srv_t *srv, const Epd__GenerateRequest *g,
                                     const epd_sample_params_t *sp, epd_peer_t *peer,
                                     epd_prefill_req_t **req_p)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    uint32_t n_tokens = (uint32_t)g->n_prompt_tokens;
    uint32_t n_media = (uint32_t)g->n_media;
    uint32_t n_blocks = epd_prefill_plan_blocks(kv, n_tokens);
    epd_prefill_req_t *req;
    epd_status_t st;

    /* blocks: the cache part knows how many a request needs (hits) */
    if (srv->n_free_slots == 0) {
        return EPD_ERR_NO_CAPACITY;
    }
    req = epd_calloc(1, sizeof(*req));
    if (req == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    req->tokens = epd_calloc(n_tokens, sizeof(*req->tokens));
    req->local_blocks = epd_calloc((size_t)n_blocks + 1, sizeof(*req->local_blocks));
    req->evs = epd_calloc((size_t)kv->n_layers + 2, sizeof(*req->evs));
    if (n_media > 0) {
        req->media = epd_calloc(n_media, sizeof(*req->media));
        req->spans = epd_calloc(n_media, sizeof(*req->spans));
    }
    if (req->tokens == NULL || req->local_blocks == NULL || req->evs == NULL ||
        (n_media > 0 && (req->media == NULL || req->spans == NULL)) ||
        epd__prefill_xfer_init(srv, &req->xfer, g->request_id, peer, req->local_blocks, n_blocks,
                               0) != EPD_OK) {
        epd_prefill_req_free(req);
        return EPD_ERR_NO_MEMORY;
    }
    req->n_media = n_media;
    req->id = g->request_id;
    req->srv = srv;
    req->fail_status = EPD_OK;
    req->t_admit_ns = epd_time_now_ns();
    req->n_tokens = n_tokens;
    for (uint32_t i = 0; i < n_tokens; i++) {
        req->tokens[i] = (int32_t)g->prompt_tokens[i];
    }
    req->n_blocks = n_blocks;
    req->first_token = -1;
    atomic_init(&req->cancel, 0);
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        req->evs[l] = (epd_prefill_ev_t){.kind = EPD_PREFILL_EV_LAYER, .layer = l, .owner = req};
    }
    req->evs[kv->n_layers] = (epd_prefill_ev_t){.kind = EPD_PREFILL_EV_DONE, .owner = req};
    req->evs[kv->n_layers + 1] = (epd_prefill_ev_t){.kind = EPD_PREFILL_EV_RELEASED, .owner = req};
    /* the blocks: the leading ones from the prefix cache, fresh ones for
     * the rest (the pool is the loop thread's while free) */
    st = epd__prefill_cache_place(srv, req, g);
    if (st != EPD_OK) {
        epd_prefill_req_free(req);
        return st;
    }
    /* blocks found, evicted (stored to the tier) and taken */
    epd_trace_span(srv->trace, "admission", "wait", req->id, -1, req->t_admit_ns,
                   epd_time_now_ns());
    req->slot = srv->free_slots[--srv->n_free_slots];
    req->xfer.local.state_slot = req->slot;
    req->run_job.kind = EPD_PREFILL_JOB_RUN;
    req->run_job.seq.req_id = req->id;
    req->run_job.seq.block_table = req->local_blocks;
    req->run_job.seq.n_blocks = n_blocks;
    req->run_job.seq.state_slot = req->slot;
    req->run_job.tokens = req->tokens;
    req->run_job.n_tokens = n_tokens;
    req->run_job.start = req->start;
    req->run_job.replay_end = req->replay_end;
    req->run_job.restore = req->restore_ckpt != EPD_KVCACHE_NONE
                               ? srv->ckpt_arena + (size_t)req->restore_ckpt * srv->ckpt_bytes
                               : NULL;
    req->run_job.ckpts = req->ckpts;
    req->run_job.n_ckpts = req->n_ckpts;
    req->run_job.n_decode = g->resume_generated;
    req->run_job.copy_from = req->copy_from;
    req->run_job.copy_wait = req->copy_wait;
    req->run_job.sample = *sp;
    req->run_job.cancel = &req->cancel;
    req->run_job.layer_evs = req->evs;
    req->run_job.done_ev = &req->evs[kv->n_layers];
    req->run_job.trace = srv->trace;
    /* with a decode worker, the engine computes each layer's checksum where
     * it can (prefill-only requests write nothing: no checksums); the KV is
     * stamped for that decode incarnation */
    req->run_job.layer_sums = peer != NULL ? req->xfer.checksums : NULL;
    req->run_job.layer_sum_kinds = peer != NULL ? req->xfer.sum_kinds : NULL;
    if (peer != NULL) {
        epd_msg_epoch_t de = epd_peer_epoch(peer);

        req->run_job.seq.stamp_tag = epd_kv_stamp_tag(de.start_time_ns, de.nonce);
    }
    req->xfer.protocol_only = g->protocol_only;
    req->xfer.from_cache = req->hit_blocks > 0;
    req->xfer.resumed = g->resume_generated > 0;
    if (peer != NULL && !g->protocol_only && req->hit_blocks > 0) {
        /* a prefix hit's blocks are final already: they cross to decode as
         * soon as its reservation is here, before the rest computes, as an
         * earlier chunk's would (hashed now rather than at the layer's end:
         * a hit's checksums are BYTES) */
        for (uint32_t l = 0; l < kv->n_layers; l++) {
            epd__prefill_xfer_chunk_ready(srv, &req->xfer, l,
                                          req->hit_blocks * kv->block_tokens);
        }
    }
    req->release_job.kind = EPD_PREFILL_JOB_RELEASE;
    req->release_job.seq = req->run_job.seq;
    req->release_job.done_ev = &req->evs[kv->n_layers + 1];
    req->peer = peer; /* the caller's reference becomes the request's */
    req->prefill_only = peer == NULL;
    *req_p = req;
    return EPD_OK;
}

void epd__prefill_pool_free(epd_prefill_srv_t *srv, epd_prefill_req_t *req)
{
    srv->free_slots[srv->n_free_slots++] = req->slot;
    epd__prefill_cache_release(srv, req);
    epd_prefill_req_free(req);
}
