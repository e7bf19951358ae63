/*
 * epd_hf_kern.c — the kernels of the Hugging Face engine that read weights
 * in their stored dtype.  Decode widens on the fly inside the mat-vec (one
 * pass over the weight bytes: decode is bound by memory, and BF16 halves
 * them); prefill widens a block of weight rows into f32 scratch once and
 * multiplies every row tile of the chunk with it through sgemm (compute
 * bound: the widening is paid once per block, not per tile).
 */
#include <cblas.h>
#include <string.h>

#include "epd_hf_int.h"

static inline float epd_hf_bf16(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    float f;

    memcpy(&f, &b, 4);
    return f;
}

/* The dot product of one weight row with x, 8 partial sums in a fixed
 * order (vectorisable, and the same order whatever the caller). */
#define EPD_HF_DOT(T, CONV)                                                                        \
    static float epd_hf_dot_##T(const T *w, const float *x, uint32_t n)                            \
    {                                                                                              \
        float acc[8] = {0};                                                                        \
        uint32_t i = 0;                                                                            \
                                                                                                   \
        for (; i + 8 <= n; i += 8) {                                                               \
            for (uint32_t j = 0; j < 8; j++) {                                                     \
                acc[j] += CONV(w[i + j]) * x[i + j];                                               \
            }                                                                                      \
        }                                                                                          \
        for (uint32_t j = 0; i < n; i++, j++) {                                                    \
            acc[j] += CONV(w[i]) * x[i];                                                           \
        }                                                                                          \
        return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])); \
    }

#define EPD_HF_F32(v) (v)
EPD_HF_DOT(uint16_t, epd_hf_bf16)
EPD_HF_DOT(float, EPD_HF_F32)

static float epd_hf_dot_f16(const uint16_t *w, const float *x, uint32_t n)
{
    float acc[8] = {0};
    uint32_t i = 0;

    for (; i + 8 <= n; i += 8) {
        for (uint32_t j = 0; j < 8; j++) {
            acc[j] += epd_f16_to_f32(w[i + j]) * x[i + j];
        }
    }
    for (uint32_t j = 0; i < n; i++, j++) {
        acc[j] += epd_f16_to_f32(w[i]) * x[i];
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void epd_hf_matvec(const epd_hf_mat_t *w, const float *x, float *y, int accumulate)
{
    uint32_t n = w->cols;

    for (uint32_t r = 0; r < w->rows; r++) {
        float d;

        switch (w->dtype) {
        case EPD_DTYPE_BF16:
            d = epd_hf_dot_uint16_t((const uint16_t *)w->data + (size_t)r * n, x, n);
            break;
        case EPD_DTYPE_F16:
            d = epd_hf_dot_f16((const uint16_t *)w->data + (size_t)r * n, x, n);
            break;
        default:
            d = epd_hf_dot_float((const float *)w->data + (size_t)r * n, x, n);
            break;
        }
        y[r] = accumulate ? y[r] + d : d;
    }
}

void epd_hf_widen_rows(const epd_hf_mat_t *w, uint32_t r0, uint32_t n, float *dst)
{
    size_t count = (size_t)n * w->cols;
    size_t off = (size_t)r0 * w->cols;

    if (w->dtype == EPD_DTYPE_F32) {
        memcpy(dst, (const float *)w->data + off, count * sizeof(float));
        return;
    }
    if (w->dtype == EPD_DTYPE_BF16) {
        const uint16_t *src = (const uint16_t *)w->data + off;

        for (size_t i = 0; i < count; i++) {
            dst[i] = epd_hf_bf16(src[i]);
        }
        return;
    }
    {
        const uint16_t *src = (const uint16_t *)w->data + off;

        for (size_t i = 0; i < count; i++) {
            dst[i] = epd_f16_to_f32(src[i]);
        }
    }
}

/* Weight rows widened per block: about 256 KiB of f32, a multiple of 16
 * rows, fixed by the matrix's shape alone (split invariance). */
static uint32_t epd_hf_wrows(const epd_hf_mat_t *w)
{
    uint32_t r = (65536u / (w->cols ? w->cols : 1)) & ~15u;

    if (r < 16) {
        r = 16;
    }
    return r < w->rows ? r : w->rows;
}

size_t epd_hf_wscratch_floats(const epd_hf_mat_t *w)
{
    return (size_t)epd_hf_wrows(w) * w->cols;
}

void epd_hf_matmul_tiles(const float *x, int ldx, uint32_t R, const epd_hf_mat_t *w, float *y,
                         int ldy, float beta, float *scratch)
{
    uint32_t wr = epd_hf_wrows(w);

    for (uint32_t r0 = 0; r0 < w->rows; r0 += wr) {
        uint32_t n = w->rows - r0 < wr ? w->rows - r0 : wr;
        const float *b = scratch;

        if (w->dtype == EPD_DTYPE_F32) {
            b = (const float *)w->data + (size_t)r0 * w->cols;
        } else {
            epd_hf_widen_rows(w, r0, n, scratch);
        }
        for (uint32_t t0 = 0; t0 < R; t0 += EPD_HF_TILE) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, EPD_HF_TILE, (int)n,
                        (int)w->cols, 1.0f, x + (size_t)t0 * ldx, ldx, b, (int)w->cols, beta,
                        y + (size_t)t0 * ldy + r0, ldy);
        }
    }
}

void epd_hf_rmsnorm(const float *x, const float *w, uint32_t n, double eps, float *out)
{
    double ss = 0.0;
    float r;

    for (uint32_t i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
    }
    r = (float)(1.0 / sqrt(ss / n + eps));
    for (uint32_t i = 0; i < n; i++) {
        out[i] = x[i] * r * w[i];
    }
}

void epd_hf_rope(float *vec, uint32_t n_heads, uint32_t hd, const float *c, const float *s)
{
    uint32_t half = hd / 2;

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

void epd_hf_rope_angles(const struct epd_engine_impl *e, uint32_t pos, float *c, float *s)
{
    uint32_t half = e->hp.head_dim / 2;

    for (uint32_t i = 0; i < half; i++) {
        double a = (double)pos * e->inv_freq[i];

        c[i] = (float)cos(a);
        s[i] = (float)sin(a);
    }
}
