/*
 * rng.h - a small seeded generator (splitmix64) for random layers: the same seed gives the
 * same layer on every machine, so a failing demo can be reproduced with --seed.
 */
#ifndef IHA_TOOLS_RNG_H
#define IHA_TOOLS_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct rng {
    uint64_t state;
} rng;

uint64_t rng_next(rng *g);

/* Fills x with values uniform in [-scale, -scale/64] U [scale/64, scale]: never zero (doc/spec.md's
 * tests forbid zeros, which hide indexing mistakes), with random signs. */
void rng_fill(rng *g, float *x, size_t n, float scale);

#endif
