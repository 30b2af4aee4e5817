/* Conversions between the caller's storage and the float workspace of a layer call. */
#include "layer/storage.h"
#include "kernels/accumulate.h"
#include "kernels/convert.h"
#include "layer/workspace.h"
#include "runtime/error.h"

iha_status iha__input_float(iha_context *ctx, const iha_plan *p, iha_buffer in, size_t elems, iha_workspace_slot slot,
                            iha_buffer *out)
{
    if (!p->act_half) {
        *out = in;
        return IHA_OK;
    }
    cl_mem m;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, slot, elems * sizeof(float), &m));
    *out = (iha_buffer){m, 0};
    return iha__convert_enqueue(ctx, p->act_storage, 0, in, *out, elems);
}

iha_status iha__output_float(iha_context *ctx, const iha_plan *p, iha_buffer out, size_t elems,
                             iha_workspace_slot slot, iha_buffer *result)
{
    if (!p->act_half) {
        *result = out;
        return IHA_OK;
    }
    cl_mem m;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, slot, elems * sizeof(float), &m));
    *result = (iha_buffer){m, 0};
    return IHA_OK;
}

iha_status iha__output_finish(iha_context *ctx, const iha_plan *p, iha_buffer result, iha_buffer out, size_t elems)
{
    if (!p->act_half) return IHA_OK;
    return iha__convert_enqueue(ctx, p->act_storage, 1, result, out, elems);
}

iha_status iha__mixing_float(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, iha_layer_weights *out)
{
    *out = *w;
    const iha_buffer src[4] = {w->alpha_q, w->alpha_k, w->alpha_v, w->r};
    /* Float, or the identity shortcut; a member that is NULL is one the call does not read. */
    if (!p->weight_half || (src[0].mem == NULL && src[3].mem == NULL)) return IHA_OK;
    const size_t n = p->mix_elems;
    cl_mem m;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_MIXING, 4 * n * sizeof(float), &m));
    iha_buffer *dst[4] = {&out->alpha_q, &out->alpha_k, &out->alpha_v, &out->r};
    for (size_t i = 0; i < 4; ++i) {
        if (src[i].mem == NULL) continue;
        *dst[i] = (iha_buffer){m, i * n};
        IHA_FORWARD_IF_ERROR(iha__convert_enqueue(ctx, p->weight_storage, 0, src[i], (iha_buffer){m, i * n}, n));
    }
    return IHA_OK;
}

iha_status iha__grad_store(iha_context *ctx, iha_storage storage, int accumulate, iha_buffer result, iha_buffer out,
                           size_t elems)
{
    if (accumulate) return iha__accumulate_enqueue(ctx, storage, result, out, elems);
    if (storage == IHA_STORAGE_F32) return IHA_OK; /* the result is the output itself */
    return iha__convert_enqueue(ctx, storage, 1, result, out, elems);
}
