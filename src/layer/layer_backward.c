/* iha_backward and iha_backward_saved: the whole layer's backward pass (doc/spec.md, "The backward
 * pass"). The forward's activations are recomputed from x (all of them, or with saved state
 * all but the attention's output and log-sum-exp), then the stages run backwards: output
 * projection, collapse, attention (the attention backward's kernels), inverse rotary, mixing,
 * projections. Every argument is checked before anything is enqueued. Half storage is
 * converted at the edges: float copies of x, dz and the weights in, float results converted
 * into the half outputs at the end; everything between runs in float. */
#include <limits.h>
#include <stdint.h>

#include "common/checked.h"
#include "gemm/sgemm.h"
#include "kernels/attention_backward.h"
#include "kernels/collapse.h"
#include "kernels/convert.h"
#include "kernels/layer_backward.h"
#include "kernels/rope.h"
#include "layer/call.h"
#include "layer/plan.h"
#include "layer/project.h"
#include "layer/saved.h"
#include "layer/storage.h"
#include "layer/workspace.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"

/* The call's own tensors, each in workspace slot IHA_WS_GRAD + role. The forward's slots hold
 * what they hold in iha_forward (Q, K, V, Y, and the packed keys in IHA_WS_KT); the attention
 * backward's packed Q and dO and its partial dq sums share the forward's pseudo-tensor slots
 * (layer/workspace.h), so the pseudo tensors it reads live here. */
enum {
    G_DY, G_DQ, G_DK, G_DV,                /* token tensors [B][N][H][d] */
    G_QT, G_KT, G_VT, G_O, G_DO,           /* pseudo tensors [B][H][T][d], keys as rows */
    G_DQT, G_DKT, G_DVT,
    G_LSE,                                 /* [B][H][T] */
    G_XT,                                  /* x transposed [D][B*N] */
    G_TRANSPOSED,                          /* one weight or Y transposed at a time */
    G_PARTIAL,                             /* the mixing gradients' partial sums */
    G_EDGE_IN,                             /* half storage: x, dz, then the 8 weights, as float */
    G_EDGE_OUT,                            /* half storage: dx, then the 8 gradients, as float */
    G_ROLES
};
_Static_assert(G_ROLES <= IHA_WS_GRAD_SLOTS, "the layer backward needs more workspace slots");

/* The call's outputs by name, and as one array for what is done to each alike (checks, half
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

typedef struct grad_buffers {
    cl_mem t[G_ROLES];
    iha_buffer o, lse; /* the G_O and G_LSE slots, or the caller's saved state */
    cl_mem q, k, v, y, packed_keys;
    cl_mem delta, packed[2], partial; /* the attention backward's: Dt, and on CPUs Q, dO packed and
                                         the partial dq sums */
} grad_buffers;

static iha_buffer at(cl_mem m) { return (iha_buffer){m, 0}; }

/* Element counts of the roles' slots into sizes (0: not allocated; with saved state, O and its
 * LSE are the caller's); returns the total of every buffer the call allocates (each slot
 * counted once), 0 on overflow. `partial`: the tile kernel's partial sums (0 without it). */
static size_t workspace_elements(const iha_plan *p, int tiled, int saved, size_t partial, size_t sizes[G_ROLES])
{
    const size_t te = p->token_elems, ve = p->virtual_elems, tr = te > p->w_elems ? te : p->w_elems;
    const size_t o = saved ? 0 : ve, lse = saved ? 0 : p->lse_elems;
    /* The edges: iha__plan_make bounds x_elems and w_elems by SIZE_MAX / 8 and mix_elems by
     * H*H*P <= INT_MAX (checked before this), so these sums do not overflow. */
    const size_t weights = p->weight_half ? 4 * p->w_elems + 4 * p->mix_elems : 0;
    const size_t in = (p->act_half ? 2 * p->x_elems : 0) + weights, out = (p->act_half ? p->x_elems : 0) + weights;
    const size_t fixed[G_ROLES] = {te, te, te, te, ve, ve, ve, o, ve, ve, ve, ve, lse, p->x_elems, tr,
                                   iha__mix_grad_partial_elements(&p->dims), in, out};
    size_t total = 0;
    for (int i = 0; i < G_ROLES; ++i) {
        sizes[i] = fixed[i];
        if (!iha__add(total, fixed[i], &total)) return 0;
    }
    /* Q, K, V, Y, the forward's packed keys, Dt, and with the tile kernel its packed Q and dO
     * and partial sums. */
    const size_t packed16 = iha__packed_keys_elements(&p->dims, 16);
    size_t more = 0;
    if (!iha__mul(te, 4, &more) || !iha__add(total, more, &total) ||
        !iha__add(total, saved ? 0 : p->packed_elems, &total) || !iha__add(total, p->lse_elems, &total) ||
        !iha__mul(packed16, tiled ? 2 : 0, &more) || !iha__add(total, more, &total) ||
        !iha__add(total, partial, &total))
        return 0;
    return total;
}

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

/* Half storage at the edges. Into the float views: x and dz, and every weight (NULL stays NULL,
 * the identity shortcut), converted into G_EDGE_IN; the outputs that are half get float
 * stand-ins in G_EDGE_OUT. Float tensors are their own views. */
static iha_status edges_in(iha_context *ctx, const iha_plan *p, const grad_buffers *g, const iha_layer_weights *w,
                           iha_buffer *x, iha_buffer *dz, iha_layer_weights *wf, const grad_outputs *outputs,
                           grad_outputs *floats)
{
    *wf = *w;
    *floats = *outputs;
    cl_mem in = g->t[G_EDGE_IN], res = g->t[G_EDGE_OUT];
    size_t at_in = 0, at_out = 0;
    if (p->act_half) {
        iha_buffer *acts[2] = {x, dz};
        for (int i = 0; i < 2; ++i, at_in += p->x_elems) {
            IHA_FORWARD_IF_ERROR(
                iha__convert_enqueue(ctx, p->act_storage, 0, *acts[i], (iha_buffer){in, at_in}, p->x_elems));
            *acts[i] = (iha_buffer){in, at_in};
        }
        if (outputs->dx.mem != NULL) floats->dx = (iha_buffer){res, 0};
        at_out = p->x_elems;
    }
    if (!p->weight_half) return IHA_OK;
    iha_buffer *ws[8] = {&wf->wq, &wf->wk, &wf->wv, &wf->wo, &wf->alpha_q, &wf->alpha_k, &wf->alpha_v, &wf->r};
    const iha_buffer *dw[8] = {&outputs->wq,      &outputs->wk,      &outputs->wv,      &outputs->wo,
                               &outputs->alpha_q, &outputs->alpha_k, &outputs->alpha_v, &outputs->r};
    iha_buffer *dwf[8] = {&floats->wq,      &floats->wk,      &floats->wv,      &floats->wo,
                          &floats->alpha_q, &floats->alpha_k, &floats->alpha_v, &floats->r};
    for (int i = 0; i < 8; ++i) {
        const size_t n = i < 4 ? p->w_elems : p->mix_elems;
        if (ws[i]->mem != NULL) {
            IHA_FORWARD_IF_ERROR(iha__convert_enqueue(ctx, p->weight_storage, 0, *ws[i], (iha_buffer){in, at_in}, n));
            *ws[i] = (iha_buffer){in, at_in};
        }
        if (dw[i]->mem != NULL) *dwf[i] = (iha_buffer){res, at_out};
        at_in += n;
        at_out += n;
    }
    return IHA_OK;
}

/* The 16-bit outputs from their float stand-ins (dx first, in the activations' storage). */
static iha_status edges_out(iha_context *ctx, const iha_plan *p, const grad_outputs *out, const grad_outputs *outf)
{
    size_t elems[OUTPUTS], bytes[OUTPUTS];
    output_layout(p, elems, bytes);
    for (int i = 0; i < OUTPUTS; ++i)
        if (out->all[i].mem != NULL && bytes[i] != sizeof(float))
            IHA_FORWARD_IF_ERROR(iha__convert_enqueue(ctx, i == 0 ? p->act_storage : p->weight_storage, 1, outf->all[i],
                                                      out->all[i], elems[i]));
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
    const size_t rows = p->dims.B * p->dims.N, hd = p->dims.H * p->dims.d;
    IHA_FORWARD_IF_ERROR(iha__project(ctx, pr->plan, rows, hd, p->D, x, pr->w->wq, at(g->q)));
    IHA_FORWARD_IF_ERROR(iha__project(ctx, pr->plan, rows, hd, p->D, x, pr->w->wk, at(g->k)));
    IHA_FORWARD_IF_ERROR(iha__project(ctx, pr->plan, rows, hd, p->D, x, pr->w->wv, at(g->v)));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.projections, mark));

    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->mix_collapse, &p->dims, at(g->q), w->alpha_q, at(g->t[G_QT]), rope, 0));
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->mix_collapse, &p->dims, at(g->k), w->alpha_k, at(g->t[G_KT]), rope, 0));
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->mix_collapse, &p->dims, at(g->v), w->alpha_v, at(g->t[G_VT]), NULL, 0));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.mixing, mark));

    if (!saved) {
        IHA_FORWARD_IF_ERROR(
            iha__pack_keys_enqueue(ctx, &p->dims, at(g->t[G_KT]), at(g->packed_keys), p->attention.key_block));
        IHA_FORWARD_IF_ERROR(iha__attention_enqueue(ctx, &p->attention, &p->dims, at(g->t[G_QT]), at(g->packed_keys),
                                                    at(g->t[G_VT]), g->o, g->lse, p->mask, p->window, p->scale));
        IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.attention, mark));
    }
    if (want_y) {
        IHA_FORWARD_IF_ERROR(iha__collapse_enqueue(ctx, &p->mix_collapse, &p->dims, g->o, w->r, at(g->y)));
        IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.collapse, mark));
    }
    return IHA_OK;
}

/* c [m][n] (= or +=) a [m][k] * transpose of b_t, where b_t is [n][k]: b_t is transposed into
 * the G_TRANSPOSED slot first (the in-order queue runs the product before the next transpose
 * overwrites it). */
static iha_status product_bt(iha_context *ctx, const grad_buffers *g, size_t m, size_t n, size_t k, iha_buffer a,
                             iha_buffer b_t, iha_buffer c, int accumulate)
{
    cl_mem t = g->t[G_TRANSPOSED];
    IHA_FORWARD_IF_ERROR(iha__transpose_enqueue(ctx, n, k, b_t, k, at(t), n));
    if (accumulate) return iha__sgemm_acc(ctx, m, n, k, a.mem, a.offset, k, t, 0, n, c.mem, c.offset, n);
    return iha__sgemm(ctx, m, n, k, a.mem, a.offset, k, t, 0, n, c.mem, c.offset, n);
}

/* The stages: the forward again, then backwards through the output projection, collapse,
 * attention and the rotation, mixing, and the projections. */
static iha_status run_stages(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, const projections *pr,
                             iha_buffer x, iha_buffer dz, int saved, const grad_outputs *out, const grad_buffers *g,
                             cl_mem rope, double *mark)
{
    const iha_dims *dims = &p->dims;
    const size_t rows = dims->B * dims->N, hd = dims->H * dims->d, D = p->D;
    IHA_FORWARD_IF_ERROR(recompute(ctx, p, w, pr, x, g, rope, saved, out->wo.mem != NULL, mark));

    /* Output projection: dY = dZ W_O^T, dW_O = Y^T dZ. */
    const iha_buffer dy = at(g->t[G_DY]), dzr = dz;
    IHA_FORWARD_IF_ERROR(product_bt(ctx, g, rows, hd, D, dzr, w->wo, dy, 0));
    if (out->wo.mem != NULL) {
        cl_mem yt = g->t[G_TRANSPOSED];
        IHA_FORWARD_IF_ERROR(iha__transpose_enqueue(ctx, rows, hd, at(g->y), hd, at(yt), rows));
        IHA_FORWARD_IF_ERROR(
            iha__sgemm(ctx, hd, D, rows, yt, 0, rows, dz.mem, dz.offset, D, out->wo.mem, out->wo.offset, D));
    }
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.output, mark));

    /* Collapse: dO = the mixing of dY with R (R[h][m][p] has alpha's layout, source h, target
     * m), dR = G(dY, O). */
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->mix_collapse, dims, dy, w->r, at(g->t[G_DO]), NULL, 0));
    if (out->r.mem != NULL)
        IHA_FORWARD_IF_ERROR(iha__mix_grad_enqueue(ctx, dims, dy, g->o, g->t[G_PARTIAL], out->r));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.collapse, mark));

    /* Attention, then the rotation's gradient. */
    iha_backward_refs r = {at(g->t[G_QT]), at(g->t[G_KT]), at(g->t[G_VT]), g->o, g->lse,
                           at(g->t[G_DO]), at(g->t[G_DQT]), at(g->t[G_DKT]), at(g->t[G_DVT]), g->delta,
                           {g->packed[0], g->packed[1]}, g->partial};
    IHA_FORWARD_IF_ERROR(iha__attention_backward_enqueue(ctx, dims, &r, p->mask, p->window, p->scale));
    if (rope) {
        IHA_FORWARD_IF_ERROR(iha__rope_inverse_enqueue(ctx, dims, r.dqt, rope));
        IHA_FORWARD_IF_ERROR(iha__rope_inverse_enqueue(ctx, dims, r.dkt, rope));
    }
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.attention, mark));

    /* Mixing: dQ = the collapse of dQt with alpha_Q (alpha[m][h][p] has R's layout, target m,
     * source h), dalpha_Q = G(Q, dQt); K and V alike. */
    const iha_buffer dpseudo[3] = {r.dqt, r.dkt, r.dvt}, dtok[3] = {at(g->t[G_DQ]), at(g->t[G_DK]), at(g->t[G_DV])};
    const iha_buffer alphas[3] = {w->alpha_q, w->alpha_k, w->alpha_v};
    const iha_buffer dalphas[3] = {out->alpha_q, out->alpha_k, out->alpha_v};
    const cl_mem tokens[3] = {g->q, g->k, g->v};
    for (int i = 0; i < 3; ++i) {
        IHA_FORWARD_IF_ERROR(iha__collapse_enqueue(ctx, &p->mix_collapse, dims, dpseudo[i], alphas[i], dtok[i]));
        if (dalphas[i].mem != NULL)
            IHA_FORWARD_IF_ERROR(iha__mix_grad_enqueue(ctx, dims, at(tokens[i]), dpseudo[i], g->t[G_PARTIAL],
                                                       dalphas[i]));
    }
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.mixing, mark));

    /* Projections: dW = X^T dQ (and K, V), dX = dQ W_Q^T + dK W_K^T + dV W_V^T. */
    const iha_buffer dws[3] = {out->wq, out->wk, out->wv};
    if (dws[0].mem != NULL || dws[1].mem != NULL || dws[2].mem != NULL) {
        cl_mem xt = g->t[G_XT];
        IHA_FORWARD_IF_ERROR(iha__transpose_enqueue(ctx, rows, D, x, D, at(xt), rows));
        for (int i = 0; i < 3; ++i)
            if (dws[i].mem != NULL)
                IHA_FORWARD_IF_ERROR(
                    iha__sgemm(ctx, D, hd, rows, xt, 0, rows, dtok[i].mem, 0, hd, dws[i].mem, dws[i].offset, hd));
    }
    if (out->dx.mem != NULL) {
        const iha_buffer ws[3] = {w->wq, w->wk, w->wv};
        for (int i = 0; i < 3; ++i)
            IHA_FORWARD_IF_ERROR(product_bt(ctx, g, rows, D, hd, dtok[i], ws[i], out->dx, i > 0));
    }
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
    return iha__plan_choose(ctx, shape, options, p);
}

/* Every buffer the call uses, allocated before the first enqueue, so that a device that cannot
 * hold one refuses the call before anything is written; and the rotary table. */
static iha_status plan_buffers(iha_context *ctx, const iha_plan *p, int from_saved, iha_buffer saved, grad_buffers *g,
                               cl_mem *rope)
{
    const size_t f = sizeof(float), rows = p->dims.B * p->dims.N;
    const int tiled = iha__attention_backward_tiled(ctx, p->dims.d);
    size_t sizes[G_ROLES], partial = 0;
    size_t total = !tiled || iha__attention_backward_partial_elements(ctx, &p->dims, &partial)
                       ? workspace_elements(p, tiled, from_saved, partial, sizes)
                       : 0;
    const size_t converted_weight = iha__project_workspace_elements(p, rows);
    if (total && !iha__add(total, converted_weight, &total)) total = 0;
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, total ? total : SIZE_MAX, f));

    for (int i = 0; i < G_ROLES; ++i) {
        g->t[i] = NULL;
        if (sizes[i] > 0)
            IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, (iha_workspace_slot)(IHA_WS_GRAD + i), sizes[i] * f, &g->t[i]));
    }
    g->o = from_saved ? iha__saved_o(saved) : at(g->t[G_O]);
    g->lse = from_saved ? iha__saved_lse(p, saved) : at(g->t[G_LSE]);
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Q, p->token_elems * f, &g->q));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_K, p->token_elems * f, &g->k));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_V, p->token_elems * f, &g->v));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Y, p->token_elems * f, &g->y));
    const size_t packed16 = iha__packed_keys_elements(&p->dims, 16);
    g->packed_keys = g->packed[0] = g->packed[1] = g->partial = NULL;
    if (!from_saved) IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_KT, p->packed_elems * f, &g->packed_keys));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_DELTA, p->lse_elems * f, &g->delta));
    if (tiled) {
        IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_PACKED_Q, packed16 * f, &g->packed[0]));
        IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_PACKED_DO, packed16 * f, &g->packed[1]));
        IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_DQ_PARTIAL, partial * f, &g->partial));
    }
    cl_mem converted = NULL;
    if (converted_weight > 0)
        IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_WEIGHT, converted_weight * f, &converted));
    *rope = NULL;
    if (p->rope) IHA_FORWARD_IF_ERROR(iha__rope_table(ctx, p->dims.T, p->dims.d, p->rope_base, rope));
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
    grad_buffers g;
    cl_mem rope;
    IHA_FORWARD_IF_ERROR(plan_buffers(ctx, &p, from_saved, saved, &g, &rope));
    /* From here on everything is float: the stages run on the float views with a plan that
     * says so (the projections would otherwise convert the already converted weights), except
     * the forward's three projections, which run as iha_forward ran them. */
    iha_layer_weights wf;
    grad_outputs outf;
    IHA_FORWARD_IF_ERROR(edges_in(ctx, &p, &g, w, &x, &dz, &wf, &out, &outf));
    iha_plan pf = p;
    pf.act_half = pf.weight_half = 0;
    pf.act_storage = pf.weight_storage = IHA_STORAGE_F32;
    pf.act_bytes = pf.weight_bytes = sizeof(float);
    const projections pr = {&p, w};
    IHA_FORWARD_IF_ERROR(run_stages(ctx, &pf, &wf, &pr, x, dz, from_saved, &outf, &g, rope, &mark));
    return edges_out(ctx, &p, &out, &outf);
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
