/* Scratch device buffers for the measurements, checked against the device's limits first. */
#include "measure/measure.h"
#include "runtime/error.h"

#include "common/checked.h"

iha_status iha__measure_buffer(iha_context *ctx, size_t elems, cl_mem *out)
{
    size_t bytes;
    IHA_RETURN_ERROR_IF(!iha__mul(elems, sizeof(float), &bytes), ctx, IHA_ERROR_SIZE_OVERFLOW,
                        "a scratch buffer of %zu floats overflows size_t", elems);
    IHA_RETURN_ERROR_IF(bytes > ctx->info.max_alloc_bytes, ctx, IHA_ERROR_DEVICE_MEMORY,
                        "a scratch buffer of %zu bytes exceeds the device's largest allocation (%llu bytes)", bytes,
                        (unsigned long long)ctx->info.max_alloc_bytes);
    cl_int err = CL_SUCCESS;
    *out = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, bytes ? bytes : 4, NULL, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateBuffer (measurement scratch)");
    return IHA_OK;
}
