/* Matrix products through the context's backend (ctx->gemm): the library's own kernel
 * (gemm/microkernel.h) or CLBlast; the only module that includes clblast_c.h. */
#ifndef IHA_GEMM_GEMM_H
#define IHA_GEMM_GEMM_H
#include "runtime/context.h"

/* C[m][n] = A[m][k] * B[k][n] (C overwritten), row-major, with leading dimensions lda, ldb, ldc and element
 * offsets, enqueued on the context's queue. */
iha_status iha__sgemm(iha_context *ctx, size_t m, size_t n, size_t k, cl_mem a, size_t a_off, size_t lda, cl_mem b,
                      size_t b_off, size_t ldb, cl_mem c, size_t c_off, size_t ldc);
/* C[m][n] = alpha * A[m][k] * op(B), row-major, where op(B) is B[k][n] or, with transpose_b,
 * the transpose of B stored as [n][k] (ldb is then the row stride of that array). */
iha_status iha__sgemm_ex(iha_context *ctx, int transpose_b, size_t m, size_t n, size_t k, float alpha, cl_mem a,
                         size_t a_off, size_t lda, cl_mem b, size_t b_off, size_t ldb, cl_mem c, size_t c_off,
                         size_t ldc);
/* The same through CLBlast whatever the context's backend (the CLBlast ceiling of benchmarks,
 * and every transposed product). */
iha_status iha__sgemm_clblast(iha_context *ctx, int transpose_b, size_t m, size_t n, size_t k, float alpha, cl_mem a,
                              size_t a_off, size_t lda, cl_mem b, size_t b_off, size_t ldb, cl_mem c, size_t c_off,
                              size_t ldc);
/* C[m][n] += A[m][k] * B[k][n] (C read and updated), through the context's backend. */
iha_status iha__sgemm_acc(iha_context *ctx, size_t m, size_t n, size_t k, cl_mem a, size_t a_off, size_t lda, cl_mem b,
                          size_t b_off, size_t ldb, cl_mem c, size_t c_off, size_t ldc);
#endif
