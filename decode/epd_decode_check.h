/*
 * epd_decode_check.h — the decode worker's pure checks: is a GenerateRequest
 * servable by this model (proto/README.md rule 3) and does it name a
 * prefill worker that can be told, and does the KV a prefill worker wrote
 * match the checksums of its landed LayerDones and its PrefillComplete
 * (rule 6) — the checks of one layer, of either checksum kind, and the
 * bookkeeping of which layers of a request are checked (the checks run on
 * the verifier thread, epd_decode_verify).
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
#include "epd_kv_stamp.h"
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
 * The same check for one layer `layer` against `sum` (kind BYTES).
 * EPD_OK, EPD_ERR_CORRUPT, or EPD_ERR_INVALID_PARAM for a layer outside the
 * model or a block/slot outside the pool.  *bytes_p (may be NULL) gets the
 * bytes hashed.
 */
epd_status_t epd_decode_check_kv_layer(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                       const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                       uint32_t layer, uint64_t sum, epd_hash_state_t *h,
                                       uint64_t *bytes_p);

/*
 * Part of a BYTES check (a chunked prefill's layer, rule 4): hashes
 * attention layer `layer`'s blocks ids[from..to) into `h` (NOT reset: it
 * holds blocks [0, from) already) and compares its digest with `sum`.
 * EPD_OK; EPD_ERR_CORRUPT or EPD_ERR_INVALID_PARAM (a block outside the
 * pool, a linear layer) with *why_p (may be NULL) a static string;
 * *bytes_p the bytes hashed now.
 */
epd_status_t epd_decode_check_kv_blocks(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                        const uint32_t *ids, uint32_t from, uint32_t to,
                                        uint32_t layer, uint64_t sum, epd_hash_state_t *h,
                                        uint64_t *bytes_p, const char **why_p);

/*
 * One layer's check of either kind (proto/README.md rule 6): BYTES hashes
 * every byte (epd_decode_check_kv_layer); STAMPED checks every unit's stamp
 * against `expect` and the stamps' checksum (epd_kv_stamp_check_layer; with
 * expect->full every body too).  EPD_OK; EPD_ERR_CORRUPT or
 * EPD_ERR_INVALID_PARAM with *why_p a static string; *bytes_p (may be
 * NULL) the bytes the layer spans.
 */
epd_status_t epd_decode_check_layer(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                    const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                    uint32_t layer, uint64_t sum, epd_kv_sum_kind_t kind,
                                    const epd_kv_stamp_expect_t *expect, epd_hash_state_t *h,
                                    uint64_t *bytes_p, const char **why_p);

/* Where one layer of a request stands in its verification. */
enum {
    EPD_DECODE_KV_WAIT = 0, /* no checksum yet */
    EPD_DECODE_KV_CHECKING, /* its check is lent to the verifier */
    EPD_DECODE_KV_OK,       /* verified */
};
/* Or'ed into CHECKING: PrefillComplete carried another sum than the
 * LayerDone the check runs against; the check's outcome decides which of
 * the two was wrong (epd_decode_seen_result). */
#define EPD_DECODE_KV_DISAGREE 0x80u

/*
 * What one request's KV verification established so far: the caller's
 * storage, [n_layers] entries each, zeroed before the first message (kind
 * -1).  Pure bookkeeping; the checks themselves run elsewhere.
 */
typedef struct {
    uint64_t *sums;  /* [n_layers]: the checksum a layer is checked against */
    uint8_t *state;  /* [n_layers]: EPD_DECODE_KV_* */
    uint32_t n_ok;   /* layers verified */
    uint32_t n_checking;
    int kind;        /* the request's epd_kv_sum_kind_t once a sum came, else -1 */
    uint64_t bytes;  /* bytes of the layers verified */
} epd_decode_kv_seen_t;

/*
 * A landed LayerDone{layer, sum, kind}: *check_p = 1 when the layer must be
 * checked now (it is marked CHECKING), 0 when it was already (the same sum
 * again).  EPD_OK; EPD_ERR_INVALID_PARAM with *why_p for a layer outside
 * the model, a second different sum, or a kind other than the request's.
 */
epd_status_t epd_decode_seen_landed(epd_decode_kv_seen_t *seen, uint32_t n_layers, uint32_t layer,
                                    uint64_t sum, int kind, int *check_p, const char **why_p);

/*
 * PrefillComplete's sums[0..n_sums) of `kind`: every layer not checked yet
 * takes its sum and is marked CHECKING, with newly[layer] = 1 (the caller's
 * [n_layers] scratch, written here: the layers the caller must check now);
 * a verified layer must carry the sum it matched; a layer still being
 * checked against another sum is marked EPD_DECODE_KV_DISAGREE (its check
 * decides).  EPD_OK; EPD_ERR_INVALID_PARAM with *why_p (wrong number of
 * sums, a sum disagreeing with a verified layer, another kind).  Nothing is
 * changed on failure.
 */
epd_status_t epd_decode_seen_completed(epd_decode_kv_seen_t *seen, uint32_t n_layers,
                                       const uint64_t *sums, size_t n_sums, int kind,
                                       uint8_t *newly, const char **why_p);

/* Protocol-only requests (nothing is written): every layer not checked
 * yet stands verified as it is. */
void epd_decode_seen_trust(epd_decode_kv_seen_t *seen, uint32_t n_layers);

/* How the first token ends a request of max_tokens (Epd__FinishReason):
 * STOP for an eos id of info (NULL: EOS ignored, the request's ignore_eos)
 * or a stop id, LENGTH when it is the only token, else NONE. */
int epd_decode_first_finish(uint32_t first_token, const epd_engine_info_t *info,
                            const uint32_t *stop_ids,
                            uint32_t n_stop, uint32_t max_tokens);

/* A layer's check came back with `status`: OK marks it verified (its bytes
 * counted).  Returns what the request fails with: the check's status, or
 * EPD_ERR_INVALID_PARAM (*why_p) when it matched the LayerDone's sum that
 * PrefillComplete disagreed with; EPD_OK otherwise. */
epd_status_t epd_decode_seen_result(epd_decode_kv_seen_t *seen, uint32_t layer,
                                    epd_status_t status, uint64_t bytes, const char **why_p);

#endif
