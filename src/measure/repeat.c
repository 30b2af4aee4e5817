/* Repeated timing with clFinish and a monotonic clock, reduced to a median. */
#include "common/timing.h"
#include "measure/measure.h"
#include "runtime/error.h"

#include <stdlib.h>
#include <time.h>

iha_status iha__measure_begin(iha_context *ctx)
{
    if (ctx == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    iha__message_clear(&ctx->message);
    ctx->cl_error = 0;
    return IHA_OK;
}

iha_status iha__measure_calibrate(iha_context *ctx, iha_measure_run run, void *arg, int *iterations,
                                  double min_seconds)
{
    for (;;) {
        double seconds = 0;
        IHA_FORWARD_IF_ERROR(iha__measure_repeat(ctx, 1, run, arg, &seconds));
        if (seconds >= min_seconds || *iterations >= (1 << 24)) return IHA_OK;
        double grow = seconds > 0 ? 1.2 * min_seconds / seconds : 16;
        grow = grow > 16 ? 16 : grow < 2 ? 2 : grow;
        *iterations = (int)(*iterations * grow);
    }
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
        const double start = iha__now_seconds();
        st = run(ctx, arg);
        if (st == IHA_OK) err = clFinish(ctx->queue);
        samples[i] = iha__now_seconds() - start;
    }
    if (st == IHA_OK && err != CL_SUCCESS) st = iha__fail_cl(ctx, err, "clFinish");
    if (st == IHA_OK) *seconds = iha__median(samples, reps);
    free(samples);
    return st;
}
