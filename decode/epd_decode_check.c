/* epd_decode_check.c — request validation and KV verification (see the
 * header). */
#include "epd_decode_check.h"

#include <math.h>
#include <string.h>

#include "epd_daemon.h"

static epd_status_t epd__refuse(const char **why_p, const char *why, epd_status_t status)
{
    if (why_p != NULL) {
        *why_p = why;
    }
    return status;
}

epd_status_t epd_decode_check_generate(const epd_decode_limits_t *lim,
                                       const Epd__GenerateRequest *g, epd_sample_params_t *sp_p,
                                       const char **why_p)
{
    const Epd__SamplingParams *s;
    epd_sample_params_t sp;

    if (g->n_prompt_tokens == 0) {
        return epd__refuse(why_p, "empty prompt", EPD_ERR_INVALID_PARAM);
    }
    if (g->n_prompt_tokens > lim->max_context) {
        return epd__refuse(why_p, "prompt longer than the context limit", EPD_ERR_TOO_LONG);
    }
    for (size_t i = 0; i < g->n_prompt_tokens; i++) {
        if (g->prompt_tokens[i] >= lim->vocab_size) {
            return epd__refuse(why_p, "prompt token id outside the vocabulary",
                               EPD_ERR_INVALID_PARAM);
        }
    }
    s = g->sampling;
    if (s == NULL || s->max_tokens == 0) {
        return epd__refuse(why_p, "max_tokens must be at least 1", EPD_ERR_INVALID_PARAM);
    }
    if (g->resume_generated > 0 &&
        (g->resume_generated >= g->n_prompt_tokens || g->resume_generated >= s->max_tokens ||
         g->n_media > 0 || g->protocol_only)) {
        /* a migrated request (rule 37): its last resume_generated prompt
         * tokens are tokens it generated, and some are still to come */
        return epd__refuse(why_p,
                           "resume_generated must be below the prompt's length and max_tokens, "
                           "without images or protocol_only",
                           EPD_ERR_INVALID_PARAM);
    }
    /* (a migrated request's prompt holds resume_generated of its tokens) */
    if ((uint64_t)g->n_prompt_tokens - g->resume_generated + s->max_tokens > lim->max_context) {
        return epd__refuse(why_p, "prompt + max_tokens exceeds the context limit",
                           EPD_ERR_TOO_LONG);
    }
    if (s->n_stop_token_ids > EPD_DECODE_MAX_STOP_IDS) {
        return epd__refuse(why_p, "too many stop token ids", EPD_ERR_INVALID_PARAM);
    }
    for (size_t i = 0; i < s->n_stop_token_ids; i++) {
        if (s->stop_token_ids[i] >= lim->vocab_size) {
            return epd__refuse(why_p, "stop token id outside the vocabulary",
                               EPD_ERR_INVALID_PARAM);
        }
    }
    epd_sample_params_default(&sp);
    sp.temperature = s->temperature;
    sp.top_k = s->top_k;
    /* proto3: 0 is "unset", which the schema defines as "off" */
    sp.top_p = s->top_p == 0.0f ? 1.0f : s->top_p;
    sp.seed = s->seed;
    {
        char why[200];

        /* (the reason is fixed text: why_p outlives this frame) */
        if (epd_sample_params_from_msg(s, lim->vocab_size, &sp, why, sizeof(why)) != EPD_OK) {
            return epd__refuse(why_p, "bad logit adjustments (penalty range, bias id or value)",
                               EPD_ERR_INVALID_PARAM);
        }
    }
    if (!isfinite(sp.temperature) || !isfinite(sp.top_p) ||
        epd_sample_params_check(&sp) != EPD_OK) {
        return epd__refuse(why_p,
                           "sampling parameters out of range (temperature 0..100, top_p in (0, 1])",
                           EPD_ERR_INVALID_PARAM);
    }
    *sp_p = sp;
    return EPD_OK;
}

int epd_decode_check_prefill_named(const Epd__GenerateRequest *g)
{
    return g->prefill_worker_id != NULL && g->prefill_worker_id[0] != '\0' &&
           strlen(g->prefill_worker_id) < EPD_WORKER_ID_MAX && g->prefill_epoch != NULL &&
           g->prefill_address.len > 0 && g->prefill_address.len <= EPD_XPORT_ADDR_MAX;
}

epd_status_t epd_decode_check_kv_layer(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                       const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                       uint32_t layer, uint64_t sum, epd_hash_state_t *h,
                                       uint64_t *bytes_p)
{
    const unsigned char *base = pool->base;
    uint64_t bytes = 0;
    uint64_t off;

    if (layer >= layout->n_layers) {
        return EPD_ERR_INVALID_PARAM;
    }
    epd_hash_state_reset(h, 0);
    if (layout->kind[layer] == EPD_LAYER_LINEAR) {
        if (epd_kv_state_offset(layout, pool->n_blocks, pool->n_state_slots, layer, slot, &off) !=
                EPD_OK ||
            off + layout->state_bytes > pool->bytes) {
            return EPD_ERR_INVALID_PARAM;
        }
        epd_hash_state_update(h, base + off, layout->state_bytes);
        bytes = layout->state_bytes;
    } else {
        /* every block at once: a chunk check from block 0 */
        epd_status_t st = epd_decode_check_kv_blocks(layout, pool, ids, 0, n_ids, layer, sum, h,
                                                     &bytes, NULL);

        if (bytes_p != NULL) {
            *bytes_p = bytes;
        }
        return st;
    }
    if (bytes_p != NULL) {
        *bytes_p = bytes;
    }
    return epd_hash_state_digest(h) == sum ? EPD_OK : EPD_ERR_CORRUPT;
}

epd_status_t epd_decode_check_kv_blocks(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                        const uint32_t *ids, uint32_t from, uint32_t to,
                                        uint32_t layer, uint64_t sum, epd_hash_state_t *h,
                                        uint64_t *bytes_p, const char **why_p)
{
    const unsigned char *base = pool->base;
    uint64_t bb, off;

    *bytes_p = 0;
    if (layer >= layout->n_layers || layout->kind[layer] != EPD_LAYER_ATTENTION || from > to) {
        return epd__refuse(why_p, "KV verification failed", EPD_ERR_INVALID_PARAM);
    }
    bb = epd_kv_layer_block_bytes(layout, layer);
    for (uint32_t i = from; i < to; i++) {
        if (epd_kv_block_offset(layout, pool->n_blocks, layer, ids[i], &off) != EPD_OK ||
            off + bb > pool->bytes) {
            return epd__refuse(why_p, "KV verification failed", EPD_ERR_INVALID_PARAM);
        }
        epd_hash_state_update(h, base + off, bb);
        *bytes_p += bb;
    }
    return epd_hash_state_digest(h) == sum
               ? EPD_OK
               : epd__refuse(why_p, "KV checksum mismatch: the cache is corrupt", EPD_ERR_CORRUPT);
}

epd_status_t epd_decode_check_kv(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                 const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                 const uint64_t *sums, size_t n_sums, epd_hash_state_t *h,
                                 uint32_t *bad_layer_p)
{
    if (n_sums != layout->n_layers) {
        return EPD_ERR_INVALID_PARAM;
    }
    for (uint32_t l = 0; l < layout->n_layers; l++) {
        epd_status_t st = epd_decode_check_kv_layer(layout, pool, ids, n_ids, slot, l, sums[l], h,
                                                    NULL);

        if (st == EPD_ERR_CORRUPT) {
            *bad_layer_p = l;
        }
        if (st != EPD_OK) {
            return st;
        }
    }
    return EPD_OK;
}

epd_status_t epd_decode_check_layer(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                    const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                    uint32_t layer, uint64_t sum, epd_kv_sum_kind_t kind,
                                    const epd_kv_stamp_expect_t *expect, epd_hash_state_t *h,
                                    uint64_t *bytes_p, const char **why_p)
{
    epd_status_t st;

    if (kind == EPD_KV_SUM_STAMPED) {
        return epd_kv_stamp_check_layer(layout, pool, ids, n_ids, slot, layer, expect, sum, h,
                                        bytes_p, why_p);
    }
    st = epd_decode_check_kv_layer(layout, pool, ids, n_ids, slot, layer, sum, h, bytes_p);
    if (st != EPD_OK) {
        return epd__refuse(why_p,
                           st == EPD_ERR_CORRUPT ? "KV checksum mismatch: the cache is corrupt"
                                                 : "KV verification failed",
                           st);
    }
    return EPD_OK;
}

epd_status_t epd_decode_seen_landed(epd_decode_kv_seen_t *seen, uint32_t n_layers, uint32_t layer,
                                    uint64_t sum, int kind, int *check_p, const char **why_p)
{
    if (layer >= n_layers) {
        return epd__refuse(why_p, "LayerDone: layer outside the model", EPD_ERR_INVALID_PARAM);
    }
    if (seen->kind >= 0 && seen->kind != kind) {
        return epd__refuse(why_p, "LayerDone: a checksum kind other than the request's",
                           EPD_ERR_INVALID_PARAM);
    }
    if (seen->state[layer] != EPD_DECODE_KV_WAIT) {
        if (seen->sums[layer] != sum) {
            return epd__refuse(why_p, "LayerDone: a second, different checksum for one layer",
                               EPD_ERR_INVALID_PARAM);
        }
        *check_p = 0;
        return EPD_OK;
    }
    seen->kind = kind;
    seen->sums[layer] = sum;
    seen->state[layer] = EPD_DECODE_KV_CHECKING;
    seen->n_checking++;
    *check_p = 1;
    return EPD_OK;
}

epd_status_t epd_decode_seen_completed(epd_decode_kv_seen_t *seen, uint32_t n_layers,
                                       const uint64_t *sums, size_t n_sums, int kind,
                                       uint8_t *newly, const char **why_p)
{
    if (n_sums != n_layers) {
        return epd__refuse(why_p, "PrefillComplete: wrong number of layer checksums",
                           EPD_ERR_INVALID_PARAM);
    }
    if (seen->kind >= 0 && seen->kind != kind) {
        return epd__refuse(why_p, "PrefillComplete: a checksum kind other than its LayerDones'",
                           EPD_ERR_INVALID_PARAM);
    }
    for (uint32_t l = 0; l < n_layers; l++) {
        if (seen->state[l] == EPD_DECODE_KV_OK && seen->sums[l] != sums[l]) {
            return epd__refuse(why_p,
                               "PrefillComplete: a layer checksum differs from its LayerDone's",
                               EPD_ERR_INVALID_PARAM);
        }
    }
    seen->kind = kind;
    for (uint32_t l = 0; l < n_layers; l++) {
        newly[l] = seen->state[l] == EPD_DECODE_KV_WAIT;
        if (newly[l]) {
            seen->sums[l] = sums[l];
            seen->state[l] = EPD_DECODE_KV_CHECKING;
            seen->n_checking++;
        } else if (seen->state[l] != EPD_DECODE_KV_OK && seen->sums[l] != sums[l]) {
            seen->state[l] |= EPD_DECODE_KV_DISAGREE;
        }
    }
    return EPD_OK;
}

epd_status_t epd_decode_seen_result(epd_decode_kv_seen_t *seen, uint32_t layer,
                                    epd_status_t status, uint64_t bytes, const char **why_p)
{
    int disagree = (seen->state[layer] & EPD_DECODE_KV_DISAGREE) != 0;

    if ((seen->state[layer] & ~EPD_DECODE_KV_DISAGREE) != EPD_DECODE_KV_CHECKING) {
        return EPD_OK;
    }
    seen->n_checking--;
    if (status != EPD_OK) {
        seen->state[layer] = EPD_DECODE_KV_WAIT;
        return status;
    }
    seen->state[layer] = EPD_DECODE_KV_OK;
    seen->n_ok++;
    seen->bytes += bytes;
    if (disagree) {
        return epd__refuse(why_p, "PrefillComplete: a layer checksum differs from its LayerDone's",
                           EPD_ERR_INVALID_PARAM);
    }
    return EPD_OK;
}

void epd_decode_seen_trust(epd_decode_kv_seen_t *seen, uint32_t n_layers)
{
    for (uint32_t l = 0; l < n_layers; l++) {
        if (seen->state[l] == EPD_DECODE_KV_WAIT) {
            seen->state[l] = EPD_DECODE_KV_OK;
            seen->n_ok++;
        }
    }
}

int epd_decode_first_finish(uint32_t first_token, const epd_engine_info_t *info,
                            const uint32_t *stop_ids, uint32_t n_stop, uint32_t max_tokens)
{
    if (info != NULL && epd_engine_is_eos(info, (int32_t)first_token)) {
        return EPD__FINISH_REASON__FINISH_STOP;
    }
    for (uint32_t i = 0; i < n_stop; i++) {
        if (stop_ids[i] == first_token) {
            return EPD__FINISH_REASON__FINISH_STOP;
        }
    }
    return max_tokens == 1 ? EPD__FINISH_REASON__FINISH_LENGTH : EPD__FINISH_REASON__FINISH_NONE;
}
