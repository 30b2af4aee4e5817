/* The projections' backward steps, which iha_backward and the backward layer stages share:
 * float products with CLBlast, a transpose (cl/layer_backward.cl) where a factor is read
 * transposed. */
#include "common/checked.h"
#include "gemm/sgemm.h"
#include "kernels/layer_backward.h"
#include "layer/project.h"
#include "runtime/error.h"

iha_status iha__product(iha_context *ctx, int add, size_t m, size_t n, size_t k, iha_buffer a, size_t lda, iha_buffer b,
                        size_t ldb, iha_buffer c, size_t ldc)
{
    if (add) return iha__sgemm_acc(ctx, m, n, k, a.mem, a.offset, lda, b.mem, b.offset, ldb, c.mem, c.offset, ldc);
    return iha__sgemm(ctx, m, n, k, a.mem, a.offset, lda, b.mem, b.offset, ldb, c.mem, c.offset, ldc);
}

iha_status iha__product_bt(iha_context *ctx, cl_mem scratch, size_t m, size_t n, size_t k, iha_buffer a, iha_buffer b_t,
                           iha_buffer c, int add)
{
    IHA_FORWARD_IF_ERROR(iha__transpose_enqueue(ctx, n, k, b_t, k, (iha_buffer){scratch, 0}, n));
    return iha__product(ctx, add, m, n, k, a, k, (iha_buffer){scratch, 0}, n, c, n);
}

iha_status iha__project_output_backward(iha_context *ctx, const iha_plan *p, cl_mem scratch, iha_buffer dz,
                                        iha_buffer wo, iha_buffer y, iha_buffer dy, iha_buffer dwo, int add)
{
    const size_t rows = p->dims.B * p->dims.N, hd = p->dims.H * p->dims.d, D = p->D;
    IHA_FORWARD_IF_ERROR(iha__product_bt(ctx, scratch, rows, hd, D, dz, wo, dy, 0));
    if (dwo.mem == NULL) return IHA_OK;
    IHA_FORWARD_IF_ERROR(iha__transpose_enqueue(ctx, rows, hd, y, hd, (iha_buffer){scratch, 0}, rows));
    return iha__product(ctx, add, hd, D, rows, (iha_buffer){scratch, 0}, rows, dz, D, dwo, D);
}

iha_status iha__project_qkv_backward(iha_context *ctx, const iha_plan *p, const cl_mem scratch[2], iha_buffer x,
                                     const iha_layer_weights *w, const iha_buffer dtok[3], const iha_buffer dw[3],
                                     unsigned add_dw, iha_buffer dx, int add_dx)
{
    const size_t rows = p->dims.B * p->dims.N, hd = p->dims.H * p->dims.d, D = p->D;
    if (dw[0].mem != NULL || dw[1].mem != NULL || dw[2].mem != NULL) {
        const iha_buffer xt = {scratch[0], 0};
        IHA_FORWARD_IF_ERROR(iha__transpose_enqueue(ctx, rows, D, x, D, xt, rows));
        for (int i = 0; i < 3; ++i)
            if (dw[i].mem != NULL)
                IHA_FORWARD_IF_ERROR(
                    iha__product(ctx, add_dw >> i & 1u, D, hd, rows, xt, rows, dtok[i], hd, dw[i], hd));
    }
    if (dx.mem == NULL) return IHA_OK;
    const iha_buffer ws[3] = {w->wq, w->wk, w->wv};
    for (int i = 0; i < 3; ++i)
        IHA_FORWARD_IF_ERROR(iha__product_bt(ctx, scratch[1], rows, D, hd, dtok[i], ws[i], dx, i > 0 || add_dx));
    return IHA_OK;
}
