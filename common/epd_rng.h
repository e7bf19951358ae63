/*
 * epd_rng.h — small, fast, seedable pseudo-random numbers (xoshiro256**,
 * seeded through splitmix64).  Reproducible across runs and machines: the
 * same seed always gives the same sequence, which is what per-request
 * sampling seeds, seeded model weights and test data need.  Not for secrets.
 * A state belongs to one thread at a time.
 */
#ifndef EPD_RNG_H
#define EPD_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} epd_rng_t;

/* Seeds `rng` (caller's storage) from `seed`. */
void epd_rng_seed(epd_rng_t *rng, uint64_t seed);
/* Next 64 random bits. */
uint64_t epd_rng_next(epd_rng_t *rng);
/* Uniform double in [0, 1), 53 bits. */
double epd_rng_uniform(epd_rng_t *rng);
/* Standard normal deviate (Box-Muller). */
double epd_rng_normal(epd_rng_t *rng);
/* Fills `len` bytes with random bytes. */
void epd_rng_fill(epd_rng_t *rng, void *buf, size_t len);
/* A seed for a fresh identity (epochs, ids): time, pid and address entropy
 * mixed; different in every process start. */
uint64_t epd_rng_entropy(void);

#endif
