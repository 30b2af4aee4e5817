/* Incremental decoding: the pseudo-token KV cache and the decoding step (SPEC "Decoding with a
 * cache"): projections, mixing of the new tokens into the cache, split-key attention, collapse
 * and output projection. */
#include <stdlib.h>
#include <string.h>

#include "common/checked.h"
#include "runtime/loop_limit.h"
#include "layer/call.h"
#include "layer/plan.h"
#include "layer/storage.h"
#include "tune/choose.h"

struct iha_kv_cache {
    iha_context *ctx;    /* NULL once the context is freed (detach_all) */
    iha_kv_cache *prev, *next; /* the context's list of live caches */
    size_t B, max_tokens, H, d, P, t_max;
    iha_storage storage;
    int key_block;       /* keys per block of the keys' layout */
    cl_mem keys, values; /* keys [B][H][ceil(t_max/KB)][d][KB] (attention.cl), values [B][H][t_max][d] */
    size_t bytes;
    size_t *length;      /* tokens per sequence */
    cl_int *step;        /* staging of the per-sequence (n0, count) pairs */
};

/* iha_context_free's hook, after its queue has finished: the caches keep their buffers (and
 * through them the cl_context) until iha_kv_cache_free, and forget the context. */
static void detach_all(iha_context *ctx)
{
    for (iha_kv_cache *c = ctx->kv_caches, *next; c != NULL; c = next) {
        next = c->next;
        c->ctx = NULL;
        c->prev = c->next = NULL;
    }
    ctx->kv_caches = NULL;
}

static void link_cache(iha_kv_cache *c)
{
    iha_context *ctx = c->ctx;
    c->next = ctx->kv_caches;
    if (c->next) c->next->prev = c;
    ctx->kv_caches = c;
    ctx->detach_kv_caches = detach_all;
}

static void unlink_cache(iha_kv_cache *c)
{
    if (c->ctx == NULL) return;
    if (c->prev)
        c->prev->next = c->next;
    else if (c->ctx->kv_caches == c)
        c->ctx->kv_caches = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

iha_status iha_kv_cache_create(iha_context *ctx, const iha_shape *shape, iha_storage storage, iha_kv_cache **out)
{
    if (ctx == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    iha__message_clear(&ctx->message);
    IHA_RETURN_ERROR_IF(out == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    IHA_RETURN_ERROR_IF(storage != IHA_STORAGE_F32 && storage != IHA_STORAGE_F16, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "unknown cache storage %d", (int)storage);
    iha_attention_options defaults;
    iha_attention_options_init(&defaults);
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, &defaults, 0, &p));
    IHA_FORWARD_IF_ERROR(iha__plan_lookup(ctx, shape, &defaults, &p)); /* the keys' block layout */
    const size_t element = storage == IHA_STORAGE_F16 ? 2 : 4;
    size_t bytes, key_bytes;
    IHA_RETURN_ERROR_IF(!iha__mul(p.virtual_elems, element, &bytes) || !iha__mul(p.packed_elems, element, &key_bytes),
                        ctx, IHA_ERROR_SIZE_OVERFLOW, "the cache's size overflows size_t");
    IHA_RETURN_ERROR_IF(key_bytes > ctx->info.max_alloc_bytes, ctx, IHA_ERROR_DEVICE_MEMORY,
                        "a cache of %zu bytes for keys exceeds the device's largest allocation (%llu bytes)",
                        key_bytes, (unsigned long long)ctx->info.max_alloc_bytes);

    iha_kv_cache *c = calloc(1, sizeof *c);
    IHA_RETURN_ERROR_IF(c == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    c->ctx = ctx;
    c->B = p.dims.B;
    c->max_tokens = p.dims.N;
    c->H = p.dims.H;
    c->d = p.dims.d;
    c->P = p.dims.P;
    c->t_max = p.dims.T;
    c->storage = storage;
    c->key_block = p.attention.key_block;
    c->bytes = key_bytes + bytes;
    c->length = calloc(c->B, sizeof *c->length);
    c->step = calloc(2 * c->B, sizeof *c->step);
    cl_int err = CL_SUCCESS, err2 = CL_SUCCESS;
    if (c->length && c->step) {
        c->keys = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, key_bytes, NULL, &err);
        c->values = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, bytes, NULL, &err2);
    }
    if (!c->length || !c->step || err != CL_SUCCESS || err2 != CL_SUCCESS) {
        iha_status st = (!c->length || !c->step) ? iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory")
                                                 : iha__fail_cl(ctx, err != CL_SUCCESS ? err : err2,
                                                                "clCreateBuffer (KV cache)");
        iha_kv_cache_free(c);
        return st;
    }
    link_cache(c);
    *out = c;
    return IHA_OK;
}

void iha_kv_cache_free(iha_kv_cache *cache)
{
    if (cache == NULL) return;
    /* Steps enqueued on the context may still use the buffers. */
    if (cache->ctx && cache->ctx->queue) clFinish(cache->ctx->queue);
    unlink_cache(cache);
    if (cache->keys) clReleaseMemObject(cache->keys);
    if (cache->values) clReleaseMemObject(cache->values);
    free(cache->length);
    free(cache->step);
    free(cache);
}

void iha_kv_cache_reset(iha_kv_cache *cache)
{
    if (cache) memset(cache->length, 0, cache->B * sizeof *cache->length);
}

iha_status iha_kv_cache_truncate(iha_kv_cache *cache, size_t b, size_t tokens)
{
    if (cache == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    /* Host state only, so it also works on a cache whose context is gone (which then gets no
     * message). */
    iha_context *ctx = cache->ctx;
    if (ctx) iha__message_clear(&ctx->message);
    if (b >= cache->B)
        return ctx ? iha__fail(ctx, IHA_ERROR_INVALID_ARGUMENT, "sequence %zu is out of range (batch %zu)", b,
                               cache->B)
                   : IHA_ERROR_INVALID_ARGUMENT;
    if (tokens > cache->length[b])
        return ctx ? iha__fail(ctx, IHA_ERROR_INVALID_ARGUMENT,
                               "cannot truncate sequence %zu to %zu tokens: it holds %zu", b, tokens,
                               cache->length[b])
                   : IHA_ERROR_INVALID_ARGUMENT;
    cache->length[b] = tokens;
    return IHA_OK;
}

size_t iha_kv_cache_length(const iha_kv_cache *cache, size_t b)
{
    return (cache && b < cache->B) ? cache->length[b] : 0;
}

size_t iha_kv_cache_bytes(const iha_kv_cache *cache) { return cache ? cache->bytes : 0; }

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
 * Q, K, V and Y of the new tokens, their pseudo-queries and pseudo-outputs, and the split-key
 * partial results. */
static iha_status check_workspace(iha_context *ctx, const iha_plan *p, const iha_decode_dims *dd)
{
    size_t tokens = 0, pseudo = 0, sum = 0, total = SIZE_MAX;
    if (iha__mul(p->token_elems, 4, &tokens) && iha__mul(p->virtual_elems, 2, &pseudo) &&
        iha__add(tokens, pseudo, &sum) && iha__add(sum, iha__decode_partial_elements(ctx, dd), &sum))
        total = sum;
    return iha__workspace_check_total(ctx, total, sizeof(float));
}

static iha_status decode_step(iha_context *ctx, iha_kv_cache *c, const iha_shape *shape,
                              const iha_attention_options *options, const iha_layer_weights *w,
                              const uint32_t *counts, iha_buffer x, iha_buffer z)
{
    double mark;
    IHA_FORWARD_IF_ERROR(iha__call_begin(ctx, &mark));
    IHA_RETURN_ERROR_IF(c == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "cache is NULL");
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 1, &p));
    /* The window is relative to the whole sequence, not to the step's k tokens. */
    p.window = (uint64_t)options->window >= c->max_tokens ? 0 : (size_t)options->window;
    IHA_FORWARD_IF_ERROR(iha__check_weights(ctx, &p, w, 1));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, x, p.x_elems, p.act_bytes, "x"));
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, z, p.x_elems, p.act_bytes, "z"));
    IHA_FORWARD_IF_ERROR(iha__check_disjoint(ctx, z, p.x_elems, x, p.x_elems, p.act_bytes, "z", "x"));
    IHA_FORWARD_IF_ERROR(iha__check_apart_from_weights(ctx, &p, w, 1, z, p.x_elems, "z"));
    size_t t_cur = 0;
    IHA_FORWARD_IF_ERROR(check_step(ctx, c, &p, counts, &t_cur));
    IHA_FORWARD_IF_ERROR(iha__plan_choose(ctx, shape, options, &p));
    iha_decode_dims dd = {c->B, p.dims.N, c->H, c->d, c->P, c->t_max, t_cur, c->storage == IHA_STORAGE_F16, p.attention, {0}};
    dd.cfg.key_block = c->key_block; /* fixed by the cache's layout */
    IHA_FORWARD_IF_ERROR(iha__tune_choose_decode(ctx, &dd, p.mask, p.window));
    IHA_FORWARD_IF_ERROR(check_workspace(ctx, &p, &dd));

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
    if (p.rope) IHA_FORWARD_IF_ERROR(iha__rope_table(ctx, c->t_max, c->d, p.rope_base, &rope));
    iha_ref xf, zf;
    iha_layer_weights mw;
    IHA_FORWARD_IF_ERROR(iha__input_float(ctx, &p, x, p.x_elems, IHA_WS_X, &xf));
    IHA_FORWARD_IF_ERROR(iha__output_float(ctx, &p, z, p.x_elems, IHA_WS_OUT, &zf));
    IHA_FORWARD_IF_ERROR(iha__mixing_float(ctx, &p, w, &mw));
    /* Blocking, so the staging array may change in the next step at once. */
    IHA_CL_CHECK(ctx, clEnqueueWriteBuffer(ctx->queue, step, CL_TRUE, 0, 2 * c->B * sizeof(cl_int), c->step, 0, NULL, NULL),
                 "clEnqueueWriteBuffer (decode step)");

    IHA_FORWARD_IF_ERROR(iha__project(ctx, &p, rows, hd, p.D, xf, w->wq, (iha_ref){q, 0}));
    IHA_FORWARD_IF_ERROR(iha__project(ctx, &p, rows, hd, p.D, xf, w->wk, (iha_ref){k, 0}));
    IHA_FORWARD_IF_ERROR(iha__project(ctx, &p, rows, hd, p.D, xf, w->wv, (iha_ref){v, 0}));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.projections, &mark));

    IHA_FORWARD_IF_ERROR(
        iha__decode_mix_queries_enqueue(ctx, &dd, (iha_ref){q, 0}, iha__ref_of(mw.alpha_q), (iha_ref){qt, 0}, rope, step));
    IHA_FORWARD_IF_ERROR(
        iha__decode_mix_cache_enqueue(ctx, &dd, (iha_ref){k, 0}, iha__ref_of(mw.alpha_k), c->keys, rope, step, c->key_block));
    IHA_FORWARD_IF_ERROR(
        iha__decode_mix_cache_enqueue(ctx, &dd, (iha_ref){v, 0}, iha__ref_of(mw.alpha_v), c->values, NULL, step, 0));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.mixing, &mark));

    IHA_FORWARD_IF_ERROR(iha__decode_attention_enqueue(ctx, &dd, (iha_ref){qt, 0}, c->keys, c->values, partial,
                                                       (iha_ref){o, 0}, step, p.mask, p.window, p.scale));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.attention, &mark));

    IHA_FORWARD_IF_ERROR(iha__collapse_enqueue(ctx, &p.rows, &p.dims, (iha_ref){o, 0}, iha__ref_of(mw.r), (iha_ref){y, 0}));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.collapse, &mark));

    IHA_FORWARD_IF_ERROR(iha__project(ctx, &p, rows, p.D, hd, (iha_ref){y, 0}, w->wo, zf));
    IHA_FORWARD_IF_ERROR(iha__output_finish(ctx, &p, zf, z, p.x_elems));
    IHA_FORWARD_IF_ERROR(iha__stage_done(ctx, &ctx->stage_times.output, &mark));

    for (size_t b = 0; b < c->B; ++b) c->length[b] += (size_t)c->step[2 * b + 1];
    return IHA_OK;
}

iha_status iha_decode_step(iha_context *ctx, iha_kv_cache *cache, const iha_shape *shape,
                           const iha_attention_options *options, const iha_layer_weights *weights,
                           const uint32_t *counts, iha_buffer x, iha_buffer z)
{
    iha_status st = decode_step(ctx, cache, shape, options, weights, counts, x, z);
    return iha__call_end(ctx, st);
}
