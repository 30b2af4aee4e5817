/* iha_attention_unfused: attention as GEMM, softmax, GEMM over a materialised score matrix,
 * the baseline that the fused kernel of iha_attention is measured against. */
#include "common/checked.h"
#include "gemm/sgemm.h"
#include "layer/plan.h"
#include "measure/measure.h"
#include "measure/softmax.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"

static iha_status check_call(iha_context *ctx, const iha_plan *p, iha_buffer qt, iha_buffer kt, iha_buffer vt,
                             iha_buffer o)
{
    IHA_RETURN_ERROR_IF(p->rope, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "iha_attention_unfused takes already rotated inputs: options->rope must be 0");
    IHA_RETURN_ERROR_IF(p->act_half, ctx, IHA_ERROR_UNSUPPORTED,
                        "iha_attention_unfused is a float32 baseline: options->storage must be IHA_STORAGE_F32");
    static const char *const names[3] = {"qt", "kt", "vt"};
    return iha__check_inputs_output(ctx, (iha_buffer[3]){qt, kt, vt}, names, o, "o", p->virtual_elems, sizeof(float));
}

/* The score matrix of one (b, h): T*T floats in one buffer, or IHA_ERROR_UNSUPPORTED. */
static iha_status scores_buffer(iha_context *ctx, size_t T, cl_mem *out)
{
    size_t bytes;
    const int fits = iha__mul(T, T, &bytes) && iha__mul(bytes, sizeof(float), &bytes) &&
                     bytes <= ctx->info.max_alloc_bytes;
    IHA_RETURN_ERROR_IF(!fits, ctx, IHA_ERROR_UNSUPPORTED,
                        "the unfused baseline needs a %zu x %zu score matrix in one buffer, more than the device's "
                        "largest allocation (%llu bytes)",
                        T, T, (unsigned long long)ctx->info.max_alloc_bytes);
    return iha__workspace_get(ctx, IHA_WS_SCORES, bytes, out);
}

static iha_status unfused(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                          iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o)
{
    IHA_FORWARD_IF_ERROR(iha__measure_begin(ctx));
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 0, &p));
    IHA_RETURN_ERROR_IF(p.seq_lens != NULL, ctx, IHA_ERROR_UNSUPPORTED,
                        "iha_attention_unfused: packed sequences (seq_lens) are not supported");
    IHA_FORWARD_IF_ERROR(iha__plan_lookup(ctx, shape, options, &p)); /* the context's GEMM backend */
    IHA_FORWARD_IF_ERROR(check_call(ctx, &p, qt, kt, vt, o));
    const size_t T = p.dims.T, d = p.dims.d, seq = T * d; /* T*d fits: the plan checked B*H*T*d */
    cl_mem s;
    IHA_FORWARD_IF_ERROR(scores_buffer(ctx, T, &s));
    /* One (b, h) at a time bounds memory to one score matrix; the in-order queue serialises
     * the reuse of s. */
    for (size_t bh = 0; bh < p.dims.B * p.dims.H; ++bh) {
        const size_t at = bh * seq;
        IHA_FORWARD_IF_ERROR(iha__sgemm_ex(ctx, 1, T, T, d, p.scale, qt.mem, qt.offset + at, d, kt.mem,
                                           kt.offset + at, d, s, 0, T));
        IHA_FORWARD_IF_ERROR(iha__softmax_rows_enqueue(ctx, s, 0, T, p.dims.P, p.mask, p.window));
        IHA_FORWARD_IF_ERROR(iha__sgemm_ex(ctx, 0, T, d, T, 1.0f, s, 0, T, vt.mem, vt.offset + at, d, o.mem,
                                           o.offset + at, d));
    }
    return IHA_OK;
}

iha_status iha_attention_unfused(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                 iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o)
{
    iha_status st = unfused(ctx, shape, options, qt, kt, vt, o);
    return iha__call_end(ctx, st);
}
