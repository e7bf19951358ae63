/*
 * epd_kvcache.c — the prefix cache's index (see the header): per block id
 * one entry (key, pins, LRU links, hash-bucket link), the buckets a power
 * of two at least twice the blocks, chained through the entries.  Keys are
 * BLAKE2b outputs, so their first 8 bytes are a good bucket index.
 */
#include "epd_kvcache.h"

#include <string.h>

#include "epd_alloc.h"

typedef struct {
    epd_prefix_hash_t key;
    uint32_t pins;
    uint32_t prev, next; /* LRU list (evictable entries only) */
    uint32_t chain;      /* next entry of the bucket */
    uint8_t cached;
    uint8_t listed; /* on the LRU list */
} epd_kvcache_ent_t;

struct epd_kvcache {
    uint32_t n_blocks;
    uint32_t mask; /* buckets - 1 */
    uint32_t *buckets;
    epd_kvcache_ent_t *ent;
    uint32_t lru, mru; /* list ends (EPD_KVCACHE_NONE when empty) */
    uint32_t count, evictable;
};

epd_status_t epd_kvcache_create(uint32_t n_blocks, epd_kvcache_t **c_p)
{
    epd_kvcache_t *c;
    uint32_t nb = 16;

    if (n_blocks == 0 || n_blocks >= (1u << 30)) {
        return EPD_ERR_INVALID_PARAM;
    }
    while (nb < 2 * n_blocks) {
        nb <<= 1;
    }
    c = epd_calloc(1, sizeof(*c));
    if (c == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    c->buckets = epd_malloc((size_t)nb * sizeof(*c->buckets));
    c->ent = epd_calloc(n_blocks, sizeof(*c->ent));
    if (c->buckets == NULL || c->ent == NULL) {
        epd_kvcache_destroy(c);
        return EPD_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < nb; i++) {
        c->buckets[i] = EPD_KVCACHE_NONE;
    }
    c->n_blocks = n_blocks;
    c->mask = nb - 1;
    c->lru = c->mru = EPD_KVCACHE_NONE;
    *c_p = c;
    return EPD_OK;
}

void epd_kvcache_destroy(epd_kvcache_t *c)
{
    if (c == NULL) {
        return;
    }
    epd_free(c->buckets);
    epd_free(c->ent);
    epd_free(c);
}

static uint32_t epd_kvcache_bucket(const epd_kvcache_t *c, const epd_prefix_hash_t *h)
{
    return (uint32_t)epd_prefix_hint(h) & c->mask;
}

uint32_t epd_kvcache_find(const epd_kvcache_t *c, const epd_prefix_hash_t *h)
{
    for (uint32_t b = c->buckets[epd_kvcache_bucket(c, h)]; b != EPD_KVCACHE_NONE;
         b = c->ent[b].chain) {
        if (memcmp(c->ent[b].key.b, h->b, EPD_PREFIX_HASH_BYTES) == 0) {
            return b;
        }
    }
    return EPD_KVCACHE_NONE;
}

uint32_t epd_kvcache_capacity(const epd_kvcache_t *c)
{
    return c->n_blocks;
}

const epd_prefix_hash_t *epd_kvcache_key(const epd_kvcache_t *c, uint32_t block)
{
    return block < c->n_blocks && c->ent[block].cached ? &c->ent[block].key : NULL;
}

static void epd_kvcache_unlist(epd_kvcache_t *c, uint32_t b)
{
    epd_kvcache_ent_t *e = &c->ent[b];

    if (!e->listed) {
        return;
    }
    if (e->prev != EPD_KVCACHE_NONE) {
        c->ent[e->prev].next = e->next;
    } else {
        c->lru = e->next;
    }
    if (e->next != EPD_KVCACHE_NONE) {
        c->ent[e->next].prev = e->prev;
    } else {
        c->mru = e->prev;
    }
    e->listed = 0;
    c->evictable--;
}

static void epd_kvcache_list_mru(epd_kvcache_t *c, uint32_t b)
{
    epd_kvcache_ent_t *e = &c->ent[b];

    e->prev = c->mru;
    e->next = EPD_KVCACHE_NONE;
    if (c->mru != EPD_KVCACHE_NONE) {
        c->ent[c->mru].next = b;
    } else {
        c->lru = b;
    }
    c->mru = b;
    e->listed = 1;
    c->evictable++;
}

uint32_t epd_kvcache_peek(const epd_kvcache_t *c, const epd_prefix_hash_t *hashes, uint32_t n)
{
    uint32_t i = 0;

    while (i < n && epd_kvcache_find(c, &hashes[i]) != EPD_KVCACHE_NONE) {
        i++;
    }
    return i;
}

uint32_t epd_kvcache_acquire(epd_kvcache_t *c, const epd_prefix_hash_t *hashes, uint32_t n,
                             uint32_t *blocks_p)
{
    uint32_t i;

    for (i = 0; i < n; i++) {
        uint32_t b = epd_kvcache_find(c, &hashes[i]);

        if (b == EPD_KVCACHE_NONE) {
            break;
        }
        epd_kvcache_unlist(c, b);
        c->ent[b].pins++;
        blocks_p[i] = b;
    }
    return i;
}

epd_status_t epd_kvcache_insert(epd_kvcache_t *c, const epd_prefix_hash_t *h, uint32_t block)
{
    epd_kvcache_ent_t *e;
    uint32_t bucket;

    if (block >= c->n_blocks || c->ent[block].cached) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (epd_kvcache_find(c, h) != EPD_KVCACHE_NONE) {
        return EPD_ERR_EXISTS;
    }
    e = &c->ent[block];
    memset(e, 0, sizeof(*e));
    e->key = *h;
    e->pins = 1;
    e->cached = 1;
    bucket = epd_kvcache_bucket(c, h);
    e->chain = c->buckets[bucket];
    c->buckets[bucket] = block;
    c->count++;
    return EPD_OK;
}

int epd_kvcache_release(epd_kvcache_t *c, uint32_t block)
{
    epd_kvcache_ent_t *e;

    if (block >= c->n_blocks || !c->ent[block].cached) {
        return 0;
    }
    e = &c->ent[block];
    if (e->pins > 0 && --e->pins == 0) {
        epd_kvcache_list_mru(c, block);
    }
    return 1;
}

uint32_t epd_kvcache_evict(epd_kvcache_t *c, epd_prefix_hash_t *h_p)
{
    uint32_t b = c->lru;
    uint32_t *link;

    if (b == EPD_KVCACHE_NONE) {
        return EPD_KVCACHE_NONE;
    }
    epd_kvcache_unlist(c, b);
    for (link = &c->buckets[epd_kvcache_bucket(c, &c->ent[b].key)]; *link != b;
         link = &c->ent[*link].chain) {
    }
    *link = c->ent[b].chain;
    if (h_p != NULL) {
        *h_p = c->ent[b].key;
    }
    c->ent[b].cached = 0;
    c->count--;
    return b;
}

uint32_t epd_kvcache_lru_find(const epd_kvcache_t *c, int (*pred)(void *arg, uint32_t block),
                              void *arg)
{
    for (uint32_t b = c->lru; b != EPD_KVCACHE_NONE; b = c->ent[b].next) {
        if (pred(arg, b)) {
            return b;
        }
    }
    return EPD_KVCACHE_NONE;
}

uint32_t epd_kvcache_count(const epd_kvcache_t *c)
{
    return c->count;
}

uint32_t epd_kvcache_evictable(const epd_kvcache_t *c)
{
    return c->evictable;
}
