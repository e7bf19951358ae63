/*
 * epd_sim_timing.c — the `sim` engine's roofline and its scaling (the
 * formulas are written out in epd_sim.h).
 *
 * Everything is computed at full size and multiplied by the factor of the
 * layer's kind, which is defined as the exact ratio of scaled to full bytes
 * of that kind.  That makes "time per byte written" independent of the scale
 * by construction, instead of approximately so after rounding.
 */
#include <math.h>
#include <string.h>

#include "epd_log.h"
#include "epd_sim.h"

#define EPD_SIM_LOG "sim"

static uint64_t epd_sim_gcd(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;

        a = b;
        b = t;
    }
    return a;
}

/* Picks n_kv_heads' <= n_kv_heads and head_dim' so that n_kv_heads' *
 * head_dim' is as close as possible to scale * n_kv_heads * head_dim, with
 * block_bytes a multiple of 64 and a head's row at least 8 bytes.  Ties go
 * to fewer heads: fewer, longer rows are cheaper to fill on a CPU, and the
 * head count of a scaled layout means nothing to anyone. */
static epd_status_t epd_sim_scale_kv(const epd_sim_model_t *m, double scale, uint32_t block_tokens,
                                     uint32_t *kvh_p, uint32_t *hd_p)
{
    uint64_t dsz = epd_dtype_size(m->kv_dtype);
    double full = (double)m->n_kv_heads * m->head_dim;
    double target = full * scale;
    double best_err = INFINITY;
    uint32_t best_k = 0;
    uint32_t best_hd = 0;

    if (scale == 1.0) {
        *kvh_p = m->n_kv_heads;
        *hd_p = m->head_dim;
        return EPD_OK;
    }
    for (uint32_t k = 1; k <= m->n_kv_heads; k++) {
        uint64_t per = 2ull * k * block_tokens * dsz; /* block bytes per unit of head_dim */
        uint64_t q = 64 / epd_sim_gcd(64, per);
        uint64_t hmin = (8 + dsz - 1) / dsz;
        uint64_t hd;
        double err;

        hmin = (hmin + q - 1) / q * q;
        hd = (uint64_t)llround(target / k / (double)q) * q;
        if (hd < hmin) {
            hd = hmin;
        }
        err = fabs((double)k * (double)hd - target) / target;
        if ((double)k * (double)hd <= full && err < best_err - 1e-12) {
            best_err = err;
            best_k = k;
            best_hd = (uint32_t)hd;
        }
    }
    if (best_k == 0) {
        epd_log_error(EPD_SIM_LOG, 0,
                      "scale %g of %s: no KV layout of %u-token blocks is a multiple of 64 bytes "
                      "and smaller than the real one",
                      scale, m->name, block_tokens);
        return EPD_ERR_INVALID_PARAM;
    }
    *kvh_p = best_k;
    *hd_p = best_hd;
    return EPD_OK;
}

epd_status_t epd_sim_timing_init(const epd_sim_conf_t *conf, uint32_t block_tokens,
                                 epd_sim_timing_t *timing_p)
{
    const epd_sim_model_t *m = &conf->model;
    size_t plen = strlen(m->layer_pattern);
    uint32_t devices = conf->devices == 0 ? 1 : conf->devices;
    double dsz = (double)epd_dtype_size(m->kv_dtype);
    epd_sim_timing_t t;
    uint32_t n_attn = 0;
    double budget;
    epd_status_t status;

    if (!(conf->scale > 0.0 && conf->scale <= 1.0) || block_tokens == 0 || plen == 0 ||
        m->n_layers == 0 || m->n_layers > EPD_KV_MAX_LAYERS || dsz == 0.0) {
        epd_log_error(EPD_SIM_LOG, 0, "sim configuration out of range (scale %g, block_tokens %u)",
                      conf->scale, block_tokens);
        return EPD_ERR_INVALID_PARAM;
    }
    memset(&t, 0, sizeof(t));
    t.n_layers = m->n_layers;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        t.kind[l] = m->layer_pattern[l % plen] == 'A' ? EPD_LAYER_ATTENTION : EPD_LAYER_LINEAR;
        n_attn += t.kind[l] == EPD_LAYER_ATTENTION;
    }
    t.flops = conf->accel.flops * devices;
    t.mem_bw = conf->accel.mem_bw * devices;
    t.active_params = m->active_params;
    t.total_params = m->total_params;
    t.weight_bytes = m->weight_bytes;
    t.n_heads = m->n_heads;
    t.head_dim = m->head_dim;
    t.qkv_params = (double)m->hidden * ((double)m->n_heads + 2.0 * m->n_kv_heads) * m->head_dim;
    if (t.qkv_params > m->active_params / m->n_layers) {
        t.qkv_params = m->active_params / m->n_layers;
    }
    t.kv_tok_bytes = 2.0 * m->n_kv_heads * m->head_dim * dsz;
    t.state_bytes = (double)m->state_bytes;
    status =
        epd_sim_scale_kv(m, conf->scale, block_tokens, &t.n_kv_heads_scaled, &t.head_dim_scaled);
    if (status != EPD_OK) {
        return status;
    }
    t.attn_factor =
        ((double)t.n_kv_heads_scaled * t.head_dim_scaled) / ((double)m->n_kv_heads * m->head_dim);
    if (m->state_bytes == 0 || conf->scale == 1.0) {
        t.state_bytes_scaled = m->state_bytes;
    } else {
        uint64_t s = (uint64_t)llround((double)m->state_bytes * conf->scale / 64.0) * 64;

        s = s < 64 ? 64 : s;
        t.state_bytes_scaled = s < m->state_bytes ? s : m->state_bytes;
    }
    t.linear_factor =
        m->state_bytes == 0 ? 1.0 : (double)t.state_bytes_scaled / (double)m->state_bytes;
    budget = conf->accel.hbm_bytes * devices - m->total_params * m->weight_bytes;
    budget = budget < 0.0 ? 0.0 : budget * (n_attn > 0 ? t.attn_factor : t.linear_factor);
    t.kv_budget_bytes = (uint64_t)budget;
    *timing_p = t;
    return EPD_OK;
}

/* Weight bytes one layer reads for n tokens: every token touches the
 * active parameters, n tokens at most all of them (MoE experts). */
static double epd_sim_weights(const epd_sim_timing_t *t, double n)
{
    double touched = n * t->active_params;

    if (touched > t->total_params) {
        touched = t->total_params;
    }
    return touched / t->n_layers * t->weight_bytes;
}

static double epd_sim_roofline(const epd_sim_timing_t *t, uint32_t layer, double flops,
                               double bytes)
{
    double compute = flops / t->flops;
    double memory = bytes / t->mem_bw;
    double factor = t->kind[layer] == EPD_LAYER_ATTENTION ? t->attn_factor : t->linear_factor;

    return (compute > memory ? compute : memory) * factor;
}

double epd_sim_prefill_seconds(const epd_sim_timing_t *t, uint32_t layer, uint32_t start,
                               uint32_t n_tokens)
{
    double n = n_tokens;
    double s = start;
    double flops = n * 2.0 * t->active_params / t->n_layers;
    double bytes = epd_sim_weights(t, n);

    if (t->kind[layer] == EPD_LAYER_ATTENTION) {
        /* token t attends to t+1 keys: sum over the chunk */
        flops += 4.0 * t->n_heads * t->head_dim * (n * s + n * (n + 1.0) / 2.0);
        bytes += (s + n) * t->kv_tok_bytes;
    } else {
        bytes += 2.0 * t->state_bytes;
    }
    return epd_sim_roofline(t, layer, flops, bytes);
}

double epd_sim_prefill_ready_seconds(const epd_sim_timing_t *t, uint32_t layer, uint32_t start,
                                     uint32_t n_tokens)
{
    double n = n_tokens;
    double all = epd_sim_prefill_seconds(t, layer, start, n_tokens);
    double bytes = t->qkv_params * t->weight_bytes +
                   (t->kind[layer] == EPD_LAYER_ATTENTION ? n * t->kv_tok_bytes : t->state_bytes);
    double ready = epd_sim_roofline(t, layer, n * 2.0 * t->qkv_params, bytes);

    (void)start;
    return ready < all ? ready : all;
}

double epd_sim_bytes_seconds(const epd_sim_timing_t *t, double bytes)
{
    return bytes / t->mem_bw;
}

double epd_sim_decode_seconds(const epd_sim_timing_t *t, uint32_t layer,
                              const epd_decode_req_t *reqs, uint32_t n_reqs)
{
    double flops = n_reqs * 2.0 * t->active_params / t->n_layers;
    double bytes = epd_sim_weights(t, n_reqs);

    for (uint32_t i = 0; i < n_reqs; i++) {
        double ctx = (double)reqs[i].pos + 1.0;

        if (t->kind[layer] == EPD_LAYER_ATTENTION) {
            flops += 4.0 * t->n_heads * t->head_dim * ctx;
            bytes += ctx * t->kv_tok_bytes;
        } else {
            bytes += 2.0 * t->state_bytes;
        }
    }
    return epd_sim_roofline(t, layer, flops, bytes);
}
