/*
 * epd_decode_check.h — the decode worker's pure checks: is a GenerateRequest
 * servable by this model (proto/README.md rule 3) and does it name a
 * prefill worker that can be told, and does the KV a prefill worker wrote
 * match the checksums of its landed LayerDones and its PrefillComplete
 * (rule 6) — the KV verification, layer by layer as the layers land and
 * for whatever is left at completion.
 *
 * No state of its own, no I/O: what a request's verification established
 * so far lives in the caller's epd_decode_kv_seen_t.  Any thread (the
 * daemon calls them on its loop thread).  A role part: it answers, it
 * changes no request.
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

/*
 * Does `g` name a prefill worker that can be told about it: a worker id of
 * 1..EPD_WORKER_ID_MAX-1 bytes, an epoch, and an address of
 * 1..EPD_XPORT_ADDR_MAX bytes?  (A refused request is refused to that
 * worker too, so that it does not wait for a reservation.)
 */
int epd_decode_check_prefill_named(const Epd__GenerateRequest *g);

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

/*
 * What one request's KV verification established so far: the caller's
 * storage, [n_layers] entries each, zeroed before the first check.
 */
typedef struct {
    uint64_t *sums; /* [n_layers]: the checksum a verified layer matched */
    uint8_t *ok;    /* [n_layers]: nonzero once that layer is verified */
    uint32_t n_ok;  /* layers verified */
    uint64_t bytes; /* bytes hashed and matched so far */
} epd_decode_kv_seen_t;

/*
 * A landed LayerDone{layer, sum}: its writes are final here, so the layer
 * is hashed now (once; a second LayerDone of a verified layer must carry
 * the same sum).  EPD_OK (verified, recorded in *seen); otherwise
 * EPD_ERR_INVALID_PARAM (a layer outside the model, a second different
 * sum, a block or slot outside the pool) or EPD_ERR_CORRUPT, with *why_p a
 * static string naming the problem.
 */
epd_status_t epd_decode_check_landed(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                     const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                     uint32_t layer, uint64_t sum, epd_hash_state_t *h,
                                     epd_decode_kv_seen_t *seen, const char **why_p);

/*
 * PrefillComplete's checksums sums[0..n_sums): every layer not verified
 * yet is hashed against its sum (all of them when no landed LayerDone
 * came); a layer verified earlier must carry the sum it matched then (else
 * EPD_ERR_INVALID_PARAM: it would read as corruption otherwise).  EPD_OK;
 * EPD_ERR_CORRUPT with *bad_layer_p the first layer that differs;
 * EPD_ERR_INVALID_PARAM (wrong number of sums, a disagreeing sum, a block
 * or slot outside the pool); *why_p a static string on failure.
 */
epd_status_t epd_decode_check_completed(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                        const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                        const uint64_t *sums, size_t n_sums, epd_hash_state_t *h,
                                        epd_decode_kv_seen_t *seen, const char **why_p,
                                        uint32_t *bad_layer_p);

#endif
