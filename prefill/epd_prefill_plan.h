/*
 * epd_prefill_plan.h — where prefill writes a request's KV: the pure part of
 * the transfer.
 *
 * A request's KV sits in prefill's local pool (its own block table and state
 * slot) and must land in the blocks and slot the decode worker reserved,
 * inside decode's pool of a possibly different geometry.  For one layer the
 * writes are, in this order (the order the per-layer checksum covers):
 *   attention layer: prompt block i, all block_bytes, local block_ids[i] ->
 *                    remote block_ids[i], for i = 0 .. n_blocks-1
 *   linear layer:    the whole recurrent state, local slot -> remote slot
 * Offsets come from epd_kv_block_offset / epd_kv_state_offset with each
 * side's pool geometry.  Nothing here allocates on the per-write path, so
 * the loop thread can compute each write when it posts it.
 *
 * epd_prefill_plan_check refuses a reservation before a single byte moves:
 * wrong number of blocks, a block or slot outside decode's pool, a block
 * named twice, a region smaller than the pool it claims.
 * Pure functions, any thread.
 */
#ifndef EPD_PREFILL_PLAN_H
#define EPD_PREFILL_PLAN_H

#include <stdint.h>

#include "epd_engine.h"
#include "epd_status.h"

/* One side's placement of a request: its blocks (borrowed) and slot, and the
 * geometry of the pool they live in. */
typedef struct {
    const uint32_t *block_ids; /* prompt blocks, in token order */
    uint32_t n_blocks;
    uint32_t state_slot;
    uint32_t pool_blocks;      /* blocks in that side's pool */
    uint32_t pool_state_slots; /* state slots in that side's pool */
} epd_prefill_place_t;

/* One write: local pool bytes [local_off, +len) -> remote [remote_off, +len). */
typedef struct {
    uint64_t local_off;
    uint64_t remote_off;
    uint64_t len;
} epd_prefill_write_t;

/* A run: prompt blocks [first, first + n) whose ids are consecutive on both
 * sides, so that in every attention layer they are one contiguous range
 * locally and one remotely (a block's offset is linear in its id inside a
 * layer): one write per run and layer. */
typedef struct {
    uint32_t first;
    uint32_t n;
} epd_prefill_run_t;

/* Blocks a prompt of n_tokens occupies: ceil(n_tokens / block_tokens)
 * (0 for a layout with block_tokens 0). */
uint32_t epd_prefill_plan_blocks(const epd_kv_layout_t *layout, uint32_t n_tokens);

/* Writes of layer `layer` for a request of n_blocks prompt blocks:
 * n_blocks for an attention layer, 1 for a linear one, 0 for a layer index
 * outside the layout. */
uint32_t epd_prefill_plan_layer_writes(const epd_kv_layout_t *layout, uint32_t layer,
                                       uint32_t n_blocks);

/*
 * Checks a remote placement for a request of n_prompt_blocks blocks against
 * `layout` and the remote region of region_size bytes: exactly
 * n_prompt_blocks block ids, each < pool_blocks and none twice, the slot <
 * pool_state_slots when the layout has linear layers, and the whole pool
 * (epd_kv_pool_bytes of the remote geometry) inside region_size.  EPD_OK,
 * or EPD_ERR_OUT_OF_RANGE / EPD_ERR_INVALID_PARAM / EPD_ERR_NO_MEMORY with a
 * static reason in *why_p (when not NULL).
 */
epd_status_t epd_prefill_plan_check(const epd_kv_layout_t *layout, uint32_t n_prompt_blocks,
                                    const epd_prefill_place_t *remote, uint64_t region_size,
                                    const char **why_p);

/*
 * Write `i` (0 .. epd_prefill_plan_layer_writes - 1) of layer `layer`, from
 * `local` to `remote` (both already checked).  EPD_ERR_OUT_OF_RANGE when an
 * index or offset falls outside either pool, or the write would end past
 * region_size.
 */
epd_status_t epd_prefill_plan_write(const epd_kv_layout_t *layout, const epd_prefill_place_t *local,
                                    const epd_prefill_place_t *remote, uint64_t region_size,
                                    uint32_t layer, uint32_t i, epd_prefill_write_t *w_p);

/*
 * Cuts the prompt blocks of `local` and `remote` (same n_blocks) into runs,
 * in block order, into runs[0..n_blocks); returns how many.  Planned once
 * per request: the runs do not depend on the layer.
 */
uint32_t epd_prefill_plan_runs(const epd_prefill_place_t *local, const epd_prefill_place_t *remote,
                               epd_prefill_run_t *runs);

/* Drops from runs[0..n_runs) the blocks before `skip` (decode holds them:
 * proto/README.md rule 36), in place; returns the runs left. */
uint32_t epd_prefill_plan_runs_skip(epd_prefill_run_t *runs, uint32_t n_runs, uint32_t skip);

/*
 * The write of run `run` of attention layer `layer` (all its blocks), or,
 * for a linear layer, of its state (run ignored).  Errors as
 * epd_prefill_plan_write.
 */
epd_status_t epd_prefill_plan_run_write(const epd_kv_layout_t *layout,
                                        const epd_prefill_place_t *local,
                                        const epd_prefill_place_t *remote, uint64_t region_size,
                                        uint32_t layer, const epd_prefill_run_t *run,
                                        epd_prefill_write_t *w_p);

#endif
