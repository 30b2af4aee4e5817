/* What the kernels' host side shares: a layer's dimensions. A device tensor is an iha_buffer
 * (include/iha.h): a buffer and an element offset. Callers (src/layer) have validated shapes;
 * the kernels' host functions only enqueue. */
#ifndef IHA_KERNELS_TENSOR_H
#define IHA_KERNELS_TENSOR_H
#include "runtime/context.h"

/* Dimensions shared by the stages of one layer. */
typedef struct iha_dims {
    size_t B, N, H, d, P, T;
} iha_dims;
#endif
