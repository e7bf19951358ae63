/*
 * epd_hash.h — hashing and checksums (xxHash XXH3, from Debian's libxxhash).
 *
 * One function for one-shot 64-bit hashes (KV block checksums, prefix hashes
 * for affinity, image content keys) and a streaming state for data that
 * arrives in pieces (a layer's KV spread over several blocks).  Any thread;
 * a state belongs to one thread at a time.
 */
#ifndef EPD_HASH_H
#define EPD_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

/* XXH3-64 of `len` bytes at `data` with `seed`. */
uint64_t epd_hash64(const void *data, size_t len, uint64_t seed);

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

#endif
