/* Devices whose driver ends kernel loops early, and the probe that turns such a cut into a
 * refusal (cl/loop_probe.clh says how the kernels carry it). */
#ifndef IHA_RUNTIME_LOOP_LIMIT_H
#define IHA_RUNTIME_LOOP_LIMIT_H
#include "runtime/context.h"
#include "runtime/launch.h"

/* At context creation, on a Mesa platform: runs cl/loop_probe.cl to learn whether the driver
 * stops loops after a fixed number of iterations; if it does, records the number in
 * ctx->loop_limit and allocates the probe's flag, and from then on every program is built with
 * -DIHA_LOOP_PROBE=1. Elsewhere does nothing. */
iha_status iha__loop_limit_detect(iha_context *ctx);
/* The build option the probe adds to every program ("" where there is no probe). */
const char *iha__loop_probe_option(const iha_context *ctx);
/* Appends the probe's two kernel arguments to `a` (no-op where there is no probe). */
void iha__loop_probe_args(const iha_context *ctx, iha_args *a);
/* Reads and clears the probe's flag: *raised is 1 when a kernel launched since the last read
 * had a loop cut short (for the tuner, which rejects such a candidate). */
iha_status iha__loop_probe_take(iha_context *ctx, int *raised);
/* The end of every public call that enqueued kernels, with the call's status: where there is a
 * probe, waits for the queue and turns a raised flag into IHA_ERROR_UNSUPPORTED (clearing it);
 * then writes launched programs to the disk cache. */
iha_status iha__call_end(iha_context *ctx, iha_status st);
void iha__loop_limit_release(iha_context *ctx);
#endif
