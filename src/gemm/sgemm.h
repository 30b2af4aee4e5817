/* Matrix products through the context's backend (ctx->gemm): the library's own kernel
 * (gemm/gemm.h) or CLBlast; the only module that includes clblast_c.h. */
#ifndef IHA_GEMM_SGEMM_H
#define IHA_GEMM_SGEMM_H
#include "gemm/gemm.h"
#include "runtime/context.h"

/* The context's GEMM state: src/tune sets the backend (the profile's GEMM entry or the device
 * type's built-in) when the context is created and when it tunes. */
typedef struct iha_gemm_state {
    iha_gemm_config config;
    int clblast_user; /* the context has called CLBlast (gemm/clblast_lock.h counts it) */
} iha_gemm_state;

/* Called by iha_context_create after the runtime's setup: CLBlast as the backend. */
iha_status iha__gemm_context_init(iha_context *ctx);
/* Called by iha_context_free after the queue has finished. */
void iha__gemm_context_free(iha_context *ctx);

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
