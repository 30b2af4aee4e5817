/* iha_measure_copy_bandwidth: device-to-device copy rate with cl/measure_copy.cl. */
#include <stdio.h>

#include "measure/measure.h"
#include "runtime/error.h"
#include "runtime/launch.h"
#include "runtime/loop_limit.h"

#define COPY_RUNS 5

typedef struct copy_problem {
    cl_kernel kernel;
    cl_mem src, dst;
    size_t vectors, local;
    int width; /* floats per work-item: COPY_VEC */
} copy_problem;

static iha_status run_copy(iha_context *ctx, void *arg)
{
    const copy_problem *c = arg;
    iha_args a = iha__args_begin(c->kernel);
    iha__arg_mem(&a, c->src);
    iha__arg_mem(&a, c->dst);
    iha__arg_ulong(&a, c->vectors);
    return iha__launch(ctx, &a, 1, &c->vectors, &c->local, "measure_copy_f32");
}

/* A GPU coalesces 16-byte accesses of neighbouring work-items, in groups of a few warps. PoCL
 * runs a group as a loop on one thread: a cache line (float16) per work-item and groups of 256
 * copy faster there than float4 in groups of any size, and as fast as memcpy. */
static void geometry(const iha_context *ctx, copy_problem *c)
{
    c->width = ctx->info.is_gpu ? 4 : 16;
    size_t wg = 256;
    if (ctx->info.max_work_group_size && wg > ctx->info.max_work_group_size) wg = ctx->info.max_work_group_size;
    c->local = wg;
}

static iha_status measure(iha_context *ctx, copy_problem *c, double *bytes_per_second)
{
    char options[32];
    snprintf(options, sizeof options, "-DCOPY_VEC=%d", c->width);
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "measure_copy.cl", options, "measure_copy_f32", &c->kernel));
    const size_t elems = c->vectors * (size_t)c->width;
    IHA_FORWARD_IF_ERROR(iha__measure_buffer(ctx, elems, &c->src));
    IHA_FORWARD_IF_ERROR(iha__measure_buffer(ctx, elems, &c->dst));
    const float one = 1.0f;
    IHA_CL_CHECK(ctx, clEnqueueFillBuffer(ctx->queue, c->src, &one, sizeof one, 0, elems * sizeof one, 0, NULL, NULL),
                 "clEnqueueFillBuffer");
    double seconds = 0;
    IHA_FORWARD_IF_ERROR(iha__measure_repeat(ctx, COPY_RUNS, run_copy, c, &seconds));
    *bytes_per_second = seconds > 0 ? 2.0 * (double)(elems * sizeof(float)) / seconds : 0;
    return IHA_OK;
}

iha_status iha_measure_copy_bandwidth(iha_context *ctx, size_t bytes, double *bytes_per_second)
{
    IHA_FORWARD_IF_ERROR(iha__measure_begin(ctx));
    IHA_RETURN_ERROR_IF(bytes_per_second == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "bytes_per_second is NULL");
    copy_problem c = {NULL, NULL, NULL, 0, 0, 0};
    geometry(ctx, &c);
    const size_t vector_bytes = (size_t)c.width * sizeof(float);
    IHA_RETURN_ERROR_IF(bytes < vector_bytes, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "bytes must be at least %zu on this device, got %zu", vector_bytes, bytes);
    c.vectors = bytes / vector_bytes;
    iha_status st = measure(ctx, &c, bytes_per_second);
    clFinish(ctx->queue);
    if (c.src) clReleaseMemObject(c.src);
    if (c.dst) clReleaseMemObject(c.dst);
    return iha__call_end(ctx, st);
}
