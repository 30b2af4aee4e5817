/* Gradient accumulation (cl/accumulate.cl): a float result added into an output of any storage. */
#ifndef IHA_KERNELS_ACCUMULATE_H
#define IHA_KERNELS_ACCUMULATE_H
#include "kernels/tensor.h"

/* dst (n elements of `storage`) = dst + src (n floats), the sum rounded once into the storage.
 * src and dst must not overlap. IHA_ERROR_UNSUPPORTED for a storage without an accumulation
 * kernel. */
iha_status iha__accumulate_enqueue(iha_context *ctx, iha_storage storage, iha_buffer src, iha_buffer dst, size_t n);
/* Builds (or finds in the context's cache) the accumulation kernel into `storage`, so that a
 * later iha__accumulate_enqueue cannot fail for its build. */
iha_status iha__accumulate_kernel_get(iha_context *ctx, iha_storage storage);
#endif
