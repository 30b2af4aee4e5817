/* What the measurement calls of iha.h share: starting a call, a monotonic clock, repeated
 * timing with a median, and scratch buffers that are checked against the device's limits. */
#ifndef IHA_MEASURE_MEASURE_H
#define IHA_MEASURE_MEASURE_H
#include "iha_measure.h"
#include "runtime/context.h"
#include "runtime/error.h" /* every measurement reports through it */

/* The unfused baseline's score matrix of one (b, h), [T][T]. */
enum { IHA_WS_SCORES = IHA_WS_MEASURE_BASE, IHA_WS_MEASURE_END };
_Static_assert((int)IHA_WS_MEASURE_END <= (int)IHA_WS_MULTI_BASE, "the measurements' slots overlap the next module's");

/* Validates ctx and clears its last message, as every public call does first. */
iha_status iha__measure_begin(iha_context *ctx);

/* One run of the thing being measured: enqueues work on ctx's queue. */
typedef iha_status (*iha_measure_run)(iha_context *ctx, void *arg);

/* Runs `run` once untimed (kernel builds, page faults), then `reps` times, each timed from just
 * after a clFinish to just after the next clFinish; stores the median in *seconds. */
iha_status iha__measure_repeat(iha_context *ctx, size_t reps, iha_measure_run run, void *arg, double *seconds);

/* Grows *iterations, which `run` reads, from its value on entry until one run takes at least
 * min_seconds (or *iterations reaches 2^24), so that launch overhead and clock resolution do not
 * count: each step multiplies it by 2 to 16, aiming 20% past min_seconds. */
iha_status iha__measure_calibrate(iha_context *ctx, iha_measure_run run, void *arg, int *iterations,
                                  double min_seconds);

/* A new device buffer of `bytes` (elems floats), refused with IHA_ERROR_SIZE_OVERFLOW or
 * IHA_ERROR_DEVICE_MEMORY before OpenCL is asked when it cannot fit in one allocation. */
iha_status iha__measure_buffer(iha_context *ctx, size_t elems, cl_mem *out);
#endif
