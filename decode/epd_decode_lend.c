/*
 * epd_decode_lend.c — lending a request's KV checks to the verifier thread
 * (proto/README.md rules 4 and 6): a whole layer's, and a chunked
 * prefill's blocks of a layer as they land.  A role part below the request
 * layer: it fills and lends the layer's one job and keeps the range
 * bookkeeping; a check that failed is reported back, and the request layer
 * fails the request.
 *
 * Chunk by chunk: a landed LayerDone with `blocks` = k says the layer's
 * blocks [0, k) landed and carries their checksum, of the request's kind:
 * BYTES, or STAMPED where the engine stamps its KV (then each block's
 * stamps are checked and only they are hashed).  The layer's running hash
 * state holds blocks [0, done) already, so a check hashes only [done, k) —
 * every byte (or stamp) once, as chunks land — and the layer's own check at
 * its end only the last chunk's blocks.  A layer has one job: a
 * range that lands while the layer's job is out waits (only the newest: its
 * checksum covers the older ones' blocks), and the layer's own check waits
 * for the range check out; so a request still lends at most one job per
 * layer (the verifier's sizing, epd_decode_verify.h).  Loop thread; the
 * running state is the verifier's while its job is out.
 */
#include "epd_decode_int.h"

#include "epd_alloc.h"

/* Lends layer `layer`'s one job, filled; EPD_ERR_NO_RESOURCE: the sizing
 * invariant is broken (nothing lent). */
static epd_status_t epd_decode_lend(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                    epd_decode_vjob_t *j)
{
    if (epd_decode_verify_submit(srv->verify, j) != EPD_OK) {
        return EPD_ERR_NO_RESOURCE;
    }
    req->v_lent++;
    return EPD_OK;
}

epd_status_t epd__decode_lend_layer(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                    uint32_t layer)
{
    epd_decode_vjob_t *j = &req->vjobs[layer];
    epd_decode_range_t *r = req->rng != NULL ? &req->rng[layer] : NULL;
    /* P knows the request by its prefill-side id and wrote prompt + the
     * tokens of a resume */
    epd_kv_stamp_expect_t x = {.req_id = req->pid,
                               .tag = srv->stamp_tag,
                               .n_tokens = req->n_prompt + req->n_resume,
                               .full = srv->verify_full};

    if (r != NULL && r->busy) {
        r->final_wait = 1; /* lent when the range check is back */
        return EPD_OK;
    }
    epd_decode_vjob_init(j, req, layer, req->kv.sums[layer], (epd_kv_sum_kind_t)req->kv.kind,
                         req->blocks, req->n_prompt_blocks, req->seq.slot, &x);
    if (r != NULL && r->done > 0 &&
        (req->kv.kind == EPD_KV_SUM_BYTES || req->kv.kind == EPD_KV_SUM_STAMPED) &&
        srv->info->kv.kind[layer] == EPD_LAYER_ATTENTION) {
        /* blocks [0, done) were checked as they landed: the rest only */
        j->hs = r->h;
        j->from = r->done;
    }
    return epd_decode_lend(srv, req, j);
}

/* Lends the range check of blocks [r->done, r->pend) of `layer`. */
static epd_status_t epd_decode_lend_range(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                          uint32_t layer)
{
    epd_decode_range_t *r = &req->rng[layer];
    epd_decode_vjob_t *j = &req->vjobs[layer];
    epd_kv_stamp_expect_t x = {.req_id = req->pid,
                               .tag = srv->stamp_tag,
                               .n_tokens = req->n_prompt + req->n_resume,
                               .full = srv->verify_full};

    if (r->h == NULL && epd_hash_state_create(0, &r->h) != EPD_OK) {
        return EPD_ERR_NO_MEMORY;
    }
    epd_decode_vjob_init(j, req, layer, r->pend_sum, (epd_kv_sum_kind_t)req->kv.kind, req->blocks,
                         r->pend, req->seq.slot, &x);
    j->hs = r->h;
    j->from = r->done;
    j->range = 1;
    r->pend = 0;
    if (epd_decode_lend(srv, req, j) != EPD_OK) {
        return EPD_ERR_NO_RESOURCE;
    }
    r->busy = 1;
    return EPD_OK;
}

epd_status_t epd__decode_lend_range_landed(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                           const Epd__LayerDone *ld, const char **why_p)
{
    uint32_t n_layers = srv->info->kv.n_layers;
    epd_decode_range_t *r;

    int kind = (int)ld->checksum_kind;

    if (kind != EPD_KV_SUM_BYTES && kind != EPD_KV_SUM_STAMPED) {
        *why_p = "LayerDone: an unknown checksum kind";
        return EPD_ERR_INVALID_PARAM;
    }
    if (req->kv.kind >= 0 && req->kv.kind != kind) {
        *why_p = "LayerDone: a checksum kind other than the request's";
        return EPD_ERR_INVALID_PARAM;
    }
    if (ld->blocks > req->n_prompt_blocks) {
        *why_p = "LayerDone: blocks past the prompt's";
        return EPD_ERR_INVALID_PARAM;
    }
    req->kv.kind = kind; /* the request's: every later LayerDone and PrefillComplete's */
    if (req->kv.state[ld->layer] != EPD_DECODE_KV_WAIT || req->protocol_only) {
        return EPD_OK; /* the whole layer is checked already, or nothing was written */
    }
    if (req->rng == NULL) {
        req->rng = epd_calloc(n_layers, sizeof(*req->rng));
        if (req->rng == NULL) {
            *why_p = "out of memory";
            return EPD_ERR_NO_MEMORY;
        }
    }
    r = &req->rng[ld->layer];
    if (ld->blocks <= r->done || ld->blocks <= r->pend) {
        return EPD_OK; /* blocks checked already, or a newer range waits */
    }
    r->pend = ld->blocks;
    r->pend_sum = ld->checksum;
    if (r->busy) {
        return EPD_OK; /* after the range check out */
    }
    if (epd_decode_lend_range(srv, req, ld->layer) != EPD_OK) {
        *why_p = "verifier queue full or out of memory";
        return EPD_ERR_NO_RESOURCE;
    }
    return EPD_OK;
}

epd_status_t epd__decode_lend_range_back(epd_decode_srv_t *srv, epd_decode_request_t *req,
                                         const epd_decode_vjob_t *job, const char **why_p)
{
    epd_decode_range_t *r = &req->rng[job->layer];

    r->busy = 0;
    if (job->status != EPD_OK) {
        *why_p = job->why != NULL ? job->why : "KV verification failed";
        return job->status;
    }
    r->done = job->n_ids;
    req->kv.bytes += job->bytes; /* the layer's own check adds the rest */
    srv->kv_range_checks++;
    srv->kv_range_bytes += job->bytes;
    if (req->fail_status != EPD_OK || req->state != EPD_DECODE_REQ_RESERVED) {
        return EPD_OK;
    }
    if (r->final_wait) {
        r->final_wait = 0;
        if (epd__decode_lend_layer(srv, req, job->layer) != EPD_OK) {
            *why_p = "verifier queue full";
            return EPD_ERR_NO_RESOURCE;
        }
    } else if (r->pend > r->done && epd_decode_lend_range(srv, req, job->layer) != EPD_OK) {
        *why_p = "verifier queue full or out of memory";
        return EPD_ERR_NO_RESOURCE;
    }
    return EPD_OK;
}

void epd__decode_lend_reset(epd_decode_srv_t *srv, epd_decode_request_t *req)
{
    if (req->rng == NULL) {
        return;
    }
    for (uint32_t l = 0; l < srv->info->kv.n_layers; l++) {
        epd_hash_state_destroy(req->rng[l].h);
    }
    epd_free(req->rng);
    req->rng = NULL;
}
