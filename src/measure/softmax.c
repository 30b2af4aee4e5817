/* Host side of cl/measure_softmax.cl: the unfused baseline's in-place masked row softmax. */
#include "measure/softmax.h"
#include "runtime/error.h"

#include <stdio.h>

#include "runtime/launch.h"

/* Work-items per row: a GPU reduces a row with a few warps; PoCL runs a group as a loop on one
 * thread, where 16 lanes keep the loops vectorisable without long reductions. */
static int group_size(const iha_context *ctx)
{
    int wg = ctx->info.is_gpu ? 256 : 16;
    while (ctx->info.max_work_group_size && (size_t)wg > ctx->info.max_work_group_size) wg /= 2;
    return wg;
}

iha_status iha__softmax_rows_enqueue(iha_context *ctx, cl_mem scores, size_t offset, size_t T, size_t P, int mask,
                                     size_t window)
{
    const int wg = group_size(ctx);
    char options[32];
    snprintf(options, sizeof options, "-DSOFTMAX_WG=%d", wg);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "measure_softmax.cl", options, "measure_softmax_rows_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_mem(&a, scores);
    iha__arg_ulong(&a, offset);
    iha__arg_int(&a, (cl_int)T);
    iha__arg_int(&a, (cl_int)P);
    iha__arg_int(&a, mask);
    iha__arg_int(&a, (cl_int)window);
    const size_t global[2] = {(size_t)wg, T}, local[2] = {(size_t)wg, 1};
    return iha__launch(ctx, &a, 2, global, local, "measure_softmax_rows_f32");
}
