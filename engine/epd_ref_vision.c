/*
 * epd_ref_vision.c — the `ref` engine's vision encoder (epd_ref_model.h has
 * the math and tensor names): a ViT on the same kernels as the language
 * model.  The image is resized straight into the patch matrix [N][P*P*3],
 * then every projection is one sgemm over all N patches and attention is
 * two sgemms per head (all patches see all patches).  Its activations are
 * allocated per call, like prefill's.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_ref_int.h"

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
    epd__ref_matmul(x, (int)in, (int)rows, (int)in, w, (int)out, y, (int)out, 1.0f);
}

typedef struct {
    float *x;     /* [N][P*P*3] patches of the resized image, in [-1, 1] */
    float *h;     /* [N][D] residual stream */
    float *u;     /* [N][D] normed */
    float *q;     /* [N][D] */
    float *k;     /* [N][D] */
    float *v;     /* [N][D] */
    float *o;     /* [N][D] attention output before o_proj */
    float *s;     /* [N][N] one head's scores */
    float *f;     /* [N][ffn] */
    float *z;     /* [E][m*m*D] merged patches */
    float *zt;    /* [E][m*m*D] projector hidden */
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

epd_status_t epd__ref_encode_image(epd_engine_impl_t *e, const epd_image_view_t *img, float *out)
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
