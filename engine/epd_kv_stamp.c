/* epd_kv_stamp.c — stamped KV units (see the header). */
#include "epd_kv_stamp.h"

#include <string.h>

#define EPD_KV_STAMP_MAGIC 0x53445045u /* "EPDS" little-endian */
#define EPD_KV_STAMP_AHEAD 8           /* units whose stamps are prefetched ahead */
#define EPD_KV_STAMP_GATHER 64         /* units' stamps hashed per update */

/* splitmix64's finalizer */
static inline uint64_t epd_kv_stamp_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

uint64_t epd_kv_stamp_tag(uint64_t epoch_start_ns, uint64_t epoch_nonce)
{
    if (epoch_start_ns == 0 && epoch_nonce == 0) {
        return 0;
    }
    return epd_kv_stamp_mix(epd_kv_stamp_mix(epoch_start_ns) ^ epoch_nonce);
}

static uint64_t epd_kv_stamp_check_of(const epd_kv_stamp_t *s)
{
    uint64_t x = epd_kv_stamp_mix(s->req_id ^ 0x5374616d70ull);

    x = epd_kv_stamp_mix(x ^ s->tag);
    x = epd_kv_stamp_mix(x ^ s->hk);
    x = epd_kv_stamp_mix(x ^ s->body);
    x = epd_kv_stamp_mix(x ^ ((uint64_t)s->layer << 32 | s->index));
    return epd_kv_stamp_mix(x ^ s->count);
}

uint64_t epd_kv_stamp_body(const void *unit, uint64_t unit_bytes)
{
    return epd_hash64((const unsigned char *)unit + EPD_KV_STAMP_HALF,
                      (size_t)(unit_bytes - EPD_KV_STAMP_BYTES), 0);
}

void epd_kv_stamp_put(void *unit, uint64_t unit_bytes, const epd_kv_stamp_t *s)
{
    unsigned char *head = unit;
    unsigned char *tail = head + unit_bytes - EPD_KV_STAMP_HALF;
    uint32_t h32[2] = {EPD_KV_STAMP_MAGIC, s->layer};
    uint32_t ic[2] = {s->index, s->count};
    uint64_t t64[4] = {s->req_id, s->hk, s->body, epd_kv_stamp_check_of(s)};

    memcpy(head, h32, 8);
    memcpy(head + 8, &s->req_id, 8);
    memcpy(head + 16, ic, 8);
    memcpy(head + 24, &s->tag, 8);
    memcpy(tail, t64, sizeof(t64));
}

uint64_t epd_kv_stamp_body_field(const void *unit, uint64_t unit_bytes)
{
    uint64_t v;

    memcpy(&v, (const unsigned char *)unit + unit_bytes - EPD_KV_STAMP_HALF + 16, 8);
    return v;
}

epd_status_t epd_kv_stamp_get(const void *unit, uint64_t unit_bytes, epd_kv_stamp_t *s_p)
{
    const unsigned char *head = unit;
    const unsigned char *tail = head + unit_bytes - EPD_KV_STAMP_HALF;
    uint32_t h32[2], ic[2];
    uint64_t t64[4];
    epd_kv_stamp_t s;

    memcpy(h32, head, 8);
    memcpy(&s.req_id, head + 8, 8);
    memcpy(ic, head + 16, 8);
    memcpy(&s.tag, head + 24, 8);
    memcpy(t64, tail, sizeof(t64));
    s.layer = h32[1];
    s.index = ic[0];
    s.count = ic[1];
    s.hk = t64[1];
    s.body = t64[2];
    *s_p = s;
    if (h32[0] != EPD_KV_STAMP_MAGIC || t64[0] != s.req_id || t64[3] != epd_kv_stamp_check_of(&s)) {
        return EPD_ERR_CORRUPT;
    }
    return EPD_OK;
}

static epd_status_t epd_kv_stamp_refuse(const char **why_p, const char *why, epd_status_t st)
{
    if (why_p != NULL) {
        *why_p = why;
    }
    return st;
}

/* One unit of the check: its stamp against what it must say, copied to
 * out[0..EPD_KV_STAMP_BYTES) for the layer's checksum. */
static epd_status_t epd_kv_stamp_check_unit(const unsigned char *unit, uint64_t unit_bytes,
                                            uint32_t layer, uint32_t index, uint32_t count,
                                            const epd_kv_stamp_expect_t *x, unsigned char *out,
                                            const char **why_p)
{
    epd_kv_stamp_t s;

    if (epd_kv_stamp_get(unit, unit_bytes, &s) != EPD_OK) {
        return epd_kv_stamp_refuse(why_p, "KV stamp torn or missing: a write did not land whole",
                                   EPD_ERR_CORRUPT);
    }
    if (s.req_id != x->req_id) {
        return epd_kv_stamp_refuse(why_p, "KV stamp names another request: misrouted bytes",
                                   EPD_ERR_CORRUPT);
    }
    if (s.layer != layer || s.index != index) {
        return epd_kv_stamp_refuse(why_p, "KV stamp names another layer or block: misplaced bytes",
                                   EPD_ERR_CORRUPT);
    }
    if (s.tag != x->tag) {
        return epd_kv_stamp_refuse(why_p, "KV stamp names another decode incarnation",
                                   EPD_ERR_CORRUPT);
    }
    if (s.count != count) {
        return epd_kv_stamp_refuse(why_p, "KV stamp holds another number of tokens",
                                   EPD_ERR_CORRUPT);
    }
    if (x->full && epd_kv_stamp_body(unit, unit_bytes) != s.body) {
        return epd_kv_stamp_refuse(why_p, "KV body differs from its stamped digest",
                                   EPD_ERR_CORRUPT);
    }
    memcpy(out, unit, EPD_KV_STAMP_HALF);
    memcpy(out + EPD_KV_STAMP_HALF, unit + unit_bytes - EPD_KV_STAMP_HALF, EPD_KV_STAMP_HALF);
    return EPD_OK;
}

/* Blocks [from, to) of an attention layer into h (not reset): each checked
 * and its stamps hashed; *bytes_p gets the bytes they span. */
static epd_status_t epd_kv_stamp_check_run(const epd_kv_layout_t *layout,
                                           const epd_kv_pool_t *pool, const uint32_t *ids,
                                           uint32_t from, uint32_t to, uint32_t layer,
                                           const epd_kv_stamp_expect_t *x, epd_hash_state_t *h,
                                           uint64_t *bytes_p, const char **why_p)
{
    unsigned char buf[EPD_KV_STAMP_GATHER * EPD_KV_STAMP_BYTES];
    const unsigned char *base = pool->base;
    uint32_t bt = layout->block_tokens, n_buf = 0;
    /* this layer's blocks: with a KV dtype map, layers differ in size */
    uint64_t bb = epd_kv_layer_block_bytes(layout, layer);
    uint64_t off;
    epd_status_t st;

    *bytes_p = 0;
    if (bb < EPD_KV_STAMP_MIN || bt == 0) {
        return epd_kv_stamp_refuse(why_p, "KV blocks too small for stamps", EPD_ERR_INVALID_PARAM);
    }
    for (uint32_t i = from; i < to; i++) {
        uint64_t first = (uint64_t)i * bt;
        uint64_t pf;

        /* the stamps of a unit a few ahead: their cache misses overlap
         * instead of adding up (two lines per unit, units apart) */
        if (i + EPD_KV_STAMP_AHEAD < to &&
            epd_kv_block_offset(layout, pool->n_blocks, layer, ids[i + EPD_KV_STAMP_AHEAD], &pf) ==
                EPD_OK &&
            pf + bb <= pool->bytes) {
            __builtin_prefetch(base + pf);
            __builtin_prefetch(base + pf + bb - EPD_KV_STAMP_HALF);
        }
        uint32_t count = x->n_tokens > first
                             ? (uint32_t)(x->n_tokens - first < bt ? x->n_tokens - first : bt)
                             : 0;

        if (epd_kv_block_offset(layout, pool->n_blocks, layer, ids[i], &off) != EPD_OK ||
            off + bb > pool->bytes) {
            return epd_kv_stamp_refuse(why_p, "block outside the pool", EPD_ERR_INVALID_PARAM);
        }
        st = epd_kv_stamp_check_unit(base + off, bb, layer, i, count, x,
                                     buf + (size_t)n_buf * EPD_KV_STAMP_BYTES, why_p);
        if (st != EPD_OK) {
            return st;
        }
        if (++n_buf == EPD_KV_STAMP_GATHER) {
            /* hashed in large pieces: one update per unit costs more than
             * the hash itself */
            epd_hash_state_update(h, buf, sizeof(buf));
            n_buf = 0;
        }
        *bytes_p += bb;
    }
    if (n_buf > 0) {
        epd_hash_state_update(h, buf, (size_t)n_buf * EPD_KV_STAMP_BYTES);
    }
    return EPD_OK;
}

static epd_status_t epd_kv_stamp_sum_is(epd_hash_state_t *h, uint64_t sum, const char **why_p)
{
    if (epd_hash_state_digest(h) != sum) {
        return epd_kv_stamp_refuse(why_p, "KV checksum mismatch: the cache is corrupt",
                                   EPD_ERR_CORRUPT);
    }
    return EPD_OK;
}

epd_status_t epd_kv_stamp_check_blocks(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                       const uint32_t *ids, uint32_t from, uint32_t to,
                                       uint32_t layer, const epd_kv_stamp_expect_t *x,
                                       uint64_t sum, epd_hash_state_t *h, uint64_t *bytes_p,
                                       const char **why_p)
{
    uint64_t bytes = 0;
    epd_status_t st;

    if (layer >= layout->n_layers || layout->kind[layer] != EPD_LAYER_ATTENTION || from > to) {
        return epd_kv_stamp_refuse(why_p, "not an attention layer's blocks",
                                   EPD_ERR_INVALID_PARAM);
    }
    st = epd_kv_stamp_check_run(layout, pool, ids, from, to, layer, x, h, &bytes, why_p);
    if (bytes_p != NULL) {
        *bytes_p = bytes;
    }
    return st != EPD_OK ? st : epd_kv_stamp_sum_is(h, sum, why_p);
}

void epd_kv_stamp_hash_unit(epd_hash_state_t *h, const void *unit, uint64_t unit_bytes)
{
    const unsigned char *u = unit;

    epd_hash_state_update(h, u, EPD_KV_STAMP_HALF);
    epd_hash_state_update(h, u + unit_bytes - EPD_KV_STAMP_HALF, EPD_KV_STAMP_HALF);
}

epd_status_t epd_kv_stamp_check_layer(const epd_kv_layout_t *layout, const epd_kv_pool_t *pool,
                                      const uint32_t *ids, uint32_t n_ids, uint32_t slot,
                                      uint32_t layer, const epd_kv_stamp_expect_t *x,
                                      uint64_t sum, epd_hash_state_t *h, uint64_t *bytes_p,
                                      const char **why_p)
{
    unsigned char buf[EPD_KV_STAMP_BYTES];
    const unsigned char *base = pool->base;
    uint64_t bytes = 0;
    uint64_t off;
    epd_status_t st;

    if (layer >= layout->n_layers) {
        return epd_kv_stamp_refuse(why_p, "layer outside the model", EPD_ERR_INVALID_PARAM);
    }
    epd_hash_state_reset(h, 0);
    if (layout->kind[layer] == EPD_LAYER_LINEAR) {
        if (layout->state_bytes < EPD_KV_STAMP_MIN ||
            epd_kv_state_offset(layout, pool->n_blocks, pool->n_state_slots, layer, slot, &off) !=
                EPD_OK ||
            off + layout->state_bytes > pool->bytes) {
            return epd_kv_stamp_refuse(why_p, "state slot outside the pool or too small",
                                       EPD_ERR_INVALID_PARAM);
        }
        st = epd_kv_stamp_check_unit(base + off, layout->state_bytes, layer, 0, x->n_tokens, x,
                                     buf, why_p);
        if (st != EPD_OK) {
            return st;
        }
        epd_hash_state_update(h, buf, EPD_KV_STAMP_BYTES);
        bytes = layout->state_bytes;
    } else {
        st = epd_kv_stamp_check_run(layout, pool, ids, 0, n_ids, layer, x, h, &bytes, why_p);
        if (st != EPD_OK) {
            return st;
        }
    }
    if (bytes_p != NULL) {
        *bytes_p = bytes;
    }
    return epd_kv_stamp_sum_is(h, sum, why_p);
}
