/* epd_hash.c — thin wrappers over XXH3 so the rest of epd does not include
 * xxhash.h (and its large inline bodies) everywhere. */
#include "epd_hash.h"

#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* for the size of XXH3_state_t */
#include <xxhash.h>

#include <sodium.h>

#include "epd_alloc.h"

struct epd_hash_state {
    XXH3_state_t xxh;
};

uint64_t epd_hash64(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

void epd_hash128(const void *data, size_t len, uint64_t seed, uint8_t out[16])
{
    XXH128_canonical_t c;

    XXH128_canonicalFromHash(&c, XXH3_128bits_withSeed(data, len, seed));
    memcpy(out, c.digest, 16);
}

epd_status_t epd_hash_state_create(uint64_t seed, epd_hash_state_t **state_p)
{
    /* XXH3_state_t wants 64-byte alignment; epd_malloc gives 16, so the
     * state is embedded in an over-aligned wrapper allocated with slack. */
    unsigned char *raw = epd_malloc(sizeof(epd_hash_state_t) + 64 + sizeof(void *));
    uintptr_t aligned;
    epd_hash_state_t *state;

    if (raw == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    aligned = ((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63;
    state = (epd_hash_state_t *)aligned;
    ((void **)state)[-1] = raw;
    epd_hash_state_reset(state, seed);
    *state_p = state;
    return EPD_OK;
}

void epd_hash_state_destroy(epd_hash_state_t *state)
{
    if (state == NULL) {
        return;
    }
    epd_free(((void **)state)[-1]);
}

void epd_hash_state_reset(epd_hash_state_t *state, uint64_t seed)
{
    XXH3_64bits_reset_withSeed(&state->xxh, seed);
}

void epd_hash_state_update(epd_hash_state_t *state, const void *data, size_t len)
{
    XXH3_64bits_update(&state->xxh, data, len);
}

uint64_t epd_hash_state_digest(const epd_hash_state_t *state)
{
    return XXH3_64bits_digest(&state->xxh);
}

void epd_content_hash(const void *data, size_t len, unsigned char out[EPD_CONTENT_HASH_BYTES])
{
    /* sodium_init is idempotent and thread-safe; it picks the fastest
     * BLAKE2b implementation this CPU has */
    if (sodium_init() < 0) {
        /* cannot happen with Debian's build (it fails only without a
         * usable random source, which BLAKE2b does not need) */
        memset(out, 0, EPD_CONTENT_HASH_BYTES);
    }
    crypto_generichash(out, EPD_CONTENT_HASH_BYTES, data, len, NULL, 0);
}

_Static_assert(sizeof(crypto_generichash_state) <= sizeof(((epd_content_hash_state_t *)0)->opaque_),
               "epd_content_hash_state_t is too small for libsodium's state");

void epd_content_hash_init(epd_content_hash_state_t *st)
{
    if (sodium_init() < 0) {
        /* cannot happen (see epd_content_hash) */
        memset(st, 0, sizeof(*st));
    }
    crypto_generichash_init((crypto_generichash_state *)(void *)st->opaque_, NULL, 0,
                            EPD_CONTENT_HASH_BYTES);
}

void epd_content_hash_update(epd_content_hash_state_t *st, const void *data, size_t len)
{
    crypto_generichash_update((crypto_generichash_state *)(void *)st->opaque_, data, len);
}

void epd_content_hash_final(epd_content_hash_state_t *st, unsigned char out[EPD_CONTENT_HASH_BYTES])
{
    crypto_generichash_final((crypto_generichash_state *)(void *)st->opaque_, out,
                             EPD_CONTENT_HASH_BYTES);
}
