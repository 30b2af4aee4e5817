/* The KV cache's life: creation with its device buffers, the context's list of live caches, and
 * the host-side bookkeeping of sequence lengths. */
#include <stdlib.h>
#include <string.h>

#include "layer/kv_cache.h"
#include "common/checked.h"
#include "layer/plan.h"
#include "runtime/error.h"

void iha__kv_caches_detach(iha_context *ctx)
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

void iha_kv_cache_options_init(iha_kv_cache_options *options)
{
    if (options == NULL) return;
    memset(options, 0, sizeof *options);
    options->storage = IHA_STORAGE_F32;
}

/* Checks a ring's options against the shape; *ring gets its tokens (0: not a ring). */
static iha_status ring_of(iha_context *ctx, const iha_shape *shape, const iha_kv_cache_options *o, size_t *ring)
{
    IHA_RETURN_ERROR_IF(o->window < 0, ctx, IHA_ERROR_INVALID_ARGUMENT, "negative window %lld",
                        (long long)o->window);
    *ring = 0;
    if (o->cache_tokens == 0 || o->cache_tokens >= shape->tokens) return IHA_OK;
    IHA_RETURN_ERROR_IF(o->window == 0, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "a cache of %zu tokens for sequences of %zu needs a windowed layer (window 0 reads every "
                        "token)",
                        o->cache_tokens, shape->tokens);
    IHA_RETURN_ERROR_IF((uint64_t)o->window > o->cache_tokens, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "a cache of %zu tokens cannot serve a window of %lld tokens (cache_tokens must be at least "
                        "the window)",
                        o->cache_tokens, (long long)o->window);
    *ring = o->cache_tokens;
    return IHA_OK;
}

iha_status iha_kv_cache_create_with(iha_context *ctx, const iha_shape *shape, const iha_kv_cache_options *options,
                                    iha_kv_cache **out)
{
    if (ctx == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    iha__message_clear(&ctx->message);
    IHA_RETURN_ERROR_IF(out == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    iha_kv_cache_options o;
    iha_kv_cache_options_init(&o);
    if (options) o = *options;
    IHA_RETURN_ERROR_IF(!iha__storage_known(o.storage), ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "unknown cache storage %d (use IHA_STORAGE_F32, IHA_STORAGE_F16 or IHA_STORAGE_BF16)",
                        o.storage);
    iha_attention_options defaults;
    iha_attention_options_init(&defaults);
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, &defaults, 0, &p));
    size_t ring = 0;
    IHA_FORWARD_IF_ERROR(ring_of(ctx, shape, &o, &ring));
    const size_t element = o.storage == IHA_STORAGE_F32 ? 4 : 2;
    size_t rows = p.dims.T, values = p.virtual_elems, keys = 0, slots = 0, angle_bytes = 0;
    if (o.compact) {
        /* L tokens and the one before them, whose last P - 1 rows the causal mask reads. */
        slots = ring ? ring + 1 : p.dims.N;
        keys = values = p.dims.B * slots * p.dims.H * p.dims.d; /* at most the pseudo-token cache's */
        if (ring) angle_bytes = p.dims.P * p.dims.d * sizeof(float); /* the rotary rows of positions 0 .. P-1 */
    } else {
        IHA_FORWARD_IF_ERROR(iha__plan_lookup(ctx, shape, &defaults, &p)); /* the keys' block layout */
        const size_t kb = (size_t)p.attention.key_block;
        keys = p.packed_elems;
        if (ring) {
            /* L tokens and the P - 1 rows of the token before them that the causal mask reads. */
            rows = ((ring + 1) * p.dims.P - 1 + kb - 1) / kb * kb;
            keys = values = p.dims.B * p.dims.H * rows * p.dims.d; /* at most the whole cache's */
        }
    }
    size_t bytes, key_bytes;
    IHA_RETURN_ERROR_IF(!iha__mul(values, element, &bytes) || !iha__mul(keys, element, &key_bytes), ctx,
                        IHA_ERROR_SIZE_OVERFLOW, "the cache's size overflows size_t");
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
    c->t_max = rows;
    c->storage = (iha_storage)o.storage;
    c->key_block = o.compact ? 0 : p.attention.key_block;
    c->bytes = key_bytes + bytes + angle_bytes;
    c->compact = o.compact != 0;
    c->slots = slots;
    c->ring_tokens = ring;
    c->window = ring ? (size_t)o.window : 0;
    c->length = calloc(c->B, sizeof *c->length);
    c->reach = calloc(c->B, sizeof *c->reach);
    c->step = calloc(2 * c->B, sizeof *c->step);
    cl_int err = CL_SUCCESS, err2 = CL_SUCCESS;
    const int host_ok = c->length && c->reach && c->step;
    if (host_ok) {
        c->keys = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, key_bytes, NULL, &err);
        c->values = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, bytes, NULL, &err2);
        if (err == CL_SUCCESS && err2 == CL_SUCCESS && angle_bytes)
            c->angles = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, angle_bytes, NULL, &err);
    }
    if (!host_ok || err != CL_SUCCESS || err2 != CL_SUCCESS) {
        iha_status st = !host_ok ? iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory")
                                 : iha__fail_cl(ctx, err != CL_SUCCESS ? err : err2, "clCreateBuffer (KV cache)");
        iha_kv_cache_free(c);
        return st;
    }
    link_cache(c);
    *out = c;
    return IHA_OK;
}

iha_status iha_kv_cache_create(iha_context *ctx, const iha_shape *shape, iha_storage storage, iha_kv_cache **out)
{
    iha_kv_cache_options o;
    iha_kv_cache_options_init(&o);
    o.storage = (int)storage;
    return iha_kv_cache_create_with(ctx, shape, &o, out);
}

void iha_kv_cache_free(iha_kv_cache *cache)
{
    if (cache == NULL) return;
    /* Steps enqueued on the context may still use the buffers. */
    if (cache->ctx && cache->ctx->queue) clFinish(cache->ctx->queue);
    unlink_cache(cache);
    if (cache->keys) clReleaseMemObject(cache->keys);
    if (cache->values) clReleaseMemObject(cache->values);
    if (cache->angles) clReleaseMemObject(cache->angles);
    free(cache->length);
    free(cache->reach);
    free(cache->step);
    free(cache);
}

void iha_kv_cache_reset(iha_kv_cache *cache)
{
    if (cache == NULL) return;
    memset(cache->length, 0, cache->B * sizeof *cache->length);
    memset(cache->reach, 0, cache->B * sizeof *cache->reach);
    cache->rope_fixed = 0;
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
    /* A ring's next step reads back to token tokens - W (the causal mask's P - 1 rows of it);
     * the ring holds the rows from reach*P - t_max on, which cover them from here. */
    const size_t reach = cache->reach[b], L = cache->ring_tokens, W = cache->window;
    if (L && reach > L && tokens + L + 1 < reach + W)
        return ctx ? iha__fail(ctx, IHA_ERROR_INVALID_ARGUMENT,
                               "cannot rewind sequence %zu to %zu tokens: its ring of %zu tokens (window %zu) holds "
                               "what the next step reads only from token %zu on",
                               b, tokens, L, W, reach + W - L - 1)
                   : IHA_ERROR_INVALID_ARGUMENT;
    cache->length[b] = tokens;
    return IHA_OK;
}

size_t iha_kv_cache_length(const iha_kv_cache *cache, size_t b)
{
    return (cache && b < cache->B) ? cache->length[b] : 0;
}

size_t iha_kv_cache_bytes(const iha_kv_cache *cache) { return cache ? cache->bytes : 0; }
