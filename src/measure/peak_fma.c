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
    int width, chains;
} fma_problem;

/* The kernel's shape. On a CPU one chain fills one vector register, so the width is the device's
 * preferred float vector width (16 under AVX-512, 8 under AVX2): a narrower vector leaves half
 * of each register idle and reads half the peak, a wider one spills AVX2's 16 registers. A GPU
 * runs a vector as scalar lanes and reports a preferred width of 1; float8 there gives each
 * work-item enough independent FMAs per loop iteration that the loop's own instructions do not
 * count, and its warps hide the latency. 12 chains suit both (cl/measure_peak_fma.cl). */
static void shape(const iha_context *ctx, int *width, int *chains)
{
    cl_uint preferred = 0;
    if (clGetDeviceInfo(ctx->device, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, sizeof preferred, &preferred, NULL) !=
        CL_SUCCESS)
        preferred = 0;
    int w = 8;
    if (!ctx->info.is_gpu && preferred >= 4)
        w = preferred >= 16 ? 16 : preferred >= 8 ? 8 : 4;
    *width = w;
    *chains = 12;
}

/* Work-items: enough groups for every compute unit many times over. A GPU needs many resident
 * warps per unit to issue every cycle; PoCL runs one group at a time per thread and hands out the
 * rest as threads free up, so 16 per core keep both cores busy to the end even when a neighbour
 * takes one of them for a while. */
static void geometry(const iha_context *ctx, size_t *global, size_t *local)
{
    const size_t cu = ctx->info.compute_units ? ctx->info.compute_units : 1;
    size_t wg = ctx->info.is_gpu ? 256 : 8;
    if (ctx->info.max_work_group_size && wg > ctx->info.max_work_group_size) wg = ctx->info.max_work_group_size;
    *local = wg;
    *global = cu * 16 * wg;
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
    return 2.0 * f->width * f->chains * (double)f->iterations * (double)f->global;
}

static iha_status measure(iha_context *ctx, fma_problem *f, double *gflops)
{
    char options[64];
    shape(ctx, &f->width, &f->chains);
    snprintf(options, sizeof options, "-DFMA_WIDTH=%d -DFMA_CHAINS=%d", f->width, f->chains);
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "measure_peak_fma.cl", options, "measure_peak_fma_f32", &f->kernel));
    geometry(ctx, &f->global, &f->local);
    IHA_FORWARD_IF_ERROR(iha__measure_buffer(ctx, f->global, &f->out));
    f->iterations = 256;
    IHA_FORWARD_IF_ERROR(iha__measure_calibrate(ctx, run_fma, f, &f->iterations, FMA_MIN_SECONDS));
    /* The fastest of the runs, not their median: a peak is what the device can do, and on a shared
     * machine a neighbour can only slow a run down. */
    double fastest = 0;
    for (int r = 0; r < FMA_RUNS; ++r) {
        double seconds = 0;
        IHA_FORWARD_IF_ERROR(iha__measure_repeat(ctx, 1, run_fma, f, &seconds));
        if (seconds > 0 && (fastest == 0 || seconds < fastest)) fastest = seconds;
    }
    *gflops = fastest > 0 ? 1e-9 * flops_of(f) / fastest : 0;
    return IHA_OK;
}

iha_status iha_measure_peak_fma(iha_context *ctx, double *gflops)
{
    IHA_FORWARD_IF_ERROR(iha__measure_begin(ctx));
    IHA_RETURN_ERROR_IF(gflops == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "gflops is NULL");
    fma_problem f = {NULL, NULL, 0, 0, 0, 0, 0};
    iha_status st = measure(ctx, &f, gflops);
    clFinish(ctx->queue);
    if (f.out) clReleaseMemObject(f.out);
    return iha__call_end(ctx, st);
}
