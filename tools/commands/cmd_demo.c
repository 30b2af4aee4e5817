/*
 * cmd_demo.c - "iha demo": the paper's hybrid layout in miniature. One sliding-window layer
 * (W = N / (2 P^2) tokens) and one global causal layer on a random input of a realistic
 * shape: what ran, time and GFLOP/s per stage, and a check against the float64 reference.
 */
#include <inttypes.h>
#include <stdio.h>

#include "bench/cost.h"
#include "commands/cli.h"
#include "common/layer_check.h"
#include "common/layer_options.h"
#include "iha.h"
#include "common/mask_names.h"
#include "common/random_layer.h"

static cli_option options[] = {
    CLI_OPTION_DEVICE,
    CLI_OPTION_BATCH("1"),
    CLI_OPTION_TOKENS("tokens per sequence (default 1024)"),
    CLI_OPTION_MODEL_DIM("model width (default 512)"),
    CLI_OPTION_HEADS("8"),
    CLI_OPTION_HEAD_DIM("64"),
    CLI_OPTION_PSEUDO("4"),
    CLI_OPTION_WINDOW("window of the sliding layer in tokens (default N/(2P^2), at least 1)"),
    CLI_OPTION_ROPE_BASE("apply rotary embedding with this base in both layers (default off)"),
    {"reps", "R", "timed runs per layer after one warm-up run; the median is shown (default 5)", NULL},
    {"rows", "K", "output rows checked against the float64 reference (default 12)", NULL},
    CLI_OPTION_SEED,
    {"half", NULL, "store activations and weights in half precision (float arithmetic; limit 2e-3)", NULL},
    {"bf16", NULL, "store activations and weights in bfloat16 (float arithmetic; limit 1e-2)", NULL},
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "demo",
    "[options]",
    "Builds a random IHA layer (default B=1 N=1024 D=512 H=8 d=64 P=4) and runs it twice, as\n"
    "the paper's hybrid layout does: a sliding-window causal layer with W = N/(2P^2) tokens and\n"
    "a global causal layer. Prints the median time and GFLOP/s of each stage (FLOPs counted as\n"
    "doc/spec.md's cost model says) and checks sampled rows against a float64 reference\n"
    "(relative L2 error at most 1e-5; 2e-3 with --half, 1e-2 with --bf16; not both). Exit status:\n"
    "0 success, 1 failure or check failed, 2 usage.",
    options,
};

typedef struct demo_config {
    iha_shape shape;
    iha_attention_options sliding, global;
    iha_storage storage; /* of activations and weights */
    size_t reps, rows;
    uint64_t seed;
} demo_config;

/* Parses the command line into the configuration: -1 when the command should go on, else the exit code to
 * return at once (cli_parse's, or CLI_EXIT_USAGE after a usage message). */
static int read_options(int argc, char **argv, demo_config *c)
{
    const int code = cli_parse(&spec, argc, argv);
    if (code >= 0)
        return code;
    iha_shape *s = &c->shape;
    *s = (iha_shape){.batch = 1, .tokens = 1024, .model_dim = 512, .heads = 8, .head_dim = 64, .pseudo = 4};
    c->reps = 5;
    c->rows = 12;
    size_t seed = 1;
    /* --window sets the sliding layer's; the global layer is the same one without it. */
    iha_attention_options_init(&c->sliding);
    if (cli_get_shape(&spec, 1 << 24, s) || cli_get_attention(&spec, 1, 1 << 24, &c->sliding) ||
        cli_get_size(&spec, "reps", 1, 1000, &c->reps) || cli_get_size(&spec, "rows", 1, 4096, &c->rows) ||
        cli_get_size(&spec, "seed", 0, SIZE_MAX, &seed))
        return CLI_EXIT_USAGE;
    size_t window = (size_t)c->sliding.window;
    if (!cli_get(&spec, "window")) {
        window = s->tokens / (2 * s->pseudo * s->pseudo);
        window = window ? window : 1;
    }
    c->seed = seed;
    c->global = c->sliding;
    c->global.window = 0;
    if (cli_get(&spec, "half") && cli_get(&spec, "bf16")) {
        cli_error(&spec, "--half and --bf16 exclude each other");
        return CLI_EXIT_USAGE;
    }
    c->storage = cli_get(&spec, "half") ? IHA_STORAGE_F16 : cli_get(&spec, "bf16") ? IHA_STORAGE_BF16 : IHA_STORAGE_F32;
    c->global.storage = c->storage;
    c->global.weight_storage = c->global.storage;
    c->sliding = c->global;
    c->sliding.window = (int64_t)window;
    return cli_check_layer(&spec, s, &c->global, "the layer") ? CLI_EXIT_USAGE : -1;
}

static void print_row(const char *stage, double seconds, double flops)
{
    printf("  %-13s %10.3f %9.3f %9.1f\n", stage, 1e3 * seconds, 1e-9 * flops, seconds > 0 ? 1e-9 * flops / seconds : 0);
}

static int forward_once(iha_context *ctx, random_layer *layer, const iha_attention_options *o)
{
    const iha_status st = random_layer_forward(ctx, layer, o);
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
    const iha_host_weights w = random_layer_host_weights(layer);
    if (layer_check_reference(s, o, &w, layer->x, layer->z, rows, &rel, &used, err, sizeof err)) {
        cli_error(&spec, "%s", err);
        return -1;
    }
    const double limit = layer->storage == IHA_STORAGE_F16    ? LAYER_CHECK_F16_LIMIT
                         : layer->storage == IHA_STORAGE_BF16 ? LAYER_CHECK_BF16_LIMIT
                                                              : LAYER_CHECK_F32_LIMIT;
    int rel_ok = rel <= limit; /* false for NaN */
    printf("  check: %zu of %zu outputs not finite %s\n", bad, count, bad ? "FAILED" : "ok");
    printf("  check: %zu of %zu rows vs float64 reference, relative L2 error %.2e (limit %.0e) %s\n", used,
           s->batch * s->tokens, rel, limit, rel_ok ? "ok" : "FAILED");
    *ok = *ok && rel_ok && !bad;
    return 0;
}

static int time_layer(iha_context *ctx, random_layer *layer, const iha_attention_options *o, size_t reps)
{
    char err[512];
    double wall;
    iha_stage_times t;
    if (random_layer_time_forward(ctx, layer, o, reps, &wall, &t, err, sizeof err)) {
        cli_error(&spec, "%s", err);
        return -1;
    }
    cost_flops f;
    cost_layer_flops(&layer->shape, o, &f);
    printf("  %-13s %10s %9s %9s\n", "stage", "ms", "GFLOP", "GFLOP/s");
    print_row("projections", t.projections, f.projections);
    print_row("mixing", t.mixing, f.mixing);
    print_row("attention", t.attention, f.attention);
    print_row("collapse", t.collapse, f.collapse);
    print_row("output", t.output, f.output);
    print_row("layer (wall)", wall, cost_total(&f));
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
    demo_config c;
    const int code = read_options(argc, argv, &c);
    if (code >= 0)
        return code;
    iha_context *ctx;
    if (cli_open_timed_context(&spec, &ctx)) return CLI_EXIT_FAILURE;
    char message[1024];
    const iha_shape *s = &c.shape;
    random_layer layer;
    if (random_layer_create(ctx, s, c.seed, &layer, message, sizeof message) ||
        (c.storage != IHA_STORAGE_F32 && random_layer_use_storage(ctx, &layer, c.storage, message, sizeof message))) {
        if (layer.x) random_layer_free(&layer);
        cli_error(&spec, "%s", message);
        iha_context_free(ctx);
        return CLI_EXIT_FAILURE;
    }
    printf("iha demo (library %s)\n", iha_version_string());
    printf("  device  %s\n", iha_context_device_name(ctx));
    printf("  shape   B=%zu N=%zu D=%zu H=%zu d=%zu P=%zu, rotary %s, seed %" PRIu64 "\n", s->batch, s->tokens,
           s->model_dim, s->heads, s->head_dim, s->pseudo, c.global.rope ? "on" : "off", c.seed);
    static const char *const storage_names[3] = {"float", "half (activations and weights; float arithmetic)",
                                                 "bfloat16 (activations and weights; float arithmetic)"};
    printf("  storage %s\n", storage_names[c.storage]);
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
               c.storage == IHA_STORAGE_F16 ? "half-storage" : c.storage == IHA_STORAGE_BF16 ? "bfloat16" : "float32");
    return failed || !ok ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}
