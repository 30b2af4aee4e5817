/* The backward pass of the layer's core (doc/spec.md, "The backward pass", steps 2 to 5): the
 * steps iha_backward runs between its projections' (layer_backward.c), and
 * iha_attention_core_backward, which runs them alone on the caller's Q, K, V and dY. Every
 * argument is checked before anything is enqueued; half storage is converted at the edges as in
 * iha_backward. */
#include <limits.h>
#include <stdint.h>

#include "layer/core_backward.h"
#include "common/checked.h"
#include "kernels/attention_backward.h"
#include "kernels/collapse.h"
#include "kernels/layer_backward.h"
#include "kernels/rope.h"
#include "layer/call.h"
#include "layer/saved.h"
#include "layer/storage.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"

static iha_buffer at(cl_mem m) { return (iha_buffer){m, 0}; }

size_t iha__core_grad_elements(const iha_context *ctx, const iha_plan *p, int saved, size_t sizes[IHA_GRAD_ROLES])
{
    const size_t ve = p->virtual_elems;
    const int tiled = iha__attention_backward_tiled(ctx, p->dims.d);
    size_t partial = 0;
    if (tiled && !iha__attention_backward_partial_elements(ctx, &p->dims, &partial)) return 0;
    static const int pseudo[] = {IHA_GRAD_QT,  IHA_GRAD_KT,  IHA_GRAD_VT, IHA_GRAD_O,
                                 IHA_GRAD_DO,  IHA_GRAD_DQT, IHA_GRAD_DKT, IHA_GRAD_DVT};
    for (size_t i = 0; i < sizeof pseudo / sizeof pseudo[0]; ++i) sizes[pseudo[i]] = ve;
    if (saved) sizes[IHA_GRAD_O] = 0;
    sizes[IHA_GRAD_LSE] = saved ? 0 : p->lse_elems;
    sizes[IHA_GRAD_PARTIAL] = iha__mix_grad_partial_elements(&p->dims);
    /* iha__plan_make bounds B*H*T*d by SIZE_MAX / 8, so 8 of them do not overflow. */
    size_t total = (saved ? 7 : 8) * ve, more = 0;
    const size_t packed16 = iha__packed_keys_elements(&p->dims, 16);
    if (!iha__add(total, sizes[IHA_GRAD_LSE], &total) || !iha__add(total, sizes[IHA_GRAD_PARTIAL], &total) ||
        !iha__add(total, saved ? 0 : p->packed_elems, &total) || !iha__add(total, p->lse_elems, &total) ||
        !iha__mul(packed16, tiled ? 2 : 0, &more) || !iha__add(total, more, &total) ||
        !iha__add(total, partial, &total))
        return 0;
    return total;
}

iha_status iha__core_grad_buffers(iha_context *ctx, const iha_plan *p, iha_buffer saved,
                                  const size_t sizes[IHA_GRAD_ROLES], iha_grad_buffers *g)
{
    const size_t f = sizeof(float);
    for (int i = 0; i < IHA_GRAD_ROLES; ++i) {
        g->t[i] = NULL;
        if (sizes[i] > 0)
            IHA_FORWARD_IF_ERROR(
                iha__workspace_get(ctx, (iha_workspace_slot)(IHA_WS_GRAD + i), sizes[i] * f, &g->t[i]));
    }
    const int from_saved = saved.mem != NULL;
    g->o = from_saved ? iha__saved_o(saved) : at(g->t[IHA_GRAD_O]);
    g->lse = from_saved ? iha__saved_lse(p, saved) : at(g->t[IHA_GRAD_LSE]);
    g->packed_keys = g->packed[0] = g->packed[1] = g->partial = NULL;
    if (!from_saved) IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_KT, p->packed_elems * f, &g->packed_keys));
    size_t partial = 0;
    const int tiled = iha__attention_backward_tiled(ctx, p->dims.d) &&
                      iha__attention_backward_partial_elements(ctx, &p->dims, &partial);
    return iha__attention_backward_workspace(ctx, tiled, p->lse_elems, iha__packed_keys_elements(&p->dims, 16), partial,
                                             &g->delta, g->packed, &g->partial);
}

iha_status iha__core_forward_again(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w,
                                   const iha_grad_buffers *g, cl_mem rope, int saved, double *mark)
{
    const iha_mix_collapse_config *mc = &p->mix_collapse;
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, mc, &p->dims, g->q, w->alpha_q, at(g->t[IHA_GRAD_QT]), rope, 0));
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, mc, &p->dims, g->k, w->alpha_k, at(g->t[IHA_GRAD_KT]), rope, 0));
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, mc, &p->dims, g->v, w->alpha_v, at(g->t[IHA_GRAD_VT]), NULL, 0));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.mixing, mark));
    if (saved) return IHA_OK;
    IHA_FORWARD_IF_ERROR(
        iha__pack_keys_enqueue(ctx, &p->dims, at(g->t[IHA_GRAD_KT]), at(g->packed_keys), p->attention.key_block));
    IHA_FORWARD_IF_ERROR(iha__attention_enqueue(ctx, &p->attention, &p->dims, at(g->t[IHA_GRAD_QT]), at(g->packed_keys),
                                                at(g->t[IHA_GRAD_VT]), g->o, g->lse, p->mask, p->window, p->scale));
    return iha__stage_done(ctx, &ctx->stage_times.attention, mark);
}

iha_status iha__collapse_backward_enqueue(iha_context *ctx, const iha_plan *p, iha_buffer r, iha_buffer dy,
                                          iha_buffer o, cl_mem partial, iha_buffer dout, iha_buffer dr)
{
    /* dO = the mixing of dY with R (R[h][m][p] has alpha's layout, source h, target m), dR =
     * G(dY, O). */
    if (dout.mem != NULL) IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->mix_collapse, &p->dims, dy, r, dout, NULL, 0));
    if (dr.mem != NULL) IHA_FORWARD_IF_ERROR(iha__mix_grad_enqueue(ctx, &p->dims, dy, o, partial, dr));
    return IHA_OK;
}

iha_status iha__mixing_backward_enqueue(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w,
                                        const iha_buffer tokens[3], const iha_buffer dpseudo[3], cl_mem partial,
                                        const iha_buffer dtok[3], const iha_buffer dalphas[3])
{
    /* dQ = the collapse of dQt with alpha_Q (alpha[m][h][p] has R's layout, target m, source h),
     * dalpha_Q = G(Q, dQt); K and V alike. */
    const iha_buffer alphas[3] = {w->alpha_q, w->alpha_k, w->alpha_v};
    for (int i = 0; i < 3; ++i) {
        if (dtok[i].mem != NULL)
            IHA_FORWARD_IF_ERROR(
                iha__collapse_enqueue(ctx, &p->mix_collapse, &p->dims, dpseudo[i], alphas[i], dtok[i]));
        if (dalphas[i].mem != NULL)
            IHA_FORWARD_IF_ERROR(iha__mix_grad_enqueue(ctx, &p->dims, tokens[i], dpseudo[i], partial, dalphas[i]));
    }
    return IHA_OK;
}

iha_status iha__core_backward_stages(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w,
                                     const iha_grad_buffers *g, iha_buffer dy, const iha_core_grads *out, cl_mem rope,
                                     double *mark)
{
    const iha_dims *dims = &p->dims;
    IHA_FORWARD_IF_ERROR(
        iha__collapse_backward_enqueue(ctx, p, w->r, dy, g->o, g->t[IHA_GRAD_PARTIAL], at(g->t[IHA_GRAD_DO]), out->r));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.collapse, mark));

    /* Attention, then the rotation's gradient. */
    iha_backward_refs r = {at(g->t[IHA_GRAD_QT]),  at(g->t[IHA_GRAD_KT]),  at(g->t[IHA_GRAD_VT]),
                           g->o,                   g->lse,                 at(g->t[IHA_GRAD_DO]),
                           at(g->t[IHA_GRAD_DQT]), at(g->t[IHA_GRAD_DKT]), at(g->t[IHA_GRAD_DVT]),
                           g->delta,               {g->packed[0], g->packed[1]}, g->partial};
    IHA_FORWARD_IF_ERROR(iha__attention_backward_enqueue(ctx, dims, &r, &p->backward, p->mask, p->window, p->scale));
    if (rope) {
        IHA_FORWARD_IF_ERROR(iha__rope_inverse_enqueue(ctx, dims, r.dqt, rope));
        IHA_FORWARD_IF_ERROR(iha__rope_inverse_enqueue(ctx, dims, r.dkt, rope));
    }
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.attention, mark));

    const iha_buffer dpseudo[3] = {r.dqt, r.dkt, r.dvt}, dtok[3] = {out->dq, out->dk, out->dv};
    const iha_buffer dalphas[3] = {out->alpha_q, out->alpha_k, out->alpha_v};
    const iha_buffer tokens[3] = {g->q, g->k, g->v};
    IHA_FORWARD_IF_ERROR(
        iha__mixing_backward_enqueue(ctx, p, w, tokens, dpseudo, g->t[IHA_GRAD_PARTIAL], dtok, dalphas));
    return iha__stage_done(ctx, &ctx->stage_times.mixing, mark);
}

/* ---- iha_attention_core_backward ---- */

/* The call's inputs q, k, v, dy and outputs dq, dk, dv (activations) and the four mixing
 * gradients (in the weights' storage), by index. */
enum { INPUTS = 4, OUTPUTS = 7, TOKEN_OUTPUTS = 3 };
static const char *const in_names[INPUTS] = {"q", "k", "v", "dy"};
static const char *const out_names[OUTPUTS] = {"dq", "dk", "dv", "grads->alpha_q", "grads->alpha_k", "grads->alpha_v",
                                               "grads->r"};

static size_t out_elems(const iha_plan *p, int i) { return i < TOKEN_OUTPUTS ? p->token_elems : p->mix_elems; }
static size_t out_bytes(const iha_plan *p, int i) { return i < TOKEN_OUTPUTS ? p->act_bytes : p->weight_bytes; }
static iha_storage out_storage(const iha_plan *p, int i)
{
    return i < TOKEN_OUTPUTS ? iha__act_storage(p) : iha__weight_storage(p);
}

/* Sizes, overlaps and the limits of the mixing gradients' kernels, then the configurations. */
static iha_status check_call(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                             const iha_layer_weights *w, const iha_buffer in[INPUTS], const iha_buffer out[OUTPUTS],
                             iha_plan *p)
{
    IHA_FORWARD_IF_ERROR(iha__check_weights(ctx, p, w, 0));
    IHA_RETURN_ERROR_IF(p->mix_elems > INT_MAX, ctx, IHA_ERROR_UNSUPPORTED,
                        "iha_attention_core_backward: heads*heads*pseudo (%zu) must be at most %d", p->mix_elems,
                        INT_MAX);
    const size_t n = p->token_elems, a = p->act_bytes;
    for (int i = 0; i < INPUTS; ++i) IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, in[i], n, a, in_names[i]));
    for (int i = 0; i < OUTPUTS; ++i) {
        if (out[i].mem == NULL) continue;
        const size_t e = out_elems(p, i), b = out_bytes(p, i);
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, out[i], e, b, out_names[i]));
        for (int j = 0; j < INPUTS; ++j)
            IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, out[i], e, b, in[j], n, a, out_names[i], in_names[j]));
        IHA_FORWARD_IF_ERROR(iha__check_apart_from_weights_bytes(ctx, p, w, 0, out[i], e, b, out_names[i]));
        for (int j = 0; j < i; ++j)
            if (out[j].mem != NULL)
                IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, out[i], e, b, out[j], out_elems(p, j), out_bytes(p, j),
                                                      out_names[i], out_names[j]));
    }
    IHA_FORWARD_IF_ERROR(iha__plan_choose_backward(ctx, shape, options, p));
    return iha__plan_sequences(ctx, p);
}

/* Every buffer, counted against the device's memory and allocated before the first enqueue:
 * the core's, and at the edges float copies of half inputs (q, k, v in the forward's slots, dy)
 * and mixing weights, and the outputs' stand-ins (layer/storage.h). */
static iha_status plan_buffers(iha_context *ctx, const iha_plan *p, int accumulate, const iha_layer_weights *w,
                               iha_grad_buffers *g, cl_mem *rope)
{
    size_t sizes[IHA_GRAD_ROLES] = {0};
    size_t total = iha__core_grad_elements(ctx, p, 0, sizes);
    const size_t te = p->token_elems;
    if (p->act_half) sizes[IHA_GRAD_DY] = te;
    for (int i = 0; i < TOKEN_OUTPUTS; ++i)
        if (iha__grad_stand_in(out_storage(p, i), accumulate)) sizes[IHA_GRAD_DQ + i] = te;
    if (iha__grad_stand_in(iha__weight_storage(p), accumulate)) sizes[IHA_GRAD_EDGE_OUT] = 4 * p->mix_elems;
    /* The core's total fits, B*N*H*d is bounded by SIZE_MAX / 8 and H*H*P by INT_MAX (checked),
     * so the few terms below cannot overflow a total that is not 0. */
    const size_t mixing = p->weight_half && w->alpha_q.mem != NULL ? 4 * p->mix_elems : 0;
    if (total)
        total += (p->act_half ? 3 * te : 0) + sizes[IHA_GRAD_DY] + sizes[IHA_GRAD_DQ] + sizes[IHA_GRAD_DK] +
                 sizes[IHA_GRAD_DV] + sizes[IHA_GRAD_EDGE_OUT] + mixing + iha__plan_sequences_elements(p);
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, total ? total : SIZE_MAX, sizeof(float)));
    IHA_FORWARD_IF_ERROR(iha__core_grad_buffers(ctx, p, (iha_buffer){NULL, 0}, sizes, g));
    /* The edges' slots too (iha__input_float and iha__mixing_float find them large enough). */
    static const iha_workspace_slot copies[3] = {IHA_WS_Q, IHA_WS_K, IHA_WS_V};
    cl_mem m;
    for (int i = 0; i < 3 && p->act_half; ++i)
        IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, copies[i], te * sizeof(float), &m));
    if (mixing > 0) IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_MIXING, mixing * sizeof(float), &m));
    IHA_FORWARD_IF_ERROR(iha__plan_rope_table(ctx, p, rope));
    return IHA_OK;
}

static iha_status core_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                const iha_layer_weights *w, const iha_buffer in[INPUTS], const iha_buffer out[OUTPUTS])
{
    double mark;
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__call_plan(ctx, shape, options, 0, NULL, &mark, &p));
    IHA_FORWARD_IF_ERROR(check_call(ctx, shape, options, w, in, out, &p));
    const int acc = options->accumulate != 0;
    iha_grad_buffers g;
    cl_mem rope;
    IHA_FORWARD_IF_ERROR(plan_buffers(ctx, &p, acc, w, &g, &rope));

    /* The float views: inputs converted from half, outputs computed into their stand-ins. */
    const size_t n = p.token_elems;
    static const iha_workspace_slot in_slots[INPUTS] = {IHA_WS_Q, IHA_WS_K, IHA_WS_V, IHA_WS_GRAD + IHA_GRAD_DY};
    iha_buffer view[INPUTS];
    for (int i = 0; i < INPUTS; ++i) IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, in[i], n, in_slots[i], &view[i]));
    g.q = view[0], g.k = view[1], g.v = view[2];
    iha_layer_weights wf;
    IHA_FORWARD_IF_ERROR(iha__mixing_float(ctx, &p, w, &wf));
    iha_buffer outf[OUTPUTS];
    for (int i = 0; i < OUTPUTS; ++i) {
        outf[i] = out[i];
        if (out[i].mem == NULL || !iha__grad_stand_in(out_storage(&p, i), acc)) continue;
        outf[i] = i < TOKEN_OUTPUTS ? at(g.t[IHA_GRAD_DQ + i])
                                    : (iha_buffer){g.t[IHA_GRAD_EDGE_OUT], (size_t)(i - TOKEN_OUTPUTS) * p.mix_elems};
    }
    const iha_core_grads grads = {outf[0], outf[1], outf[2], outf[3], outf[4], outf[5], outf[6]};
    IHA_FORWARD_IF_ERROR(iha__core_forward_again(ctx, &p, &wf, &g, rope, 0, &mark));
    IHA_FORWARD_IF_ERROR(iha__core_backward_stages(ctx, &p, &wf, &g, view[3], &grads, rope, &mark));
    for (int i = 0; i < OUTPUTS; ++i)
        if (out[i].mem != NULL && iha__grad_stand_in(out_storage(&p, i), acc))
            IHA_FORWARD_IF_ERROR(iha__grad_store(ctx, out_storage(&p, i), acc, outf[i], out[i], out_elems(&p, i)));
    return IHA_OK;
}

iha_status iha_attention_core_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                       const iha_layer_weights *weights, iha_buffer q, iha_buffer k, iha_buffer v,
                                       iha_buffer dy, iha_buffer dq, iha_buffer dk, iha_buffer dv,
                                       const iha_layer_grads *grads)
{
    const iha_buffer none = {NULL, 0}, in[INPUTS] = {q, k, v, dy};
    const iha_buffer out[OUTPUTS] = {dq,
                                     dk,
                                     dv,
                                     grads ? grads->alpha_q : none,
                                     grads ? grads->alpha_k : none,
                                     grads ? grads->alpha_v : none,
                                     grads ? grads->r : none};
    iha_status st = core_backward(ctx, shape, options, weights, in, out);
    return iha__call_end(ctx, st);
}
