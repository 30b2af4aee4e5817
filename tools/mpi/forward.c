/*
 * forward.c - "iha-mpi forward": iha forward's layer on NumPy files with the sequence split over
 * the ranks (iha_mpi_forward). Every rank reads the directory (a file system all ranks see),
 * takes its runs of tokens and the whole weights; rank 0 gathers z and writes it.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands/cli.h"
#include "common/layer_files.h"
#include "common/layer_options.h"
#include "common/mask_names.h"
#include "common/npy.h"
#include "common/timer.h"
#include "mpi/commands.h"

static cli_option options[] = {
    {"in", "DIR", "directory with x.npy, wq/wk/wv/wo.npy, alpha_q/k/v.npy, r.npy (required)", NULL},
    {"out", "FILE", "where rank 0 writes Z as float32 .npy [B, N, D]: a regular file or a new path (required)", NULL},
    CLI_OPTION_MASK("causal (default), token_causal or none"),
    CLI_OPTION_WINDOW("sliding window in tokens; 0 (default) is global"),
    CLI_OPTION_ROPE_BASE("apply rotary embedding at virtual positions with this base (d even)"),
    {"scale", "S", "attention score scale (default 1/sqrt(d))", NULL},
    {"layout", "L", "contiguous (default) or zigzag: which tokens each rank holds (doc/mpi.md)", NULL},
    CLI_OPTION_DEVICE,
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "forward",
    "--in DIR --out FILE [options]",
    "Runs one Interleaved Head Attention layer Z = IHA(X) on the NumPy files in DIR, as\n"
    "'iha forward' does, with the sequence split over the ranks of MPI_COMM_WORLD: each rank\n"
    "expands its tokens, the keys and values travel the ring, each rank collapses its tokens,\n"
    "and rank 0 writes Z (the same within float rounding). Every rank reads DIR. Float32 only;\n"
    "a seq_lens.npy in DIR is refused. FILE is replaced as 'iha forward' replaces it.\n"
    "Exit status (every rank): 0 success, 1 failure, 2 usage error.",
    options,
};

const char *const layout_names[] = {"contiguous", "zigzag", NULL};

/* Runs f with stdout and stderr closed on every rank but 0, so that what every rank would
 * say (usage, help) is said once. */
static int rank0_speaks(int rank, int (*f)(int, char **), int argc, char **argv)
{
    if (rank == 0) return f(argc, argv);
    fflush(stdout);
    fflush(stderr);
    const int out = dup(1), err = dup(2), null = open("/dev/null", O_WRONLY);
    if (null >= 0) {
        dup2(null, 1);
        dup2(null, 2);
        close(null);
    }
    const int code = f(argc, argv);
    fflush(stdout);
    fflush(stderr);
    if (out >= 0) dup2(out, 1), close(out);
    if (err >= 0) dup2(err, 2), close(err);
    return code;
}

static iha_attention_options attention;
static int layout;

static int read_options(int argc, char **argv)
{
    const int code = cli_parse(&spec, argc, argv);
    if (code >= 0) return code;
    if (!cli_get(&spec, "in") || !cli_get(&spec, "out")) {
        cli_error(&spec, "--in DIR and --out FILE are required (see 'iha-mpi forward --help')");
        return CLI_EXIT_USAGE;
    }
    iha_attention_options_init(&attention);
    layout = IHA_MPI_CONTIGUOUS;
    if (cli_get_attention(&spec, 0, INT64_MAX, &attention) ||
        cli_get_positive_float(&spec, "scale", &attention.scale) ||
        cli_get_choice(&spec, "layout", layout_names, &layout))
        return CLI_EXIT_USAGE;
    char path[4096], err[1024];
    struct stat st;
    if ((size_t)snprintf(path, sizeof path, "%s/seq_lens.npy", cli_get(&spec, "in")) < sizeof path &&
        stat(path, &st) == 0) {
        cli_error(&spec, "%s: packed sequences are not supported over ranks", path);
        return CLI_EXIT_FAILURE;
    }
    if (npy_check_output(cli_get(&spec, "out"), err, sizeof err)) {
        cli_error(&spec, "--out: %s", err);
        return CLI_EXIT_FAILURE;
    }
    return -1;
}

/* Every rank's verdict: the worst exit code (usage 2 above failure 1 above success 0). */
static int agree(int code)
{
    int worst = code;
    MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

static cl_mem upload(iha_context *ctx, const float *x, size_t n)
{
    cl_int e = CL_SUCCESS;
    cl_mem m = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, (n ? n : 1) * sizeof(float), NULL, &e);
    if (m != NULL && x != NULL &&
        clEnqueueWriteBuffer(iha_context_cl_queue(ctx), m, CL_TRUE, 0, n * sizeof(float), x, 0, NULL, NULL) !=
            CL_SUCCESS) {
        clReleaseMemObject(m);
        m = NULL;
    }
    return m;
}

/* The rows of `runs` of a [B][N][D] tensor, gathered into [B][count][D] (to_rank) or put back. */
static void run_rows(float *whole, float *mine, const iha_shape *s, const iha_mpi_run runs[2], int to_rank)
{
    size_t at = 0;
    for (size_t b = 0; b < s->batch; ++b)
        for (int i = 0; i < 2; ++i) {
            float *w = whole + (b * s->tokens + runs[i].first) * s->model_dim;
            const size_t n = runs[i].count * s->model_dim * sizeof(float);
            if (n) memcpy(to_rank ? mine + at : w, to_rank ? w : mine + at, n);
            at += runs[i].count * s->model_dim;
        }
}

typedef struct device_layer {
    cl_mem m[10]; /* wq wk wv wo alpha_q alpha_k alpha_v r, x, z */
} device_layer;

/* The layer on this rank: weights and its x rows on the device, iha_mpi_forward, its z rows
 * back into z_mine. Returns 0 or 1 (the message printed). */
static int run_rank(iha_context *ctx, const layer_files *f, int rank, float *x_mine, float *z_mine, size_t n_mine,
                    double *seconds)
{
    const npy_array *w[8] = {&f->wq, &f->wk, &f->wv, &f->wo, &f->alpha_q, &f->alpha_k, &f->alpha_v, &f->r};
    device_layer d = {{NULL}};
    int ok = 1;
    for (int i = 0; i < 8 && ok; ++i) ok = (d.m[i] = upload(ctx, w[i]->data, w[i]->header.count)) != NULL;
    ok = ok && (d.m[8] = upload(ctx, x_mine, n_mine)) != NULL && (d.m[9] = upload(ctx, NULL, n_mine)) != NULL;
    if (!ok) cli_error(&spec, "rank %d: the layer's device buffers could not be made", rank);
    iha_status st = IHA_ERROR_DEVICE_MEMORY;
    if (agree(ok ? 0 : 1) == 0) { /* every rank goes on, or none */
        const iha_layer_weights lw = {{d.m[0], 0}, {d.m[1], 0}, {d.m[2], 0}, {d.m[3], 0},
                                      {d.m[4], 0}, {d.m[5], 0}, {d.m[6], 0}, {d.m[7], 0}};
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = timer_seconds();
        st = iha_mpi_forward(ctx, MPI_COMM_WORLD, (iha_mpi_layout)layout, &f->shape, &attention, &lw,
                             (iha_buffer){d.m[8], 0}, (iha_buffer){d.m[9], 0});
        double dt = timer_seconds() - t0;
        MPI_Allreduce(&dt, seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        /* The call's status and message are the same on every rank (the failing rank's reason
         * included): said once. */
        if (st != IHA_OK && rank == 0) cli_error(&spec, "%s: %s", iha_status_name(st), iha_mpi_message());
        if (st == IHA_OK && clEnqueueReadBuffer(iha_context_cl_queue(ctx), d.m[9], CL_TRUE, 0, n_mine * sizeof(float),
                                                z_mine, 0, NULL, NULL) != CL_SUCCESS) {
            cli_error(&spec, "rank %d: reading z back failed", rank);
            st = IHA_ERROR_OPENCL;
        }
    }
    for (int i = 0; i < 10; ++i)
        if (d.m[i] != NULL) clReleaseMemObject(d.m[i]);
    return st == IHA_OK ? 0 : 1;
}

/* z_mine of every rank into rank 0's z [B][N][D]. */
static int gather(const iha_shape *s, int R, int rank, float *z_mine, size_t n_mine, float *z)
{
    int *counts = NULL, *displs = NULL, ok = 1;
    if (rank == 0) {
        counts = malloc((size_t)R * sizeof(int));
        displs = malloc((size_t)R * sizeof(int));
        ok = counts != NULL && displs != NULL;
        for (int j = 0, at = 0; ok && j < R; ++j) {
            iha_mpi_run runs[2];
            iha_mpi_runs(s->tokens, R, j, (iha_mpi_layout)layout, runs);
            counts[j] = (int)(s->batch * (runs[0].count + runs[1].count) * s->model_dim);
            displs[j] = at;
            at += counts[j];
        }
    }
    float *all = rank == 0 ? malloc(s->batch * s->tokens * s->model_dim * sizeof(float)) : NULL;
    ok = ok && (rank != 0 || all != NULL);
    if (agree(ok ? 0 : 1) != 0) {
        free(counts);
        free(displs);
        free(all);
        return 1;
    }
    MPI_Gatherv(z_mine, (int)n_mine, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (rank == 0)
        for (int j = 0; j < R; ++j) {
            iha_mpi_run runs[2];
            iha_mpi_runs(s->tokens, R, j, (iha_mpi_layout)layout, runs);
            run_rows(z, all + displs[j], s, runs, 0);
        }
    free(counts);
    free(displs);
    free(all);
    return 0;
}

int mpi_cmd_forward(int argc, char **argv, int R, int rank)
{
    cli_program = "iha-mpi";
    int code = agree(rank0_speaks(rank, read_options, argc, argv));
    if (code >= 0) return code;
    layer_files f;
    char err[1024];
    const int loaded = layer_files_load(cli_get(&spec, "in"), &f, err, sizeof err) == 0;
    /* Every rank reads the same files: rank 0 says what it found, another rank only what rank 0
     * did not see. */
    int rank0_loaded = loaded;
    MPI_Bcast(&rank0_loaded, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!loaded && (rank == 0 || rank0_loaded)) cli_error(&spec, "rank %d: %s", rank, err);
    if (agree(loaded ? 0 : 1) != 0) {
        if (loaded) layer_files_free(&f);
        return CLI_EXIT_FAILURE;
    }
    const iha_shape *s = &f.shape;
    iha_mpi_run runs[2];
    iha_mpi_runs(s->tokens, R, rank, (iha_mpi_layout)layout, runs);
    const size_t n_mine = s->batch * (runs[0].count + runs[1].count) * s->model_dim;
    const int sizes_ok = n_mine <= (size_t)INT32_MAX && s->batch * s->tokens * s->model_dim <= (size_t)INT32_MAX;
    float *x_mine = malloc((n_mine ? n_mine : 1) * sizeof(float)),
          *z_mine = malloc((n_mine ? n_mine : 1) * sizeof(float));
    float *z = rank == 0 ? malloc(f.x.header.count * sizeof(float)) : NULL;
    iha_context *ctx = NULL;
    int ok = x_mine != NULL && z_mine != NULL && (rank != 0 || z != NULL);
    if (!sizes_ok && rank == 0) /* the same on every rank */
        cli_error(&spec, "the layer's tensors exceed one MPI message's int count");
    else if (!ok)
        cli_error(&spec, "rank %d: out of host memory", rank);
    ok = ok && sizes_ok && cli_open_context(&spec, NULL, &ctx) == 0;
    code = CLI_EXIT_FAILURE;
    if (agree(ok ? 0 : 1) == 0) {
        run_rows(f.x.data, x_mine, s, runs, 1);
        double seconds = 0;
        const int ran = agree(run_rank(ctx, &f, rank, x_mine, z_mine, n_mine, &seconds)) == 0;
        if (ran && gather(s, R, rank, z_mine, n_mine, z) == 0) {
            const size_t shape[3] = {s->batch, s->tokens, s->model_dim};
            int written = 0;
            if (rank == 0) {
                written = npy_write_f32(cli_get(&spec, "out"), shape, 3, z, err, sizeof err) == 0;
                if (!written) cli_error(&spec, "%s", err);
            }
            MPI_Bcast(&written, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (written && rank == 0) {
                printf("layer B=%zu N=%zu D=%zu H=%zu d=%zu P=%zu, mask %s, window %lld, rotary %s, float\n", s->batch,
                       s->tokens, s->model_dim, s->heads, s->head_dim, s->pseudo, mask_names[attention.mask],
                       (long long)attention.window, attention.rope ? "on" : "off");
                printf("ranks %d, layout %s, device %s, %.3f s (slowest rank, including kernel builds)\n", R,
                       layout_names[layout], iha_context_device_name(ctx), seconds);
                printf("wrote %s, float32 (%zu, %zu, %zu)\n", cli_get(&spec, "out"), shape[0], shape[1], shape[2]);
            }
            code = written ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
        }
    }
    iha_context_free(ctx);
    free(x_mine);
    free(z_mine);
    free(z);
    layer_files_free(&f);
    return code;
}
