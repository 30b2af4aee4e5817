/*
 * bench.c - "iha-mpi bench": iha_mpi_attention on random tensors split over the ranks under
 * --layout: the slowest rank's time per call (median over --reps), the bytes of one hop and the
 * hops per call; each rank's busy time (the partial steps the ring gives it, replayed alone)
 * with the slowest against the mean, so the layout's balance shows; the hops alone (the same
 * messages without compute) and how much of them the ring hides behind compute; with --layer
 * the whole layer's forward and backward (iha_mpi_forward, iha_mpi_backward); with one rank the
 * single-process iha_attention over the same sequence, for the ring's overhead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/args.h"
#include "common/mask_names.h"
#include "common/timer.h"
#include "mpi/commands.h"

static cli_option bench_options[] = {
    {"n", "N", "tokens of the whole sequence (default 256)", NULL},
    {"heads", "H", "heads (default 2)", NULL},
    {"d", "D", "head dimension (default 32)", NULL},
    {"p", "P", "pseudo-tokens per token (default 2)", NULL},
    {"batch", "B", "batch (default 1)", NULL},
    {"mask", "MASK", "causal, token_causal or none (default causal)", NULL},
    {"window", "W", "sliding window in tokens, 0 for global (default 0)", NULL},
    {"layout", "L", "contiguous or zigzag (default contiguous)", NULL},
    {"reps", "R", "timed calls (default 5)", NULL},
    {"layer", NULL, "also time the whole layer, forward and backward, at model width H*d", NULL},
    {NULL, NULL, NULL, NULL},
};

static cl_mem random_buffer(iha_context *ctx, size_t n, unsigned seed)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    cl_int e = CL_SUCCESS;
    cl_mem m = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, (n ? n : 1) * sizeof(float), NULL, &e);
    if (x == NULL || m == NULL) {
        free(x);
        if (m != NULL) clReleaseMemObject(m);
        return NULL;
    }
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
    }
    clEnqueueWriteBuffer(iha_context_cl_queue(ctx), m, CL_TRUE, 0, n * sizeof(float), x, 0, NULL, NULL);
    free(x);
    return m;
}

/* Nonzero on every rank when `ok` holds on every rank. */
static int all_ok(int ok)
{
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

static void release(cl_mem *m, int n)
{
    for (int i = 0; i < n; ++i)
        if (m[i] != NULL) clReleaseMemObject(m[i]);
}

/* The compute the ring gives `rank`: one iha_attention_partial per (query run, key run) pair
 * it attends, in the ring's order, on stand-in buffers (q, o, l of the rank's tokens, k, v of
 * the largest run; the cost depends on the shapes, the mask and the global offsets, not on
 * the values). Seconds, or a negative value on failure. */
static double busy_seconds(iha_context *ctx, int R, int rank, iha_mpi_layout layout, const iha_shape *shape,
                           const iha_attention_options *op, const cl_mem buf[5])
{
    iha_mpi_run mine[2], keys[2];
    iha_mpi_runs(shape->tokens, R, rank, layout, mine);
    int started[2] = {0, 0};
    const int causal = op->mask == IHA_MASK_CAUSAL || op->mask == IHA_MASK_TOKEN_CAUSAL;
    const double t0 = timer_seconds();
    for (int s = 0; s < R; ++s) {
        iha_mpi_runs(shape->tokens, R, (rank - s + R) % R, layout, keys);
        for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) {
                if (mine[a].count == 0 || keys[b].count == 0) continue;
                if (causal && keys[b].first >= mine[a].first + mine[a].count) continue; /* the ring skips it */
                iha_shape local = *shape;
                local.tokens = mine[a].count;
                const iha_partial_block pb = {mine[a].first, keys[b].first, keys[b].count, !started[a]};
                started[a] = 1;
                if (iha_attention_partial(ctx, &local, op, &pb, (iha_buffer){buf[0], 0}, (iha_buffer){buf[1], 0},
                                          (iha_buffer){buf[2], 0}, (iha_buffer){buf[3], 0},
                                          (iha_buffer){buf[4], 0}) != IHA_OK)
                    return -1;
            }
    }
    return iha_context_finish(ctx) == IHA_OK ? timer_seconds() - t0 : -1;
}

/* The ring's hops without compute: R - 1 exchanges of `floats` floats with the neighbours, as
 * the ring sends K and V. Seconds (median over reps, slowest rank). */
static double hops_seconds(int R, int rank, size_t floats, size_t reps, double *t)
{
    float *buf = calloc(2 * (floats ? floats : 1), sizeof(float));
    if (!all_ok(buf != NULL)) { /* no rank posts a message another cannot receive */
        free(buf);
        return -1;
    }
    const int next = (rank + 1) % R, prev = (rank + R - 1) % R;
    for (size_t i = 0; i <= reps; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = timer_seconds();
        for (int s = 0; s + 1 < R; ++s) {
            MPI_Request req[2];
            MPI_Irecv(buf + floats, (int)floats, MPI_FLOAT, prev, 7, MPI_COMM_WORLD, &req[0]);
            MPI_Isend(buf, (int)floats, MPI_FLOAT, next, 7, MPI_COMM_WORLD, &req[1]);
            MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
        }
        double dt = timer_seconds() - t0, slowest = dt;
        MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (i > 0) t[i - 1] = slowest;
    }
    free(buf);
    return timer_median(t, reps);
}

/* One of the calls bench times, with its arguments. */
typedef struct ring_call {
    enum { RING_ATTENTION, LAYER_FORWARD, LAYER_BACKWARD } which;
    iha_context *ctx;
    iha_mpi_layout layout;
    const iha_shape *shape;
    const iha_attention_options *op;
    const iha_layer_weights *weights;
    const iha_layer_grads *grads;
    iha_buffer b[5]; /* qt, kt, vt, o, lse; or x, z (dz), dx */
} ring_call;

static iha_status run_call(const ring_call *c)
{
    const iha_buffer *b = c->b;
    if (c->which == RING_ATTENTION)
        return iha_mpi_attention(c->ctx, MPI_COMM_WORLD, c->layout, c->shape, c->op, b[0], b[1], b[2], b[3], b[4]);
    if (c->which == LAYER_FORWARD)
        return iha_mpi_forward(c->ctx, MPI_COMM_WORLD, c->layout, c->shape, c->op, c->weights, b[0], b[1]);
    return iha_mpi_backward(c->ctx, MPI_COMM_WORLD, c->layout, c->shape, c->op, c->weights, b[0], b[1], b[2], c->grads);
}

/* The slowest rank's time of the call, median of reps after one warm-up call, into *median;
 * 0, or 1 when the call failed (agreed by every rank; rank 0 says why). */
static int time_call(const ring_call *c, size_t reps, double *t, int rank, double *median)
{
    for (size_t i = 0; i <= reps; ++i) { /* the first call warms the caches */
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = timer_seconds();
        const iha_status st = run_call(c);
        double dt = timer_seconds() - t0, slowest = dt;
        MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (st != IHA_OK) { /* agreed by every rank, with the failing rank's reason */
            if (rank == 0) fprintf(stderr, "iha-mpi bench: %s: %s\n", iha_status_name(st), iha_mpi_message());
            return 1;
        }
        if (i > 0) t[i - 1] = slowest;
    }
    *median = timer_median(t, reps);
    return 0;
}

/* The whole layer on random weights at model width D = H*d: iha_mpi_forward, then
 * iha_mpi_backward (every gradient), each the median over reps of the slowest rank; 0, or 1
 * after a message. */
static int time_layer(iha_context *ctx, int R, int rank, iha_mpi_layout layout, const iha_shape *attention_shape,
                      const iha_attention_options *op, size_t count, size_t reps, double *t, double *fwd, double *bwd)
{
    iha_shape s = *attention_shape;
    s.model_dim = s.heads * s.head_dim;
    const size_t D = s.model_dim, proj = D * s.heads * s.head_dim, mix = s.heads * s.heads * s.pseudo,
                 nx = s.batch * count * D;
    cl_mem m[19]; /* wq .. r, their gradients, x, z, dx */
    int made = 1;
    for (int i = 0; i < 8; ++i) {
        m[i] = random_buffer(ctx, i < 4 ? proj : mix, 20 + (unsigned)i); /* the same on every rank */
        m[8 + i] = random_buffer(ctx, i < 4 ? proj : mix, 0);
    }
    m[16] = random_buffer(ctx, nx, 11 + rank);
    m[17] = random_buffer(ctx, nx, 0);
    m[18] = random_buffer(ctx, nx, 0);
    for (int i = 0; i < 19; ++i) made = made && m[i] != NULL;
    if (!all_ok(made)) {
        if (!made) fprintf(stderr, "iha-mpi bench: rank %d: the layer's buffers could not be made\n", rank);
        release(m, 19);
        return 1;
    }
    const cl_mem *w = m, *g = m + 8, x = m[16], z = m[17], dx = m[18];
    const iha_layer_weights lw = {{w[0], 0}, {w[1], 0}, {w[2], 0}, {w[3], 0},
                                  {w[4], 0}, {w[5], 0}, {w[6], 0}, {w[7], 0}};
    const iha_layer_grads lg = {{g[0], 0}, {g[1], 0}, {g[2], 0}, {g[3], 0}, {g[4], 0}, {g[5], 0}, {g[6], 0}, {g[7], 0}};
    ring_call c = {LAYER_FORWARD, ctx, layout, &s, op, &lw, &lg, {{x, 0}, {z, 0}, {dx, 0}}};
    int status = time_call(&c, reps, t, rank, fwd);
    c.which = LAYER_BACKWARD; /* z serves as dz */
    if (status == 0) status = time_call(&c, reps, t, rank, bwd);
    (void)R;
    release(m, 19);
    return status;
}

int mpi_cmd_bench(int argc, char **argv, int R, int rank)
{
    cli_program = "iha-mpi";
    cli_spec spec = {"bench", "[options]", "Times iha_mpi_attention over the ranks of MPI_COMM_WORLD.", bench_options};
    const int parsed = cli_parse(&spec, argc, argv);
    if (parsed >= 0) return parsed;
    size_t N = 256, H = 2, d = 32, P = 2, B = 1, reps = 5, window = 0;
    int mask = IHA_MASK_CAUSAL, layout = IHA_MPI_CONTIGUOUS;
    if (cli_get_size(&spec, "n", 1, 1u << 20, &N) || cli_get_size(&spec, "heads", 1, 64, &H) ||
        cli_get_size(&spec, "d", 1, 256, &d) || cli_get_size(&spec, "p", 1, 64, &P) ||
        cli_get_size(&spec, "batch", 1, 64, &B) || cli_get_size(&spec, "reps", 1, 1000, &reps) ||
        cli_get_size(&spec, "window", 0, 1u << 20, &window) || cli_get_choice(&spec, "mask", mask_names, &mask) ||
        cli_get_choice(&spec, "layout", layout_names, &layout))
        return 2;
    iha_context *ctx = NULL;
    char message[256] = "";
    iha_context_options co;
    iha_context_options_init(&co);
    int ok = iha_context_create(&ctx, &co, message, sizeof message) == IHA_OK, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (!ok) fprintf(stderr, "iha-mpi bench: rank %d: %s\n", rank, message);
        iha_context_free(ctx);
        return 1;
    }
    /* The largest rank's tokens (one hop's block) and the largest run (busy_seconds' keys). */
    size_t count = 0, largest = 0, longest_run = 0;
    for (int j = 0; j < R; ++j) {
        iha_mpi_run runs[2];
        iha_mpi_runs(N, R, j, (iha_mpi_layout)layout, runs);
        const size_t c = runs[0].count + runs[1].count;
        if (j == rank) count = c;
        if (c > largest) largest = c;
        for (int b = 0; b < 2; ++b)
            if (runs[b].count > longest_run) longest_run = runs[b].count;
    }
    const size_t rows = B * H * count * P, n = rows * d,
                 nk = B * H * (count > longest_run ? count : longest_run) * P * d;
    const iha_shape shape = {B, N, 1, H, d, P};
    iha_attention_options op;
    iha_attention_options_init(&op);
    op.mask = mask;
    op.window = (int64_t)window;
    cl_mem q = random_buffer(ctx, n, 1 + rank), k = random_buffer(ctx, nk, 2 + rank),
           v = random_buffer(ctx, nk, 3 + rank);
    cl_mem o = random_buffer(ctx, n, 0), l = random_buffer(ctx, rows, 0);
    double *t = malloc((reps + 1) * sizeof(double)), *all_busy = malloc((size_t)R * sizeof(double));
    cl_mem made[5] = {q, k, v, o, l};
    const int have = q != NULL && k != NULL && v != NULL && o != NULL && l != NULL && t != NULL && all_busy != NULL;
    if (!all_ok(have)) {
        if (!have) fprintf(stderr, "iha-mpi bench: rank %d: out of memory for the tensors\n", rank);
        release(made, 5);
        free(t);
        free(all_busy);
        iha_context_free(ctx);
        return 1;
    }
    int status = 0;
    const ring_call ring = {
        RING_ATTENTION, ctx, (iha_mpi_layout)layout, &shape, &op, NULL, NULL, {{q, 0}, {k, 0}, {v, 0}, {o, 0}, {l, 0}}};
    double ring_time = 0;
    status = time_call(&ring, reps, t, rank, &ring_time);
    /* Busy time: one rank at a time, so that the ranks do not share the cores while timed, and
     * the ranks in turn within each repetition, so that other load on the machine falls on all
     * of them alike; the fastest repetition, the one least disturbed by that load. */
    double busy = 0;
    const cl_mem buf[5] = {q, k, v, o, l};
    const int timed = status == 0; /* the same on every rank: the ring call's status is agreed */
    for (size_t i = 0; i <= reps && timed; ++i)
        for (int j = 0; j < R; ++j) {
            MPI_Barrier(MPI_COMM_WORLD);
            if (j != rank) continue;
            const double b = busy_seconds(ctx, R, rank, (iha_mpi_layout)layout, &shape, &op, buf);
            if (b < 0 && status == 0) {
                fprintf(stderr, "iha-mpi bench: rank %d: replaying the partial steps failed: %s\n", rank,
                        iha_context_message(ctx));
                status = 1;
            }
            if (i > 0 && (i == 1 || b < busy)) busy = b;
        }
    if (timed && !all_ok(status == 0)) status = 1; /* a replay failed somewhere: every rank stops */
    MPI_Gather(&busy, 1, MPI_DOUBLE, all_busy, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    const size_t block = B * H * largest * P * d;
    const double hops = status == 0 && R > 1 ? hops_seconds(R, rank, 2 * block, reps, t) : 0;
    if (hops < 0) {
        if (rank == 0) fprintf(stderr, "iha-mpi bench: no host memory to time the hops alone\n");
        status = 1;
    }
    double layer_fwd = 0, layer_bwd = 0;
    const int layer = status == 0 && cli_get(&spec, "layer") != NULL;
    if (layer && time_layer(ctx, R, rank, (iha_mpi_layout)layout, &shape, &op, count, reps, t, &layer_fwd, &layer_bwd))
        status = 1;
    if (status == 0 && rank == 0) {
        double slowest = 0, mean = 0;
        for (int j = 0; j < R; ++j) {
            if (all_busy[j] > slowest) slowest = all_busy[j];
            mean += all_busy[j] / R;
        }
        printf("ranks %d  B %zu N %zu H %zu d %zu P %zu mask %s window %zu layout %s\n", R, B, N, H, d, P,
               mask_names[mask], window, layout_names[layout]);
        printf("ring call      %.3f ms (median of %zu, slowest rank)\n", 1e3 * ring_time, reps);
        printf("bytes per hop  %zu (K and V of the largest block, float32)\n", 2 * block * sizeof(float));
        printf("hops per call  %d\n", R - 1);
        printf("busy per rank ");
        for (int j = 0; j < R; ++j) printf(" %.3f", 1e3 * all_busy[j]);
        printf(" ms (fastest of %zu, each rank's partial steps replayed alone)\n", reps);
        printf("busy spread    slowest %.3f ms, mean %.3f ms, slowest/mean %.2f\n", 1e3 * slowest, 1e3 * mean,
               mean > 0 ? slowest / mean : 0.0);
        if (R > 1) {
            /* What the ring takes beyond its slowest rank's compute is what the compute did not
             * hide: host staging copies, hops and waits on other ranks. */
            const double exposed = ring_time > slowest ? ring_time - slowest : 0.0;
            printf("hops alone     %.3f ms (the call's %d exchanges of one hop's bytes, no compute)\n", 1e3 * hops,
                   R - 1);
            printf("not hidden     %.3f ms (ring call - slowest busy: staging copies, hops, waits)\n", 1e3 * exposed);
            if (exposed < hops)
                printf("hidden         %.0f%% of the hops alone\n", 100.0 * (1.0 - exposed / hops));
            else
                printf("hidden         not measurable: what is not hidden exceeds the hops alone\n");
        }
        if (layer)
            printf("layer          forward %.3f ms, backward %.3f ms (median of %zu, slowest rank, D = %zu)\n",
                   1e3 * layer_fwd, 1e3 * layer_bwd, reps, H * d);
    }
    free(all_busy);
    if (status == 0 && R == 1) { /* the single-process call on the same sequence */
        for (size_t i = 0; i <= reps; ++i) {
            const double t0 = timer_seconds();
            iha_attention(ctx, &shape, &op, (iha_buffer){q, 0}, (iha_buffer){k, 0}, (iha_buffer){v, 0},
                          (iha_buffer){o, 0}, (iha_buffer){l, 0});
            iha_context_finish(ctx);
            if (i > 0) t[i - 1] = timer_seconds() - t0;
        }
        printf("iha_attention  %.3f ms (median of %zu, one process)\n", 1e3 * timer_median(t, reps), reps);
    }
    free(t);
    clReleaseMemObject(q);
    clReleaseMemObject(k);
    clReleaseMemObject(v);
    clReleaseMemObject(o);
    clReleaseMemObject(l);
    iha_context_free(ctx);
    return status;
}
