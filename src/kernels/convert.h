/* Half-precision storage (cl/convert.cl): conversions and the half-weight GEMV. */
#ifndef IHA_KERNELS_CONVERT_H
#define IHA_KERNELS_CONVERT_H
#include "kernels/tensor.h"

/* The fixed work-group size of the passes over a tensor's elements (here and
 * kernels/accumulate.h): PoCL compiles a kernel once per work-group size. */
size_t iha__convert_group_size(const iha_context *ctx);
/* n elements from half to float or back (round to nearest even). */
iha_status iha__convert_enqueue(iha_context *ctx, int to_half, iha_buffer src, iha_buffer dst, size_t n);
/* y [m][C] = x [m][K] * w [K][C] with float x and y and half w, read directly. */
iha_status iha__gemv_half_weights_enqueue(iha_context *ctx, size_t m, size_t C, size_t K, iha_buffer x, iha_buffer w,
                                          iha_buffer y);
#endif
