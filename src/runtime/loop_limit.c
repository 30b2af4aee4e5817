/* Drivers that end kernel loops early. Mesa's gallivm (llvmpipe, under rusticl or Clover)
 * guards graphics shaders against endless loops with one counter per kernel invocation, shared
 * by all its loops: after a fixed number of iterations in all (65535 in Mesa 22.3) every loop
 * exits, and the kernel finishes with partial sums and no error. OpenCL promises no such limit,
 * and no kernel of a size-independent design can stay under it on long sequences. On such a
 * device every kernel carries a probe (cl/loop_probe.clh) and every public call that launched
 * kernels reads it at its end, so a cut loop becomes IHA_ERROR_UNSUPPORTED, never a result. */
#include "runtime/loop_limit.h"
#include "runtime/error.h"

#include <string.h>

/* More iterations than any known limiter allows, few enough to take microseconds. */
#define PROBE_ITERATIONS (1 << 17)

static int mesa_platform(const iha_device_info *info)
{
    return strstr(info->platform_name, "rusticl") != NULL || strstr(info->platform_name, "Clover") != NULL ||
           strstr(info->device_vendor, "Mesa") != NULL;
}

iha_status iha__loop_limit_detect(iha_context *ctx)
{
    if (!mesa_platform(&ctx->info)) return IHA_OK;
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "loop_probe.cl", "", "loop_probe_count", &k));
    cl_int err;
    cl_mem out = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, sizeof(cl_int), NULL, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateBuffer(loop probe)");
    iha_args a = iha__args_begin(k);
    iha__arg_mem(&a, out);
    iha__arg_int(&a, PROBE_ITERATIONS);
    const size_t one = 1;
    cl_int ran = 0;
    iha_status st = iha__launch(ctx, &a, 1, &one, &one, "loop_probe_count");
    if (st == IHA_OK) {
        err = clEnqueueReadBuffer(ctx->queue, out, CL_TRUE, 0, sizeof ran, &ran, 0, NULL, NULL);
        if (err != CL_SUCCESS) st = iha__fail_cl(ctx, err, "clEnqueueReadBuffer(loop probe)");
    }
    if (st == IHA_OK && ran < PROBE_ITERATIONS) {
        const cl_int zero = 0;
        ctx->loop_limit = ran;
        ctx->loop_flag = out;
        err = clEnqueueWriteBuffer(ctx->queue, out, CL_TRUE, 0, sizeof zero, &zero, 0, NULL, NULL);
        return err == CL_SUCCESS ? IHA_OK : iha__fail_cl(ctx, err, "clEnqueueWriteBuffer(loop probe)");
    }
    clReleaseMemObject(out);
    return st;
}

const char *iha__loop_probe_option(const iha_context *ctx) { return ctx->loop_flag ? "-DIHA_LOOP_PROBE=1" : ""; }

void iha__loop_probe_args(const iha_context *ctx, iha_args *a)
{
    if (ctx->loop_flag == NULL) return;
    iha__arg_mem(a, ctx->loop_flag);
    iha__arg_int(a, 2); /* iha_probe_trips */
}

iha_status iha__loop_probe_take(iha_context *ctx, int *raised)
{
    *raised = 0;
    if (ctx->loop_flag == NULL) return IHA_OK;
    cl_int flag = 0;
    IHA_CL_CHECK(ctx, clEnqueueReadBuffer(ctx->queue, ctx->loop_flag, CL_TRUE, 0, sizeof flag, &flag, 0, NULL, NULL),
                 "clEnqueueReadBuffer(loop probe)");
    if (!flag) return IHA_OK;
    *raised = 1;
    const cl_int zero = 0;
    IHA_CL_CHECK(ctx, clEnqueueWriteBuffer(ctx->queue, ctx->loop_flag, CL_TRUE, 0, sizeof zero, &zero, 0, NULL, NULL),
                 "clEnqueueWriteBuffer(loop probe)");
    return IHA_OK;
}

static iha_status probe_verdict(iha_context *ctx)
{
    int raised;
    IHA_FORWARD_IF_ERROR(iha__loop_probe_take(ctx, &raised));
    if (!raised) return IHA_OK;
    return iha__fail(ctx, IHA_ERROR_UNSUPPORTED,
                     "the OpenCL driver of %s (%s, driver %s) ends a kernel's loops after %ld iterations in all, "
                     "and a kernel of this call needed more, so its outputs are wrong: use a shorter sequence "
                     "(fewer virtual tokens N*P) or a narrower head, or another device",
                     ctx->info.device_name, ctx->info.platform_name, ctx->info.driver_version, ctx->loop_limit);
}

iha_status iha__call_end(iha_context *ctx, iha_status st)
{
    if (ctx == NULL) return st;
    if (ctx->loop_flag != NULL) {
        if (st == IHA_OK) {
            st = probe_verdict(ctx);
        } else {
            /* A failed call reports its own error; a flag its kernels raised must not reach
             * the next call. */
            int raised;
            (void)iha__loop_probe_take(ctx, &raised);
        }
    }
    if (st == IHA_OK) iha__program_cache_end_loads(ctx);
    return st;
}

void iha__loop_limit_release(iha_context *ctx)
{
    if (ctx->loop_flag) clReleaseMemObject(ctx->loop_flag);
    ctx->loop_flag = NULL;
}
