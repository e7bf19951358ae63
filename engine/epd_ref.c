/*
 * epd_ref.c — the `ref` engine: a real (small) hybrid transformer on the CPU.
 * This file opens it (weights, digest, info), tokenizes and releases, and
 * holds the ops table; the forward pass is in epd_ref_forward.c, the
 * vision encoder in epd_ref_vision.c, the kernels in epd_ref_kern.c
 * (epd_ref_int.h: what they share).
 *
 * The math is written down in epd_ref_model.h.  Design points:
 *  - Weights are read once at open (safetensors is mmapped, each tensor
 *    converted to f32 into one engine-owned buffer), so F16/BF16 files cost
 *    nothing at run time and alignment never matters.
 *  - KV lives in the caller's pool (see epd_engine.h):
 *      block of one attention layer: [2: K,V][kv_head][tok][head_dim] f32
 *      state of one linear layer:    [head][hd*hd (S) + hd (z)]        f32
 *    K is stored after RoPE, so decode never re-rotates the cache.
 *  - Prefill runs layer by layer over the whole chunk (so the sink fires
 *    once per layer); the projections are one cblas_sgemm each, attention
 *    gathers one kv head's K and V into contiguous scratch and runs two
 *    sgemms per query tile (scores, then scores x V).  OpenBLAS is pinned to
 *    one thread: daemons own their threads.
 *  - Prefill allocates its activations per call (sized by the chunk); decode
 *    allocates nothing: its scratch is sized at open by max_batch.
 *  - Decode is batch-invariant: every projection runs one request's row at
 *    a time (sgemv), so a request's logits are bit for bit the same alone
 *    or in any batch (one sgemm over the batch sums in another order, and
 *    a seeded sample at a near-tie followed it: the storm test caught it).
 *  - The vision encoder (encode_image) is a ViT on the same kernels: the
 *    image is resized straight into the patch matrix [N][P*P*3], then every
 *    projection is one sgemm over all N patches and attention is two sgemms
 *    per head (all patches see all patches).  Its activations are allocated
 *    per call, like prefill's.  Prefill places the caller's embedding rows
 *    over the token embeddings of the covered positions and is otherwise
 *    unchanged.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_engine.h"
#include "epd_engine_int.h"
#include "epd_hash.h"
#include "epd_kvq.h"
#include "epd_log.h"
#include "epd_ref_int.h"
#include "epd_safetensors.h"

/* ---- open / close ------------------------------------------------------- */

static void epd_ref_close(epd_engine_impl_t *e)
{
    if (e == NULL) {
        return;
    }
    epd_free(e->d_scores);
    epd_free(e->d_u);
    epd_free(e->d_g);
    epd_free(e->d_o);
    epd_free(e->d_v);
    epd_free(e->d_k);
    epd_free(e->d_q);
    epd_free(e->d_h);
    epd_free(e->d_x);
    epd_free(e->decay);
    epd_free(e->rope_sin);
    epd_free(e->rope_cos);
    epd_free(e->vis.blocks);
    epd_free(e->layers);
    epd_free(e->weights);
    epd_free(e);
}

/* Points the vision weights at the i-th vision tensor `w` (0-based among
 * the vision tensors, epd_ref_model.h's order). */
static void epd_ref_vision_slot(epd_engine_impl_t *e, size_t i, const float *w)
{
    size_t blocks = (size_t)e->hp.vision.n_layers * EPD_REF_VISION_PER_BLOCK;
    epd_ref_vision_t *v = &e->vis;

    if (i < 3) {
        const float **head[3] = {&v->patch_w, &v->patch_b, &v->pos};

        *head[i] = w;
    } else if (i < 3 + blocks) {
        v->blocks[(i - 3) / EPD_REF_VISION_PER_BLOCK].t[(i - 3) % EPD_REF_VISION_PER_BLOCK] = w;
    } else {
        const float **tail[6] = {&v->post_w, &v->post_b, &v->m0_w, &v->m0_b, &v->m2_w, &v->m2_b};

        *tail[i - 3 - blocks] = w;
    }
}

/* info.model_digest: XXH3-128 of model.safetensors seeded with XXH3-64 of
 * config.json (the two files every number of the model comes from). */
static epd_status_t epd_ref_digest(epd_engine_impl_t *e, const char *dir, const epd_st_file_t *file)
{
    char path[4096];
    char buf[4096];
    epd_hash_state_t *h;
    FILE *f;
    size_t n;
    epd_status_t status;

    if (snprintf(path, sizeof(path), "%s/config.json", dir) >= (int)sizeof(path)) {
        return EPD_ERR_INVALID_PARAM;
    }
    f = fopen(path, "rb");
    if (f == NULL) {
        epd_log_error(EPD_REF_LOG, 0, "%s: cannot read it again", path);
        return EPD_ERR_IO;
    }
    status = epd_hash_state_create(0, &h);
    if (status == EPD_OK) {
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
            epd_hash_state_update(h, buf, n);
        }
        epd_st_digest(file, epd_hash_state_digest(h), e->digest);
        epd_hash_state_destroy(h);
    }
    fclose(f);
    return status;
}

static epd_status_t epd_ref_load_weights(epd_engine_impl_t *e, const char *dir)
{
    const epd_ref_hparams_t *hp = &e->hp;
    size_t n = epd_ref_tensor_count(hp);
    size_t n_lm = epd_ref_lm_tensor_count(hp);
    epd_st_file_t *file;
    char path[4096];
    uint64_t total = 0;
    float *w;
    epd_status_t status;

    if (snprintf(path, sizeof(path), "%s/model.safetensors", dir) >= (int)sizeof(path)) {
        return EPD_ERR_INVALID_PARAM;
    }
    status = epd_st_open(path, &file);
    if (status != EPD_OK) {
        return status == EPD_ERR_NOT_FOUND ? EPD_ERR_NOT_FOUND : status;
    }
    for (size_t i = 0; i < n; i++) {
        epd_ref_tensor_spec_t s;

        epd_ref_tensor_spec(hp, i, &s);
        total += s.n_elems;
    }
    e->weights = epd_calloc(total, sizeof(float));
    e->layers = epd_calloc(hp->n_layers, sizeof(*e->layers));
    if (hp->has_vision) {
        e->vis.blocks = epd_calloc(hp->vision.n_layers, sizeof(*e->vis.blocks));
    }
    if (e->weights == NULL || e->layers == NULL || (hp->has_vision && e->vis.blocks == NULL)) {
        status = EPD_ERR_NO_MEMORY;
        goto out;
    }
    w = e->weights;
    for (size_t i = 0; i < n; i++) {
        epd_ref_tensor_spec_t s;

        epd_ref_tensor_spec(hp, i, &s);
        status = epd_st_read_f32(file, s.name, s.ndim, s.shape, w);
        if (status != EPD_OK) {
            epd_log_error(EPD_REF_LOG, 0, "%s does not match %s/config.json", path, dir);
            status = EPD_ERR_MALFORMED;
            goto out;
        }
        if (i >= n_lm) {
            epd_ref_vision_slot(e, i - n_lm, w);
        } else if (i == 0) {
            e->embed = w;
        } else if (i == n_lm - 2) {
            e->final_norm = w;
        } else if (i == n_lm - 1) {
            e->lm_head = w;
        } else {
            epd_ref_layer_t *L = &e->layers[(i - 1) / 9];
            const float **slots[9] = {&L->in_norm,   &L->wq,   &L->wk, &L->wv,  &L->wo,
                                      &L->post_norm, &L->gate, &L->up, &L->down};

            *slots[(i - 1) % 9] = w;
        }
        w += s.n_elems;
    }
    status = epd_ref_digest(e, dir, file);
out:
    epd_st_close(file);
    return status;
}

static void epd_ref_fill_info(epd_engine_impl_t *e, uint32_t block_tokens, uint32_t max_batch,
                              uint32_t max_context)
{
    const epd_ref_hparams_t *hp = &e->hp;
    epd_engine_info_t *info = &e->info;
    epd_kv_layout_t *kv = &info->kv;

    memset(info, 0, sizeof(*info));
    memcpy(info->model_digest, e->digest, sizeof(info->model_digest));
    info->vocab_size = hp->vocab;
    info->bos_token = hp->bos;
    info->eos_token = hp->eos;
    info->max_context = max_context;
    info->max_batch = max_batch;
    info->image_token = -1;
    if (hp->has_vision) {
        info->image_embeddings = epd_ref_image_embeddings(hp);
        info->embed_dim = hp->dim;
        info->image_token = hp->image_token;
        info->image_size = hp->vision.image_size;
    }
    kv->n_layers = hp->n_layers;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        kv->kind[l] = (uint8_t)epd_ref_layer_kind(hp, l);
        kv->kind_index[l] =
            kv->kind[l] == EPD_LAYER_ATTENTION ? kv->n_attn_layers++ : kv->n_linear_layers++;
    }
    kv->dtype = EPD_DTYPE_F32;
    kv->block_tokens = block_tokens;
    kv->n_kv_heads = hp->n_kv_heads;
    kv->head_dim = hp->head_dim;
    kv->block_bytes = 2ull * hp->n_kv_heads * block_tokens * hp->head_dim * sizeof(float);
    kv->n_state_heads = hp->n_heads;
    kv->state_bytes = (uint64_t)hp->n_heads *
                      ((uint64_t)hp->head_dim * hp->head_dim + hp->head_dim) * sizeof(float);
}

static epd_status_t epd_ref_open(const epd_engine_config_t *config, epd_engine_impl_t **impl_p)
{
    uint32_t block_tokens = config->block_tokens ? config->block_tokens : 16;
    uint32_t max_batch = config->max_batch ? config->max_batch : 64;
    uint32_t max_context;
    uint32_t half;
    size_t qd;
    epd_engine_impl_t *e;
    epd_status_t status;

    if (config->model_dir == NULL) {
        epd_log_error(EPD_REF_LOG, 0, "no model folder given");
        return EPD_ERR_INVALID_PARAM;
    }
    if (block_tokens > 4096 || max_batch > 4096) {
        epd_log_error(EPD_REF_LOG, 0, "block_tokens %u / max_batch %u out of range (1..4096)",
                      block_tokens, max_batch);
        return EPD_ERR_INVALID_PARAM;
    }
    e = epd_calloc(1, sizeof(*e));
    if (e == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    status = epd_ref_hparams_load(config->model_dir, &e->hp);
    if (status != EPD_OK) {
        goto err_close;
    }
    if (e->hp.head_dim > 1024) {
        status = EPD_ERR_MALFORMED;
        goto err_close;
    }
    max_context = e->hp.max_context;
    if (config->max_context != 0 && config->max_context < max_context) {
        max_context = config->max_context;
    }
    status = epd_ref_load_weights(e, config->model_dir);
    if (status != EPD_OK) {
        goto err_close;
    }
    half = e->hp.head_dim / 2;
    qd = (size_t)e->hp.n_heads * e->hp.head_dim;
    e->rope_cos = epd_calloc((size_t)max_context * half, sizeof(float));
    e->rope_sin = epd_calloc((size_t)max_context * half, sizeof(float));
    e->decay = epd_calloc(e->hp.n_heads, sizeof(float));
    e->d_x = epd_calloc((size_t)max_batch * e->hp.dim, sizeof(float));
    e->d_h = epd_calloc((size_t)max_batch * e->hp.dim, sizeof(float));
    e->d_q = epd_calloc((size_t)max_batch * qd, sizeof(float));
    e->d_k = epd_calloc((size_t)max_batch * qd, sizeof(float));
    e->d_v = epd_calloc((size_t)max_batch * qd, sizeof(float));
    e->d_o = epd_calloc((size_t)max_batch * qd, sizeof(float));
    e->d_g = epd_calloc((size_t)max_batch * e->hp.ffn, sizeof(float));
    e->d_u = epd_calloc((size_t)max_batch * e->hp.ffn, sizeof(float));
    e->d_scores = epd_calloc(max_context, sizeof(float));
    if (e->rope_cos == NULL || e->rope_sin == NULL || e->decay == NULL || e->d_x == NULL ||
        e->d_h == NULL || e->d_q == NULL || e->d_k == NULL || e->d_v == NULL || e->d_o == NULL ||
        e->d_g == NULL || e->d_u == NULL || e->d_scores == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err_close;
    }
    for (uint32_t p = 0; p < max_context; p++) {
        for (uint32_t i = 0; i < half; i++) {
            double angle = p * pow(e->hp.rope_theta, -2.0 * i / e->hp.head_dim);

            e->rope_cos[(size_t)p * half + i] = (float)cos(angle);
            e->rope_sin[(size_t)p * half + i] = (float)sin(angle);
        }
    }
    for (uint32_t h = 0; h < e->hp.n_heads; h++) {
        e->decay[h] = (float)epd_ref_linear_decay(h);
    }
    epd_ref_fill_info(e, block_tokens, max_batch, max_context);
    status = epd_kvq_layout_set(&e->info.kv, config->kv_dtype, EPD_REF_LOG);
    if (status != EPD_OK) {
        goto err_close;
    }
    openblas_set_num_threads(1);
    epd_log_debug(EPD_REF_LOG, 0,
                  "%s: %u layers (%s), dim %u, %u heads / %u kv heads of %u, ffn %u, vocab %u, "
                  "context %u, %u-token blocks of %llu bytes, state %llu bytes",
                  config->model_dir, e->hp.n_layers, e->hp.pattern, e->hp.dim, e->hp.n_heads,
                  e->hp.n_kv_heads, e->hp.head_dim, e->hp.ffn, e->hp.vocab, max_context,
                  block_tokens, (unsigned long long)e->info.kv.block_bytes,
                  (unsigned long long)e->info.kv.state_bytes);
    if (e->hp.has_vision) {
        epd_log_debug(EPD_REF_LOG, 0,
                      "%s: vision %u x %u pixels, %u-pixel patches, %u layers of %u (%u heads), "
                      "MLP %u, %u x %u merge: %u embeddings per image, placeholder %d",
                      config->model_dir, e->hp.vision.image_size, e->hp.vision.image_size,
                      e->hp.vision.patch_size, e->hp.vision.n_layers, e->hp.vision.dim,
                      e->hp.vision.n_heads, e->hp.vision.ffn, e->hp.vision.merge,
                      e->hp.vision.merge, e->info.image_embeddings, e->hp.image_token);
    }
    *impl_p = e;
    return EPD_OK;

err_close:
    epd_ref_close(e);
    return status;
}

static void epd_ref_describe(const epd_engine_impl_t *e, epd_engine_info_t *info_p)
{
    *info_p = e->info;
}

/* ---- tokenizer: one token per byte, plus BOS and EOS --------------------- */

static epd_status_t epd_ref_tokenize(const epd_engine_impl_t *e, const char *text, size_t len,
                                     int add_bos, int32_t *tokens, size_t cap, size_t *n_p)
{
    (void)e;
    return epd__byte_tokenize(e->hp.bos, text, len, add_bos, tokens, cap, n_p);
}

static epd_status_t epd_ref_detokenize(const epd_engine_impl_t *e, const int32_t *tokens, size_t n,
                                       char *buf, size_t cap, size_t *len_p)
{
    (void)e;
    return epd__byte_detokenize(tokens, n, buf, cap, len_p);
}

static void epd_ref_release(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                            const epd_kv_seq_t *seq)
{
    /* The ref engine keeps nothing per request outside the pool; clearing
     * the state slots makes a stale state impossible to read by mistake. */
    for (uint32_t l = 0; l < e->hp.n_layers; l++) {
        if (e->info.kv.kind[l] == EPD_LAYER_LINEAR) {
            memset(epd_ref_state(e, pool, l, seq->state_slot), 0, e->info.kv.state_bytes);
        }
    }
}

const epd_engine_ops_t epd__ref_ops = {
    .size = sizeof(epd_engine_ops_t),
    .abi_version = EPD_ENGINE_ABI_VERSION,
    .name = "ref",
    .open = epd_ref_open,
    .close = epd_ref_close,
    .describe = epd_ref_describe,
    .tokenize = epd_ref_tokenize,
    .detokenize = epd_ref_detokenize,
    .prefill = epd__ref_prefill,
    .decode = epd__ref_decode,
    .release = epd_ref_release,
    .encode_image = epd__ref_encode_image,
};
