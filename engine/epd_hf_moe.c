/*
 * epd_hf_moe.c — Qwen3-MoE's sparse MLP for one token (transformers'
 * Qwen3MoeSparseMoeBlock): router logits = gate(h), softmax over the
 * experts (here in double), the top k (ties: the lower expert index, as
 * torch.topk on equal values keeps the first), their weights divided by
 * their sum when norm_topk_prob, and the weighted sum of the chosen
 * SwiGLU experts added in ascending expert order (the order of the
 * reference's index_add loop).
 *
 * One token at a time through the widening mat-vec, in prefill too: a
 * batched expert product would run a different sgemm shape for each count
 * of tokens routed to the expert, so a token's output would depend on the
 * other tokens of the chunk (split and batch invariance both break).
 */
#include <string.h>

#include "epd_hf_int.h"

void epd_hf_moe_token(struct epd_engine_impl *e, const epd_hf_layer_t *L, const float *h, float *x,
                      float *g, float *u)
{
    const epd_hf_hparams_t *hp = &e->hp;
    uint32_t E = hp->n_experts;
    uint32_t K = hp->top_k;
    uint32_t dim = hp->dim;
    uint32_t sel[EPD_HF_MAX_EXPERTS];
    double wsel[EPD_HF_MAX_EXPERTS];
    uint8_t taken[EPD_HF_MAX_EXPERTS];
    double mx;
    double sum = 0.0;
    double wsum = 0.0;
    float *tmp = e->m_y;
    float *acc = e->m_y + dim;

    epd_hf_matvec(&L->router, h, e->m_logit, 0);
    mx = e->m_logit[0];
    for (uint32_t i = 1; i < E; i++) {
        mx = e->m_logit[i] > mx ? e->m_logit[i] : mx;
    }
    for (uint32_t i = 0; i < E; i++) {
        sum += exp((double)e->m_logit[i] - mx);
    }
    memset(taken, 0, E);
    for (uint32_t k = 0; k < K; k++) {
        uint32_t best = E;

        for (uint32_t i = 0; i < E; i++) {
            if (!taken[i] && (best == E || e->m_logit[i] > e->m_logit[best])) {
                best = i;
            }
        }
        taken[best] = 1;
        sel[k] = best;
        wsel[k] = exp((double)e->m_logit[best] - mx) / sum;
        wsum += wsel[k];
    }
    /* ascending expert order for the sum */
    for (uint32_t a = 1; a < K; a++) {
        for (uint32_t b = a; b > 0 && sel[b - 1] > sel[b]; b--) {
            uint32_t ts = sel[b];
            double tw = wsel[b];

            sel[b] = sel[b - 1];
            wsel[b] = wsel[b - 1];
            sel[b - 1] = ts;
            wsel[b - 1] = tw;
        }
    }
    memset(acc, 0, dim * sizeof(float));
    for (uint32_t k = 0; k < K; k++) {
        const epd_hf_expert_t *X = &L->experts[sel[k]];
        float w = (float)(hp->norm_topk ? wsel[k] / wsum : wsel[k]);

        epd_hf_matvec(&X->gate, h, g, 0);
        epd_hf_matvec(&X->up, h, u, 0);
        for (uint32_t i = 0; i < hp->moe_ffn; i++) {
            g[i] = epd_hf_silu(g[i]) * u[i];
        }
        epd_hf_matvec(&X->down, g, tmp, 0);
        for (uint32_t i = 0; i < dim; i++) {
            acc[i] += w * tmp[i];
        }
    }
    for (uint32_t i = 0; i < dim; i++) {
        x[i] += acc[i];
    }
}
