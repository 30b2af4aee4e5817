/* Host side of cl/accumulate.cl: a float result added into an output of any storage. */
#include "kernels/accumulate.h"
#include "kernels/convert.h"
#include "runtime/error.h"
#include "runtime/program.h"

static const char *kernel_name(iha_storage storage)
{
    return storage == IHA_STORAGE_F32    ? "accumulate_f32"
           : storage == IHA_STORAGE_F16  ? "accumulate_f16"
           : storage == IHA_STORAGE_BF16 ? "accumulate_bf16"
                                         : NULL;
}

iha_status iha__accumulate_kernel_get(iha_context *ctx, iha_storage storage)
{
    const char *name = kernel_name(storage);
    IHA_RETURN_ERROR_IF(name == NULL, ctx, IHA_ERROR_UNSUPPORTED, "accumulate: no accumulation into storage %d",
                        (int)storage);
    cl_kernel k;
    return iha__kernel_get(ctx, "accumulate.cl", "", name, &k);
}

iha_status iha__accumulate_enqueue(iha_context *ctx, iha_storage storage, iha_buffer src, iha_buffer dst, size_t n)
{
    const char *name = kernel_name(storage);
    IHA_RETURN_ERROR_IF(name == NULL, ctx, IHA_ERROR_UNSUPPORTED, "accumulate: no accumulation into storage %d",
                        (int)storage);
    return iha__elementwise_enqueue(ctx, "accumulate.cl", name, src, dst, n);
}
