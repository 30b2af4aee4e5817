/* iha_measure_gemm and iha_measure_gemm_kernel: the SGEMM rate of one shape on the context's
 * device, through CLBlast or through the library's kernel. */
#include "common/checked.h"
#include "gemm/gemm.h"
#include "gemm/sgemm.h"
#include "measure/measure.h"
#include "runtime/error.h"
#include "tune/choose.h"

typedef struct gemm_problem {
    size_t m, n, k;
    const iha_gemm_config *own; /* NULL: CLBlast */
    cl_mem a, b, c;
} gemm_problem;

static iha_status run_gemm(iha_context *ctx, void *arg)
{
    const gemm_problem *g = arg;
    if (g->own != NULL)
        return iha__gemm_kernel_enqueue(ctx, g->own, g->m, g->n, g->k, 1.0f, g->a, 0, g->k, g->b, 0, g->n, 0.0f, g->c, 0, g->n);
    return iha__sgemm_clblast(ctx, 0, g->m, g->n, g->k, 1.0f, g->a, 0, g->k, g->b, 0, g->n, g->c, 0, g->n);
}

/* Fills with a constant: uninitialised memory may hold denormals or NaNs, which some CPUs
 * process far more slowly than normal numbers. */
static iha_status fill(iha_context *ctx, cl_mem m, size_t elems, float value)
{
    IHA_CL_CHECK(ctx, clEnqueueFillBuffer(ctx->queue, m, &value, sizeof value, 0, elems * sizeof value, 0, NULL, NULL),
                 "clEnqueueFillBuffer");
    return IHA_OK;
}

static iha_status measure(iha_context *ctx, gemm_problem *g, size_t reps, double *seconds)
{
    size_t a_elems, b_elems, c_elems;
    IHA_RETURN_ERROR_IF(!iha__mul(g->m, g->k, &a_elems) || !iha__mul(g->k, g->n, &b_elems) ||
                            !iha__mul(g->m, g->n, &c_elems),
                        ctx, IHA_ERROR_SIZE_OVERFLOW, "GEMM %zu x %zu x %zu: a matrix size overflows size_t", g->m,
                        g->n, g->k);
    IHA_FORWARD_IF_ERROR(iha__measure_buffer(ctx, a_elems, &g->a));
    IHA_FORWARD_IF_ERROR(iha__measure_buffer(ctx, b_elems, &g->b));
    IHA_FORWARD_IF_ERROR(iha__measure_buffer(ctx, c_elems, &g->c));
    IHA_FORWARD_IF_ERROR(fill(ctx, g->a, a_elems, 0.25f));
    IHA_FORWARD_IF_ERROR(fill(ctx, g->b, b_elems, 0.5f));
    return iha__measure_repeat(ctx, reps, run_gemm, g, seconds);
}

static iha_status measure_backend(iha_context *ctx, int own, size_t m, size_t n, size_t k, size_t reps,
                                  double *seconds)
{
    IHA_FORWARD_IF_ERROR(iha__measure_begin(ctx));
    IHA_RETURN_ERROR_IF(seconds == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "seconds is NULL");
    IHA_RETURN_ERROR_IF(m == 0 || n == 0 || k == 0, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "every GEMM size must be at least 1 (m=%zu n=%zu k=%zu)", m, n, k);
    /* With the parameters the context's layer calls use: the profile's or the built-in. */
    iha_gemm_config tile;
    if (own)
        iha__tune_gemm_own_tile(ctx, &tile);
    else
        iha__tune_clblast_ready(ctx);
    gemm_problem g = {m, n, k, own ? &tile : NULL, NULL, NULL, NULL};
    iha_status st = measure(ctx, &g, reps, seconds);
    clFinish(ctx->queue); /* a failed run may have left work queued on the buffers */
    if (g.a) clReleaseMemObject(g.a);
    if (g.b) clReleaseMemObject(g.b);
    if (g.c) clReleaseMemObject(g.c);
    return st;
}

iha_status iha_measure_gemm(iha_context *ctx, size_t m, size_t n, size_t k, size_t reps, double *seconds)
{
    return measure_backend(ctx, 0, m, n, k, reps, seconds);
}

iha_status iha_measure_gemm_kernel(iha_context *ctx, size_t m, size_t n, size_t k, size_t reps, double *seconds)
{
    return measure_backend(ctx, 1, m, n, k, reps, seconds);
}
