/* The rotary cos/sin table, computed in double on the host: in float, the angle t*theta
 * loses about 1e-3 rad at t = 32768, far outside the 1e-5 contract. */
#include "kernels/rope.h"
#include "runtime/error.h"

#include <math.h>
#include <stdlib.h>

/* The angles' frequencies theta_i = base^(-2i/d), i < d/2 (malloc'ed; NULL when out of memory). */
static double *rope_thetas(size_t d, float base)
{
    double *theta = malloc((d / 2 + 1) * sizeof *theta);
    for (size_t i = 0; theta && i < d / 2; ++i) theta[i] = pow((double)base, -2.0 * (double)i / (double)d);
    return theta;
}

/* One row of the table, [2][d/2]: the cosines, then the sines, at position t. */
static void rope_row(size_t t, size_t half, const double *theta, float *row)
{
    for (size_t i = 0; i < half; ++i) {
        const double angle = (double)t * theta[i];
        row[i] = (float)cos(angle);
        row[half + i] = (float)sin(angle);
    }
}

iha_status iha__rope_table(iha_context *ctx, size_t first, size_t T, size_t d, float base, cl_mem *out)
{
    /* Layout [T][2][d/2]: a row of cosines then a row of sines, so kernels load vectors. */
    const size_t half = d / 2, count = T * half * 2; /* the caller validated T*d */
    cl_mem table;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_ROPE, count * sizeof(float), &table));
    iha_rope_cache *held = ctx->rope;
    if (held->generation == iha__workspace_generation(ctx, IHA_WS_ROPE) && held->first == first &&
        held->positions == T && held->head_dim == d && held->base == base) {
        *out = table;
        return IHA_OK;
    }
    float *host = malloc(count * sizeof(float));
    double *theta = rope_thetas(d, base);
    if (host == NULL || theta == NULL) {
        free(host);
        free(theta);
        return iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the rotary table");
    }
    for (size_t t = 0; t < T; ++t) rope_row(first + t, half, theta, host + t * d);
    free(theta);
    cl_int err = clEnqueueWriteBuffer(ctx->queue, table, CL_TRUE, 0, count * sizeof(float), host, 0, NULL, NULL);
    free(host);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clEnqueueWriteBuffer (rotary table)");
    held->first = first;
    held->positions = T;
    held->head_dim = d;
    held->base = base;
    held->generation = iha__workspace_generation(ctx, IHA_WS_ROPE);
    *out = table;
    return IHA_OK;
}

iha_status iha__rope_rows(iha_context *ctx, const cl_int *step, size_t B, size_t k, size_t P, size_t d, float base,
                          cl_mem dst)
{
    const size_t rows = B * k * P; /* the caller validated the step's workspace */
    float *host = calloc(rows * d, sizeof(float));
    double *theta = rope_thetas(d, base);
    if (host == NULL || theta == NULL) {
        free(host);
        free(theta);
        return iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the rotary rows");
    }
    for (size_t b = 0; b < B; ++b)
        for (size_t r = 0; r < (size_t)step[2 * b + 1] * P; ++r)
            rope_row((size_t)step[2 * b] * P + r, d / 2, theta, host + (b * k * P + r) * d);
    free(theta);
    cl_int err = clEnqueueWriteBuffer(ctx->queue, dst, CL_TRUE, 0, rows * d * sizeof(float), host, 0, NULL, NULL);
    free(host);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clEnqueueWriteBuffer (rotary rows)");
    return IHA_OK;
}

iha_status iha__rope_write(iha_context *ctx, size_t first, size_t T, size_t d, float base, cl_mem dst)
{
    float *host = malloc(T * d * sizeof(float)); /* the caller sized dst for these rows */
    double *theta = rope_thetas(d, base);
    if (host == NULL || theta == NULL) {
        free(host);
        free(theta);
        return iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the rotary rows");
    }
    for (size_t t = 0; t < T; ++t) rope_row(first + t, d / 2, theta, host + t * d);
    free(theta);
    cl_int err = clEnqueueWriteBuffer(ctx->queue, dst, CL_TRUE, 0, T * d * sizeof(float), host, 0, NULL, NULL);
    free(host);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clEnqueueWriteBuffer (rotary rows)");
    return IHA_OK;
}

iha_status iha__rope_cache_init(iha_context *ctx)
{
    ctx->rope = calloc(1, sizeof *ctx->rope); /* positions 0: nothing held */
    IHA_RETURN_ERROR_IF(ctx->rope == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    return IHA_OK;
}

void iha__rope_cache_free(iha_context *ctx)
{
    free(ctx->rope);
    ctx->rope = NULL;
}
