/* Host side of cl/gemm.cl: build options, argument checks and launch geometry. */
#include "gemm/gemm.h"
#include "runtime/error.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "common/checked.h"
#include "runtime/launch.h"

/* Rows up to which a product counts as a decoding step's: its tile is exactly m rows tall, so
 * no FMA is spent on rows that are not there (one program per m, from the disk cache). */
#define SMALL_ROWS 4

/* Rows from which B is packed into contiguous panels first (one pass over B, k*n floats read and
 * written): unpacked panels whose rows lie a power of two apart fall into the same few cache
 * sets and evict each other; a decoding step's few rows do not repay the pass. */
#define PACK_MIN_ROWS 64

/* The kernel's built-in tiles, one row per kind of device (as zstd's clevels.h); own is left as
 * the caller has it. */
static const iha_gemm_config gemm_defaults[2] = {
    /* own GEMM_MR GEMM_VW GEMM_KU GEMM_GROUP */
    {0,    6,      16,     4,      16}, /* CPUs: 12 of AVX2's 16 registers as accumulators */
    {0,    4,       4,     4,      64}, /* GPUs */
};

void iha__gemm_kernel_default(const iha_context *ctx, iha_gemm_config *cfg)
{
    const iha_gemm_config *d = &gemm_defaults[ctx->info.is_gpu ? 1 : 0];
    cfg->rows = d->rows;
    cfg->vec = d->vec;
    cfg->unroll = d->unroll;
    cfg->group = d->group;
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

/* `want` work-items per group, halved until the kernel allows it on the device. PoCL compiles a
 * kernel once per work-group size, so callers use few distinct sizes. */
static iha_status fit_group(iha_context *ctx, cl_kernel kernel, size_t want, size_t *out)
{
    size_t most = 0;
    IHA_CL_CHECK(ctx,
                 clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof most, &most, NULL),
                 "clGetKernelWorkGroupInfo (gemm.cl)");
    while (want > 1 && want > most) want /= 2;
    *out = want;
    return IHA_OK;
}

/* B packed into [ceil(n / vec)][k][vec] in the context's workspace, enqueued before the product.
 * Returns 0 without an error when the workspace cannot hold it: the product then reads B as it
 * is. */
static int pack_b(iha_context *ctx, const char *options, int vec, size_t n, size_t k, cl_mem b, size_t b_off,
                  size_t ldb, cl_mem *packed, iha_status *st)
{
    const size_t panels = (n + (size_t)vec - 1) / (size_t)vec, factors[3] = {panels, k, (size_t)vec * sizeof(float)};
    size_t bytes;
    *st = IHA_OK;
    if (!iha__mul_n(&bytes, 3, factors) || iha__workspace_get(ctx, IHA_WS_GEMM_B, bytes, packed) != IHA_OK) {
        iha__message_clear(&ctx->message);
        return 0;
    }
    cl_kernel kernel;
    size_t local[2] = {1, 1};
    *st = iha__kernel_get(ctx, "gemm.cl", options, "gemm_pack_b_f32", &kernel);
    if (*st == IHA_OK) *st = fit_group(ctx, kernel, 64, &local[0]);
    if (*st != IHA_OK) return 0;
    iha_args args = iha__args_begin(kernel);
    iha__arg_int(&args, (cl_int)k);
    iha__arg_int(&args, (cl_int)n);
    iha__arg_tensor(&args, b, b_off);
    iha__arg_ulong(&args, ldb);
    iha__arg_mem(&args, *packed);
    const size_t global[2] = {k, panels};
    *st = iha__launch(ctx, &args, 2, global, local, "gemm_pack_b_f32");
    return *st == IHA_OK;
}

iha_status iha__gemm_kernel_enqueue(iha_context *ctx, const iha_gemm_config *cfg, size_t m, size_t n, size_t k,
                                    float alpha, cl_mem a, size_t a_off, size_t lda, cl_mem b, size_t b_off,
                                    size_t ldb, float beta, cl_mem c, size_t c_off, size_t ldc)
{
    IHA_RETURN_ERROR_IF(!iha__gemm_kernel_valid(cfg), ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "GEMM kernel: invalid tile (rows %d, vec %d, unroll %d, group %zu)", cfg->rows, cfg->vec,
                        cfg->unroll, cfg->group);
    /* The kernel indexes rows and columns as int, whole tiles included: the launch rounds the row
     * tiles up to whole work-groups, so the last work-item's first row can lie up to
     * group * GEMM_MR rows past m. */
    const size_t row_slack = (cfg->group + 1) * (size_t)cfg->rows;
    IHA_RETURN_ERROR_IF(m > INT_MAX - row_slack || n > INT_MAX - 16 || k > INT_MAX, ctx, IHA_ERROR_UNSUPPORTED,
                        "GEMM kernel: m=%zu n=%zu k=%zu exceeds its int sizes", m, n, k);
    IHA_FORWARD_IF_ERROR(check_matrix(ctx, "A", a, a_off, m, k, lda));
    IHA_FORWARD_IF_ERROR(check_matrix(ctx, "B", b, b_off, k, n, ldb));
    IHA_FORWARD_IF_ERROR(check_matrix(ctx, "C", c, c_off, m, n, ldc));
    if (m == 0 || n == 0) return IHA_OK;

    const int rows = m <= SMALL_ROWS && (int)m < cfg->rows ? (int)m : cfg->rows;
    char options[128];
    snprintf(options, sizeof options, "-DGEMM_MR=%d -DGEMM_VW=%d -DGEMM_KU=%d -DGEMM_PACKED=1", rows, cfg->vec,
             cfg->unroll);
    cl_mem packed = NULL;
    iha_status st = IHA_OK;
    const int is_packed = m >= PACK_MIN_ROWS && k > 0 && pack_b(ctx, options, cfg->vec, n, k, b, b_off, ldb, &packed, &st);
    IHA_FORWARD_IF_ERROR(st);
    if (!is_packed)
        snprintf(options, sizeof options, "-DGEMM_MR=%d -DGEMM_VW=%d -DGEMM_KU=%d -DGEMM_PACKED=0", rows, cfg->vec,
                 cfg->unroll);
    cl_kernel kernel;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "gemm.cl", options, "sgemm_f32", &kernel));
    iha_args args = iha__args_begin(kernel);
    iha__arg_int(&args, (cl_int)m);
    iha__arg_int(&args, (cl_int)n);
    iha__arg_int(&args, (cl_int)k);
    iha__arg_float(&args, alpha);
    iha__arg_float(&args, beta);
    iha__arg_tensor(&args, a, a_off);
    iha__arg_ulong(&args, lda);
    iha__arg_tensor(&args, is_packed ? packed : b, is_packed ? 0 : b_off);
    iha__arg_ulong(&args, ldb);
    iha__arg_tensor(&args, c, c_off);
    iha__arg_ulong(&args, ldc);
    const size_t row_tiles = (m + (size_t)rows - 1) / (size_t)rows, col_tiles = (n + (size_t)cfg->vec - 1) / (size_t)cfg->vec;
    /* The configured row tiles per group where there are that many, otherwise 1 (a decoding
     * step's single row tile). */
    size_t local[2] = {1, 1};
    IHA_FORWARD_IF_ERROR(fit_group(ctx, kernel, row_tiles >= cfg->group ? cfg->group : 1, &local[0]));
    const size_t global[2] = {row_tiles, col_tiles};
    return iha__launch(ctx, &args, 2, global, local, "sgemm_f32");
}
