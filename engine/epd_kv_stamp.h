/*
 * epd_kv_stamp.h — stamped KV units: how an engine whose KV lives in device
 * memory (`sim` models one) marks each piece of KV it writes so that the
 * receiving side can check, cheaply and without hashing every byte, that
 * the right bytes landed in the right place.
 *
 * A unit is one block of one attention layer (epd_kv_layer_block_bytes:
 * layers of different KV dtypes differ in size) or one linear layer's
 * state slot (state_bytes), at least EPD_KV_STAMP_MIN bytes.  Its
 * first 32 bytes (the head) and its last 32 bytes (the tail) are the stamp;
 * the bytes between (the body) are the engine's:
 *
 *   head  u32 magic "EPDS" | u32 layer | u64 req_id | u32 index | u32 count
 *         | u64 tag
 *   tail  u64 req_id | u64 hk | u64 body | u64 check
 *
 *   req_id  the request the unit belongs to (its misrouted bytes say so)
 *   layer   the unit's layer, index its block's place in the request's block
 *           table (0 for a state slot): a misplaced unit says so
 *   count   tokens the unit holds (a block: 1..block_tokens; a state: the
 *           tokens it summarises)
 *   tag     the decode incarnation the KV is for (epd_kv_stamp_tag of its
 *           epoch; 0 for none): a write meant for another incarnation says so
 *   hk      engine data (sim: the prefix hash of the unit's last token, which
 *           a decode step reads back)
 *   body    xxh3-64 (seed 0) of the body
 *   check   a mix of every other field of both halves: a head and a tail from
 *           two different writes (a torn write) do not agree
 *
 * Host byte order (as the transport's frames: both ends run the same build
 * on the same kind of machine).
 *
 * The checksum of kind EPD_KV_SUM_STAMPED of one layer of one request is the
 * xxh3-64 (seed 0) of the concatenation, in write order (the request's
 * prompt blocks in block-table order; the state slot of a linear layer), of
 * each unit's head and tail (64 bytes per unit).  It covers the body through
 * the body digest in the tail, so a writer that knows its bodies' digests
 * (written once, from a template) computes it from 64 bytes per unit, and a
 * checker reads 64 bytes per unit ("stamps") — or also hashes every body and
 * compares it with its digest ("full").  What stamps alone cannot see: a
 * body changed while both stamps stayed intact (a write torn in its middle
 * only, a bit flip in the body); full sees those too.
 *
 * Pure functions, any thread.
 */
#ifndef EPD_KV_STAMP_H
#define EPD_KV_STAMP_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_hash.h"
#include "epd_status.h"

#define EPD_KV_STAMP_HALF 32u                   /* bytes of the head, and of the tail */
#define EPD_KV_STAMP_BYTES (2 * EPD_KV_STAMP_HALF) /* what the layer checksum hashes per unit */
#define EPD_KV_STAMP_MIN EPD_KV_STAMP_BYTES     /* the smallest unit */

typedef struct {
    uint64_t req_id;
    uint64_t tag;
    uint64_t hk;
    uint64_t body;
    uint32_t layer;
    uint32_t index;
    uint32_t count;
} epd_kv_stamp_t;

/* The tag of a decode incarnation (its epoch's start time and nonce). */
uint64_t epd_kv_stamp_tag(uint64_t epoch_start_ns, uint64_t epoch_nonce);

/* xxh3-64 (seed 0) of the body of a unit of unit_bytes (>= EPD_KV_STAMP_MIN). */
uint64_t epd_kv_stamp_body(const void *unit, uint64_t unit_bytes);

/* Writes the head and tail of `s` into a unit of unit_bytes (>= EPD_KV_STAMP_MIN). */
void epd_kv_stamp_put(void *unit, uint64_t unit_bytes, const epd_kv_stamp_t *s);

/* Reads a unit's stamp.  EPD_OK; EPD_ERR_CORRUPT when the magic is wrong or
 * the head and tail do not agree (a torn or missing write, or never
 * stamped); *s_p is written either way (best effort). */
epd_status_t epd_kv_stamp_get(const void *unit, uint64_t unit_bytes, epd_kv_stamp_t *s_p);

/* The raw body field of a unit's tail, whatever the rest says. */
uint64_t epd_kv_stamp_body_field(const void *unit, uint64_t unit_bytes);

/* What one layer of one request must hold (decode's side of the check). */
typedef struct {
    uint64_t req_id;
    uint64_t tag;
    uint32_t n_tokens; /* the prompt's tokens: every unit's count follows from it */
    int full;          /* also hash every body and compare it with its digest */
} epd_kv_stamp_expect_t;

/*
 * Checks layer `layer` of a request in `pool` (borrowed): its units are the
 * blocks ids[0..n_ids) (attention; prompt order) or state slot `slot`
 * (linear).  Every unit must carry a valid stamp with the expected req_id,
 * layer, index, count and tag (and, with full, a body matching its digest),
 * and the layer's EPD_KV_SUM_STAMPED checksum must be `sum`.  `h` is a
 * scratch streaming state (caller's).  EPD_OK; EPD_ERR_CORRUPT with *why_p
 * naming the first problem (a static string); EPD_ERR_INVALID_PARAM for a
 * layer, block or slot outside the pool or units smaller than
 * EPD_KV_STAMP_MIN.  *bytes_p (may be NULL): the bytes the layer spans.
 */
epd_status_t epd_kv_stamp_check_layer(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                      const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                      uint32_t layer, const epd_kv_stamp_expect_t *expect,
                                      uint64_t sum, epd_hash_state_t *h, uint64_t *bytes_p,
                                      const char **why_p);

/*
 * As epd_kv_stamp_check_layer for blocks ids[from..to) of attention layer
 * `layer` only, continuing the running state `h` (not reset: blocks
 * [0, from) went into it before), whose digest must then be `sum` — the
 * EPD_KV_SUM_STAMPED checksum of blocks [0, to).  A chunked prefill's
 * blocks are checked so as they land, and the layer's rest at its end.
 */
epd_status_t epd_kv_stamp_check_blocks(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                       const uint32_t *ids, uint32_t from, uint32_t to,
                                       uint32_t layer, const epd_kv_stamp_expect_t *x,
                                       uint64_t sum, epd_hash_state_t *h, uint64_t *bytes_p,
                                       const char **why_p);

/* Adds one unit's stamps (its head and tail, EPD_KV_STAMP_BYTES) to h: a
 * writer's share of an EPD_KV_SUM_STAMPED checksum, read from the unit. */
void epd_kv_stamp_hash_unit(epd_hash_state_t *h, const void *unit, uint64_t unit_bytes);

#endif
