/*
 * bench_packed.c - "iha bench --seq-lens": the attention core (iha_attention) on one batch row
 * packing the given sequences (options->seq_lens), against the same sequences run one by one,
 * and against one sequence of their total length (what packing saves). Every time is a median
 * of reps runs after a warm-up run, the three taking turns; the sequences alone are timed as
 * consecutive calls, each with its own buffers, as an application without packing would run
 * them.
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench.h"
#include "common/rng.h"
#include "common/timer.h"

/* Qt, Kt, Vt and O [H][T][d] of one problem: the packed row, or one sequence alone. */
typedef struct packed_buffers {
    cl_mem in[3], out;
} packed_buffers;

static void release(packed_buffers *b, size_t count)
{
    for (size_t k = 0; k < count; k++) {
        for (int i = 0; i < 3; i++)
            if (b[k].in[i]) clReleaseMemObject(b[k].in[i]);
        if (b[k].out) clReleaseMemObject(b[k].out);
    }
}

static cl_int create(iha_context *ctx, const iha_shape *s, rng *g, packed_buffers *b)
{
    const size_t elems = s->heads * s->tokens * s->pseudo * s->head_dim;
    float *host = malloc(elems * sizeof *host);
    cl_int err = host ? CL_SUCCESS : CL_OUT_OF_HOST_MEMORY;
    for (int i = 0; i < 3 && err == CL_SUCCESS; i++) {
        rng_fill(g, host, elems, 1.0f);
        b->in[i] = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                  elems * sizeof *host, host, &err);
    }
    free(host);
    if (err == CL_SUCCESS)
        b->out = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, elems * sizeof(float), NULL, &err);
    return err;
}

static iha_status run_once(iha_context *ctx, const iha_shape *shape, const iha_attention_options *o,
                           const packed_buffers *b)
{
    const iha_buffer none = {NULL, 0};
    iha_status st = iha_attention(ctx, shape, o, (iha_buffer){b->in[0], 0}, (iha_buffer){b->in[1], 0},
                                  (iha_buffer){b->in[2], 0}, (iha_buffer){b->out, 0}, none);
    return st == IHA_OK ? iha_context_finish(ctx) : st;
}

/* One way of running the problem: `calls` calls, call i on shapes[i] with buffers b[i]. */
typedef struct packed_way {
    const iha_shape *shapes;
    const iha_attention_options *options;
    const packed_buffers *b;
    size_t calls;
} packed_way;

static iha_status run_way(iha_context *ctx, const packed_way *w)
{
    iha_status st = IHA_OK;
    for (size_t i = 0; i < w->calls && st == IHA_OK; i++) st = run_once(ctx, &w->shapes[i], w->options, &w->b[i]);
    return st;
}

/* The median of reps timed runs of each of the three ways, after a warm-up of each. The ways
 * take turns within each rep, so a shared machine's load, which drifts over seconds, weighs on
 * all three alike. */
static iha_status time_ways(iha_context *ctx, const bench_config *c, const packed_way ways[3], double seconds[3])
{
    double *samples = malloc(3 * c->reps * sizeof *samples);
    if (!samples) return IHA_ERROR_HOST_MEMORY;
    iha_status st = IHA_OK;
    for (int k = 0; k < 3 && st == IHA_OK; k++) st = run_way(ctx, &ways[k]);
    for (size_t r = 0; r < c->reps && st == IHA_OK; r++)
        for (int k = 0; k < 3 && st == IHA_OK; k++) {
            const double start = timer_seconds();
            st = run_way(ctx, &ways[k]);
            samples[k * c->reps + r] = timer_seconds() - start;
        }
    for (int k = 0; k < 3 && st == IHA_OK; k++) seconds[k] = timer_median(samples + k * c->reps, c->reps);
    free(samples);
    return st;
}

int bench_packed_run(iha_context *ctx, const bench_config *c, bench_packed *out)
{
    const iha_shape row = c->core; /* batch 1, tokens = the lengths' sum */
    const size_t n = c->seq_count;
    /* b[0]: the packed row; b[1 + i]: sequence i alone. */
    packed_buffers *b = calloc(n + 1, sizeof *b);
    iha_shape *shapes = malloc(n * sizeof *shapes);
    cl_int err = b && shapes ? CL_SUCCESS : CL_OUT_OF_HOST_MEMORY;
    rng g = {11};
    if (err == CL_SUCCESS) err = create(ctx, &row, &g, &b[0]);
    out->visible_pairs = 0;
    for (size_t i = 0; i < n && err == CL_SUCCESS; i++) {
        shapes[i] = row;
        shapes[i].tokens = c->seq_lens[i];
        out->visible_pairs += cost_visible_pairs(&shapes[i], &c->options);
        err = create(ctx, &shapes[i], &g, &b[1 + i]);
    }
    if (err != CL_SUCCESS) {
        fprintf(stderr, "iha bench: allocating the packed sequences' buffers failed (OpenCL error %d)\n", (int)err);
        if (b) release(b, n + 1);
        free(b), free(shapes);
        return -1;
    }
    const double heads = (double)row.heads;
    out->visible_pairs *= heads;
    out->unpacked_pairs = heads * cost_visible_pairs(&row, &c->options);
    iha_attention_options packed = c->options;
    packed.seq_lens = c->seq_lens;
    packed.seq_count = n;
    const packed_way ways[3] = {{&row, &packed, &b[0], 1}, {shapes, &c->options, &b[1], n}, {&row, &c->options, &b[0], 1}};
    double seconds[3] = {0, 0, 0};
    iha_status st = run_way(ctx, &ways[0]);
    if (st == IHA_OK) bench_choice_get(ctx, "attention", &out->choice); /* the packed call's */
    if (st == IHA_OK) st = time_ways(ctx, c, ways, seconds);
    out->packed_seconds = seconds[0], out->separate_seconds = seconds[1], out->unpacked_seconds = seconds[2];
    release(b, n + 1);
    free(b), free(shapes);
    if (st != IHA_OK) return bench_fail(ctx, st, "packed sequences");
    out->state = BENCH_RAN;
    return 0;
}
