/*
 * bench_decode.c - "iha bench --decode": one generated token per sequence against a cache of
 * L tokens (L*P virtual keys). A decoding step is memory-bound: its attention must read the
 * cached pseudo-keys and -values it sees (a compact cache: the heads' own K and V, P times
 * fewer), so the measure is that read's bandwidth next to the device's copy bandwidth.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/random_layer.h"
#include "common/timer.h"

/* Prompt tokens per prefill step: bounds the step's workspace. */
#define PREFILL_CHUNK 512

/* Keys a query of the last token sees under the mask and window (doc/spec.md's intervals), per head. */
static double visible_keys(const iha_shape *s, const iha_attention_options *o, size_t tokens)
{
    const size_t P = s->pseudo, W = (size_t)o->window;
    size_t keys_tokens = tokens;
    if (W > 0 && W < tokens) keys_tokens = W;
    return (double)keys_tokens * (double)P;
}

/* 16-bit copies of the layer's weights in `storage` (half for --half-weights, bfloat16 for --bf16;
 * released with release_16bit). */
static int upload_16bit_weights(iha_context *ctx, const random_layer *layer, iha_storage storage,
                               iha_layer_weights *out)
{
    const iha_shape *s = &layer->shape;
    const size_t nw = s->model_dim * s->heads * s->head_dim, nm = s->heads * s->heads * s->pseudo;
    const float *src[8] = {layer->wq, layer->wk, layer->wv, layer->wo,
                           layer->alpha_q, layer->alpha_k, layer->alpha_v, layer->r};
    iha_buffer *dst[8] = {&out->wq, &out->wk, &out->wv, &out->wo, &out->alpha_q, &out->alpha_k, &out->alpha_v, &out->r};
    memset(out, 0, sizeof *out);
    for (int i = 0; i < 8; ++i) {
        const size_t n = i < 4 ? nw : nm;
        uint16_t *h = malloc(n * sizeof *h);
        if (!h) return -1;
        if (storage == IHA_STORAGE_BF16)
            iha_bf16_from_float(src[i], h, n);
        else
            iha_half_from_float(src[i], h, n);
        cl_int err = CL_SUCCESS;
        dst[i]->mem = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                     n * sizeof *h, h, &err);
        free(h);
        if (err != CL_SUCCESS) return -1;
    }
    return 0;
}

static void release_16bit(iha_layer_weights *w)
{
    iha_buffer *all[8] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->alpha_q, &w->alpha_k, &w->alpha_v, &w->r};
    for (int i = 0; i < 8; ++i)
        if (all[i]->mem) clReleaseMemObject(all[i]->mem);
}

/* The prefill runs with a window of one token: the cached values do not matter for the step's
 * time, and a global prefill of tens of thousands of tokens would take longer than every step. */
static int fill_cache(iha_context *ctx, const bench_config *c, const random_layer *layer,
                      const iha_layer_weights *weights, iha_kv_cache *cache, cl_mem xs, cl_mem zs)
{
    const iha_shape *s = &layer->shape;
    iha_attention_options prefill = c->options;
    prefill.window = 1;
    size_t done = 0;
    while (done < c->decode_tokens) {
        const size_t k = c->decode_tokens - done < PREFILL_CHUNK ? c->decode_tokens - done : PREFILL_CHUNK;
        const iha_shape step = {s->batch, k, s->model_dim, s->heads, s->head_dim, s->pseudo};
        iha_status st = iha_decode_step(ctx, cache, &step, &prefill, weights, NULL, (iha_buffer){xs, 0},
                                        (iha_buffer){zs, 0});
        if (st != IHA_OK) return bench_fail(ctx, st, "prefill");
        done += k;
    }
    iha_status st = iha_context_finish(ctx);
    return st == IHA_OK ? 0 : bench_fail(ctx, st, "prefill");
}

int bench_decode_run(iha_context *ctx, const bench_config *c, int compact, bench_decode *out)
{
    const iha_shape *core = &c->core;
    const iha_shape shape = {core->batch, c->decode_tokens + 1, c->layer.model_dim, core->heads, core->head_dim,
                             core->pseudo};
    random_layer layer;
    char err[512];
    if (random_layer_create(ctx, &shape, 7, &layer, err, sizeof err)) {
        out->state = BENCH_NOT_RUN;
        snprintf(out->note, sizeof out->note, "%.200s", err);
        return 0;
    }
    iha_kv_cache *cache = NULL;
    cl_mem xs = NULL, zs = NULL;
    int rc = -1;
    /* --half-weights (--bf16): the step reads 16-bit weights and 16-bit x, z (as an application
     * storing its model in half or bfloat16 would). */
    bench_config cc = *c;
    iha_layer_weights narrow_w;
    memset(&narrow_w, 0, sizeof narrow_w);
    const int narrow = c->half_weights || c->bf16;
    const iha_storage narrow_storage = c->bf16 ? IHA_STORAGE_BF16 : IHA_STORAGE_F16;
    if (narrow) {
        cc.options.weight_storage = narrow_storage;
        cc.options.storage = narrow_storage;
        if (upload_16bit_weights(ctx, &layer, narrow_storage, &narrow_w)) {
            release_16bit(&narrow_w);
            random_layer_free(&layer);
            out->state = BENCH_NOT_RUN;
            snprintf(out->note, sizeof out->note, "could not upload 16-bit weights");
            return 0;
        }
    }
    const iha_layer_weights *weights = narrow ? &narrow_w : &layer.weights;
    c = &cc;
    const iha_storage cache_storage = c->bf16 ? IHA_STORAGE_BF16 : c->decode_half ? IHA_STORAGE_F16 : IHA_STORAGE_F32;
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = (int)cache_storage;
    co.compact = compact;
    iha_status st = iha_kv_cache_create_with(ctx, &shape, &co, &cache);
    if (st != IHA_OK) {
        rc = bench_fail(ctx, st, "iha_kv_cache_create");
        goto done;
    }
    /* The prefill chunks read the layer's first rows: the values do not matter for timing. */
    const size_t chunk_rows = shape.batch * PREFILL_CHUNK;
    cl_int e1 = CL_SUCCESS, e2 = CL_SUCCESS;
    const size_t x_elems =
        (chunk_rows < shape.batch * shape.tokens ? chunk_rows : shape.batch * shape.tokens) * shape.model_dim;
    const void *x_host = layer.x;
    uint16_t *x_16bit = NULL; /* as many bytes as the float rows; the first half of them used */
    if (narrow) {
        x_16bit = calloc(2 * x_elems, sizeof *x_16bit);
        if (x_16bit && c->bf16)
            iha_bf16_from_float(layer.x, x_16bit, x_elems);
        else if (x_16bit)
            iha_half_from_float(layer.x, x_16bit, x_elems);
        x_host = x_16bit;
    }
    if (x_host)
        xs = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                            x_elems * sizeof(float), (void *)x_host, &e1);
    else
        e1 = CL_OUT_OF_HOST_MEMORY;
    free(x_16bit);
    zs = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, chunk_rows * shape.model_dim * sizeof(float),
                        NULL, &e2);
    if (e1 != CL_SUCCESS || e2 != CL_SUCCESS) {
        out->state = BENCH_NOT_RUN;
        snprintf(out->note, sizeof out->note, "clCreateBuffer failed (%d, %d)", (int)e1, (int)e2);
        rc = 0;
        goto done;
    }
    if (fill_cache(ctx, c, &layer, weights, cache, xs, zs)) goto done;

    /* Each timed step appends one token per sequence, then the cache is rewound to L tokens. */
    const iha_shape step = {shape.batch, 1, shape.model_dim, shape.heads, shape.head_dim, shape.pseudo};
    double *wall = calloc(2 * (c->reps + 1), sizeof *wall), *att = wall ? wall + c->reps + 1 : NULL;
    if (!wall) {
        fprintf(stderr, "iha bench: out of memory\n");
        goto done;
    }
    for (size_t r = 0; r <= c->reps; ++r) {
        const double start = timer_seconds();
        st = iha_decode_step(ctx, cache, &step, &c->options, weights, NULL, (iha_buffer){xs, 0},
                             (iha_buffer){zs, 0});
        if (st == IHA_OK) st = iha_context_finish(ctx);
        if (st != IHA_OK) {
            free(wall);
            rc = bench_fail(ctx, st, "decode step");
            goto done;
        }
        wall[r] = timer_seconds() - start;
        iha_stage_times t;
        iha_context_stage_times(ctx, &t);
        att[r] = t.attention;
        for (size_t b = 0; b < shape.batch; ++b) iha_kv_cache_truncate(cache, b, c->decode_tokens);
    }
    bench_choice_get(ctx, compact ? "decode_compact" : "decode", &out->choice);
    /* Run 0 is the warm-up (kernel builds). */
    out->step_seconds = timer_median(wall + 1, c->reps);
    out->attention_seconds = timer_median(att + 1, c->reps);
    free(wall);
    const double element = cache_storage == IHA_STORAGE_F32 ? 4.0 : 2.0;
    /* A compact cache holds a token's H rows where the pseudo-token one holds its P rows per head. */
    out->cache_bytes_read = 2.0 * (double)(shape.batch * shape.heads) *
                            visible_keys(&shape, &c->options, c->decode_tokens + 1) * (double)shape.head_dim * element /
                            (compact ? (double)shape.pseudo : 1.0);
    out->cache_bytes_per_token = (double)iha_kv_cache_bytes(cache) / (double)shape.tokens;
    out->state = BENCH_RAN;
    rc = 0;
done:
    release_16bit(&narrow_w);
    if (xs) clReleaseMemObject(xs);
    if (zs) clReleaseMemObject(zs);
    iha_kv_cache_free(cache);
    random_layer_free(&layer);
    return rc;
}
