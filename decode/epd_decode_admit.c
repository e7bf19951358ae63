/*
 * epd_decode_admit.c — a decode request's admission (proto/README.md rule
 * 3; KV on demand: rule 30): its memory, its blocks — prompt + max_tokens
 * up front, or the prompt plus a headroom for a request that grows — and
 * its place in the tables; and the refusal its prefill worker hears when
 * a GenerateRequest is refused here.  A role part below the request layer:
 * a request is made here in its first state (RESERVED) and stepped only by
 * the request layer.  Loop thread.
 */
#include <string.h>

#include "epd_alloc.h"
#include "epd_decode_int.h"
#include "epd_time.h"

int epd__decode_admit_live(const epd_decode_srv_t *srv, uint64_t id)
{
    return epd_reqtab_find_req(&srv->reqs, id, 0) != NULL;
}

/* Does a prompt hold image placeholders?  (Its embeddings are not ours to
 * prefill again, so such a request is reserved up front, never preempted.) */
static int epd_decode_has_images(const epd_decode_srv_t *srv, const Epd__GenerateRequest *g,
                                 uint32_t n)
{
    for (uint32_t i = 0; srv->info->image_token >= 0 && i < n; i++) {
        if ((int32_t)g->prompt_tokens[i] == srv->info->image_token) {
            return 1;
        }
    }
    return 0;
}

/* Admits a checked GenerateRequest bound to `peer` (the caller's reference
 * becomes the request's on success): blocks (rule 3; KV on demand: rule
 * 30), the request in the tables.  EPD_OK, or EPD_ERR_NO_CAPACITY /
 * EPD_ERR_EXISTS / EPD_ERR_NO_MEMORY / EPD_ERR_INVALID_PARAM with *why_p (nothing
 * kept). */
epd_status_t epd__decode_admit(epd_decode_srv_t *srv, const Epd__Envelope *env,
                               const epd_sample_params_t *sp, epd_link_t *client, epd_peer_t *peer,
                               uint64_t t_recv, epd_decode_request_t **req_p, const char **why_p)
{
    const Epd__GenerateRequest *g = env->generate;
    const epd_kv_layout_t *kv = &srv->info->kv;
    /* a migrated request (rule 37): its prompt ends with the k tokens it
     * generated before, and it goes on from there as after a resume */
    uint32_t k = g->resume_generated;
    uint32_t n_prompt = (uint32_t)g->n_prompt_tokens - k;
    uint32_t max_tokens = g->sampling->max_tokens;
    uint32_t max_blocks =
        (uint32_t)epd_decode_div_up((uint64_t)n_prompt + max_tokens, kv->block_tokens);
    /* (protocol-only requests end at their first token: nothing to grow) */
    int grows = srv->headroom > 0 && !g->protocol_only && !epd_decode_has_images(srv, g, n_prompt);
    uint32_t n_blocks = epd__decode_kv_admit_blocks(srv, n_prompt + k, n_prompt, max_tokens, grows);
    uint32_t n_stop = (uint32_t)g->sampling->n_stop_token_ids;
    /* the prompt is kept to resume it (grows) or for the repetition
     * penalty, which reads it at every step */
    int keep = grows || (sp->repetition_penalty != 0.0f && sp->repetition_penalty != 1.0f);
    epd_decode_request_t *req;
    epd_status_t st = EPD_ERR_NO_CAPACITY;
    size_t sz;

    /* (the generated tokens are plain tokens, an image token among them too) */
    if (k > 0 && epd_decode_has_images(srv, g, n_prompt)) {
        *why_p = "resume_generated with images";
        return EPD_ERR_INVALID_PARAM;
    }
    if (epd_reqtab_find(&srv->by_pid, g->request_id, 0) != NULL) {
        *why_p = "request id already live"; /* as a resume's prefill-side id */
        return EPD_ERR_EXISTS;
    }
    /* one allocation: the struct, the per-layer checks and sums (8-aligned
     * right after it), the tokens' logprobs (when asked), tokens, block ids, stop ids, the prompt
     * (to resume it), per-layer states */
    sz = sizeof(*req) + (size_t)kv->n_layers * (sizeof(epd_decode_vjob_t) + sizeof(uint64_t)) +
         (sp->logprobs > 0 ? (size_t)max_tokens * sizeof(epd_sample_logprob_t) : 0) +
         (size_t)max_tokens * sizeof(int32_t) + (size_t)max_blocks * sizeof(uint32_t) +
         (size_t)n_stop * sizeof(uint32_t) + (keep ? (size_t)n_prompt * sizeof(uint32_t) : 0) +
         kv->n_layers;
    req = epd_calloc(1, sz);
    if (req == NULL) {
        *why_p = "out of memory";
        return EPD_ERR_NO_MEMORY;
    }
    req->vjobs = (epd_decode_vjob_t *)(req + 1);
    req->kv.sums = (uint64_t *)(req->vjobs + kv->n_layers);
    /* (8-aligned after the sums): each token's logprobs when asked */
    req->seq.lps = sp->logprobs > 0 ? (epd_sample_logprob_t *)(req->kv.sums + kv->n_layers) : NULL;
    req->seq.tokens =
        (int32_t *)(req->kv.sums + kv->n_layers +
                    (sp->logprobs > 0
                         ? (size_t)max_tokens * sizeof(epd_sample_logprob_t) / sizeof(uint64_t)
                         : 0));
    req->blocks = (uint32_t *)(req->seq.tokens + max_tokens);
    req->stop_ids = req->blocks + max_blocks;
    req->prompt = grows ? req->stop_ids + n_stop : NULL;
    req->seq.prompt = keep ? req->stop_ids + n_stop : NULL;
    req->kv.state = (uint8_t *)(req->stop_ids + n_stop + (keep ? n_prompt : 0));
    req->kv.kind = -1;
    if (max_blocks <= srv->pool.n_blocks && epd__decode_kv_may_admit(srv, n_blocks)) {
        /* a cached head (decode-side reuse: up front only), then fresh blocks */
        st = epd__decode_cache_reserve(srv, req, g, n_blocks);
    }
    if (st != EPD_OK) {
        epd__decode_cache_drop(srv, req);
        epd_free(req);
        *why_p = st != EPD_ERR_NO_CAPACITY ? "reservation failed"
                 : max_blocks > srv->pool.n_blocks
                     ? "request needs more KV blocks than the whole pool"
                 : srv->n_hungry > 0 || srv->pre_head != NULL
                     ? "KV pool full: preempted requests wait to resume"
                     : "not enough free KV blocks or state slots";
        return st;
    }
    req->id = g->request_id;
    req->pid = g->request_id; /* its first prefill knows it by the client's id */
    req->state = EPD_DECODE_REQ_RESERVED;
    req->srv = srv;
    req->client = client;
    epd_link_ref(client);
    req->client_hash = epd_hash64(env->sender->worker_id, strlen(env->sender->worker_id), 0);
    req->peer = peer;
    req->n_prompt = n_prompt;
    req->max_tokens = max_tokens;
    req->grows = grows;
    if (keep) {
        memcpy(req->stop_ids + n_stop, g->prompt_tokens, (size_t)n_prompt * sizeof(uint32_t));
    }
    req->n_blocks = n_blocks;
    req->max_blocks = max_blocks;
    req->n_resume = k;
    req->n_sent = k; /* its earlier attempt streamed them */
    for (uint32_t i = 0; i < k; i++) {
        req->seq.tokens[i] = (int32_t)g->prompt_tokens[n_prompt + i];
    }
    req->n_prompt_blocks = (uint32_t)epd_decode_div_up((uint64_t)n_prompt + k, kv->block_tokens);
    req->n_stop = n_stop;
    req->protocol_only = g->protocol_only;
    if (n_stop > 0) {
        memcpy(req->stop_ids, g->sampling->stop_token_ids, n_stop * sizeof(uint32_t));
    }
    req->fail_status = EPD_OK;
    req->t_recv_ns = t_recv;
    req->lease_ns = epd_time_now_ns() + (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    req->lease_cap_ns = req->lease_ns + 3 * (uint64_t)srv->lease_ms * EPD_NSEC_PER_MSEC;
    /* a budget beyond a day is as good as none (and must not overflow) */
    req->deadline_ns = g->deadline_ms > 0 && g->deadline_ms <= 86400000ULL
                           ? t_recv + g->deadline_ms * EPD_NSEC_PER_MSEC
                           : 0;
    epd_decode_seq_init(&req->seq, k + 1, n_blocks);
    req->seq.req_id = req->id;
    req->seq.block_table = req->blocks;
    req->seq.slot = req->slot == EPD_DECODE_NO_SLOT ? 0 : req->slot;
    req->seq.n_prompt = req->n_prompt;
    req->seq.max_tokens = req->max_tokens;
    req->seq.sp = *sp;
    req->seq.stop_ids = req->stop_ids;
    req->seq.n_stop = n_stop;
    req->ent.id = req->id;
    req->ent.sub = 0;
    epd_reqtab_insert(&srv->reqs, &req->ent);
    req->pent.id = req->pid;
    req->pent.sub = 0;
    epd_reqtab_insert(&srv->by_pid, &req->pent);
    *req_p = req;
    return EPD_OK;
}

void epd__decode_admit_refused(epd_decode_srv_t *srv, const Epd__Envelope *env, epd_status_t status,
                             const char *why)
{
    const Epd__GenerateRequest *g = env->generate;
    epd_msg_epoch_t p_epoch;
    epd_peer_t *peer = NULL;

    if (!epd_decode_check_prefill_named(g)) {
        return;
    }
    p_epoch = epd_msg_epoch_of(g->prefill_epoch);
    if (epd_peer_get(srv->d, EPD__ROLE__ROLE_PREFILL, g->prefill_worker_id, &p_epoch,
                     g->prefill_address.data, g->prefill_address.len, &peer) == EPD_OK) {
        (void)epd_link_send_refused(epd_peer_link(peer), g->request_id, status, why);
        epd_peer_unref(peer);
    }
}
