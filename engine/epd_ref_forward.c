/*
 * epd_ref_forward.c — the `ref` engine's language model: prefill (layer by
 * layer over the chunk, the sink called once per layer as soon as its KV
 * or state is final) and decode (one token per request, batch-invariant).
 * KV is read and written through epd_ref_int.h's accessors, in the layer's
 * KV dtype.  The design is at the top of epd_ref.c.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_ref_int.h"

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

        epd__ref_linear_step(e, state, a->q + r * qd, a->k + r * qd, a->v + r * qd, a->o + r * qd);
        if (ci < args->n_ckpts && args->ckpts[ci].pos == args->start + t + 1) {
            memcpy((char *)args->ckpts[ci].dst + (size_t)kv->kind_index[l] * kv->state_bytes, state,
                   kv->state_bytes);
            ci++;
        }
    }
}

epd_status_t epd__ref_prefill(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
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
        uint64_t hi =
            (uint64_t)sp->pos + sp->n < (uint64_t)end ? (uint64_t)sp->pos + sp->n : (uint64_t)end;

        for (uint64_t p = lo; p < hi; p++) {
            memcpy(a.x + (size_t)(p - a.base) * dim, sp->data + (size_t)(p - sp->pos) * dim,
                   dim * sizeof(float));
        }
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const epd_ref_layer_t *L = &e->layers[l];
        epd_layer_done_t done;

        for (uint32_t r = 0; r < a.rows; r++) {
            epd__ref_rmsnorm(a.x + (size_t)r * dim, L->in_norm, dim, hp->rms_eps,
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

                epd__ref_rope(e, a.q + r * qd, hp->n_heads, p);
                if (p < kv_from) {
                    continue;
                }
                epd__ref_rope(e, a.k + r * kvd, hp->n_kv_heads, p);
                for (uint32_t kvh = 0; kvh < hp->n_kv_heads; kvh++) {
                    epd_ref_kv_put(e, pool, l, &args->seq, kvh, p, 0,
                                   a.k + r * kvd + (size_t)kvh * hd);
                    epd_ref_kv_put(e, pool, l, &args->seq, kvh, p, 1,
                                   a.v + r * kvd + (size_t)kvh * hd);
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
            epd__ref_rmsnorm(a.x + (size_t)r * dim, L->post_norm, dim, hp->rms_eps,
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
    epd__ref_rmsnorm(a.x + (size_t)(end - 1 - a.base) * dim, e->final_norm, dim, hp->rms_eps, a.h);
    epd__ref_matmul(a.h, dim, 1, dim, e->lm_head, hp->vocab, logits, hp->vocab, 0.0f);
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

epd_status_t epd__ref_decode(epd_engine_impl_t *e, const epd_kv_pool_t *pool,
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
            epd__ref_rmsnorm(e->d_x + (size_t)b * dim, L->in_norm, dim, hp->rms_eps,
                             e->d_h + (size_t)b * dim);
        }
        epd__ref_matmul_rows(e->d_h, dim, B, dim, L->wq, qd, e->d_q, qd, 0.0f);
        epd__ref_matmul_rows(e->d_h, dim, B, dim, L->wk, kd, e->d_k, kd, 0.0f);
        epd__ref_matmul_rows(e->d_h, dim, B, dim, L->wv, kd, e->d_v, kd, 0.0f);
        for (uint32_t b = 0; b < B; b++) {
            const epd_decode_req_t *r = &reqs[b];
            float *q = e->d_q + (size_t)b * qd;
            float *k = e->d_k + (size_t)b * kd;
            float *v = e->d_v + (size_t)b * kd;
            float *o = e->d_o + (size_t)b * qd;

            if (attn) {
                epd__ref_rope(e, q, hp->n_heads, r->pos);
                epd__ref_rope(e, k, hp->n_kv_heads, r->pos);
                for (uint32_t kvh = 0; kvh < hp->n_kv_heads; kvh++) {
                    epd_ref_kv_put(e, pool, l, &r->seq, kvh, r->pos, 0, k + (size_t)kvh * hd);
                    epd_ref_kv_put(e, pool, l, &r->seq, kvh, r->pos, 1, v + (size_t)kvh * hd);
                }
                epd_ref_decode_attention(e, pool, l, r, q, o);
            } else {
                epd__ref_linear_step(e, epd_ref_state(e, pool, l, r->seq.state_slot), q, k, v, o);
            }
        }
        epd__ref_matmul_rows(e->d_o, qd, B, qd, L->wo, dim, e->d_x, dim, 1.0f);
        for (uint32_t b = 0; b < B; b++) {
            epd__ref_rmsnorm(e->d_x + (size_t)b * dim, L->post_norm, dim, hp->rms_eps,
                             e->d_h + (size_t)b * dim);
        }
        epd__ref_matmul_rows(e->d_h, dim, B, dim, L->gate, hp->ffn, e->d_g, hp->ffn, 0.0f);
        epd__ref_matmul_rows(e->d_h, dim, B, dim, L->up, hp->ffn, e->d_u, hp->ffn, 0.0f);
        for (size_t i = 0; i < (size_t)B * hp->ffn; i++) {
            e->d_g[i] = epd_ref_silu(e->d_g[i]) * e->d_u[i];
        }
        epd__ref_matmul_rows(e->d_g, hp->ffn, B, hp->ffn, L->down, dim, e->d_x, dim, 1.0f);
    }
    for (uint32_t b = 0; b < B; b++) {
        epd__ref_rmsnorm(e->d_x + (size_t)b * dim, e->final_norm, dim, hp->rms_eps,
                         e->d_h + (size_t)b * dim);
    }
    epd__ref_matmul_rows(e->d_h, dim, B, dim, e->lm_head, hp->vocab, logits, hp->vocab, 0.0f);
    return EPD_OK;
}
