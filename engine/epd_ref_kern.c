/*
 * epd_ref_kern.c — the `ref` engine's kernels, shared by prefill, decode
 * and the vision encoder: matrix products (OpenBLAS, pinned to one thread
 * at open), RMSNorm, RoPE and one step of the linear-attention recurrence.
 * Pure functions of their arguments and the engine's tables.
 */
#include <cblas.h>
#include <math.h>

#include "epd_ref_int.h"

/* Y[rows, out] (ldy) = (beta ? Y : 0) + X[rows, in] (ldx) * W[out, in]^T */
void epd__ref_matmul(const float *x, int ldx, int rows, int in, const float *w, int out, float *y,
                     int ldy, float beta)
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
void epd__ref_matmul_rows(const float *x, int ldx, int rows, int in, const float *w, int out,
                          float *y, int ldy, float beta)
{
    for (int b = 0; b < rows; b++) {
        epd__ref_matmul(x + (size_t)b * (size_t)ldx, ldx, 1, in, w, out,
                        y + (size_t)b * (size_t)ldy, ldy, beta);
    }
}

void epd__ref_rmsnorm(const float *x, const float *w, uint32_t dim, double eps, float *out)
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
void epd__ref_rope(const struct epd_engine_impl *e, float *vec, uint32_t n_heads, uint32_t pos)
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

/* One linear-attention step for all heads: updates state (S, z per head),
 * writes the output of the token to o[heads*hd]. */
void epd__ref_linear_step(const struct epd_engine_impl *e, float *state, const float *q,
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
