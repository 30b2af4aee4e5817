/* 16-bit storage (cl/convert.cl): conversions and the 16-bit-weight GEMV, for half and bfloat16. */
#ifndef IHA_KERNELS_CONVERT_H
#define IHA_KERNELS_CONVERT_H
#include "kernels/tensor.h"

/* One pass over n elements (here and kernels/accumulate.h): kernel `name` of `program`, taking
 * (src, src_off, dst, dst_off, n) and 8 elements per work-item, on a fixed work-group size.
 * Nothing is enqueued for n == 0. */
iha_status iha__elementwise_enqueue(iha_context *ctx, const char *program, const char *name, iha_buffer src,
                                    iha_buffer dst, size_t n);
/* n elements from `storage` (IHA_STORAGE_F16 or IHA_STORAGE_BF16) to float, or back when
 * to_storage (round to nearest even). */
iha_status iha__convert_enqueue(iha_context *ctx, int storage, int to_storage, iha_buffer src, iha_buffer dst,
                                size_t n);
/* y [m][C] = x [m][K] * w [K][C] with float x and y and w in `storage` (IHA_STORAGE_F16 or
 * IHA_STORAGE_BF16), read directly. */
iha_status iha__gemv_16bit_weights_enqueue(iha_context *ctx, int storage, size_t m, size_t C, size_t K, iha_buffer x,
                                           iha_buffer w, iha_buffer y);
#endif
