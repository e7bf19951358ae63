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

#include "epd_kvq.h"
#include "epd_log.h"
#include "epd_sim.h"

#define EPD_SIM_LOG "sim"

/* Bytes of one block of `dtype` (epd_kvq.h: codes, and for fp8 / int8 an
 * f32 scale per token and head). */
static uint64_t epd_sim_block_bytes(uint32_t dtype, uint32_t kvh, uint32_t bt, uint64_t hd)
{
    return epd_kvq_block_bytes((epd_dtype_t)dtype, kvh, bt, (uint32_t)hd);
}

/* Nonzero when a layout of kvh heads of hd suits every dtype in `dmask`
 * (bit d: some attention layer holds dtype d): each block a multiple of 64
 * bytes, each code row at least 8 bytes. */
static int epd_sim_kv_fits(uint32_t dmask, uint32_t kvh, uint32_t bt, uint64_t hd)
{
    for (uint32_t d = 0; d < 8; d++) {
        if ((dmask >> d & 1) != 0 && (hd * epd_dtype_size((epd_dtype_t)d) < 8 ||
                                      epd_sim_block_bytes(d, kvh, bt, hd) % 64 != 0)) {
            return 0;
        }
    }
    return 1;
}

/* Worst relative distance, over the dtypes of dmask, between a layer's
 * scaled bytes (kvh heads of hd) and `scale` times its full bytes. */
static double epd_sim_kv_err(const epd_sim_model_t *m, uint32_t dmask, double scale, uint32_t kvh,
                             uint64_t hd)
{
    double worst = 0.0;

    for (uint32_t d = 0; d < 8; d++) {
        if ((dmask >> d & 1) != 0) {
            double full = (double)epd_sim_block_bytes(d, m->n_kv_heads, 1, m->head_dim);
            double err = fabs((double)epd_sim_block_bytes(d, kvh, 1, hd) / full - scale) / scale;

            worst = err > worst ? err : worst;
        }
    }
    return worst;
}

/* Picks n_kv_heads' <= n_kv_heads and head_dim' so that each dtype's block
 * is as close as possible to scale times its full size (the worst dtype
 * decides), with every block a multiple of 64 bytes and a head's code row
 * at least 8 bytes.  Per head count k, the valid head_dims around each
 * dtype's exact one (where its bytes are scale times the full ones) are
 * tried, ties going to the larger; k is dropped when its best is larger
 * than the real layout.  For one dtype without scales this is the valid
 * head_dim nearest to scale * n_kv_heads * head_dim / k.  Ties between head
 * counts go to fewer heads: fewer, longer rows are cheaper to fill on a
 * CPU, and the head count of a scaled layout means nothing to anyone. */
static epd_status_t epd_sim_scale_kv(const epd_sim_model_t *m, uint32_t dmask, double scale,
                                     uint32_t block_tokens, uint32_t *kvh_p, uint32_t *hd_p)
{
    double full = (double)m->n_kv_heads * m->head_dim;
    double best_err = INFINITY;
    uint32_t best_k = 0;
    uint32_t best_hd = 0;

    if (scale == 1.0) {
        *kvh_p = m->n_kv_heads;
        *hd_p = m->head_dim;
        return EPD_OK;
    }
    for (uint32_t k = 1; k <= m->n_kv_heads; k++) {
        double x_lo = INFINITY;
        double x_hi = 0.0;
        double k_err = INFINITY;
        uint64_t k_hd = 0;

        for (uint32_t d = 0; d < 8; d++) {
            /* bytes per (token, head) = (hd + e) * size, e * size the
             * scale's; x: the head_dim whose bytes are exactly `scale`
             * times the full ones (e = 0: scale * n_kv_heads * head_dim / k,
             * computed in that order) */
            double size = (double)epd_dtype_size((epd_dtype_t)d);
            double e = epd_kvq_dtype_scaled((epd_dtype_t)d) ? (double)sizeof(float) / size : 0.0;
            double x;

            if ((dmask >> d & 1) == 0) {
                continue;
            }
            x = (double)m->n_kv_heads * (m->head_dim + e) * scale / k - e;
            x_lo = x < x_lo ? x : x_lo;
            x_hi = x > x_hi ? x : x_hi;
        }
        /* the valid head_dims repeat every 64 at most: 64 either side of
         * the exact ones holds the nearest of each */
        for (uint64_t hd = x_lo > 65.0 ? (uint64_t)floor(x_lo) - 64 : 1;
             (double)hd <= ceil(x_hi) + 64.0; hd++) {
            double err;

            if (!epd_sim_kv_fits(dmask, k, block_tokens, hd)) {
                continue;
            }
            err = epd_sim_kv_err(m, dmask, scale, k, hd);
            if (err <= k_err + 1e-12) {
                k_err = err;
                k_hd = hd;
            }
        }
        if (k_hd == 0 || (double)k * (double)k_hd > full) {
            continue;
        }
        if (k_err < best_err - 1e-12) {
            best_err = k_err;
            best_k = k;
            best_hd = (uint32_t)k_hd;
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
    epd_sim_timing_t t;
    uint32_t n_attn = 0;
    uint32_t dmask = 0; /* bit d: an attention layer holds dtype d */
    double attn_full = 0.0;
    double attn_scaled = 0.0;
    double budget;
    epd_status_t status;

    if (!(conf->scale > 0.0 && conf->scale <= 1.0) || block_tokens == 0 || plen == 0 ||
        m->n_layers == 0 || m->n_layers > EPD_KV_MAX_LAYERS || epd_dtype_size(m->kv_dtype) == 0) {
        epd_log_error(EPD_SIM_LOG, 0, "sim configuration out of range (scale %g, block_tokens %u)",
                      conf->scale, block_tokens);
        return EPD_ERR_INVALID_PARAM;
    }
    memset(&t, 0, sizeof(t));
    t.n_layers = m->n_layers;
    if (conf->kv_dtype_map[0] != '\0') {
        const char *why = NULL;

        if (epd_kvq_map_parse(conf->kv_dtype_map, m->n_layers, t.kv_dtype, &why) != EPD_OK) {
            epd_log_error(EPD_SIM_LOG, 0, "--kv-dtype '%s': %s", conf->kv_dtype_map, why);
            return EPD_ERR_INVALID_PARAM;
        }
        t.kv_mapped = 1;
    }
    for (uint32_t l = 0; l < m->n_layers; l++) {
        t.kind[l] = m->layer_pattern[l % plen] == 'A' ? EPD_LAYER_ATTENTION : EPD_LAYER_LINEAR;
        if (t.kind[l] != EPD_LAYER_ATTENTION) {
            t.kv_dtype[l] = EPD_DTYPE_F32; /* the state's, opaque bytes */
            continue;
        }
        n_attn++;
        if (!t.kv_mapped) {
            t.kv_dtype[l] = (uint8_t)m->kv_dtype;
        }
        dmask |= 1u << t.kv_dtype[l];
        t.kv_tok[l] =
            (double)epd_kvq_block_bytes((epd_dtype_t)t.kv_dtype[l], m->n_kv_heads, 1, m->head_dim);
    }
    if (dmask == 0) {
        dmask = 1u << m->kv_dtype; /* no attention layer: the layout is still described */
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
    t.state_bytes = (double)m->state_bytes;
    status = epd_sim_scale_kv(m, dmask, conf->scale, block_tokens, &t.n_kv_heads_scaled,
                              &t.head_dim_scaled);
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
    for (uint32_t l = 0; l < m->n_layers; l++) {
        if (t.kind[l] == EPD_LAYER_ATTENTION) {
            double scaled = (double)epd_kvq_block_bytes((epd_dtype_t)t.kv_dtype[l],
                                                        t.n_kv_heads_scaled, 1, t.head_dim_scaled);

            /* the exact ratio of this layer's scaled to full bytes: for f32
             * / bf16 / f16 the head ratio; fp8 / int8 add their scales */
            t.factor[l] = scaled / t.kv_tok[l];
            attn_full += t.kv_tok[l];
            attn_scaled += scaled;
        } else {
            t.factor[l] = t.linear_factor;
        }
    }
    budget = conf->accel.hbm_bytes * devices - m->total_params * m->weight_bytes;
    budget = budget < 0.0 ? 0.0 : budget * (n_attn > 0 ? attn_scaled / attn_full : t.linear_factor);
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
    return (compute > memory ? compute : memory) * t->factor[layer];
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
        bytes += (s + n) * t->kv_tok[layer];
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
                   (t->kind[layer] == EPD_LAYER_ATTENTION ? n * t->kv_tok[layer] : t->state_bytes);
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
            bytes += ctx * t->kv_tok[layer];
        } else {
            bytes += 2.0 * t->state_bytes;
        }
    }
    return epd_sim_roofline(t, layer, flops, bytes);
}
