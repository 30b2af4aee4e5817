/*
 * cost.h - FLOPs of one IHA layer, counted as doc/spec.md's cost model says, so that every
 * GFLOP/s the tool prints means the same thing (demo now, bench later).
 */
#ifndef IHA_TOOLS_COST_H
#define IHA_TOOLS_COST_H

#include "iha.h"

/* FLOPs per stage; the fields match iha_stage_times. Doubles: exact up to 2^53, and large
 * shapes overflow 64-bit integers long before they overflow a double's range. */
typedef struct cost_flops {
    double projections; /* 3 * 2*B*N*D*H*d */
    double mixing;      /* 3 * 2*B*N*H*H*P*d */
    double attention;   /* 4*d per visible (query, key) pair, for each of B*H sequences */
    double collapse;    /* 2*B*N*H*H*P*d */
    double output;      /* 2*B*N*D*H*d */
} cost_flops;

/* The number of visible (virtual query, virtual key) pairs of one (b, h) sequence under the
 * mask and window of `options` (doc/spec.md "Attention" table). */
double cost_visible_pairs(const iha_shape *shape, const iha_attention_options *options);

void cost_layer_flops(const iha_shape *shape, const iha_attention_options *options, cost_flops *out);

double cost_total(const cost_flops *flops);

#endif
