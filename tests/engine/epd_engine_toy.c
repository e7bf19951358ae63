/*
 * epd_engine_toy.c — a tiny engine built as a shared object, to prove the
 * dlopen path: two layers (attention, then linear), one kv head of two
 * floats.  Prefill and decode write K = (token, pos), V = (pos, token) for
 * every token, count tokens in the linear layer's state, and answer logits
 * that are one-hot at (last token + 1) % 256; no vision encoder (images are
 * refused with EPD_ERR_UNSUPPORTED).  It allocates through the
 * host's epd_calloc (resolved from the executable, linked -rdynamic).
 * With EPD_TOY_BAD_OPS set in the environment, the entry returns a table
 * with a NULL op, which the loader must refuse.
 */
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_engine.h"

#define TOY_VOCAB 258

struct epd_engine_impl {
    epd_engine_info_t info;
};

static epd_status_t toy_open(const epd_engine_config_t *config, epd_engine_impl_t **impl_p)
{
    epd_engine_impl_t *e = epd_calloc(1, sizeof(*e));
    epd_kv_layout_t *kv;

    if (e == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    e->info.vocab_size = TOY_VOCAB;
    e->info.bos_token = 256;
    e->info.eos_token = 257;
    e->info.max_context = config->max_context ? config->max_context : 64;
    e->info.max_batch = 4;
    e->info.image_token = -1; /* no vision encoder */
    kv = &e->info.kv;
    kv->n_layers = 2;
    kv->n_attn_layers = 1;
    kv->n_linear_layers = 1;
    kv->kind[0] = EPD_LAYER_ATTENTION;
    kv->kind[1] = EPD_LAYER_LINEAR;
    kv->kind_index[0] = 0;
    kv->kind_index[1] = 0;
    kv->dtype = EPD_DTYPE_F32;
    kv->block_tokens = config->block_tokens ? config->block_tokens : 4;
    kv->n_kv_heads = 1;
    kv->head_dim = 2;
    kv->block_bytes = 2ull * kv->block_tokens * 2 * sizeof(float);
    kv->n_state_heads = 1;
    kv->state_bytes = sizeof(float);
    *impl_p = e;
    return EPD_OK;
}

static void toy_close(epd_engine_impl_t *e)
{
    epd_free(e);
}

static void toy_describe(const epd_engine_impl_t *e, epd_engine_info_t *info_p)
{
    *info_p = e->info;
}

static epd_status_t toy_tokenize(const epd_engine_impl_t *e, const char *text, size_t len,
                                 int add_bos, int32_t *tokens, size_t cap, size_t *n_p)
{
    size_t n = 0;

    (void)e;
    if (len + (add_bos ? 1 : 0) > cap) {
        return EPD_ERR_TOO_LONG;
    }
    if (add_bos) {
        tokens[n++] = 256;
    }
    for (size_t i = 0; i < len; i++) {
        tokens[n++] = (unsigned char)text[i];
    }
    *n_p = n;
    return EPD_OK;
}

static epd_status_t toy_detokenize(const epd_engine_impl_t *e, const int32_t *tokens, size_t n,
                                   char *buf, size_t cap, size_t *len_p)
{
    size_t len = 0;

    (void)e;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 256) {
            if (len == cap) {
                return EPD_ERR_TOO_LONG;
            }
            buf[len++] = (char)tokens[i];
        }
    }
    *len_p = len;
    return EPD_OK;
}

static void toy_put(const epd_engine_impl_t *e, const epd_kv_pool_t *pool, const epd_kv_seq_t *seq,
                    uint32_t pos, int32_t token)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint64_t off;
    float *blk;

    epd_kv_block_offset(kv, pool->n_blocks, 0, seq->block_table[pos / kv->block_tokens], &off);
    blk = (float *)((char *)pool->base + off);
    blk[(pos % kv->block_tokens) * 2] = (float)token;
    blk[(pos % kv->block_tokens) * 2 + 1] = (float)pos;
    blk[kv->block_tokens * 2 + (pos % kv->block_tokens) * 2] = (float)pos;
    blk[kv->block_tokens * 2 + (pos % kv->block_tokens) * 2 + 1] = (float)token;
}

static float *toy_state(const epd_engine_impl_t *e, const epd_kv_pool_t *pool, uint32_t slot)
{
    uint64_t off;

    epd_kv_state_offset(&e->info.kv, pool->n_blocks, pool->n_state_slots, 1, slot, &off);
    return (float *)((char *)pool->base + off);
}

static void toy_logits(int32_t last, float *logits)
{
    memset(logits, 0, TOY_VOCAB * sizeof(float));
    logits[(last + 1) % 256] = 1.0f;
}

static epd_status_t toy_prefill(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                const epd_prefill_args_t *args, const epd_engine_sink_t *sink,
                                float *logits)
{
    uint32_t bt = e->info.kv.block_tokens;
    uint32_t end = args->start + args->n_tokens;
    epd_layer_done_t d = {.req_id = args->seq.req_id, .tok_start = args->start, .tok_end = end};
    float *state = toy_state(e, pool, args->seq.state_slot);
    epd_status_t st;

    for (uint32_t i = 0; i < args->n_tokens; i++) {
        toy_put(e, pool, &args->seq, args->start + i, args->tokens[i]);
    }
    /* the engine ABI: the last block's unused positions hold nobody's KV */
    for (uint32_t p = end; p % bt != 0; p++) {
        uint64_t off;
        float *blk;

        epd_kv_block_offset(&e->info.kv, pool->n_blocks, 0, args->seq.block_table[p / bt], &off);
        blk = (float *)((char *)pool->base + off);
        blk[(p % bt) * 2] = blk[(p % bt) * 2 + 1] = 0.0f;
        blk[bt * 2 + (p % bt) * 2] = blk[bt * 2 + (p % bt) * 2 + 1] = 0.0f;
    }
    d.layer = 0;
    d.kind = EPD_LAYER_ATTENTION;
    d.first_block = args->start / bt;
    d.n_blocks = (end - 1) / bt - d.first_block + 1;
    d.block_ids = args->seq.block_table + d.first_block;
    if (sink != NULL && sink->cb != NULL && (st = sink->cb(sink->ctx, 0, &d)) != EPD_OK) {
        return st;
    }
    *state = (args->start == 0 ? 0.0f : *state) + (float)args->n_tokens;
    d.layer = 1;
    d.kind = EPD_LAYER_LINEAR;
    d.state_slot = args->seq.state_slot;
    if (sink != NULL && sink->cb != NULL && (st = sink->cb(sink->ctx, 1, &d)) != EPD_OK) {
        return st;
    }
    toy_logits(args->tokens[args->n_tokens - 1], logits);
    return EPD_OK;
}

static epd_status_t toy_decode(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                               const epd_decode_req_t *reqs, uint32_t n, float *logits)
{
    for (uint32_t i = 0; i < n; i++) {
        toy_put(e, pool, &reqs[i].seq, reqs[i].pos, reqs[i].token);
        *toy_state(e, pool, reqs[i].seq.state_slot) += 1.0f;
        toy_logits(reqs[i].token, logits + (size_t)i * TOY_VOCAB);
    }
    return EPD_OK;
}

static void toy_release(epd_engine_impl_t *e, const epd_kv_pool_t *pool, const epd_kv_seq_t *seq)
{
    *toy_state(e, pool, seq->state_slot) = 0.0f;
}

static epd_status_t toy_encode_image(epd_engine_impl_t *e, const epd_image_view_t *image,
                                     float *out)
{
    (void)e;
    (void)image;
    (void)out;
    return EPD_ERR_UNSUPPORTED;
}

static const epd_engine_ops_t toy_ops = {
    .size = sizeof(epd_engine_ops_t),
    .abi_version = EPD_ENGINE_ABI_VERSION,
    .name = "toy",
    .open = toy_open,
    .close = toy_close,
    .describe = toy_describe,
    .tokenize = toy_tokenize,
    .detokenize = toy_detokenize,
    .prefill = toy_prefill,
    .decode = toy_decode,
    .release = toy_release,
    .encode_image = toy_encode_image,
};

static const epd_engine_ops_t toy_bad_ops = {
    .size = sizeof(epd_engine_ops_t),
    .abi_version = EPD_ENGINE_ABI_VERSION,
    .name = "toy-bad",
    .open = toy_open,
    .close = toy_close,
    .describe = toy_describe,
    .tokenize = toy_tokenize,
    .detokenize = toy_detokenize,
    .prefill = toy_prefill,
    .decode = NULL, /* deliberately incomplete: the loader must refuse it */
    .release = toy_release,
    .encode_image = toy_encode_image,
};

const epd_engine_ops_t *epd_engine_entry(void);

const epd_engine_ops_t *epd_engine_entry(void)
{
    return getenv("EPD_TOY_BAD_OPS") != NULL ? &toy_bad_ops : &toy_ops;
}
