/*
 * bench_ring.c - "iha bench --decode --ring L": generation far past a ring KV cache's L tokens.
 * One sequence set goes through a ring of L tokens (iha_kv_cache_create_with, cache_tokens L,
 * the layer's --window) and the same through a cache that keeps every token; at L, 4L and 16L
 * cached tokens both time one generated token per sequence, and the bytes of the ring and of a
 * full cache holding those tokens are read. The ring's step and bytes follow the window and L;
 * the full cache's bytes grow with the position.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/random_layer.h"
#include "common/timer.h"

/* Prompt tokens per prefill step, as bench_decode.c's. */
#define RING_PREFILL_CHUNK 512

static const size_t kMultiples[BENCH_RING_POSITIONS] = {1, 4, 16};

/* Appends tokens to every sequence until each holds `to`. */
static int prefill(iha_context *ctx, const bench_config *c, const random_layer *layer, iha_kv_cache *cache,
                   size_t to, cl_mem xs, cl_mem zs)
{
    const iha_shape *s = &layer->shape;
    for (size_t done = iha_kv_cache_length(cache, 0); done < to;) {
        const size_t k = to - done < RING_PREFILL_CHUNK ? to - done : RING_PREFILL_CHUNK;
        const iha_shape step = {s->batch, k, s->model_dim, s->heads, s->head_dim, s->pseudo};
        iha_status st = iha_decode_step(ctx, cache, &step, &c->options, &layer->weights, NULL, (iha_buffer){xs, 0},
                                        (iha_buffer){zs, 0});
        if (st != IHA_OK) return bench_fail(ctx, st, "prefill");
        done += k;
    }
    iha_status st = iha_context_finish(ctx);
    return st == IHA_OK ? 0 : bench_fail(ctx, st, "prefill");
}

/* The median of reps timed steps of one token per sequence (after a warm-up step), each
 * rewound to the position before the next. */
static int time_step(iha_context *ctx, const bench_config *c, const random_layer *layer, iha_kv_cache *cache,
                     cl_mem xs, cl_mem zs, double *median)
{
    const iha_shape *s = &layer->shape;
    const iha_shape step = {s->batch, 1, s->model_dim, s->heads, s->head_dim, s->pseudo};
    const size_t at = iha_kv_cache_length(cache, 0);
    double *wall = calloc(c->reps + 1, sizeof *wall);
    if (!wall) {
        fprintf(stderr, "iha bench: out of memory\n");
        return -1;
    }
    for (size_t r = 0; r <= c->reps; ++r) {
        const double start = timer_seconds();
        iha_status st = iha_decode_step(ctx, cache, &step, &c->options, &layer->weights, NULL, (iha_buffer){xs, 0},
                                        (iha_buffer){zs, 0});
        if (st == IHA_OK) st = iha_context_finish(ctx);
        for (size_t b = 0; st == IHA_OK && b < s->batch; ++b) st = iha_kv_cache_truncate(cache, b, at);
        if (st != IHA_OK) {
            free(wall);
            return bench_fail(ctx, st, "decode step");
        }
        wall[r] = timer_seconds() - start;
    }
    *median = timer_median(wall + 1, c->reps);
    free(wall);
    return 0;
}

/* The bytes of a cache that keeps every one of `tokens` tokens (0 if it cannot be made). */
static size_t full_bytes(iha_context *ctx, const iha_shape *shape, iha_storage storage, size_t tokens)
{
    iha_shape s = *shape;
    s.tokens = tokens;
    iha_kv_cache *cache = NULL;
    if (iha_kv_cache_create(ctx, &s, storage, &cache) != IHA_OK) return 0;
    const size_t bytes = iha_kv_cache_bytes(cache);
    iha_kv_cache_free(cache);
    return bytes;
}

int bench_ring_run(iha_context *ctx, const bench_config *c, bench_ring *out)
{
    const iha_shape *core = &c->core;
    const size_t L = c->ring_tokens, last = kMultiples[BENCH_RING_POSITIONS - 1] * L;
    const iha_shape shape = {core->batch, last + 1, c->layer.model_dim, core->heads, core->head_dim, core->pseudo};
    const iha_storage storage = c->decode_half ? IHA_STORAGE_F16 : IHA_STORAGE_F32;
    out->cache_tokens = L;
    random_layer layer;
    char err[512];
    if (random_layer_create(ctx, &shape, 11, &layer, err, sizeof err)) {
        out->state = BENCH_NOT_RUN;
        snprintf(out->note, sizeof out->note, "%.200s", err);
        return 0;
    }
    iha_kv_cache *ring = NULL, *full = NULL;
    cl_mem xs = NULL, zs = NULL;
    int rc = -1;
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = (int)storage;
    co.window = c->options.window;
    co.cache_tokens = L;
    iha_status st = iha_kv_cache_create_with(ctx, &shape, &co, &ring);
    if (st == IHA_OK) st = iha_kv_cache_create(ctx, &shape, storage, &full);
    if (st != IHA_OK) {
        rc = bench_fail(ctx, st, "creating the caches");
        goto done;
    }
    /* The prefill reads the layer's first rows: the values do not matter for timing. */
    const size_t rows = shape.batch * (RING_PREFILL_CHUNK < shape.tokens ? RING_PREFILL_CHUNK : shape.tokens);
    cl_int e1 = CL_SUCCESS, e2 = CL_SUCCESS;
    xs = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                        rows * shape.model_dim * sizeof(float), layer.x, &e1);
    zs = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, rows * shape.model_dim * sizeof(float), NULL,
                        &e2);
    if (e1 != CL_SUCCESS || e2 != CL_SUCCESS) {
        out->state = BENCH_NOT_RUN;
        snprintf(out->note, sizeof out->note, "clCreateBuffer failed (%d, %d)", (int)e1, (int)e2);
        rc = 0;
        goto done;
    }
    for (size_t i = 0; i < BENCH_RING_POSITIONS; ++i) {
        bench_ring_position *at = &out->at[i];
        at->tokens = kMultiples[i] * L;
        if (prefill(ctx, c, &layer, ring, at->tokens, xs, zs) || prefill(ctx, c, &layer, full, at->tokens, xs, zs) ||
            time_step(ctx, c, &layer, ring, xs, zs, &at->ring_step_seconds) ||
            time_step(ctx, c, &layer, full, xs, zs, &at->full_step_seconds))
            goto done;
        at->ring_cache_bytes = iha_kv_cache_bytes(ring);
        at->full_cache_bytes = full_bytes(ctx, &shape, storage, at->tokens + 1);
    }
    out->state = BENCH_RAN;
    rc = 0;
done:
    if (xs) clReleaseMemObject(xs);
    if (zs) clReleaseMemObject(zs);
    iha_kv_cache_free(ring);
    iha_kv_cache_free(full);
    random_layer_free(&layer);
    return rc;
}
