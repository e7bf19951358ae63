/*
 * epd_kvcache.h — the index of a prefix cache: which blocks of a worker's
 * KV pool hold which chain-hashed prompt blocks (kv/epd_prefix.h),
 * who uses them, and which go first when room is needed.
 *
 * The cache never owns memory of the pool: it maps a key to a block id the
 * caller gave it (epd_kvcache_insert) and hands the id back when it evicts
 * it.  A cached block is read-only for as long as it is cached (the same
 * KV is read by every request whose prompt starts the same way).
 *
 *   pinned    used by a request (acquire, or the insert of the request
 *             that computed it): never evicted
 *   evictable no pin: on the LRU list, the least recently released first
 *
 * Requests release a chain deepest block first, so a prompt's first blocks
 * end up more recent than its last ones and a chain is evicted from its
 * end: a deeper block is only useful while its parents are cached.
 *
 * Threads: one (a daemon's loop thread).  No allocation after create.
 */
#ifndef EPD_KVCACHE_H
#define EPD_KVCACHE_H

#include <stdint.h>

#include "epd_prefix.h"
#include "epd_status.h"

#define EPD_KVCACHE_NONE UINT32_MAX

typedef struct epd_kvcache epd_kvcache_t;

/* An index for block ids [0, n_blocks); *c_p owned by the caller
 * (epd_kvcache_destroy).  EPD_ERR_NO_MEMORY, EPD_ERR_INVALID_PARAM. */
epd_status_t epd_kvcache_create(uint32_t n_blocks, epd_kvcache_t **c_p);
/* NULL is a no-op. */
void epd_kvcache_destroy(epd_kvcache_t *c);

/* How many leading keys of hashes[0..n) are cached (nothing changes). */
uint32_t epd_kvcache_peek(const epd_kvcache_t *c, const epd_prefix_hash_t *hashes, uint32_t n);

/* The same, and pins each of those blocks once, their ids into
 * blocks_p[0..returned) (caller's array of n). */
uint32_t epd_kvcache_acquire(epd_kvcache_t *c, const epd_prefix_hash_t *hashes, uint32_t n,
                             uint32_t *blocks_p);

/* The block cached under h, or EPD_KVCACHE_NONE (nothing changes). */
uint32_t epd_kvcache_find(const epd_kvcache_t *c, const epd_prefix_hash_t *h);

/* Blocks the cache was created for (every block id is below it). */
uint32_t epd_kvcache_capacity(const epd_kvcache_t *c);

/* The key of cached block `block` (NULL when it is not cached). */
const epd_prefix_hash_t *epd_kvcache_key(const epd_kvcache_t *c, uint32_t block);

/* Caches the caller's `block` (its KV final) under h, pinned once for the
 * caller.  EPD_OK; EPD_ERR_EXISTS when h is cached already, under another
 * block (nothing changes: the block stays the caller's); EPD_ERR_INVALID_PARAM
 * for a block out of range or cached already. */
epd_status_t epd_kvcache_insert(epd_kvcache_t *c, const epd_prefix_hash_t *h, uint32_t block);

/* Drops one pin of `block`.  Returns 1 when the block is cached (the cache
 * keeps it; the last pin makes it the most recently used evictable one),
 * 0 when it is not (it is the caller's to free). */
int epd_kvcache_release(epd_kvcache_t *c, uint32_t block);

/* Takes the least recently used evictable block out of the cache: its id
 * (the caller's again), its key into *h_p (may be NULL); EPD_KVCACHE_NONE
 * when every cached block is pinned or none is cached. */
uint32_t epd_kvcache_evict(epd_kvcache_t *c, epd_prefix_hash_t *h_p);

/* The least recently used evictable block for which pred(arg, block) is
 * nonzero, or EPD_KVCACHE_NONE (nothing changes; O(evictable)). */
uint32_t epd_kvcache_lru_find(const epd_kvcache_t *c, int (*pred)(void *arg, uint32_t block),
                              void *arg);

/* Cached blocks, and those of them that are evictable. */
uint32_t epd_kvcache_count(const epd_kvcache_t *c);
uint32_t epd_kvcache_evictable(const epd_kvcache_t *c);

#endif
