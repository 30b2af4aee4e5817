/* 16-bit storage (cl/convert.cl): conversions and the 16-bit-weight GEMV, for half and bfloat16. */
#ifndef IHA_KERNELS_CONVERT_H
#define IHA_KERNELS_CONVERT_H
#include "kernels/tensor.h"

/* The fixed work-group size of the passes over a tensor's elements (here and
 * kernels/accumulate.h): PoCL compiles a kernel once per work-group size. */
size_t iha__convert_group_size(const iha_context *ctx);
/* n elements from `storage` (IHA_STORAGE_F16 or IHA_STORAGE_BF16) to float, or back when
 * to_storage (round to nearest even). */
iha_status iha__convert_enqueue(iha_context *ctx, int storage, int to_storage, iha_buffer src, iha_buffer dst,
                                size_t n);
/* y [m][C] = x [m][K] * w [K][C] with float x and y and w in `storage` (IHA_STORAGE_F16 or
 * IHA_STORAGE_BF16), read directly. */
iha_status iha__gemv_16bit_weights_enqueue(iha_context *ctx, int storage, size_t m, size_t C, size_t K, iha_buffer x,
                                           iha_buffer w, iha_buffer y);
#endif
