/* Repeated timing with clFinish and a monotonic clock, reduced to a median. */
#include "measure/measure.h"

#include <stdlib.h>
#include <time.h>

iha_status iha__measure_begin(iha_context *ctx)
{
    if (ctx == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    iha__message_clear(&ctx->message);
    ctx->cl_error = 0;
    return IHA_OK;
}

double iha__measure_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Medians, not means: on a shared machine the odd descheduled run would dominate a mean. */
static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

iha_status iha__measure_repeat(iha_context *ctx, size_t reps, iha_measure_run run, void *arg, double *seconds)
{
    IHA_RETURN_ERROR_IF(reps == 0 || reps > 1000, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "reps must be from 1 to 1000, got %zu", reps);
    double *samples = malloc(reps * sizeof *samples);
    IHA_RETURN_ERROR_IF(samples == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    iha_status st = run(ctx, arg);
    cl_int err = st == IHA_OK ? clFinish(ctx->queue) : CL_SUCCESS;
    for (size_t i = 0; i < reps && st == IHA_OK && err == CL_SUCCESS; ++i) {
        const double start = iha__measure_now();
        st = run(ctx, arg);
        if (st == IHA_OK) err = clFinish(ctx->queue);
        samples[i] = iha__measure_now() - start;
    }
    if (st == IHA_OK && err != CL_SUCCESS) st = iha__fail_cl(ctx, err, "clFinish");
    if (st == IHA_OK) *seconds = median(samples, reps);
    free(samples);
    return st;
}
