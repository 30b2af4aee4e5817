/* Conversions between the caller's storage and the float workspace of a layer call. */
#include "layer/storage.h"

#include <limits.h>

#include "gemm/gemm.h"

/* Up to this many rows a projection with half weights reads them directly: the product is
 * then memory-bound on the weights, and a float copy would move 5x their half bytes (read
 * half, write float, read float). Past it, CLBlast's SGEMM on a converted copy wins, its
 * conversion being small next to the product. */
#define HALF_GEMV_MAX_ROWS 16

iha_status iha__input_float(iha_context *ctx, const iha_plan *p, iha_buffer in, size_t elems, iha_workspace_slot slot,
                            iha_ref *out)
{
    if (!p->act_half) {
        *out = (iha_ref){in.mem, in.offset};
        return IHA_OK;
    }
    cl_mem m;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, slot, elems * sizeof(float), &m));
    *out = (iha_ref){m, 0};
    return iha__convert_enqueue(ctx, 0, (iha_ref){in.mem, in.offset}, *out, elems);
}

iha_status iha__output_float(iha_context *ctx, const iha_plan *p, iha_buffer out, size_t elems,
                             iha_workspace_slot slot, iha_ref *result)
{
    if (!p->act_half) {
        *result = (iha_ref){out.mem, out.offset};
        return IHA_OK;
    }
    cl_mem m;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, slot, elems * sizeof(float), &m));
    *result = (iha_ref){m, 0};
    return IHA_OK;
}

iha_status iha__output_finish(iha_context *ctx, const iha_plan *p, iha_ref result, iha_buffer out, size_t elems)
{
    if (!p->act_half) return IHA_OK;
    return iha__convert_enqueue(ctx, 1, result, (iha_ref){out.mem, out.offset}, elems);
}

iha_status iha__mixing_float(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, iha_layer_weights *out)
{
    *out = *w;
    if (!p->weight_half || w->alpha_q.mem == NULL) return IHA_OK; /* float, or the identity shortcut */
    const size_t n = p->mix_elems;
    cl_mem m;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_MIXING, 4 * n * sizeof(float), &m));
    iha_buffer *dst[4] = {&out->alpha_q, &out->alpha_k, &out->alpha_v, &out->r};
    const iha_buffer src[4] = {w->alpha_q, w->alpha_k, w->alpha_v, w->r};
    for (size_t i = 0; i < 4; ++i) {
        *dst[i] = (iha_buffer){m, i * n};
        IHA_FORWARD_IF_ERROR(iha__convert_enqueue(ctx, 0, (iha_ref){src[i].mem, src[i].offset}, (iha_ref){m, i * n}, n));
    }
    return IHA_OK;
}

size_t iha__project_workspace_elements(const iha_plan *p, size_t rows)
{
    return p->weight_half && rows > HALF_GEMV_MAX_ROWS ? p->w_elems : 0;
}

iha_status iha__project(iha_context *ctx, const iha_plan *p, size_t rows, size_t n, size_t k, iha_ref x, iha_buffer w,
                        iha_ref out)
{
    if (!p->weight_half) return iha__sgemm(ctx, rows, n, k, x.mem, x.offset, k, w.mem, w.offset, n, out.mem, out.offset, n);
    const iha_ref wr = {w.mem, w.offset};
    IHA_RETURN_ERROR_IF(rows > INT_MAX || n > INT_MAX || k > INT_MAX, ctx, IHA_ERROR_UNSUPPORTED,
                        "a projection of %zu x %zu x %zu is too large for the half-weight kernels", rows, n, k);
    if (rows <= HALF_GEMV_MAX_ROWS) return iha__gemv_half_weights_enqueue(ctx, rows, n, k, x, wr, out);
    cl_mem wf;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_WEIGHT, p->w_elems * sizeof(float), &wf));
    /* One slot serves all four matrices: the in-order queue finishes each product before the
     * next conversion overwrites it. */
    IHA_FORWARD_IF_ERROR(iha__convert_enqueue(ctx, 0, wr, (iha_ref){wf, 0}, p->w_elems));
    return iha__sgemm(ctx, rows, n, k, x.mem, x.offset, k, wf, 0, n, out.mem, out.offset, n);
}
