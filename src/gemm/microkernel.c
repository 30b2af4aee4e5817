/* Host side of cl/gemm.cl: build options, argument checks and launch geometry. */
#include "gemm/microkernel.h"

#include <limits.h>
#include <stdio.h>

#include "common/checked.h"
#include "runtime/launch.h"

/* Rows up to which a product counts as a decoding step's: its tile is exactly m rows tall, so
 * no FMA is spent on rows that are not there (one program per m, from the disk cache). */
#define SMALL_ROWS 4

void iha__gemm_kernel_default(const iha_context *ctx, iha_gemm_config *cfg)
{
    cfg->rows = ctx->info.is_gpu ? 4 : 6;
    cfg->vec = ctx->info.is_gpu ? 4 : 16;
    cfg->unroll = 4;
    cfg->group = ctx->info.is_gpu ? 64 : 16;
}

int iha__gemm_kernel_valid(const iha_gemm_config *cfg)
{
    return cfg->rows >= 1 && cfg->rows <= 8 && (cfg->vec == 4 || cfg->vec == 8 || cfg->vec == 16) &&
           cfg->unroll >= 1 && cfg->unroll <= 16 && cfg->group >= 1 && cfg->group <= 1024;
}

/* Whether rows x cols with leading dimension ld from element offset off fit in mem. */
static iha_status check_matrix(iha_context *ctx, const char *name, cl_mem mem, size_t off, size_t rows, size_t cols,
                               size_t ld)
{
    IHA_RETURN_ERROR_IF(mem == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "GEMM: matrix %s is NULL", name);
    IHA_RETURN_ERROR_IF(ld < cols, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "GEMM: leading dimension %zu of %s is below its row length %zu", ld, name, cols);
    size_t bytes = 0, last = 0, end = 0;
    IHA_CL_CHECK(ctx, clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof bytes, &bytes, NULL), "clGetMemObjectInfo (GEMM)");
    if (rows == 0 || cols == 0) return IHA_OK;
    const int fits = iha__mul(rows - 1, ld, &last) && iha__add(last, cols, &end) && iha__add(end, off, &end) &&
                     iha__mul(end, sizeof(float), &end) && end <= bytes;
    IHA_RETURN_ERROR_IF(!fits, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "GEMM: %s (%zu x %zu, leading dimension %zu, offset %zu) does not fit its buffer of %zu bytes",
                        name, rows, cols, ld, off, bytes);
    return IHA_OK;
}

/* Row tiles per work-group: the configured count where there are that many tiles, otherwise 1
 * (a decoding step's single row tile), and never more than the kernel allows on the device.
 * PoCL compiles a kernel once per work-group size, so only these two sizes occur. */
static iha_status group_size(iha_context *ctx, cl_kernel kernel, const iha_gemm_config *cfg, size_t row_tiles,
                             size_t *out)
{
    size_t most = 0;
    IHA_CL_CHECK(ctx,
                 clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof most, &most, NULL),
                 "clGetKernelWorkGroupInfo (sgemm_f32)");
    size_t g = row_tiles >= cfg->group ? cfg->group : 1;
    while (g > 1 && g > most) g /= 2;
    *out = g;
    return IHA_OK;
}

iha_status iha__gemm_kernel_enqueue(iha_context *ctx, const iha_gemm_config *cfg, size_t m, size_t n, size_t k,
                                    float alpha, cl_mem a, size_t a_off, size_t lda, cl_mem b, size_t b_off,
                                    size_t ldb, cl_mem c, size_t c_off, size_t ldc)
{
    IHA_RETURN_ERROR_IF(!iha__gemm_kernel_valid(cfg), ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "GEMM kernel: invalid tile (rows %d, vec %d, unroll %d, group %zu)", cfg->rows, cfg->vec,
                        cfg->unroll, cfg->group);
    /* The kernel indexes rows and columns as int, whole tiles included. */
    IHA_RETURN_ERROR_IF(m > INT_MAX - 16 || n > INT_MAX - 16 || k > INT_MAX, ctx, IHA_ERROR_UNSUPPORTED,
                        "GEMM kernel: m=%zu n=%zu k=%zu exceeds its int sizes", m, n, k);
    IHA_FORWARD_IF_ERROR(check_matrix(ctx, "A", a, a_off, m, k, lda));
    IHA_FORWARD_IF_ERROR(check_matrix(ctx, "B", b, b_off, k, n, ldb));
    IHA_FORWARD_IF_ERROR(check_matrix(ctx, "C", c, c_off, m, n, ldc));
    if (m == 0 || n == 0) return IHA_OK;

    const int rows = m <= SMALL_ROWS && (int)m < cfg->rows ? (int)m : cfg->rows;
    char options[96];
    snprintf(options, sizeof options, "-DGEMM_MR=%d -DGEMM_VW=%d -DGEMM_KU=%d", rows, cfg->vec, cfg->unroll);
    cl_kernel kernel;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "gemm.cl", options, "sgemm_f32", &kernel));
    iha_args args = iha__args_begin(kernel);
    iha__arg_int(&args, (cl_int)m);
    iha__arg_int(&args, (cl_int)n);
    iha__arg_int(&args, (cl_int)k);
    iha__arg_float(&args, alpha);
    iha__arg_tensor(&args, a, a_off);
    iha__arg_ulong(&args, lda);
    iha__arg_tensor(&args, b, b_off);
    iha__arg_ulong(&args, ldb);
    iha__arg_tensor(&args, c, c_off);
    iha__arg_ulong(&args, ldc);
    const size_t row_tiles = (m + (size_t)rows - 1) / (size_t)rows, col_tiles = (n + (size_t)cfg->vec - 1) / (size_t)cfg->vec;
    size_t local[2] = {1, 1};
    IHA_FORWARD_IF_ERROR(group_size(ctx, kernel, cfg, row_tiles, &local[0]));
    const size_t global[2] = {row_tiles, col_tiles};
    return iha__launch(ctx, &args, 2, global, local, "sgemm_f32");
}
