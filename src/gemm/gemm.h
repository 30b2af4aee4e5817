/* The library's own SGEMM (cl/gemm.cl): a register-tile micro-kernel for CPU devices, which
 * loads from the IHA program cache like every other kernel of the library. */
#ifndef IHA_GEMM_GEMM_H
#define IHA_GEMM_GEMM_H
#include "runtime/context.h"

/* The workspace slot of B packed in panels. */
enum { IHA_WS_GEMM_B = IHA_WS_GEMM_BASE, IHA_WS_GEMM_END };
_Static_assert((int)IHA_WS_GEMM_END <= (int)IHA_WS_LAYER_BASE, "gemm's workspace slots overlap the next module's");

/* The backend of the library's matrix products and the tile of its own kernel. own = 0 (a
 * zeroed state): CLBlast. */
typedef struct iha_gemm_config {
    int own;      /* 1: cl/gemm.cl with the tile below; 0: CLBlast */
    int rows;     /* GEMM_MR: rows of C per work-item, 1 to 8 */
    int vec;      /* GEMM_VW: columns of C per work-item, 4, 8 or 16 */
    int unroll;   /* GEMM_KU: unrolling of the k loop, 1 to 16 */
    size_t group; /* row tiles per work-group */
} iha_gemm_config;

/* The kernel's default tile for the device type (own is left as it is): 6 x 16 on a CPU (12 of
 * AVX2's 16 registers as accumulators), 4 x 4 in groups of 64 on a GPU. */
void iha__gemm_kernel_default(const iha_context *ctx, iha_gemm_config *cfg);

/* Nonzero when rows, vec, unroll and group are values the kernel accepts. */
int iha__gemm_kernel_valid(const iha_gemm_config *cfg);

/* C[m][n] = alpha * A[m][k] * B[k][n] + beta * C with cl/gemm.cl and cfg's tile (cfg->own is not
 * read), row-major with element offsets and leading dimensions; beta = 0 overwrites C unread. m <= 4 (a decoding
 * step's rows) uses a tile of exactly m rows. Nothing to do when m or n is 0; k = 0 writes beta * C.
 * IHA_ERROR_INVALID_ARGUMENT for an invalid cfg, a leading dimension below its row length or a
 * buffer too small for its matrix; IHA_ERROR_UNSUPPORTED when m or n exceeds INT_MAX - 16 or k exceeds INT_MAX. */
iha_status iha__gemm_kernel_enqueue(iha_context *ctx, const iha_gemm_config *cfg, size_t m, size_t n, size_t k,
                                    float alpha, cl_mem a, size_t a_off, size_t lda, cl_mem b, size_t b_off,
                                    size_t ldb, float beta, cl_mem c, size_t c_off, size_t ldc);
#endif
