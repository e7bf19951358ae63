/*
 * epd_kvq.h — quantized KV: element codecs, the per-layer dtype map, and the
 * row format engines write into KV blocks.
 *
 * KV dtypes: F32 (the reference), BF16 (round to nearest even, NaN kept),
 * FP8 (OCP E4M3: bias 7, max ±448, NaN 0x7F/0xFF, no infinities; saturating)
 * and INT8 (symmetric, ±127, code -128 reserved for NaN).
 *
 * Scales.  FP8 and INT8 rows carry one f32 scale per (token, KV head): the
 * row's amax / 448 (fp8) or amax / 127 (int8), 1 for an all-zero row.  Per
 * token rather than per block because a block is filled one token at a time
 * by decode: a per-block scale would have to grow (and re-quantize the rows
 * already written) as tokens arrive, so the bytes of position p would depend
 * on later tokens — which breaks split invariance (epd_engine.h), the prefix
 * cache and the byte-equality of disaggregated and colocated runs.  Per
 * token, a row's bytes depend on that row alone.
 *
 * The scales live INSIDE the block, so the transport moves bytes and nothing
 * else.  One block of one attention layer is two equal halves, K then V (so
 * V stays at +block_bytes/2):
 *
 *   half: [kv_head][tok][head_dim] codes (dtype size each),
 *         then (fp8, int8 only) [kv_head][tok] f32 scales
 *
 * Threads: pure functions, any thread.
 */
#ifndef EPD_KVQ_H
#define EPD_KVQ_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"

/* Longest dtype map string accepted ("0-3:bf16,4-:fp8"). */
#define EPD_KVQ_MAP_MAX 256

/* Largest head_dim a quantized layer supports (rows are dequantized on the
 * stack). */
#define EPD_KVQ_MAX_HEAD_DIM 1024

/* One value <-> code.  Pure. */
uint16_t epd_kvq_bf16_from_f32(float x);
float epd_kvq_bf16_to_f32(uint16_t b);
uint8_t epd_kvq_fp8_from_f32(float x); /* saturates to ±448; NaN -> 0x7F (sign kept) */
float epd_kvq_fp8_to_f32(uint8_t c);
int8_t epd_kvq_int8_from_f32(float x, float inv_scale); /* NaN -> -128 */
float epd_kvq_int8_to_f32(int8_t c, float scale);

/* Nonzero for a dtype a KV layer may hold (F32, BF16, FP8_E4M3, INT8). */
int epd_kvq_dtype_ok(epd_dtype_t dtype);
/* Nonzero when rows of `dtype` carry a scale. */
int epd_kvq_dtype_scaled(epd_dtype_t dtype);
/* "f32", "bf16", "fp8", "int8" ("?" otherwise); static. */
const char *epd_kvq_dtype_short(epd_dtype_t dtype);

/* Bytes of one block of one attention layer holding `dtype`. */
uint64_t epd_kvq_block_bytes(epd_dtype_t dtype, uint32_t n_kv_heads, uint32_t block_tokens,
                             uint32_t head_dim);

/*
 * Parses a dtype map: "int8" (every layer), or comma-separated "A-B:dtype",
 * "A-:dtype", "A:dtype" ranges over absolute layer indices (later entries
 * win; layers no entry names stay f32).  Writes dtypes[0..n_layers).  NULL
 * or "" means all f32.  EPD_ERR_INVALID_PARAM, with a static reason in
 * *why_p, for a bad dtype name, a range outside [0, n_layers) or a malformed
 * entry.  Pure.
 */
epd_status_t epd_kvq_map_parse(const char *map, uint32_t n_layers, uint8_t *dtypes,
                               const char **why_p);

/*
 * Sets the attention dtype of every layer of `kv` from dtypes[0..n_layers)
 * (NULL: all f32; linear layers ignore theirs, their state stays f32) and
 * recomputes the per-layer block bytes and offsets and kv->block_bytes (the
 * largest layer's) and kv->dtype (the common dtype, or the first attention
 * layer's when mixed; kv->mixed says so).  kv's shape fields must be set.
 */
void epd_kvq_layout_apply(epd_kv_layout_t *kv, const uint8_t *dtypes);

/* Parses `map` (NULL: all f32) for kv's layers and applies it; a refusal
 * is logged once under `comp` with its reason (EPD_ERR_INVALID_PARAM, or
 * EPD_ERR_UNSUPPORTED for a head_dim above EPD_KVQ_MAX_HEAD_DIM). */
epd_status_t epd_kvq_layout_set(epd_kv_layout_t *kv, const char *map, const char *comp);

/* The canonical map string of a layout ("f32", "int8", "0-3:bf16,4-7:fp8",
 * attention layers only) into buf[cap]; what workers register and epd-ctl
 * prints.  Truncated (still terminated) when cap is short. */
void epd_kvq_map_format(const epd_kv_layout_t *kv, char *buf, size_t cap);

/*
 * Writes one row (head_dim floats of `x`) of (half v: 0 K / 1 V, kv head,
 * token-in-block tok) into the block at `block` of layer `layer`, quantized
 * to the layer's dtype.  `block` points to the start of that layer's block.
 */
void epd_kvq_row_put(const epd_kv_layout_t *kv, uint32_t layer, void *block, int v, uint32_t kvh,
                     uint32_t tok, const float *x);
/* Reads (dequantizes) that row into out[head_dim]. */
void epd_kvq_row_get(const epd_kv_layout_t *kv, uint32_t layer, const void *block, int v,
                     uint32_t kvh, uint32_t tok, float *out);
/* Zeroes that row (codes and scale). */
void epd_kvq_row_zero(const epd_kv_layout_t *kv, uint32_t layer, void *block, int v, uint32_t kvh,
                      uint32_t tok);

#endif
