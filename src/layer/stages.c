/* iha_layer_expand and iha_layer_collapse: iha_forward's stages before and after its attention
 * step, as calls of their own (include/iha.h, "Layer stages"). The stages are forward.c's:
 * projections, mixing with the rotary table from the run's first position, collapse, output
 * projection. Every argument is checked before anything is enqueued; 16-bit storage is
 * converted at the edges (layer/storage.h). */
#include <limits.h>
#include <stdint.h>

#include "common/checked.h"
#include "kernels/collapse.h"
#include "layer/call.h"
#include "layer/project.h"
#include "layer/stages.h"
#include "layer/storage.h"
#include "layer/workspace.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"

iha_status iha__stage_plan(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options, int rotary,
                           size_t first_token, const iha_layer_weights *w, unsigned reads, double *mark, iha_plan *p,
                           iha_attention_options *used, iha_layer_weights *read)
{
    IHA_FORWARD_IF_ERROR(iha__call_begin(ctx, mark));
    IHA_RETURN_ERROR_IF(options == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "options is NULL");
    iha_attention_options_init(used);
    used->storage = options->storage;
    used->weight_storage = options->weight_storage;
    used->accumulate = options->accumulate;
    if (rotary) {
        used->rope = options->rope;
        used->rope_base = options->rope_base;
        used->seq_lens = options->seq_lens;
        used->seq_count = options->seq_count;
    }
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, used, 1, p));
    if (!rotary) return iha__check_weights_read(ctx, p, w, reads, read);
    IHA_RETURN_ERROR_IF(p->seq_lens != NULL && first_token != 0, ctx, IHA_ERROR_UNSUPPORTED,
                        "with packed sequences (options->seq_lens) first_token must be 0, got %zu", first_token);
    /* The rotary table covers the run's positions, which the kernels' int positions bound (as
     * iha_attention_partial's blocks); without rotary first_token changes nothing. */
    size_t end;
    IHA_RETURN_ERROR_IF(p->rope && (!iha__add(first_token, p->dims.N, &end) || end > (size_t)(INT_MAX / 4) / p->dims.P),
                        ctx, IHA_ERROR_UNSUPPORTED,
                        "first_token %zu + tokens %zu, times pseudo %zu, runs past the kernels' virtual positions "
                        "(at most %d)",
                        first_token, p->dims.N, p->dims.P, INT_MAX / 4);
    p->rope_first = first_token * p->dims.P;
    return iha__check_weights_read(ctx, p, w, reads, read);
}

/* The floats of a stage's workspace: `fixed` of its own, and with 16-bit activations float
 * copies of `act_copies` elements, with 16-bit weights float mixing weights, the projections'
 * converted weight and the packed sequences' tables; SIZE_MAX on overflow. */
static size_t stage_workspace(const iha_plan *p, size_t fixed, size_t act_copies)
{
    size_t total;
    const size_t mixing = p->weight_half ? 4 * p->mix_elems : 0; /* H*H*P <= INT_MAX (iha__plan_make) */
    if (iha__add(fixed, p->act_half ? act_copies : 0, &total) && iha__add(total, mixing, &total) &&
        iha__add(total, iha__project_workspace_elements(p, p->dims.B * p->dims.N), &total) &&
        iha__add(total, iha__plan_sequences_elements(p), &total))
        return total;
    return SIZE_MAX;
}

static iha_status layer_expand(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                               const iha_layer_weights *w, size_t first_token, iha_buffer x, iha_buffer qt,
                               iha_buffer kt, iha_buffer vt)
{
    double mark;
    iha_plan p;
    iha_attention_options used;
    iha_layer_weights read;
    IHA_FORWARD_IF_ERROR(iha__stage_plan(ctx, shape, options, 1, first_token, w, IHA_READS_WQKV | IHA_READS_ALPHAS,
                                         &mark, &p, &used, &read));
    const size_t a = p.act_bytes, n = p.virtual_elems, te = p.token_elems, f = sizeof(float);
    const iha_arg in[1] = {{x, p.x_elems, a, "x"}};
    const iha_arg out[3] = {{qt, n, a, "qt"}, {kt, n, a, "kt"}, {vt, n, a, "vt"}};
    IHA_FORWARD_IF_ERROR(iha__check_args(ctx, &p, &read, in, 1, out, 3, 0));
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, &used, &p));
    IHA_FORWARD_IF_ERROR(iha__plan_sequences(ctx, &p));
    /* Q, K, V; with 16-bit activations float x and float Qt, Kt, Vt. iha__plan_make bounds
     * B*N*H*d, B*N*D and B*H*T*d by SIZE_MAX / 8, so these sums do not overflow. */
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, stage_workspace(&p, 3 * te, p.x_elems + 3 * n), f));

    cl_mem m[3], rope;
    static const iha_workspace_slot token_slots[3] = {IHA_WS_Q, IHA_WS_K, IHA_WS_V};
    for (int i = 0; i < 3; ++i) IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, token_slots[i], te * f, &m[i]));
    const iha_buffer tok[3] = {{m[0], 0}, {m[1], 0}, {m[2], 0}}, dst[3] = {qt, kt, vt};
    static const iha_workspace_slot pseudo_slots[3] = {IHA_WS_QT, IHA_WS_KT, IHA_WS_VT};
    iha_buffer xf, dstf[3];
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, x, p.x_elems, IHA_WS_X, &xf));
    for (int i = 0; i < 3; ++i) IHA_FORWARD_IF_ERROR(iha__output_float(ctx, &p, dst[i], n, pseudo_slots[i], &dstf[i]));
    IHA_FORWARD_IF_ERROR(iha__plan_rope_table(ctx, &p, &rope));

    IHA_FORWARD_IF_ERROR(iha__project_qkv(ctx, &p, xf, &read, tok[0], tok[1], tok[2]));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.projections, &mark));
    iha_layer_weights mw;
    IHA_FORWARD_IF_ERROR(iha__mixing_float(ctx, &p, &read, &mw));
    const iha_buffer alphas[3] = {mw.alpha_q, mw.alpha_k, mw.alpha_v};
    for (int i = 0; i < 3; ++i) {
        /* Rows, not the attention kernel's key blocks: the caller's layout. */
        IHA_FORWARD_IF_ERROR(
            iha__mix_enqueue(ctx, &p.mix_collapse, &p.dims, tok[i], alphas[i], dstf[i], i < 2 ? rope : NULL, 0));
        IHA_FORWARD_IF_ERROR(iha__output_finish(ctx, &p, dstf[i], dst[i], n));
    }
    return iha__stage_done(ctx, &ctx->stage_times.mixing, &mark);
}

iha_status iha_layer_expand(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            const iha_layer_weights *weights, size_t first_token, iha_buffer x, iha_buffer qt,
                            iha_buffer kt, iha_buffer vt)
{
    iha_status st = layer_expand(ctx, shape, options, weights, first_token, x, qt, kt, vt);
    return iha__call_end(ctx, st);
}

static iha_status layer_collapse(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                 const iha_layer_weights *w, iha_buffer o, iha_buffer z)
{
    double mark;
    iha_plan p;
    iha_attention_options used;
    iha_layer_weights read;
    IHA_FORWARD_IF_ERROR(
        iha__stage_plan(ctx, shape, options, 0, 0, w, IHA_READS_WO | IHA_READS_R, &mark, &p, &used, &read));
    const size_t a = p.act_bytes, n = p.virtual_elems, f = sizeof(float);
    const iha_arg in[1] = {{o, n, a, "o"}};
    const iha_arg out[1] = {{z, p.x_elems, a, "z"}};
    IHA_FORWARD_IF_ERROR(iha__check_args(ctx, &p, &read, in, 1, out, 1, 0));
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, &used, &p));
    /* Y; with 16-bit activations float O and float Z. */
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, stage_workspace(&p, p.token_elems, n + p.x_elems), f));

    cl_mem y;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Y, p.token_elems * f, &y));
    iha_buffer of, zf;
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, o, n, IHA_WS_O, &of));
    IHA_FORWARD_IF_ERROR(iha__output_float(ctx, &p, z, p.x_elems, IHA_WS_OUT, &zf));
    iha_layer_weights mw;
    IHA_FORWARD_IF_ERROR(iha__mixing_float(ctx, &p, &read, &mw));
    IHA_FORWARD_IF_ERROR(iha__collapse_enqueue(ctx, &p.mix_collapse, &p.dims, of, mw.r, (iha_buffer){y, 0}));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.collapse, &mark));
    IHA_FORWARD_IF_ERROR(iha__project_output(ctx, &p, (iha_buffer){y, 0}, read.wo, zf));
    IHA_FORWARD_IF_ERROR(iha__output_finish(ctx, &p, zf, z, p.x_elems));
    return iha__stage_done(ctx, &ctx->stage_times.output, &mark);
}

iha_status iha_layer_collapse(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                              const iha_layer_weights *weights, iha_buffer o, iha_buffer z)
{
    iha_status st = layer_collapse(ctx, shape, options, weights, o, z);
    return iha__call_end(ctx, st);
}
