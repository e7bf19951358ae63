/*
 * epd_hf.c — the Hugging Face engine's ops: prefill, decode.
 * Opened through `ref` on a folder whose config.json has "architectures"
 * (epd_engine.c), so daemons keep --engine ref.  The math is in
 * epd_hf_model.h; weights and kernels in epd_hf_int.h.
 *
 * The same rules as ref (engine/epd_ref.c), for the same reasons:
 *  - KV f32 in the caller's pool, [2: K,V][kv_head][tok][head_dim] per
 *    block, K after RoPE (and after Qwen3's k_norm);
 *  - split invariance: prefill products run on EPD_HF_TILE-row tiles
 *    aligned to absolute positions, attention keys in EPD_HF_KTILE chunks
 *    aligned to 0, weight blocks of a size fixed by the matrix shape;
 *  - batch invariance: decode sums every (weight row, request) pair the
 *    same way alone or in a batch (epd_hf_matvec_batch reads each weight
 *    row once for the batch); MoE experts always run per token
 *    (epd_hf_moe.c).
 */
#include <cblas.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_engine_int.h"
#include "epd_kvq.h"
#include "epd_hf_int.h"
#include "epd_log.h"

/* prefill MLP rows per weight widening (a multiple of EPD_HF_TILE) */
#define EPD_HF_MLP_ROWS 512

static void epd_hf_ops_close(epd_engine_impl_t *e)
{
    epd_hf_close(e);
}

static void epd_hf_describe(const epd_engine_impl_t *e, epd_engine_info_t *info_p)
{
    *info_p = e->info;
}

/* Text and ids go through the engine layer, which loads the folder's
 * tokenizer.json once for every engine (epd_engine.c): it never calls these
 * two ops when the folder has one, so the engine keeps no second copy (94 MB
 * and 0.4 s of CPU for Qwen3's).  Without tokenizer.json a Hugging Face
 * folder takes token ids only. */
static epd_status_t epd_hf_tokenize(const epd_engine_impl_t *e, const char *text, size_t len,
                                    int add_bos, int32_t *tokens, size_t cap, size_t *n_p)
{
    (void)e, (void)text, (void)len, (void)add_bos, (void)tokens, (void)cap, (void)n_p;
    epd_log_error(EPD_HF_LOG, 0, "this model folder has no tokenizer.json: give token ids");
    return EPD_ERR_UNSUPPORTED;
}

static epd_status_t epd_hf_detokenize(const epd_engine_impl_t *e, const int32_t *tokens, size_t n,
                                      char *buf, size_t cap, size_t *len_p)
{
    (void)e, (void)tokens, (void)n, (void)buf, (void)cap, (void)len_p;
    return EPD_ERR_UNSUPPORTED;
}

/* The block of attention layer `layer` holding position `pos` (arguments
 * were validated by epd_engine_*). */
static inline void *epd_hf_kv_block(const epd_engine_impl_t *e, const epd_kv_pool_t *pool, uint32_t layer,
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
static inline void epd_hf_kv_put(const epd_engine_impl_t *e, const epd_kv_pool_t *pool, uint32_t layer,
                                  const epd_kv_seq_t *seq, uint32_t kvh, uint32_t pos, int v,
                                  const float *x)
{
    epd_kvq_row_put(&e->info.kv, layer, epd_hf_kv_block(e, pool, layer, seq, pos), v, kvh,
                    pos % e->info.kv.block_tokens, x);
}

static inline void epd_hf_kv_get(const epd_engine_impl_t *e, const epd_kv_pool_t *pool, uint32_t layer,
                                  const epd_kv_seq_t *seq, uint32_t kvh, uint32_t pos, int v,
                                  float *out)
{
    epd_kvq_row_get(&e->info.kv, layer, epd_hf_kv_block(e, pool, layer, seq, pos), v, kvh,
                    pos % e->info.kv.block_tokens, out);
}

static inline void epd_hf_kv_zero(const epd_engine_impl_t *e, const epd_kv_pool_t *pool, uint32_t layer,
                                   const epd_kv_seq_t *seq, uint32_t kvh, uint32_t pos, int v)
{
    epd_kvq_row_zero(&e->info.kv, layer, epd_hf_kv_block(e, pool, layer, seq, pos), v, kvh,
                     pos % e->info.kv.block_tokens);
}

/* Biases (qwen2), per-head q/k norms (qwen3) and RoPE on one position's
 * q [heads*hd] and k [kv_heads*hd] (k NULL: q only). */
static void epd_hf_qk_prep(const epd_engine_impl_t *e, const epd_hf_layer_t *L, float *q, float *k,
                           const float *c, const float *s)
{
    const epd_hf_hparams_t *hp = &e->hp;
    uint32_t hd = hp->head_dim;

    if (L->q_norm != NULL) {
        for (uint32_t h = 0; h < hp->n_heads; h++) {
            epd_hf_rmsnorm(q + (size_t)h * hd, L->q_norm, hd, hp->rms_eps, q + (size_t)h * hd);
        }
        for (uint32_t h = 0; k != NULL && h < hp->n_kv_heads; h++) {
            epd_hf_rmsnorm(k + (size_t)h * hd, L->k_norm, hd, hp->rms_eps, k + (size_t)h * hd);
        }
    }
    epd_hf_rope(q, hp->n_heads, hd, c, s);
    if (k != NULL) {
        epd_hf_rope(k, hp->n_kv_heads, hd, c, s);
    }
}

static void epd_hf_add(float *y, const float *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        y[i] += b[i];
    }
}

/* ---- prefill ------------------------------------------------------------ */

typedef struct {
    uint32_t base; /* position of row 0: start rounded down to a tile */
    uint32_t rows; /* padded rows, a multiple of EPD_HF_TILE */
    uint32_t keys; /* start + n rounded up to a key tile */
    uint32_t mlp_rows;
    float *x, *h, *q, *k, *v, *o; /* [rows][...] */
    float *g, *u;                 /* [mlp_rows][ffn] */
    float *kg, *vg;               /* [keys][hd] */
    float *s;                     /* [TILE][keys] */
    float *ws;                    /* widened weight block */
    float *rc, *rs;               /* [n_tokens][hd/2] RoPE cos / sin */
} epd_hf_act_t;

static void epd_hf_act_free(epd_hf_act_t *a)
{
    float *all[] = {a->x, a->h,  a->q,  a->k, a->v,  a->o,  a->g,
                    a->u, a->kg, a->vg, a->s, a->ws, a->rc, a->rs};

    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        epd_free(all[i]);
    }
}

static size_t epd_hf_max_wscratch(const epd_engine_impl_t *e)
{
    const epd_hf_layer_t *L = &e->layers[0];
    const epd_hf_mat_t *m[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
    size_t mx = 0;

    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
        size_t n = m[i]->data != NULL ? epd_hf_wscratch_floats(m[i]) : 0;

        mx = n > mx ? n : mx;
    }
    return mx;
}

static epd_status_t epd_hf_act_alloc(const epd_engine_impl_t *e, uint32_t start, uint32_t T,
                                     epd_hf_act_t *a)
{
    const epd_hf_hparams_t *hp = &e->hp;
    size_t dim = hp->dim;
    size_t qd = (size_t)hp->n_heads * hp->head_dim;
    size_t kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    size_t ffn = hp->ffn > hp->moe_ffn ? hp->ffn : hp->moe_ffn;
    uint32_t end = start + T;
    size_t R;

    memset(a, 0, sizeof(*a));
    a->base = start - start % EPD_HF_TILE;
    a->rows = (end - a->base + EPD_HF_TILE - 1) / EPD_HF_TILE * EPD_HF_TILE;
    a->keys = (end + EPD_HF_KTILE - 1) / EPD_HF_KTILE * EPD_HF_KTILE;
    a->mlp_rows = a->rows < EPD_HF_MLP_ROWS ? a->rows : EPD_HF_MLP_ROWS;
    R = a->rows;
    /* zeroed: padding rows are zero vectors through every layer */
    a->x = epd_calloc(R * dim, sizeof(float));
    a->h = epd_calloc(R * dim, sizeof(float));
    a->q = epd_calloc(R * qd, sizeof(float));
    a->k = epd_calloc(R * kvd, sizeof(float));
    a->v = epd_calloc(R * kvd, sizeof(float));
    a->o = epd_calloc(R * qd, sizeof(float));
    a->g = epd_malloc((size_t)a->mlp_rows * ffn * sizeof(float));
    a->u = epd_malloc((size_t)a->mlp_rows * ffn * sizeof(float));
    a->kg = epd_calloc((size_t)a->keys * hp->head_dim, sizeof(float));
    a->vg = epd_calloc((size_t)a->keys * hp->head_dim, sizeof(float));
    a->s = epd_malloc((size_t)EPD_HF_TILE * a->keys * sizeof(float));
    a->ws = epd_malloc((epd_hf_max_wscratch(e) + 1) * sizeof(float));
    a->rc = epd_malloc((size_t)T * (hp->head_dim / 2) * sizeof(float));
    a->rs = epd_malloc((size_t)T * (hp->head_dim / 2) * sizeof(float));
    if (a->x == NULL || a->h == NULL || a->q == NULL || a->k == NULL || a->v == NULL ||
        a->o == NULL || a->g == NULL || a->u == NULL || a->kg == NULL || a->vg == NULL ||
        a->s == NULL || a->ws == NULL || a->rc == NULL || a->rs == NULL) {
        epd_hf_act_free(a);
        return EPD_ERR_NO_MEMORY;
    }
    return EPD_OK;
}

/* Causal attention of the chunk's queries over every cached key of layer
 * l, into a->o (ref's algorithm, engine/epd_ref_forward.c). */
static void epd_hf_prefill_attention(const epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                     uint32_t l, const epd_prefill_args_t *args, epd_hf_act_t *a)
{
    uint32_t hd = e->hp.head_dim;
    uint32_t qd = e->hp.n_heads * hd;
    uint32_t group = e->hp.n_heads / e->hp.n_kv_heads;
    uint32_t start = args->start;
    uint32_t end = start + args->n_tokens;
    float scale = (float)(1.0 / sqrt((double)hd));

    for (uint32_t kvh = 0; kvh < e->hp.n_kv_heads; kvh++) {
        for (uint32_t p = 0; p < end; p++) {
            epd_hf_kv_get(e, pool, l, &args->seq, kvh, p, 0, a->kg + (size_t)p * hd);
            epd_hf_kv_get(e, pool, l, &args->seq, kvh, p, 1, a->vg + (size_t)p * hd);
        }
        for (uint32_t hq = kvh * group; hq < (kvh + 1) * group; hq++) {
            for (uint32_t r0 = 0; r0 < a->rows; r0 += EPD_HF_TILE) {
                uint32_t p0 = a->base + r0;
                uint32_t last = p0 + EPD_HF_TILE < end ? p0 + EPD_HF_TILE : end;
                uint32_t kt = (last + EPD_HF_KTILE - 1) / EPD_HF_KTILE;
                uint32_t ld = kt * EPD_HF_KTILE;
                float *o = a->o + (size_t)r0 * qd + (size_t)hq * hd;

                for (uint32_t c = 0; c < kt; c++) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, EPD_HF_TILE, EPD_HF_KTILE,
                                (int)hd, scale, a->q + (size_t)r0 * qd + (size_t)hq * hd, (int)qd,
                                a->kg + (size_t)c * EPD_HF_KTILE * hd, (int)hd, 0.0f,
                                a->s + (size_t)c * EPD_HF_KTILE, (int)ld);
                }
                for (uint32_t r = 0; r < EPD_HF_TILE; r++) {
                    uint32_t p = p0 + r;
                    float *srow = a->s + (size_t)r * ld;
                    uint32_t lim = p + 1;
                    float mx;
                    float sum = 0.0f;

                    if (p < start || p >= end) {
                        memset(srow, 0, ld * sizeof(float));
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
                for (uint32_t c = 0; c < kt; c++) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, EPD_HF_TILE, (int)hd,
                                EPD_HF_KTILE, 1.0f, a->s + (size_t)c * EPD_HF_KTILE, (int)ld,
                                a->vg + (size_t)c * EPD_HF_KTILE * hd, (int)hd,
                                c == 0 ? 0.0f : 1.0f, o, (int)qd);
                }
            }
        }
    }
}

/* The MLP of every row (dense: sgemm tiles, EPD_HF_MLP_ROWS rows per
 * weight widening; MoE: per token). */
static void epd_hf_prefill_mlp(epd_engine_impl_t *e, const epd_hf_layer_t *L, uint32_t start,
                               uint32_t end, epd_hf_act_t *a)
{
    const epd_hf_hparams_t *hp = &e->hp;
    uint32_t dim = hp->dim;

    if (hp->arch == EPD_HF_QWEN3_MOE) {
        for (uint32_t p = start; p < end; p++) {
            size_t r = p - a->base;

            epd_hf_moe_token(e, L, a->h + r * dim, a->x + r * dim, a->g, a->u);
        }
        return;
    }
    for (uint32_t r0 = 0; r0 < a->rows; r0 += a->mlp_rows) {
        uint32_t n = a->rows - r0 < a->mlp_rows ? a->rows - r0 : a->mlp_rows;

        epd_hf_matmul_tiles(a->h + (size_t)r0 * dim, (int)dim, n, &L->gate, a->g, (int)hp->ffn,
                            0.0f, a->ws);
        epd_hf_matmul_tiles(a->h + (size_t)r0 * dim, (int)dim, n, &L->up, a->u, (int)hp->ffn, 0.0f,
                            a->ws);
        for (size_t i = 0; i < (size_t)n * hp->ffn; i++) {
            a->g[i] = epd_hf_silu(a->g[i]) * a->u[i];
        }
        epd_hf_matmul_tiles(a->g, (int)hp->ffn, n, &L->down, a->x + (size_t)r0 * dim, (int)dim,
                            1.0f, a->ws);
    }
}

static epd_status_t epd_hf_prefill(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                   const epd_prefill_args_t *args, const epd_engine_sink_t *sink,
                                   float *logits)
{
    const epd_hf_hparams_t *hp = &e->hp;
    const epd_kv_layout_t *kv = &e->info.kv;
    uint32_t T = args->n_tokens;
    uint32_t start = args->start;
    uint32_t end = start + T;
    uint32_t kv_from = args->replay_end > start ? args->replay_end : start;
    uint32_t dim = hp->dim;
    uint32_t hd = hp->head_dim;
    uint32_t half = hd / 2;
    uint32_t qd = hp->n_heads * hd;
    uint32_t kvd = hp->n_kv_heads * hd;
    epd_hf_act_t a;
    epd_status_t status;

    status = epd_hf_act_alloc(e, start, T, &a);
    if (status != EPD_OK) {
        epd_log_error(EPD_HF_LOG, args->seq.req_id, "prefill of %u tokens: out of memory", T);
        return status;
    }
    for (uint32_t t = 0; t < T; t++) {
        epd_hf_widen_rows(&e->embed, (uint32_t)args->tokens[t], 1,
                          a.x + (size_t)(start + t - a.base) * dim);
        epd_hf_rope_angles(e, start + t, a.rc + (size_t)t * half, a.rs + (size_t)t * half);
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const epd_hf_layer_t *L = &e->layers[l];
        epd_layer_done_t done;

        for (uint32_t p = start; p < end; p++) {
            size_t r = p - a.base;

            epd_hf_rmsnorm(a.x + r * dim, L->in_norm, dim, hp->rms_eps, a.h + r * dim);
        }
        epd_hf_matmul_tiles(a.h, (int)dim, a.rows, &L->q, a.q, (int)qd, 0.0f, a.ws);
        epd_hf_matmul_tiles(a.h, (int)dim, a.rows, &L->k, a.k, (int)kvd, 0.0f, a.ws);
        epd_hf_matmul_tiles(a.h, (int)dim, a.rows, &L->v, a.v, (int)kvd, 0.0f, a.ws);
        for (uint32_t p = start; p < end; p++) {
            size_t r = p - a.base;
            float *q = a.q + r * qd;
            float *k = a.k + r * kvd;
            float *v = a.v + r * kvd;

            if (L->bq != NULL) {
                epd_hf_add(q, L->bq, qd);
                epd_hf_add(k, L->bk, kvd);
                epd_hf_add(v, L->bv, kvd);
            }
            epd_hf_qk_prep(e, L, q, p < kv_from ? NULL : k, a.rc + (size_t)(p - start) * half,
                           a.rs + (size_t)(p - start) * half);
            if (p < kv_from) {
                continue;
            }
            for (uint32_t kvh = 0; kvh < hp->n_kv_heads; kvh++) {
                epd_hf_kv_put(e, pool, l, &args->seq, kvh, p, 0, k + (size_t)kvh * hd);
                epd_hf_kv_put(e, pool, l, &args->seq, kvh, p, 1, v + (size_t)kvh * hd);
            }
        }
        /* the rest of the chunk's last block holds nobody's KV */
        for (uint32_t p = end; p % kv->block_tokens != 0; p++) {
            for (uint32_t kvh = 0; kvh < hp->n_kv_heads; kvh++) {
                epd_hf_kv_zero(e, pool, l, &args->seq, kvh, p, 0);
                epd_hf_kv_zero(e, pool, l, &args->seq, kvh, p, 1);
            }
        }
        memset(&done, 0, sizeof(done));
        done.req_id = args->seq.req_id;
        done.layer = l;
        done.kind = EPD_LAYER_ATTENTION;
        done.tok_start = kv_from;
        done.tok_end = end;
        done.first_block = kv_from / kv->block_tokens;
        done.n_blocks = (end - 1) / kv->block_tokens - done.first_block + 1;
        done.block_ids = args->seq.block_table + done.first_block;
        if (sink != NULL && sink->cb != NULL) {
            status = sink->cb(sink->ctx, l, &done);
            if (status != EPD_OK) {
                goto out;
            }
        }
        epd_hf_prefill_attention(e, pool, l, args, &a);
        epd_hf_matmul_tiles(a.o, (int)qd, a.rows, &L->o, a.x, (int)dim, 1.0f, a.ws);
        for (uint32_t p = start; p < end; p++) {
            size_t r = p - a.base;

            epd_hf_rmsnorm(a.x + r * dim, L->post_norm, dim, hp->rms_eps, a.h + r * dim);
        }
        epd_hf_prefill_mlp(e, L, start, end, &a);
    }
    epd_hf_rmsnorm(a.x + (size_t)(end - 1 - a.base) * dim, e->final_norm, dim, hp->rms_eps, a.h);
    epd_hf_matvec(&e->lm_head, a.h, logits, 0);
    status = EPD_OK;
out:
    epd_hf_act_free(&a);
    return status;
}

/* ---- decode ------------------------------------------------------------- */

static void epd_hf_decode_attention(epd_engine_impl_t *e, const epd_kv_pool_t *pool, uint32_t l,
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

            epd_hf_kv_get(e, pool, l, &r->seq, kvh, p, 0, k);
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
        memset(oh, 0, hd * sizeof(float));
        for (uint32_t p = 0; p < n; p++) {
            float v[EPD_KVQ_MAX_HEAD_DIM];

            epd_hf_kv_get(e, pool, l, &r->seq, kvh, p, 1, v);
            float w = s[p] / sum;

            for (uint32_t i = 0; i < hd; i++) {
                oh[i] += w * v[i];
            }
        }
    }
}

static epd_status_t epd_hf_decode(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
                                  const epd_decode_req_t *reqs, uint32_t B, float *logits)
{
    const epd_hf_hparams_t *hp = &e->hp;
    uint32_t dim = hp->dim;
    uint32_t hd = hp->head_dim;
    uint32_t half = hd / 2;
    uint32_t qd = hp->n_heads * hd;
    uint32_t kvd = hp->n_kv_heads * hd;
    uint32_t ffn = hp->ffn > hp->moe_ffn ? hp->ffn : hp->moe_ffn;

    for (uint32_t b = 0; b < B; b++) {
        epd_hf_widen_rows(&e->embed, (uint32_t)reqs[b].token, 1, e->d_x + (size_t)b * dim);
        epd_hf_rope_angles(e, reqs[b].pos, e->d_cos + (size_t)b * half,
                           e->d_sin + (size_t)b * half);
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const epd_hf_layer_t *L = &e->layers[l];

        for (uint32_t b = 0; b < B; b++) {
            epd_hf_rmsnorm(e->d_x + (size_t)b * dim, L->in_norm, dim, hp->rms_eps,
                           e->d_h + (size_t)b * dim);
        }
        epd_hf_matvec_batch(&L->q, e->d_h, dim, B, e->d_q, qd, 0);
        epd_hf_matvec_batch(&L->k, e->d_h, dim, B, e->d_k, kvd, 0);
        epd_hf_matvec_batch(&L->v, e->d_h, dim, B, e->d_v, kvd, 0);
        for (uint32_t b = 0; b < B; b++) {
            const epd_decode_req_t *r = &reqs[b];
            float *q = e->d_q + (size_t)b * qd;
            float *k = e->d_k + (size_t)b * kvd;
            float *v = e->d_v + (size_t)b * kvd;

            if (L->bq != NULL) {
                epd_hf_add(q, L->bq, qd);
                epd_hf_add(k, L->bk, kvd);
                epd_hf_add(v, L->bv, kvd);
            }
            epd_hf_qk_prep(e, L, q, k, e->d_cos + (size_t)b * half, e->d_sin + (size_t)b * half);
            for (uint32_t kvh = 0; kvh < hp->n_kv_heads; kvh++) {
                epd_hf_kv_put(e, pool, l, &r->seq, kvh, r->pos, 0, k + (size_t)kvh * hd);
                epd_hf_kv_put(e, pool, l, &r->seq, kvh, r->pos, 1, v + (size_t)kvh * hd);
            }
            epd_hf_decode_attention(e, pool, l, r, q, e->d_o + (size_t)b * qd);
        }
        epd_hf_matvec_batch(&L->o, e->d_o, qd, B, e->d_x, dim, 1);
        for (uint32_t b = 0; b < B; b++) {
            epd_hf_rmsnorm(e->d_x + (size_t)b * dim, L->post_norm, dim, hp->rms_eps,
                           e->d_h + (size_t)b * dim);
        }
        if (hp->arch == EPD_HF_QWEN3_MOE) {
            /* each token its own experts */
            for (uint32_t b = 0; b < B; b++) {
                epd_hf_moe_token(e, L, e->d_h + (size_t)b * dim, e->d_x + (size_t)b * dim,
                                 e->d_g + (size_t)b * ffn, e->d_u + (size_t)b * ffn);
            }
            continue;
        }
        epd_hf_matvec_batch(&L->gate, e->d_h, dim, B, e->d_g, ffn, 0);
        epd_hf_matvec_batch(&L->up, e->d_h, dim, B, e->d_u, ffn, 0);
        for (uint32_t b = 0; b < B; b++) {
            float *g = e->d_g + (size_t)b * ffn;
            const float *u = e->d_u + (size_t)b * ffn;

            for (uint32_t i = 0; i < hp->ffn; i++) {
                g[i] = epd_hf_silu(g[i]) * u[i];
            }
        }
        epd_hf_matvec_batch(&L->down, e->d_g, ffn, B, e->d_x, dim, 1);
    }
    for (uint32_t b = 0; b < B; b++) {
        epd_hf_rmsnorm(e->d_x + (size_t)b * dim, e->final_norm, dim, hp->rms_eps,
                       e->d_h + (size_t)b * dim);
    }
    epd_hf_matvec_batch(&e->lm_head, e->d_h, dim, B, logits, hp->vocab, 0);
    return EPD_OK;
}

static void epd_hf_release(epd_engine_impl_t *e, const epd_kv_pool_t *pool, const epd_kv_seq_t *seq)
{
    /* attention only: nothing per request outside the blocks */
    (void)e;
    (void)pool;
    (void)seq;
}

static epd_status_t epd_hf_encode_image(epd_engine_impl_t *e, const epd_image_view_t *image,
                                        float *out)
{
    (void)e;
    (void)image;
    (void)out;
    return EPD_ERR_UNSUPPORTED;
}

/* Named "ref": the daemons' --engine ref opens it on a Hugging Face folder
 * (epd_engine.c picks it by the folder's config.json). */
const epd_engine_ops_t epd__hf_ops = {
    .size = sizeof(epd_engine_ops_t),
    .abi_version = EPD_ENGINE_ABI_VERSION,
    .name = "ref",
    .open = epd_hf_open,
    .close = epd_hf_ops_close,
    .describe = epd_hf_describe,
    .tokenize = epd_hf_tokenize,
    .detokenize = epd_hf_detokenize,
    .prefill = epd_hf_prefill,
    .decode = epd_hf_decode,
    .release = epd_hf_release,
    .encode_image = epd_hf_encode_image,
};
