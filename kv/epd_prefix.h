/*
 * epd_prefix.h — chain hashes of a prompt's KV blocks: the keys of the
 * prefix caches (prefill's, decode's) and of KV-aware routing.
 *
 * A cache is a namespace of blocks that compute the same: the root hash
 * digests the engine's name, its model digest (epd_engine_info_t), the KV
 * layout (block size, layers and their kinds, heads, dtype, bytes) and an
 * optional salt (a tenant's: blocks of two salts never meet).  Block i of
 * a prompt — tokens [i * bt, (i + 1) * bt) — is keyed
 *
 *   h(i) = BLAKE2b-256(h(i - 1) || its bt tokens (u32 little-endian) ||
 *                      for each image span that meets the block:
 *                      pos, n (u32 LE) and the image's content hash)
 *
 * with h(-1) the root: equal keys mean equal tokens and images at equal
 * positions all the way from position 0, in the same namespace, so equal
 * KV (the engines are split-invariant, epd_engine_prefill).  A
 * cryptographic hash, as for the embedding cache: the cache is shared by
 * every client, and a colliding prompt must not be craftable.  Only full
 * blocks have keys.
 *
 * Pure functions, any thread.
 */
#ifndef EPD_PREFIX_H
#define EPD_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_hash.h"

#define EPD_PREFIX_HASH_BYTES EPD_CONTENT_HASH_BYTES
#define EPD_PREFIX_SALT_MAX 256 /* bytes of a salt */

typedef struct {
    unsigned char b[EPD_PREFIX_HASH_BYTES];
} epd_prefix_hash_t;

/* An image of the prompt, as the hash sees it (its 32-byte content hash,
 * borrowed). */
typedef struct {
    uint32_t pos; /* first placeholder position */
    uint32_t n;   /* placeholders */
    const unsigned char *hash;
} epd_prefix_media_t;

/* The namespace of engine `engine_name` with `info` (borrowed) and
 * salt[0..salt_len) (NULL / 0: none; at most EPD_PREFIX_SALT_MAX). */
void epd_prefix_root(const char *engine_name, const epd_engine_info_t *info, const void *salt,
                     size_t salt_len, epd_prefix_hash_t *root_p);

/* The keys of the full blocks of tokens[0..n_tokens) under `root`, at most
 * `cap` of them, into out[]; images media[0..n_media) sorted by pos.
 * Returns how many were written: min(n_tokens / block_tokens, cap). */
uint32_t epd_prefix_chain(const epd_prefix_hash_t *root, uint32_t block_tokens,
                          const int32_t *tokens, uint32_t n_tokens,
                          const epd_prefix_media_t *media, uint32_t n_media,
                          epd_prefix_hash_t *out, uint32_t cap);

/* The same for blocks [first, first + cap) only, given `parent`: the key
 * of block first - 1 (the root when first is 0).  Returns how many were
 * written (the prompt's full blocks after `first`, at most cap). */
uint32_t epd_prefix_chain_from(const epd_prefix_hash_t *parent, uint32_t block_tokens,
                               const int32_t *tokens, uint32_t n_tokens,
                               const epd_prefix_media_t *media, uint32_t n_media, uint32_t first,
                               epd_prefix_hash_t *out, uint32_t cap);

/* The first 8 bytes of a key as a number: what workers publish to the
 * router (a hint, never trusted for correctness). */
uint64_t epd_prefix_hint(const epd_prefix_hash_t *h);

#endif
