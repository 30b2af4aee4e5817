/* Host side of cl/accumulate.cl: a float result added into an output of any storage. */
#include "kernels/accumulate.h"
#include "kernels/convert.h"
#include "runtime/error.h"
#include "runtime/launch.h"

#define ACCUMULATE_VEC 8 /* elements per work-item, the kernel's default */

iha_status iha__accumulate_enqueue(iha_context *ctx, iha_storage storage, iha_buffer src, iha_buffer dst, size_t n)
{
    const char *name = storage == IHA_STORAGE_F32   ? "accumulate_f32"
                       : storage == IHA_STORAGE_F16 ? "accumulate_f16"
                       : storage == IHA_STORAGE_BF16 ? "accumulate_bf16"
                                                     : NULL;
    IHA_RETURN_ERROR_IF(name == NULL, ctx, IHA_ERROR_UNSUPPORTED, "accumulate: no accumulation into storage %d",
                        (int)storage);
    if (n == 0) return IHA_OK;
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "accumulate.cl", "", name, &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, src.mem, src.offset);
    iha__arg_tensor(&a, dst.mem, dst.offset);
    iha__arg_ulong(&a, n);
    const size_t global[1] = {(n + ACCUMULATE_VEC - 1) / ACCUMULATE_VEC}, local[1] = {iha__convert_group_size(ctx)};
    return iha__launch(ctx, &a, 1, global, local, name);
}
