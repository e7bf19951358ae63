/*
 * epd_decode_check.h — the decode worker's pure checks: is a GenerateRequest
 * servable by this model (proto/README.md rule 3), and does the KV a
 * prefill worker wrote match the checksums of its PrefillComplete (rule 6).
 *
 * No state, no I/O: any thread (the daemon calls them on its loop thread).
 */
#ifndef EPD_DECODE_CHECK_H
#define EPD_DECODE_CHECK_H

#include <stdint.h>

#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_msg.h"
#include "epd_sample.h"

/* Most stop token ids a request may carry. */
#define EPD_DECODE_MAX_STOP_IDS 64

typedef struct {
    uint32_t vocab_size;
    uint32_t max_context; /* prompt + max_tokens must fit */
} epd_decode_limits_t;

/*
 * Checks the prompt and sampling of `g` (borrowed): 1 <= n_prompt, every
 * token < vocab, 1 <= max_tokens, n_prompt + max_tokens <= max_context,
 * sampling in range (epd_sample_params_check; top_p 0 means off), at most
 * EPD_DECODE_MAX_STOP_IDS stop ids each < vocab.  On EPD_OK *sp_p holds the
 * sampling parameters.  Otherwise EPD_ERR_INVALID_PARAM or EPD_ERR_TOO_LONG
 * and *why_p a static string naming the first problem.
 */
epd_status_t epd_decode_check_generate(const epd_decode_limits_t *lim,
                                       const Epd__GenerateRequest *g, epd_sample_params_t *sp_p,
                                       const char **why_p);

/* ceil(a / b) for b > 0, without overflow. */
static inline uint64_t epd_decode_div_up(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

/*
 * Hashes this worker's copy of every layer of one request the way the
 * prefill side hashed what it wrote (xxh3-64, seed 0, streaming): an
 * attention layer = the full block_bytes of each prompt block, in
 * reservation order; a linear layer = the slot's state_bytes.  `pool`
 * describes the pool (borrowed), ids[0..n_ids) the prompt blocks, `slot` the
 * state slot (ignored without linear layers), sums[0..n_sums) the checksums
 * from PrefillComplete, `h` a scratch streaming state (caller's).
 * EPD_OK when all match; EPD_ERR_CORRUPT with *bad_layer_p the first layer
 * that differs; EPD_ERR_INVALID_PARAM when n_sums is not the number of
 * layers or a block/slot is outside the pool.
 */
epd_status_t epd_decode_check_kv(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                 const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                 const uint64_t *sums, size_t n_sums, epd_hash_state_t *h,
                                 uint32_t *bad_layer_p);

/*
 * The same check for one layer `layer` against `sum` (per-layer
 * verification: a LayerDone with landed = true).  EPD_OK, EPD_ERR_CORRUPT,
 * or EPD_ERR_INVALID_PARAM for a layer outside the model or a block/slot
 * outside the pool.  *bytes_p (may be NULL) gets the bytes hashed.
 */
epd_status_t epd_decode_check_kv_layer(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                       const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                       uint32_t layer, uint64_t sum, epd_hash_state_t *h,
                                       uint64_t *bytes_p);

#endif
