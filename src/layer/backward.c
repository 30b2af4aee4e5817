/* iha_attention_backward: the gradients of iha_attention (SPEC "The backward pass", attention),
 * validated like the forward calls before anything is enqueued. */
#include <stdint.h>

#include "common/checked.h"
#include "layer/call.h"
#include "layer/plan.h"

static iha_status attention_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                     const iha_buffer in[6], const iha_buffer out[3])
{
    static const char *const in_names[6] = {"qt", "kt", "vt", "o", "lse", "dout"};
    static const char *const out_names[3] = {"dqt", "dkt", "dvt"};
    double mark;
    IHA_FORWARD_IF_ERROR(iha__call_begin(ctx, &mark));
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 0, &p));
    IHA_RETURN_ERROR_IF(p.rope, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "iha_attention_backward takes already rotated inputs: options->rope must be 0");
    /* weight_storage is ignored, as by iha_attention: the call has no weights. */
    IHA_RETURN_ERROR_IF(p.act_half, ctx, IHA_ERROR_UNSUPPORTED,
                        "iha_attention_backward supports float32 activations only (options->storage)");
    const size_t f = sizeof(float), n = p.virtual_elems;
    size_t elems[6];
    for (int i = 0; i < 6; ++i) {
        elems[i] = i == 4 ? p.lse_elems : n;
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, in[i], elems[i], f, in_names[i]));
    }
    for (int j = 0; j < 3; ++j) {
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, out[j], n, f, out_names[j]));
        for (int i = 0; i < 6; ++i)
            IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, out[j], n, f, in[i], elems[i], f, out_names[j], in_names[i]));
        for (int i = 0; i < j; ++i)
            IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, out[j], n, out[i], n, f, out_names[j], out_names[i]));
    }
    /* Workspace: Dt, one float per virtual row, and for the tile kernels packed copies of K,
     * V, Q and dO. */
    const int tiled = iha__attention_backward_tiled(ctx, p.dims.d);
    const size_t packed = iha__packed_keys_elements(&p.dims, 16);
    size_t total = SIZE_MAX, copies;
    if (iha__mul(packed, tiled ? 4 : 0, &copies)) iha__add(copies, p.lse_elems, &total);
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, total, f));
    iha_backward_refs r = {iha__ref_of(in[0]), iha__ref_of(in[1]), iha__ref_of(in[2]), iha__ref_of(in[3]),
                           iha__ref_of(in[4]), iha__ref_of(in[5]), iha__ref_of(out[0]), iha__ref_of(out[1]),
                           iha__ref_of(out[2]), NULL, {NULL, NULL, NULL, NULL}};
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_DELTA, p.lse_elems * f, &r.delta));
    if (tiled) {
        /* The slots the forward calls use for their pseudo tensors, free during this call. */
        static const iha_workspace_slot slots[4] = {IHA_WS_KT, IHA_WS_VT, IHA_WS_QT, IHA_WS_O};
        for (int i = 0; i < 4; ++i) IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, slots[i], packed * f, &r.packed[i]));
    }
    IHA_FORWARD_IF_ERROR(iha__attention_backward_enqueue(ctx, &p.dims, &r, p.mask, p.window, p.scale));
    return iha__stage_done(ctx, &ctx->stage_times.attention, &mark);
}

iha_status iha_attention_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                  iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o, iha_buffer lse,
                                  iha_buffer dout, iha_buffer dqt, iha_buffer dkt, iha_buffer dvt)
{
    const iha_buffer in[6] = {qt, kt, vt, o, lse, dout}, out[3] = {dqt, dkt, dvt};
    iha_status st = attention_backward(ctx, shape, options, in, out);
    if (st == IHA_OK) iha__program_cache_flush(ctx);
    return st;
}
