/* SGEMM through CLBlast, with its status codes mapped onto iha's. */
#include "gemm/gemm.h"

#include <clblast_c.h>

iha_status iha__sgemm(iha_context *ctx, size_t m, size_t n, size_t k, cl_mem a, size_t a_off, size_t lda, cl_mem b,
                      size_t b_off, size_t ldb, cl_mem c, size_t c_off, size_t ldc)
{
    CLBlastStatusCode s = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, m, n, k, 1.0f, a,
                                       a_off, lda, b, b_off, ldb, 0.0f, c, c_off, ldc, &ctx->queue, NULL);
    if (s == CLBlastSuccess) return IHA_OK;
    /* CLBlast passes OpenCL's own codes through unchanged and uses -1024 and below for its own. */
    if (s > -1024) return iha__fail_cl(ctx, (cl_int)s, "CLBlastSgemm");
    return iha__fail(ctx, IHA_ERROR_GEMM, "CLBlastSgemm failed with CLBlast status %d (m=%zu n=%zu k=%zu)", (int)s, m,
                     n, k);
}
