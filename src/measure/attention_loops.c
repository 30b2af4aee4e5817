/* iha_measure_attention_loops: the register-tile attention kernel's score and P.V loops alone,
 * on blocks that stay in L1 (cl/measure_attention_loops.cl): the ceiling of the kernel's
 * design on the device, next to the device's own (iha_measure_peak_fma). */
#include "kernels/attention.h"
#include "layer/plan.h"
#include "measure/measure.h"
#include "runtime/error.h"
#include "runtime/launch.h"
#include "runtime/loop_limit.h"

#define LOOP_RUNS 5
#define LOOP_MIN_SECONDS 0.1

typedef struct loops_problem {
    cl_kernel kernel;
    cl_mem blocks, out;
    size_t items, local;
    int iterations, which;
    double flops_per_iteration; /* per work-item: 2 * rows * key block * d, in either loop */
} loops_problem;

static iha_status run_loops(iha_context *ctx, void *arg)
{
    const loops_problem *l = arg;
    iha_args a = iha__args_begin(l->kernel);
    iha__arg_mem(&a, l->blocks);
    iha__arg_mem(&a, l->out);
    iha__arg_int(&a, l->iterations);
    iha__arg_int(&a, l->which);
    return iha__launch(ctx, &a, 1, &l->items, &l->local, "attention_loops_f32");
}

/* A run calibrated to LOOP_MIN_SECONDS, then the median of LOOP_RUNS runs, as
 * iha_measure_peak_fma does. */
static iha_status time_loop(iha_context *ctx, loops_problem *l, double *gflops)
{
    double seconds = 0;
    l->iterations = 16;
    IHA_FORWARD_IF_ERROR(iha__measure_calibrate(ctx, run_loops, l, &l->iterations, LOOP_MIN_SECONDS));
    IHA_FORWARD_IF_ERROR(iha__measure_repeat(ctx, LOOP_RUNS, run_loops, l, &seconds));
    *gflops = seconds > 0 ? 1e-9 * l->flops_per_iteration * l->iterations * (double)l->items / seconds : 0;
    return IHA_OK;
}

static iha_status measure(iha_context *ctx, const iha_plan *p, loops_problem *l, double *score, double *pv)
{
    const iha_attention_config *cfg = &p->attention;
    IHA_RETURN_ERROR_IF(cfg->variant != IHA_ATTENTION_REGISTER_TILES, ctx, IHA_ERROR_UNSUPPORTED,
                        "the attention configuration for this shape is a local-memory variant "
                        "(cl/attention_local.cl or cl/attention_local_tiles.cl), which has no register-tile "
                        "loops to measure");
    IHA_FORWARD_IF_ERROR(iha__attention_kernel_get(ctx, cfg, p->dims.d, "measure_attention_loops.cl", "attention_loops_f32",
                                                   &l->kernel));
    /* Work-groups of the configuration's size, as attention_fwd_f32 runs them, and as many per
     * compute unit as the peak-FMA kernel runs (4 on a CPU, 16 on a GPU), so that every unit is
     * busy, a GPU's has warps to switch between, and the units even out. */
    const size_t cu = ctx->info.compute_units ? ctx->info.compute_units : 1;
    l->local = cfg->group ? cfg->group : 1;
    l->items = cu * (ctx->info.is_gpu ? 16 : 4) * l->local;
    const size_t block = 2 * p->dims.d * (size_t)cfg->key_block; /* a key block and its value rows */
    IHA_FORWARD_IF_ERROR(iha__measure_buffer(ctx, l->items * block, &l->blocks));
    const cl_float fill = 0.01f;
    IHA_CL_CHECK(ctx,
                 clEnqueueFillBuffer(ctx->queue, l->blocks, &fill, sizeof fill, 0, l->items * block * sizeof(float), 0,
                                     NULL, NULL),
                 "clEnqueueFillBuffer");
    IHA_FORWARD_IF_ERROR(iha__measure_buffer(ctx, l->items, &l->out));
    l->flops_per_iteration = 2.0 * cfg->rows * cfg->key_block * (double)p->dims.d;
    l->which = 0;
    IHA_FORWARD_IF_ERROR(time_loop(ctx, l, score));
    l->which = 1;
    return time_loop(ctx, l, pv);
}

iha_status iha_measure_attention_loops(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                       double *score_gflops, double *pv_gflops)
{
    IHA_FORWARD_IF_ERROR(iha__measure_begin(ctx));
    IHA_RETURN_ERROR_IF(score_gflops == NULL || pv_gflops == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "score_gflops and pv_gflops must not be NULL");
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 0, &p));
    IHA_RETURN_ERROR_IF(p.seq_lens != NULL, ctx, IHA_ERROR_UNSUPPORTED,
                        "iha_measure_attention_loops: packed sequences (seq_lens) are not supported");
    IHA_FORWARD_IF_ERROR(iha__plan_lookup(ctx, shape, options, &p));
    loops_problem l = {0};
    iha_status st = measure(ctx, &p, &l, score_gflops, pv_gflops);
    clFinish(ctx->queue);
    if (l.blocks) clReleaseMemObject(l.blocks);
    if (l.out) clReleaseMemObject(l.out);
    return iha__call_end(ctx, st);
}
