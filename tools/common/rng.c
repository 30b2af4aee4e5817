/*
 * rng.c - splitmix64 and the non-zero uniform fill of rng.h.
 */
#include "common/rng.h"

uint64_t rng_next(rng *g)
{
    uint64_t z = (g->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_fill(rng *g, float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t bits = rng_next(g);
        float magnitude = (float)(bits >> 40) * (1.0f / 16777216.0f); /* [0, 1), 24 bits */
        magnitude = (1.0f / 64) + magnitude * (1.0f - 1.0f / 64);
        x[i] = (bits & 1) ? -scale * magnitude : scale * magnitude;
    }
}
