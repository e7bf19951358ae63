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
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
        return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));  \
    }

#define EPD_HF_F32(v) (v)
EPD_HF_DOT(float, EPD_HF_F32)

#if defined(__SSE2__)
/* BF16 with SSE2 (every x86-64): the same 8 partial sums in the same
 * order as EPD_HF_DOT, so the result is bit for bit the portable one's;
 * only faster (a BF16 value widens by a 16-bit shift: unpack with zeros). */
static float epd_hf_dot_uint16_t(const uint16_t *w, const float *x, uint32_t n)
{
    __m128 a0 = _mm_setzero_ps();
    __m128 a1 = _mm_setzero_ps();
    const __m128i z = _mm_setzero_si128();
    float acc[8];
    uint32_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m128i h;

        memcpy(&h, w + i, sizeof(h));
        a0 = _mm_add_ps(
            a0, _mm_mul_ps(_mm_castsi128_ps(_mm_unpacklo_epi16(z, h)), _mm_loadu_ps(x + i)));
        a1 = _mm_add_ps(
            a1, _mm_mul_ps(_mm_castsi128_ps(_mm_unpackhi_epi16(z, h)), _mm_loadu_ps(x + i + 4)));
    }
    _mm_storeu_ps(acc, a0);
    _mm_storeu_ps(acc + 4, a1);
    for (uint32_t j = 0; i < n; i++, j++) {
        acc[j] += epd_hf_bf16(w[i]) * x[i];
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
#else
EPD_HF_DOT(uint16_t, epd_hf_bf16)
#endif

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

/* One weight row against one input: the single place a decode product is
 * summed, so a row's result is the same in any batch. */
static inline float epd_hf_dot_row(const epd_hf_mat_t *w, uint32_t r, const float *x)
{
    uint32_t n = w->cols;

    switch (w->dtype) {
    case EPD_DTYPE_BF16:
        return epd_hf_dot_uint16_t((const uint16_t *)w->data + (size_t)r * n, x, n);
    case EPD_DTYPE_F16:
        return epd_hf_dot_f16((const uint16_t *)w->data + (size_t)r * n, x, n);
    default:
        return epd_hf_dot_float((const float *)w->data + (size_t)r * n, x, n);
    }
}

void epd_hf_matvec(const epd_hf_mat_t *w, const float *x, float *y, int accumulate)
{
    epd_hf_matvec_batch(w, x, 0, 1, y, 0, accumulate);
}

void epd_hf_matvec_batch(const epd_hf_mat_t *w, const float *x, size_t ldx, uint32_t B, float *y,
                         size_t ldy, int accumulate)
{
    for (uint32_t r = 0; r < w->rows; r++) {
        for (uint32_t b = 0; b < B; b++) {
            float d = epd_hf_dot_row(w, r, x + (size_t)b * ldx);
            float *yb = y + (size_t)b * ldy + r;

            *yb = accumulate ? *yb + d : d;
        }
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

/* Weight rows widened per block: about 4 MiB of f32, a multiple of 16
 * rows, fixed by the matrix's shape alone (split invariance).  Not less:
 * 256 KiB blocks made sgemm calls of 64 x 32 x 1536 on a 1.5B shape, and
 * prefill ran at 3 tok/s against 14 with 4 MiB (epd-bench engine --hf,
 * qwen-1.5b, 4 layers; 18 against 130 on qwen-0.5b). */
static uint32_t epd_hf_wrows(const epd_hf_mat_t *w)
{
    uint32_t r = ((1u << 20) / (w->cols ? w->cols : 1)) & ~15u;

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
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, EPD_HF_TILE, (int)n, (int)w->cols,
                        1.0f, x + (size_t)t0 * ldx, ldx, b, (int)w->cols, beta,
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
