/* Internal device buffers, one per role, grown on demand and kept for the next call. */
#include "runtime/context.h"

iha_status iha__workspace_get(iha_context *ctx, iha_workspace_slot slot, size_t bytes, cl_mem *out)
{
    if (bytes == 0) bytes = 4;
    if (ctx->workspace[slot] != NULL && ctx->workspace_bytes[slot] >= bytes) {
        *out = ctx->workspace[slot];
        return IHA_OK;
    }
    IHA_RETURN_ERROR_IF(bytes > ctx->info.max_alloc_bytes, ctx, IHA_ERROR_DEVICE_MEMORY,
                        "an internal buffer of %zu bytes exceeds the device's largest allocation (%llu bytes)", bytes,
                        (unsigned long long)ctx->info.max_alloc_bytes);
    if (ctx->workspace[slot] != NULL) {
        /* The in-order queue may still use the old buffer; OpenCL keeps it alive until then. */
        clReleaseMemObject(ctx->workspace[slot]);
        ctx->workspace[slot] = NULL;
        ctx->workspace_bytes[slot] = 0;
        if (slot == IHA_WS_ROPE) ctx->rope_key.positions = 0;
    }
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateBuffer (workspace)");
    ctx->workspace[slot] = m;
    ctx->workspace_bytes[slot] = bytes;
    *out = m;
    return IHA_OK;
}

void iha__workspace_release(iha_context *ctx)
{
    for (int i = 0; i < IHA_WS_COUNT; ++i) {
        if (ctx->workspace[i]) clReleaseMemObject(ctx->workspace[i]);
        ctx->workspace[i] = NULL;
        ctx->workspace_bytes[i] = 0;
    }
    ctx->rope_key.positions = 0;
}
