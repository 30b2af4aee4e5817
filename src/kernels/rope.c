/* The rotary cos/sin table, computed in double on the host: in float, the angle t*theta
 * loses about 1e-3 rad at t = 32768, far outside the 1e-5 contract. */
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>

iha_status iha__rope_table(iha_context *ctx, size_t T, size_t d, float base, cl_mem *out)
{
    /* Layout [T][2][d/2]: a row of cosines then a row of sines, so kernels load vectors. */
    const size_t half = d / 2, count = T * half * 2; /* the caller validated T*d */
    cl_mem table;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_ROPE, count * sizeof(float), &table));
    if (ctx->rope_key.positions == T && ctx->rope_key.head_dim == d && ctx->rope_key.base == base) {
        *out = table;
        return IHA_OK;
    }
    float *host = malloc(count * sizeof(float));
    IHA_RETURN_ERROR_IF(host == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the rotary table");
    for (size_t i = 0; i < half; ++i) {
        const double theta = pow((double)base, -2.0 * (double)i / (double)d);
        for (size_t t = 0; t < T; ++t) {
            const double angle = (double)t * theta;
            host[t * d + i] = (float)cos(angle);
            host[t * d + half + i] = (float)sin(angle);
        }
    }
    cl_int err = clEnqueueWriteBuffer(ctx->queue, table, CL_TRUE, 0, count * sizeof(float), host, 0, NULL, NULL);
    free(host);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clEnqueueWriteBuffer (rotary table)");
    ctx->rope_key.positions = T;
    ctx->rope_key.head_dim = d;
    ctx->rope_key.base = base;
    *out = table;
    return IHA_OK;
}
