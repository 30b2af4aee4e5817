/* Internal device buffers, one per role, grown on demand and kept for the next call. */
#define _DEFAULT_SOURCE /* MADV_HUGEPAGE */
#include "runtime/context.h"
#include "runtime/error.h"

#include "common/checked.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

/* On a CPU device a buffer is host memory, and a call's first write to fresh workspace takes one
 * page fault per 4 KiB, which a layer's tens of megabytes make a visible part of a first call.
 * Large buffers are therefore host memory of our own, 2 MiB-aligned and marked for
 * transparent huge pages, that the device uses in place (CL_MEM_USE_HOST_PTR; PoCL's CPU drivers
 * take the pointer as device memory, no copy). OpenCL frees it through a destructor callback,
 * since the in-order queue may still use a released buffer. */
#define HUGE_PAGE_BYTES ((size_t)2 << 20)

static void CL_CALLBACK free_host_block(cl_mem mem, void *block)
{
    (void)mem;
    free(block);
}

/* A CL_MEM_USE_HOST_PTR buffer on a huge-page block, or NULL on any failure: the caller then
 * lets OpenCL allocate, as on other devices. */
static cl_mem huge_page_buffer(iha_context *ctx, size_t bytes)
{
    if (bytes > SIZE_MAX - HUGE_PAGE_BYTES) return NULL;
    const size_t rounded = (bytes + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    void *block = NULL;
    if (posix_memalign(&block, HUGE_PAGE_BYTES, rounded) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(block, rounded, MADV_HUGEPAGE); /* advice only: 4 KiB pages still work */
#endif
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, bytes, block, &err);
    if (err != CL_SUCCESS) {
        free(block);
        return NULL;
    }
    if (clSetMemObjectDestructorCallback(m, free_host_block, block) != CL_SUCCESS) {
        clReleaseMemObject(m); /* nothing was enqueued on it yet, so OpenCL lets go of it now */
        free(block);
        return NULL;
    }
    return m;
}

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
        ++ctx->workspace_generation[slot];
    }
    cl_int err = CL_SUCCESS;
    cl_mem m = ctx->info.is_cpu && bytes >= HUGE_PAGE_BYTES ? huge_page_buffer(ctx, bytes) : NULL;
    if (m == NULL) m = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateBuffer (workspace)");
    ctx->workspace[slot] = m;
    ctx->workspace_bytes[slot] = bytes;
    *out = m;
    return IHA_OK;
}

iha_status iha__workspace_check_total(iha_context *ctx, size_t elems, size_t elem_bytes)
{
    size_t bytes = 0;
    const int fits = iha__mul(elems, elem_bytes, &bytes) && bytes <= ctx->info.global_mem_bytes;
    IHA_RETURN_ERROR_IF(!fits, ctx, IHA_ERROR_DEVICE_MEMORY,
                        "the call's internal buffers, %zu elements of %zu bytes together, exceed the device's "
                        "memory (%llu bytes)",
                        elems, elem_bytes, (unsigned long long)ctx->info.global_mem_bytes);
    return IHA_OK;
}

void iha__workspace_release(iha_context *ctx)
{
    for (int i = 0; i < IHA_WS_COUNT; ++i) {
        if (ctx->workspace[i]) clReleaseMemObject(ctx->workspace[i]);
        ctx->workspace[i] = NULL;
        ctx->workspace_bytes[i] = 0;
        ++ctx->workspace_generation[i];
    }
}

unsigned long iha__workspace_generation(const iha_context *ctx, iha_workspace_slot slot)
{
    return ctx->workspace_generation[slot];
}
