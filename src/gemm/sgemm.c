/* SGEMM through the context's backend: cl/gemm.cl (gemm/gemm.h) or CLBlast, with
 * CLBlast's status codes mapped onto iha's. */
#include "gemm/sgemm.h"
#include "runtime/error.h"

#include <clblast_c.h>

#include "gemm/clblast_lock.h"
#include "gemm/gemm.h"

static iha_status clblast_failure(iha_context *ctx, CLBlastStatusCode s, const char *call, size_t m, size_t n,
                                  size_t k)
{
    /* CLBlast passes OpenCL's own codes through unchanged and uses -1024 and below for its own. */
    if (s > -1024) return iha__fail_cl(ctx, (cl_int)s, call);
    return iha__fail(ctx, IHA_ERROR_GEMM, "%s failed with CLBlast status %d (m=%zu n=%zu k=%zu)", call, (int)s, m, n,
                     k);
}

/* A few rows (a decoding step's tokens) as matrix-vector products: CLBlast's GEMM kernels pad
 * such shapes to whole tiles, which on PoCL costs far more than GEMV for one row. */
#define IHA_GEMV_MAX_ROWS 4

static iha_status clblast_gemm(iha_context *ctx, int transpose_b, size_t m, size_t n, size_t k, float alpha, cl_mem a,
                               size_t a_off, size_t lda, cl_mem b, size_t b_off, size_t ldb, float beta, cl_mem c,
                               size_t c_off, size_t ldc)
{
    /* CLBlast's kernels carry no loop probe (runtime/loop_limit.h): where a driver may cut
     * loops short, a CLBlast result could be silently wrong. Layer calls use cl/gemm.cl there. */
    IHA_RETURN_ERROR_IF(ctx->loop_flag != NULL, ctx, IHA_ERROR_UNSUPPORTED,
                        "CLBlast is not used on %s: its driver ends kernel loops early (see iha_context_create)",
                        ctx->info.device_name);
    const CLBlastTranspose tb = transpose_b ? CLBlastTransposeYes : CLBlastTransposeNo;
    iha__clblast_enter(ctx);
    CLBlastStatusCode s = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, tb, m, n, k, alpha, a, a_off, lda,
                                       b, b_off, ldb, beta, c, c_off, ldc, &ctx->queue, NULL);
    iha__clblast_unlock();
    return s == CLBlastSuccess ? IHA_OK : clblast_failure(ctx, s, "CLBlastSgemm", m, n, k);
}

iha_status iha__sgemm_clblast(iha_context *ctx, int transpose_b, size_t m, size_t n, size_t k, float alpha, cl_mem a,
                              size_t a_off, size_t lda, cl_mem b, size_t b_off, size_t ldb, cl_mem c, size_t c_off,
                              size_t ldc)
{
    /* CLBlast's GEMV reads y even with beta = 0 (BLAS does not), which a write-only output
     * buffer forbids: such an output takes the GEMM. */
    cl_mem_flags flags = 0;
    const int readable = clGetMemObjectInfo(c, CL_MEM_FLAGS, sizeof flags, &flags, NULL) == CL_SUCCESS &&
                         !(flags & CL_MEM_WRITE_ONLY);
    if (m <= IHA_GEMV_MAX_ROWS && !transpose_b && readable) {
        /* NaN in an output buffer would survive GEMV's read of y: clear the rows first. */
        const cl_float zero = 0.0f;
        for (size_t i = 0; i < m; ++i) {
            cl_int err = clEnqueueFillBuffer(ctx->queue, c, &zero, sizeof zero, (c_off + i * ldc) * sizeof(float),
                                             n * sizeof(float), 0, NULL, NULL);
            if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clEnqueueFillBuffer (GEMV output)");
        }
        for (size_t i = 0; i < m; ++i) {
            /* Row i of C is B^T (row i of A), with B row-major [k][n]. */
            iha__clblast_enter(ctx);
            CLBlastStatusCode s = CLBlastSgemv(CLBlastLayoutRowMajor, CLBlastTransposeYes, k, n, alpha, b, b_off, ldb,
                                               a, a_off + i * lda, 1, 0.0f, c, c_off + i * ldc, 1, &ctx->queue, NULL);
            iha__clblast_unlock();
            if (s != CLBlastSuccess) return clblast_failure(ctx, s, "CLBlastSgemv", m, n, k);
        }
        return IHA_OK;
    }
    return clblast_gemm(ctx, transpose_b, m, n, k, alpha, a, a_off, lda, b, b_off, ldb, 0.0f, c, c_off, ldc);
}

iha_status iha__sgemm_ex(iha_context *ctx, int transpose_b, size_t m, size_t n, size_t k, float alpha, cl_mem a,
                         size_t a_off, size_t lda, cl_mem b, size_t b_off, size_t ldb, cl_mem c, size_t c_off,
                         size_t ldc)
{
    /* The transposed product (only the unfused baseline's Q K^T) stays with CLBlast. */
    if (ctx->gemm->config.own && !transpose_b)
        return iha__gemm_kernel_enqueue(ctx, &ctx->gemm->config, m, n, k, alpha, a, a_off, lda, b, b_off, ldb, 0.0f,
                                        c, c_off, ldc);
    return iha__sgemm_clblast(ctx, transpose_b, m, n, k, alpha, a, a_off, lda, b, b_off, ldb, c, c_off, ldc);
}

iha_status iha__sgemm(iha_context *ctx, size_t m, size_t n, size_t k, cl_mem a, size_t a_off, size_t lda, cl_mem b,
                      size_t b_off, size_t ldb, cl_mem c, size_t c_off, size_t ldc)
{
    return iha__sgemm_ex(ctx, 0, m, n, k, 1.0f, a, a_off, lda, b, b_off, ldb, c, c_off, ldc);
}

iha_status iha__sgemm_acc(iha_context *ctx, size_t m, size_t n, size_t k, cl_mem a, size_t a_off, size_t lda, cl_mem b,
                          size_t b_off, size_t ldb, cl_mem c, size_t c_off, size_t ldc)
{
    if (ctx->gemm->config.own)
        return iha__gemm_kernel_enqueue(ctx, &ctx->gemm->config, m, n, k, 1.0f, a, a_off, lda, b, b_off, ldb, 1.0f,
                                        c, c_off, ldc);
    /* CLBlast's GEMM with beta = 1 (its GEMV path for a few rows overwrites, so it is not used). */
    return clblast_gemm(ctx, 0, m, n, k, 1.0f, a, a_off, lda, b, b_off, ldb, 1.0f, c, c_off, ldc);
}

iha_status iha__gemm_context_init(iha_context *ctx)
{
    ctx->gemm = calloc(1, sizeof *ctx->gemm);
    IHA_RETURN_ERROR_IF(ctx->gemm == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    return IHA_OK;
}

void iha__gemm_context_free(iha_context *ctx)
{
    if (ctx->gemm == NULL) return;
    iha__clblast_leave(ctx);
    free(ctx->gemm);
    ctx->gemm = NULL;
}
