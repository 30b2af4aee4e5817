/*
 * cmd_demo.c - "iha demo": the paper's hybrid layout in miniature. One sliding-window layer
 * (W = N / (2 P^2) tokens) and one global causal layer on a random input of a realistic
 * shape: what ran, time and GFLOP/s per stage, and a check against the float64 reference.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "cli.h"
#include "cost.h"
#include "iha.h"
#include "layer_check.h"
#include "mask_names.h"
#include "random_layer.h"
#include "timer.h"

static cli_option options[] = {
    {"device", "SPEC", "P:D index or name substring (default $IHA_DEVICE, else first GPU)", NULL},
    {"batch", "B", "sequences (default 1)", NULL},
    {"n", "N", "tokens per sequence (default 1024)", NULL},
    {"model-dim", "D", "model width (default 512)", NULL},
    {"heads", "H", "heads (default 8)", NULL},
    {"d", "HEAD_DIM", "head width, 1..256 (default 64)", NULL},
    {"p", "P", "pseudo-heads per head (default 4)", NULL},
    {"window", "W", "window of the sliding layer in tokens (default N/(2P^2), at least 1)", NULL},
    {"rope-base", "BASE", "apply rotary embedding with this base in both layers (default off)", NULL},
    {"reps", "R", "timed runs per layer after one warm-up run; the median is shown (default 5)", NULL},
    {"rows", "K", "output rows checked against the float64 reference (default 12)", NULL},
    {"seed", "S", "random seed of the layer (default 1)", NULL},
    {"half", NULL, "store activations and weights in half precision (float arithmetic; limit 2e-3)", NULL},
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "demo",
    "[options]",
    "Builds a random IHA layer (default B=1 N=1024 D=512 H=8 d=64 P=4) and runs it twice, as\n"
    "the paper's hybrid layout does: a sliding-window causal layer with W = N/(2P^2) tokens and\n"
    "a global causal layer. Prints the median time and GFLOP/s of each stage (FLOPs counted as\n"
    "SPEC.md's cost model says) and checks sampled rows against a float64 reference\n"
    "(relative L2 error at most 1e-5; 2e-3 with --half). Exit status: 0 success, 1 failure or\n"
    "check failed, 2 usage.",
    options,
};

typedef struct demo_config {
    iha_shape shape;
    iha_attention_options sliding, global;
    int half;
    size_t reps, rows;
    uint64_t seed;
} demo_config;

static int read_options(demo_config *c)
{
    iha_shape *s = &c->shape;
    *s = (iha_shape){.batch = 1, .tokens = 1024, .model_dim = 512, .heads = 8, .head_dim = 64, .pseudo = 4};
    c->reps = 5;
    c->rows = 12;
    size_t seed = 1, window = 0;
    float rope_base = 0;
    /* Caps keep every product below overflow; cli_check_layer applies the library's own limits. */
    if (cli_get_size(&spec, "batch", 1, 1 << 16, &s->batch) || cli_get_size(&spec, "n", 1, 1 << 24, &s->tokens) ||
        cli_get_size(&spec, "model-dim", 1, 1 << 16, &s->model_dim) ||
        cli_get_size(&spec, "heads", 1, 1024, &s->heads) ||
        cli_get_size(&spec, "d", 1, CLI_MAX_HEAD_DIM, &s->head_dim) ||
        cli_get_size(&spec, "p", 1, 256, &s->pseudo) || cli_get_size(&spec, "window", 1, 1 << 24, &window) ||
        cli_get_positive_float(&spec, "rope-base", &rope_base) || cli_get_size(&spec, "reps", 1, 1000, &c->reps) ||
        cli_get_size(&spec, "rows", 1, 4096, &c->rows) || cli_get_size(&spec, "seed", 0, SIZE_MAX, &seed))
        return -1;
    if (!cli_get(&spec, "window")) {
        window = s->tokens / (2 * s->pseudo * s->pseudo);
        window = window ? window : 1;
    }
    c->seed = seed;
    iha_attention_options_init(&c->global);
    c->global.rope = cli_get(&spec, "rope-base") != NULL;
    c->global.rope_base = rope_base;
    c->half = cli_get(&spec, "half") != NULL;
    c->global.storage = c->half ? IHA_STORAGE_F16 : IHA_STORAGE_F32;
    c->global.weight_storage = c->global.storage;
    c->sliding = c->global;
    c->sliding.window = (int64_t)window;
    return cli_check_layer(&spec, s, &c->global, "the layer");
}

static void print_row(const char *stage, double seconds, double flops)
{
    printf("  %-13s %10.3f %9.3f %9.1f\n", stage, 1e3 * seconds, 1e-9 * flops, seconds > 0 ? 1e-9 * flops / seconds : 0);
}

static int forward_once(iha_context *ctx, random_layer *layer, const iha_attention_options *o)
{
    iha_status st = iha_forward(ctx, &layer->shape, o, &layer->weights, (iha_buffer){layer->x_mem, 0},
                                (iha_buffer){layer->z_mem, 0});
    if (st == IHA_OK)
        st = iha_context_finish(ctx);
    if (st != IHA_OK)
        cli_error(&spec, "%s: %s", iha_status_name(st), iha_context_message(ctx));
    return st == IHA_OK ? 0 : -1;
}

/* The first run builds the kernels and is the one checked (into a NaN-poisoned output). */
static int check_layer(iha_context *ctx, random_layer *layer, const iha_attention_options *o, size_t rows, int *ok)
{
    char err[512];
    const iha_shape *s = &layer->shape;
    if (random_layer_poison_output(ctx, layer, err, sizeof err)) {
        cli_error(&spec, "%s", err);
        return -1;
    }
    if (forward_once(ctx, layer, o))
        return -1;
    if (random_layer_read_output(ctx, layer, err, sizeof err)) {
        cli_error(&spec, "%s", err);
        return -1;
    }
    size_t count = s->batch * s->tokens * s->model_dim, bad = layer_check_nonfinite(layer->z, count), used = 0;
    double rel = 0;
    iha_host_weights w = {layer->wq, layer->wk, layer->wv, layer->wo,
                          layer->alpha_q, layer->alpha_k, layer->alpha_v, layer->r};
    if (layer_check_reference(s, o, &w, layer->x, layer->z, rows, &rel, &used, err, sizeof err)) {
        cli_error(&spec, "%s", err);
        return -1;
    }
    const double limit = layer->half ? LAYER_CHECK_F16_LIMIT : LAYER_CHECK_F32_LIMIT;
    int rel_ok = rel <= limit; /* false for NaN */
    printf("  check: %zu of %zu outputs not finite %s\n", bad, count, bad ? "FAILED" : "ok");
    printf("  check: %zu of %zu rows vs float64 reference, relative L2 error %.2e (limit %.0e) %s\n", used,
           s->batch * s->tokens, rel, limit, rel_ok ? "ok" : "FAILED");
    *ok = *ok && rel_ok && !bad;
    return 0;
}

static int time_layer(iha_context *ctx, random_layer *layer, const iha_attention_options *o, size_t reps)
{
    double *samples = malloc(6 * reps * sizeof *samples);
    if (!samples) {
        cli_error(&spec, "out of memory");
        return -1;
    }
    double *wall = samples, *proj = wall + reps, *mix = proj + reps, *att = mix + reps, *col = att + reps,
           *out = col + reps;
    for (size_t i = 0; i < reps; i++) {
        double start = timer_seconds();
        if (forward_once(ctx, layer, o)) {
            free(samples);
            return -1;
        }
        wall[i] = timer_seconds() - start;
        iha_stage_times t;
        iha_context_stage_times(ctx, &t);
        proj[i] = t.projections;
        mix[i] = t.mixing;
        att[i] = t.attention;
        col[i] = t.collapse;
        out[i] = t.output;
    }
    cost_flops f;
    cost_layer_flops(&layer->shape, o, &f);
    printf("  %-13s %10s %9s %9s\n", "stage", "ms", "GFLOP", "GFLOP/s");
    print_row("projections", timer_median(proj, reps), f.projections);
    print_row("mixing", timer_median(mix, reps), f.mixing);
    print_row("attention", timer_median(att, reps), f.attention);
    print_row("collapse", timer_median(col, reps), f.collapse);
    print_row("output", timer_median(out, reps), f.output);
    print_row("layer (wall)", timer_median(wall, reps), cost_total(&f));
    free(samples);
    return 0;
}

static void describe_layer(int index, const iha_shape *s, const iha_attention_options *o)
{
    if (o->window > 0)
        printf("\nlayer %d: sliding window, mask %s, W = %" PRId64 " tokens (%" PRId64
               " virtual keys per query at most)\n",
               index, mask_names[o->mask], o->window, o->window * (int64_t)s->pseudo);
    else
        printf("\nlayer %d: global, mask %s (T = %zu virtual tokens)\n", index, mask_names[o->mask],
               s->tokens * s->pseudo);
}

int cmd_demo(int argc, char **argv)
{
    int code = cli_parse(&spec, argc, argv);
    if (code >= 0)
        return code;
    demo_config c;
    if (read_options(&c))
        return CLI_EXIT_USAGE;
    iha_context_options context_options;
    iha_context_options_init(&context_options);
    context_options.time_stages = 1;
    iha_context *ctx;
    if (cli_open_context(&spec, &context_options, &ctx)) return CLI_EXIT_FAILURE;
    char message[1024];
    const iha_shape *s = &c.shape;
    random_layer layer;
    if (random_layer_create(ctx, s, c.seed, &layer, message, sizeof message) ||
        (c.half && random_layer_use_half(ctx, &layer, message, sizeof message))) {
        if (layer.x) random_layer_free(&layer);
        cli_error(&spec, "%s", message);
        iha_context_free(ctx);
        return CLI_EXIT_FAILURE;
    }
    printf("iha demo (library %s)\n", iha_version_string());
    printf("  device  %s\n", iha_context_device_name(ctx));
    printf("  shape   B=%zu N=%zu D=%zu H=%zu d=%zu P=%zu, rotary %s, seed %" PRIu64 "\n", s->batch, s->tokens,
           s->model_dim, s->heads, s->head_dim, s->pseudo, c.global.rope ? "on" : "off", c.seed);
    printf("  storage %s\n", c.half ? "half (activations and weights; float arithmetic)" : "float");
    printf("  timing  median of %zu runs after one checked warm-up run; stages timed one by one\n", c.reps);
    int ok = 1, failed = 0;
    const iha_attention_options *layers[2] = {&c.sliding, &c.global};
    for (int i = 0; i < 2 && !failed; i++) {
        describe_layer(i + 1, s, layers[i]);
        fflush(stdout);
        failed = check_layer(ctx, &layer, layers[i], c.rows, &ok) || time_layer(ctx, &layer, layers[i], c.reps);
    }
    random_layer_free(&layer);
    iha_context_free(ctx);
    if (!failed && !ok)
        printf("\nFAILED: an output differs from the float64 reference beyond the %s contract\n",
               c.half ? "half-storage" : "float32");
    return failed || !ok ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}
