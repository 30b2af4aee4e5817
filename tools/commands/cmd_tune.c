/*
 * cmd_tune.c - "iha tune": tunes the kernels of a layer shape on one device within a time
 * budget, with a progress bar (candidates, best so far) on stderr and a before/after table on
 * stdout, and stores the winners in the device's profile. --exhaustive is the benchmark: it
 * first runs the budgeted search, then times every configuration of the same space, and prints
 * the space's spread (worst, median, best) next to what the budgeted search chose.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands/cli.h"
#include "common/layer_options.h"
#include "iha.h"
#include "iha_tune.h"

static cli_option options[] = {
    CLI_OPTION_DEVICE,
    {"budget-s", "S", "wall-clock budget in seconds for the whole run (default 40)", NULL},
    {"shapes", "demo|B,N,D,H,d,P", "layer shape (default demo: 1,1024,512,8,64,4)", NULL},
    {"widths", "LIST", "comma-separated head widths to tune the shape at, each with D scaled by width/d (default: d)",
     NULL},
    {"layers", "both|global|sliding", "causal layers to tune: global, sliding window N/(2P^2), both (default)", NULL},
    {"kernels", "LIST", "comma-separated attention,rows,gemm,decode,backward,decode_compact (default all)", NULL},
    CLI_OPTION_ROPE_BASE("rotary embedding with this base in the layers (default off); of the kernels only "
                         "decode_compact tunes per rotary setting"),
    {"storage", "float|half|bf16", "the layers' activation storage: half and bf16 have attention buckets of their own, "
                                   "where NVIDIA's tensor cores may serve them (default float)",
     NULL},
    {"reps", "R", "timed runs per candidate, median taken (default 5)", NULL},
    {"dry-run", NULL, "measure and report, but store nothing", NULL},
    {"exhaustive", NULL, "benchmark: budgeted search, then every configuration (slow); needs --kernels without gemm",
     NULL},
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "tune",
    "[options]",
    "Measures candidate configurations of the layer's kernels on this device: attention, mixing and\n"
    "collapse (rows), the layer's SGEMMs (gemm: which backend runs them, the library's own kernel\n"
    "cl/gemm.cl or CLBlast, and each one's parameters), the decoding step's attention (decode) and\n"
    "the attention backward of training (backward).\n"
    "Each candidate is verified against a float64 reference on a small problem; the fastest goes\n"
    "into the device's tuning profile (`iha profile path`). Progress goes to stderr; the\n"
    "before/after table to stdout. Times are medians per run of each kernel's timing problem.\n"
    "--exhaustive needs --kernels without gemm (the default, all kernels, includes it): CLBlast's\n"
    "space has millions of configurations. Exit status: 0 success, 1 failure, 2 usage.",
    options,
};

static int parse_shape(const char *text, iha_shape *s)
{
    *s = (iha_shape){.batch = 1, .tokens = 1024, .model_dim = 512, .heads = 8, .head_dim = 64, .pseudo = 4};
    if (text == NULL || strcmp(text, "demo") == 0) return 0;
    char tail;
    if (sscanf(text, "%zu,%zu,%zu,%zu,%zu,%zu%c", &s->batch, &s->tokens, &s->model_dim, &s->heads, &s->head_dim,
               &s->pseudo, &tail) != 6)
        return -1;
    return 0;
}

#define MAX_WIDTHS 8

/* --widths: up to MAX_WIDTHS distinct head widths of 1 to 256; the shape's own d when absent. */
static int parse_widths(const char *text, const iha_shape *shape, size_t *widths, size_t *count)
{
    *count = 0;
    if (text == NULL) {
        widths[(*count)++] = shape->head_dim;
        return 0;
    }
    char buf[128];
    const size_t len = strlen(text);
    /* strtok would skip the empty items of "64,", ",64" and "64,,96" */
    if (len == 0 || len >= sizeof buf || text[0] == ',' || text[len - 1] == ',' || strstr(text, ",,")) return -1;
    memcpy(buf, text, len + 1);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *end;
        unsigned long w = strtoul(tok, &end, 10);
        if (*tok < '0' || *tok > '9' || *end != '\0' || w < 1 || w > 256 || *count == MAX_WIDTHS) return -1;
        for (size_t i = 0; i < *count; ++i)
            if (widths[i] == w) return -1;
        widths[(*count)++] = w;
    }
    return *count > 0 ? 0 : -1;
}

/* The shape at head width w: the model width keeps its ratio to H*d (rounded down, at least 1). */
static iha_shape at_width(const iha_shape *s, size_t w)
{
    iha_shape out = *s;
    out.head_dim = w;
    out.model_dim = s->model_dim * w / s->head_dim;
    if (out.model_dim == 0) out.model_dim = 1;
    return out;
}

static int parse_kernels(const char *text, unsigned *out)
{
    *out = 0;
    if (text == NULL || strcmp(text, "all") == 0) return 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (strcmp(tok, "attention") == 0) *out |= IHA_TUNE_ATTENTION;
        else if (strcmp(tok, "rows") == 0) *out |= IHA_TUNE_ROWS;
        else if (strcmp(tok, "gemm") == 0) *out |= IHA_TUNE_GEMM;
        else if (strcmp(tok, "decode") == 0) *out |= IHA_TUNE_DECODE;
        else if (strcmp(tok, "backward") == 0) *out |= IHA_TUNE_BACKWARD;
        else if (strcmp(tok, "decode_compact") == 0) *out |= IHA_TUNE_DECODE_COMPACT;
        else return -1;
    }
    return 0;
}

/* ---- Progress bar ---- */

/* What the exhaustive pass saw: every candidate's first time, and the finalists' re-timing. */
typedef struct seen_config {
    size_t task;
    int confirming;
    double seconds;
    char config[512];
} seen_config;

typedef struct bar_state {
    int tty;
    size_t last_task;
    seen_config *seen;
    size_t seen_count, seen_capacity;
} bar_state;

static void record(bar_state *b, const iha_tune_progress *p)
{
    if (p->task_done || p->candidate_config[0] == '\0' || p->candidate_s < 0) return; /* the last report repeats */
    if (b->seen_count == b->seen_capacity) {
        size_t cap = b->seen_capacity ? 2 * b->seen_capacity : 256;
        seen_config *grown = realloc(b->seen, cap * sizeof *grown);
        if (grown == NULL) return;
        b->seen = grown;
        b->seen_capacity = cap;
    }
    seen_config *e = &b->seen[b->seen_count++];
    e->task = p->task;
    e->confirming = p->confirming;
    e->seconds = p->candidate_s;
    snprintf(e->config, sizeof e->config, "%s", p->candidate_config);
}

/* The time of `config` in task `task`: its re-timing among the finalists when it was one
 * (*confirmed = 1), else its first pass; 0 when never timed. */
static double time_of(const bar_state *b, size_t task, const char *config, int *confirmed)
{
    double first = 0;
    *confirmed = 0;
    for (size_t i = 0; i < b->seen_count; i++) {
        const seen_config *e = &b->seen[i];
        if (e->task != task || strcmp(e->config, config) != 0) continue;
        if (e->confirming) {
            *confirmed = 1;
            return e->seconds;
        }
        first = e->seconds;
    }
    return first;
}

static void on_progress(const iha_tune_progress *p, void *user)
{
    bar_state *b = user;
    record(b, p);
    const double frac = p->budget_s > 0 ? p->elapsed_s / p->budget_s : 0;
    char bar[21];
    for (int i = 0; i < 20; i++) bar[i] = i < (int)(20 * frac + 0.5) ? '#' : '.';
    bar[20] = '\0';
    if (!b->tty && !p->task_done) return; /* a log file gets one line per task */
    fprintf(stderr, "%s[%s] %3.0fs/%.0fs task %zu/%zu %-9s %zu cand (%zu rej)  best %8.3f ms  default %8.3f ms%s",
            b->tty ? "\r" : "", bar, p->elapsed_s, p->budget_s, p->task + 1, p->tasks, p->kernel, p->candidates,
            p->rejected, 1e3 * p->best_s, 1e3 * p->default_s, b->tty ? "\033[K" : "");
    if (p->task_done) fprintf(stderr, "\n");
    fflush(stderr);
    b->last_task = p->task;
}

/* ---- Table ---- */

static void print_table(const iha_tune_result *r, size_t n)
{
    printf("\n%-9s %-58s %10s %10s %7s %6s\n", "kernel", "bucket", "before ms", "after ms", "speedup", "tried");
    for (size_t i = 0; i < n; i++) {
        const double speedup = r[i].tuned_s > 0 ? r[i].default_s / r[i].tuned_s : 0;
        if (r[i].default_s == 0) {
            printf("%-9s %-58s %10s %10s %7s %6zu  (not run: the budget was spent)\n", r[i].kernel, r[i].bucket, "-",
                   "-", "-", r[i].candidates);
            continue;
        }
        if (r[i].tuned_s <= 0) {
            printf("%-9s %-58s %10.3f %10s %7s %6zu  (not stored: the built-in stays)\n", r[i].kernel, r[i].bucket,
                   1e3 * r[i].default_s, "-", "-", r[i].candidates);
            continue;
        }
        printf("%-9s %-58s %10.3f %10.3f %6.2fx %6zu%s\n", r[i].kernel, r[i].bucket, 1e3 * r[i].default_s,
               1e3 * r[i].tuned_s, speedup, r[i].candidates, r[i].stored ? "" : "  (not stored)");
    }
    printf("\nconfigurations:\n");
    for (size_t i = 0; i < n; i++)
        printf("  %s %s\n    before: %s\n    after:  %s\n", r[i].kernel, r[i].bucket, r[i].default_config,
               r[i].tuned_config[0]                ? r[i].tuned_config
               : r[i].candidates > r[i].rejected ? "(no verified candidate beat the built-in: it stays)"
               : r[i].candidates                 ? "(no candidate passed verification: the built-in stays)"
                                                 : "(the budget ran out before a candidate: the built-in stays)");
}

/* The spread of each space (first pass: worst, median, best) and the budgeted search's choice
 * against the exhaustive best, both from the final alternating re-timing when the choice was a
 * finalist (the fair comparison on a machine whose load drifts), else from the first pass. */
static void print_spread(const bar_state *b, const iha_tune_result *tuned, const iha_tune_result *all, size_t n)
{
    printf("\nexhaustive search over the same spaces (median of each configuration's runs):\n");
    printf("%-9s %-58s %9s %9s %9s %9s %10s %6s\n", "kernel", "bucket", "worst ms", "median ms", "best ms",
           "tuned ms", "tuned/best", "timed");
    for (size_t i = 0; i < n; i++) {
        int confirmed = 0;
        double t = time_of(b, i, tuned[i].tuned_config, &confirmed);
        printf("%-9s %-58s %9.3f %9.3f %9.3f %9.3f %10.3f %6zu%s\n", all[i].kernel, all[i].bucket,
               1e3 * all[i].worst_s, 1e3 * all[i].median_s, 1e3 * all[i].tuned_s, 1e3 * t,
               all[i].tuned_s > 0 && t > 0 ? t / all[i].tuned_s : 0, all[i].candidates - all[i].rejected,
               confirmed ? "" : "  (tuned time from the first pass)");
    }
    printf("finalists, timed again in alternation:\n");
    for (size_t i = 0; i < b->seen_count; i++)
        if (b->seen[i].confirming)
            printf("  task %zu  %9.3f ms  %s%s\n", b->seen[i].task + 1, 1e3 * b->seen[i].seconds, b->seen[i].config,
                   strcmp(b->seen[i].config, tuned[b->seen[i].task].tuned_config) == 0 ? "  <- budgeted choice" : "");
}

/* Results of one run: every kernel's tasks at each width and layer (tune at most 64). */
#define MAX_RESULTS 64

/* shapes[0..count) and layers[0..count): one per (width, layer) pair. */
static int run(iha_context *ctx, const iha_shape *shapes, const iha_attention_options *layers, size_t count,
               iha_tune_options *to, int exhaustive)
{
    bar_state bar = {isatty(fileno(stderr)), 0, NULL, 0, 0};
    to->progress = on_progress;
    to->user = &bar;
    iha_tune_result tuned[MAX_RESULTS], all[MAX_RESULTS];
    size_t n = 0;
    iha_status st = iha_tune(ctx, shapes, layers, count, to, tuned, MAX_RESULTS, &n);
    if (st != IHA_OK) {
        cli_error(&spec, "%s: %s", iha_status_name(st), iha_context_message(ctx));
        free(bar.seen);
        return CLI_EXIT_FAILURE;
    }
    bar.seen_count = 0; /* the budgeted pass's candidates are not the exhaustive pass's */
    n = n < MAX_RESULTS ? n : MAX_RESULTS;
    print_table(tuned, n);
    if (exhaustive) {
        fprintf(stderr, "\nexhaustive search (no budget):\n");
        to->exhaustive = 1;
        to->dry_run = 1;
        size_t m = 0;
        st = iha_tune(ctx, shapes, layers, count, to, all, MAX_RESULTS, &m);
        if (st != IHA_OK) {
            cli_error(&spec, "%s: %s", iha_status_name(st), iha_context_message(ctx));
            free(bar.seen);
            return CLI_EXIT_FAILURE;
        }
        print_spread(&bar, tuned, all, n < m ? n : m);
    }
    free(bar.seen);
    iha_profile_info info;
    if (!to->dry_run && iha_context_profile(ctx, &info) == IHA_OK)
        printf("\nprofile: %s (%zu entries)\n", info.path[0] ? info.path : "(off: kept in memory only)", info.entries);
    return CLI_EXIT_OK;
}

int cmd_tune(int argc, char **argv)
{
    int code = cli_parse(&spec, argc, argv);
    if (code >= 0) return code;
    iha_shape shape;
    iha_tune_options to;
    iha_tune_options_init(&to);
    float budget = 40.0f;
    size_t reps = 5;
    if (parse_shape(cli_get(&spec, "shapes"), &shape)) {
        cli_error(&spec, "--shapes takes demo or B,N,D,H,d,P (six positive integers)");
        return CLI_EXIT_USAGE;
    }
    size_t widths[MAX_WIDTHS], width_count = 0;
    if (parse_widths(cli_get(&spec, "widths"), &shape, widths, &width_count)) {
        cli_error(&spec, "--widths takes up to %d distinct head widths of 1 to 256, comma-separated", MAX_WIDTHS);
        return CLI_EXIT_USAGE;
    }
    if (parse_kernels(cli_get(&spec, "kernels"), &to.kernels)) {
        cli_error(&spec, "--kernels takes a comma-separated list of attention, rows, gemm, decode, backward, decode_compact");
        return CLI_EXIT_USAGE;
    }
    if (cli_get_positive_float(&spec, "budget-s", &budget) || cli_get_size(&spec, "reps", 1, 64, &reps))
        return CLI_EXIT_USAGE;
    static const char *const layer_names[] = {"both", "global", "sliding", NULL};
    int which = 0;
    if (cli_get(&spec, "layers") && cli_get_choice(&spec, "layers", layer_names, &which)) return CLI_EXIT_USAGE;
    if (cli_get(&spec, "exhaustive") && (to.kernels == 0 || (to.kernels & IHA_TUNE_GEMM))) {
        cli_error(&spec, "--exhaustive needs --kernels without gemm (CLBlast's space has millions of configurations)");
        return CLI_EXIT_USAGE;
    }
    to.budget_s = budget;
    to.reps = (int)reps;
    to.dry_run = cli_get(&spec, "dry-run") != NULL;

    iha_attention_options global, sliding;
    iha_attention_options_init(&global);
    if (cli_get_attention(&spec, 0, 0, &global)) return CLI_EXIT_USAGE;
    static const char *const storage_names[] = {"float", "half", "bf16", NULL};
    int storage = 0; /* the names' order is iha_storage's */
    if (cli_get(&spec, "storage") && cli_get_choice(&spec, "storage", storage_names, &storage)) return CLI_EXIT_USAGE;
    global.storage = storage;
    for (size_t i = 0; i < width_count; ++i) {
        const iha_shape at = at_width(&shape, widths[i]);
        if (cli_check_layer(&spec, &at, &global, "the layer")) return CLI_EXIT_USAGE;
    }
    sliding = global;
    size_t window = shape.tokens / (2 * shape.pseudo * shape.pseudo);
    sliding.window = (int64_t)(window ? window : 1);
    /* Every width with each layer asked for; the first width's shape gives the GEMM shapes. */
    iha_shape shapes[2 * MAX_WIDTHS];
    iha_attention_options layers[2 * MAX_WIDTHS];
    size_t count = 0;
    for (size_t i = 0; i < width_count; ++i) {
        if (which != 2) shapes[count] = at_width(&shape, widths[i]), layers[count++] = global;
        if (which != 1) shapes[count] = at_width(&shape, widths[i]), layers[count++] = sliding;
    }
    char width_text[MAX_WIDTHS * 4 + 1] = "", dim_text[MAX_WIDTHS * 21 + 1] = "";
    for (size_t i = 0; i < width_count; ++i) {
        size_t used = strlen(width_text), dim_used = strlen(dim_text);
        snprintf(width_text + used, sizeof width_text - used, "%s%zu", i ? "," : "", widths[i]);
        snprintf(dim_text + dim_used, sizeof dim_text - dim_used, "%s%zu", i ? "," : "", at_width(&shape, widths[i]).model_dim);
    }

    iha_context *ctx;
    if (cli_open_context(&spec, NULL, &ctx)) return CLI_EXIT_FAILURE;
    iha_profile_info info;
    if (iha_context_profile(ctx, &info) != IHA_OK || info.message[0])
        fprintf(stderr, "iha tune: note: %s\n", info.message);
    printf("iha tune (library %s) on %s\n", iha_version_string(), iha_context_device_name(ctx));
    printf("  shape B=%zu N=%zu D=%s H=%zu d=%s P=%zu, causal, %s%s%s; budget %.0f s, median of %d runs\n",
           shape.batch, shape.tokens, dim_text, shape.heads, width_text, shape.pseudo,
           which == 0 ? "global and sliding window" : which == 1 ? "global" : "sliding window",
           global.rope ? ", rotary" : "", storage == 1 ? ", half storage" : storage == 2 ? ", bf16 storage" : "",
           to.budget_s, to.reps);
    fflush(stdout);
    code = run(ctx, shapes, layers, count, &to, cli_get(&spec, "exhaustive") != NULL);
    iha_context_free(ctx);
    return code;
}
