/* The public layer calls as thin orchestration of the stages: projections (CLBlast), mixing,
 * attention, collapse, output projection. Half storage is converted at the edges
 * (layer/storage.h); the stages always see float. */
#include <stdint.h>
#include <string.h>

#include "common/checked.h"
#include "kernels/collapse.h"
#include "kernels/rope.h"
#include "layer/call.h"
#include "layer/plan.h"
#include "layer/project.h"
#include "layer/saved.h"
#include "layer/storage.h"
#include "layer/workspace.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"

/* Mixing, attention and collapse: float q, k, v [B][N][H][d] -> float y [B][N][H][d]. With
 * saved.mem (iha_forward_save), the attention writes O and its log-sum-exp there
 * (layer/saved.h) instead of O into workspace. */
static iha_status run_core(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, iha_buffer q, iha_buffer k,
                           iha_buffer v, iha_buffer y, iha_buffer saved, double *mark)
{
    const size_t f = sizeof(float);
    cl_mem qt, kt, vt, rope = NULL;
    iha_buffer o = iha__saved_o(saved), lse = {NULL, 0};
    iha_layer_weights mw;
    IHA_FORWARD_IF_ERROR(iha__mixing_float(ctx, p, w, &mw));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_QT, p->virtual_elems * f, &qt));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_KT, p->packed_elems * f, &kt));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_VT, p->virtual_elems * f, &vt));
    if (saved.mem != NULL)
        lse = iha__saved_lse(p, saved);
    else
        IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_O, p->virtual_elems * f, &o.mem));
    IHA_FORWARD_IF_ERROR(iha__plan_rope_table(ctx, p, &rope));

    const int kb = p->attention.key_block;
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->mix_collapse, &p->dims, q, mw.alpha_q, (iha_buffer){qt, 0}, rope, 0));
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->mix_collapse, &p->dims, k, mw.alpha_k, (iha_buffer){kt, 0}, rope, kb));
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->mix_collapse, &p->dims, v, mw.alpha_v, (iha_buffer){vt, 0}, NULL, 0));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.mixing, mark));

    IHA_FORWARD_IF_ERROR(iha__attention_enqueue(ctx, &p->attention, &p->dims, (iha_buffer){qt, 0}, (iha_buffer){kt, 0},
                                                (iha_buffer){vt, 0}, o, lse, p->mask, p->window, p->scale));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.attention, mark));

    IHA_FORWARD_IF_ERROR(iha__collapse_enqueue(ctx, &p->mix_collapse, &p->dims, o, mw.r, y));
    return iha__stage_done(ctx, &ctx->stage_times.collapse, mark);
}

/* Refuses, before any allocation, a call whose float workspace exceeds the device's memory: the
 * pseudo tensors (Qt, Vt and, unless saved, O) and packed keys, and with `token_slots` Q, K, V
 * and Y (the layer's projections, or the core's half inputs converted to float). */
static iha_status check_workspace(iha_context *ctx, const iha_plan *p, int token_slots, int saved)
{
    size_t tokens = 0, pseudo = 0, sum = 0, total = SIZE_MAX;
    if (iha__mul(p->token_elems, token_slots ? 4 : 0, &tokens) && iha__mul(p->virtual_elems, saved ? 2 : 3, &pseudo) &&
        iha__add(tokens, pseudo, &sum) && iha__add(sum, p->packed_elems, &sum) &&
        iha__add(sum, iha__plan_sequences_elements(p), &sum))
        total = sum;
    return iha__workspace_check_total(ctx, total, sizeof(float));
}

/* The opening of iha_forward and iha_attention_core: the call's plan, then its weights, the
 * projections and the model dimension with them or neither. */
static iha_status call_plan_weights(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                    const iha_layer_weights *w, int with_projections, double *mark, iha_plan *p)
{
    IHA_FORWARD_IF_ERROR(iha__call_plan(ctx, shape, options, with_projections, NULL, mark, p));
    return iha__check_weights(ctx, p, w, with_projections);
}

/* iha_forward, and with `save` iha_forward_save. */
static iha_status forward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                          const iha_layer_weights *w, iha_buffer x, iha_buffer z, int save, iha_buffer saved)
{
    double mark;
    iha_plan p;
    IHA_FORWARD_IF_ERROR(call_plan_weights(ctx, shape, options, w, 1, &mark, &p));
    const size_t a = p.act_bytes;
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, x, p.x_elems, a, "x"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, z, p.x_elems, a, "z"));
    IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, z, p.x_elems, x, p.x_elems, a, "z", "x"));
    IHA_FORWARD_IF_ERROR(iha__check_apart_from_weights(ctx, &p, w, 1, z, p.x_elems, "z"));
    if (save) IHA_FORWARD_IF_ERROR(iha__check_saved(ctx, &p, w, saved, x, z, "z", "iha_forward_save"));
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, options, &p));
    IHA_FORWARD_IF_ERROR(iha__plan_sequences(ctx, &p));
    IHA_FORWARD_IF_ERROR(check_workspace(ctx, &p, 1, save));

    const size_t f = sizeof(float);
    cl_mem q, k, v, y;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Q, p.token_elems * f, &q));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_K, p.token_elems * f, &k));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_V, p.token_elems * f, &v));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Y, p.token_elems * f, &y));
    iha_buffer xf, zf;
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, x, p.x_elems, IHA_WS_X, &xf));
    IHA_FORWARD_IF_ERROR(iha__output_float(ctx, &p, z, p.x_elems, IHA_WS_OUT, &zf));

    IHA_FORWARD_IF_ERROR(iha__project_qkv(ctx, &p, xf, w, (iha_buffer){q, 0}, (iha_buffer){k, 0}, (iha_buffer){v, 0}));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.projections, &mark));

    IHA_FORWARD_IF_ERROR(
        run_core(ctx, &p, w, (iha_buffer){q, 0}, (iha_buffer){k, 0}, (iha_buffer){v, 0}, (iha_buffer){y, 0}, saved, &mark));

    IHA_FORWARD_IF_ERROR(iha__project_output(ctx, &p, (iha_buffer){y, 0}, w->wo, zf));
    IHA_FORWARD_IF_ERROR(iha__output_finish(ctx, &p, zf, z, p.x_elems));
    return iha__stage_done(ctx, &ctx->stage_times.output, &mark);
}

iha_status iha_forward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                       const iha_layer_weights *weights, iha_buffer x, iha_buffer z)
{
    iha_status st = forward(ctx, shape, options, weights, x, z, 0, (iha_buffer){NULL, 0});
    return iha__call_end(ctx, st);
}

iha_status iha_forward_save(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            const iha_layer_weights *weights, iha_buffer x, iha_buffer z, iha_buffer saved)
{
    iha_status st = forward(ctx, shape, options, weights, x, z, 1, saved);
    return iha__call_end(ctx, st);
}

static iha_status attention_core(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                 const iha_layer_weights *w, iha_buffer q, iha_buffer k, iha_buffer v, iha_buffer y)
{
    double mark;
    iha_plan p;
    IHA_FORWARD_IF_ERROR(call_plan_weights(ctx, shape, options, w, 0, &mark, &p));
    const size_t n = p.token_elems, a = p.act_bytes;
    static const char *const names[3] = {"q", "k", "v"};
    IHA_FORWARD_IF_ERROR(iha__check_inputs_output(ctx, (iha_buffer[3]){q, k, v}, names, y, "y", n, a));
    IHA_FORWARD_IF_ERROR(iha__check_apart_from_weights(ctx, &p, w, 0, y, n, "y"));
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, options, &p));
    IHA_FORWARD_IF_ERROR(iha__plan_sequences(ctx, &p));
    IHA_FORWARD_IF_ERROR(check_workspace(ctx, &p, p.act_half, 0));
    iha_buffer qf, kf, vf, yf;
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, q, n, IHA_WS_Q, &qf));
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, k, n, IHA_WS_K, &kf));
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, v, n, IHA_WS_V, &vf));
    IHA_FORWARD_IF_ERROR(iha__output_float(ctx, &p, y, n, IHA_WS_Y, &yf));
    IHA_FORWARD_IF_ERROR(run_core(ctx, &p, w, qf, kf, vf, yf, (iha_buffer){NULL, 0}, &mark));
    return iha__output_finish(ctx, &p, yf, y, n);
}

iha_status iha_attention_core(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                              const iha_layer_weights *weights, iha_buffer q, iha_buffer k, iha_buffer v,
                              iha_buffer y)
{
    iha_status st = attention_core(ctx, shape, options, weights, q, k, v, y);
    return iha__call_end(ctx, st);
}

static iha_status attention(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o, iha_buffer lse)
{
    double mark;
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__call_plan(ctx, shape, options, 0, "iha_attention", &mark, &p));
    const size_t n = p.virtual_elems, a = p.act_bytes, f = sizeof(float);
    static const char *const names[3] = {"qt", "kt", "vt"};
    IHA_FORWARD_IF_ERROR(iha__check_inputs_output(ctx, (iha_buffer[3]){qt, kt, vt}, names, o, "o", n, a));
    if (lse.mem != NULL) {
        /* lse is float whatever the storage of o and the inputs. */
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, lse, p.lse_elems, f, "lse"));
        const iha_buffer others[4] = {o, qt, kt, vt};
        static const char *const names[4] = {"o", "qt", "kt", "vt"};
        for (int i = 0; i < 4; ++i)
            IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, lse, p.lse_elems, f, others[i], n, a, "lse", names[i]));
    }
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, options, &p));
    IHA_FORWARD_IF_ERROR(iha__plan_sequences(ctx, &p));
    /* Workspace: the packed keys, and float copies of half inputs and output. */
    size_t total = SIZE_MAX, copies;
    if (iha__mul(n, p.act_half ? 4 : 0, &copies) && iha__add(copies, iha__plan_sequences_elements(&p), &copies))
        iha__add(copies, p.packed_elems, &total);
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, total, f));
    iha_buffer qf, kf, vf, of;
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, qt, n, IHA_WS_QT, &qf));
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, kt, n, IHA_WS_X, &kf));
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, vt, n, IHA_WS_VT, &vf));
    IHA_FORWARD_IF_ERROR(iha__output_float(ctx, &p, o, n, IHA_WS_O, &of));
    cl_mem packed;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_KT, p.packed_elems * f, &packed));
    IHA_FORWARD_IF_ERROR(iha__pack_keys_enqueue(ctx, &p.dims, kf, (iha_buffer){packed, 0}, p.attention.key_block));
    IHA_FORWARD_IF_ERROR(iha__attention_enqueue(ctx, &p.attention, &p.dims, qf, (iha_buffer){packed, 0}, vf, of,
                                                lse, p.mask, p.window, p.scale));
    IHA_FORWARD_IF_ERROR(iha__output_finish(ctx, &p, of, o, n));
    return iha__stage_done(ctx, &ctx->stage_times.attention, &mark);
}

iha_status iha_attention(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                         iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o, iha_buffer lse)
{
    iha_status st = attention(ctx, shape, options, qt, kt, vt, o, lse);
    return iha__call_end(ctx, st);
}

void iha_attention_options_init(iha_attention_options *options)
{
    if (options == NULL) return;
    memset(options, 0, sizeof *options);
    options->mask = IHA_MASK_CAUSAL;
}
