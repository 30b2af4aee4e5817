/* Shape, option and buffer validation; the sizes derived from a shape, overflow-checked. */
#include "layer/plan.h"
#include "layer/call.h"
#include "runtime/error.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "common/checked.h"
#include "tune/choose.h"

#define IHA_MAX_HEAD_DIM 256
#define IHA_LOG2E 1.4426950408889634

/* options->seq_lens (doc/spec.md, "Packed sequences"): lengths of at least 1 token, in order over
 * the B*N tokens, each within one batch row, together B*N. */
static iha_status check_sequences(iha_context *ctx, const iha_attention_options *o, iha_plan *p)
{
    const size_t B = p->dims.B, N = p->dims.N;
    IHA_RETURN_ERROR_IF(o->seq_lens == NULL && o->seq_count != 0, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "seq_count is %zu but seq_lens is NULL", o->seq_count);
    IHA_RETURN_ERROR_IF(o->seq_lens != NULL && o->seq_count == 0, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "seq_lens is given but seq_count is 0");
    if (o->seq_lens == NULL) return IHA_OK;
    IHA_RETURN_ERROR_IF(o->seq_count > B * N, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "seq_count %zu exceeds the call's %zu tokens (batch %zu x tokens %zu)", o->seq_count, B * N, B,
                        N);
    size_t start = 0; /* the sequence's first token, over the B*N tokens */
    for (size_t i = 0; i < o->seq_count; ++i) {
        const size_t len = o->seq_lens[i];
        IHA_RETURN_ERROR_IF(len == 0, ctx, IHA_ERROR_INVALID_ARGUMENT, "seq_lens[%zu] is 0: a sequence holds at least 1 token",
                            i);
        IHA_RETURN_ERROR_IF(len > B * N - start, ctx, IHA_ERROR_INVALID_ARGUMENT,
                            "seq_lens[%zu] = %zu runs past the call's %zu tokens (it starts at token %zu)", i, len,
                            B * N, start);
        IHA_RETURN_ERROR_IF(start / N != (start + len - 1) / N, ctx, IHA_ERROR_INVALID_ARGUMENT,
                            "seq_lens[%zu] = %zu crosses from batch row %zu into row %zu (rows of %zu tokens)", i, len,
                            start / N, (start + len - 1) / N, N);
        start += len;
    }
    IHA_RETURN_ERROR_IF(start != B * N, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "seq_lens sum to %zu tokens, not the call's %zu (batch %zu x tokens %zu)", start, B * N, B, N);
    p->seq_lens = o->seq_lens;
    p->seq_count = o->seq_count;
    return IHA_OK;
}

int iha__storage_known(int storage)
{
    return storage == IHA_STORAGE_F32 || storage == IHA_STORAGE_F16 || storage == IHA_STORAGE_BF16;
}

static iha_status check_options(iha_context *ctx, const iha_attention_options *o, iha_plan *p)
{
    IHA_RETURN_ERROR_IF(o->mask != IHA_MASK_CAUSAL && o->mask != IHA_MASK_TOKEN_CAUSAL && o->mask != IHA_MASK_NONE,
                        ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "unknown mask %d (use IHA_MASK_CAUSAL, IHA_MASK_TOKEN_CAUSAL or IHA_MASK_NONE)", o->mask);
    IHA_RETURN_ERROR_IF(o->window < 0, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "window must be 0 (global) or a positive number of tokens, got %lld", (long long)o->window);
    IHA_RETURN_ERROR_IF(!isfinite(o->scale), ctx, IHA_ERROR_INVALID_ARGUMENT, "scale must be finite, got %g",
                        (double)o->scale);
    /* The kernels fold log2(e) into the scale (they work in base 2): a scale whose product with
     * it is not a float would turn every score into infinity or NaN (doc/numerics.md). */
    IHA_RETURN_ERROR_IF(fabs((double)o->scale) * IHA_LOG2E > FLT_MAX, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "scale %g is too large: times log2(e) it overflows float32 (|scale| at most %g)",
                        (double)o->scale, FLT_MAX / IHA_LOG2E);
    IHA_RETURN_ERROR_IF(o->rope && (p->dims.d % 2 != 0), ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "rotary embedding needs an even head width, got d=%zu", p->dims.d);
    IHA_RETURN_ERROR_IF(o->rope && (!isfinite(o->rope_base) || o->rope_base < 0.0f), ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "rope_base must be positive and finite (0 for the default 10000), got %g",
                        (double)o->rope_base);
    p->mask = o->mask;
    /* A window of N tokens or more hides nothing: treat it as global, which also keeps
     * window*P inside int range in the kernels. */
    p->window = (uint64_t)o->window >= p->dims.N ? 0 : (size_t)o->window;
    p->scale = o->scale != 0.0f ? o->scale : (float)(1.0 / sqrt((double)p->dims.d));
    p->rope = o->rope != 0;
    p->rope_base = o->rope_base != 0.0f ? o->rope_base : 10000.0f;
    IHA_RETURN_ERROR_IF(!iha__storage_known(o->storage), ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "unknown storage %d (use IHA_STORAGE_F32, IHA_STORAGE_F16 or IHA_STORAGE_BF16)", o->storage);
    IHA_RETURN_ERROR_IF(!iha__storage_known(o->weight_storage), ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "unknown weight_storage %d (use IHA_STORAGE_F32, IHA_STORAGE_F16 or IHA_STORAGE_BF16)",
                        o->weight_storage);
    p->act_storage = o->storage;
    p->weight_storage = o->weight_storage;
    p->act_half = o->storage != IHA_STORAGE_F32;
    p->weight_half = o->weight_storage != IHA_STORAGE_F32;
    p->act_bytes = p->act_half ? 2 : 4;
    p->weight_bytes = p->weight_half ? 2 : 4;
    return check_sequences(ctx, o, p);
}

/* The packed keys' size depends on the chosen key block. */
static iha_status size_packed_keys(iha_context *ctx, iha_plan *p)
{
    p->packed_elems = iha__packed_keys_elements(&p->dims, p->attention.key_block);
    IHA_RETURN_ERROR_IF(p->packed_elems == 0 || p->packed_elems > SIZE_MAX / 8, ctx, IHA_ERROR_SIZE_OVERFLOW,
                        "the packed key buffer's size overflows size_t");
    return IHA_OK;
}

iha_status iha__call_plan(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                          int with_model_dim, const char *rotated_call, double *mark, iha_plan *p)
{
    IHA_FORWARD_IF_ERROR(iha__call_begin(ctx, mark));
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, with_model_dim, p));
    IHA_RETURN_ERROR_IF(rotated_call != NULL && p->rope, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "%s takes already rotated inputs: options->rope must be 0", rotated_call);
    return IHA_OK;
}

iha_status iha__plan_make(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                          int with_model_dim, iha_plan *p)
{
    IHA_RETURN_ERROR_IF(shape == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "shape is NULL");
    IHA_RETURN_ERROR_IF(options == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "options is NULL");
    memset(p, 0, sizeof *p);
    const size_t B = shape->batch, N = shape->tokens, H = shape->heads, d = shape->head_dim, P = shape->pseudo;
    const size_t D = with_model_dim ? shape->model_dim : 1;
    IHA_RETURN_ERROR_IF(B == 0 || N == 0 || H == 0 || d == 0 || P == 0 || D == 0, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "every dimension must be at least 1 (batch=%zu tokens=%zu model_dim=%zu heads=%zu "
                        "head_dim=%zu pseudo=%zu)",
                        B, N, shape->model_dim, H, d, P);
    IHA_RETURN_ERROR_IF(d > IHA_MAX_HEAD_DIM, ctx, IHA_ERROR_INVALID_ARGUMENT, "head_dim %zu exceeds the maximum of %d",
                        d, IHA_MAX_HEAD_DIM);

    size_t T, HP;
    const size_t fx[3] = {B, N, D}, ftok[4] = {B, N, H, d}, fw[3] = {D, H, d}, fmix[3] = {H, H, P};
    int ok = iha__mul(N, P, &T) && iha__mul(H, P, &HP) && iha__mul_n(&p->x_elems, 3, fx) &&
             iha__mul_n(&p->token_elems, 4, ftok) && iha__mul_n(&p->w_elems, 3, fw) &&
             iha__mul_n(&p->mix_elems, 3, fmix);
    if (ok) {
        const size_t fvirt[4] = {B, H, T, d}, flse[3] = {B, H, T};
        ok = iha__mul_n(&p->virtual_elems, 4, fvirt) && iha__mul_n(&p->lse_elems, 3, flse) &&
             iha__mul(T, d, &(size_t){0}) && T <= SIZE_MAX - 64;
    }
    /* Bytes too: every element count is later multiplied by sizeof(float). */
    ok = ok && p->x_elems <= SIZE_MAX / 8 && p->token_elems <= SIZE_MAX / 8 && p->virtual_elems <= SIZE_MAX / 8 &&
         p->w_elems <= SIZE_MAX / 8;
    IHA_RETURN_ERROR_IF(!ok, ctx, IHA_ERROR_SIZE_OVERFLOW,
                        "the shape's sizes overflow size_t (batch=%zu tokens=%zu heads=%zu head_dim=%zu pseudo=%zu "
                        "model_dim=%zu)",
                        B, N, H, d, P, shape->model_dim);
    /* Kernels index within one sequence with int and multiply by at most 2T. */
    IHA_RETURN_ERROR_IF(T > INT_MAX / 4, ctx, IHA_ERROR_UNSUPPORTED,
                        "the virtual sequence T = N*P = %zu exceeds the kernels' limit of %d", T, INT_MAX / 4);
    /* The kernels hold a (b, h) index in an int. */
    IHA_RETURN_ERROR_IF(HP > INT_MAX || B * H > INT_MAX, ctx, IHA_ERROR_UNSUPPORTED,
                        "heads*pseudo = %zu or batch*heads = %zu exceeds the kernels' 32-bit indexing", HP, B * H);
    IHA_RETURN_ERROR_IF(N * D > INT_MAX * (size_t)8, ctx, IHA_ERROR_UNSUPPORTED,
                        "tokens*model_dim = %zu exceeds the kernels' limit of %zu", N * D, INT_MAX * (size_t)8);

    p->dims = (iha_dims){B, N, H, d, P, T, NULL};
    p->D = D;
    return check_options(ctx, options, p);
}

iha_status iha__plan_lookup(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            iha_plan *p)
{
    IHA_FORWARD_IF_ERROR(iha__tune_choose(ctx, shape, options, &p->attention, &p->mix_collapse, 0));
    return size_packed_keys(ctx, p);
}

iha_status iha__plan_choose(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            iha_plan *p)
{
    IHA_FORWARD_IF_ERROR(
        iha__tune_choose(ctx, shape, options, &p->attention, &p->mix_collapse, IHA_CHOOSE_TUNE | IHA_CHOOSE_RECORD));
    return size_packed_keys(ctx, p);
}

iha_status iha__plan_choose_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                     iha_plan *p)
{
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, options, p));
    return iha__tune_choose_backward(ctx, shape, options, IHA_CHOOSE_TUNE | IHA_CHOOSE_RECORD, &p->backward);
}

iha_status iha__check_buffer(iha_context *ctx, iha_buffer buf, size_t elems, size_t elem_bytes, const char *name)
{
    IHA_RETURN_ERROR_IF(buf.mem == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "buffer %s is NULL", name);
    size_t size = 0;
    cl_int err = clGetMemObjectInfo(buf.mem, CL_MEM_SIZE, sizeof size, &size, NULL);
    IHA_RETURN_ERROR_IF(err != CL_SUCCESS, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "buffer %s is not a valid cl_mem (clGetMemObjectInfo: %s)", name, iha__cl_error_name(err));
    cl_context owner = NULL;
    err = clGetMemObjectInfo(buf.mem, CL_MEM_CONTEXT, sizeof owner, &owner, NULL);
    IHA_RETURN_ERROR_IF(err != CL_SUCCESS || owner != ctx->cl_ctx, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "buffer %s belongs to another OpenCL context than the iha context's", name);
    size_t end;
    IHA_RETURN_ERROR_IF(!iha__add(buf.offset, elems, &end) || end > SIZE_MAX / elem_bytes, ctx,
                        IHA_ERROR_SIZE_OVERFLOW, "buffer %s: offset %zu + %zu elements overflows size_t", name,
                        buf.offset, elems);
    IHA_RETURN_ERROR_IF(end * elem_bytes > size, ctx, IHA_ERROR_BUFFER_TOO_SMALL,
                        "buffer %s holds %zu bytes but needs %zu (offset %zu + %zu %s)", name, size,
                        end * elem_bytes, buf.offset, elems, elem_bytes == 2 ? "16-bit elements" : "floats");
    return IHA_OK;
}

iha_status iha__check_weights(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, int with_projections)
{
    iha_layer_weights read;
    const unsigned projections = with_projections ? IHA_READS_WQKV | IHA_READS_WO : 0;
    return iha__check_weights_read(ctx, p, w, IHA_READS_ALPHAS | IHA_READS_R | projections, &read);
}

iha_status iha__check_weights_read(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, unsigned reads,
                                   iha_layer_weights *read)
{
    IHA_RETURN_ERROR_IF(w == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "weights is NULL");
    memset(read, 0, sizeof *read);
    iha_buffer *const dst[8] = {&read->wq,      &read->wk,      &read->wv,      &read->wo,
                                &read->alpha_q, &read->alpha_k, &read->alpha_v, &read->r};
    const iha_buffer src[8] = {w->wq, w->wk, w->wv, w->wo, w->alpha_q, w->alpha_k, w->alpha_v, w->r};
    static const char *const names[8] = {"wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r"};
    static const unsigned member[8] = {IHA_READS_WQKV,   IHA_READS_WQKV,   IHA_READS_WQKV,   IHA_READS_WO,
                                       IHA_READS_ALPHAS, IHA_READS_ALPHAS, IHA_READS_ALPHAS, IHA_READS_R};
    int nulls = 0, mixing = 0;
    for (int i = 0; i < 8; ++i)
        if (reads & member[i]) {
            *dst[i] = src[i];
            if (i >= 4) mixing++, nulls += src[i].mem == NULL;
        }
    /* The mixing members the call reads, as the messages name them. */
    const char *const list = !(reads & IHA_READS_R)        ? "alpha_q, alpha_k and alpha_v"
                             : !(reads & IHA_READS_ALPHAS) ? "r"
                                                           : "alpha_q, alpha_k, alpha_v and r";
    if (mixing > 0 && nulls == mixing) {
        IHA_RETURN_ERROR_IF(p->dims.P != 1, ctx, IHA_ERROR_INVALID_ARGUMENT,
                            "%s may be NULL (identity) only when pseudo == 1, not %zu", list, p->dims.P);
    } else {
        IHA_RETURN_ERROR_IF(nulls != 0, ctx, IHA_ERROR_INVALID_ARGUMENT,
                            "give all of %s, or (with pseudo == 1) none of them", list);
    }
    for (int i = 0; i < 8; ++i)
        if (dst[i]->mem != NULL || (i < 4 && (reads & member[i])))
            IHA_FORWARD_IF_ERROR(
                iha__check_buffer(ctx, src[i], i < 4 ? p->w_elems : p->mix_elems, p->weight_bytes, names[i]));
    return IHA_OK;
}

iha_status iha__check_apart(iha_context *ctx, iha_buffer out, size_t out_elems, size_t out_bytes, iha_buffer in,
                            size_t in_elems, size_t in_bytes, const char *out_name, const char *in_name)
{
    if (out.mem != in.mem) return IHA_OK;
    const size_t out_lo = out.offset * out_bytes, out_hi = (out.offset + out_elems) * out_bytes;
    const size_t in_lo = in.offset * in_bytes, in_hi = (in.offset + in_elems) * in_bytes;
    IHA_RETURN_ERROR_IF(!(out_hi <= in_lo || in_hi <= out_lo), ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "output %s overlaps %s in the same buffer", out_name, in_name);
    return IHA_OK;
}

iha_status iha__check_disjoint(iha_context *ctx, iha_buffer out, size_t out_elems, iha_buffer in, size_t in_elems,
                               size_t elem_bytes, const char *out_name, const char *in_name)
{
    return iha__check_apart(ctx, out, out_elems, elem_bytes, in, in_elems, elem_bytes, out_name, in_name);
}

iha_status iha__check_inputs_output(iha_context *ctx, const iha_buffer in[3], const char *const in_names[3],
                                    iha_buffer out, const char *out_name, size_t elems, size_t elem_bytes)
{
    for (int i = 0; i < 3; ++i) IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, in[i], elems, elem_bytes, in_names[i]));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, out, elems, elem_bytes, out_name));
    for (int i = 0; i < 3; ++i)
        IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, out, elems, in[i], elems, elem_bytes, out_name, in_names[i]));
    return IHA_OK;
}

iha_status iha__check_apart_from_weights(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w,
                                         int with_projections, iha_buffer out, size_t out_elems, const char *out_name)
{
    return iha__check_apart_from_weights_bytes(ctx, p, w, with_projections, out, out_elems, p->act_bytes, out_name);
}

iha_status iha__check_apart_from_weights_bytes(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w,
                                               int with_projections, iha_buffer out, size_t out_elems,
                                               size_t out_bytes, const char *out_name)
{
    const iha_buffer weights[8] = {w->alpha_q, w->alpha_k, w->alpha_v, w->r, w->wq, w->wk, w->wv, w->wo};
    static const char *const names[8] = {"alpha_q", "alpha_k", "alpha_v", "r", "wq", "wk", "wv", "wo"};
    for (int i = 0; i < (with_projections ? 8 : 4); ++i) {
        if (weights[i].mem == NULL) continue; /* the identity shortcut */
        IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, out, out_elems, out_bytes, weights[i],
                                              i < 4 ? p->mix_elems : p->w_elems, p->weight_bytes, out_name, names[i]));
    }
    return IHA_OK;
}

iha_status iha__check_args(iha_context *ctx, const iha_plan *p, const iha_layer_weights *read, const iha_arg *in,
                           int in_count, const iha_arg *out, int out_count, int outputs_optional)
{
    for (int i = 0; i < in_count; ++i)
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, in[i].buf, in[i].elems, in[i].bytes, in[i].name));
    for (int i = 0; i < out_count; ++i) {
        const iha_arg *o = &out[i];
        if (outputs_optional && o->buf.mem == NULL) continue;
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, o->buf, o->elems, o->bytes, o->name));
        for (int j = 0; j < in_count; ++j)
            IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, o->buf, o->elems, o->bytes, in[j].buf, in[j].elems, in[j].bytes,
                                                  o->name, in[j].name));
        IHA_FORWARD_IF_ERROR(iha__check_apart_from_weights_bytes(ctx, p, read, 1, o->buf, o->elems, o->bytes, o->name));
        for (int j = 0; j < i; ++j)
            if (out[j].buf.mem != NULL)
                IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, o->buf, o->elems, o->bytes, out[j].buf, out[j].elems,
                                                      out[j].bytes, o->name, out[j].name));
    }
    return IHA_OK;
}
