/* epd_layout.c — KV layout <-> epd.KvLayout (see epd_layout.h). */
#include "epd_layout.h"

#include <string.h>

#include "epd_kvq.h"

static Epd__KvDtype epd_layout_dtype_to_msg(epd_dtype_t dtype)
{
    switch (dtype) {
    case EPD_DTYPE_F32:
        return EPD__KV_DTYPE__KV_DTYPE_F32;
    case EPD_DTYPE_F16:
        return EPD__KV_DTYPE__KV_DTYPE_F16;
    case EPD_DTYPE_BF16:
        return EPD__KV_DTYPE__KV_DTYPE_BF16;
    case EPD_DTYPE_FP8_E4M3:
        return EPD__KV_DTYPE__KV_DTYPE_FP8;
    case EPD_DTYPE_INT8:
        return EPD__KV_DTYPE__KV_DTYPE_INT8;
    }
    return EPD__KV_DTYPE__KV_DTYPE_UNSPECIFIED;
}

void epd_layout_to_msg(const epd_kv_layout_t *layout, Epd__KvLayout *msg,
                       char pattern[EPD_LAYOUT_PATTERN_MAX])
{
    uint32_t n = layout->n_layers < EPD_KV_MAX_LAYERS ? layout->n_layers : EPD_KV_MAX_LAYERS;

    epd__kv_layout__init(msg);
    for (uint32_t i = 0; i < n; i++) {
        pattern[i] = layout->kind[i] == EPD_LAYER_LINEAR ? 'L' : 'A';
    }
    pattern[n] = '\0';
    msg->n_layers = layout->n_layers;
    msg->layer_pattern = pattern;
    msg->block_tokens = layout->block_tokens;
    msg->n_kv_heads = layout->n_kv_heads;
    msg->head_dim = layout->head_dim;
    msg->dtype = epd_layout_dtype_to_msg(layout->dtype);
    msg->block_bytes = layout->block_bytes;
    msg->state_bytes = layout->state_bytes;
    epd_kvq_map_format(layout, pattern + n + 1, EPD_LAYOUT_MAP_MAX);
    msg->kv_dtype_map = pattern + n + 1;
}

epd_status_t epd_layout_check(const epd_kv_layout_t *layout, const Epd__KvLayout *msg,
                              const char **why_p)
{
    char pattern[EPD_LAYOUT_PATTERN_MAX];
    Epd__KvLayout mine;
    const char *why = NULL;

    epd_layout_to_msg(layout, &mine, pattern);
    if (msg == NULL) {
        why = "no KV layout";
    } else if (msg->n_layers != mine.n_layers) {
        why = "number of layers differs";
    } else if (msg->layer_pattern == NULL || strcmp(msg->layer_pattern, pattern) != 0) {
        why = "layer pattern differs";
    } else if (msg->block_tokens != mine.block_tokens) {
        why = "block_tokens differs";
    } else if (msg->n_kv_heads != mine.n_kv_heads || msg->head_dim != mine.head_dim) {
        why = "KV head shape differs";
    } else if (msg->dtype != mine.dtype) {
        why = "KV dtype differs";
    } else if (strcmp(msg->kv_dtype_map != NULL && msg->kv_dtype_map[0] != '\0'
                          ? msg->kv_dtype_map
                          : epd_kvq_dtype_short((epd_dtype_t)layout->dtype),
                      mine.kv_dtype_map) != 0) {
        why = "KV dtype map differs";
    } else if (msg->block_bytes != mine.block_bytes) {
        why = "block size differs";
    } else if (msg->state_bytes != mine.state_bytes) {
        why = "recurrent state size differs";
    }
    if (why != NULL) {
        if (why_p != NULL) {
            *why_p = why;
        }
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}
