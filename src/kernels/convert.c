/* Host side of cl/convert.cl: half/float conversion and the half-weight GEMV. */
#include "kernels/convert.h"
#include "runtime/error.h"
#include "runtime/launch.h"

#define CONVERT_VEC 8 /* elements per work-item, the kernel's default */
#define GEMV_ROWS 4   /* rows per work-item, as in the kernel */

/* A fixed work-group size: PoCL compiles a kernel once per work-group size, and letting the
 * implementation choose would give a new size (and a compile) for many new lengths. */
size_t iha__convert_group_size(const iha_context *ctx)
{
    const size_t want = ctx->info.is_gpu ? 64 : 256;
    return want < ctx->info.max_work_group_size ? want : ctx->info.max_work_group_size;
}

iha_status iha__convert_enqueue(iha_context *ctx, int to_half, iha_buffer src, iha_buffer dst, size_t n)
{
    if (n == 0) return IHA_OK;
    const char *name = to_half ? "convert_float_to_half" : "convert_half_to_float";
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "convert.cl", "", name, &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, src.mem, src.offset);
    iha__arg_tensor(&a, dst.mem, dst.offset);
    iha__arg_ulong(&a, n);
    const size_t global[1] = {(n + CONVERT_VEC - 1) / CONVERT_VEC}, local[1] = {iha__convert_group_size(ctx)};
    return iha__launch(ctx, &a, 1, global, local, name);
}

iha_status iha__gemv_half_weights_enqueue(iha_context *ctx, size_t m, size_t C, size_t K, iha_buffer x, iha_buffer w,
                                          iha_buffer y)
{
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "convert.cl", "", "gemv_half_weights", &k));
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
    return iha__launch(ctx, &a, 2, global, local, "gemv_half_weights");
}
