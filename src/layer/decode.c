/* The decoding step (doc/spec.md, "Decoding with a cache"): projections of the new tokens,
 * their mixing into the cache, split-key attention, collapse and output projection. A step is
 * planned (every check), its workspace counted and allocated, and only then enqueued; a ring's
 * long step plans and allocates all its sub-steps before enqueueing the first. */
#include <stdlib.h>
#include <string.h>

#include "common/checked.h"
#include "kernels/collapse.h"
#include "kernels/decode.h"
#include "kernels/decode_compact.h"
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

/* Checks the step against the cache, sequence b starting at n0[b] tokens; *t_cur gets the
 * longest virtual length after the step. Nothing is changed. */
static iha_status check_step(iha_context *ctx, iha_kv_cache *c, const iha_plan *p, const uint32_t *counts,
                             const size_t *n0, size_t *t_cur)
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
    IHA_RETURN_ERROR_IF(c->compact && c->rope_fixed &&
                            (p->rope != c->rope || (p->rope && p->rope_base != c->rope_base)),
                        ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "a compact cache completes its keys' rotation as it reads them: its steps keep the rotary "
                        "setting of its first step (rope %d, base %g), not rope %d, base %g (iha_kv_cache_reset "
                        "frees it)",
                        c->rope, (double)c->rope_base, p->rope, (double)p->rope_base);
    size_t longest = 0;
    for (size_t b = 0; b < c->B; ++b) {
        const size_t count = counts ? counts[b] : p->dims.N;
        IHA_RETURN_ERROR_IF(count > p->dims.N, ctx, IHA_ERROR_INVALID_ARGUMENT,
                            "counts[%zu] = %zu exceeds the step's %zu tokens", b, count, p->dims.N);
        IHA_RETURN_ERROR_IF(n0[b] + count > c->max_tokens, ctx, IHA_ERROR_INVALID_ARGUMENT,
                            "sequence %zu holds %zu tokens; %zu more exceed the cache's %zu", b, n0[b], count,
                            c->max_tokens);
        if (n0[b] + count > longest) longest = n0[b] + count;
    }
    *t_cur = longest * c->P;
    return IHA_OK;
}

/* The step's plan and every check of its arguments against the cache (sequences starting at
 * n0; x and z NULL: buffers of the library's own, not checked); *t_cur as check_step sets it. */
static iha_status check_call(iha_context *ctx, iha_kv_cache *c, const iha_shape *shape,
                             const iha_attention_options *options, const iha_layer_weights *w, const uint32_t *counts,
                             const size_t *n0, const iha_buffer *x, const iha_buffer *z, iha_plan *p, size_t *t_cur)
{
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 1, p));
    /* The window is relative to the whole sequence, not to the step's k tokens. */
    p->window = (uint64_t)options->window >= c->max_tokens ? 0 : (size_t)options->window;
    IHA_FORWARD_IF_ERROR(iha__check_weights(ctx, p, w, 1));
    if (x && z) {
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, *x, p->x_elems, p->act_bytes, "x"));
        IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, *z, p->x_elems, p->act_bytes, "z"));
        IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, *z, p->x_elems, *x, p->x_elems, p->act_bytes, "z", "x"));
        IHA_FORWARD_IF_ERROR(iha__check_apart_from_weights(ctx, p, w, 1, *z, p->x_elems, "z"));
    }
    return check_step(ctx, c, p, counts, n0, t_cur);
}

/* A checked step with its kernels chosen: the plan, the decode dimensions (a compact cache's in
 * dc, whose dd is dd) and the rows of a ring's rotary staging. */
typedef struct step_plan {
    iha_plan p;
    iha_decode_dims dd;
    iha_decode_compact dc;
    size_t rope_rows;
} step_plan;

static iha_status plan_step(iha_context *ctx, iha_kv_cache *c, const iha_shape *shape,
                            const iha_attention_options *options, const iha_layer_weights *w, const uint32_t *counts,
                            const size_t *n0, const iha_buffer *x, const iha_buffer *z, step_plan *s)
{
    iha_plan *p = &s->p;
    size_t t_cur = 0;
    IHA_FORWARD_IF_ERROR(check_call(ctx, c, shape, options, w, counts, n0, x, z, p, &t_cur));
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, options, p));
    const size_t kb = (size_t)c->key_block;
    if (!c->compact && c->ring_tokens && t_cur > c->t_max + kb) t_cur = c->t_max + kb; /* the blocks a ring's splits cover */
    s->dd = (iha_decode_dims){c->B, p->dims.N, c->H, c->d, c->P, c->t_max, t_cur, c->storage == IHA_STORAGE_F16,
                              c->ring_tokens != 0, p->attention, {0}, c->storage == IHA_STORAGE_BF16};
    s->dd.cfg.key_block = c->key_block; /* fixed by the cache's layout */
    memset(&s->dc, 0, sizeof s->dc);
    if (c->compact) {
        s->dc.dd = s->dd;
        s->dc.slots = c->slots;
        IHA_FORWARD_IF_ERROR(iha__tune_choose_decode_compact(ctx, &s->dc, p->mask, p->window, p->rope));
        s->dc.fold = iha__decode_compact_can_fold(ctx, &s->dc, p->rope, w->alpha_q.mem != NULL);
    } else {
        IHA_FORWARD_IF_ERROR(iha__tune_choose_decode(ctx, &s->dd, p->mask, p->window));
    }
    s->rope_rows = p->rope && s->dd.ring ? c->B * p->dims.N * c->P * c->d : 0;
    return IHA_OK;
}

/* The workspace slots a step uses, and their bytes (step_space). */
static const iha_workspace_slot kSlots[] = {IHA_WS_Q,    IHA_WS_K,         IHA_WS_V,      IHA_WS_QT,
                                            IHA_WS_O,    IHA_WS_Y,         IHA_WS_PARTIAL, IHA_WS_STEP,
                                            IHA_WS_ROPE_ROWS, IHA_WS_X,    IHA_WS_OUT,    IHA_WS_MIXING,
                                            IHA_WS_WEIGHT};
#define SLOTS (sizeof kSlots / sizeof kSlots[0])

/* The split-key partial results' floats of either layout's attention. */
static size_t c_partial_elements(const iha_context *ctx, const step_plan *s)
{
    return s->dc.slots ? iha__decode_compact_partial_elements(ctx, &s->dc) : iha__decode_partial_elements(ctx, &s->dd);
}

/* Bytes of each of kSlots the step needs (0: unused): Q, K, V and Y of the new tokens, their
 * pseudo-queries and pseudo-outputs, the split-key partial results, the (n0, count) staging, a
 * ring's rotary rows, float copies of half x and z, and half weights converted to float. 0 if a
 * size overflows. */
static int step_space(const iha_context *ctx, const step_plan *s, size_t bytes[SLOTS])
{
    const iha_plan *p = &s->p;
    const size_t rows = p->dims.B * p->dims.N;
    const size_t elems[SLOTS] = {p->token_elems,
                                 p->token_elems,
                                 p->token_elems,
                                 p->virtual_elems,
                                 p->virtual_elems,
                                 p->token_elems,
                                 c_partial_elements(ctx, s),
                                 2 * s->dd.B, /* cl_int, the size of a float */
                                 s->rope_rows,
                                 p->act_half ? p->x_elems : 0,
                                 p->act_half ? p->x_elems : 0,
                                 p->weight_half ? 4 * p->mix_elems : 0,
                                 iha__project_workspace_elements(p, rows)};
    for (size_t i = 0; i < SLOTS; ++i)
        if (!iha__mul(elems[i], sizeof(float), &bytes[i])) return 0;
    return 1;
}

/* Refuses, before any allocation, workspace of need[] plus `extra` bytes that exceeds the
 * device's memory, then allocates need[]: the slots keep their buffers, so every later
 * iha__workspace_get of at most those bytes allocates nothing. */
static iha_status reserve_space(iha_context *ctx, const size_t need[SLOTS], size_t extra)
{
    size_t total = extra;
    for (size_t i = 0; i < SLOTS && total != SIZE_MAX; ++i)
        if (!iha__add(total, need[i], &total)) total = SIZE_MAX;
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, total == SIZE_MAX ? SIZE_MAX : (total + 3) / 4, sizeof(float)));
    cl_mem m;
    for (size_t i = 0; i < SLOTS; ++i)
        if (need[i]) IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, kSlots[i], need[i], &m));
    return IHA_OK;
}

/* A compact cache's first step after a reset fixes its rotary setting; a ring with rotary then
 * gets the angles of positions 0 .. P-1 that its reads add to each token's n*P (the other caches
 * read them from the start of the rotary table). */
static iha_status compact_fix_rope(iha_context *ctx, iha_kv_cache *c, const iha_plan *p)
{
    if (c->rope_fixed) return IHA_OK;
    if (p->rope && c->angles)
        IHA_FORWARD_IF_ERROR(iha__rope_write(ctx, 0, c->P, c->d, p->rope_base, c->angles));
    c->rope_fixed = 1;
    c->rope = p->rope;
    c->rope_base = p->rope_base;
    return IHA_OK;
}

/* Enqueues a planned step whose workspace is reserved: sequence b appends counts[b] tokens
 * (NULL: k each) at its current length. */
static iha_status run_step(iha_context *ctx, iha_kv_cache *c, const step_plan *s, const iha_layer_weights *w,
                           const uint32_t *counts, iha_buffer x, iha_buffer z, double *timer)
{
    double mark = *timer;
    const iha_plan p = s->p;
    const iha_decode_dims dd = s->dd;
    for (size_t b = 0; b < c->B; ++b) {
        c->step[2 * b] = (cl_int)c->length[b];
        c->step[2 * b + 1] = (cl_int)(counts ? counts[b] : p.dims.N);
    }
    const size_t f = sizeof(float), rows = p.dims.B * p.dims.N, hd = p.dims.H * p.dims.d;
    cl_mem q, k, v, qt, o, y, partial, step, rope = NULL;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Q, p.token_elems * f, &q));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_K, p.token_elems * f, &k));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_V, p.token_elems * f, &v));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_QT, p.virtual_elems * f, &qt));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_O, p.virtual_elems * f, &o));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_Y, p.token_elems * f, &y));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_PARTIAL, c_partial_elements(ctx, s) * f, &partial));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_STEP, 2 * c->B * sizeof(cl_int), &step));
    if (s->rope_rows) {
        IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_ROPE_ROWS, s->rope_rows * f, &rope));
        IHA_FORWARD_IF_ERROR(iha__rope_rows(ctx, c->step, c->B, p.dims.N, c->P, c->d, p.rope_base, rope));
    } else if (p.rope) {
        IHA_FORWARD_IF_ERROR(iha__rope_table(ctx, 0, c->max_tokens * c->P, c->d, p.rope_base, &rope));
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

    /* From here the cache's rows past each length may be overwritten: a ring then no longer
     * holds what a rewind below the new tokens' reach would read, so reach counts them at once
     * (a step that fails later leaves the lengths and such a rewind refused). */
    for (size_t b = 0; b < c->B; ++b) {
        const size_t end = c->length[b] + (size_t)c->step[2 * b + 1];
        if (end > c->reach[b]) c->reach[b] = end;
    }
    IHA_FORWARD_IF_ERROR(
        iha__decode_mix_queries_enqueue(ctx, &dd, (iha_buffer){q, 0}, mw.alpha_q, (iha_buffer){qt, 0}, rope, step));
    if (c->compact) {
        IHA_FORWARD_IF_ERROR(compact_fix_rope(ctx, c, &p));
        IHA_FORWARD_IF_ERROR(iha__decode_store_compact_enqueue(ctx, &s->dc, k, v, c->keys, c->values,
                                                               p.rope ? rope : NULL, step));
    } else {
        IHA_FORWARD_IF_ERROR(iha__decode_mix_cache_enqueue(ctx, &dd, (iha_buffer){k, 0}, mw.alpha_k, c->keys, rope,
                                                           step, c->key_block));
        IHA_FORWARD_IF_ERROR(
            iha__decode_mix_cache_enqueue(ctx, &dd, (iha_buffer){v, 0}, mw.alpha_v, c->values, NULL, step, 0));
    }
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.mixing, &mark));

    if (s->dc.fold) {
        /* Attention and collapse in one (cl/attention_decode_fold.cl). */
        IHA_FORWARD_IF_ERROR(iha__decode_compact_fold_enqueue(
            ctx, &s->dc, (iha_buffer){qt, 0}, (iha_buffer){q, 0}, c->keys, c->values, mw.alpha_q, mw.alpha_k,
            mw.alpha_v, mw.r, !p.rope ? NULL : c->angles ? c->angles : rope, partial, (iha_buffer){y, 0}, step,
            p.mask, p.window, p.scale));
    } else if (c->compact) {
        IHA_FORWARD_IF_ERROR(iha__decode_compact_attention_enqueue(
            ctx, &s->dc, (iha_buffer){qt, 0}, (iha_buffer){q, 0}, c->keys, c->values, mw.alpha_q, mw.alpha_k,
            mw.alpha_v, !p.rope ? NULL : c->angles ? c->angles : rope, partial, (iha_buffer){o, 0}, step, p.mask, p.window, p.scale));
    } else {
        IHA_FORWARD_IF_ERROR(iha__decode_attention_enqueue(ctx, &dd, (iha_buffer){qt, 0}, c->keys, c->values, partial,
                                                           (iha_buffer){o, 0}, step, p.mask, p.window, p.scale));
    }
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.attention, &mark));

    if (!s->dc.fold)
        IHA_FORWARD_IF_ERROR(
            iha__collapse_enqueue(ctx, &p.mix_collapse, &p.dims, (iha_buffer){o, 0}, mw.r, (iha_buffer){y, 0}));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.collapse, &mark));

    IHA_FORWARD_IF_ERROR(iha__project(ctx, &p, rows, p.D, hd, (iha_buffer){y, 0}, w->wo, zf));
    IHA_FORWARD_IF_ERROR(iha__output_finish(ctx, &p, zf, z, p.x_elems));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.output, &mark));

    for (size_t b = 0; b < c->B; ++b) c->length[b] += (size_t)c->step[2 * b + 1];
    *timer = mark;
    return IHA_OK;
}

static iha_status decode_step(iha_context *ctx, iha_kv_cache *c, const iha_shape *shape,
                              const iha_attention_options *options, const iha_layer_weights *w,
                              const uint32_t *counts, iha_buffer x, iha_buffer z, double *timer)
{
    step_plan s;
    size_t need[SLOTS];
    IHA_FORWARD_IF_ERROR(plan_step(ctx, c, shape, options, w, counts, c->length, &x, &z, &s));
    const int sizes_fit = step_space(ctx, &s, need);
    IHA_FORWARD_IF_ERROR(reserve_space(ctx, need, sizes_fit ? 0 : SIZE_MAX));
    return run_step(ctx, c, &s, w, counts, x, z, timer);
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

/* Sub-step j of a long ring step: its tokens per row (*tokens) and per sequence (part). */
static void sub_counts(const iha_kv_cache *c, const uint32_t *counts, size_t k, size_t chunk, size_t j,
                       size_t *tokens, uint32_t *part)
{
    const size_t first = j * chunk;
    *tokens = k - first < chunk ? k - first : chunk;
    for (size_t b = 0; b < c->B; ++b) {
        const size_t count = counts ? counts[b] : k;
        part[b] = (uint32_t)(count <= first ? 0 : (count - first < chunk ? count - first : chunk));
    }
}

/* Plans every sub-step of a long ring step on the lengths it starts from, and reserves the
 * workspace they need together with the chunk buffers (*xc, *zc of chunk_bytes). */
static iha_status plan_sub_steps(iha_context *ctx, iha_kv_cache *c, const iha_shape *shape,
                                 const iha_attention_options *options, const iha_layer_weights *w,
                                 const uint32_t *counts, size_t chunk, size_t steps, size_t chunk_bytes, cl_mem *xc,
                                 cl_mem *zc)
{
    uint32_t *part = malloc(c->B * sizeof *part);
    size_t *n0 = malloc(c->B * sizeof *n0);
    step_plan s;
    size_t need[SLOTS] = {0}, bytes[SLOTS];
    iha_status st = part && n0 ? IHA_OK : iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    if (st == IHA_OK) memcpy(n0, c->length, c->B * sizeof *n0);
    iha_shape sub = *shape;
    int sizes_fit = 1;
    for (size_t j = 0; j < steps && st == IHA_OK; ++j) {
        sub_counts(c, counts, shape->tokens, chunk, j, &sub.tokens, part);
        st = plan_step(ctx, c, &sub, options, w, part, n0, NULL, NULL, &s);
        if (st != IHA_OK) break;
        sizes_fit = sizes_fit && step_space(ctx, &s, bytes);
        for (size_t i = 0; i < SLOTS; ++i)
            if (bytes[i] > need[i]) need[i] = bytes[i];
        for (size_t b = 0; b < c->B; ++b) n0[b] += part[b];
    }
    free(part);
    free(n0);
    IHA_FORWARD_IF_ERROR(st);
    IHA_FORWARD_IF_ERROR(reserve_space(ctx, need, sizes_fit ? 2 * chunk_bytes : SIZE_MAX));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_CHUNK_X, chunk_bytes, xc));
    return iha__workspace_get(ctx, IHA_WS_CHUNK_Z, chunk_bytes, zc);
}

/* A ring's step whose counts exceed what the ring holds at once besides the window (L - w + 1
 * tokens): run as consecutive steps of at most that many tokens per sequence, through chunk
 * copies of x and z. Every check and allocation of every sub-step comes first, so a refused
 * step changes nothing, and only the device (an OpenCL call) can fail between sub-steps. */
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
    IHA_FORWARD_IF_ERROR(check_call(ctx, c, shape, options, w, counts, c->length, &x, &z, &p, &t_cur));
    IHA_RETURN_ERROR_IF(p.mask == IHA_MASK_NONE, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "a bidirectional step reads all its keys at once: on a ring cache of %zu tokens with a window "
                        "of %zu it appends at most %zu tokens per sequence, not %zu",
                        c->ring_tokens, p.window, chunk, most);
    const size_t steps = (most + chunk - 1) / chunk;
    const size_t chunk_bytes = p.dims.B * chunk * p.D * p.act_bytes; /* below x's bytes */
    cl_mem xc, zc;
    IHA_FORWARD_IF_ERROR(plan_sub_steps(ctx, c, shape, options, w, counts, chunk, steps, chunk_bytes, &xc, &zc));
    uint32_t *part = malloc(c->B * sizeof *part);
    IHA_RETURN_ERROR_IF(part == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    iha_shape sub = *shape;
    step_plan s;
    iha_status st = IHA_OK;
    for (size_t j = 0; j < steps && st == IHA_OK; ++j) {
        const size_t first = j * chunk;
        sub_counts(c, counts, k, chunk, j, &sub.tokens, part);
        /* The same plan as plan_sub_steps made: it passes the same checks on the same state. */
        st = plan_step(ctx, c, &sub, options, w, part, c->length, NULL, NULL, &s);
        if (st == IHA_OK) st = copy_rows(ctx, &p, x, k, first, (iha_buffer){xc, 0}, sub.tokens, 0, sub.tokens);
        if (st == IHA_OK) st = run_step(ctx, c, &s, w, part, (iha_buffer){xc, 0}, (iha_buffer){zc, 0}, mark);
        if (st == IHA_OK) st = copy_rows(ctx, &p, (iha_buffer){zc, 0}, sub.tokens, 0, z, k, first, sub.tokens);
    }
    free(part);
    const size_t end = steps * chunk < k ? steps * chunk : k; /* the rows of z written */
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

static iha_status any_step(iha_context *ctx, iha_kv_cache *c, const iha_shape *shape,
                           const iha_attention_options *options, const iha_layer_weights *w, const uint32_t *counts,
                           iha_buffer x, iha_buffer z, double *mark)
{
    if (c->ring_tokens) return ring_step(ctx, c, shape, options, w, counts, x, z, mark);
    return decode_step(ctx, c, shape, options, w, counts, x, z, mark);
}

/* Copies each sequence's rows between the packed tensor [sum seq_lens][D] and the padded one
 * [B][k][D]; to_padded says which way. */
static iha_status copy_packed(iha_context *ctx, const size_t *lens, size_t B, size_t k, size_t row, iha_buffer packed,
                              size_t bytes, cl_mem padded, int to_padded)
{
    for (size_t b = 0, first = 0; b < B; first += lens[b++]) {
        if (lens[b] == 0) continue;
        const size_t at_packed = packed.offset * bytes + first * row, at_padded = b * k * row;
        IHA_CL_CHECK(ctx,
                     clEnqueueCopyBuffer(ctx->queue, to_padded ? packed.mem : padded, to_padded ? padded : packed.mem,
                                         to_padded ? at_packed : at_padded, to_padded ? at_padded : at_packed,
                                         lens[b] * row, 0, NULL, NULL),
                     "clEnqueueCopyBuffer (packed decoding step)");
    }
    return IHA_OK;
}

/* A step whose new tokens come packed (options->seq_lens, include/iha.h): the ragged step of
 * counts seq_lens on padded copies of x and z. Every check runs first (the lengths here, the
 * rest in the ragged step before it writes), so a refused step changes nothing. */
static iha_status packed_step(iha_context *ctx, iha_kv_cache *c, const iha_shape *shape,
                              const iha_attention_options *options, const iha_layer_weights *w, const uint32_t *counts,
                              iha_buffer x, iha_buffer z, double *mark)
{
    IHA_RETURN_ERROR_IF(shape == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "shape is NULL");
    IHA_RETURN_ERROR_IF(counts != NULL, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "a step with options->seq_lens takes its counts from them: counts must be NULL");
    IHA_RETURN_ERROR_IF(options->seq_count != c->B || shape->batch != c->B, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "a packed step gives one length per sequence of the cache: seq_count %zu, batch %zu, the "
                        "cache's %zu",
                        options->seq_count, shape->batch, c->B);
    size_t total = 0;
    uint32_t *lens32 = malloc(c->B * sizeof *lens32);
    IHA_RETURN_ERROR_IF(lens32 == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    for (size_t b = 0; b < c->B; ++b) {
        if (options->seq_lens[b] > shape->tokens) {
            free(lens32);
            return iha__fail(ctx, IHA_ERROR_INVALID_ARGUMENT, "seq_lens[%zu] = %zu exceeds the step's %zu tokens", b,
                             options->seq_lens[b], shape->tokens);
        }
        lens32[b] = (uint32_t)options->seq_lens[b];
        total += options->seq_lens[b];
    }
    iha_attention_options o = *options;
    o.seq_lens = NULL;
    o.seq_count = 0;
    iha_plan p;
    iha_status st = iha__plan_make(ctx, shape, &o, 1, &p);
    size_t row = 0, padded = 0;
    if (st == IHA_OK) {
        row = p.D * p.act_bytes; /* the plan bounds B*N*D elements */
        padded = c->B * shape->tokens * row;
        st = iha__check_weights(ctx, &p, w, 1);
    }
    if (st == IHA_OK) st = iha__check_buffer(ctx, x, total * p.D, p.act_bytes, "x");
    if (st == IHA_OK) st = iha__check_buffer(ctx, z, total * p.D, p.act_bytes, "z");
    if (st == IHA_OK) st = iha__check_disjoint(ctx, z, total * p.D, x, total * p.D, p.act_bytes, "z", "x");
    if (st == IHA_OK) st = iha__check_apart_from_weights(ctx, &p, w, 1, z, total * p.D, "z");
    cl_mem xp = NULL, zp = NULL;
    if (st == IHA_OK) st = iha__workspace_get(ctx, IHA_WS_PACKED_X, padded, &xp);
    if (st == IHA_OK) st = iha__workspace_get(ctx, IHA_WS_PACKED_Z, padded, &zp);
    if (st == IHA_OK) st = copy_packed(ctx, options->seq_lens, c->B, shape->tokens, row, x, p.act_bytes, xp, 1);
    if (st == IHA_OK)
        st = any_step(ctx, c, shape, &o, w, lens32, (iha_buffer){xp, 0}, (iha_buffer){zp, 0}, mark);
    if (st == IHA_OK) st = copy_packed(ctx, options->seq_lens, c->B, shape->tokens, row, z, p.act_bytes, zp, 0);
    free(lens32);
    return st;
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
    else if (options != NULL && (options->seq_lens != NULL || options->seq_count != 0))
        st = options->seq_lens == NULL
                 ? iha__fail(ctx, IHA_ERROR_INVALID_ARGUMENT, "seq_count is %zu but seq_lens is NULL", options->seq_count)
                 : packed_step(ctx, cache, shape, options, weights, counts, x, z, &mark);
    else
        st = any_step(ctx, cache, shape, options, weights, counts, x, z, &mark);
    return iha__call_end(ctx, st);
}
