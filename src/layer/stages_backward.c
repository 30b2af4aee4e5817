/* iha_layer_collapse_backward and iha_layer_expand_backward: iha_backward's steps after and
 * before its attention backward, as calls of their own (include/iha.h, "Layer stages"). The
 * steps are iha_backward's (layer/project.h, layer/core_backward.h); the forward's values they
 * read (Y, or Q, K and V) are recomputed from the call's inputs. Every argument is checked and
 * every buffer allocated before anything is enqueued; 16-bit tensors are converted at the edges,
 * and outputs that are 16-bit or added into get float stand-ins (layer/storage.h). */
#include <limits.h>
#include <stdint.h>

#include "common/checked.h"
#include "kernels/collapse.h"
#include "kernels/convert.h"
#include "kernels/layer_backward.h"
#include "layer/call.h"
#include "layer/core_backward.h"
#include "layer/project.h"
#include "layer/stages.h"
#include "layer/storage.h"
#include "layer/workspace.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"

static iha_buffer at(cl_mem m) { return (iha_buffer){m, 0}; }

/* ---- What both calls share ---- */

#define MAX_OUTPUTS 7

/* A call's outputs and where its steps write each one's float result. */
typedef struct stage_outputs {
    int count;
    iha_arg arg[MAX_OUTPUTS]; /* the caller's; mem NULL: not computed */
    int weight[MAX_OUTPUTS];  /* 1: in the weights' storage (a gradient), 0: the activations' */
    int product[MAX_OUTPUTS]; /* 1: written by a product, which adds itself (beta = 1) */
    iha_buffer view[MAX_OUTPUTS];
} stage_outputs;

static iha_storage out_storage(const iha_plan *p, const stage_outputs *o, int i)
{
    return o->weight[i] ? iha__weight_storage(p) : iha__act_storage(p);
}

/* Output i is wanted and computed into a float stand-in. */
static int stand_in(const iha_plan *p, int acc, const stage_outputs *o, int i)
{
    return o->arg[i].buf.mem != NULL && iha__grad_stand_in(out_storage(p, o, i), acc && !o->product[i]);
}

/* Output i's product adds into it (accumulating into the float output itself). */
static int adds(const iha_plan *p, int acc, const stage_outputs *o, int i) { return acc && !stand_in(p, acc, o, i); }

static size_t stand_in_elements(const iha_plan *p, int acc, const stage_outputs *o)
{
    size_t total = 0; /* each count is bounded by SIZE_MAX / 8 (iha__plan_make), and there are few */
    for (int i = 0; i < o->count; ++i) total += stand_in(p, acc, o, i) ? o->arg[i].elems : 0;
    return total;
}

/* The float views: each stand-in at its place in `edge`, the other outputs themselves. */
static void outputs_place(const iha_plan *p, int acc, stage_outputs *o, cl_mem edge)
{
    size_t at_out = 0;
    for (int i = 0; i < o->count; ++i) {
        o->view[i] = o->arg[i].buf;
        if (!stand_in(p, acc, o, i)) continue;
        o->view[i] = (iha_buffer){edge, at_out};
        at_out += o->arg[i].elems;
    }
}

static iha_status outputs_store(iha_context *ctx, const iha_plan *p, int acc, const stage_outputs *o)
{
    for (int i = 0; i < o->count; ++i)
        if (stand_in(p, acc, o, i))
            IHA_FORWARD_IF_ERROR(
                iha__grad_store(ctx, out_storage(p, o, i), acc, o->view[i], o->arg[i].buf, o->arg[i].elems));
    return IHA_OK;
}

/* The limits of iha_backward's kernels: the transposes and products index rows and columns as
 * int, the mixing gradients their H*H*P outputs. */
static iha_status check_limits(iha_context *ctx, const iha_plan *p, const char *call)
{
    const size_t rows = p->dims.B * p->dims.N, hd = p->dims.H * p->dims.d;
    IHA_RETURN_ERROR_IF(rows > INT_MAX / 2 || p->D > INT_MAX / 2 || hd > INT_MAX / 2, ctx, IHA_ERROR_UNSUPPORTED,
                        "%s: batch*tokens (%zu), model_dim (%zu) and heads*head_dim (%zu) must each be at most %d",
                        call, rows, p->D, hd, INT_MAX / 2);
    IHA_RETURN_ERROR_IF(p->mix_elems > INT_MAX, ctx, IHA_ERROR_UNSUPPORTED,
                        "%s: heads*heads*pseudo (%zu) must be at most %d", call, p->mix_elems, INT_MAX);
    return IHA_OK;
}

/* The sum of n sizes, SIZE_MAX on overflow (refused by the memory check). */
static size_t sum_of(const size_t *terms, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; ++i)
        if (!iha__add(total, terms[i], &total)) return SIZE_MAX;
    return total;
}

/* Allocates sizes[role] floats for each role of the backward's slots that is not 0 (NULL for
 * the others). */
static iha_status roles_get(iha_context *ctx, const size_t sizes[IHA_GRAD_ROLES], cl_mem t[IHA_GRAD_ROLES])
{
    for (int i = 0; i < IHA_GRAD_ROLES; ++i) {
        t[i] = NULL;
        if (sizes[i] > 0)
            IHA_FORWARD_IF_ERROR(
                iha__workspace_get(ctx, (iha_workspace_slot)(IHA_WS_GRAD + i), sizes[i] * sizeof(float), &t[i]));
    }
    return IHA_OK;
}

/* A float copy of a 16-bit weight, or the weight itself; NULL stays NULL. */
static iha_status weight_float(iha_context *ctx, const iha_plan *p, iha_buffer w, size_t elems, iha_buffer into,
                               iha_buffer *out)
{
    *out = w;
    if (!p->weight_half || w.mem == NULL) return IHA_OK;
    *out = into;
    return iha__convert_enqueue(ctx, p->weight_storage, 0, w, into, elems);
}

/* The plan with float activations and weights: the steps between the edges run on float views. */
static iha_plan float_plan(const iha_plan *p)
{
    iha_plan pf = *p;
    pf.act_half = pf.weight_half = 0;
    pf.act_storage = pf.weight_storage = IHA_STORAGE_F32;
    pf.act_bytes = pf.weight_bytes = sizeof(float);
    return pf;
}

/* ---- iha_layer_collapse_backward ---- */

enum { C_DOUT, C_WO, C_R, C_OUTPUTS };

static iha_status collapse_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                    const iha_layer_weights *w, iha_buffer o, iha_buffer dz, iha_buffer dout,
                                    const iha_layer_grads *grads)
{
    double mark;
    iha_plan p;
    iha_attention_options used;
    iha_layer_weights read;
    IHA_FORWARD_IF_ERROR(
        iha__stage_plan(ctx, shape, options, 0, 0, w, IHA_READS_WO | IHA_READS_R, &mark, &p, &used, &read));
    IHA_FORWARD_IF_ERROR(check_limits(ctx, &p, "iha_layer_collapse_backward"));
    const size_t a = p.act_bytes, wb = p.weight_bytes, n = p.virtual_elems, te = p.token_elems;
    const iha_buffer none = {NULL, 0};
    const iha_arg in[2] = {{o, n, a, "o"}, {dz, p.x_elems, a, "dz"}};
    stage_outputs out = {C_OUTPUTS,
                         {{dout, n, a, "dout"},
                          {grads ? grads->wo : none, p.w_elems, wb, "grads->wo"},
                          {grads ? grads->r : none, p.mix_elems, wb, "grads->r"}},
                         {0, 1, 1},
                         {0, 1, 0},
                         {{NULL, 0}}};
    IHA_FORWARD_IF_ERROR(iha__check_args(ctx, &p, &read, in, 2, out.arg, C_OUTPUTS, 1));
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, &used, &p));

    /* dY, Y (for dW_O), the transposes' scratch, the mixing gradient's partial sums; at the
     * edges float O and dZ, float W_O and R, and the stand-ins. */
    const int acc = used.accumulate != 0, want_wo = out.arg[C_WO].buf.mem != NULL;
    size_t sizes[IHA_GRAD_ROLES] = {0};
    sizes[IHA_GRAD_DY] = te;
    sizes[IHA_GRAD_TRANSPOSED] = te > p.w_elems ? te : p.w_elems;
    sizes[IHA_GRAD_PARTIAL] = out.arg[C_R].buf.mem != NULL ? iha__mix_grad_partial_elements(&p.dims) : 0;
    sizes[IHA_GRAD_EDGE_IN] = (p.act_half ? n + p.x_elems : 0) + (p.weight_half ? p.w_elems + p.mix_elems : 0);
    sizes[IHA_GRAD_EDGE_OUT] = stand_in_elements(&p, acc, &out);
    const size_t y_elems = want_wo ? te : 0;
    const size_t terms[6] = {sizes[IHA_GRAD_DY],      sizes[IHA_GRAD_TRANSPOSED], sizes[IHA_GRAD_PARTIAL],
                             sizes[IHA_GRAD_EDGE_IN], sizes[IHA_GRAD_EDGE_OUT],   y_elems};
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, sum_of(terms, 6), sizeof(float)));
    cl_mem t[IHA_GRAD_ROLES], y = NULL;
    IHA_FORWARD_IF_ERROR(roles_get(ctx, sizes, t));
    if (want_wo) IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Y, te * sizeof(float), &y));
    outputs_place(&p, acc, &out, t[IHA_GRAD_EDGE_OUT]);

    /* The float views. */
    const cl_mem edge = t[IHA_GRAD_EDGE_IN];
    iha_buffer of = o, dzf = dz, wo, r;
    if (p.act_half) {
        of = (iha_buffer){edge, 0}, dzf = (iha_buffer){edge, n};
        IHA_FORWARD_IF_ERROR(iha__convert_enqueue(ctx, p.act_storage, 0, o, of, n));
        IHA_FORWARD_IF_ERROR(iha__convert_enqueue(ctx, p.act_storage, 0, dz, dzf, p.x_elems));
    }
    const size_t wat = p.act_half ? n + p.x_elems : 0;
    IHA_FORWARD_IF_ERROR(weight_float(ctx, &p, read.wo, p.w_elems, (iha_buffer){edge, wat}, &wo));
    IHA_FORWARD_IF_ERROR(weight_float(ctx, &p, read.r, p.mix_elems, (iha_buffer){edge, wat + p.w_elems}, &r));
    const iha_plan pf = float_plan(&p);

    /* Y = the collapse of O (for dW_O), then dY = dZ W_O^T and dW_O = Y^T dZ. */
    const iha_buffer dy = at(t[IHA_GRAD_DY]);
    if (want_wo) IHA_FORWARD_IF_ERROR(iha__collapse_enqueue(ctx, &p.mix_collapse, &p.dims, of, r, at(y)));
    IHA_FORWARD_IF_ERROR(iha__project_output_backward(ctx, &pf, t[IHA_GRAD_TRANSPOSED], dzf, wo, at(y), dy,
                                                      out.view[C_WO], adds(&p, acc, &out, C_WO)));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.output, &mark));
    IHA_FORWARD_IF_ERROR(
        iha__collapse_backward_enqueue(ctx, &pf, r, dy, of, t[IHA_GRAD_PARTIAL], out.view[C_DOUT], out.view[C_R]));
    IHA_FORWARD_IF_ERROR(outputs_store(ctx, &p, acc, &out));
    return iha__stage_done(ctx, &ctx->stage_times.collapse, &mark);
}

iha_status iha_layer_collapse_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                       const iha_layer_weights *weights, iha_buffer o, iha_buffer dz, iha_buffer dout,
                                       const iha_layer_grads *grads)
{
    iha_status st = collapse_backward(ctx, shape, options, weights, o, dz, dout, grads);
    return iha__call_end(ctx, st);
}

/* ---- iha_layer_expand_backward ---- */

enum { E_DX, E_WQ, E_WK, E_WV, E_AQ, E_AK, E_AV, E_OUTPUTS };

/* A float view of dQt, dKt or dVt: the input itself, or (16-bit, or `writable` for the inverse
 * rotary, which runs in place) a float copy in `into`. */
static iha_status pseudo_float(iha_context *ctx, const iha_plan *p, iha_buffer in, int writable, cl_mem into,
                               iha_buffer *view)
{
    *view = in;
    if (!p->act_half && !writable) return IHA_OK;
    *view = at(into);
    const size_t n = p->virtual_elems;
    if (p->act_half) return iha__convert_enqueue(ctx, p->act_storage, 0, in, *view, n);
    IHA_CL_CHECK(
        ctx,
        clEnqueueCopyBuffer(ctx->queue, in.mem, into, in.offset * sizeof(float), 0, n * sizeof(float), 0, NULL, NULL),
        "clEnqueueCopyBuffer (dqt or dkt)");
    return IHA_OK;
}

static iha_status expand_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                  const iha_layer_weights *w, size_t first_token, const iha_buffer in_bufs[4],
                                  iha_buffer dx, const iha_layer_grads *grads)
{
    double mark;
    iha_plan p;
    iha_attention_options used;
    iha_layer_weights read;
    IHA_FORWARD_IF_ERROR(iha__stage_plan(ctx, shape, options, 1, first_token, w, IHA_READS_WQKV | IHA_READS_ALPHAS,
                                         &mark, &p, &used, &read));
    IHA_FORWARD_IF_ERROR(check_limits(ctx, &p, "iha_layer_expand_backward"));
    const size_t a = p.act_bytes, wb = p.weight_bytes, n = p.virtual_elems, te = p.token_elems, nw = p.w_elems;
    const size_t nm = p.mix_elems;
    const iha_buffer none = {NULL, 0};
    const iha_arg in[4] = {{in_bufs[0], p.x_elems, a, "x"},
                           {in_bufs[1], n, a, "dqt"},
                           {in_bufs[2], n, a, "dkt"},
                           {in_bufs[3], n, a, "dvt"}};
    stage_outputs out = {E_OUTPUTS,
                         {{dx, p.x_elems, a, "dx"},
                          {grads ? grads->wq : none, nw, wb, "grads->wq"},
                          {grads ? grads->wk : none, nw, wb, "grads->wk"},
                          {grads ? grads->wv : none, nw, wb, "grads->wv"},
                          {grads ? grads->alpha_q : none, nm, wb, "grads->alpha_q"},
                          {grads ? grads->alpha_k : none, nm, wb, "grads->alpha_k"},
                          {grads ? grads->alpha_v : none, nm, wb, "grads->alpha_v"}},
                         {0, 1, 1, 1, 1, 1, 1},
                         {1, 1, 1, 1, 0, 0, 0},
                         {{NULL, 0}}};
    IHA_FORWARD_IF_ERROR(iha__check_args(ctx, &p, &read, in, 4, out.arg, E_OUTPUTS, 1));
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, &used, &p));
    IHA_FORWARD_IF_ERROR(iha__plan_sequences(ctx, &p));

    /* What is wanted decides what is computed: dQ, dK, dV for dx or their dW; Q, K, V for their
     * dalpha; float dQt, dKt for the inverse rotary (in place) or from 16 bits. */
    const int acc = used.accumulate != 0, want_dx = dx.mem != NULL;
    int want_tok[3], want_alpha[3], want_dw = 0, want_any_alpha = 0;
    for (int i = 0; i < 3; ++i) {
        want_dw |= out.arg[E_WQ + i].buf.mem != NULL;
        want_tok[i] = want_dx || out.arg[E_WQ + i].buf.mem != NULL;
        want_alpha[i] = out.arg[E_AQ + i].buf.mem != NULL;
        want_any_alpha |= want_alpha[i];
    }
    size_t sizes[IHA_GRAD_ROLES] = {0}, tokens = 0;
    for (int i = 0; i < 3; ++i) {
        sizes[IHA_GRAD_DQ + i] = want_tok[i] ? te : 0;
        sizes[IHA_GRAD_DQT + i] = p.act_half || (i < 2 && p.rope) ? n : 0;
        tokens += want_alpha[i] ? te : 0;
    }
    sizes[IHA_GRAD_XT] = want_dw ? p.x_elems : 0;
    sizes[IHA_GRAD_TRANSPOSED] = want_dx ? nw : 0;
    sizes[IHA_GRAD_PARTIAL] = want_any_alpha ? iha__mix_grad_partial_elements(&p.dims) : 0;
    sizes[IHA_GRAD_EDGE_IN] = (p.act_half ? p.x_elems : 0) + (p.weight_half ? 3 * nw + 4 * nm : 0);
    sizes[IHA_GRAD_EDGE_OUT] = stand_in_elements(&p, acc, &out);
    size_t terms[IHA_GRAD_ROLES + 2];
    for (int i = 0; i < IHA_GRAD_ROLES; ++i) terms[i] = sizes[i];
    terms[IHA_GRAD_ROLES] = tokens;
    terms[IHA_GRAD_ROLES + 1] = iha__plan_sequences_elements(&p);
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, sum_of(terms, IHA_GRAD_ROLES + 2), sizeof(float)));
    cl_mem t[IHA_GRAD_ROLES], tok[3] = {NULL, NULL, NULL}, rope;
    IHA_FORWARD_IF_ERROR(roles_get(ctx, sizes, t));
    static const iha_workspace_slot token_slots[3] = {IHA_WS_Q, IHA_WS_K, IHA_WS_V};
    for (int i = 0; i < 3; ++i)
        if (want_alpha[i]) IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, token_slots[i], te * sizeof(float), &tok[i]));
    IHA_FORWARD_IF_ERROR(iha__plan_rope_table(ctx, &p, &rope));
    outputs_place(&p, acc, &out, t[IHA_GRAD_EDGE_OUT]);

    /* The float views: x, the weights (the alphas after the projections), dQt, dKt, dVt. */
    const cl_mem edge = t[IHA_GRAD_EDGE_IN];
    iha_buffer xf = in_bufs[0];
    if (p.act_half) {
        xf = (iha_buffer){edge, 0};
        IHA_FORWARD_IF_ERROR(iha__convert_enqueue(ctx, p.act_storage, 0, in_bufs[0], xf, p.x_elems));
    }
    iha_layer_weights wf = read;
    iha_buffer *const ws[6] = {&wf.wq, &wf.wk, &wf.wv, &wf.alpha_q, &wf.alpha_k, &wf.alpha_v};
    for (size_t i = 0, at_in = p.act_half ? p.x_elems : 0; i < 6; at_in += i < 3 ? nw : nm, ++i)
        IHA_FORWARD_IF_ERROR(weight_float(ctx, &p, *ws[i], i < 3 ? nw : nm, (iha_buffer){edge, at_in}, ws[i]));
    iha_buffer dpseudo[3];
    for (int i = 0; i < 3; ++i)
        IHA_FORWARD_IF_ERROR(pseudo_float(ctx, &p, in_bufs[1 + i], i < 2 && p.rope, t[IHA_GRAD_DQT + i], &dpseudo[i]));
    const iha_plan pf = float_plan(&p);

    /* Q, K, V again where their mixing gradient is wanted. */
    const size_t rows = p.dims.B * p.dims.N, hd = p.dims.H * p.dims.d;
    const iha_buffer wproj[3] = {wf.wq, wf.wk, wf.wv};
    iha_buffer tokv[3];
    for (int i = 0; i < 3; ++i) {
        tokv[i] = (iha_buffer){tok[i], 0};
        if (want_alpha[i]) IHA_FORWARD_IF_ERROR(iha__project(ctx, &pf, rows, hd, p.D, xf, wproj[i], tokv[i]));
    }
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.projections, &mark));
    if (rope) {
        IHA_FORWARD_IF_ERROR(iha__rope_inverse_enqueue(ctx, &p.dims, dpseudo[0], rope));
        IHA_FORWARD_IF_ERROR(iha__rope_inverse_enqueue(ctx, &p.dims, dpseudo[1], rope));
    }
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.attention, &mark));

    /* The mixing backward, then the projections'. */
    iha_buffer dtok[3], dalphas[3], dws[3];
    unsigned add_dw = 0;
    for (int i = 0; i < 3; ++i) {
        dtok[i] = want_tok[i] ? at(t[IHA_GRAD_DQ + i]) : none;
        dalphas[i] = out.view[E_AQ + i];
        dws[i] = out.view[E_WQ + i];
        if (adds(&p, acc, &out, E_WQ + i)) add_dw |= 1u << i;
    }
    IHA_FORWARD_IF_ERROR(
        iha__mixing_backward_enqueue(ctx, &pf, &wf, tokv, dpseudo, t[IHA_GRAD_PARTIAL], dtok, dalphas));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.mixing, &mark));
    const cl_mem scratch[2] = {t[IHA_GRAD_XT], t[IHA_GRAD_TRANSPOSED]};
    IHA_FORWARD_IF_ERROR(iha__project_qkv_backward(ctx, &pf, scratch, xf, &wf, dtok, dws, add_dw, out.view[E_DX],
                                                   adds(&p, acc, &out, E_DX)));
    IHA_FORWARD_IF_ERROR(outputs_store(ctx, &p, acc, &out));
    return iha__stage_done(ctx, &ctx->stage_times.projections, &mark);
}

iha_status iha_layer_expand_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                     const iha_layer_weights *weights, size_t first_token, iha_buffer x, iha_buffer dqt,
                                     iha_buffer dkt, iha_buffer dvt, iha_buffer dx, const iha_layer_grads *grads)
{
    const iha_buffer in[4] = {x, dqt, dkt, dvt};
    iha_status st = expand_backward(ctx, shape, options, weights, first_token, in, dx, grads);
    return iha__call_end(ctx, st);
}
