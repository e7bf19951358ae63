/*
 * epd_hash.h — hashing and checksums (xxHash XXH3, from Debian's libxxhash;
 * BLAKE2b from libsodium).
 *
 * One function for one-shot 64-bit hashes (KV block checksums, prefix hashes
 * for affinity) and a streaming state for data that arrives in pieces (a
 * layer's KV spread over several blocks): fast, not meant to resist anyone
 * crafting collisions.  Content keys that users supply the data for (the
 * images behind the shared embedding cache) use a cryptographic hash
 * instead, epd_content_hash.  Any thread; a state belongs to one thread at
 * a time.
 */
#ifndef EPD_HASH_H
#define EPD_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

/* XXH3-64 of `len` bytes at `data` with `seed`. */
uint64_t epd_hash64(const void *data, size_t len, uint64_t seed);
/* XXH3-128 of the same, in its canonical (big-endian) byte order. */
void epd_hash128(const void *data, size_t len, uint64_t seed, uint8_t out[16]);

typedef struct epd_hash_state epd_hash_state_t;

/* Creates a streaming state (owned by the caller; destroy with
 * epd_hash_state_destroy).  EPD_ERR_NO_MEMORY. */
epd_status_t epd_hash_state_create(uint64_t seed, epd_hash_state_t **state_p);
void epd_hash_state_destroy(epd_hash_state_t *state);
/* Restarts the state with `seed`. */
void epd_hash_state_reset(epd_hash_state_t *state, uint64_t seed);
void epd_hash_state_update(epd_hash_state_t *state, const void *data, size_t len);
/* The hash of everything fed since the last reset; equals epd_hash64 of the
 * concatenation. */
uint64_t epd_hash_state_digest(const epd_hash_state_t *state);

/* Bytes of a content hash. */
#define EPD_CONTENT_HASH_BYTES 32

/* BLAKE2b-256 (unkeyed) of `len` bytes at `data` into out[0..32): the key
 * of the embedding cache (an image's encoded bytes).  Any thread. */
void epd_content_hash(const void *data, size_t len, unsigned char out[EPD_CONTENT_HASH_BYTES]);
/* The same, streaming (caller's storage, one thread at a time): init,
 * update with each piece, final — equals epd_content_hash of the
 * concatenation.  The chain hashes of the prefix caches
 * (kv/epd_prefix.h). */
typedef struct {
    _Alignas(64) unsigned char opaque_[512]; /* libsodium's state */
} epd_content_hash_state_t;
void epd_content_hash_init(epd_content_hash_state_t *st);
void epd_content_hash_update(epd_content_hash_state_t *st, const void *data, size_t len);
void epd_content_hash_final(epd_content_hash_state_t *st, unsigned char out[EPD_CONTENT_HASH_BYTES]);

#endif
