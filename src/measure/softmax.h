/* The unfused baseline's masked softmax (cl/measure_softmax.cl). */
#ifndef IHA_MEASURE_SOFTMAX_H
#define IHA_MEASURE_SOFTMAX_H
#include "runtime/context.h"

/* Replaces each row of the T x T score matrix at scores + offset (floats) by the softmax over
 * its visible keys, 0 elsewhere. mask is an iha_mask; window in tokens (0: global), already
 * clamped below N = T/P. */
iha_status iha__softmax_rows_enqueue(iha_context *ctx, cl_mem scores, size_t offset, size_t T, size_t P, int mask,
                                     size_t window);
#endif
