/* epd_prefill_plan.c — write plan of a request's KV (see the header). */
#include "epd_prefill_plan.h"

#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"

uint32_t epd_prefill_plan_blocks(const epd_kv_layout_t *layout, uint32_t n_tokens)
{
    if (layout->block_tokens == 0) {
        return 0;
    }
    return (uint32_t)(((uint64_t)n_tokens + layout->block_tokens - 1) / layout->block_tokens);
}

uint32_t epd_prefill_plan_layer_writes(const epd_kv_layout_t *layout, uint32_t layer,
                                       uint32_t n_blocks)
{
    if (layer >= layout->n_layers || layer >= EPD_KV_MAX_LAYERS) {
        return 0;
    }
    return layout->kind[layer] == EPD_LAYER_LINEAR ? 1 : n_blocks;
}

static int epd_prefill_plan_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a;
    uint32_t y = *(const uint32_t *)b;

    return x < y ? -1 : x > y;
}

static epd_status_t epd_prefill_plan_refuse(epd_status_t status, const char *why,
                                            const char **why_p)
{
    if (why_p != NULL) {
        *why_p = why;
    }
    return status;
}

epd_status_t epd_prefill_plan_check(const epd_kv_layout_t *layout, uint32_t n_prompt_blocks,
                                    const epd_prefill_place_t *remote, uint64_t region_size,
                                    const char **why_p)
{
    uint64_t pool_bytes;

    if (remote->n_blocks != n_prompt_blocks) {
        return epd_prefill_plan_refuse(
            EPD_ERR_INVALID_PARAM, "number of reserved blocks differs from the prompt's", why_p);
    }
    if (n_prompt_blocks > 0 && remote->block_ids == NULL) {
        return epd_prefill_plan_refuse(EPD_ERR_INVALID_PARAM, "no block ids", why_p);
    }
    if (layout->n_attn_layers > 0 && remote->pool_blocks == 0) {
        return epd_prefill_plan_refuse(EPD_ERR_OUT_OF_RANGE, "remote pool has no blocks", why_p);
    }
    if (layout->n_linear_layers > 0 && remote->state_slot >= remote->pool_state_slots) {
        return epd_prefill_plan_refuse(EPD_ERR_OUT_OF_RANGE, "state slot outside the remote pool",
                                       why_p);
    }
    pool_bytes = epd_kv_pool_bytes(layout, remote->pool_blocks, remote->pool_state_slots);
    if (pool_bytes == 0) {
        return epd_prefill_plan_refuse(EPD_ERR_OUT_OF_RANGE, "remote pool size overflows", why_p);
    }
    if (pool_bytes > region_size) {
        return epd_prefill_plan_refuse(EPD_ERR_OUT_OF_RANGE,
                                       "remote region smaller than its pool geometry", why_p);
    }
    for (uint32_t i = 0; i < remote->n_blocks; i++) {
        if (remote->block_ids[i] >= remote->pool_blocks) {
            return epd_prefill_plan_refuse(EPD_ERR_OUT_OF_RANGE, "block id outside the remote pool",
                                           why_p);
        }
    }
    /* a block named twice would be overwritten by the later write and
     * decode would hash garbage; sort a copy (sized by the prompt, never by
     * the pool the message claims) and compare neighbours */
    if (remote->n_blocks > 1) {
        uint32_t *ids = epd_malloc((size_t)remote->n_blocks * sizeof(*ids));
        int twice = 0;

        if (ids == NULL) {
            return epd_prefill_plan_refuse(EPD_ERR_NO_MEMORY, "out of memory", why_p);
        }
        memcpy(ids, remote->block_ids, (size_t)remote->n_blocks * sizeof(*ids));
        qsort(ids, remote->n_blocks, sizeof(*ids), epd_prefill_plan_cmp_u32);
        for (uint32_t i = 1; i < remote->n_blocks && !twice; i++) {
            twice = ids[i] == ids[i - 1];
        }
        epd_free(ids);
        if (twice) {
            return epd_prefill_plan_refuse(EPD_ERR_INVALID_PARAM, "block id named twice", why_p);
        }
    }
    return EPD_OK;
}

epd_status_t epd_prefill_plan_write(const epd_kv_layout_t *layout, const epd_prefill_place_t *local,
                                    const epd_prefill_place_t *remote, uint64_t region_size,
                                    uint32_t layer, uint32_t i, epd_prefill_write_t *w_p)
{
    epd_prefill_write_t w;
    epd_status_t st;

    if (layer >= layout->n_layers || layer >= EPD_KV_MAX_LAYERS) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    if (layout->kind[layer] == EPD_LAYER_LINEAR) {
        if (i != 0) {
            return EPD_ERR_OUT_OF_RANGE;
        }
        st = epd_kv_state_offset(layout, local->pool_blocks, local->pool_state_slots, layer,
                                 local->state_slot, &w.local_off);
        if (st == EPD_OK) {
            st = epd_kv_state_offset(layout, remote->pool_blocks, remote->pool_state_slots, layer,
                                     remote->state_slot, &w.remote_off);
        }
        w.len = layout->state_bytes;
    } else {
        if (i >= local->n_blocks || i >= remote->n_blocks) {
            return EPD_ERR_OUT_OF_RANGE;
        }
        st = epd_kv_block_offset(layout, local->pool_blocks, layer, local->block_ids[i],
                                 &w.local_off);
        if (st == EPD_OK) {
            st = epd_kv_block_offset(layout, remote->pool_blocks, layer, remote->block_ids[i],
                                     &w.remote_off);
        }
        w.len = epd_kv_layer_block_bytes(layout, layer);
    }
    if (st != EPD_OK) {
        return st;
    }
    if (w.len == 0 || w.remote_off > region_size || w.len > region_size - w.remote_off) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    *w_p = w;
    return EPD_OK;
}

uint32_t epd_prefill_plan_runs(const epd_prefill_place_t *local, const epd_prefill_place_t *remote,
                               epd_prefill_run_t *runs)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < local->n_blocks && i < remote->n_blocks; i++) {
        if (n > 0 && local->block_ids[i] == local->block_ids[i - 1] + 1 &&
            remote->block_ids[i] == remote->block_ids[i - 1] + 1) {
            runs[n - 1].n++;
            continue;
        }
        runs[n].first = i;
        runs[n].n = 1;
        n++;
    }
    return n;
}

uint32_t epd_prefill_plan_runs_skip(epd_prefill_run_t *runs, uint32_t n_runs, uint32_t skip)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < n_runs; i++) {
        epd_prefill_run_t r = runs[i];

        if (r.first + r.n <= skip) {
            continue;
        }
        if (r.first < skip) {
            r.n -= skip - r.first;
            r.first = skip;
        }
        runs[n++] = r;
    }
    return n;
}

epd_status_t epd_prefill_plan_run_write(const epd_kv_layout_t *layout,
                                        const epd_prefill_place_t *local,
                                        const epd_prefill_place_t *remote, uint64_t region_size,
                                        uint32_t layer, const epd_prefill_run_t *run,
                                        epd_prefill_write_t *w_p)
{
    epd_prefill_write_t w;
    epd_status_t st;

    if (layer < layout->n_layers && layer < EPD_KV_MAX_LAYERS &&
        layout->kind[layer] == EPD_LAYER_LINEAR) {
        return epd_prefill_plan_write(layout, local, remote, region_size, layer, 0, w_p);
    }
    if (run->n == 0 || run->first + (uint64_t)run->n > local->n_blocks ||
        run->first + (uint64_t)run->n > remote->n_blocks) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    /* the first block's write, checked, then the run's length: its last
     * block must be inside both pools and the region too */
    st = epd_prefill_plan_write(layout, local, remote, region_size, layer, run->first, &w);
    if (st == EPD_OK && run->n > 1) {
        epd_prefill_write_t last;

        st = epd_prefill_plan_write(layout, local, remote, region_size, layer,
                                    run->first + run->n - 1, &last);
        if (st == EPD_OK && (last.local_off != w.local_off + (uint64_t)(run->n - 1) * w.len ||
                             last.remote_off != w.remote_off + (uint64_t)(run->n - 1) * w.len)) {
            st = EPD_ERR_OUT_OF_RANGE; /* not a run */
        }
        w.len *= run->n;
    }
    if (st != EPD_OK) {
        return st;
    }
    *w_p = w;
    return EPD_OK;
}
