/* iha_measure_peak_fma: the device's float32 FMA rate with cl/measure_peak_fma.cl. */
#include <stdio.h>

#include "measure/measure.h"
#include "runtime/loop_limit.h"
#include "runtime/launch.h"

#define FMA_RUNS 5
#define FMA_MIN_SECONDS 0.1

typedef struct fma_problem {
    cl_kernel kernel;
    cl_mem out;
    size_t global, local;
    int iterations;
} fma_problem;

/* The kernel's shape: float8 x 12 chains suits AVX2 (16 ymm registers); a GPU has a larger
 * register file and hides latency across warps as well, so the same works there. Measured on
 * the 2-core AVX2 EPYC with PoCL 3.1, in one slow phase of that shared machine: float8 x 12,
 * float8 x 8, float16 x 6 and float16 x 4 all reach 86-91 GFLOP/s (a hand-written AVX2 loop on
 * two threads: 81-86); float4 x 16 only 28. In its fast phases float8 x 12 reads 177-192. */
enum { FMA_WIDTH = 8, FMA_CHAINS = 12 };

/* Work-items: enough groups for every compute unit several times over (a GPU needs many
 * resident warps per unit to issue every cycle; PoCL runs one group per thread, and 4 per core
 * even out the cores). */
static void geometry(const iha_context *ctx, size_t *global, size_t *local)
{
    const size_t cu = ctx->info.compute_units ? ctx->info.compute_units : 1;
    size_t wg = ctx->info.is_gpu ? 256 : 8;
    if (ctx->info.max_work_group_size && wg > ctx->info.max_work_group_size) wg = ctx->info.max_work_group_size;
    *local = wg;
    *global = cu * (ctx->info.is_gpu ? 16 : 4) * wg;
}

static iha_status run_fma(iha_context *ctx, void *arg)
{
    const fma_problem *f = arg;
    iha_args a = iha__args_begin(f->kernel);
    iha__arg_mem(&a, f->out);
    iha__arg_int(&a, f->iterations);
    iha__arg_float(&a, 0.999f);
    iha__arg_float(&a, 0.001f);
    return iha__launch(ctx, &a, 1, &f->global, &f->local, "measure_peak_fma_f32");
}

static double flops_of(const fma_problem *f)
{
    return 2.0 * FMA_WIDTH * FMA_CHAINS * (double)f->iterations * (double)f->global;
}

static iha_status measure(iha_context *ctx, fma_problem *f, double *gflops)
{
    char options[64];
    snprintf(options, sizeof options, "-DFMA_WIDTH=%d -DFMA_CHAINS=%d", FMA_WIDTH, FMA_CHAINS);
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "measure_peak_fma.cl", options, "measure_peak_fma_f32", &f->kernel));
    geometry(ctx, &f->global, &f->local);
    IHA_FORWARD_IF_ERROR(iha__measure_buffer(ctx, f->global, &f->out));
    f->iterations = 256;
    IHA_FORWARD_IF_ERROR(iha__measure_calibrate(ctx, run_fma, f, &f->iterations, FMA_MIN_SECONDS));
    double seconds = 0;
    IHA_FORWARD_IF_ERROR(iha__measure_repeat(ctx, FMA_RUNS, run_fma, f, &seconds));
    *gflops = seconds > 0 ? 1e-9 * flops_of(f) / seconds : 0;
    return IHA_OK;
}

iha_status iha_measure_peak_fma(iha_context *ctx, double *gflops)
{
    IHA_FORWARD_IF_ERROR(iha__measure_begin(ctx));
    IHA_RETURN_ERROR_IF(gflops == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "gflops is NULL");
    fma_problem f = {NULL, NULL, 0, 0, 0};
    iha_status st = measure(ctx, &f, gflops);
    clFinish(ctx->queue);
    if (f.out) clReleaseMemObject(f.out);
    return iha__call_end(ctx, st);
}
