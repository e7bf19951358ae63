/*
 * epd_sim.h — the `sim` engine's profiles, configuration and timing model.
 *
 * `sim` is a timing model behind the engine interface (epd_engine.h): it
 * spends, per layer, the time a named accelerator would spend on a named
 * model, leaves KV of the real (or scaled) size in the pool — per-request
 * stamps (epd_kv_stamp.h) around block templates written once per pool —
 * and reports each layer to the sink where its KV exists in the model.  A
 * daemon selects it with `--engine sim --model DIR`, where DIR holds a
 * `sim.conf` (see epd_sim_conf_load).  This header is for the tests and the
 * benchmarks that need the same numbers the engine uses; daemons only need
 * epd_engine.h.
 *
 * Files are "key = value" lines; '#' starts a comment (whole line or after a
 * value); blank lines are ignored.  Every key of a profile is required,
 * unknown and repeated keys are refused, numbers must be whole (no trailing
 * text).  Each refusal is logged once as "FILE:LINE: why" and returns
 * EPD_ERR_MALFORMED (EPD_ERR_NOT_FOUND for a missing file).
 *
 * Model profile keys:
 *   name           text
 *   n_layers       1..256
 *   layer_pattern  letters L (linear attention) / A (full attention); layer i
 *                  is pattern[i % length] (as `ref`)
 *   hidden         model width (the size of the QKV projection, which is
 *                  where a layer's KV comes into existence)
 *   n_heads        query heads of an attention layer (attention FLOPs)
 *   n_kv_heads     KV heads (grouped-query attention), divides n_heads
 *   head_dim       1..4096
 *   kv_dtype       BF16 | F16 | F32
 *   state_bytes    recurrent state of one linear layer for one request
 *                  (>= 8 when the pattern has an L)
 *   active_params  parameters used per token (MoE: the routed experts)
 *   total_params   all parameters, >= active_params
 *   weight_bytes   bytes per parameter as stored (1 for W8A8 / FP8, 2 for BF16)
 *   vocab          258.. (byte tokenizer: 0..255 bytes, 256 BOS, 257 EOS)
 *   max_context    tokens
 * Accelerator profile keys (one device):
 *   name, flops (sustained FLOP/s), mem_bw (sustained bytes/s), hbm_bytes.
 *
 * Threads: every function here is pure or reads files; any thread.
 */
#ifndef EPD_SIM_H
#define EPD_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_kvq.h"
#include "epd_status.h"

#define EPD_SIM_NAME_MAX 64
#define EPD_SIM_CONF_FILE "sim.conf"

typedef struct {
    char name[EPD_SIM_NAME_MAX];
    uint32_t n_layers;
    char layer_pattern[EPD_KV_MAX_LAYERS + 1];
    uint32_t hidden;
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    epd_dtype_t kv_dtype;
    uint64_t state_bytes;
    double active_params;
    double total_params;
    double weight_bytes; /* per parameter */
    uint32_t vocab;
    uint32_t max_context;
} epd_sim_model_t;

typedef struct {
    char name[EPD_SIM_NAME_MAX];
    double flops;     /* sustained FLOP/s of one device */
    double mem_bw;    /* sustained bytes/s of one device */
    double hbm_bytes; /* memory of one device */
} epd_sim_accel_t;

typedef enum {
    EPD_SIM_SLEEP = 0, /* clock_nanosleep to each layer's deadline: the CPU stays free */
    EPD_SIM_SPIN = 1,  /* busy-wait to each deadline: the compute thread holds a core */
} epd_sim_mode_t;

/* The contents of a sim.conf, profiles loaded. */
typedef struct {
    epd_sim_model_t model;
    epd_sim_accel_t accel;
    double scale;     /* (0, 1]: KV bytes and time shrink by (about) this factor */
    uint32_t devices; /* accelerators one worker spans (ideal split, no communication) */
    epd_sim_mode_t mode;
    uint64_t seed;  /* KV bytes and logits */
    uint32_t vocab; /* 0 = the model's; else overrides it (cheaper logits on a CPU) */
    /* a per-layer KV dtype map (epd_kvq.h grammar: "int8", "0-3:bf16,4-:fp8");
     * "" = the profile's kv_dtype on every attention layer.  sim.conf's
     * kv_dtype_map, or the engine config's kv_dtype (--kv-dtype), which wins. */
    char kv_dtype_map[EPD_KVQ_MAP_MAX];
} epd_sim_conf_t;

/* Parses a model (accelerator) profile from `len` bytes of `text`; `origin`
 * names it in error lines.  *model_p is written only on success. */
epd_status_t epd_sim_model_parse(const char *text, size_t len, const char *origin,
                                 epd_sim_model_t *model_p);
epd_status_t epd_sim_accel_parse(const char *text, size_t len, const char *origin,
                                 epd_sim_accel_t *accel_p);
/* The same from a file. */
epd_status_t epd_sim_model_load(const char *path, epd_sim_model_t *model_p);
epd_status_t epd_sim_accel_load(const char *path, epd_sim_accel_t *accel_p);

/*
 * Reads DIR/sim.conf:
 *   model   = PATH   model profile (required; relative to DIR unless absolute)
 *   accel   = PATH   accelerator profile (required; same)
 *   scale   = S      0 < S <= 1 (default 1)
 *   devices = N      1..4096 (default 1)
 *   mode    = sleep | spin (default sleep)
 *   seed    = N      (default 0)
 *   vocab   = N      258.. (default: the model's)
 *   kv_dtype_map = MAP  per-layer KV dtypes (f32, bf16, fp8, int8; epd_kvq.h)
 *                    instead of the profile's kv_dtype (default: none)
 * and both profiles (the map is checked against the model by
 * epd_sim_timing_init).  Errors as the parsers.
 */
epd_status_t epd_sim_conf_load(const char *dir, epd_sim_conf_t *conf_p);

/* What a tool or benchmark passes to epd_sim_conf_write. */
typedef struct {
    const char *model; /* borrowed: model profile path (made absolute in the file) */
    const char *accel; /* borrowed: accelerator profile path */
    double scale;      /* 0 = 1 */
    uint32_t devices;  /* 0 = 1 */
    epd_sim_mode_t mode;
    uint64_t seed;
    uint32_t vocab; /* 0 = the model's */
    const char *kv_dtype_map; /* borrowed; NULL or "": none (the profile's kv_dtype) */
} epd_sim_options_t;

/* Creates DIR if needed and writes DIR/sim.conf from `opts` (profile paths
 * resolved with realpath, so the folder may be used from anywhere).  Does
 * not parse the profiles.  EPD_ERR_NOT_FOUND for a missing profile,
 * EPD_ERR_INVALID_PARAM for an option out of range, EPD_ERR_IO. */
epd_status_t epd_sim_conf_write(const char *dir, const epd_sim_options_t *opts);

/*
 * The timing model, resolved for one configuration and block size.
 *
 * Roofline per layer l, with D = devices, F = D * flops, B = D * mem_bw,
 * P_a / P_t the active / total parameters, L layers, wb bytes per parameter,
 * kv_tok = 2 * n_kv_heads * head_dim * dtype bytes (one token, one layer,
 * full size; with a KV dtype map, layer l's dtype, plus 2 * n_kv_heads * 4
 * bytes of scales for fp8 / int8: epd_kvq_block_bytes of one token),
 * S = state_bytes:
 *
 *   weights(n) = min(P_t, n * P_a) / L * wb      (n tokens touch at most
 *                                                  every expert once)
 *   prefill of tokens [s, s+n):
 *     flops  = n * 2 * P_a / L
 *            + attention layer: 4 * n_heads * head_dim * sum_{t=s}^{s+n-1} (t+1)
 *     bytes  = weights(n) + attention: (s + n) * kv_tok  (read the cached
 *                                                         prefix, write n)
 *                         + linear:    2 * S             (read + write state)
 *   decode step of requests r at positions pos_r (each appends one token):
 *     flops  = sum_r [2 * P_a / L + attention: 4 * n_heads * head_dim * (pos_r+1)]
 *     bytes  = weights(n_reqs) + sum_r [attention: (pos_r+1) * kv_tok
 *                                       | linear: 2 * S]
 *   time_l = max(flops / F, bytes / B) * factor(kind of l)
 *
 * Where in the layer its KV exists: a layer's K and V (a linear layer's
 * state update) come out of its QKV projection, before the attention and
 * the MLP.  With Q = hidden * (n_heads + 2 * n_kv_heads) * head_dim (at
 * most P_a / L) the projection's parameters, the KV of a prefill of n
 * tokens is ready after
 *   ready_l = min(time_l, max(n * 2 * Q / F,
 *                             (Q * wb + bytes the layer writes) / B) * factor)
 * (bytes written: n * kv_tok for attention, S for linear).
 *
 * Scale: at scale s < 1 the KV layout shrinks (fewer KV heads and/or a
 * smaller head_dim, block_bytes kept a multiple of 64, a K row of head 0
 * kept >= 8 bytes) and the state to a multiple of 64 bytes near s * S.  The
 * factor of each kind is the exact ratio of its scaled to its full bytes:
 *   attn_factor   = (n_kv_heads' * head_dim') / (n_kv_heads * head_dim)
 *   linear_factor = state_bytes' / state_bytes
 * With a KV dtype map every attention layer's block (its codes and, for
 * fp8 / int8, its f32 scale per token and head: the real format, scaled) is
 * kept a multiple of 64 bytes and each code row >= 8 bytes, head_dim' is
 * chosen so that the worst layer's bytes are closest to s times its full
 * bytes, and layer l's factor is its own exact ratio
 *   factor_l = block_bytes_l(n_kv_heads', head_dim') / block_bytes_l(full)
 * (= attn_factor for f32 / bf16 / f16: scales do not shrink with head_dim,
 * so an int8 layer's ratio is a little above the head ratio);
 * so the invariant is exact per layer: for every layer, prefill chunk and
 * decode batch,  time_l(s) / bytes_written_l(s) = time_l(1) / bytes_written_l(1)
 * where bytes_written_l is what the layer writes into the pool (n * kv_tok'
 * for attention, state_bytes' for linear) — the bytes a KV transfer moves
 * per unit of compute never depend on the scale.
 */
typedef struct {
    uint32_t n_layers;
    uint8_t kind[EPD_KV_MAX_LAYERS]; /* epd_layer_kind_t */
    double flops;                    /* D * accel flops */
    double mem_bw;                   /* D * accel mem_bw */
    double active_params;
    double total_params;
    double weight_bytes;
    double n_heads;
    double head_dim;
    double qkv_params;   /* the QKV projection's parameters per layer (<= P_a / L) */
    double state_bytes;  /* full size */
    double attn_factor;  /* the head ratio (the layout's); layers use factor[] */
    double linear_factor;
    /* per layer: the KV dtype (epd_dtype_t; attention layers), the full-size
     * KV bytes of one token (codes and scales; 0 for linear layers) and the
     * factor its time is scaled by (attention: factor_l above; linear:
     * linear_factor) */
    uint8_t kv_dtype[EPD_KV_MAX_LAYERS];
    double kv_tok[EPD_KV_MAX_LAYERS];
    double factor[EPD_KV_MAX_LAYERS];
    int kv_mapped; /* kv_dtype[] comes from conf->kv_dtype_map */
    /* the scaled layout */
    uint32_t n_kv_heads_scaled;
    uint32_t head_dim_scaled;
    uint64_t state_bytes_scaled;
    /* KV + state memory of the devices once the weights are in, scaled by
     * attn_factor (0 when the weights do not fit): a realistic pool size */
    uint64_t kv_budget_bytes;
} epd_sim_timing_t;

/* Resolves `conf` for KV blocks of `block_tokens` tokens.
 * EPD_ERR_INVALID_PARAM when the scale cannot be met or conf->kv_dtype_map
 * is not a map of this model's layers (logged). */
epd_status_t epd_sim_timing_init(const epd_sim_conf_t *conf, uint32_t block_tokens,
                                 epd_sim_timing_t *timing_p);

/* Modelled seconds of layer `layer` for a prefill of tokens [start, start+n). */
double epd_sim_prefill_seconds(const epd_sim_timing_t *t, uint32_t layer, uint32_t start,
                               uint32_t n_tokens);

/* Modelled seconds from the start of layer `layer` of that prefill until its
 * KV exists (ready_l above; <= epd_sim_prefill_seconds). */
double epd_sim_prefill_ready_seconds(const epd_sim_timing_t *t, uint32_t layer, uint32_t start,
                                     uint32_t n_tokens);

/* Modelled seconds of a device kernel that reads `bytes` of (scaled) KV once
 * (a checksum, a verification): bytes / B, times nothing — the bytes are
 * already the scaled ones. */
double epd_sim_bytes_seconds(const epd_sim_timing_t *t, double bytes);

/* Modelled seconds of layer `layer` for one decode step of `reqs`. */
double epd_sim_decode_seconds(const epd_sim_timing_t *t, uint32_t layer,
                              const epd_decode_req_t *reqs, uint32_t n_reqs);

#endif
