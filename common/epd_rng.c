/* epd_rng.c — xoshiro256** (Blackman & Vigna), public-domain algorithm. */
#include "epd_rng.h"

#include <math.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "epd_time.h"

static uint64_t epd_rng_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t epd_rng_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void epd_rng_seed(epd_rng_t *rng, uint64_t seed)
{
    uint64_t x = seed;

    for (int i = 0; i < 4; i++) {
        rng->s[i] = epd_rng_splitmix(&x);
    }
}

uint64_t epd_rng_next(epd_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = epd_rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = epd_rng_rotl(s[3], 45);
    return result;
}

double epd_rng_uniform(epd_rng_t *rng)
{
    return (double)(epd_rng_next(rng) >> 11) * 0x1.0p-53;
}

double epd_rng_normal(epd_rng_t *rng)
{
    double u1 = epd_rng_uniform(rng);
    double u2 = epd_rng_uniform(rng);

    if (u1 < 1e-300) {
        u1 = 1e-300;
    }
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void epd_rng_fill(epd_rng_t *rng, void *buf, size_t len)
{
    unsigned char *p = buf;

    while (len >= 8) {
        uint64_t v = epd_rng_next(rng);

        memcpy(p, &v, 8);
        p += 8;
        len -= 8;
    }
    if (len > 0) {
        uint64_t v = epd_rng_next(rng);

        memcpy(p, &v, len);
    }
}

uint64_t epd_rng_entropy(void)
{
    uint64_t seed = 0;
    uint64_t mix;

    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed)) {
        seed = 0;
    }
    mix = seed ^ epd_time_wall_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&mix;
    return epd_rng_splitmix(&mix);
}
