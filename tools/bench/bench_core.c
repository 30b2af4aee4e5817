/*
 * bench_core.c - the attention core alone (iha_attention on device buffers of mixed
 * sequences), the unfused baseline on the same inputs with a check that both agree, and with
 * --backward the core's gradients (iha_attention_backward) from the same inputs.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench.h"
#include "common/rng.h"
#include "common/timer.h"

/* Qt, Kt, Vt and the two outputs, each [B][H][T][d]; with --backward also the gradient of the
 * output dO (random, like the inputs), the gradients dQt, dKt, dVt, and the log-sum-exp [B][H][T]. */
typedef struct core_buffers {
    size_t elems;
    cl_mem qt, kt, vt, fused, unfused;
    cl_mem dout, dqt, dkt, dvt, lse;
} core_buffers;

static void release_buffers(core_buffers *b)
{
    cl_mem *all[] = {&b->qt, &b->kt, &b->vt, &b->fused, &b->unfused, &b->dout, &b->dqt, &b->dkt, &b->dvt, &b->lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (*all[i])
            clReleaseMemObject(*all[i]);
        *all[i] = NULL;
    }
}

static int create_buffers(iha_context *ctx, const bench_config *c, core_buffers *b)
{
    const iha_shape *s = &c->core;
    b->elems = s->batch * s->heads * s->tokens * s->pseudo * s->head_dim; /* bounded by the option caps */
    const size_t bytes = c->core_half ? sizeof(uint16_t) : sizeof(float);
    float *host = malloc(b->elems * sizeof *host);
    uint16_t *halves = c->core_half ? malloc(b->elems * sizeof *halves) : NULL;
    if (!host || (c->core_half && !halves)) {
        free(host);
        fprintf(stderr, "iha bench: out of host memory for the attention inputs\n");
        return -1;
    }
    cl_context cl = iha_context_cl_context(ctx);
    cl_mem *inputs[] = {&b->qt, &b->kt, &b->vt, &b->dout};
    cl_mem *outputs[] = {&b->fused, &b->unfused, &b->dqt, &b->dkt, &b->dvt};
    const int n_inputs = c->run_backward ? 4 : 3, n_outputs = c->run_backward ? 5 : 2;
    cl_int err = CL_SUCCESS;
    rng g = {7};
    for (int i = 0; i < n_inputs && err == CL_SUCCESS; i++) {
        rng_fill(&g, host, b->elems, 1.0f);
        if (halves) iha_half_from_float(host, halves, b->elems);
        *inputs[i] = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, b->elems * bytes,
                                    halves ? (void *)halves : (void *)host, &err);
    }
    free(host);
    free(halves);
    for (int i = 0; i < n_outputs && err == CL_SUCCESS; i++)
        *outputs[i] = clCreateBuffer(cl, CL_MEM_READ_WRITE, b->elems * bytes, NULL, &err);
    if (err == CL_SUCCESS && c->run_backward)
        b->lse = clCreateBuffer(cl, CL_MEM_READ_WRITE, b->elems / s->head_dim * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "iha bench: clCreateBuffer for the attention core failed with OpenCL error %d\n", (int)err);
        release_buffers(b);
        return -1;
    }
    return 0;
}

static iha_buffer at(cl_mem m) { return (iha_buffer){m, 0}; }

/* One call of what is timed, until it has finished on the device. */
typedef iha_status (*core_call)(iha_context *ctx, const bench_config *c, const core_buffers *b);

/* --core-half stores the core's tensors in half; the layer keeps its own storage. */
static iha_status fused_once(iha_context *ctx, const bench_config *c, const core_buffers *b)
{
    iha_attention_options o = c->options;
    if (c->core_half) o.storage = IHA_STORAGE_F16;
    iha_status st = iha_attention(ctx, &c->core, &o, at(b->qt), at(b->kt), at(b->vt), at(b->fused),
                                  (iha_buffer){NULL, 0});
    return st == IHA_OK ? iha_context_finish(ctx) : st;
}

static iha_status backward_once(iha_context *ctx, const bench_config *c, const core_buffers *b)
{
    iha_status st = iha_attention_backward(ctx, &c->core, &c->options, at(b->qt), at(b->kt), at(b->vt), at(b->fused),
                                           at(b->lse), at(b->dout), at(b->dqt), at(b->dkt), at(b->dvt));
    return st == IHA_OK ? iha_context_finish(ctx) : st;
}

/* The median of `reps` timed runs of `call`; the caller has warmed up. */
static iha_status time_call(iha_context *ctx, const bench_config *c, const core_buffers *b, core_call call,
                            double *seconds)
{
    double *samples = malloc(c->reps * sizeof *samples);
    if (!samples)
        return IHA_ERROR_HOST_MEMORY;
    iha_status st = IHA_OK;
    for (size_t i = 0; i < c->reps && st == IHA_OK; i++) {
        double start = timer_seconds();
        st = call(ctx, c, b);
        samples[i] = timer_seconds() - start;
    }
    if (st == IHA_OK)
        *seconds = timer_median(samples, c->reps);
    free(samples);
    return st;
}

/* ||fused - unfused|| / ||unfused|| over the first `elems` floats of the outputs. */
static int compare_outputs(iha_context *ctx, const core_buffers *b, size_t elems, double *rel)
{
    float *x = malloc(2 * elems * sizeof *x);
    if (!x)
        return -1;
    float *y = x + elems;
    cl_command_queue q = iha_context_cl_queue(ctx);
    cl_int err = clEnqueueReadBuffer(q, b->fused, CL_TRUE, 0, elems * sizeof *x, x, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueReadBuffer(q, b->unfused, CL_TRUE, 0, elems * sizeof *y, y, 0, NULL, NULL);
    double num = 0, den = 0;
    for (size_t i = 0; i < elems && err == CL_SUCCESS; i++) {
        double d = (double)x[i] - (double)y[i];
        num += d * d;
        den += (double)y[i] * (double)y[i];
    }
    free(x);
    if (err != CL_SUCCESS)
        return -1;
    *rel = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
    return 0;
}

/* The unfused baseline on one (b, h) sequence: slice `index` of the [B*H][T][d] tensors. */
static iha_status unfused_slice(iha_context *ctx, const iha_shape *one, const iha_attention_options *o,
                                const core_buffers *b, size_t index)
{
    const size_t at = index * one->tokens * one->pseudo * one->head_dim;
    iha_status st = iha_attention_unfused(ctx, one, o, (iha_buffer){b->qt, at}, (iha_buffer){b->kt, at},
                                          (iha_buffer){b->vt, at}, (iha_buffer){b->unfused, at});
    return st == IHA_OK ? iha_context_finish(ctx) : st;
}

/* The baseline handles one (b, h) at a time with nothing shared between them, so its time is
 * B*H times that of one sequence: it is timed on baseline_reps sequences (0, 1, ...) after a
 * warm-up on sequence 0, and the median is scaled by B*H. This keeps the default run short
 * (one T = 8192 sequence takes seconds on a CPU) without guessing. */
static int run_baseline(iha_context *ctx, const bench_config *c, const core_buffers *b, bench_baseline *out)
{
    const iha_shape *s = &c->core;
    const size_t T = s->tokens * s->pseudo, sequences = s->batch * s->heads;
    if (T > BENCH_BASELINE_MAX_T) {
        out->state = BENCH_NOT_RUN;
        snprintf(out->note, sizeof out->note, "T = %zu exceeds %d, the largest T the baseline is run for", T,
                 BENCH_BASELINE_MAX_T);
        return 0;
    }
    iha_shape one = *s;
    one.batch = one.heads = 1;
    iha_status st = unfused_slice(ctx, &one, &c->options, b, 0);
    if (st == IHA_ERROR_UNSUPPORTED) {
        out->state = BENCH_NOT_RUN;
        snprintf(out->note, sizeof out->note, "%s", iha_context_message(ctx));
        return 0;
    }
    const size_t reps = c->baseline_reps;
    double *samples = malloc(reps * sizeof *samples);
    if (!samples)
        st = IHA_ERROR_HOST_MEMORY;
    for (size_t i = 0; i < reps && st == IHA_OK; i++) {
        double start = timer_seconds();
        st = unfused_slice(ctx, &one, &c->options, b, i % sequences);
        samples[i] = timer_seconds() - start;
    }
    if (st == IHA_OK) {
        out->sequence_seconds = timer_median(samples, reps);
        out->seconds = out->sequence_seconds * (double)sequences;
        out->sequences_timed = reps < sequences ? reps : sequences;
    }
    free(samples);
    if (st != IHA_OK)
        return bench_fail(ctx, st, "unfused baseline");
    if (compare_outputs(ctx, b, out->sequences_timed * (b->elems / sequences), &out->rel_difference)) {
        fprintf(stderr, "iha bench: reading the attention outputs back failed\n");
        return -1;
    }
    out->state = BENCH_RAN;
    return 0;
}

/* The gradients need the forward's o and its log-sum-exp, which the timed core runs do not
 * write: one more forward call writes both, then the backward is warmed up and timed like the
 * core. dO is random: the time does not depend on its values. */
static int run_backward(iha_context *ctx, const bench_config *c, const core_buffers *b, bench_backward *out)
{
    const iha_shape *s = &c->core;
    iha_status st = iha_attention(ctx, s, &c->options, at(b->qt), at(b->kt), at(b->vt), at(b->fused), at(b->lse));
    if (st == IHA_OK)
        st = iha_context_finish(ctx);
    if (st != IHA_OK)
        return bench_fail(ctx, st, "attention core with log-sum-exp, for the backward pass");
    st = backward_once(ctx, c, b); /* warm-up: builds the kernels */
    if (st == IHA_OK)
        st = time_call(ctx, c, b, backward_once, &out->seconds);
    if (st != IHA_OK)
        return bench_fail(ctx, st, "attention backward");
    out->state = BENCH_RAN;
    return 0;
}

int bench_core_run(iha_context *ctx, const bench_config *c, bench_core *core, bench_baseline *baseline,
                   bench_backward *backward)
{
    const iha_shape *s = &c->core;
    const double d = (double)s->head_dim, bh = (double)(s->batch * s->heads);
    const double pairs = bh * cost_visible_pairs(s, &c->options); /* over all B*H sequences */
    core->flops = 4 * d * pairs;
    backward->flops = 10 * d * pairs; /* FlashAttention-2's convention (bench.h) */
    core->bytes = 4 * bh * (double)(s->tokens * s->pseudo) * d * (c->core_half ? 2.0 : 4.0);
    core_buffers b = {0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    if (create_buffers(ctx, c, &b))
        return -1;
    iha_status st = fused_once(ctx, c, &b); /* warm-up: builds the kernels */
    if (st == IHA_OK) {
        bench_choice_get(ctx, "attention", &core->choice);
        st = time_call(ctx, c, &b, fused_once, &core->seconds);
    }
    int failed = st != IHA_OK ? bench_fail(ctx, st, "attention core") : 0;
    if (!failed)
        core->state = BENCH_RAN;
    if (!failed && c->run_baseline)
        failed = run_baseline(ctx, c, &b, baseline);
    if (!failed && c->run_backward) {
        backward->forward_seconds = core->seconds;
        failed = run_backward(ctx, c, &b, backward);
    }
    release_buffers(&b);
    return failed;
}
