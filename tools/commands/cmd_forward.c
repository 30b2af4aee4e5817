/*
 * cmd_forward.c - "iha forward": one IHA layer on NumPy files, for checking the library
 * against other implementations and for using it without writing C.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "commands/cli.h"
#include "common/half_range.h"
#include "common/layer_files.h"
#include "common/layer_options.h"
#include "iha.h"
#include "common/mask_names.h"
#include "common/npy.h"
#include "common/timer.h"

static cli_option options[] = {
    {"in", "DIR", "directory with x.npy, wq/wk/wv/wo.npy, alpha_q/k/v.npy, r.npy (required), seq_lens.npy (optional)", NULL},
    {"out", "FILE", "where to write Z as float32 .npy [B, N, D]: a regular file or a new path (required)", NULL},
    CLI_OPTION_MASK("causal (default), token_causal or none"),
    CLI_OPTION_WINDOW("sliding window in tokens; 0 (default) is global"),
    CLI_OPTION_ROPE_BASE("apply rotary embedding at virtual positions with this base (d even)"),
    {"scale", "S", "attention score scale (default 1/sqrt(d))", NULL},
    {"half", NULL, "store activations and weights on the device in half precision (float arithmetic)", NULL},
    {"bf16", NULL, "store activations and weights on the device in bfloat16 (float arithmetic)", NULL},
    CLI_OPTION_DEVICE,
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "forward",
    "--in DIR --out FILE [options]",
    "Runs one Interleaved Head Attention layer Z = IHA(X) on the NumPy files in DIR and writes\n"
    "Z. Files are little-endian float32 or float64 in C order; shapes: x [B,N,D], wq wk wv\n"
    "[D,H*d], wo [H*d,D], alpha_q alpha_k alpha_v r [H,H,P]. H and P come from alpha_q.npy,\n"
    "d = columns of wq.npy / H. An optional seq_lens.npy, a 1-D integer array summing to B*N,\n"
    "packs sequences into the batch: attention stays within each, rotary restarts at each.\n"
    "With --half the tensors are rounded to half precision on the\n"
    "device (doc/spec.md's contract: relative L2 error at most 2e-3), with --bf16 to bfloat16\n"
    "(at most 1e-2; not both); Z is still written as float32. With --half, inputs below half's\n"
    "normal range (6.1e-05: they lose precision or flush to zero) or above 65504 (infinite) are\n"
    "named in a warning on standard error.\n"
    "FILE is replaced whole, through a temporary file beside it, keeping its permissions; a\n"
    "symbolic link is followed to its target and stays a link; a FIFO, a device, a socket or a\n"
    "directory is refused before the run (exit status 1).\n"
    "Exit status: 0 success, 1 failure, 2 usage error.",
    options,
};

/* Parses the command line into the attention options: -1 when the command should go on, else the exit code to
 * return at once (cli_parse's, or CLI_EXIT_USAGE after a usage message). */
static int read_options(int argc, char **argv, iha_attention_options *attention)
{
    const int code = cli_parse(&spec, argc, argv);
    if (code >= 0)
        return code;
    if (!cli_get(&spec, "in") || !cli_get(&spec, "out")) {
        cli_error(&spec, "--in DIR and --out FILE are required (see 'iha forward --help')");
        return CLI_EXIT_USAGE;
    }
    iha_attention_options_init(attention);
    if (cli_get_attention(&spec, 0, INT64_MAX, attention) || cli_get_positive_float(&spec, "scale", &attention->scale))
        return CLI_EXIT_USAGE;
    if (cli_get(&spec, "half") && cli_get(&spec, "bf16")) {
        cli_error(&spec, "--half and --bf16 exclude each other");
        return CLI_EXIT_USAGE;
    }
    attention->storage = cli_get(&spec, "half")   ? IHA_STORAGE_F16
                         : cli_get(&spec, "bf16") ? IHA_STORAGE_BF16
                                                  : IHA_STORAGE_F32;
    attention->weight_storage = attention->storage;
    return -1;
}

/* Finding out that the output cannot be written after a long run would waste it. */
static int check_output(const char *out)
{
    char err[1024];
    if (npy_check_output(out, err, sizeof err)) {
        cli_error(&spec, "--out: %s", err);
        return -1;
    }
    return 0;
}

/* DIR/seq_lens.npy into *lens and *count when the file exists (none: NULL and 0). */
static int read_seq_lens(const char *dir, const iha_shape *s, size_t **lens, size_t *count)
{
    *lens = NULL;
    *count = 0;
    char path[4096], err[1024];
    struct stat st;
    if ((size_t)snprintf(path, sizeof path, "%s/seq_lens.npy", dir) >= sizeof path) {
        cli_error(&spec, "--in: the directory's path is too long");
        return -1;
    }
    if (stat(path, &st) != 0) return 0; /* optional */
    if (npy_read_sizes(path, s->batch * s->tokens, lens, count, err, sizeof err)) {
        cli_error(&spec, "%s: %s", path, err);
        return -1;
    }
    return 0;
}

/* Warns, per input file, of the values that rounding to half takes out of half's normal range:
 * the run itself is the user's choice, a clean-looking result that hides the loss is not. */
static void warn_half_range(const layer_files *f)
{
    const struct {
        const char *name;
        const npy_array *a;
    } inputs[] = {{"x", &f->x},       {"wq", &f->wq},           {"wk", &f->wk},
                  {"wv", &f->wv},     {"wo", &f->wo},           {"alpha_q", &f->alpha_q},
                  {"alpha_k", &f->alpha_k}, {"alpha_v", &f->alpha_v}, {"r", &f->r}};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        half_range r = {0, 0, 0};
        half_range_count(inputs[i].a->data, inputs[i].a->header.count, &r);
        char line[512];
        if (half_range_describe(inputs[i].name, inputs[i].a->header.count, &r, line, sizeof line))
            fprintf(stderr, "iha forward: warning: --half: %s\n", line);
    }
}

/* Runs the layer; on success prints the device and time after the layer's description. */
static int run(const layer_files *files, const iha_attention_options *attention, float *z, char *summary,
               size_t summary_size)
{
    iha_context *ctx;
    if (cli_open_context(&spec, NULL, &ctx)) return -1;
    iha_host_weights weights = layer_files_weights(files);
    double start = timer_seconds();
    iha_status status = iha_forward_host(ctx, &files->shape, attention, &weights, files->x.data, z);
    double seconds = timer_seconds() - start;
    if (status != IHA_OK)
        cli_error(&spec, "%s: %s", iha_status_name(status), iha_context_message(ctx));
    else
        snprintf(summary, summary_size, "device %s, %.3f s including kernel builds and copies",
                 iha_context_device_name(ctx), seconds);
    iha_context_free(ctx);
    return status == IHA_OK ? 0 : -1;
}

int cmd_forward(int argc, char **argv)
{
    iha_attention_options attention;
    const int code = read_options(argc, argv, &attention);
    if (code >= 0)
        return code;
    if (check_output(cli_get(&spec, "out")))
        return CLI_EXIT_FAILURE;
    layer_files files;
    char err[1024];
    if (layer_files_load(cli_get(&spec, "in"), &files, err, sizeof err)) {
        cli_error(&spec, "%s", err);
        return CLI_EXIT_FAILURE;
    }
    const iha_shape *s = &files.shape;
    size_t *seq_lens = NULL;
    if (read_seq_lens(cli_get(&spec, "in"), s, &seq_lens, &attention.seq_count)) {
        layer_files_free(&files);
        return CLI_EXIT_FAILURE;
    }
    attention.seq_lens = seq_lens;
    if (attention.storage == IHA_STORAGE_F16) warn_half_range(&files);
    /* Same count as x.npy, which the reader already sized without overflow. */
    float *z = malloc(files.x.header.count * sizeof *z);
    int rc = CLI_EXIT_FAILURE;
    if (!z) {
        cli_error(&spec, "out of memory for the output");
        goto done;
    }
    char summary[512];
    if (run(&files, &attention, z, summary, sizeof summary))
        goto done;
    const size_t shape[3] = {s->batch, s->tokens, s->model_dim};
    if (npy_write_f32(cli_get(&spec, "out"), shape, 3, z, err, sizeof err)) {
        cli_error(&spec, "%s", err);
        goto done;
    }
    printf("layer B=%zu N=%zu D=%zu H=%zu d=%zu P=%zu, mask %s, window %lld, rotary %s, storage %s\n", s->batch,
           s->tokens, s->model_dim, s->heads, s->head_dim, s->pseudo, mask_names[attention.mask],
           (long long)attention.window, attention.rope ? "on" : "off",
           attention.storage == IHA_STORAGE_F16    ? "half"
           : attention.storage == IHA_STORAGE_BF16 ? "bfloat16"
                                                   : "float");
    if (seq_lens) printf("packed sequences: %zu (seq_lens.npy)\n", attention.seq_count);
    printf("%s\n", summary);
    printf("wrote %s, float32 (%zu, %zu, %zu)\n", cli_get(&spec, "out"), shape[0], shape[1], shape[2]);
    rc = CLI_EXIT_OK;
done:
    free(seq_lens);
    free(z);
    layer_files_free(&files);
    return rc;
}
