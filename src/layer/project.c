/* The projection stage: x times one of the layer's weight matrices, with float or 16-bit (half
 * or bfloat16) weights. */
#include "layer/project.h"
#include "kernels/convert.h"
#include "layer/workspace.h"
#include "runtime/error.h"

#include <limits.h>

#include "gemm/sgemm.h"

/* Up to this many rows a projection with 16-bit weights reads them directly: the product is
 * then memory-bound on the weights, and a float copy would move 5x their 16-bit bytes (read
 * 16 bits, write float, read float). Past it, CLBlast's SGEMM on a converted copy wins, its
 * conversion being small next to the product. */
#define HALF_GEMV_MAX_ROWS 16

size_t iha__project_workspace_elements(const iha_plan *p, size_t rows)
{
    return p->weight_half && rows > HALF_GEMV_MAX_ROWS ? p->w_elems : 0;
}

iha_status iha__project(iha_context *ctx, const iha_plan *p, size_t rows, size_t n, size_t k, iha_buffer x, iha_buffer w,
                        iha_buffer out)
{
    if (!p->weight_half) return iha__sgemm(ctx, rows, n, k, x.mem, x.offset, k, w.mem, w.offset, n, out.mem, out.offset, n);
    const iha_buffer wr = {w.mem, w.offset};
    IHA_RETURN_ERROR_IF(rows > INT_MAX || n > INT_MAX || k > INT_MAX, ctx, IHA_ERROR_UNSUPPORTED,
                        "a projection of %zu x %zu x %zu is too large for the 16-bit-weight kernels", rows, n, k);
    if (rows <= HALF_GEMV_MAX_ROWS)
        return iha__gemv_16bit_weights_enqueue(ctx, p->weight_storage, rows, n, k, x, wr, out);
    cl_mem wf;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_WEIGHT, p->w_elems * sizeof(float), &wf));
    /* One slot serves all four matrices: the in-order queue finishes each product before the
     * next conversion overwrites it. */
    IHA_FORWARD_IF_ERROR(iha__convert_enqueue(ctx, p->weight_storage, 0, wr, (iha_buffer){wf, 0}, p->w_elems));
    return iha__sgemm(ctx, rows, n, k, x.mem, x.offset, k, wf, 0, n, out.mem, out.offset, n);
}

iha_status iha__project_qkv(iha_context *ctx, const iha_plan *p, iha_buffer x, const iha_layer_weights *w, iha_buffer q,
                            iha_buffer k, iha_buffer v)
{
    const size_t rows = p->dims.B * p->dims.N, hd = p->dims.H * p->dims.d;
    IHA_FORWARD_IF_ERROR(iha__project(ctx, p, rows, hd, p->D, x, w->wq, q));
    IHA_FORWARD_IF_ERROR(iha__project(ctx, p, rows, hd, p->D, x, w->wk, k));
    return iha__project(ctx, p, rows, hd, p->D, x, w->wv, v);
}

iha_status iha__project_output(iha_context *ctx, const iha_plan *p, iha_buffer y, iha_buffer wo, iha_buffer z)
{
    return iha__project(ctx, p, p->dims.B * p->dims.N, p->D, p->dims.H * p->dims.d, y, wo, z);
}
