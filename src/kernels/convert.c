/* Host side of cl/convert.cl: conversions between float and half or bfloat16, and the GEMV
 * reading 16-bit weights. */
#include "kernels/convert.h"
#include "runtime/error.h"
#include "runtime/launch.h"

#define ELEMENT_VEC 8 /* elements per work-item, CONVERT_VEC's and ACCUMULATE_VEC's default */
#define GEMV_ROWS 4   /* rows per work-item, as in the kernel */

iha_status iha__elementwise_enqueue(iha_context *ctx, const char *program, const char *name, iha_buffer src,
                                    iha_buffer dst, size_t n)
{
    if (n == 0) return IHA_OK;
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, program, "", name, &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, src.mem, src.offset);
    iha__arg_tensor(&a, dst.mem, dst.offset);
    iha__arg_ulong(&a, n);
    /* A fixed work-group size: PoCL compiles a kernel once per work-group size, and letting the
     * implementation choose would give a new size (and a compile) for many new lengths. */
    const size_t want = ctx->info.is_gpu ? 64 : 256;
    const size_t group = want < ctx->info.max_work_group_size ? want : ctx->info.max_work_group_size;
    const size_t global[1] = {(n + ELEMENT_VEC - 1) / ELEMENT_VEC}, local[1] = {group};
    return iha__launch(ctx, &a, 1, global, local, name);
}

iha_status iha__convert_enqueue(iha_context *ctx, int storage, int to_storage, iha_buffer src, iha_buffer dst,
                                size_t n)
{
    const int bf16 = storage == IHA_STORAGE_BF16;
    const char *name = to_storage ? (bf16 ? "convert_float_to_bf16" : "convert_float_to_half")
                                  : (bf16 ? "convert_bf16_to_float" : "convert_half_to_float");
    return iha__elementwise_enqueue(ctx, "convert.cl", name, src, dst, n);
}

iha_status iha__gemv_16bit_weights_enqueue(iha_context *ctx, int storage, size_t m, size_t C, size_t K, iha_buffer x,
                                           iha_buffer w, iha_buffer y)
{
    const char *name = storage == IHA_STORAGE_BF16 ? "gemv_bf16_weights" : "gemv_half_weights";
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "convert.cl", "", name, &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, x.mem, x.offset);
    iha__arg_int(&a, (cl_int)m);
    iha__arg_int(&a, (cl_int)K);
    iha__arg_tensor(&a, w.mem, w.offset);
    iha__arg_int(&a, (cl_int)C);
    iha__arg_tensor(&a, y.mem, y.offset);
    /* Columns across work-items; a CPU gets few, long work-items (a work-group of 8 column
     * pieces), a GPU 64 per group for coalescing. */
    const size_t cols = (C + 7) / 8, rows = (m + GEMV_ROWS - 1) / GEMV_ROWS;
    const size_t global[2] = {cols, rows}, local[2] = {ctx->info.is_gpu ? 64 : 8, 1};
    return iha__launch(ctx, &a, 2, global, local, name);
}
