/* The decoding step (doc/spec.md, "Decoding with a cache"): projections of the new tokens,
 * their mixing into the cache, split-key attention, collapse and output projection. */
#include <stdlib.h>

#include "common/checked.h"
#include "kernels/collapse.h"
#include "kernels/decode.h"
#include "kernels/rope.h"
#include "layer/call.h"
#include "layer/kv_cache.h"
#include "layer/plan.h"
#include "layer/project.h"
#include "layer/storage.h"
#include "layer/workspace.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"
#include "tune/choose.h"

/* Checks the step against the cache and fills the (n0, count) staging; *t_cur gets the longest
 * virtual length after the step. Nothing is changed on failure. */
static iha_status check_step(iha_context *ctx, iha_kv_cache *c, const iha_plan *p, const uint32_t *counts,
                             size_t *t_cur)
{
    IHA_RETURN_ERROR_IF(c->ctx == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "the cache's context was freed: a cache serves only the context that created it");
    IHA_RETURN_ERROR_IF(c->ctx != ctx, ctx, IHA_ERROR_INVALID_ARGUMENT, "the cache belongs to another context");
    IHA_RETURN_ERROR_IF(p->dims.B != c->B || p->dims.H != c->H || p->dims.d != c->d || p->dims.P != c->P, ctx,
                        IHA_ERROR_INVALID_ARGUMENT,
                        "step shape (batch %zu, heads %zu, head_dim %zu, pseudo %zu) does not match the cache's "
                        "(%zu, %zu, %zu, %zu)",
                        p->dims.B, p->dims.H, p->dims.d, p->dims.P, c->B, c->H, c->d, c->P);
    IHA_RETURN_ERROR_IF(c->ring_tokens && (p->window == 0 || p->window > c->window), ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "a ring cache of %zu tokens for a window of %zu tokens serves steps with a window of 1 to %zu "
                        "tokens, not %zu (0: global)",
                        c->ring_tokens, c->window, c->window, p->window);
    size_t longest = 0;
    for (size_t b = 0; b < c->B; ++b) {
        const size_t count = counts ? counts[b] : p->dims.N;
        IHA_RETURN_ERROR_IF(count > p->dims.N, ctx, IHA_ERROR_INVALID_ARGUMENT,
                            "counts[%zu] = %zu exceeds the step's %zu tokens", b, count, p->dims.N);
        IHA_RETURN_ERROR_IF(c->length[b] + count > c->max_tokens, ctx, IHA_ERROR_INVALID_ARGUMENT,
                            "sequence %zu holds %zu tokens; %zu more exceed the cache's %zu", b, c->length[b], count,
                            c->max_tokens);
        if (c->length[b] + count > longest) longest = c->length[b] + count;
    }
    for (size_t b = 0; b < c->B; ++b) {
        c->step[2 * b] = (cl_int)c->length[b];
        c->step[2 * b + 1] = (cl_int)(counts ? counts[b] : p->dims.N);
    }
    *t_cur = longest * c->P;
    return IHA_OK;
}

/* Refuses, before any allocation, a step whose float workspace exceeds the device's memory:
 * Q, K, V and Y of the new tokens, their pseudo-queries and pseudo-outputs, the split-key
 * partial results and a ring's rotary rows. */
static iha_status check_workspace(iha_context *ctx, const iha_plan *p, const iha_decode_dims *dd, size_t rope_rows)
{
    size_t tokens = 0, pseudo = 0, sum = 0, total = SIZE_MAX;
    if (iha__mul(p->token_elems, 4, &tokens) && iha__mul(p->virtual_elems, 2, &pseudo) &&
        iha__add(tokens, pseudo, &sum) && iha__add(sum, iha__decode_partial_elements(ctx, dd), &sum) &&
        iha__add(sum, rope_rows, &sum))
        total = sum;
    return iha__workspace_check_total(ctx, total, sizeof(float));
}

/* The step's plan and every check of its arguments against the cache (staging filled, *t_cur
 * set as check_step does). */
static iha_status check_call(iha_context *ctx, iha_kv_cache *c, const iha_shape *shape,
                             const iha_attention_options *options, const iha_layer_weights *w, const uint32_t *counts,
                             iha_buffer x, iha_buffer z, iha_plan *p, size_t *t_cur)
{
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 1, p));
    /* The window is relative to the whole sequence, not to the step's k tokens. */
    p->window = (uint64_t)options->window >= c->max_tokens ? 0 : (size_t)options->window;
    IHA_FORWARD_IF_ERROR(iha__check_weights(ctx, p, w, 1));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, x, p->x_elems, p->act_bytes, "x"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, z, p->x_elems, p->act_bytes, "z"));
    IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, z, p->x_elems, x, p->x_elems, p->act_bytes, "z", "x"));
    IHA_FORWARD_IF_ERROR(iha__check_apart_from_weights(ctx, p, w, 1, z, p->x_elems, "z"));
    return check_step(ctx, c, p, counts, t_cur);
}

static iha_status decode_step(iha_context *ctx, iha_kv_cache *c, const iha_shape *shape,
                              const iha_attention_options *options, const iha_layer_weights *w,
                              const uint32_t *counts, iha_buffer x, iha_buffer z, double *timer)
{
    double mark = *timer;
    iha_plan p;
    size_t t_cur = 0;
    IHA_FORWARD_IF_ERROR(check_call(ctx, c, shape, options, w, counts, x, z, &p, &t_cur));
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, options, &p));
    const size_t kb = (size_t)c->key_block;
    if (c->ring_tokens && t_cur > c->t_max + kb) t_cur = c->t_max + kb; /* the blocks a ring's splits cover */
    iha_decode_dims dd = {c->B, p.dims.N, c->H, c->d, c->P, c->t_max, t_cur, c->storage == IHA_STORAGE_F16,
                          c->ring_tokens != 0, p.attention, {0}, c->storage == IHA_STORAGE_BF16};
    dd.cfg.key_block = c->key_block; /* fixed by the cache's layout */
    IHA_FORWARD_IF_ERROR(iha__tune_choose_decode(ctx, &dd, p.mask, p.window));
    const size_t rope_rows = p.rope && dd.ring ? c->B * p.dims.N * c->P * c->d : 0;
    IHA_FORWARD_IF_ERROR(check_workspace(ctx, &p, &dd, rope_rows));

    const size_t f = sizeof(float), rows = p.dims.B * p.dims.N, hd = p.dims.H * p.dims.d;
    cl_mem q, k, v, qt, o, y, partial, step, rope = NULL;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Q, p.token_elems * f, &q));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_K, p.token_elems * f, &k));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_V, p.token_elems * f, &v));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_QT, p.virtual_elems * f, &qt));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_O, p.virtual_elems * f, &o));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Y, p.token_elems * f, &y));
    IHA_FORWARD_IF_ERROR(
        iha__workspace_get(ctx, IHA_WS_PARTIAL, iha__decode_partial_elements(ctx, &dd) * f, &partial));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_STEP, 2 * c->B * sizeof(cl_int), &step));
    if (rope_rows) {
        IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_ROPE_ROWS, rope_rows * f, &rope));
        IHA_FORWARD_IF_ERROR(iha__rope_rows(ctx, c->step, c->B, p.dims.N, c->P, c->d, p.rope_base, rope));
    } else if (p.rope) {
        IHA_FORWARD_IF_ERROR(iha__rope_table(ctx, c->max_tokens * c->P, c->d, p.rope_base, &rope));
    }
    iha_buffer xf, zf;
    iha_layer_weights mw;
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, x, p.x_elems, IHA_WS_X, &xf));
    IHA_FORWARD_IF_ERROR(iha__output_float(ctx, &p, z, p.x_elems, IHA_WS_OUT, &zf));
    IHA_FORWARD_IF_ERROR(iha__mixing_float(ctx, &p, w, &mw));
    /* Blocking, so the staging array may change in the next step at once. */
    IHA_CL_CHECK(ctx, clEnqueueWriteBuffer(ctx->queue, step, CL_TRUE, 0, 2 * c->B * sizeof(cl_int), c->step, 0, NULL, NULL),
                 "clEnqueueWriteBuffer (decode step)");

    IHA_FORWARD_IF_ERROR(iha__project(ctx, &p, rows, hd, p.D, xf, w->wq, (iha_buffer){q, 0}));
    IHA_FORWARD_IF_ERROR(iha__project(ctx, &p, rows, hd, p.D, xf, w->wk, (iha_buffer){k, 0}));
    IHA_FORWARD_IF_ERROR(iha__project(ctx, &p, rows, hd, p.D, xf, w->wv, (iha_buffer){v, 0}));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.projections, &mark));

    IHA_FORWARD_IF_ERROR(
        iha__decode_mix_queries_enqueue(ctx, &dd, (iha_buffer){q, 0}, mw.alpha_q, (iha_buffer){qt, 0}, rope, step));
    IHA_FORWARD_IF_ERROR(
        iha__decode_mix_cache_enqueue(ctx, &dd, (iha_buffer){k, 0}, mw.alpha_k, c->keys, rope, step, c->key_block));
    IHA_FORWARD_IF_ERROR(
        iha__decode_mix_cache_enqueue(ctx, &dd, (iha_buffer){v, 0}, mw.alpha_v, c->values, NULL, step, 0));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.mixing, &mark));

    IHA_FORWARD_IF_ERROR(iha__decode_attention_enqueue(ctx, &dd, (iha_buffer){qt, 0}, c->keys, c->values, partial,
                                                       (iha_buffer){o, 0}, step, p.mask, p.window, p.scale));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.attention, &mark));

    IHA_FORWARD_IF_ERROR(iha__collapse_enqueue(ctx, &p.mix_collapse, &p.dims, (iha_buffer){o, 0}, mw.r, (iha_buffer){y, 0}));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.collapse, &mark));

    IHA_FORWARD_IF_ERROR(iha__project(ctx, &p, rows, p.D, hd, (iha_buffer){y, 0}, w->wo, zf));
    IHA_FORWARD_IF_ERROR(iha__output_finish(ctx, &p, zf, z, p.x_elems));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.output, &mark));

    for (size_t b = 0; b < c->B; ++b) {
        c->length[b] += (size_t)c->step[2 * b + 1];
        if (c->length[b] > c->reach[b]) c->reach[b] = c->length[b];
    }
    *timer = mark;
    return IHA_OK;
}

/* Copies rows first .. first+rows-1 of each sequence's `from_k` rows of D elements between x-like
 * tensors [B][from_k][D] and [B][to_k][D] (to_first: the rows' place in the destination). */
static iha_status copy_rows(iha_context *ctx, const iha_plan *p, iha_buffer src, size_t src_k, size_t src_first,
                            iha_buffer dst, size_t dst_k, size_t dst_first, size_t rows)
{
    const size_t e = p->act_bytes, row = p->D * e;
    const size_t src_origin[3] = {src.offset * e + src_first * row, 0, 0}, dst_origin[3] = {dst.offset * e + dst_first * row, 0, 0};
    const size_t region[3] = {rows * row, p->dims.B, 1};
    IHA_CL_CHECK(ctx, clEnqueueCopyBufferRect(ctx->queue, src.mem, dst.mem, src_origin, dst_origin, region, src_k * row, 0,
                                              dst_k * row, 0, 0, NULL, NULL),
                 "clEnqueueCopyBufferRect (decode chunk)");
    return IHA_OK;
}

/* A ring's step whose counts exceed what the ring holds at once besides the window (L - w + 1
 * tokens): run as consecutive steps of at most that many tokens per sequence, through chunk
 * copies of x and z. Every check of the whole step runs first, so a refused step changes
 * nothing. */
static iha_status ring_step(iha_context *ctx, iha_kv_cache *c, const iha_shape *shape,
                            const iha_attention_options *options, const iha_layer_weights *w,
                            const uint32_t *counts, iha_buffer x, iha_buffer z, double *mark)
{
    /* A window outside 1 .. c->window, like every other fault, is decode_step's to refuse. */
    if (shape == NULL || options == NULL || options->window < 1 || (uint64_t)options->window > c->window)
        return decode_step(ctx, c, shape, options, w, counts, x, z, mark);
    const size_t chunk = c->ring_tokens - (size_t)options->window + 1, k = shape->tokens;
    size_t most = 0;
    for (size_t b = 0; b < c->B && b < shape->batch; ++b) {
        const size_t count = counts ? counts[b] : k;
        if (count > most) most = count;
    }
    if (most <= chunk) return decode_step(ctx, c, shape, options, w, counts, x, z, mark);
    iha_plan p;
    size_t t_cur = 0;
    IHA_FORWARD_IF_ERROR(check_call(ctx, c, shape, options, w, counts, x, z, &p, &t_cur));
    IHA_RETURN_ERROR_IF(p.mask == IHA_MASK_NONE, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "a bidirectional step reads all its keys at once: on a ring cache of %zu tokens with a window "
                        "of %zu it appends at most %zu tokens per sequence, not %zu",
                        c->ring_tokens, p.window, chunk, most);
    const size_t chunk_bytes = p.dims.B * chunk * p.D * p.act_bytes; /* below x's bytes */
    cl_mem xc, zc;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_CHUNK_X, chunk_bytes, &xc));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_CHUNK_Z, chunk_bytes, &zc));
    uint32_t *part = malloc(c->B * sizeof *part);
    IHA_RETURN_ERROR_IF(part == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    iha_shape sub = *shape;
    iha_status st = IHA_OK;
    size_t end = 0; /* the rows of z written */
    for (size_t first = 0; first < most && st == IHA_OK; first += chunk) {
        sub.tokens = k - first < chunk ? k - first : chunk;
        end = first + sub.tokens;
        for (size_t b = 0; b < c->B; ++b) {
            const size_t count = counts ? counts[b] : k;
            part[b] = (uint32_t)(count <= first ? 0 : (count - first < chunk ? count - first : chunk));
        }
        st = copy_rows(ctx, &p, x, k, first, (iha_buffer){xc, 0}, sub.tokens, 0, sub.tokens);
        if (st == IHA_OK) st = decode_step(ctx, c, &sub, options, w, part, (iha_buffer){xc, 0}, (iha_buffer){zc, 0}, mark);
        if (st == IHA_OK) st = copy_rows(ctx, &p, (iha_buffer){zc, 0}, sub.tokens, 0, z, k, first, sub.tokens);
    }
    free(part);
    if (st != IHA_OK || end == k) return st;
    /* The rows past every count are 0, as in one step. */
    const cl_float zero = 0.0f;
    const cl_ushort zero_half = 0;
    const size_t e = p.act_bytes, row = p.D * e;
    for (size_t b = 0; b < c->B; ++b)
        IHA_CL_CHECK(ctx, clEnqueueFillBuffer(ctx->queue, z.mem, e == 2 ? (const void *)&zero_half : (const void *)&zero, e,
                                              z.offset * e + (b * k + end) * row, (k - end) * row, 0, NULL, NULL),
                     "clEnqueueFillBuffer (decode rows)");
    return IHA_OK;
}

iha_status iha_decode_step(iha_context *ctx, iha_kv_cache *cache, const iha_shape *shape,
                           const iha_attention_options *options, const iha_layer_weights *weights,
                           const uint32_t *counts, iha_buffer x, iha_buffer z)
{
    double mark;
    IHA_FORWARD_IF_ERROR(iha__call_begin(ctx, &mark));
    iha_status st = IHA_OK;
    if (cache == NULL)
        st = iha__fail(ctx, IHA_ERROR_INVALID_ARGUMENT, "cache is NULL");
    else if (cache->ring_tokens)
        st = ring_step(ctx, cache, shape, options, weights, counts, x, z, &mark);
    else
        st = decode_step(ctx, cache, shape, options, weights, counts, x, z, &mark);
    return iha__call_end(ctx, st);
}
