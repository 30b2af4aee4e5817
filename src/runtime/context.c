/* The runtime's part of a context: the device and queue, the directories, the loop probe; and
 * the public calls that read or finish what it holds. */
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/headroom.h"
#include "runtime/loop_limit.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/disk_cache.h"

/* A cache directory whose files' paths would pass PATH_MAX cannot hold the cache: it is
 * turned off here, with the reason kept for the profile to report, rather than failing later
 * where the reason is lost. */
static void refuse_long_cache_dir(iha_context *ctx)
{
    const size_t n = ctx->cache_dir ? strlen(ctx->cache_dir) : 0;
    if (n + 1 + IHA_DISK_CACHE_NAME_MAX < PATH_MAX) return;
    snprintf(ctx->cache_dir_refused, sizeof ctx->cache_dir_refused,
             "the cache directory's path is %zu bytes long: with the file names the cache writes in it, paths "
             "would reach PATH_MAX (%d bytes), so the program cache and the profile in it are off",
             n, PATH_MAX);
    free(ctx->cache_dir);
    ctx->cache_dir = NULL;
}

/* The cache directory's trust model, as ssh's for its keys: whoever can write the directory
 * can plant binaries that the driver runs in this process, so a directory that another user
 * owns, or that its group or others may write, is not used (the cache and the profile in it are
 * off, with the reason kept). Root's directories are trusted, as the system's are. A directory
 * that does not exist yet is made by the first write, for this user only (disk_cache.h). */
static void refuse_untrusted_cache_dir(iha_context *ctx)
{
    struct stat st;
    if (ctx->cache_dir == NULL || stat(ctx->cache_dir, &st) != 0 || !S_ISDIR(st.st_mode)) return;
    const uid_t me = geteuid();
    if (st.st_uid != me && st.st_uid != 0)
        snprintf(ctx->cache_dir_refused, sizeof ctx->cache_dir_refused,
                 "the cache directory %.64s belongs to user %ld, not to this user (%ld): the program cache and "
                 "the profile in it are off",
                 ctx->cache_dir, (long)st.st_uid, (long)me);
    else if (st.st_mode & (S_IWGRP | S_IWOTH))
        snprintf(ctx->cache_dir_refused, sizeof ctx->cache_dir_refused,
                 "the cache directory %.64s is writable by its group or others (mode %04o): the program cache "
                 "and the profile in it are off",
                 ctx->cache_dir, (unsigned)(st.st_mode & 07777));
    else
        return;
    free(ctx->cache_dir);
    ctx->cache_dir = NULL;
}

static iha_status borrow(iha_context *ctx, const iha_runtime_options *o)
{
    cl_command_queue_properties props = 0;
    cl_context queue_ctx = NULL;
    IHA_CL_CHECK(ctx, clGetCommandQueueInfo(o->opencl_queue, CL_QUEUE_CONTEXT, sizeof queue_ctx, &queue_ctx, NULL),
                 "clGetCommandQueueInfo(CL_QUEUE_CONTEXT)");
    IHA_RETURN_ERROR_IF(queue_ctx != o->opencl_context, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "the borrowed queue does not belong to the borrowed context");
    IHA_CL_CHECK(ctx, clGetCommandQueueInfo(o->opencl_queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL),
                 "clGetCommandQueueInfo(CL_QUEUE_PROPERTIES)");
    IHA_RETURN_ERROR_IF(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "the borrowed queue is out-of-order; iha needs an in-order queue");
    IHA_CL_CHECK(ctx, clGetCommandQueueInfo(o->opencl_queue, CL_QUEUE_DEVICE, sizeof ctx->device, &ctx->device, NULL),
                 "clGetCommandQueueInfo(CL_QUEUE_DEVICE)");
    IHA_CL_CHECK(ctx, clGetDeviceInfo(ctx->device, CL_DEVICE_PLATFORM, sizeof ctx->platform, &ctx->platform, NULL),
                 "clGetDeviceInfo(CL_DEVICE_PLATFORM)");
    IHA_CL_CHECK(ctx, clRetainContext(o->opencl_context), "clRetainContext");
    ctx->cl_ctx = o->opencl_context;
    IHA_CL_CHECK(ctx, clRetainCommandQueue(o->opencl_queue), "clRetainCommandQueue");
    ctx->queue = o->opencl_queue;
    if (iha__device_describe(ctx->platform, ctx->device, 0, 0, &ctx->info) != IHA_OK)
        return iha__fail(ctx, IHA_ERROR_OPENCL, "cannot query the borrowed queue's device");
    return IHA_OK;
}

static iha_status own(iha_context *ctx, const iha_runtime_options *o)
{
    IHA_FORWARD_IF_ERROR(iha__device_select(o->device, &ctx->platform, &ctx->device, &ctx->info, &ctx->message));
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)ctx->platform, 0};
    cl_int err = CL_SUCCESS;
    ctx->cl_ctx = clCreateContext(props, 1, &ctx->device, NULL, NULL, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateContext");
    ctx->queue = clCreateCommandQueue(ctx->cl_ctx, ctx->device, 0, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateCommandQueue");
    return IHA_OK;
}

/* Refuses, before the driver aborts the process, an address-space limit that leaves less than
 * `needed` (headroom.h); `what` names the work that needs it. */
static iha_status check_address_space(iha_context *ctx, unsigned long long needed, const char *what)
{
    unsigned long long limit = 0, left = 0;
    if (iha__address_space_room(needed, &limit, &left)) return IHA_OK;
    return iha__fail(ctx, IHA_ERROR_HOST_MEMORY,
                     "the address-space limit (ulimit -v %llu) leaves %llu MiB, and %s needs about %llu MiB: "
                     "raise the limit to at least %llu (KiB) or lift it",
                     limit >> 10, left >> 20, what, needed >> 20, (limit - left + needed) >> 10);
}

iha_status iha__runtime_setup(iha_context *ctx, const iha_runtime_options *o)
{
    int borrow_ctx = o->opencl_context != NULL, borrow_queue = o->opencl_queue != NULL;
    IHA_RETURN_ERROR_IF(borrow_ctx != borrow_queue, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "to borrow OpenCL objects give both opencl_context and opencl_queue");
    if (!borrow_ctx)
        IHA_FORWARD_IF_ERROR(check_address_space(ctx, IHA_ROOM_TO_LOAD_DRIVER, "loading the OpenCL driver and compiling kernels"));
    IHA_FORWARD_IF_ERROR(borrow_ctx ? borrow(ctx, o) : own(ctx, o));
    IHA_FORWARD_IF_ERROR(check_address_space(ctx, IHA_ROOM_TO_COMPILE, "compiling kernels"));
    cl_uint floats = 0;
    if (clGetDeviceInfo(ctx->device, CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT, sizeof floats, &floats, NULL) != CL_SUCCESS)
        floats = 0;
    ctx->vector_floats = floats > 0 ? floats : 1;
    ctx->cpu_prefetch = ctx->info.is_cpu && !ctx->info.is_gpu &&
                        strstr(ctx->info.platform_name, "Portable Computing Language") != NULL;
    IHA_RETURN_ERROR_IF(iha__device_identity(ctx->platform, ctx->device, &ctx->identity) != IHA_OK, ctx,
                        IHA_ERROR_HOST_MEMORY, "out of host memory for the device's description");
    ctx->cache_dir = o->cache_dir ? strdup(o->cache_dir) : NULL;
    IHA_RETURN_ERROR_IF(o->cache_dir != NULL && ctx->cache_dir == NULL, ctx, IHA_ERROR_HOST_MEMORY,
                        "out of host memory");
    refuse_long_cache_dir(ctx);
    refuse_untrusted_cache_dir(ctx);
    ctx->kernel_dir = o->kernel_dir ? strdup(o->kernel_dir) : NULL;
    IHA_RETURN_ERROR_IF(o->kernel_dir != NULL && ctx->kernel_dir == NULL, ctx, IHA_ERROR_HOST_MEMORY,
                        "out of host memory");
    ctx->time_stages = o->time_stages != 0;
    ctx->mma = o->mma_emulate ? IHA_MMA_EMULATED : iha__device_has_mma(ctx->device) ? IHA_MMA_HARDWARE : IHA_MMA_NONE;
    return iha__loop_limit_detect(ctx);
}

void iha__runtime_finish_pending(iha_context *ctx)
{
    if (ctx->queue == NULL) return;
    iha__program_cache_flush(ctx);
    clFinish(ctx->queue);
}

void iha__runtime_release(iha_context *ctx)
{
    iha__workspace_release(ctx);
    iha__program_cache_release(&ctx->programs);
    iha__loop_limit_release(ctx);
    if (ctx->queue) clReleaseCommandQueue(ctx->queue);
    if (ctx->cl_ctx) clReleaseContext(ctx->cl_ctx);
    iha__message_free(&ctx->message);
    iha__device_identity_free(&ctx->identity);
    free(ctx->cache_dir);
    free(ctx->kernel_dir);
}

const char *iha_context_message(const iha_context *ctx) { return ctx ? iha__message_text(&ctx->message) : ""; }
cl_int iha_context_cl_error(const iha_context *ctx) { return ctx ? ctx->cl_error : 0; }
cl_context iha_context_cl_context(const iha_context *ctx) { return ctx ? ctx->cl_ctx : NULL; }
cl_command_queue iha_context_cl_queue(const iha_context *ctx) { return ctx ? ctx->queue : NULL; }
cl_device_id iha_context_cl_device(const iha_context *ctx) { return ctx ? ctx->device : NULL; }
const char *iha_context_device_name(const iha_context *ctx) { return ctx ? ctx->info.device_name : ""; }

iha_status iha_context_finish(iha_context *ctx)
{
    if (ctx == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    iha__message_clear(&ctx->message);
    IHA_CL_CHECK(ctx, clFinish(ctx->queue), "clFinish");
    iha__program_cache_end_loads(ctx);
    return IHA_OK;
}

void iha_context_trim(iha_context *ctx)
{
    if (ctx == NULL) return;
    clFinish(ctx->queue);
    iha__program_cache_flush(ctx);
    iha__workspace_release(ctx);
}

void iha_context_stage_times(const iha_context *ctx, iha_stage_times *out)
{
    if (out == NULL) return;
    if (ctx == NULL) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = ctx->stage_times;
}
