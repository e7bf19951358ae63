/*
 * epd_ref.c — the `ref` engine: a real (small) hybrid transformer on the CPU.
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
#include "epd_kvq.h"
#include "epd_hash.h"
#include "epd_log.h"
#include "epd_ref_model.h"
#include "epd_safetensors.h"

#define EPD_REF_LOG "ref"
/* prefill: rows of every matrix product (and attention query tile), aligned
 * to absolute positions; keys per attention product, aligned to 0 (see
 * "Split invariance" below) */
#define EPD_REF_TILE 64
#define EPD_REF_KTILE 64

typedef struct {
    const float *in_norm; /* [dim] */
    const float *wq;      /* [heads*hd, dim] */
    const float *wk;      /* [kv_heads*hd, dim] (linear: [heads*hd, dim]) */
    const float *wv;
    const float *wo;        /* [dim, heads*hd] */
    const float *post_norm; /* [dim] */
    const float *gate;      /* [ffn, dim] */
    const float *up;        /* [ffn, dim] */
    const float *down;      /* [dim, ffn] */
} epd_ref_layer_t;

/* The tensors of one vision block, in epd_ref_model.h's order. */
enum {
    EPD_REF_V_N1W,
    EPD_REF_V_N1B,
    EPD_REF_V_QW,
    EPD_REF_V_QB,
    EPD_REF_V_KW,
    EPD_REF_V_KB,
    EPD_REF_V_VW,
    EPD_REF_V_VB,
    EPD_REF_V_OW,
    EPD_REF_V_OB,
    EPD_REF_V_N2W,
    EPD_REF_V_N2B,
    EPD_REF_V_FC1W,
    EPD_REF_V_FC1B,
    EPD_REF_V_FC2W,
    EPD_REF_V_FC2B,
};

typedef struct {
    const float *t[EPD_REF_VISION_PER_BLOCK]; /* [D, D] maps, [D] / [ffn] vectors */
} epd_ref_vblock_t;

/* The vision encoder's weights (NULL pointers without vision). */
typedef struct {
    const float *patch_w;     /* [D, P*P*3] */
    const float *patch_b;     /* [D] */
    const float *pos;         /* [N, D] */
    epd_ref_vblock_t *blocks; /* [vision layers] */
    const float *post_w;      /* [D] */
    const float *post_b;
    const float *m0_w; /* [m*m*D, m*m*D] */
    const float *m0_b;
    const float *m2_w; /* [dim, m*m*D] */
    const float *m2_b; /* [dim] */
} epd_ref_vision_t;

struct epd_engine_impl {
    epd_ref_hparams_t hp;
    epd_engine_info_t info;
    float *weights;          /* every tensor, canonical order */
    const float *embed;      /* [vocab, dim] */
    const float *final_norm; /* [dim] */
    const float *lm_head;    /* [vocab, dim] */
    epd_ref_layer_t *layers; /* [n_layers] */
    epd_ref_vision_t vis;
    float *rope_cos;         /* [max_context][hd/2] */
    float *rope_sin;
    float *decay; /* [heads] */
    uint8_t digest[16]; /* info.model_digest (epd_ref_digest) */
    /* decode scratch, [max_batch][...] */
    float *d_x;
    float *d_h;
    float *d_q;
    float *d_k;
    float *d_v;
    float *d_o;
    float *d_g;
    float *d_u;
    float *d_scores; /* [max_context] */
};

/* ---- kernels ------------------------------------------------------------ */

/* Y[rows, out] (ldy) = (beta ? Y : 0) + X[rows, in] (ldx) * W[out, in]^T */
static void epd_ref_matmul(const float *x, int ldx, int rows, int in, const float *w, int out,
                           float *y, int ldy, float beta)
{
    if (rows == 1) {
        /* one row (decode of one request, the last prefill position): a
         * matrix-vector product, which OpenBLAS runs faster than sgemm */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x, 1, beta, y, 1);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x, ldx, w, in, beta,
                y, ldy);
}

/* The same product one row at a time: row b's result does not depend on
 * how many rows share the call.  Decode uses it so that a request's logits
 * are the same whether it runs alone or in a batch of any size (sgemm's
 * summation order differs from sgemv's and with the row count, and a
 * seeded sample at a near-tie would follow that difference). */
static void epd_ref_matmul_rows(const float *x, int ldx, int rows, int in, const float *w, int out,
                                float *y, int ldy, float beta)
{
    for (int b = 0; b < rows; b++) {
        epd_ref_matmul(x + (size_t)b * (size_t)ldx, ldx, 1, in, w, out, y + (size_t)b * (size_t)ldy,
                       ldy, beta);
    }
}

static void epd_ref_rmsnorm(const float *x, const float *w, uint32_t dim, double eps, float *out)
{
    double ss = 0.0;
    float r;

    for (uint32_t i = 0; i < dim; i++) {
        ss += (double)x[i] * x[i];
    }
    r = (float)(1.0 / sqrt(ss / dim + eps));
    for (uint32_t i = 0; i < dim; i++) {
        out[i] = x[i] * r * w[i];
    }
}

/* Rotates the n_heads heads of vec (head_dim each) for position pos. */
static void epd_ref_rope(const struct epd_engine_impl *e, float *vec, uint32_t n_heads,
                         uint32_t pos)
{
    uint32_t hd = e->hp.head_dim;
    uint32_t half = hd / 2;
    const float *c = e->rope_cos + (size_t)pos * half;
    const float *s = e->rope_sin + (size_t)pos * half;

    for (uint32_t h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * hd;

        for (uint32_t i = 0; i < half; i++) {
            float x0 = v[i];
            float x1 = v[i + half];

            v[i] = x0 * c[i] - x1 * s[i];
            v[i + half] = x0 * s[i] + x1 * c[i];
        }
    }
}

static inline float epd_ref_phi(float u)
{
    return u > 0.0f ? u + 1.0f : expf(u);
}

static inline float epd_ref_silu(float u)
{
    return u / (1.0f + expf(-u));
}

/* The block of attention layer `layer` holding position `pos` (arguments
 * were validated by epd_engine_*). */
static inline void *epd_ref_kv_block(const struct epd_engine_impl *e, const epd_kv_pool_t *pool, uint32_t layer,
                                   const epd_kv_seq_t *seq, uint32_t pos)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint64_t off = 0;

    (void)epd_kv_block_offset(kv, pool->n_blocks, layer, seq->block_table[pos / kv->block_tokens],
                              &off);
    return (char *)pool->base + off;
}

/* K (or V when v) row of (kv head, position) of layer `layer`, quantized to
 * the layer's KV dtype on the way in (epd_kvq.h), dequantized on the way
 * out: attention always reads what the pool holds, so a disaggregated run
 * (the bytes moved) and a colocated one compute the same. */
static inline void epd_ref_kv_put(const struct epd_engine_impl *e, const epd_kv_pool_t *pool, uint32_t layer,
                                  const epd_kv_seq_t *seq, uint32_t kvh, uint32_t pos, int v,
                                  const float *x)
{
    epd_kvq_row_put(&e->info.kv, layer, epd_ref_kv_block(e, pool, layer, seq, pos), v, kvh,
                    pos % e->info.kv.block_tokens, x);
}

static inline void epd_ref_kv_get(const struct epd_engine_impl *e, const epd_kv_pool_t *pool, uint32_t layer,
                                  const epd_kv_seq_t *seq, uint32_t kvh, uint32_t pos, int v,
                                  float *out)
{
    epd_kvq_row_get(&e->info.kv, layer, epd_ref_kv_block(e, pool, layer, seq, pos), v, kvh,
                    pos % e->info.kv.block_tokens, out);
}

static inline void epd_ref_kv_zero(const struct epd_engine_impl *e, const epd_kv_pool_t *pool, uint32_t layer,
                                   const epd_kv_seq_t *seq, uint32_t kvh, uint32_t pos, int v)
{
    epd_kvq_row_zero(&e->info.kv, layer, epd_ref_kv_block(e, pool, layer, seq, pos), v, kvh,
                     pos % e->info.kv.block_tokens);
}

static inline float *epd_ref_state(const struct epd_engine_impl *e, const epd_kv_pool_t *pool,
                                   uint32_t layer, uint32_t slot)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint64_t off = (uint64_t)pool->n_blocks * epd_kv_block_set_bytes(kv) +
                   ((uint64_t)kv->kind_index[layer] * pool->n_state_slots + slot) * kv->state_bytes;

    return (float *)((char *)pool->base + off);
}

/* One linear-attention step for all heads: updates state (S, z per head),
 * writes the output of the token to o[heads*hd]. */
static void epd_ref_linear_step(const struct epd_engine_impl *e, float *state, const float *q,
                                const float *k, const float *v, float *o)
{
    uint32_t hd = e->hp.head_dim;

    for (uint32_t h = 0; h < e->hp.n_heads; h++) {
        float *S = state + (size_t)h * (hd * hd + hd); /* [hd][hd] */
        float *z = S + (size_t)hd * hd;                /* [hd] */
        const float *qh = q + (size_t)h * hd;
        const float *kh = k + (size_t)h * hd;
        const float *vh = v + (size_t)h * hd;
        float *oh = o + (size_t)h * hd;
        float g = e->decay[h];
        float den = 0.0f;
        float pq[1024];

        for (uint32_t i = 0; i < hd; i++) {
            float pk = epd_ref_phi(kh[i]);
            float *row = S + (size_t)i * hd;

            for (uint32_t j = 0; j < hd; j++) {
                row[j] = g * row[j] + pk * vh[j];
            }
            z[i] = g * z[i] + pk;
            pq[i] = epd_ref_phi(qh[i]);
            den += pq[i] * z[i];
        }
        den += (float)EPD_REF_LINEAR_EPS;
        for (uint32_t j = 0; j < hd; j++) {
            oh[j] = 0.0f;
        }
        for (uint32_t i = 0; i < hd; i++) {
            const float *row = S + (size_t)i * hd;
            float w = pq[i] / den;

            for (uint32_t j = 0; j < hd; j++) {
                oh[j] += w * row[j];
            }
        }
    }
}

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
        const float **tail[6] = {&v->post_w, &v->post_b, &v->m0_w,
                                 &v->m0_b,   &v->m2_w,   &v->m2_b};

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

/* ---- prefill ------------------------------------------------------------ */

/*
 * Split invariance.  A prefix cache reuses the KV of one request's prompt in
 * another whose prefill starts where the cached blocks end, so the bytes of
 * position p must not depend on how the prompt was cut into calls.  BLAS
 * does not promise that: OpenBLAS picks its kernel (a small-matrix one, the
 * blocked one, gemv for one row) and its blocking of the inner dimension
 * from the shapes of the call, and each choice rounds differently.  So every
 * product here has a shape that depends on nothing but the model: rows in
 * tiles of EPD_REF_TILE aligned to absolute positions (a chunk's first and
 * last tiles are padded with zero rows: position p is always row p %
 * EPD_REF_TILE of a call of the same shape), attention keys in chunks of
 * EPD_REF_KTILE aligned to position 0 (the scores of a query row beyond its
 * last key are exact zeros, and adding a chunk of zeros adds +0).  A
 * product's rows never mix, so row p of a call sees the same inputs and the
 * same kernel whatever the other rows hold.  The cost is the padding rows
 * (up to 2 x (EPD_REF_TILE - 1) per call) and one weight packing per tile
 * instead of per call: engine/README.md has the measurement.
 */

typedef struct {
    uint32_t base; /* position of row 0: start rounded down to a tile */
    uint32_t rows; /* padded rows, a multiple of EPD_REF_TILE */
    uint32_t keys; /* padded keys: start + n_tokens rounded up to a key tile */
    float *x;      /* [rows][dim] residual stream (padding rows stay 0) */
    float *h;      /* [rows][dim] normed */
    float *q;      /* [rows][heads*hd] */
    float *k;      /* [rows][heads*hd] (attention layers use [rows][kv_heads*hd]) */
    float *v;
    float *o;  /* [rows][heads*hd] mixer output before o_proj */
    float *g;  /* [TILE][ffn] */
    float *u;  /* [TILE][ffn] */
    float *kg; /* [keys][hd] one kv head's K, gathered, zero past the context */
    float *vg; /* [keys][hd] */
    float *s;  /* [TILE][keys] scores */
} epd_ref_act_t;

static void epd_ref_act_free(epd_ref_act_t *a)
{
    epd_free(a->x);
    epd_free(a->h);
    epd_free(a->q);
    epd_free(a->k);
    epd_free(a->v);
    epd_free(a->o);
    epd_free(a->g);
    epd_free(a->u);
    epd_free(a->kg);
    epd_free(a->vg);
    epd_free(a->s);
}

static epd_status_t epd_ref_act_alloc(const epd_engine_impl_t *e, uint32_t start, uint32_t T,
                                      epd_ref_act_t *a)
{
    size_t dim = e->hp.dim;
    size_t qd = (size_t)e->hp.n_heads * e->hp.head_dim;
    uint32_t end = start + T;
    size_t R;

    memset(a, 0, sizeof(*a));
    a->base = start - start % EPD_REF_TILE;
    a->rows = (end - a->base + EPD_REF_TILE - 1) / EPD_REF_TILE * EPD_REF_TILE;
    a->keys = (end + EPD_REF_KTILE - 1) / EPD_REF_KTILE * EPD_REF_KTILE;
    R = a->rows;
    /* zeroed: the padding rows are zero vectors through every layer */
    a->x = epd_calloc(R * dim, sizeof(float));
    a->h = epd_malloc(R * dim * sizeof(float));
    a->q = epd_calloc(R * qd, sizeof(float));
    a->k = epd_malloc(R * qd * sizeof(float));
    a->v = epd_malloc(R * qd * sizeof(float));
    a->o = epd_calloc(R * qd, sizeof(float));
    a->g = epd_malloc((size_t)EPD_REF_TILE * e->hp.ffn * sizeof(float));
    a->u = epd_malloc((size_t)EPD_REF_TILE * e->hp.ffn * sizeof(float));
    if (e->info.kv.n_attn_layers > 0) {
        a->kg = epd_calloc((size_t)a->keys * e->hp.head_dim, sizeof(float));
        a->vg = epd_calloc((size_t)a->keys * e->hp.head_dim, sizeof(float));
        a->s = epd_malloc((size_t)EPD_REF_TILE * a->keys * sizeof(float));
    }
    if (a->x == NULL || a->h == NULL || a->q == NULL || a->k == NULL || a->v == NULL ||
        a->o == NULL || a->g == NULL || a->u == NULL ||
        (e->info.kv.n_attn_layers > 0 && (a->kg == NULL || a->vg == NULL || a->s == NULL))) {
        epd_ref_act_free(a);
        return EPD_ERR_NO_MEMORY;
    }
    return EPD_OK;
}

/* Y[rows, out] (ldy) = (beta ? Y : 0) + X[rows, in] (ldx) * W[out, in]^T, one
 * sgemm per EPD_REF_TILE rows (rows is a multiple of it): the same call
 * shape for every tile, whatever the chunk (see "Split invariance"). */
static void epd_ref_matmul_tiles(const float *x, int ldx, uint32_t rows, int in, const float *w,
                                 int out, float *y, int ldy, float beta)
{
    for (uint32_t t0 = 0; t0 < rows; t0 += EPD_REF_TILE) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, EPD_REF_TILE, out, in, 1.0f,
                    x + (size_t)t0 * ldx, ldx, w, in, beta, y + (size_t)t0 * ldy, ldy);
    }
}

/* Causal attention of the chunk's queries over every cached key (layer l),
 * into a->o for every row of the chunk's tiles (padding rows get zeros). */
static void epd_ref_prefill_attention(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                      uint32_t l, const epd_prefill_args_t *args, epd_ref_act_t *a)
{
    uint32_t hd = e->hp.head_dim;
    uint32_t qd = e->hp.n_heads * hd;
    uint32_t group = e->hp.n_heads / e->hp.n_kv_heads;
    uint32_t start = args->start;
    uint32_t end = start + args->n_tokens;
    float scale = (float)(1.0 / sqrt((double)hd));

    for (uint32_t kvh = 0; kvh < e->hp.n_kv_heads; kvh++) {
        /* rows [end, a->keys) stay zero from the allocation */
        for (uint32_t p = 0; p < end; p++) {
            epd_ref_kv_get(e, pool, l, &args->seq, kvh, p, 0, a->kg + (size_t)p * hd);
            epd_ref_kv_get(e, pool, l, &args->seq, kvh, p, 1, a->vg + (size_t)p * hd);
        }
        for (uint32_t hq = kvh * group; hq < (kvh + 1) * group; hq++) {
            for (uint32_t r0 = 0; r0 < a->rows; r0 += EPD_REF_TILE) {
                uint32_t p0 = a->base + r0; /* the tile's first position */
                uint32_t last = p0 + EPD_REF_TILE < end ? p0 + EPD_REF_TILE : end;
                /* key chunks the tile's last real row may see */
                uint32_t kt = (last + EPD_REF_KTILE - 1) / EPD_REF_KTILE;
                uint32_t ld = kt * EPD_REF_KTILE;
                float *o = a->o + (size_t)r0 * qd + (size_t)hq * hd;

                /* s[TILE][ld] = Q_tile K^T * scale, one key chunk per call */
                for (uint32_t c = 0; c < kt; c++) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, EPD_REF_TILE,
                                EPD_REF_KTILE, (int)hd, scale,
                                a->q + (size_t)r0 * qd + (size_t)hq * hd, (int)qd,
                                a->kg + (size_t)c * EPD_REF_KTILE * hd, (int)hd, 0.0f,
                                a->s + (size_t)c * EPD_REF_KTILE, (int)ld);
                }
                for (uint32_t r = 0; r < EPD_REF_TILE; r++) {
                    uint32_t p = p0 + r;
                    float *srow = a->s + (size_t)r * ld;
                    uint32_t lim = p + 1;
                    float mx;
                    float sum = 0.0f;

                    if (p < start || p >= end) {
                        memset(srow, 0, ld * sizeof(float)); /* a padding row */
                        continue;
                    }
                    mx = srow[0];
                    for (uint32_t j = 1; j < lim; j++) {
                        mx = srow[j] > mx ? srow[j] : mx;
                    }
                    for (uint32_t j = 0; j < lim; j++) {
                        srow[j] = expf(srow[j] - mx);
                        sum += srow[j];
                    }
                    for (uint32_t j = 0; j < lim; j++) {
                        srow[j] /= sum;
                    }
                    for (uint32_t j = lim; j < ld; j++) {
                        srow[j] = 0.0f;
                    }
                }
                /* o_tile[TILE][hd] = s V, accumulated one key chunk at a time */
                for (uint32_t c = 0; c < kt; c++) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, EPD_REF_TILE, (int)hd,
                                EPD_REF_KTILE, 1.0f, a->s + (size_t)c * EPD_REF_KTILE, (int)ld,
                                a->vg + (size_t)c * EPD_REF_KTILE * hd, (int)hd,
                                c == 0 ? 0.0f : 1.0f, o, (int)qd);
                }
            }
        }
    }
}

/* One linear layer over the chunk: the recurrence through every position
 * (replayed ones too), state checkpoints as they pass. */
static void epd_ref_prefill_linear(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                   uint32_t l, const epd_prefill_args_t *args, epd_ref_act_t *a)
{
    const epd_kv_layout_t *kv = &e->info.kv;
    uint32_t qd = e->hp.n_heads * e->hp.head_dim;
    float *state = epd_ref_state(e, pool, l, args->seq.state_slot);
    uint32_t ci = 0;

    if (args->start == 0) {
        memset(state, 0, kv->state_bytes);
    }
    for (uint32_t t = 0; t < args->n_tokens; t++) {
        size_t r = (size_t)(args->start + t - a->base);

        epd_ref_linear_step(e, state, a->q + r * qd, a->k + r * qd, a->v + r * qd, a->o + r * qd);
        if (ci < args->n_ckpts && args->ckpts[ci].pos == args->start + t + 1) {
            memcpy((char *)args->ckpts[ci].dst + (size_t)kv->kind_index[l] * kv->state_bytes,
                   state, kv->state_bytes);
            ci++;
        }
    }
}

static epd_status_t epd_ref_prefill(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                    const epd_prefill_args_t *args, const epd_engine_sink_t *sink,
                                    float *logits)
{
    const epd_ref_hparams_t *hp = &e->hp;
    const epd_kv_layout_t *kv = &e->info.kv;
    uint32_t T = args->n_tokens;
    uint32_t start = args->start;
    uint32_t end = start + T;
    /* replayed positions keep the KV the cache gave them */
    uint32_t kv_from = args->replay_end > start ? args->replay_end : start;
    uint32_t dim = hp->dim;
    uint32_t hd = hp->head_dim;
    uint32_t qd = hp->n_heads * hd;
    uint32_t kvd = hp->n_kv_heads * hd;
    epd_ref_act_t a;
    epd_status_t status;

    status = epd_ref_act_alloc(e, start, T, &a);
    if (status != EPD_OK) {
        epd_log_error(EPD_REF_LOG, args->seq.req_id, "prefill of %u tokens: out of memory", T);
        return status;
    }
    for (uint32_t t = 0; t < T; t++) {
        memcpy(a.x + (size_t)(start + t - a.base) * dim, e->embed + (size_t)args->tokens[t] * dim,
               dim * sizeof(float));
    }
    /* Image embeddings over their placeholders: only the rows inside this
     * chunk (the spans were checked by epd_engine_prefill). */
    for (uint32_t i = 0; i < args->n_embeds; i++) {
        const epd_embed_span_t *sp = &args->embeds[i];
        uint64_t lo = sp->pos > start ? sp->pos : start;
        uint64_t hi = (uint64_t)sp->pos + sp->n < (uint64_t)end ? (uint64_t)sp->pos + sp->n
                                                                 : (uint64_t)end;

        for (uint64_t p = lo; p < hi; p++) {
            memcpy(a.x + (size_t)(p - a.base) * dim, sp->data + (size_t)(p - sp->pos) * dim,
                   dim * sizeof(float));
        }
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const epd_ref_layer_t *L = &e->layers[l];
        epd_layer_done_t done;

        for (uint32_t r = 0; r < a.rows; r++) {
            epd_ref_rmsnorm(a.x + (size_t)r * dim, L->in_norm, dim, hp->rms_eps,
                            a.h + (size_t)r * dim);
        }
        memset(&done, 0, sizeof(done));
        done.req_id = args->seq.req_id;
        done.layer = l;
        done.kind = (epd_layer_kind_t)kv->kind[l];
        done.tok_start = start;
        done.tok_end = end;
        if (kv->kind[l] == EPD_LAYER_ATTENTION) {
            epd_ref_matmul_tiles(a.h, dim, a.rows, dim, L->wq, qd, a.q, qd, 0.0f);
            epd_ref_matmul_tiles(a.h, dim, a.rows, dim, L->wk, kvd, a.k, kvd, 0.0f);
            epd_ref_matmul_tiles(a.h, dim, a.rows, dim, L->wv, kvd, a.v, kvd, 0.0f);
            for (uint32_t p = start; p < end; p++) {
                size_t r = p - a.base;

                epd_ref_rope(e, a.q + r * qd, hp->n_heads, p);
                if (p < kv_from) {
                    continue;
                }
                epd_ref_rope(e, a.k + r * kvd, hp->n_kv_heads, p);
                for (uint32_t kvh = 0; kvh < hp->n_kv_heads; kvh++) {
                    epd_ref_kv_put(e, pool, l, &args->seq, kvh, p, 0, a.k + r * kvd + (size_t)kvh * hd);
                    epd_ref_kv_put(e, pool, l, &args->seq, kvh, p, 1, a.v + r * kvd + (size_t)kvh * hd);
                }
            }
            /* the rest of the chunk's last block holds nobody's KV: the
             * whole block may be written elsewhere (epd_engine_prefill) */
            for (uint32_t p = start + T; p % kv->block_tokens != 0; p++) {
                for (uint32_t kvh = 0; kvh < hp->n_kv_heads; kvh++) {
                    epd_ref_kv_zero(e, pool, l, &args->seq, kvh, p, 0);
                    epd_ref_kv_zero(e, pool, l, &args->seq, kvh, p, 1);
                }
            }
            /* The layer's KV is final now: let the transfer start while the
             * attention itself (and the next layers) compute. */
            done.tok_start = kv_from;
            done.first_block = kv_from / kv->block_tokens;
            done.n_blocks = (end - 1) / kv->block_tokens - done.first_block + 1;
            done.block_ids = args->seq.block_table + done.first_block;
            if (sink != NULL && sink->cb != NULL) {
                status = sink->cb(sink->ctx, l, &done);
                if (status != EPD_OK) {
                    goto out;
                }
            }
            epd_ref_prefill_attention(e, pool, l, args, &a);
        } else {
            epd_ref_matmul_tiles(a.h, dim, a.rows, dim, L->wq, qd, a.q, qd, 0.0f);
            epd_ref_matmul_tiles(a.h, dim, a.rows, dim, L->wk, qd, a.k, qd, 0.0f);
            epd_ref_matmul_tiles(a.h, dim, a.rows, dim, L->wv, qd, a.v, qd, 0.0f);
            /* padding rows: no step, a zero output (the attention layers
             * before wrote zeros there too) */
            epd_ref_prefill_linear(e, pool, l, args, &a);
            done.state_slot = args->seq.state_slot;
            if (sink != NULL && sink->cb != NULL) {
                status = sink->cb(sink->ctx, l, &done);
                if (status != EPD_OK) {
                    goto out;
                }
            }
        }
        epd_ref_matmul_tiles(a.o, qd, a.rows, qd, L->wo, dim, a.x, dim, 1.0f);
        for (uint32_t r = 0; r < a.rows; r++) {
            epd_ref_rmsnorm(a.x + (size_t)r * dim, L->post_norm, dim, hp->rms_eps,
                            a.h + (size_t)r * dim);
        }
        for (uint32_t t0 = 0; t0 < a.rows; t0 += EPD_REF_TILE) {
            epd_ref_matmul_tiles(a.h + (size_t)t0 * dim, dim, EPD_REF_TILE, dim, L->gate, hp->ffn,
                                 a.g, hp->ffn, 0.0f);
            epd_ref_matmul_tiles(a.h + (size_t)t0 * dim, dim, EPD_REF_TILE, dim, L->up, hp->ffn,
                                 a.u, hp->ffn, 0.0f);
            for (size_t i = 0; i < (size_t)EPD_REF_TILE * hp->ffn; i++) {
                a.g[i] = epd_ref_silu(a.g[i]) * a.u[i];
            }
            epd_ref_matmul_tiles(a.g, hp->ffn, EPD_REF_TILE, hp->ffn, L->down, dim,
                                 a.x + (size_t)t0 * dim, dim, 1.0f);
        }
    }
    epd_ref_rmsnorm(a.x + (size_t)(end - 1 - a.base) * dim, e->final_norm, dim, hp->rms_eps, a.h);
    epd_ref_matmul(a.h, dim, 1, dim, e->lm_head, hp->vocab, logits, hp->vocab, 0.0f);
    status = EPD_OK;
out:
    epd_ref_act_free(&a);
    return status;
}

/* ---- decode ------------------------------------------------------------- */

static void epd_ref_decode_attention(epd_engine_impl_t *e, const epd_kv_pool_t *pool, uint32_t l,
                                     const epd_decode_req_t *r, const float *q, float *o)
{
    uint32_t hd = e->hp.head_dim;
    uint32_t group = e->hp.n_heads / e->hp.n_kv_heads;
    uint32_t n = r->pos + 1;
    float scale = (float)(1.0 / sqrt((double)hd));
    float *s = e->d_scores;

    for (uint32_t hq = 0; hq < e->hp.n_heads; hq++) {
        const float *qh = q + (size_t)hq * hd;
        float *oh = o + (size_t)hq * hd;
        uint32_t kvh = hq / group;
        float mx = -INFINITY;
        float sum = 0.0f;

        for (uint32_t p = 0; p < n; p++) {
            float k[EPD_KVQ_MAX_HEAD_DIM];

            epd_ref_kv_get(e, pool, l, &r->seq, kvh, p, 0, k);
            float d = 0.0f;

            for (uint32_t i = 0; i < hd; i++) {
                d += qh[i] * k[i];
            }
            s[p] = d * scale;
            mx = s[p] > mx ? s[p] : mx;
        }
        for (uint32_t p = 0; p < n; p++) {
            s[p] = expf(s[p] - mx);
            sum += s[p];
        }
        for (uint32_t i = 0; i < hd; i++) {
            oh[i] = 0.0f;
        }
        for (uint32_t p = 0; p < n; p++) {
            float v[EPD_KVQ_MAX_HEAD_DIM];

            epd_ref_kv_get(e, pool, l, &r->seq, kvh, p, 1, v);
            float w = s[p] / sum;

            for (uint32_t i = 0; i < hd; i++) {
                oh[i] += w * v[i];
            }
        }
    }
}

static epd_status_t epd_ref_decode(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                   const epd_decode_req_t *reqs, uint32_t B, float *logits)
{
    const epd_ref_hparams_t *hp = &e->hp;
    const epd_kv_layout_t *kv = &e->info.kv;
    uint32_t dim = hp->dim;
    uint32_t hd = hp->head_dim;
    uint32_t qd = hp->n_heads * hd;
    uint32_t kvd = hp->n_kv_heads * hd;

    for (uint32_t b = 0; b < B; b++) {
        memcpy(e->d_x + (size_t)b * dim, e->embed + (size_t)reqs[b].token * dim,
               dim * sizeof(float));
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const epd_ref_layer_t *L = &e->layers[l];
        int attn = kv->kind[l] == EPD_LAYER_ATTENTION;
        uint32_t kd = attn ? kvd : qd;

        for (uint32_t b = 0; b < B; b++) {
            epd_ref_rmsnorm(e->d_x + (size_t)b * dim, L->in_norm, dim, hp->rms_eps,
                            e->d_h + (size_t)b * dim);
        }
        epd_ref_matmul_rows(e->d_h, dim, B, dim, L->wq, qd, e->d_q, qd, 0.0f);
        epd_ref_matmul_rows(e->d_h, dim, B, dim, L->wk, kd, e->d_k, kd, 0.0f);
        epd_ref_matmul_rows(e->d_h, dim, B, dim, L->wv, kd, e->d_v, kd, 0.0f);
        for (uint32_t b = 0; b < B; b++) {
            const epd_decode_req_t *r = &reqs[b];
            float *q = e->d_q + (size_t)b * qd;
            float *k = e->d_k + (size_t)b * kd;
            float *v = e->d_v + (size_t)b * kd;
            float *o = e->d_o + (size_t)b * qd;

            if (attn) {
                epd_ref_rope(e, q, hp->n_heads, r->pos);
                epd_ref_rope(e, k, hp->n_kv_heads, r->pos);
                for (uint32_t kvh = 0; kvh < hp->n_kv_heads; kvh++) {
                    epd_ref_kv_put(e, pool, l, &r->seq, kvh, r->pos, 0, k + (size_t)kvh * hd);
                    epd_ref_kv_put(e, pool, l, &r->seq, kvh, r->pos, 1, v + (size_t)kvh * hd);
                }
                epd_ref_decode_attention(e, pool, l, r, q, o);
            } else {
                epd_ref_linear_step(e, epd_ref_state(e, pool, l, r->seq.state_slot), q, k, v, o);
            }
        }
        epd_ref_matmul_rows(e->d_o, qd, B, qd, L->wo, dim, e->d_x, dim, 1.0f);
        for (uint32_t b = 0; b < B; b++) {
            epd_ref_rmsnorm(e->d_x + (size_t)b * dim, L->post_norm, dim, hp->rms_eps,
                            e->d_h + (size_t)b * dim);
        }
        epd_ref_matmul_rows(e->d_h, dim, B, dim, L->gate, hp->ffn, e->d_g, hp->ffn, 0.0f);
        epd_ref_matmul_rows(e->d_h, dim, B, dim, L->up, hp->ffn, e->d_u, hp->ffn, 0.0f);
        for (size_t i = 0; i < (size_t)B * hp->ffn; i++) {
            e->d_g[i] = epd_ref_silu(e->d_g[i]) * e->d_u[i];
        }
        epd_ref_matmul_rows(e->d_g, hp->ffn, B, hp->ffn, L->down, dim, e->d_x, dim, 1.0f);
    }
    for (uint32_t b = 0; b < B; b++) {
        epd_ref_rmsnorm(e->d_x + (size_t)b * dim, e->final_norm, dim, hp->rms_eps,
                        e->d_h + (size_t)b * dim);
    }
    epd_ref_matmul_rows(e->d_h, dim, B, dim, e->lm_head, hp->vocab, logits, hp->vocab, 0.0f);
    return EPD_OK;
}

/* ---- vision encoder ------------------------------------------------------ */

static inline float epd_ref_gelu(float u)
{
    return 0.5f * u * (1.0f + erff(u * 0.70710678118654752f));
}

static void epd_ref_layernorm(const float *x, const float *w, const float *b, uint32_t n,
                              double eps, float *out)
{
    double sum = 0.0;
    double ss = 0.0;
    double mean;
    float r;
    float m;

    for (uint32_t i = 0; i < n; i++) {
        sum += x[i];
    }
    mean = sum / n;
    for (uint32_t i = 0; i < n; i++) {
        double d = x[i] - mean;

        ss += d * d;
    }
    r = (float)(1.0 / sqrt(ss / n + eps));
    m = (float)mean;
    for (uint32_t i = 0; i < n; i++) {
        out[i] = (x[i] - m) * r * w[i] + b[i];
    }
}

/* y[rows][out] = x[rows][in] W^T + b  (or y += that when accumulate) */
static void epd_ref_linear(const float *x, uint32_t rows, uint32_t in, const float *w,
                           const float *b, uint32_t out, float *y, int accumulate)
{
    for (uint32_t r = 0; r < rows; r++) {
        float *yr = y + (size_t)r * out;

        if (accumulate) {
            for (uint32_t i = 0; i < out; i++) {
                yr[i] += b[i];
            }
        } else {
            memcpy(yr, b, out * sizeof(float));
        }
    }
    epd_ref_matmul(x, (int)in, (int)rows, (int)in, w, (int)out, y, (int)out, 1.0f);
}

typedef struct {
    float *x;  /* [N][P*P*3] patches of the resized image, in [-1, 1] */
    float *h;  /* [N][D] residual stream */
    float *u;  /* [N][D] normed */
    float *q;  /* [N][D] */
    float *k;  /* [N][D] */
    float *v;  /* [N][D] */
    float *o;  /* [N][D] attention output before o_proj */
    float *s;  /* [N][N] one head's scores */
    float *f;  /* [N][ffn] */
    float *z;  /* [E][m*m*D] merged patches */
    float *zt; /* [E][m*m*D] projector hidden */
    uint32_t *ix; /* [S][2] source columns x0, x1 of each output column */
    uint32_t *iy; /* [S][2] source rows */
    float *fx;    /* [S] weight of x1 */
    float *fy;    /* [S] */
} epd_ref_vact_t;

static void epd_ref_vact_free(epd_ref_vact_t *a)
{
    epd_free(a->x);
    epd_free(a->h);
    epd_free(a->u);
    epd_free(a->q);
    epd_free(a->k);
    epd_free(a->v);
    epd_free(a->o);
    epd_free(a->s);
    epd_free(a->f);
    epd_free(a->z);
    epd_free(a->zt);
    epd_free(a->ix);
    epd_free(a->iy);
    epd_free(a->fx);
    epd_free(a->fy);
}

static epd_status_t epd_ref_vact_alloc(const epd_engine_impl_t *e, epd_ref_vact_t *a)
{
    const epd_ref_vision_hparams_t *vh = &e->hp.vision;
    size_t N = epd_ref_vision_patches(&e->hp);
    size_t E = epd_ref_image_embeddings(&e->hp);
    size_t D = vh->dim;
    size_t S = vh->image_size;
    size_t md = epd_ref_vision_merged_dim(&e->hp);

    memset(a, 0, sizeof(*a));
    a->x = epd_malloc(S * S * 3 * sizeof(float));
    a->h = epd_malloc(N * D * sizeof(float));
    a->u = epd_malloc(N * D * sizeof(float));
    a->q = epd_malloc(N * D * sizeof(float));
    a->k = epd_malloc(N * D * sizeof(float));
    a->v = epd_malloc(N * D * sizeof(float));
    a->o = epd_malloc(N * D * sizeof(float));
    a->s = epd_malloc(N * N * sizeof(float));
    a->f = epd_malloc(N * vh->ffn * sizeof(float));
    a->z = epd_malloc(E * md * sizeof(float));
    a->zt = epd_malloc(E * md * sizeof(float));
    a->ix = epd_malloc(S * 2 * sizeof(uint32_t));
    a->iy = epd_malloc(S * 2 * sizeof(uint32_t));
    a->fx = epd_malloc(S * sizeof(float));
    a->fy = epd_malloc(S * sizeof(float));
    if (a->x == NULL || a->h == NULL || a->u == NULL || a->q == NULL || a->k == NULL ||
        a->v == NULL || a->o == NULL || a->s == NULL || a->f == NULL || a->z == NULL ||
        a->zt == NULL || a->ix == NULL || a->iy == NULL || a->fx == NULL || a->fy == NULL) {
        epd_ref_vact_free(a);
        return EPD_ERR_NO_MEMORY;
    }
    return EPD_OK;
}

/* Bilinear taps of the S output samples over `src` source samples
 * (epd_ref_model.h: half-pixel centres, clamped). */
static void epd_ref_resize_taps(uint32_t src, uint32_t S, uint32_t *idx, float *frac)
{
    for (uint32_t o = 0; o < S; o++) {
        double sx = (o + 0.5) * (double)src / S - 0.5;
        uint32_t x0;

        sx = sx < 0.0 ? 0.0 : sx > src - 1.0 ? src - 1.0 : sx;
        x0 = (uint32_t)sx;
        idx[2 * o] = x0;
        idx[2 * o + 1] = x0 + 1 < src ? x0 + 1 : src - 1;
        frac[o] = (float)(sx - x0);
    }
}

/* Resizes `img` to S x S, scales to [-1, 1] and writes the patch matrix. */
static void epd_ref_patchify(const epd_engine_impl_t *e, const epd_image_view_t *img,
                             epd_ref_vact_t *a)
{
    uint32_t S = e->hp.vision.image_size;
    uint32_t P = e->hp.vision.patch_size;
    uint32_t g = S / P;
    size_t pdim = (size_t)P * P * 3;
    size_t stride = (size_t)img->width * 3;

    epd_ref_resize_taps(img->width, S, a->ix, a->fx);
    epd_ref_resize_taps(img->height, S, a->iy, a->fy);
    for (uint32_t oy = 0; oy < S; oy++) {
        const uint8_t *r0 = img->rgb + a->iy[2 * oy] * stride;
        const uint8_t *r1 = img->rgb + a->iy[2 * oy + 1] * stride;
        float wy = a->fy[oy];
        float *prow = a->x + ((size_t)(oy / P) * g) * pdim + (size_t)(oy % P) * P * 3;

        for (uint32_t ox = 0; ox < S; ox++) {
            size_t c0 = (size_t)a->ix[2 * ox] * 3;
            size_t c1 = (size_t)a->ix[2 * ox + 1] * 3;
            float wx = a->fx[ox];
            float *dst = prow + (size_t)(ox / P) * pdim + (size_t)(ox % P) * 3;

            for (uint32_t c = 0; c < 3; c++) {
                float top = (1.0f - wx) * r0[c0 + c] + wx * r0[c1 + c];
                float bot = (1.0f - wx) * r1[c0 + c] + wx * r1[c1 + c];

                dst[c] = ((1.0f - wy) * top + wy * bot) * (1.0f / 127.5f) - 1.0f;
            }
        }
    }
}

/* Full (bidirectional) multi-head attention over the N patches: o = attn(q, k, v). */
static void epd_ref_vision_attention(const epd_engine_impl_t *e, epd_ref_vact_t *a)
{
    uint32_t N = epd_ref_vision_patches(&e->hp);
    uint32_t D = e->hp.vision.dim;
    uint32_t hd = D / e->hp.vision.n_heads;
    float scale = (float)(1.0 / sqrt((double)hd));

    for (uint32_t h = 0; h < e->hp.vision.n_heads; h++) {
        /* s[N][N] = Q_h K_h^T * scale */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)N, (int)hd, scale,
                    a->q + (size_t)h * hd, (int)D, a->k + (size_t)h * hd, (int)D, 0.0f, a->s,
                    (int)N);
        for (uint32_t r = 0; r < N; r++) {
            float *row = a->s + (size_t)r * N;
            float mx = row[0];
            float sum = 0.0f;

            for (uint32_t j = 1; j < N; j++) {
                mx = row[j] > mx ? row[j] : mx;
            }
            for (uint32_t j = 0; j < N; j++) {
                row[j] = expf(row[j] - mx);
                sum += row[j];
            }
            for (uint32_t j = 0; j < N; j++) {
                row[j] /= sum;
            }
        }
        /* o_h[N][hd] = s V_h */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)hd, (int)N, 1.0f, a->s,
                    (int)N, a->v + (size_t)h * hd, (int)D, 0.0f, a->o + (size_t)h * hd, (int)D);
    }
}

static epd_status_t epd_ref_encode_image(epd_engine_impl_t *e, const epd_image_view_t *img,
                                         float *out)
{
    const epd_ref_hparams_t *hp = &e->hp;
    const epd_ref_vision_hparams_t *vh = &hp->vision;
    const epd_ref_vision_t *W = &e->vis;
    uint32_t N = epd_ref_vision_patches(hp);
    uint32_t D = vh->dim;
    uint32_t g = epd_ref_vision_grid(hp);
    uint32_t m = vh->merge;
    uint32_t gm = g / m;
    uint32_t md = epd_ref_vision_merged_dim(hp);
    uint32_t pdim = vh->patch_size * vh->patch_size * 3;
    epd_ref_vact_t a;
    epd_status_t status;

    if (!hp->has_vision) {
        return EPD_ERR_UNSUPPORTED;
    }
    status = epd_ref_vact_alloc(e, &a);
    if (status != EPD_OK) {
        epd_log_error(EPD_REF_LOG, 0, "image encode: out of memory");
        return status;
    }
    epd_ref_patchify(e, img, &a);
    epd_ref_linear(a.x, N, pdim, W->patch_w, W->patch_b, D, a.h, 0);
    for (size_t i = 0; i < (size_t)N * D; i++) {
        a.h[i] += W->pos[i];
    }
    for (uint32_t l = 0; l < vh->n_layers; l++) {
        const float *const *t = W->blocks[l].t;

        for (uint32_t n = 0; n < N; n++) {
            epd_ref_layernorm(a.h + (size_t)n * D, t[EPD_REF_V_N1W], t[EPD_REF_V_N1B], D,
                              vh->ln_eps, a.u + (size_t)n * D);
        }
        epd_ref_linear(a.u, N, D, t[EPD_REF_V_QW], t[EPD_REF_V_QB], D, a.q, 0);
        epd_ref_linear(a.u, N, D, t[EPD_REF_V_KW], t[EPD_REF_V_KB], D, a.k, 0);
        epd_ref_linear(a.u, N, D, t[EPD_REF_V_VW], t[EPD_REF_V_VB], D, a.v, 0);
        epd_ref_vision_attention(e, &a);
        epd_ref_linear(a.o, N, D, t[EPD_REF_V_OW], t[EPD_REF_V_OB], D, a.h, 1);
        for (uint32_t n = 0; n < N; n++) {
            epd_ref_layernorm(a.h + (size_t)n * D, t[EPD_REF_V_N2W], t[EPD_REF_V_N2B], D,
                              vh->ln_eps, a.u + (size_t)n * D);
        }
        epd_ref_linear(a.u, N, D, t[EPD_REF_V_FC1W], t[EPD_REF_V_FC1B], vh->ffn, a.f, 0);
        for (size_t i = 0; i < (size_t)N * vh->ffn; i++) {
            a.f[i] = epd_ref_gelu(a.f[i]);
        }
        epd_ref_linear(a.f, N, vh->ffn, t[EPD_REF_V_FC2W], t[EPD_REF_V_FC2B], D, a.h, 1);
    }
    /* final norm, written straight into the merged layout: embedding j
     * takes the m x m patches of merged cell (my, mx), dy major */
    for (uint32_t my = 0; my < gm; my++) {
        for (uint32_t mx = 0; mx < gm; mx++) {
            float *zj = a.z + ((size_t)my * gm + mx) * md;

            for (uint32_t dy = 0; dy < m; dy++) {
                for (uint32_t dx = 0; dx < m; dx++) {
                    size_t n = (size_t)(my * m + dy) * g + (mx * m + dx);

                    epd_ref_layernorm(a.h + n * D, W->post_w, W->post_b, D, vh->ln_eps,
                                      zj + ((size_t)dy * m + dx) * D);
                }
            }
        }
    }
    epd_ref_linear(a.z, gm * gm, md, W->m0_w, W->m0_b, md, a.zt, 0);
    for (size_t i = 0; i < (size_t)gm * gm * md; i++) {
        a.zt[i] = epd_ref_gelu(a.zt[i]);
    }
    epd_ref_linear(a.zt, gm * gm, md, W->m2_w, W->m2_b, hp->dim, out, 0);
    epd_ref_vact_free(&a);
    return EPD_OK;
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
    .prefill = epd_ref_prefill,
    .decode = epd_ref_decode,
    .release = epd_ref_release,
    .encode_image = epd_ref_encode_image,
};
