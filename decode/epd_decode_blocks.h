/*
 * epd_decode_blocks.h — the decode worker's KV block and state-slot
 * allocator, with an explicit lifecycle per block (and per slot).
 *
 * The decode pool holds n_blocks KV blocks and n_slots recurrent-state
 * slots.  A prefill worker writes into them remotely (one-sided), so a block
 * may only be handed to a new request once nobody can still write into it
 * (DESIGN.md lesson 3, proto/README.md rule 8).  Every block and slot is in
 * exactly one state:
 *
 *            reserve                activate
 *   FREE ─────────────▶ RESERVED ─────────────▶ ACTIVE
 *    ▲                  │  │  owned by a request;   │ owned by a request; P's
 *    │   unreserve      │  │  P may be writing      │ PrefillComplete verified,
 *    ├──────────────────┘  │                        │ P writes nothing more
 *    │  (P never got the   │ quarantine             │
 *    │   reservation)      ▼                        │ retire (finished: P's
 *    │              QUARANTINED                     │ fence means nothing
 *    │   release    request finished or aborted,    │ is in flight)
 *    ├───────────── but P may still write: waiting  │
 *    │              for WritesQuiesced /            │
 *    │              PrefillComplete from P's epoch, │
 *    │              or P declared dead / restarted  │
 *    └──────────────────────────────────────────────┘
 *
 * One more edge, FREE → ACTIVE (grow): a request whose KV grows on
 * demand takes blocks for the tokens it generates; no remote side ever
 * learns of them, so they never pass through RESERVED.
 *
 * RESERVED→QUARANTINED→FREE is the only way back from a reservation P may
 * have seen, so a block P could still write is never free.  Each transition
 * names the request that owns the blocks; a call naming a block that is not
 * in the expected state or belongs to another request (double free, foreign
 * block) changes nothing and returns EPD_ERR_INVALID_PARAM: the daemon
 * asserts on it (an internal invariant, never input), the unit tests check
 * it.  A call is all-or-nothing.
 *
 * Free blocks and free slots are two stacks (O(1) per block).  Loop thread
 * only (the compute thread never sees this object).
 */
#ifndef EPD_DECODE_BLOCKS_H
#define EPD_DECODE_BLOCKS_H

#include <stdint.h>

#include "epd_status.h"

/* "no state slot" (a model without linear layers). */
#define EPD_DECODE_NO_SLOT UINT32_MAX

typedef enum {
    EPD_DECODE_BLK_FREE = 0,
    EPD_DECODE_BLK_RESERVED,
    EPD_DECODE_BLK_ACTIVE,
    EPD_DECODE_BLK_QUARANTINED,
    EPD_DECODE_BLK_CACHED, /* decode's prefix cache holds it (no owner): nobody writes it */
    EPD_DECODE_BLK_NSTATES
} epd_decode_blk_state_t;

typedef struct epd_decode_blocks epd_decode_blocks_t;

/* Creates an allocator for n_blocks blocks (>= 1) and n_slots slots (may be
 * 0), all FREE.  Owned by the caller (epd_decode_blocks_destroy).
 * EPD_ERR_INVALID_PARAM, EPD_ERR_NO_MEMORY. */
epd_status_t epd_decode_blocks_create(uint32_t n_blocks, uint32_t n_slots,
                                      epd_decode_blocks_t **blocks_p);
/* NULL is a no-op. */
void epd_decode_blocks_destroy(epd_decode_blocks_t *blocks);

/*
 * FREE → RESERVED: takes n (>= 1) free blocks into ids[0..n) (caller's
 * storage) and, when want_slot, one free slot into *slot_p (otherwise
 * *slot_p = EPD_DECODE_NO_SLOT), all owned by `owner` (a nonzero request
 * id).  EPD_ERR_NO_CAPACITY when there are not enough free blocks or no free
 * slot: nothing is taken.  EPD_ERR_INVALID_PARAM for n 0 or owner 0.
 */
epd_status_t epd_decode_blocks_reserve(epd_decode_blocks_t *blocks, uint64_t owner, uint32_t n,
                                       int want_slot, uint32_t *ids, uint32_t *slot_p);

/* FREE → ACTIVE: n (>= 1) more blocks for `owner`, a request that
 * generates (its KV on demand, proto/README.md rule 30) — nobody remote
 * ever writes them, so they skip RESERVED.  The ids go to ids[0..n).
 * EPD_ERR_NO_CAPACITY when fewer are free (nothing taken). */
epd_status_t epd_decode_blocks_grow(epd_decode_blocks_t *blocks, uint64_t owner, uint32_t n,
                                    uint32_t *ids);

/* RESERVED → ACTIVE (PrefillComplete verified). */
epd_status_t epd_decode_blocks_activate(epd_decode_blocks_t *blocks, uint64_t owner,
                                        const uint32_t *ids, uint32_t n, uint32_t slot);

/* RESERVED or ACTIVE → QUARANTINED (finished or aborted while P may still
 * write).  The blocks keep their owner until released. */
epd_status_t epd_decode_blocks_quarantine(epd_decode_blocks_t *blocks, uint64_t owner,
                                          const uint32_t *ids, uint32_t n, uint32_t slot);

/* QUARANTINED → FREE (P quiesced, completed, died or restarted). */
epd_status_t epd_decode_blocks_release(epd_decode_blocks_t *blocks, uint64_t owner,
                                       const uint32_t *ids, uint32_t n, uint32_t slot);

/* ACTIVE → FREE (the request finished after P's fenced completion). */
epd_status_t epd_decode_blocks_retire(epd_decode_blocks_t *blocks, uint64_t owner,
                                      const uint32_t *ids, uint32_t n, uint32_t slot);

/* RESERVED → FREE, only when P can never have seen the reservation (it was
 * never sent). */
epd_status_t epd_decode_blocks_unreserve(epd_decode_blocks_t *blocks, uint64_t owner,
                                         const uint32_t *ids, uint32_t n, uint32_t slot);

/* Decode-side reuse (decode/epd_decode_cache.h): ACTIVE -> CACHED, the
 * request's fully written prompt blocks kept after it finished (P's
 * fenced completion: nothing in flight), owned by nobody; CACHED -> FREE
 * when the cache evicts them.  A cached block is lent to later requests
 * read-only (they do not own it; their other blocks move as above). */
epd_status_t epd_decode_blocks_cache(epd_decode_blocks_t *blocks, uint64_t owner,
                                     const uint32_t *ids, uint32_t n);
epd_status_t epd_decode_blocks_uncache(epd_decode_blocks_t *blocks, const uint32_t *ids,
                                       uint32_t n);

/* Counts. */
uint32_t epd_decode_blocks_total(const epd_decode_blocks_t *blocks);
uint32_t epd_decode_blocks_slots_total(const epd_decode_blocks_t *blocks);
uint32_t epd_decode_blocks_free(const epd_decode_blocks_t *blocks);
uint32_t epd_decode_blocks_slots_free(const epd_decode_blocks_t *blocks);
/* Blocks (slots) in `state`. */
uint32_t epd_decode_blocks_count(const epd_decode_blocks_t *blocks, epd_decode_blk_state_t state);
uint32_t epd_decode_blocks_slots_count(const epd_decode_blocks_t *blocks,
                                       epd_decode_blk_state_t state);

/* State and owner of one block (for tests and logs); FREE/0 out of range. */
epd_decode_blk_state_t epd_decode_blocks_state(const epd_decode_blocks_t *blocks, uint32_t id);
uint64_t epd_decode_blocks_owner(const epd_decode_blocks_t *blocks, uint32_t id);

/* The same of one state slot (the fence's write check). */
epd_decode_blk_state_t epd_decode_blocks_slot_state(const epd_decode_blocks_t *blocks, uint32_t id);
uint64_t epd_decode_blocks_slot_owner(const epd_decode_blocks_t *blocks, uint32_t id);

/* A static name of a state ("QUARANTINED"). */
const char *epd_decode_blk_state_name(epd_decode_blk_state_t state);

#endif
