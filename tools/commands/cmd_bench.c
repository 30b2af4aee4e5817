/*
 * cmd_bench.c - "iha bench": the attention core, a whole layer, the device's ceilings, the
 * unfused baseline and cold-start costs, measured in one run and printed as a table or as
 * JSON. The measuring lives in bench_*.c and cold_start.c, the printing in bench_report.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "commands/cli.h"
#include "common/layer_options.h"
#include "iha.h"

static cli_option options[] = {
    CLI_OPTION_DEVICE,
    CLI_OPTION_BATCH("1"),
    CLI_OPTION_HEADS("8"),
    CLI_OPTION_TOKENS("tokens per sequence of the attention core (default 2048)"),
    CLI_OPTION_PSEUDO("4; T = N*P"),
    CLI_OPTION_HEAD_DIM("64"),
    CLI_OPTION_MASK("causal, token_causal or none (default causal)"),
    CLI_OPTION_WINDOW("sliding window in tokens, 0 = global (default 0)"),
    CLI_OPTION_ROPE_BASE("with --decode: rotary embedding at virtual positions with this base (d even; default off)"),
    {"layer-n", "N", "tokens per sequence of the whole layer (default 1024)", NULL},
    CLI_OPTION_MODEL_DIM("model width of the whole layer (default 512)"),
    {"reps", "R", "timed runs after one warm-up run; medians are shown (default 3)", NULL},
    {"baseline-reps", "R", "timed one-sequence runs of the unfused baseline, scaled by B*H (default: reps)", NULL},
    {"json", NULL, "print one JSON object instead of the table (keys: doc/benchmarking.md)", NULL},
    {"no-layer", NULL, "skip the whole-layer section", NULL},
    {"no-ceilings", NULL, "skip the ceilings (copy, CLBlast/library/host SGEMM, peak FMA, attention loops)", NULL},
    {"no-baseline", NULL, "skip the unfused baseline", NULL},
    {"no-cold-start", NULL, "skip the cold-start child processes", NULL},
    {"backward", NULL, "also time iha_attention_backward on the core's problem and iha_backward on the layer", NULL},
    {"decode", NULL, "measure a decoding step (one new token per sequence) instead of core, layer, cold start", NULL},
    {"cache-tokens", "L", "with --decode: tokens already cached per sequence (default 4096)", NULL},
    {"half", NULL, "with --decode: store the cache in half precision", NULL},
    {"compact", NULL, "with --decode: also the compact cache (the heads' own keys and values), in the same run", NULL},
    {"ring", "L", "with --decode: also steps at L, 4L and 16L cached tokens on a ring cache of L tokens (needs "
                  "--window W <= L) beside a full cache",
     NULL},
    {"seq-lens", "L1,L2,...", "time the attention core on one row packing these sequences against them one by one", NULL},
    {"half-weights", NULL, "store the layer's (or with --decode the step's) weights, x and z in half precision", NULL},
    {"bf16", NULL, "store the layer's (or the step's) weights, x and z, with --decode also the cache, in bfloat16",
     NULL},
    {"core-half", NULL, "store the attention core's qt, kt, vt and o in half (where a tuned profile allows, NVIDIA's "
                        "tensor cores run it); needs --no-baseline, excludes --backward",
     NULL},
    {"cold-start-child", "DIR", "internal: measure one cold start with program cache DIR and print one line", NULL},
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "bench",
    "[options]",
    "Measures, in one run: the attention core (iha_attention, default B*H=8, T=N*P=8192, d=64,\n"
    "causal) with GFLOP/s over visible pairs (doc/spec.md's cost model) and bytes moved; a whole layer\n"
    "(iha_forward, default B=1 N=1024 D=512) per stage; the device's ceilings (copy bandwidth,\n"
    "CLBlast SGEMM, the library's own SGEMM kernel, a peak-FMA kernel, the attention kernel's\n"
    "score and P.V loops alone, and on a CPU device the host's CBLAS SGEMM) with each result as\n"
    "a fraction of them; the unfused baseline (GEMM, softmax, GEMM) for T <= 8192, timed on\n"
    "single (b, h) sequences and scaled by B*H, and the fused speed-up over it; and cold-start\n"
    "costs in child processes with fresh program caches.\n"
    "With --backward, also the core's gradients (iha_attention_backward, from one iha_attention\n"
    "call's o and lse; off by default, as the first backward kernel is slow): GFLOP/s counting\n"
    "10*d FLOPs per visible pair (FlashAttention-2's five products, 2.5x the forward's 4*d) and\n"
    "the ratio of its time to the core's in the same run; and, unless --no-layer, the layer's\n"
    "backward pass (iha_backward: dx and every weight's gradient) per stage, against the layer.\n"
    "With --decode, instead of the core, baseline, layer and cold start: a decoding step (one\n"
    "token per sequence; B, H, d, P, --model-dim, mask, window and --rope-base as given) against a cache of\n"
    "--cache-tokens tokens, its cache-read bandwidth next to the copy bandwidth, tokens/s;\n"
    "With --decode --ring L, also generation far past a ring KV cache: one token per sequence at\n"
    "L, 4L and 16L cached tokens on a ring of L tokens for the layer's --window, beside a cache that\n"
    "keeps every token: step times and cache bytes.\n"
    "With --decode --compact, the same step on the compact cache too (1/P of the bytes).\n"
    "--cache-tokens, --half, --compact, --rope-base and --ring need --decode; --n, --baseline-reps and\n"
    "--backward refuse it.\n"
    "--half-weights stores the weights, x and z in half (IHA_STORAGE_F16 activations and weights):\n"
    "the layer's, and with --backward also dz, dx and every gradient; with --decode the step's.\n"
    "--bf16 stores the same tensors in bfloat16 (IHA_STORAGE_BF16), and with --decode also the\n"
    "cache; it excludes --half and --half-weights.\n"
    "The attention core stays float unless --core-half stores its qt, kt, vt and o in half.\n"
    "With --seq-lens, instead of the core, baseline, layer and cold start: iha_attention on one\n"
    "batch row packing the sequences (options->seq_lens; H, d, P, mask and window as given), the\n"
    "same sequences run one by one, and one sequence of their total length; --n, --batch,\n"
    "--decode and --backward refuse it.\n"
    "Exit status: 0 success, 1 failure, 2 usage.",
    options,
};

int bench_fail(iha_context *ctx, iha_status status, const char *what)
{
    cli_error(&spec, "%s: %s: %s", what, iha_status_name(status), iha_context_message(ctx));
    return -1;
}

void bench_choice_get(const iha_context *ctx, const char *kernel, bench_choice *out)
{
    memset(out, 0, sizeof *out);
    iha_kernel_choice choices[8];
    size_t n = 0;
    if (iha_context_last_choices(ctx, choices, 8, &n) != IHA_OK) return;
    for (size_t i = 0; i < n && i < 8; i++) {
        if (strcmp(choices[i].kernel, kernel) != 0) continue;
        out->found = 1;
        snprintf(out->config, sizeof out->config, "%s", choices[i].config);
        out->source = choices[i].source;
        snprintf(out->source_bucket, sizeof out->source_bucket, "%s", choices[i].source_bucket);
        return;
    }
}

/* --seq-lens "L1,L2,...": positive lengths, at most BENCH_MAX_SEQS, their sum at most 2^24. */
static int read_seq_lens(const char *text, bench_config *c)
{
    size_t sum = 0;
    c->seq_count = 0;
    for (const char *p = text;;) {
        char *end;
        errno = 0;
        const unsigned long long v = strtoull(p, &end, 10);
        if (end == p || *p == '-' || errno || v == 0 || v > (1u << 24) || (*end != ',' && *end != '\0') ||
            c->seq_count == BENCH_MAX_SEQS || (sum += (size_t)v) > (1u << 24)) {
            cli_error(&spec, "--seq-lens takes 1 to %d positive lengths separated by commas, summing to at most %u "
                             "tokens, not '%s'",
                      BENCH_MAX_SEQS, 1u << 24, text);
            return -1;
        }
        c->seq_lens[c->seq_count++] = (size_t)v;
        if (*end == '\0') break;
        p = end + 1;
    }
    c->core.tokens = sum;
    return 0;
}

/* Parses the command line into the configuration: -1 when the command should go on, else the exit code to
 * return at once (cli_parse's, or CLI_EXIT_USAGE after a usage message). */
static int read_options(int argc, char **argv, bench_config *c)
{
    const int code = cli_parse(&spec, argc, argv);
    if (code >= 0)
        return code;
    memset(c, 0, sizeof *c);
    /* The core and the layer share B, H, d and P; --n is the core's tokens, --layer-n and
     * --model-dim the layer's. */
    iha_shape s = {.batch = 1, .tokens = 2048, .model_dim = 512, .heads = 8, .head_dim = 64, .pseudo = 4};
    size_t layer_n = 1024;
    c->reps = 3;
    iha_attention_options_init(&c->options);
    if (cli_get_shape(&spec, 1 << 24, &s) || cli_get_attention(&spec, 0, 1 << 24, &c->options) ||
        cli_get_size(&spec, "layer-n", 1, 1 << 24, &layer_n) || cli_get_size(&spec, "reps", 1, 1000, &c->reps))
        return CLI_EXIT_USAGE;
    c->baseline_reps = c->reps;
    if (cli_get_size(&spec, "baseline-reps", 1, 1000, &c->baseline_reps))
        return CLI_EXIT_USAGE;
    c->core = s;
    c->core.model_dim = 1;
    c->layer = s;
    c->layer.tokens = layer_n;
    c->device = cli_get(&spec, "device");
    c->json = cli_get(&spec, "json") != NULL;
    c->run_layer = !cli_get(&spec, "no-layer");
    c->run_ceilings = !cli_get(&spec, "no-ceilings");
    c->run_baseline = !cli_get(&spec, "no-baseline");
    c->run_cold_start = !cli_get(&spec, "no-cold-start");
    c->run_decode = cli_get(&spec, "decode") != NULL;
    c->run_backward = cli_get(&spec, "backward") != NULL;
    c->decode_half = cli_get(&spec, "half") != NULL;
    c->decode_compact = cli_get(&spec, "compact") != NULL;
    c->half_weights = cli_get(&spec, "half-weights") != NULL;
    c->bf16 = cli_get(&spec, "bf16") != NULL;
    c->core_half = cli_get(&spec, "core-half") != NULL;
    if (c->core_half && (c->run_baseline || c->run_backward)) {
        cli_error(&spec, "--core-half needs --no-baseline (the baseline compares in float) and excludes --backward");
        return CLI_EXIT_USAGE;
    }
    if (c->bf16 && (c->decode_half || c->half_weights)) {
        cli_error(&spec, "--bf16 excludes --half and --half-weights");
        return CLI_EXIT_USAGE;
    }
    c->decode_tokens = 4096;
    c->ring_tokens = 0;
    if (cli_get_size(&spec, "cache-tokens", 1, 1 << 22, &c->decode_tokens) ||
        cli_get_size(&spec, "ring", 1, 1 << 18, &c->ring_tokens))
        return CLI_EXIT_USAGE;
    /* An option that the chosen measurement would not use is refused rather than ignored: a run
     * with --half but without --decode would otherwise look like a half-precision result. */
    static const char *const decode_only[] = {"cache-tokens", "half", "ring", "compact", "rope-base", NULL};
    static const char *const core_only[] = {"n", "baseline-reps", "backward", "core-half", NULL};
    const char *const *unused = c->run_decode ? core_only : decode_only;
    for (size_t i = 0; unused[i]; i++) {
        if (!cli_get(&spec, unused[i]))
            continue;
        if (c->run_decode)
            cli_error(&spec, "--%s applies to the attention core, which --decode does not run (--cache-tokens "
                             "sets the decoding step's cache)", unused[i]);
        else
            cli_error(&spec, "--%s sets the decoding step and needs --decode (see 'iha bench --help')", unused[i]);
        return CLI_EXIT_USAGE;
    }
    if ((c->half_weights || c->bf16) && !c->run_decode && !c->run_layer) {
        cli_error(&spec, "--%s applies to the layer (or with --decode the decoding step), which --no-layer skips",
                  c->bf16 ? "bf16" : "half-weights");
        return CLI_EXIT_USAGE;
    }
    if (c->ring_tokens && (c->options.window < 1 || (uint64_t)c->options.window > c->ring_tokens ||
                           c->options.mask == IHA_MASK_NONE)) {
        cli_error(&spec, "--ring %zu needs a causal or token_causal layer with --window W, 1 <= W <= %zu (a ring "
                         "keeps the tokens a window reads)", c->ring_tokens, c->ring_tokens);
        return CLI_EXIT_USAGE;
    }
    if (c->run_decode)
        c->run_layer = c->run_baseline = c->run_cold_start = 0;
    const char *seq_lens = cli_get(&spec, "seq-lens");
    if (seq_lens) {
        static const char *const refused[] = {"n", "batch", "decode", "backward", NULL};
        for (size_t i = 0; refused[i]; i++)
            if (cli_get(&spec, refused[i])) {
                cli_error(&spec, "--%s does not apply with --seq-lens (one batch row of the given sequences)",
                          refused[i]);
                return CLI_EXIT_USAGE;
            }
        if (read_seq_lens(seq_lens, c)) return CLI_EXIT_USAGE;
        c->run_layer = c->run_baseline = c->run_cold_start = 0;
    }
    /* The decoding step's cache holds the cached tokens and the new one. */
    iha_shape decode = c->core;
    decode.tokens = c->decode_tokens + 1;
    decode.model_dim = c->layer.model_dim;
    if (c->run_decode ? cli_check_layer(&spec, &decode, &c->options, "the decoding step")
                      : cli_check_layer(&spec, &c->core, NULL, "the attention core") ||
                            (c->run_layer && cli_check_layer(&spec, &c->layer, NULL, "the layer")))
        return CLI_EXIT_USAGE;
    return -1;
}

/* Progress on stderr, only for a person watching: the whole run takes a minute or so. */
static void progress(const char *what)
{
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "iha bench: %s ...\n", what);
}

static int device_is_cpu(iha_context *ctx)
{
    cl_device_type type = 0;
    return clGetDeviceInfo(iha_context_cl_device(ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL) == CL_SUCCESS &&
           (type & CL_DEVICE_TYPE_CPU);
}

/* The 1-minute load average, or -1 where /proc/loadavg cannot be read (not Linux). */
static double load_average(void)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double load = -1.0;
    if (f == NULL)
        return load;
    if (fscanf(f, "%lf", &load) != 1)
        load = -1.0;
    fclose(f);
    return load;
}

/* Everything that runs in this process, on one context with stage timing on. */
static int measure(const bench_config *c, bench_results *r)
{
    iha_context *ctx;
    if (cli_open_timed_context(&spec, &ctx)) return -1;
    snprintf(r->device, sizeof r->device, "%s", iha_context_device_name(ctx));
    r->device_is_cpu = device_is_cpu(ctx);
    int failed = 0;
    if (c->run_ceilings) {
        progress("ceilings (copy, CLBlast SGEMM, peak FMA, attention loops, host SGEMM)");
        failed = bench_ceilings_run(ctx, c, r->device_is_cpu, &r->ceilings);
    }
    if (!failed && c->run_decode) {
        progress("decoding step");
        failed = bench_decode_run(ctx, c, 0, &r->decode);
        if (!failed && c->decode_compact) {
            progress("decoding step on the compact cache");
            failed = bench_decode_run(ctx, c, 1, &r->decode_compact);
        }
        if (!failed && c->ring_tokens) {
            progress("decoding on a ring cache and a full one");
            failed = bench_ring_run(ctx, c, &r->ring);
        }
    } else if (!failed && c->seq_count) {
        progress("packed sequences, then one by one");
        failed = bench_packed_run(ctx, c, &r->packed);
    } else if (!failed) {
        char what[64];
        snprintf(what, sizeof what, "attention core%s%s", c->run_baseline ? ", unfused baseline" : "",
                 c->run_backward ? ", backward pass" : "");
        progress(what);
        failed = bench_core_run(ctx, c, &r->core, &r->baseline, &r->backward);
    }
    if (!failed && c->run_layer) {
        progress("whole layer");
        failed = bench_layer_run(ctx, c, &r->layer);
    }
    if (!failed && c->run_ceilings) {
        progress("compute ceilings again");
        failed = bench_ceilings_recheck(ctx, c, &r->ceilings);
    }
    iha_context_free(ctx);
    return failed;
}

int cmd_bench(int argc, char **argv)
{
    bench_config c;
    const int code = read_options(argc, argv, &c);
    if (code >= 0)
        return code;
    const char *child_dir = cli_get(&spec, "cold-start-child");
    if (child_dir)
        return bench_cold_start_child(&c, child_dir) ? CLI_EXIT_FAILURE : CLI_EXIT_OK;

    bench_results r;
    memset(&r, 0, sizeof r);
    r.load.start = load_average();
    r.load.cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (measure(&c, &r))
        return CLI_EXIT_FAILURE;
    if (c.run_cold_start) {
        progress("cold start in child processes");
        bench_cold_start_run(argc, argv, &r.cold);
    }
    r.load.end = load_average();
    r.load.known = r.load.start >= 0.0 && r.load.end >= 0.0;
    if (c.json)
        bench_print_json(&c, &r);
    else
        bench_print_table(&c, &r);
    return CLI_EXIT_OK;
}
