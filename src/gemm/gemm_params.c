/* CLBlast parameter overrides (see gemm_params.h for their process-wide scope). */
#include "gemm/gemm_params.h"
#include "runtime/error.h"

#include <clblast_c.h>

#include "gemm/clblast_lock.h"

iha_status iha__gemm_override(iha_context *ctx, const char *kernel, size_t count, const char *const *names,
                              const size_t *values)
{
    /* CLBlast's C API takes non-const name pointers but only reads them. */
    iha__clblast_lock();
    CLBlastStatusCode s = CLBlastOverrideParameters(ctx->device, kernel, CLBlastPrecisionSingle, count,
                                                    (const char **)names, values);
    iha__clblast_unlock();
    if (s == CLBlastSuccess) return IHA_OK;
    if (s > -1024) return iha__fail_cl(ctx, (cl_int)s, "CLBlastOverrideParameters");
    return iha__fail(ctx, IHA_ERROR_GEMM, "CLBlastOverrideParameters(%s) failed with CLBlast status %d", kernel, (int)s);
}
