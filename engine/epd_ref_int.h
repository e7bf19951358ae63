/*
 * epd_ref_int.h — internals of the `ref` engine, shared by its files (not an
 * API: daemons include epd_engine.h only):
 *   epd_ref.c          open (weights, digest, info), tokenizer, release, ops
 *   epd_ref_kern.c     kernels: matmul, RMSNorm, RoPE, a linear-attention step
 *   epd_ref_forward.c  the language model's prefill and decode
 *   epd_ref_vision.c   the vision encoder (encode_image)
 * Calls go one way: epd_ref.c -> forward, vision -> kern.  The design is at
 * the top of epd_ref.c, the math in epd_ref_model.h.
 */
#ifndef EPD_REF_INT_H
#define EPD_REF_INT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_kvq.h"
#include "epd_ref_model.h"

#define EPD_REF_LOG "ref"
/* prefill: rows of every matrix product (and attention query tile), aligned
 * to absolute positions; keys per attention product, aligned to 0 (see
 * epd_ref_forward.c "Split invariance") */
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
    float *rope_cos; /* [max_context][hd/2] */
    float *rope_sin;
    float *decay;       /* [heads] */
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

/* ---- KV and state in the caller's pool, activations ----------------------
 * Inline: attention reads a row once per (position, kv head), and these
 * were static functions of one file before the split. */

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
static inline void *epd_ref_kv_block(const struct epd_engine_impl *e, const epd_kv_pool_t *pool,
                                     uint32_t layer, const epd_kv_seq_t *seq, uint32_t pos)
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
static inline void epd_ref_kv_put(const struct epd_engine_impl *e, const epd_kv_pool_t *pool,
                                  uint32_t layer, const epd_kv_seq_t *seq, uint32_t kvh,
                                  uint32_t pos, int v, const float *x)
{
    epd_kvq_row_put(&e->info.kv, layer, epd_ref_kv_block(e, pool, layer, seq, pos), v, kvh,
                    pos % e->info.kv.block_tokens, x);
}

static inline void epd_ref_kv_get(const struct epd_engine_impl *e, const epd_kv_pool_t *pool,
                                  uint32_t layer, const epd_kv_seq_t *seq, uint32_t kvh,
                                  uint32_t pos, int v, float *out)
{
    epd_kvq_row_get(&e->info.kv, layer, epd_ref_kv_block(e, pool, layer, seq, pos), v, kvh,
                    pos % e->info.kv.block_tokens, out);
}

static inline void epd_ref_kv_zero(const struct epd_engine_impl *e, const epd_kv_pool_t *pool,
                                   uint32_t layer, const epd_kv_seq_t *seq, uint32_t kvh,
                                   uint32_t pos, int v)
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

/* ---- kernels (epd_ref_kern.c) -------------------------------------------- */

/* Y[rows, out] (ldy) = (beta ? Y : 0) + X[rows, in] (ldx) * W[out, in]^T;
 * one row is a matrix-vector product. */
void epd__ref_matmul(const float *x, int ldx, int rows, int in, const float *w, int out, float *y,
                     int ldy, float beta);
/* The same, one row at a time: row b's result does not depend on how many
 * rows share the call (decode's batch invariance). */
void epd__ref_matmul_rows(const float *x, int ldx, int rows, int in, const float *w, int out,
                          float *y, int ldy, float beta);
/* out[dim] = x / sqrt(mean(x^2) + eps) * w (the mean in double). */
void epd__ref_rmsnorm(const float *x, const float *w, uint32_t dim, double eps, float *out);
/* Rotates the n_heads heads of vec (head_dim each) for position pos. */
void epd__ref_rope(const struct epd_engine_impl *e, float *vec, uint32_t n_heads, uint32_t pos);
/* One linear-attention step for all heads: updates state (S, z per head),
 * writes the token's output to o[heads*hd]. */
void epd__ref_linear_step(const struct epd_engine_impl *e, float *state, const float *q,
                          const float *k, const float *v, float *o);

/* ---- the ops behind epd__ref_ops (epd_engine.h says what each does) ------ */

/* epd_ref_forward.c */
epd_status_t epd__ref_prefill(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                              const epd_prefill_args_t *args, const epd_engine_sink_t *sink,
                              float *logits);
epd_status_t epd__ref_decode(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                             const epd_decode_req_t *reqs, uint32_t B, float *logits);
/* epd_ref_vision.c */
epd_status_t epd__ref_encode_image(epd_engine_impl_t *e, const epd_image_view_t *img, float *out);

#endif
