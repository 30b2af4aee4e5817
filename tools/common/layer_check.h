/*
 * layer_check.h - checks of a layer's output that the tool can afford on large shapes: every
 * element finite, and sampled rows against the float64 reference of doc/spec.md (reference/).
 */
#ifndef IHA_TOOLS_LAYER_CHECK_H
#define IHA_TOOLS_LAYER_CHECK_H

#include <stddef.h>

#include "iha.h"

/* doc/spec.md's float32 contract: relative L2 error at most this against float64. */
#define LAYER_CHECK_F32_LIMIT 1e-5
/* doc/spec.md's contract for half-precision storage with float arithmetic. */
#define LAYER_CHECK_F16_LIMIT 2e-3
/* doc/spec.md's contract for bfloat16 storage with float arithmetic. */
#define LAYER_CHECK_BF16_LIMIT 1e-2

/* The number of NaN or infinite values among z[0 .. count-1]. */
size_t layer_check_nonfinite(const float *z, size_t count);

/* Compares `nrows` rows of z [B*N][D] spread evenly over all B*N token rows (the first and
 * the last included; all rows when nrows >= B*N) with the float64 reference. Stores
 * ||z - ref|| / ||ref|| over those rows in *rel_error and the number of rows used in *used.
 * Returns 0, or -1 with a message when memory runs out. */
int layer_check_reference(const iha_shape *shape, const iha_attention_options *options,
                          const iha_host_weights *weights, const float *x, const float *z, size_t nrows,
                          double *rel_error, size_t *used, char *err, size_t err_size);

#endif
