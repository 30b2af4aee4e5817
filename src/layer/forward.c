/* The public layer calls as thin orchestration of the stages: projections (CLBlast), mixing,
 * attention, collapse, output projection. */
#include <string.h>

#include "gemm/gemm.h"
#include "layer/call.h"
#include "layer/plan.h"

/* Mixing, attention and collapse: q, k, v [B][N][H][d] -> y [B][N][H][d]. */
static iha_status run_core(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, iha_ref q, iha_ref k,
                           iha_ref v, iha_ref y, double *mark)
{
    const size_t f = sizeof(float);
    cl_mem qt, kt, vt, o, rope = NULL;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_QT, p->virtual_elems * f, &qt));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_KT, p->packed_elems * f, &kt));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_VT, p->virtual_elems * f, &vt));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_O, p->virtual_elems * f, &o));
    if (p->rope) IHA_FORWARD_IF_ERROR(iha__rope_table(ctx, p->dims.T, p->dims.d, p->rope_base, &rope));

    const int kb = p->attention.key_block;
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->rows, &p->dims, q, iha__ref_of(w->alpha_q), (iha_ref){qt, 0}, rope, 0));
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->rows, &p->dims, k, iha__ref_of(w->alpha_k), (iha_ref){kt, 0}, rope, kb));
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &p->rows, &p->dims, v, iha__ref_of(w->alpha_v), (iha_ref){vt, 0}, NULL, 0));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.mixing, mark));

    IHA_FORWARD_IF_ERROR(iha__attention_enqueue(ctx, &p->attention, &p->dims, (iha_ref){qt, 0}, (iha_ref){kt, 0},
                                                (iha_ref){vt, 0}, (iha_ref){o, 0}, (iha_ref){NULL, 0}, p->mask,
                                                p->window, p->scale));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.attention, mark));

    IHA_FORWARD_IF_ERROR(iha__collapse_enqueue(ctx, &p->rows, &p->dims, (iha_ref){o, 0}, iha__ref_of(w->r), y));
    return iha__stage_done(ctx, &ctx->stage_times.collapse, mark);
}

static iha_status forward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                          const iha_layer_weights *w, iha_buffer x, iha_buffer z)
{
    double mark;
    IHA_FORWARD_IF_ERROR(iha__call_begin(ctx, &mark));
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 1, &p));
    IHA_FORWARD_IF_ERROR(iha__check_weights(ctx, &p, w, 1));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, x, p.x_elems, "x"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, z, p.x_elems, "z"));
    IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, z, p.x_elems, x, p.x_elems, "z", "x"));
    IHA_FORWARD_IF_ERROR(iha__check_apart_from_weights(ctx, &p, w, 1, z, p.x_elems, "z"));

    const size_t f = sizeof(float), rows = p.dims.B * p.dims.N, hd = p.dims.H * p.dims.d;
    cl_mem q, k, v, y;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Q, p.token_elems * f, &q));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_K, p.token_elems * f, &k));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_V, p.token_elems * f, &v));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Y, p.token_elems * f, &y));

    IHA_FORWARD_IF_ERROR(iha__sgemm(ctx, rows, hd, p.D, x.mem, x.offset, p.D, w->wq.mem, w->wq.offset, hd, q, 0, hd));
    IHA_FORWARD_IF_ERROR(iha__sgemm(ctx, rows, hd, p.D, x.mem, x.offset, p.D, w->wk.mem, w->wk.offset, hd, k, 0, hd));
    IHA_FORWARD_IF_ERROR(iha__sgemm(ctx, rows, hd, p.D, x.mem, x.offset, p.D, w->wv.mem, w->wv.offset, hd, v, 0, hd));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.projections, &mark));

    IHA_FORWARD_IF_ERROR(run_core(ctx, &p, w, (iha_ref){q, 0}, (iha_ref){k, 0}, (iha_ref){v, 0}, (iha_ref){y, 0}, &mark));

    IHA_FORWARD_IF_ERROR(iha__sgemm(ctx, rows, p.D, hd, y, 0, hd, w->wo.mem, w->wo.offset, p.D, z.mem, z.offset, p.D));
    return iha__stage_done(ctx, &ctx->stage_times.output, &mark);
}

iha_status iha_forward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                       const iha_layer_weights *weights, iha_buffer x, iha_buffer z)
{
    iha_status st = forward(ctx, shape, options, weights, x, z);
    if (st == IHA_OK) iha__program_cache_flush(ctx);
    return st;
}

static iha_status attention_core(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                 const iha_layer_weights *w, iha_buffer q, iha_buffer k, iha_buffer v, iha_buffer y)
{
    double mark;
    IHA_FORWARD_IF_ERROR(iha__call_begin(ctx, &mark));
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 0, &p));
    IHA_FORWARD_IF_ERROR(iha__check_weights(ctx, &p, w, 0));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, q, p.token_elems, "q"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, k, p.token_elems, "k"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, v, p.token_elems, "v"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, y, p.token_elems, "y"));
    IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, y, p.token_elems, q, p.token_elems, "y", "q"));
    IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, y, p.token_elems, k, p.token_elems, "y", "k"));
    IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, y, p.token_elems, v, p.token_elems, "y", "v"));
    IHA_FORWARD_IF_ERROR(iha__check_apart_from_weights(ctx, &p, w, 0, y, p.token_elems, "y"));
    return run_core(ctx, &p, w, iha__ref_of(q), iha__ref_of(k), iha__ref_of(v), iha__ref_of(y), &mark);
}

iha_status iha_attention_core(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                              const iha_layer_weights *weights, iha_buffer q, iha_buffer k, iha_buffer v,
                              iha_buffer y)
{
    iha_status st = attention_core(ctx, shape, options, weights, q, k, v, y);
    if (st == IHA_OK) iha__program_cache_flush(ctx);
    return st;
}

static iha_status attention(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o, iha_buffer lse)
{
    double mark;
    IHA_FORWARD_IF_ERROR(iha__call_begin(ctx, &mark));
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 0, &p));
    IHA_RETURN_ERROR_IF(p.rope, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "iha_attention takes already rotated inputs: options->rope must be 0");
    const size_t n = p.virtual_elems;
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, qt, n, "qt"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, kt, n, "kt"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, vt, n, "vt"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, o, n, "o"));
    IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, o, n, qt, n, "o", "qt"));
    IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, o, n, kt, n, "o", "kt"));
    IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, o, n, vt, n, "o", "vt"));
    if (lse.mem != NULL) {
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, lse, p.lse_elems, "lse"));
        IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, lse, p.lse_elems, o, n, "lse", "o"));
        IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, lse, p.lse_elems, qt, n, "lse", "qt"));
        IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, lse, p.lse_elems, kt, n, "lse", "kt"));
        IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, lse, p.lse_elems, vt, n, "lse", "vt"));
    }
    cl_mem packed;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_KT, p.packed_elems * sizeof(float), &packed));
    IHA_FORWARD_IF_ERROR(iha__pack_keys_enqueue(ctx, &p.dims, iha__ref_of(kt), (iha_ref){packed, 0}, p.attention.key_block));
    IHA_FORWARD_IF_ERROR(iha__attention_enqueue(ctx, &p.attention, &p.dims, iha__ref_of(qt), (iha_ref){packed, 0},
                                                iha__ref_of(vt), iha__ref_of(o), iha__ref_of(lse), p.mask, p.window, p.scale));
    return iha__stage_done(ctx, &ctx->stage_times.attention, &mark);
}

iha_status iha_attention(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                         iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o, iha_buffer lse)
{
    iha_status st = attention(ctx, shape, options, qt, kt, vt, o, lse);
    if (st == IHA_OK) iha__program_cache_flush(ctx);
    return st;
}

void iha_attention_options_init(iha_attention_options *options)
{
    if (options == NULL) return;
    memset(options, 0, sizeof *options);
    options->mask = IHA_MASK_CAUSAL;
}
