/*
 * epd_kv_layout.c — KV dtype sizes and names, and the KV layout
 * arithmetic (block and state offsets in a pool) that engines, daemons and
 * the quantized-KV codecs share.  Below epd_engine.c and epd_kvq.c: pure
 * functions of a layout, no engine.
 */
#include <stdint.h>

#include "epd_engine.h"

size_t epd_dtype_size(epd_dtype_t dtype)
{
    switch (dtype) {
    case EPD_DTYPE_F32:
        return 4;
    case EPD_DTYPE_F16:
    case EPD_DTYPE_BF16:
        return 2;
    case EPD_DTYPE_FP8_E4M3:
    case EPD_DTYPE_INT8:
        return 1;
    }
    return 0;
}

const char *epd_dtype_name(epd_dtype_t dtype)
{
    switch (dtype) {
    case EPD_DTYPE_F32:
        return "F32";
    case EPD_DTYPE_F16:
        return "F16";
    case EPD_DTYPE_BF16:
        return "BF16";
    case EPD_DTYPE_FP8_E4M3:
        return "F8_E4M3";
    case EPD_DTYPE_INT8:
        return "I8";
    }
    return "?";
}

uint64_t epd_kv_layer_block_bytes(const epd_kv_layout_t *layout, uint32_t layer)
{
    if (layer >= layout->n_layers || layout->kind[layer] != EPD_LAYER_ATTENTION) {
        return 0;
    }
    return layout->attn_block_bytes != 0 ? layout->layer_block_bytes[layer] : layout->block_bytes;
}

uint64_t epd_kv_block_set_bytes(const epd_kv_layout_t *layout)
{
    return layout->attn_block_bytes != 0 ? layout->attn_block_bytes
                                         : (uint64_t)layout->n_attn_layers * layout->block_bytes;
}

uint64_t epd_kv_pool_bytes(const epd_kv_layout_t *layout, uint32_t n_blocks, uint32_t n_state_slots)
{
    uint64_t attn;
    uint64_t lin;
    uint64_t total;

    if (__builtin_mul_overflow((uint64_t)n_blocks, epd_kv_block_set_bytes(layout), &attn) ||
        __builtin_mul_overflow((uint64_t)layout->n_linear_layers * n_state_slots,
                               layout->state_bytes, &lin) ||
        __builtin_add_overflow(attn, lin, &total)) {
        return 0;
    }
    return total;
}

epd_status_t epd_kv_block_offset(const epd_kv_layout_t *layout, uint32_t n_blocks, uint32_t layer,
                                 uint32_t block, uint64_t *offset_p)
{
    if (layer >= layout->n_layers || layout->kind[layer] != EPD_LAYER_ATTENTION ||
        block >= n_blocks) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    if (layout->attn_block_bytes != 0) {
        /* per-layer map: [attn_layer][block], each layer's blocks its own size */
        *offset_p = layout->layer_prefix[layer] * n_blocks +
                    (uint64_t)block * layout->layer_block_bytes[layer];
    } else {
        *offset_p = ((uint64_t)layout->kind_index[layer] * n_blocks + block) * layout->block_bytes;
    }
    return EPD_OK;
}

epd_status_t epd_kv_block_at(const epd_kv_layout_t *layout, uint32_t n_blocks, uint64_t off,
                             uint32_t *layer_p, uint32_t *block_p)
{
    for (uint32_t l = 0; l < layout->n_layers; l++) {
        uint64_t bb = epd_kv_layer_block_bytes(layout, l);
        uint64_t start;

        if (bb == 0 || epd_kv_block_offset(layout, n_blocks, l, 0, &start) != EPD_OK) {
            continue;
        }
        if (off >= start && off - start < bb * n_blocks) {
            *layer_p = l;
            *block_p = (uint32_t)((off - start) / bb);
            return EPD_OK;
        }
    }
    return EPD_ERR_OUT_OF_RANGE;
}

epd_status_t epd_kv_state_offset(const epd_kv_layout_t *layout, uint32_t n_blocks,
                                 uint32_t n_state_slots, uint32_t layer, uint32_t slot,
                                 uint64_t *offset_p)
{
    if (layer >= layout->n_layers || layout->kind[layer] != EPD_LAYER_LINEAR ||
        slot >= n_state_slots) {
        return EPD_ERR_OUT_OF_RANGE;
    }
    *offset_p = (uint64_t)n_blocks * epd_kv_block_set_bytes(layout) +
                ((uint64_t)layout->kind_index[layer] * n_state_slots + slot) * layout->state_bytes;
    return EPD_OK;
}
