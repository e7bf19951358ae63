/*
 * epd_itest_colo.c — the colocated baseline for test programs; a copy of
 * epd-generate's loop (engine/tools/epd_generate.c), kept step for step.
 */
#include "epd_itest_colo.h"

#include <string.h>

#include "epd_alloc.h"

epd_status_t epd_itest_colocated(epd_engine_t *engine, const int32_t *prompt, uint32_t n_prompt,
                                 const epd_sample_params_t *sp, uint32_t max_tokens, int32_t *out,
                                 uint32_t *n_out_p)
{
    return epd_itest_colocated_mm(engine, prompt, n_prompt, NULL, 0, sp, max_tokens, out, n_out_p);
}

epd_status_t epd_itest_colocated_mm(epd_engine_t *engine, const int32_t *prompt, uint32_t n_prompt,
                                    const epd_embed_span_t *spans, uint32_t n_spans,
                                    const epd_sample_params_t *sp, uint32_t max_tokens,
                                    int32_t *out, uint32_t *n_out_p)
{
    const epd_engine_info_t *info = epd_engine_info(engine);
    epd_sample_scratch_t *scratch = NULL;
    epd_kv_pool_t pool = {0};
    epd_prefill_args_t pa;
    uint32_t *table = NULL;
    float *logits = NULL;
    uint64_t n_total;
    uint32_t n_blocks;
    uint32_t n_out = 0;
    epd_status_t status;

    n_total = (uint64_t)n_prompt + max_tokens;
    if (n_total > info->max_context) {
        n_total = info->max_context;
    }
    n_blocks = (uint32_t)((n_total + info->kv.block_tokens - 1) / info->kv.block_tokens);
    pool.n_blocks = n_blocks;
    pool.n_state_slots = 1;
    pool.bytes = epd_kv_pool_bytes(&info->kv, n_blocks, 1);
    pool.base = epd_calloc(1, pool.bytes);
    table = epd_calloc(n_blocks, sizeof(*table));
    logits = epd_calloc(info->vocab_size, sizeof(*logits));
    status = epd_sample_scratch_create(info->vocab_size, &scratch);
    if (pool.base == NULL || table == NULL || logits == NULL || status != EPD_OK) {
        status = EPD_ERR_NO_MEMORY;
        goto out;
    }
    for (uint32_t i = 0; i < n_blocks; i++) {
        table[i] = i;
    }
    memset(&pa, 0, sizeof(pa));
    pa.seq.req_id = 1;
    pa.seq.block_table = table;
    pa.seq.n_blocks = n_blocks;
    pa.tokens = prompt;
    pa.n_tokens = n_prompt;
    pa.embeds = spans;
    pa.n_embeds = n_spans;
    status = epd_engine_prefill(engine, &pool, &pa, NULL, logits);
    if (status != EPD_OK) {
        goto out;
    }
    for (;;) {
        epd_decode_req_t r;
        int32_t tok;

        status = epd_sample_token(sp, scratch, logits, info->vocab_size, n_out, &tok);
        if (status != EPD_OK) {
            goto out;
        }
        out[n_out++] = tok;
        if (tok == info->eos_token || n_out == max_tokens ||
            n_prompt + n_out - 1 >= info->max_context) {
            break;
        }
        r.seq = pa.seq;
        r.pos = n_prompt + n_out - 1;
        r.token = tok;
        status = epd_engine_decode(engine, &pool, &r, 1, logits);
        if (status != EPD_OK) {
            goto out;
        }
    }
    *n_out_p = n_out;
    status = EPD_OK;
out:
    epd_sample_scratch_destroy(scratch);
    epd_free(logits);
    epd_free(table);
    epd_free(pool.base);
    return status;
}
