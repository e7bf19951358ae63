/*
 * epd_hf_int.h — internals of the Hugging Face engine (epd_hf.c: ops,
 * prefill, decode; epd_hf_load.c: open, weights, digest; epd_hf_moe.c: the
 * expert MLP; epd_hf_kern.c: the widening kernels).  Not an API.
 *
 * Weights stay where the safetensors mapping put them, in the file's dtype
 * (read-only, shared with every process that maps the same file); matrices
 * are read through epd_hf_mat_t and widened to f32 per tile at compute
 * time.  Only the small vectors (norms, biases) are copied to f32 at open.
 */
#ifndef EPD_HF_INT_H
#define EPD_HF_INT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_hf_model.h"
#include "epd_safetensors.h"
#include "epd_tokenizer.h"

#define EPD_HF_LOG "hf"
/* prefill row tile (aligned to absolute positions) and key tile, as ref's
 * (engine/epd_ref_forward.c "Split invariance") */
#define EPD_HF_TILE 64
#define EPD_HF_KTILE 64

/* A [rows][cols] matrix in the mapping (y = W x: rows = out, cols = in). */
typedef struct {
    const void *data; /* may be unaligned */
    epd_dtype_t dtype;
    uint32_t rows;
    uint32_t cols;
} epd_hf_mat_t;

typedef struct {
    epd_hf_mat_t gate; /* [moe_ffn, dim] */
    epd_hf_mat_t up;
    epd_hf_mat_t down; /* [dim, moe_ffn] */
} epd_hf_expert_t;

typedef struct {
    const float *in_norm;   /* [dim] */
    const float *post_norm; /* [dim] */
    epd_hf_mat_t q, k, v, o;
    const float *bq, *bk, *bv;    /* qwen2, else NULL */
    const float *q_norm, *k_norm; /* qwen3, else NULL: [hd] */
    epd_hf_mat_t gate, up, down;  /* dense */
    epd_hf_mat_t router;          /* moe: [experts, dim] */
    epd_hf_expert_t *experts;     /* moe: [n_experts] */
} epd_hf_layer_t;

struct epd_engine_impl {
    epd_hf_hparams_t hp;
    epd_engine_info_t info;
    epd_st_file_t **files; /* [n_files] mapped shards */
    uint32_t n_files;
    float *vecs; /* every norm / bias, widened, one buffer */
    epd_hf_layer_t *layers;
    epd_hf_expert_t *experts; /* [n_layers * n_experts] */
    epd_hf_mat_t embed;       /* [vocab, dim] */
    epd_hf_mat_t lm_head;     /* [vocab, dim]: the embedding when tied */
    const float *final_norm;
    double *inv_freq;     /* [hd/2], llama3-scaled when asked */
    /* decode scratch, [max_batch][...] */
    float *d_x, *d_h, *d_q, *d_k, *d_v, *d_o, *d_g, *d_u;
    float *d_scores;      /* [max_context] */
    float *d_cos, *d_sin; /* [max_batch][hd/2] */
    float *m_logit;       /* [n_experts] router logits of one token */
    float *m_y;           /* [2][dim]: one expert's output, the mixture */
};

/* ---- kernels (epd_hf_kern.c) ---- */

/* y[0..rows) = (accumulate ? y : 0) + W x, widened on the fly, f32
 * accumulation in a fixed order: a row's result depends on W row and x
 * only (batch-invariant). */
void epd_hf_matvec(const epd_hf_mat_t *w, const float *x, float *y, int accumulate);

/* The same for B inputs x[b * ldx ..] into y[b * ldy ..]: each weight row
 * is read once for the whole batch (decode is bound by weight bytes), and
 * each (row, input) pair summed exactly as epd_hf_matvec sums it, so a
 * request's result is bit for bit the same alone or in any batch. */
void epd_hf_matvec_batch(const epd_hf_mat_t *w, const float *x, size_t ldx, uint32_t B, float *y,
                         size_t ldy, int accumulate);

/* Widens rows [r0, r0+n) of w into dst [n][cols] f32. */
void epd_hf_widen_rows(const epd_hf_mat_t *w, uint32_t r0, uint32_t n, float *dst);

/* Y[R][w.rows] (ldy) = (beta ? Y : 0) + X[R][w.cols] (ldx) W^T, R a
 * multiple of EPD_HF_TILE: W widened EPD_HF_WROWS(w) rows at a time into
 * `scratch` (epd_hf_wscratch_floats(w) floats), one sgemm per (row tile,
 * weight block): every call has a shape fixed by the model alone. */
void epd_hf_matmul_tiles(const float *x, int ldx, uint32_t R, const epd_hf_mat_t *w, float *y,
                         int ldy, float beta, float *scratch);
size_t epd_hf_wscratch_floats(const epd_hf_mat_t *w);

/* out = x / sqrt(mean(x^2) + eps) * w (the mean in double). */
void epd_hf_rmsnorm(const float *x, const float *w, uint32_t n, double eps, float *out);

/* Rotates n_heads heads of vec (head_dim each), pairs (i, i + hd/2), with
 * the angles' cos / sin [hd/2]. */
void epd_hf_rope(float *vec, uint32_t n_heads, uint32_t hd, const float *c, const float *s);

/* cos / sin [hd/2] of position pos (angle pos * inv_freq in double). */
void epd_hf_rope_angles(const struct epd_engine_impl *e, uint32_t pos, float *c, float *s);

static inline float epd_hf_silu(float u)
{
    return u / (1.0f + expf(-u));
}

/* ---- MoE (epd_hf_moe.c) ---- */

/* x[dim] += the layer's expert mixture of h[dim] (one token).  Uses
 * e->m_logit, e->m_y and g / u [moe_ffn] scratch. */
void epd_hf_moe_token(struct epd_engine_impl *e, const epd_hf_layer_t *L, const float *h, float *x,
                      float *g, float *u);

/* ---- open (epd_hf_load.c) ---- */

epd_status_t epd_hf_open(const epd_engine_config_t *config, epd_engine_impl_t **impl_p);
void epd_hf_close(epd_engine_impl_t *e);

#endif
