/*
 * bench_layer.c - a whole random layer through iha_forward with the context's stage timing:
 * median seconds per stage, FLOPs per stage, and the bytes that the memory-bound stages
 * (mixing, collapse) must move; with --backward also iha_backward of the same layer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/random_layer.h"
#include "common/timer.h"

/* The counts documented at bench_layer in bench.h (float32, each tensor touched once). */
static void count_bytes(const iha_shape *s, bench_layer *out)
{
    const double f = sizeof(float), b = (double)s->batch, n = (double)s->tokens, h = (double)s->heads;
    const double d = (double)s->head_dim, p = (double)s->pseudo;
    const double tokens = b * n * h * d, virt = b * h * n * p * d, mix = h * h * p;
    out->mixing_bytes = f * (3 * tokens + 3 * mix + 3 * virt);
    out->collapse_bytes = f * (virt + mix + tokens);
}

/* reps timed passes after the caller's warm-up: the median of each stage. */
static int time_passes(iha_context *ctx, random_layer *layer, const bench_config *c, const iha_attention_options *o,
                       bench_layer *out)
{
    char err[512];
    if (random_layer_time_forward(ctx, layer, o, c->reps, &out->wall, &out->stages, err, sizeof err)) {
        fprintf(stderr, "iha bench: layer: %s\n", err);
        return -1;
    }
    return 0;
}

/* The layer's backward pass and the saved training pair, interleaved so that a noisy stretch of
 * a shared machine hits both alike: one warm-up of each, then per rep iha_backward (wall and
 * stages), iha_forward_save and iha_backward_saved; medians of each. */
static int time_backward(iha_context *ctx, random_layer *layer, const bench_config *c, const iha_attention_options *o,
                         bench_layer *out)
{
    random_layer_grads g = {{NULL}, NULL};
    const size_t reps = c->reps;
    double *samples = malloc(8 * reps * sizeof *samples);
    char err[256] = "";
    int failed = samples == NULL || random_layer_grads_create(ctx, &layer->shape, &g, err, sizeof err);
    if (failed && samples) fprintf(stderr, "iha bench: layer backward: %s\n", err);
    iha_status st = failed ? IHA_OK : random_layer_backward(ctx, layer, o, &g);
    if (!failed && st == IHA_OK) st = random_layer_forward_save(ctx, layer, o, &g);
    if (!failed && st == IHA_OK) st = random_layer_backward_saved(ctx, layer, o, &g);
    for (size_t i = 0; !failed && i < reps && st == IHA_OK; i++) {
        double start = timer_seconds();
        st = random_layer_backward(ctx, layer, o, &g);
        samples[i] = timer_seconds() - start;
        iha_stage_times t;
        iha_context_stage_times(ctx, &t);
        const double stage[5] = {t.projections, t.mixing, t.attention, t.collapse, t.output};
        for (int k = 0; k < 5; k++) samples[(size_t)(k + 1) * reps + i] = stage[k];
        start = timer_seconds();
        if (st == IHA_OK) st = random_layer_forward_save(ctx, layer, o, &g);
        samples[6 * reps + i] = timer_seconds() - start;
        start = timer_seconds();
        if (st == IHA_OK) st = random_layer_backward_saved(ctx, layer, o, &g);
        samples[7 * reps + i] = timer_seconds() - start;
    }
    size_t saved = 0;
    if (!failed && st == IHA_OK) st = iha_saved_elements(ctx, &layer->shape, &saved);
    if (!failed && st == IHA_OK) {
        double m[8];
        for (int k = 0; k < 8; k++) m[k] = timer_median(samples + (size_t)k * reps, reps);
        out->backward_wall = m[0];
        out->backward_stages = (iha_stage_times){m[1], m[2], m[3], m[4], m[5]};
        out->forward_save_wall = m[6];
        out->backward_saved_wall = m[7];
        out->saved_bytes = (double)saved * sizeof(float);
        out->backward_ran = 1;
    }
    random_layer_grads_free(&g);
    free(samples);
    if (samples == NULL) fprintf(stderr, "iha bench: out of host memory\n");
    return failed ? -1 : st == IHA_OK ? 0 : bench_fail(ctx, st, "layer backward");
}

/* Whether the last layer call's GEMM entry names the library's kernel ("backend=1"). */
static int uses_library_gemm(const iha_context *ctx)
{
    bench_choice gemm;
    bench_choice_get(ctx, "gemm", &gemm);
    return gemm.found && strstr(gemm.config, "backend=1") != NULL;
}

int bench_layer_run(iha_context *ctx, const bench_config *c, bench_layer *out)
{
    const iha_shape *s = &c->layer;
    cost_layer_flops(s, &c->options, &out->flops);
    count_bytes(s, out);
    random_layer layer;
    char err[512];
    if (random_layer_create(ctx, s, 1, &layer, err, sizeof err)) {
        fprintf(stderr, "iha bench: layer: %s\n", err);
        return -1;
    }
    /* --half-weights (--bf16): x, z and the weights in half (bfloat16); the gradient buffers are
     * float-sized, which holds their 16-bit elements; dz is the 16-bit z. */
    iha_attention_options o = c->options;
    if (c->half_weights || c->bf16) {
        o.storage = o.weight_storage = c->bf16 ? IHA_STORAGE_BF16 : IHA_STORAGE_F16;
        if (random_layer_use_storage(ctx, &layer, (iha_storage)o.storage, err, sizeof err)) {
            fprintf(stderr, "iha bench: layer: %s\n", err);
            random_layer_free(&layer);
            return -1;
        }
    }
    iha_status st = random_layer_forward(ctx, &layer, &o); /* warm-up: builds kernels, sizes workspace */
    int failed = st != IHA_OK ? bench_fail(ctx, st, "layer") : time_passes(ctx, &layer, c, &o, out);
    if (!failed) out->library_gemm = uses_library_gemm(ctx);
    if (!failed && c->run_backward) failed = time_backward(ctx, &layer, c, &o, out);
    random_layer_free(&layer);
    if (!failed)
        out->state = BENCH_RAN;
    return failed;
}
