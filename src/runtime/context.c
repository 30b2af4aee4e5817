/* Context creation and teardown: the only place that reads the environment. */
#include "runtime/context.h"
#include "runtime/loop_limit.h"
#include "tune/state.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/disk_cache.h"

void iha_context_options_init(iha_context_options *options)
{
    if (options) memset(options, 0, sizeof *options);
}

static char *dup_or_null(const char *s)
{
    if (s == NULL) return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static char *join_path(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *p = malloc(na + nb + 2);
    if (p == NULL) return NULL;
    memcpy(p, a, na);
    p[na] = '/';
    memcpy(p + na + 1, b, nb + 1);
    return p;
}

/* Explicit option, else IHA_CACHE_DIR, else $XDG_CACHE_HOME/iha, else ~/.cache/iha;
 * "off" in any case disables. Returns 0 only on allocation failure. */
static int choose_cache_dir(iha_context *ctx, const char *option)
{
    const char *dir = option ? option : getenv("IHA_CACHE_DIR");
    if (dir != NULL && dir[0] != '\0') {
        if (strcasecmp(dir, "off") == 0) return 1;
        return (ctx->cache_dir = dup_or_null(dir)) != NULL;
    }
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg != NULL && xdg[0] == '/') return (ctx->cache_dir = join_path(xdg, "iha")) != NULL;
    const char *home = getenv("HOME");
    if (home == NULL || home[0] == '\0') return 1; /* nowhere sensible: run without a disk cache */
    return (ctx->cache_dir = join_path(home, ".cache/iha")) != NULL;
}

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

static iha_status borrow(iha_context *ctx, const iha_context_options *o)
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

static iha_status own(iha_context *ctx, const iha_context_options *o)
{
    const char *spec = o->device ? o->device : getenv("IHA_DEVICE");
    IHA_FORWARD_IF_ERROR(iha__device_select(spec, &ctx->platform, &ctx->device, &ctx->info, &ctx->message));
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)ctx->platform, 0};
    cl_int err = CL_SUCCESS;
    ctx->cl_ctx = clCreateContext(props, 1, &ctx->device, NULL, NULL, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateContext");
    ctx->queue = clCreateCommandQueue(ctx->cl_ctx, ctx->device, 0, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateCommandQueue");
    return IHA_OK;
}

static iha_status setup(iha_context *ctx, const iha_context_options *o)
{
    int borrow_ctx = o->opencl_context != NULL, borrow_queue = o->opencl_queue != NULL;
    IHA_RETURN_ERROR_IF(borrow_ctx != borrow_queue, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "to borrow OpenCL objects give both opencl_context and opencl_queue");
    IHA_FORWARD_IF_ERROR(borrow_ctx ? borrow(ctx, o) : own(ctx, o));
    IHA_RETURN_ERROR_IF(iha__device_identity(ctx->platform, ctx->device, &ctx->identity) != IHA_OK, ctx,
                        IHA_ERROR_HOST_MEMORY, "out of host memory for the device's description");
    IHA_RETURN_ERROR_IF(!choose_cache_dir(ctx, o->cache_dir), ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    refuse_long_cache_dir(ctx);
    const char *kdir = o->kernel_dir ? o->kernel_dir : getenv("IHA_KERNEL_DIR");
    if (kdir != NULL && kdir[0] != '\0') {
        ctx->kernel_dir = dup_or_null(kdir);
        IHA_RETURN_ERROR_IF(ctx->kernel_dir == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    }
    ctx->time_stages = o->time_stages != 0;
    IHA_FORWARD_IF_ERROR(iha__loop_limit_detect(ctx));
    const char *profile = o->profile ? o->profile : getenv("IHA_PROFILE");
    return iha__tune_context_init(ctx, profile, o->tune_on_first_use, o->tune_budget_s);
}

iha_status iha_context_create(iha_context **out, const iha_context_options *options, char *message,
                              size_t message_size)
{
    if (message && message_size) message[0] = '\0';
    if (out == NULL) {
        if (message && message_size)
            snprintf(message, message_size, "out is NULL: iha_context_create needs a place for the new context");
        return IHA_ERROR_INVALID_ARGUMENT;
    }
    *out = NULL;
    iha_context_options defaults;
    iha_context_options_init(&defaults);
    const iha_context_options *o = options ? options : &defaults;

    iha_context *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        if (message && message_size) snprintf(message, message_size, "out of host memory");
        return IHA_ERROR_HOST_MEMORY;
    }
    iha_status st = setup(ctx, o);
    if (st != IHA_OK) {
        if (message && message_size) snprintf(message, message_size, "%s", iha__message_text(&ctx->message));
        iha_context_free(ctx);
        return st;
    }
    *out = ctx;
    return IHA_OK;
}

void iha_context_free(iha_context *ctx)
{
    if (ctx == NULL) return;
    if (ctx->queue) {
        iha__program_cache_flush(ctx);
        clFinish(ctx->queue);
    }
    if (ctx->detach_kv_caches) ctx->detach_kv_caches(ctx);
    if (ctx->release_gemm) ctx->release_gemm(ctx);
    iha__workspace_release(ctx);
    iha__tune_context_free(ctx);
    iha__program_cache_release(&ctx->programs);
    iha__loop_limit_release(ctx);
    if (ctx->queue) clReleaseCommandQueue(ctx->queue);
    if (ctx->cl_ctx) clReleaseContext(ctx->cl_ctx);
    iha__message_free(&ctx->message);
    iha__device_identity_free(&ctx->identity);
    free(ctx->cache_dir);
    free(ctx->kernel_dir);
    free(ctx);
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
    iha__program_cache_flush(ctx);
    return IHA_OK;
}

void iha_context_trim(iha_context *ctx)
{
    if (ctx == NULL) return;
    clFinish(ctx->queue);
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
