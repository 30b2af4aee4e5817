/* Kernel launch: argument errors, rounding of the global size, and enqueue errors. */
#include "runtime/launch.h"
#include "runtime/error.h"

#include <stdio.h>

#include "common/checked.h"
#include "runtime/loop_limit.h"

iha_status iha__launch(iha_context *ctx, const iha_args *a, cl_uint dims, const size_t *global, const size_t *local,
                       const char *what)
{
    char call[160];
    iha_args with_probe = *a;
    iha__loop_probe_args(ctx, &with_probe);
    a = &with_probe;
    if (a->err != CL_SUCCESS) {
        snprintf(call, sizeof call, "clSetKernelArg(%s, argument %u)", what, a->index - 1);
        return iha__fail_cl(ctx, a->err, call);
    }
    size_t rounded[3];
    for (cl_uint i = 0; i < dims; ++i) {
        rounded[i] = local ? iha__round_up(global[i], local[i]) : global[i];
        if (rounded[i] == 0) return IHA_OK; /* an empty range: nothing to do */
    }
    cl_int err = clEnqueueNDRangeKernel(ctx->queue, a->kernel, dims, NULL, rounded, local, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        snprintf(call, sizeof call, "clEnqueueNDRangeKernel(%s)", what);
        return iha__fail_cl(ctx, err, call);
    }
    return IHA_OK;
}
