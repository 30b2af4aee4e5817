/* iha_backward and iha_backward_saved: the whole layer's backward pass (doc/spec.md, "The backward
 * pass"). The forward's activations are recomputed from x (all of them, or with saved state
 * all but the attention's output and log-sum-exp), then the stages run backwards: output
 * projection, the core (collapse, attention, inverse rotary, mixing: layer/core_backward.h),
 * projections. Every argument is checked before anything is enqueued. Half storage is
 * converted at the edges: float copies of x, dz and the weights in, float results converted
 * into the half outputs (or added into the outputs, options->accumulate) at the end; everything
 * between runs in float. */
#include <limits.h>
#include <stdint.h>

#include "common/checked.h"
#include "gemm/sgemm.h"
#include "kernels/collapse.h"
#include "kernels/convert.h"
#include "kernels/layer_backward.h"
#include "kernels/rope.h"
#include "layer/call.h"
#include "layer/core_backward.h"
#include "layer/plan.h"
#include "layer/project.h"
#include "layer/saved.h"
#include "layer/storage.h"
#include "layer/workspace.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"

/* The call's outputs by name, and as one array for what is done to each alike (checks, float
 * stand-ins): dx in the activations' storage, the eight gradients in the weights'. A NULL mem is
 * an output that is not wanted. */
#define OUTPUTS 9
typedef union grad_outputs {
    struct {
        iha_buffer dx;
        iha_buffer wq, wk, wv, wo;
        iha_buffer alpha_q, alpha_k, alpha_v, r;
    };
    iha_buffer all[OUTPUTS];
} grad_outputs;
_Static_assert(sizeof(grad_outputs) == OUTPUTS * sizeof(iha_buffer), "grad_outputs: its names and its array differ");

/* The core's buffers (layer/core_backward.h), the layer's roles among them, and Y. */
typedef struct grad_buffers {
    iha_grad_buffers c;
    cl_mem y;
} grad_buffers;

static iha_buffer at(cl_mem m) { return (iha_buffer){m, 0}; }

/* Element counts and sizes of the outputs: dx in the activations' storage, the gradients in
 * the weights'. */
static void output_layout(const iha_plan *p, size_t elems[OUTPUTS], size_t bytes[OUTPUTS])
{
    for (int i = 0; i < OUTPUTS; ++i) {
        elems[i] = i == 0 ? p->x_elems : i < 5 ? p->w_elems : p->mix_elems;
        bytes[i] = i == 0 ? p->act_bytes : p->weight_bytes;
    }
}

/* Checks every output: its size, apart from the inputs (x, dz, and saved when its mem is not
 * NULL) and weights, disjoint from the others. */
static iha_status check_outputs(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, iha_buffer x,
                                iha_buffer dz, iha_buffer saved, const grad_outputs *outputs)
{
    static const char *const names[OUTPUTS] = {"dx", "grads->wq", "grads->wk", "grads->wv", "grads->wo",
                                         "grads->alpha_q", "grads->alpha_k", "grads->alpha_v", "grads->r"};
    const size_t f = sizeof(float), a = p->act_bytes;
    const iha_buffer *out = outputs->all;
    size_t elems[OUTPUTS], bytes[OUTPUTS];
    output_layout(p, elems, bytes);
    for (int i = 0; i < OUTPUTS; ++i) {
        if (out[i].mem == NULL) continue;
        const size_t n = elems[i], b = bytes[i];
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, out[i], n, b, names[i]));
        IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, out[i], n, b, x, p->x_elems, a, names[i], "x"));
        IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, out[i], n, b, dz, p->x_elems, a, names[i], "dz"));
        if (saved.mem != NULL)
            IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, out[i], n, b, saved, iha__saved_elements(p), f, names[i], "saved"));
        IHA_FORWARD_IF_ERROR(iha__check_apart_from_weights_bytes(ctx, p, w, 1, out[i], n, b, names[i]));
        for (int j = 0; j < i; ++j)
            if (out[j].mem != NULL)
                IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, out[i], n, b, out[j], elems[j], bytes[j], names[i], names[j]));
    }
    return IHA_OK;
}

/* Whether output i is computed into a float stand-in (layer/storage.h): it is half, or it is
 * added into and is not the result of a product (dx and dW_Q, dW_K, dW_V, dW_O are, and add
 * themselves with beta = 1). */
static int stand_in(const iha_plan *p, int accumulate, int i)
{
    return iha__grad_stand_in(i == 0 ? iha__act_storage(p) : iha__weight_storage(p), accumulate && i >= 5);
}

/* The stand-ins' floats, all of them in IHA_GRAD_EDGE_OUT in output order, wanted or not. */
static size_t stand_in_elements(const iha_plan *p, int accumulate)
{
    size_t elems[OUTPUTS], bytes[OUTPUTS], total = 0;
    output_layout(p, elems, bytes);
    for (int i = 0; i < OUTPUTS; ++i) total += stand_in(p, accumulate, i) ? elems[i] : 0;
    return total; /* iha__plan_make bounds B*N*D and D*H*d by SIZE_MAX / 8, H*H*P is checked */
}

/* The edges. Into the float views: with half storage x and dz, and every weight (NULL stays
 * NULL, the identity shortcut), converted into IHA_GRAD_EDGE_IN; the outputs that need one get
 * their stand-in in IHA_GRAD_EDGE_OUT. Float tensors are their own views. */
static iha_status edges_in(iha_context *ctx, const iha_plan *p, int accumulate, const grad_buffers *g,
                           const iha_layer_weights *w, iha_buffer *x, iha_buffer *dz, iha_layer_weights *wf,
                           const grad_outputs *outputs, grad_outputs *floats)
{
    *wf = *w;
    *floats = *outputs;
    cl_mem in = g->c.t[IHA_GRAD_EDGE_IN], res = g->c.t[IHA_GRAD_EDGE_OUT];
    size_t at_in = 0, at_out = 0;
    if (p->act_half) {
        iha_buffer *acts[2] = {x, dz};
        for (int i = 0; i < 2; ++i, at_in += p->x_elems) {
            IHA_FORWARD_IF_ERROR(
                iha__convert_enqueue(ctx, p->act_storage, 0, *acts[i], (iha_buffer){in, at_in}, p->x_elems));
            *acts[i] = (iha_buffer){in, at_in};
        }
    }
    if (p->weight_half) {
        iha_buffer *ws[8] = {&wf->wq, &wf->wk, &wf->wv, &wf->wo, &wf->alpha_q, &wf->alpha_k, &wf->alpha_v, &wf->r};
        for (int i = 0; i < 8; ++i) {
            const size_t n = i < 4 ? p->w_elems : p->mix_elems;
            if (ws[i]->mem != NULL) {
                IHA_FORWARD_IF_ERROR(iha__convert_enqueue(ctx, p->weight_storage, 0, *ws[i], (iha_buffer){in, at_in}, n));
                *ws[i] = (iha_buffer){in, at_in};
            }
            at_in += n;
        }
    }
    size_t elems[OUTPUTS], bytes[OUTPUTS];
    output_layout(p, elems, bytes);
    for (int i = 0; i < OUTPUTS; ++i) {
        if (!stand_in(p, accumulate, i)) continue;
        if (outputs->all[i].mem != NULL) floats->all[i] = (iha_buffer){res, at_out};
        at_out += elems[i];
    }
    return IHA_OK;
}

/* The outputs from their float stand-ins: converted, or added into. */
static iha_status edges_out(iha_context *ctx, const iha_plan *p, int accumulate, const grad_outputs *out,
                            const grad_outputs *outf)
{
    size_t elems[OUTPUTS], bytes[OUTPUTS];
    output_layout(p, elems, bytes);
    for (int i = 0; i < OUTPUTS; ++i)
        if (out->all[i].mem != NULL && stand_in(p, accumulate, i))
            IHA_FORWARD_IF_ERROR(iha__grad_store(ctx, i == 0 ? iha__act_storage(p) : iha__weight_storage(p),
                                                 accumulate, outf->all[i], out->all[i], elems[i]));
    return IHA_OK;
}

/* What the forward's projections read: the plan and weights in the caller's storage. With half
 * weights iha_forward reads them directly for a few rows (the GEMV kernel) and converts them for
 * more; recomputing through the same path keeps Q, K, V and all that follows bit for bit the
 * forward's, which the saved state (O and its LSE from iha_forward_save) relies on. */
typedef struct projections {
    const iha_plan *plan;
    const iha_layer_weights *w;
} projections;

/* The forward pass again, keeping what the backward reads: Q, K, V, the pseudo tensors as rows,
 * O and its LSE (unless `saved`: the caller kept them), and Y when dW_O is wanted. */
static iha_status recompute(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, const projections *pr,
                            iha_buffer x, const grad_buffers *g, cl_mem rope, int saved, int want_y, double *mark)
{
    IHA_FORWARD_IF_ERROR(iha__project_qkv(ctx, pr->plan, x, pr->w, g->c.q, g->c.k, g->c.v));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.projections, mark));
    IHA_FORWARD_IF_ERROR(iha__core_forward_again(ctx, p, w, &g->c, rope, saved, mark));
    if (want_y) {
        IHA_FORWARD_IF_ERROR(iha__collapse_enqueue(ctx, &p->mix_collapse, &p->dims, g->c.o, w->r, at(g->y)));
        IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.collapse, mark));
    }
    return IHA_OK;
}

/* The stages: the forward again, then backwards through the output projection, the core
 * (collapse, attention and the rotation, mixing), and the projections. Bit i of `add`: the
 * product that computes output i adds into it. */
static iha_status run_stages(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, const projections *pr,
                             iha_buffer x, iha_buffer dz, int saved, const grad_outputs *out, unsigned add,
                             const grad_buffers *g, cl_mem rope, double *mark)
{
    IHA_FORWARD_IF_ERROR(recompute(ctx, p, w, pr, x, g, rope, saved, out->wo.mem != NULL, mark));

    /* Output projection: dY = dZ W_O^T, dW_O = Y^T dZ. */
    const iha_buffer dy = at(g->c.t[IHA_GRAD_DY]);
    IHA_FORWARD_IF_ERROR(iha__project_output_backward(ctx, p, g->c.t[IHA_GRAD_TRANSPOSED], dz, w->wo, at(g->y), dy,
                                                      out->wo, add >> 4 & 1u));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.output, mark));

    /* The core: dQ, dK, dV into their slots, and the mixing and collapse gradients. */
    const iha_buffer dtok[3] = {at(g->c.t[IHA_GRAD_DQ]), at(g->c.t[IHA_GRAD_DK]), at(g->c.t[IHA_GRAD_DV])};
    const iha_core_grads core = {dtok[0], dtok[1], dtok[2], out->alpha_q, out->alpha_k, out->alpha_v, out->r};
    IHA_FORWARD_IF_ERROR(iha__core_backward_stages(ctx, p, w, &g->c, dy, &core, rope, mark));

    /* Projections: dW = X^T dQ (and K, V), dX = dQ W_Q^T + dK W_K^T + dV W_V^T. */
    const cl_mem scratch[2] = {g->c.t[IHA_GRAD_XT], g->c.t[IHA_GRAD_TRANSPOSED]};
    const iha_buffer dws[3] = {out->wq, out->wk, out->wv};
    IHA_FORWARD_IF_ERROR(iha__project_qkv_backward(ctx, p, scratch, x, w, dtok, dws, add >> 1 & 7u, out->dx, add & 1u));
    return iha__stage_done(ctx, &ctx->stage_times.projections, mark);
}

/* Checks the call's arguments, in the caller's storage, and chooses its kernels into *p. saved
 * becomes {NULL, 0} without from_saved. */
static iha_status check_call(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                             const iha_layer_weights *w, iha_buffer x, int from_saved, iha_buffer *saved,
                             iha_buffer dz, const grad_outputs *out, iha_plan *p)
{
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 1, p));
    IHA_RETURN_ERROR_IF(w == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "weights is NULL");
    IHA_FORWARD_IF_ERROR(iha__check_weights(ctx, p, w, 1));
    const size_t rows = p->dims.B * p->dims.N, hd = p->dims.H * p->dims.d;
    /* The transposes and products index rows and columns as int, the mixing gradients their
     * H*H*P outputs. */
    IHA_RETURN_ERROR_IF(rows > INT_MAX / 2 || p->D > INT_MAX / 2 || hd > INT_MAX / 2, ctx, IHA_ERROR_UNSUPPORTED,
                        "iha_backward: batch*tokens (%zu), model_dim (%zu) and heads*head_dim (%zu) must each be at "
                        "most %d",
                        rows, p->D, hd, INT_MAX / 2);
    IHA_RETURN_ERROR_IF(p->mix_elems > INT_MAX, ctx, IHA_ERROR_UNSUPPORTED,
                        "iha_backward: heads*heads*pseudo (%zu) must be at most %d", p->mix_elems, INT_MAX);
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, x, p->x_elems, p->act_bytes, "x"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, dz, p->x_elems, p->act_bytes, "dz"));
    if (from_saved)
        IHA_FORWARD_IF_ERROR(iha__check_saved(ctx, p, w, *saved, x, dz, "dz", "iha_backward_saved"));
    else
        *saved = (iha_buffer){NULL, 0};
    IHA_FORWARD_IF_ERROR(check_outputs(ctx, p, w, x, dz, *saved, out));
    IHA_FORWARD_IF_ERROR(iha__plan_choose_backward(ctx, shape, options, p));
    return iha__plan_sequences(ctx, p);
}

/* The floats of every buffer the call uses into sizes (the roles) and *total (each slot counted
 * once, the core's, Q, K, V, Y and the forward's converted weight among them); *total is 0 on
 * overflow. */
static void workspace_elements(const iha_context *ctx, const iha_plan *p, int saved, int accumulate,
                               size_t sizes[IHA_GRAD_ROLES], size_t *total)
{
    for (int i = 0; i < IHA_GRAD_ROLES; ++i) sizes[i] = 0;
    *total = iha__core_grad_elements(ctx, p, saved, sizes);
    const size_t te = p->token_elems, tr = te > p->w_elems ? te : p->w_elems;
    /* The edges: iha__plan_make bounds x_elems and w_elems by SIZE_MAX / 8 and mix_elems by
     * H*H*P <= INT_MAX (checked before this), so these sums do not overflow. */
    const size_t weights = p->weight_half ? 4 * p->w_elems + 4 * p->mix_elems : 0;
    sizes[IHA_GRAD_DY] = sizes[IHA_GRAD_DQ] = sizes[IHA_GRAD_DK] = sizes[IHA_GRAD_DV] = te;
    sizes[IHA_GRAD_XT] = p->x_elems;
    sizes[IHA_GRAD_TRANSPOSED] = tr;
    sizes[IHA_GRAD_EDGE_IN] = (p->act_half ? 2 * p->x_elems : 0) + weights;
    sizes[IHA_GRAD_EDGE_OUT] = stand_in_elements(p, accumulate);
    static const int own[] = {IHA_GRAD_DY, IHA_GRAD_DQ,         IHA_GRAD_DK,      IHA_GRAD_DV,
                              IHA_GRAD_XT, IHA_GRAD_TRANSPOSED, IHA_GRAD_EDGE_IN, IHA_GRAD_EDGE_OUT};
    size_t qkvy = 0;
    for (size_t i = 0; i < sizeof own / sizeof own[0] && *total; ++i)
        if (!iha__add(*total, sizes[own[i]], total)) *total = 0;
    if (*total && !(iha__mul(te, 4, &qkvy) && iha__add(*total, qkvy, total) &&
                    iha__add(*total, iha__project_workspace_elements(p, p->dims.B * p->dims.N), total) &&
                    iha__add(*total, iha__plan_sequences_elements(p), total)))
        *total = 0;
}

/* Every buffer the call uses, allocated before the first enqueue, so that a device that cannot
 * hold one refuses the call before anything is written; and the rotary table. */
static iha_status plan_buffers(iha_context *ctx, const iha_plan *p, int accumulate, iha_buffer saved, grad_buffers *g,
                               cl_mem *rope)
{
    const size_t f = sizeof(float), converted_weight = iha__project_workspace_elements(p, p->dims.B * p->dims.N);
    size_t sizes[IHA_GRAD_ROLES], total;
    workspace_elements(ctx, p, saved.mem != NULL, accumulate, sizes, &total);
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, total ? total : SIZE_MAX, f));
    IHA_FORWARD_IF_ERROR(iha__core_grad_buffers(ctx, p, saved, sizes, &g->c));
    cl_mem q, k, v;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Q, p->token_elems * f, &q));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_K, p->token_elems * f, &k));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_V, p->token_elems * f, &v));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Y, p->token_elems * f, &g->y));
    g->c.q = at(q), g->c.k = at(k), g->c.v = at(v);
    cl_mem converted = NULL;
    if (converted_weight > 0)
        IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_WEIGHT, converted_weight * f, &converted));
    IHA_FORWARD_IF_ERROR(iha__plan_rope_table(ctx, p, rope));
    return IHA_OK;
}

/* iha_backward, and with `from_saved` iha_backward_saved: check, plan, run. */
static iha_status layer_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                 const iha_layer_weights *w, iha_buffer x, int from_saved, iha_buffer saved,
                                 iha_buffer dz, iha_buffer dx, const iha_layer_grads *grads)
{
    double mark;
    IHA_FORWARD_IF_ERROR(iha__call_begin(ctx, &mark));
    grad_outputs out = {.dx = dx};
    if (grads != NULL) {
        out.wq = grads->wq, out.wk = grads->wk, out.wv = grads->wv, out.wo = grads->wo;
        out.alpha_q = grads->alpha_q, out.alpha_k = grads->alpha_k, out.alpha_v = grads->alpha_v, out.r = grads->r;
    }
    iha_plan p;
    IHA_FORWARD_IF_ERROR(check_call(ctx, shape, options, w, x, from_saved, &saved, dz, &out, &p));
    const int acc = options->accumulate != 0;
    grad_buffers g;
    cl_mem rope;
    IHA_FORWARD_IF_ERROR(plan_buffers(ctx, &p, acc, saved, &g, &rope));
    /* From here on everything is float: the stages run on the float views with a plan that
     * says so (the projections would otherwise convert the already converted weights), except
     * the forward's three projections, which run as iha_forward ran them. The products that
     * write an output that has no stand-in add into it when accumulating. */
    iha_layer_weights wf;
    grad_outputs outf;
    IHA_FORWARD_IF_ERROR(edges_in(ctx, &p, acc, &g, w, &x, &dz, &wf, &out, &outf));
    unsigned add = 0;
    for (int i = 0; i < 5; ++i)
        if (acc && !stand_in(&p, acc, i)) add |= 1u << i;
    iha_plan pf = p;
    pf.act_half = pf.weight_half = 0;
    pf.act_storage = pf.weight_storage = IHA_STORAGE_F32;
    pf.act_bytes = pf.weight_bytes = sizeof(float);
    const projections pr = {&p, w};
    IHA_FORWARD_IF_ERROR(run_stages(ctx, &pf, &wf, &pr, x, dz, from_saved, &outf, add, &g, rope, &mark));
    return edges_out(ctx, &p, acc, &out, &outf);
}

iha_status iha_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                        const iha_layer_weights *weights, iha_buffer x, iha_buffer dz, iha_buffer dx,
                        const iha_layer_grads *grads)
{
    iha_status st = layer_backward(ctx, shape, options, weights, x, 0, (iha_buffer){NULL, 0}, dz, dx, grads);
    return iha__call_end(ctx, st);
}

iha_status iha_backward_saved(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                              const iha_layer_weights *weights, iha_buffer x, iha_buffer saved, iha_buffer dz,
                              iha_buffer dx, const iha_layer_grads *grads)
{
    iha_status st = layer_backward(ctx, shape, options, weights, x, 1, saved, dz, dx, grads);
    return iha__call_end(ctx, st);
}
