/* iha_attention_backward: the gradients of iha_attention (doc/spec.md, "The backward pass", attention),
 * validated like the forward calls before anything is enqueued. */
#include <stdint.h>

#include "common/checked.h"
#include "kernels/attention_backward.h"
#include "layer/call.h"
#include "layer/plan.h"
#include "layer/storage.h"
#include "layer/workspace.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"
#include "tune/choose.h"

static iha_status attention_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                     const iha_buffer in[6], const iha_buffer out[3])
{
    static const char *const in_names[6] = {"qt", "kt", "vt", "o", "lse", "dout"};
    static const char *const out_names[3] = {"dqt", "dkt", "dvt"};
    double mark;
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__call_plan(ctx, shape, options, 0, "iha_attention_backward", &mark, &p));
    /* weight_storage is ignored, as by iha_attention: the call has no weights. The activations
     * are in options->storage; lse is float whatever it is. */
    const size_t f = sizeof(float), a = p.act_bytes, n = p.virtual_elems;
    size_t elems[6], bytes[6];
    for (int i = 0; i < 6; ++i) {
        elems[i] = i == 4 ? p.lse_elems : n;
        bytes[i] = i == 4 ? f : a;
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, in[i], elems[i], bytes[i], in_names[i]));
    }
    for (int j = 0; j < 3; ++j) {
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, out[j], n, a, out_names[j]));
        for (int i = 0; i < 6; ++i)
            IHA_FORWARD_IF_ERROR(
                iha__check_apart(ctx, out[j], n, a, in[i], elems[i], bytes[i], out_names[j], in_names[i]));
        for (int i = 0; i < j; ++i)
            IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, out[j], n, out[i], n, a, out_names[j], out_names[i]));
    }
    /* Workspace: Dt, one float per virtual row; for the tile kernel packed copies of Q and dO
     * and its partial dq sums; with half activations float copies of the five inputs, and float
     * stand-ins of the three outputs with half activations or accumulation (layer/storage.h). */
    const int acc = options->accumulate != 0;
    const iha_storage storage = iha__act_storage(&p);
    const int stand_in = iha__grad_stand_in(storage, acc);
    const int tiled = iha__attention_backward_tiled(ctx, p.dims.d);
    const size_t packed = iha__packed_keys_elements(&p.dims, 16);
    size_t partial = 0, total = SIZE_MAX, copies, floats;
    if ((!tiled || iha__attention_backward_partial_elements(ctx, &p.dims, &partial)) &&
        iha__mul(packed, tiled ? 2 : 0, &copies) && iha__add(copies, partial, &copies) &&
        iha__mul(n, (p.act_half ? 5 : 0) + (stand_in ? 3 : 0), &floats) && iha__add(copies, floats, &copies) &&
        iha__add(copies, iha__plan_sequences_elements(&p), &copies))
        iha__add(copies, p.lse_elems, &total);
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, total, f));
    /* The call's only choice besides the GEMM's: the record starts with it. */
    const int choose = IHA_CHOOSE_TUNE | IHA_CHOOSE_RECORD | IHA_CHOOSE_FIRST;
    IHA_FORWARD_IF_ERROR(iha__tune_choose_backward(ctx, shape, options, choose, &p.backward));
    IHA_FORWARD_IF_ERROR(iha__plan_sequences(ctx, &p));
    cl_mem delta, packs[2], sums;
    IHA_FORWARD_IF_ERROR(
        iha__attention_backward_workspace(ctx, tiled, p.lse_elems, packed, partial, &delta, packs, &sums));
    /* Float views: the inputs themselves, or their conversions in the layer backward's slots,
     * which no other part of this call uses. */
    iha_buffer view[9];
    for (int i = 0, k = 0; i < 6; ++i)
        if (i == 4)
            view[i] = in[i];
        else
            IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, in[i], n, (iha_workspace_slot)(IHA_WS_GRAD + k++), &view[i]));
    for (int j = 0; j < 3; ++j) {
        view[6 + j] = out[j];
        if (stand_in) {
            cl_mem m;
            IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, (iha_workspace_slot)(IHA_WS_GRAD + 5 + j), n * f, &m));
            view[6 + j] = (iha_buffer){m, 0};
        }
    }
    iha_backward_refs r = {view[0], view[1], view[2], view[3], view[4], view[5], view[6], view[7], view[8],
                           delta,   {packs[0], packs[1]}, sums};
    IHA_FORWARD_IF_ERROR(iha__attention_backward_enqueue(ctx, &p.dims, &r, &p.backward, p.mask, p.window, p.scale));
    for (int j = 0; j < 3 && stand_in; ++j)
        IHA_FORWARD_IF_ERROR(iha__grad_store(ctx, storage, acc, view[6 + j], out[j], n));
    return iha__stage_done(ctx, &ctx->stage_times.attention, &mark);
}

iha_status iha_attention_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                  iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o, iha_buffer lse,
                                  iha_buffer dout, iha_buffer dqt, iha_buffer dkt, iha_buffer dvt)
{
    const iha_buffer in[6] = {qt, kt, vt, o, lse, dout}, out[3] = {dqt, dkt, dvt};
    iha_status st = attention_backward(ctx, shape, options, in, out);
    return iha__call_end(ctx, st);
}
