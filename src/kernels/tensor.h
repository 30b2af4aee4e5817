/* What the kernels' host side shares: a layer's dimensions. A device tensor is an iha_buffer
 * (include/iha.h): a buffer and an element offset. Callers (src/layer) have validated shapes;
 * the kernels' host functions only enqueue. */
#ifndef IHA_KERNELS_TENSOR_H
#define IHA_KERNELS_TENSOR_H
#include "runtime/context.h"

/* Dimensions shared by the stages of one layer. */
typedef struct iha_dims {
    size_t B, N, H, d, P, T;
    /* Packed sequences: (first token, one past the last) of each token's sequence as cl_int2
     * [B][N] (layer/sequences.h); NULL when each batch row is one sequence. */
    cl_mem seq_bounds;
} iha_dims;
#endif
