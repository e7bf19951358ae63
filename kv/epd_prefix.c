/*
 * epd_prefix.c — chain hashes of KV blocks (see the header).  Everything is
 * serialized little-endian with explicit widths, so a router and workers on
 * different hosts compute the same keys.
 */
#include "epd_prefix.h"

#include <string.h>

#include "epd_bytes.h"

#define EPD_PREFIX_TAG "epd-prefix-v1"

static void epd_prefix_put32(epd_content_hash_state_t *st, uint32_t v)
{
    unsigned char b[4];

    epd_le_put(b, v, 4);
    epd_content_hash_update(st, b, 4);
}

static void epd_prefix_put64(epd_content_hash_state_t *st, uint64_t v)
{
    epd_prefix_put32(st, (uint32_t)v);
    epd_prefix_put32(st, (uint32_t)(v >> 32));
}

void epd_prefix_root(const char *engine_name, const epd_engine_info_t *info, const void *salt,
                     size_t salt_len, epd_prefix_hash_t *root_p)
{
    const epd_kv_layout_t *kv = &info->kv;
    size_t name_len = strlen(engine_name);
    uint32_t n_layers = kv->n_layers < EPD_KV_MAX_LAYERS ? kv->n_layers : EPD_KV_MAX_LAYERS;
    epd_content_hash_state_t st;

    if (salt == NULL || salt_len > EPD_PREFIX_SALT_MAX) {
        salt_len = salt == NULL ? 0 : EPD_PREFIX_SALT_MAX;
    }
    epd_content_hash_init(&st);
    epd_content_hash_update(&st, EPD_PREFIX_TAG, sizeof(EPD_PREFIX_TAG));
    /* every variable-length field after its length: no two inputs
     * concatenate alike */
    epd_prefix_put32(&st, (uint32_t)name_len);
    epd_content_hash_update(&st, engine_name, name_len);
    epd_content_hash_update(&st, info->model_digest, sizeof(info->model_digest));
    epd_prefix_put32(&st, n_layers);
    epd_content_hash_update(&st, kv->kind, n_layers);
    epd_prefix_put32(&st, (uint32_t)kv->dtype);
    epd_prefix_put32(&st, kv->block_tokens);
    epd_prefix_put32(&st, kv->n_kv_heads);
    epd_prefix_put32(&st, kv->head_dim);
    epd_prefix_put32(&st, kv->n_state_heads);
    epd_prefix_put64(&st, kv->block_bytes);
    if (kv->attn_block_bytes != 0) {
        /* a per-layer KV dtype map: blocks of another map are other bytes */
        epd_content_hash_update(&st, kv->layer_dtype, n_layers);
    }
    epd_prefix_put64(&st, kv->state_bytes);
    epd_prefix_put32(&st, (uint32_t)salt_len);
    if (salt_len > 0) {
        epd_content_hash_update(&st, salt, salt_len);
    }
    epd_content_hash_final(&st, root_p->b);
}

uint32_t epd_prefix_chain(const epd_prefix_hash_t *root, uint32_t block_tokens,
                          const int32_t *tokens, uint32_t n_tokens,
                          const epd_prefix_media_t *media, uint32_t n_media,
                          epd_prefix_hash_t *out, uint32_t cap)
{
    return epd_prefix_chain_from(root, block_tokens, tokens, n_tokens, media, n_media, 0, out,
                                 cap);
}

uint32_t epd_prefix_chain_from(const epd_prefix_hash_t *parent_key, uint32_t block_tokens,
                               const int32_t *tokens, uint32_t n_tokens,
                               const epd_prefix_media_t *media, uint32_t n_media, uint32_t first,
                               epd_prefix_hash_t *out, uint32_t cap)
{
    uint32_t full = block_tokens > 0 ? n_tokens / block_tokens : 0;
    uint32_t n = full > first ? full - first : 0;
    epd_prefix_hash_t parent = *parent_key;
    uint32_t m = 0; /* the first image that may meet this block or a later one */

    n = n < cap ? n : cap;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t i = first + j;
        uint64_t lo = (uint64_t)i * block_tokens;
        uint64_t hi = lo + block_tokens;
        unsigned char buf[64 * 4];
        epd_content_hash_state_t st;

        epd_content_hash_init(&st);
        epd_content_hash_update(&st, parent.b, EPD_PREFIX_HASH_BYTES);
        for (uint64_t t = lo; t < hi;) {
            uint32_t cnt = hi - t < 64 ? (uint32_t)(hi - t) : 64;

            for (uint32_t q = 0; q < cnt; q++) {
                epd_le_put(buf + 4 * q, (uint32_t)tokens[t + q], 4);
            }
            epd_content_hash_update(&st, buf, 4 * (size_t)cnt);
            t += cnt;
        }
        while (m < n_media && (uint64_t)media[m].pos + media[m].n <= lo) {
            m++;
        }
        for (uint32_t k = m; k < n_media && media[k].pos < hi; k++) {
            if ((uint64_t)media[k].pos + media[k].n > lo) {
                epd_prefix_put32(&st, media[k].pos);
                epd_prefix_put32(&st, media[k].n);
                epd_content_hash_update(&st, media[k].hash, EPD_CONTENT_HASH_BYTES);
            }
        }
        epd_content_hash_final(&st, out[j].b);
        parent = out[j];
    }
    return n;
}

uint64_t epd_prefix_hint(const epd_prefix_hash_t *h)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++) {
        v |= (uint64_t)h->b[i] << (8 * i);
    }
    return v;
}
