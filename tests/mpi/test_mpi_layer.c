/*
 * test_mpi_layer.c - iha_mpi_forward and iha_mpi_backward under mpirun: every rank builds the
 * same random layer and sequence, computes the float64 reference and the single-process
 * iha_forward / iha_backward on the whole of it, runs the layer over the ranks on its own
 * tokens and compares its rows of z and dx, and the whole sequence's weight gradients (summed
 * over the ranks), with both. Every mask, rotary, windows spanning ranks, N not divisible by
 * the ranks, batch 2, gradients added into with accumulate, every layout; the refusals agreed
 * by every rank with nothing written, arguments that differ between ranks among them; some
 * outputs only. A plain main: nonzero when any rank saw a failure.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"
#include "reference.h"

#define CHECK MPI_CHECK

typedef struct layer_case {
    size_t B, N, D, H, d, P;
    int mask;
    int64_t window;
    int rope;
    int accumulate;
} layer_case;

enum { W = 8 }; /* wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r */

static const char *const weight_names[W] = {"wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r"};

/* The prefilled value of element i of an accumulated output. */
static float prefill(size_t i) { return 0.125f * (float)(i % 5) - 0.25f; }

typedef struct layer_data {
    size_t n_x, size[W];
    float *x, *dz, *w[W];
    cl_mem dw[W];
    iha_layer_weights weights;
} layer_data;

static void data_make(iha_context *ctx, const layer_case *c, layer_data *L)
{
    const size_t proj = c->D * c->H * c->d, mix = c->H * c->H * c->P;
    L->n_x = c->B * c->N * c->D;
    mpi_test_seed(1000 + c->N * 131 + (uint64_t)c->mask * 17 + (uint64_t)c->window * 3 + (uint64_t)c->rope);
    L->x = malloc(L->n_x * sizeof(float));
    L->dz = malloc(L->n_x * sizeof(float));
    for (size_t i = 0; i < L->n_x; ++i) L->x[i] = mpi_test_random(1.0f);
    for (size_t i = 0; i < L->n_x; ++i) L->dz[i] = mpi_test_random(1.0f);
    for (int i = 0; i < W; ++i) {
        L->size[i] = i < 4 ? proj : mix;
        L->w[i] = malloc(L->size[i] * sizeof(float));
        const float scale = i < 4 ? 1.0f / sqrtf((float)c->D) : 0.7f;
        for (size_t e = 0; e < L->size[i]; ++e) L->w[i][e] = mpi_test_random(scale);
        L->dw[i] = mpi_test_buffer(ctx, L->w[i], L->size[i]);
    }
    L->weights = (iha_layer_weights){{L->dw[0], 0}, {L->dw[1], 0}, {L->dw[2], 0}, {L->dw[3], 0},
                                     {L->dw[4], 0}, {L->dw[5], 0}, {L->dw[6], 0}, {L->dw[7], 0}};
}

static void data_free(layer_data *L)
{
    free(L->x);
    free(L->dz);
    for (int i = 0; i < W; ++i) {
        free(L->w[i]);
        clReleaseMemObject(L->dw[i]);
    }
}

static void options_of(const layer_case *c, iha_attention_options *op)
{
    iha_attention_options_init(op);
    op->mask = c->mask;
    op->window = c->window;
    op->rope = c->rope;
    op->accumulate = c->accumulate;
}

/* The float64 reference and the single-process calls on the whole sequence. */
typedef struct expected {
    double *z, *dx, *g[W];   /* float64 reference */
    float *z1, *dx1, *g1[W]; /* iha_forward, iha_backward */
} expected;

static void expected_make(iha_context *ctx, const layer_case *c, const layer_data *L, expected *e)
{
    ref_problem rp = {.B = c->B,
                      .N = c->N,
                      .D = c->D,
                      .H = c->H,
                      .d = c->d,
                      .P = c->P,
                      .mask = c->mask,
                      .window = c->window,
                      .rope = c->rope,
                      .x = L->x,
                      .wq = L->w[0],
                      .wk = L->w[1],
                      .wv = L->w[2],
                      .wo = L->w[3],
                      .alpha_q = L->w[4],
                      .alpha_k = L->w[5],
                      .alpha_v = L->w[6],
                      .r = L->w[7]};
    e->z = malloc(L->n_x * sizeof(double));
    e->dx = malloc(L->n_x * sizeof(double));
    for (int i = 0; i < W; ++i) e->g[i] = malloc(L->size[i] * sizeof(double));
    const ref_grads rg = {e->dx, e->g[0], e->g[1], e->g[2], e->g[3], e->g[4], e->g[5], e->g[6], e->g[7]};
    CHECK(ref_forward(&rp, NULL, 0, e->z) == 0 && ref_backward(&rp, L->dz, &rg) == 0, "the reference failed");

    const iha_shape s = {c->B, c->N, c->D, c->H, c->d, c->P};
    iha_attention_options op;
    options_of(c, &op);
    op.accumulate = 0;
    cl_mem x = mpi_test_buffer(ctx, L->x, L->n_x), z = mpi_test_buffer(ctx, NULL, L->n_x),
           dz = mpi_test_buffer(ctx, L->dz, L->n_x), dx = mpi_test_buffer(ctx, NULL, L->n_x), g[W];
    for (int i = 0; i < W; ++i) g[i] = mpi_test_buffer(ctx, NULL, L->size[i]);
    const iha_layer_grads grads = {{g[0], 0}, {g[1], 0}, {g[2], 0}, {g[3], 0},
                                   {g[4], 0}, {g[5], 0}, {g[6], 0}, {g[7], 0}};
    CHECK(iha_forward(ctx, &s, &op, &L->weights, (iha_buffer){x, 0}, (iha_buffer){z, 0}) == IHA_OK &&
              iha_backward(ctx, &s, &op, &L->weights, (iha_buffer){x, 0}, (iha_buffer){dz, 0}, (iha_buffer){dx, 0},
                           &grads) == IHA_OK,
          "the single-process layer failed: %s", iha_context_message(ctx));
    e->z1 = malloc(L->n_x * sizeof(float));
    e->dx1 = malloc(L->n_x * sizeof(float));
    mpi_test_read(ctx, z, e->z1, L->n_x);
    mpi_test_read(ctx, dx, e->dx1, L->n_x);
    for (int i = 0; i < W; ++i) {
        e->g1[i] = malloc(L->size[i] * sizeof(float));
        mpi_test_read(ctx, g[i], e->g1[i], L->size[i]);
        clReleaseMemObject(g[i]);
    }
    clReleaseMemObject(x);
    clReleaseMemObject(z);
    clReleaseMemObject(dz);
    clReleaseMemObject(dx);
}

static void expected_free(expected *e)
{
    free(e->z);
    free(e->dx);
    free(e->z1);
    free(e->dx1);
    for (int i = 0; i < W; ++i) {
        free(e->g[i]);
        free(e->g1[i]);
    }
}

/* got against the reference rows (float64, and the single-process call's as float64). */
static void compare(const char *label, const char *what, const float *got, const double *ref, const float *one,
                    size_t n, int accumulate, double tolerance)
{
    double *want = malloc(n * sizeof(double)), *want1 = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; ++i) {
        const double base = accumulate ? (double)prefill(i) : 0.0;
        want[i] = ref[i] + base;
        want1[i] = (double)one[i] + base;
    }
    const double e = mpi_test_rel_l2(got, want, n), e1 = mpi_test_rel_l2(got, want1, n);
    CHECK(e <= tolerance, "%s %s: relative L2 %.3g against the float64 reference", label, what, e);
    CHECK(e1 <= tolerance, "%s %s: relative L2 %.3g against the single-process call", label, what, e1);
    free(want);
    free(want1);
}

static void run_case(iha_context *ctx, int R, const layer_case *c, iha_mpi_layout layout)
{
    layer_data L;
    data_make(ctx, c, &L);
    expected e;
    expected_make(ctx, c, &L, &e);
    iha_mpi_run runs[2];
    iha_mpi_runs(c->N, R, mpi_test_rank, layout, runs);
    const size_t count = runs[0].count + runs[1].count, nm = c->B * count * c->D;
    float *mine = malloc(nm * sizeof(float)), *got = malloc((nm + L.size[0] + L.size[4]) * sizeof(float));
    double *ref = malloc(nm * sizeof(double));
    char label[200];
    snprintf(label, sizeof label, "R=%d layout=%d B=%zu N=%zu P=%zu mask=%d window=%lld rope=%d accumulate=%d", R,
             (int)layout, c->B, c->N, c->P, c->mask, (long long)c->window, c->rope, c->accumulate);
    const iha_shape s = {c->B, c->N, c->D, c->H, c->d, c->P};
    iha_attention_options op;
    options_of(c, &op);

    mpi_test_gather(L.x, mine, c->B, c->N, 1, c->D, runs);
    cl_mem x = mpi_test_buffer(ctx, mine, nm), z = mpi_test_buffer(ctx, NULL, nm);
    mpi_test_gather(L.dz, mine, c->B, c->N, 1, c->D, runs);
    cl_mem dz = mpi_test_buffer(ctx, mine, nm);
    iha_status st =
        iha_mpi_forward(ctx, MPI_COMM_WORLD, layout, &s, &op, &L.weights, (iha_buffer){x, 0}, (iha_buffer){z, 0});
    CHECK(st == IHA_OK, "%s iha_mpi_forward: %s: %s", label, iha_status_name(st), iha_mpi_message());
    mpi_test_read(ctx, z, got, nm);
    mpi_test_gather_d(e.z, ref, c->B, c->N, 1, c->D, runs);
    mpi_test_gather(e.z1, mine, c->B, c->N, 1, c->D, runs);
    compare(label, "z", got, ref, mine, nm, 0, 2e-5);

    /* The backward into outputs that hold prefill() (added into with accumulate) or NaN. */
    size_t largest = nm;
    for (int i = 0; i < W; ++i) largest = L.size[i] > largest ? L.size[i] : largest;
    float *fill = malloc(largest * sizeof(float));
    for (size_t i = 0; i < largest; ++i) fill[i] = c->accumulate ? prefill(i) : NAN;
    cl_mem dx = mpi_test_buffer(ctx, fill, nm), g[W];
    for (int i = 0; i < W; ++i) g[i] = mpi_test_buffer(ctx, fill, L.size[i]);
    const iha_layer_grads grads = {{g[0], 0}, {g[1], 0}, {g[2], 0}, {g[3], 0},
                                   {g[4], 0}, {g[5], 0}, {g[6], 0}, {g[7], 0}};
    st = iha_mpi_backward(ctx, MPI_COMM_WORLD, layout, &s, &op, &L.weights, (iha_buffer){x, 0}, (iha_buffer){dz, 0},
                          (iha_buffer){dx, 0}, &grads);
    CHECK(st == IHA_OK, "%s iha_mpi_backward: %s: %s", label, iha_status_name(st), iha_mpi_message());
    mpi_test_read(ctx, dx, got, nm);
    mpi_test_gather_d(e.dx, ref, c->B, c->N, 1, c->D, runs);
    mpi_test_gather(e.dx1, mine, c->B, c->N, 1, c->D, runs);
    compare(label, "dx", got, ref, mine, nm, c->accumulate, 1e-4);
    for (int i = 0; i < W; ++i) {
        mpi_test_read(ctx, g[i], got, L.size[i]);
        compare(label, weight_names[i], got, e.g[i], e.g1[i], L.size[i], c->accumulate, 1e-4);
        clReleaseMemObject(g[i]);
    }
    clReleaseMemObject(x);
    clReleaseMemObject(z);
    clReleaseMemObject(dz);
    clReleaseMemObject(dx);
    free(mine);
    free(got);
    free(ref);
    free(fill);
    expected_free(&e);
    data_free(&L);
}

/* Some outputs only: dx NULL and two gradients; then no gradient at all. Each equals the same
 * output of the call that computes everything, bit for bit. */
static void some_outputs(iha_context *ctx, int R)
{
    const layer_case c = {2, 9, 8, 2, 4, 2, IHA_MASK_CAUSAL, 3, 1, 0};
    layer_data L;
    data_make(ctx, &c, &L);
    const iha_shape s = {c.B, c.N, c.D, c.H, c.d, c.P};
    iha_attention_options op;
    options_of(&c, &op);
    iha_mpi_run runs[2];
    iha_mpi_runs(c.N, R, mpi_test_rank, IHA_MPI_CONTIGUOUS, runs);
    const size_t nm = c.B * runs[0].count * c.D;
    float *buf = malloc(nm * sizeof(float));
    mpi_test_gather(L.x, buf, c.B, c.N, 1, c.D, runs);
    cl_mem x = mpi_test_buffer(ctx, buf, nm);
    mpi_test_gather(L.dz, buf, c.B, c.N, 1, c.D, runs);
    cl_mem dz = mpi_test_buffer(ctx, buf, nm), dx = mpi_test_buffer(ctx, NULL, nm),
           dx2 = mpi_test_buffer(ctx, NULL, nm);
    cl_mem all[W], two[2];
    for (int i = 0; i < W; ++i) all[i] = mpi_test_buffer(ctx, NULL, L.size[i]);
    two[0] = mpi_test_buffer(ctx, NULL, L.size[3]);
    two[1] = mpi_test_buffer(ctx, NULL, L.size[6]);
    const iha_layer_grads every = {{all[0], 0}, {all[1], 0}, {all[2], 0}, {all[3], 0},
                                   {all[4], 0}, {all[5], 0}, {all[6], 0}, {all[7], 0}};
    const iha_layer_grads some = {.wo = {two[0], 0}, .alpha_v = {two[1], 0}};
    iha_status st = iha_mpi_backward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, &L.weights, (iha_buffer){x, 0},
                                     (iha_buffer){dz, 0}, (iha_buffer){dx, 0}, &every);
    CHECK(st == IHA_OK, "every output: %s: %s", iha_status_name(st), iha_mpi_message());
    st = iha_mpi_backward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, &L.weights, (iha_buffer){x, 0},
                          (iha_buffer){dz, 0}, (iha_buffer){NULL, 0}, &some);
    CHECK(st == IHA_OK, "two gradients, no dx: %s: %s", iha_status_name(st), iha_mpi_message());
    const int pick[2] = {3, 6};
    for (int i = 0; i < 2; ++i) {
        const size_t n = L.size[pick[i]];
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        mpi_test_read(ctx, all[pick[i]], a, n);
        mpi_test_read(ctx, two[i], b, n);
        CHECK(memcmp(a, b, n * sizeof(float)) == 0, "grads->%s alone differs from the full call's",
              weight_names[pick[i]]);
        free(a);
        free(b);
    }
    st = iha_mpi_backward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, &L.weights, (iha_buffer){x, 0},
                          (iha_buffer){dz, 0}, (iha_buffer){dx2, 0}, NULL);
    CHECK(st == IHA_OK, "dx alone: %s: %s", iha_status_name(st), iha_mpi_message());
    float *a = malloc(nm * sizeof(float));
    mpi_test_read(ctx, dx, a, nm);
    mpi_test_read(ctx, dx2, buf, nm);
    CHECK(memcmp(a, buf, nm * sizeof(float)) == 0, "dx alone differs from the full call's");
    free(a);
    free(buf);
    for (int i = 0; i < W; ++i) clReleaseMemObject(all[i]);
    clReleaseMemObject(two[0]);
    clReleaseMemObject(two[1]);
    clReleaseMemObject(x);
    clReleaseMemObject(dz);
    clReleaseMemObject(dx);
    clReleaseMemObject(dx2);
    data_free(&L);
}

/* Refusals are agreed: what one rank refuses every rank refuses, and nothing is written. */
static void refusals(iha_context *ctx, int R)
{
    const layer_case c = {1, 8, 8, 2, 4, 2, IHA_MASK_CAUSAL, 0, 1, 0};
    layer_data L;
    data_make(ctx, &c, &L);
    const iha_shape s = {c.B, c.N, c.D, c.H, c.d, c.P};
    iha_attention_options op;
    options_of(&c, &op);
    size_t first, count;
    iha_mpi_split(c.N, R, mpi_test_rank, &first, &count);
    const size_t nm = count * c.D;
    float *fill = malloc(nm * sizeof(float)), *back = malloc(nm * sizeof(float));
    for (size_t i = 0; i < nm; ++i) fill[i] = 7.0f;
    cl_mem x = mpi_test_buffer(ctx, fill, nm), z = mpi_test_buffer(ctx, fill, nm),
           small = mpi_test_buffer(ctx, fill, 1);
    const iha_buffer zb = {mpi_test_rank == R - 1 ? small : z, 0};
    iha_status st =
        iha_mpi_forward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, &L.weights, (iha_buffer){x, 0}, zb);
    if (mpi_test_rank == R - 1)
        CHECK(st == IHA_ERROR_BUFFER_TOO_SMALL, "short z: %s", iha_status_name(st));
    else
        CHECK(st == IHA_ERROR_INVALID_ARGUMENT && strstr(iha_mpi_message(), "rank") != NULL,
              "short z elsewhere: %s (%s)", iha_status_name(st), iha_mpi_message());
    mpi_test_read(ctx, zb.mem, back, zb.mem == small ? 1 : nm);
    CHECK(memcmp(back, fill, (zb.mem == small ? 1 : nm) * sizeof(float)) == 0, "a refused forward wrote z");

    /* A weight only the collapse reads, too small on rank 0: refused on every rank after the
     * ring, and z is written on none. */
    iha_layer_weights short_wo = L.weights;
    if (mpi_test_rank == 0) short_wo.wo = (iha_buffer){small, 0};
    st = iha_mpi_forward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, &short_wo, (iha_buffer){x, 0},
                         (iha_buffer){z, 0});
    CHECK(st != IHA_OK && iha_mpi_message()[0] != '\0', "a short wo on rank 0: %s", iha_status_name(st));
    mpi_test_read(ctx, z, back, nm);
    CHECK(memcmp(back, fill, nm * sizeof(float)) == 0, "a forward refused at the collapse wrote z");

    /* Arguments that differ between ranks: refused on every rank, never a hang. */
    iha_shape other = s;
    if (mpi_test_rank == R - 1) other.tokens = s.tokens + 4;
    st = iha_mpi_forward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &other, &op, &L.weights, (iha_buffer){x, 0},
                         (iha_buffer){z, 0});
    CHECK(st == IHA_ERROR_INVALID_ARGUMENT && strstr(iha_mpi_message(), "shape->tokens") != NULL,
          "tokens differing between ranks: %s (%s)", iha_status_name(st), iha_mpi_message());
    iha_attention_options other_op = op;
    if (mpi_test_rank == 0) other_op.window = 3;
    st = iha_mpi_forward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &other_op, &L.weights, (iha_buffer){x, 0},
                         (iha_buffer){z, 0});
    CHECK(st == IHA_ERROR_INVALID_ARGUMENT, "windows differing between ranks: %s", iha_status_name(st));
    st = iha_mpi_forward(ctx, MPI_COMM_WORLD, mpi_test_rank == 0 ? IHA_MPI_ZIGZAG : IHA_MPI_CONTIGUOUS, &s, &op,
                         &L.weights, (iha_buffer){x, 0}, (iha_buffer){z, 0});
    CHECK(st == IHA_ERROR_INVALID_ARGUMENT, "layouts differing between ranks: %s", iha_status_name(st));
    mpi_test_read(ctx, z, back, nm);
    CHECK(memcmp(back, fill, nm * sizeof(float)) == 0, "a refused forward wrote z");

    /* Too few tokens: one per rank (contiguous), two chunks per rank (zig-zag). */
    const iha_shape few = {1, (size_t)R - 1, c.D, c.H, c.d, c.P},
                    few_zigzag = {1, 2 * (size_t)R - 1, c.D, c.H, c.d, c.P};
    if (R > 1) {
        st = iha_mpi_forward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &few, &op, &L.weights, (iha_buffer){x, 0},
                             (iha_buffer){z, 0});
        CHECK(st == IHA_ERROR_INVALID_ARGUMENT, "fewer tokens than ranks: %s", iha_status_name(st));
    }
    st = iha_mpi_forward(ctx, MPI_COMM_WORLD, IHA_MPI_ZIGZAG, &few_zigzag, &op, &L.weights, (iha_buffer){x, 0},
                         (iha_buffer){z, 0});
    CHECK(st == IHA_ERROR_INVALID_ARGUMENT, "fewer than 2R tokens in zig-zag: %s", iha_status_name(st));

    /* A weight one rank's libiha call refuses (too small on rank 0): every rank refuses. */
    iha_layer_weights bad = L.weights;
    if (mpi_test_rank == 0) bad.alpha_k = (iha_buffer){small, 0};
    st =
        iha_mpi_forward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, &bad, (iha_buffer){x, 0}, (iha_buffer){z, 0});
    CHECK(st != IHA_OK, "a short alpha_k on rank 0 was accepted");
    mpi_test_read(ctx, z, back, nm);
    CHECK(memcmp(back, fill, nm * sizeof(float)) == 0, "a refused forward wrote z");

    iha_attention_options half = op;
    half.storage = IHA_STORAGE_F16;
    st = iha_mpi_forward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &half, &L.weights, (iha_buffer){x, 0},
                         (iha_buffer){z, 0});
    CHECK(st == IHA_ERROR_UNSUPPORTED, "half storage: %s", iha_status_name(st));
    st = iha_mpi_forward(ctx, MPI_COMM_WORLD, (iha_mpi_layout)7, &s, &op, &L.weights, (iha_buffer){x, 0},
                         (iha_buffer){z, 0});
    CHECK(st == IHA_ERROR_INVALID_ARGUMENT, "an unknown layout: %s", iha_status_name(st));

    /* The backward: dx overlapping x on one rank is refused everywhere, no gradient written. */
    cl_mem g = mpi_test_buffer(ctx, fill, 1), gq = mpi_test_buffer(ctx, NULL, L.size[0]);
    float *gfill = malloc(L.size[0] * sizeof(float)), *gback = malloc(L.size[0] * sizeof(float));
    for (size_t i = 0; i < L.size[0]; ++i) gfill[i] = 3.0f;
    clEnqueueWriteBuffer(iha_context_cl_queue(ctx), gq, CL_TRUE, 0, L.size[0] * sizeof(float), gfill, 0, NULL, NULL);
    const iha_layer_grads grads = {.wq = {gq, 0}};
    const iha_buffer dxb = {mpi_test_rank == 0 ? x : z, 0};
    st = iha_mpi_backward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, &L.weights, (iha_buffer){x, 0},
                          (iha_buffer){x, 0}, dxb, &grads);
    CHECK(st == IHA_ERROR_INVALID_ARGUMENT, "dx over x on rank 0: %s (%s)", iha_status_name(st), iha_mpi_message());
    mpi_test_read(ctx, gq, gback, L.size[0]);
    CHECK(memcmp(gback, gfill, L.size[0] * sizeof(float)) == 0, "a refused backward wrote grads->wq");
    mpi_test_read(ctx, z, back, nm);
    CHECK(memcmp(back, fill, nm * sizeof(float)) == 0, "a refused backward wrote dx");

    /* Different gradients asked for on different ranks: refused on every rank (the sums over
     * the ranks must be of the same gradients), nothing written. */
    cl_mem gk = mpi_test_buffer(ctx, gfill, L.size[0]);
    const iha_layer_grads mine =
        mpi_test_rank == 0 ? (iha_layer_grads){.wq = {gq, 0}} : (iha_layer_grads){.wk = {gk, 0}};
    st = iha_mpi_backward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, &L.weights, (iha_buffer){x, 0},
                          (iha_buffer){x, 0}, (iha_buffer){z, 0}, R > 1 ? &mine : NULL);
    if (R > 1)
        CHECK(st == IHA_ERROR_INVALID_ARGUMENT && strstr(iha_mpi_message(), "gradients") != NULL,
              "gradients differing between ranks: %s (%s)", iha_status_name(st), iha_mpi_message());
    if (R > 1) {
        mpi_test_read(ctx, gq, gback, L.size[0]);
        CHECK(memcmp(gback, gfill, L.size[0] * sizeof(float)) == 0, "a refused backward wrote grads->wq");
        mpi_test_read(ctx, gk, gback, L.size[0]);
        CHECK(memcmp(gback, gfill, L.size[0] * sizeof(float)) == 0, "a refused backward wrote grads->wk");
        mpi_test_read(ctx, z, back, nm);
        CHECK(memcmp(back, fill, nm * sizeof(float)) == 0, "a refused backward wrote dx");
    }
    clReleaseMemObject(gk);
    clReleaseMemObject(g);
    clReleaseMemObject(gq);
    clReleaseMemObject(x);
    clReleaseMemObject(z);
    clReleaseMemObject(small);
    free(gfill);
    free(gback);
    free(fill);
    free(back);
    data_free(&L);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int R;
    MPI_Comm_size(MPI_COMM_WORLD, &R);
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_test_rank);
    iha_context *ctx;
    if (mpi_test_context(&ctx)) {
        MPI_Finalize();
        return 1;
    }
    /* N = 9 and 10 split unevenly over 2, 3 and 4 ranks (and 2R chunks); windows of 2 and 3
     * tokens span ranks; rotary at the tokens' global positions. */
    static const layer_case cases[] = {
        {1, 9, 8, 2, 4, 2, IHA_MASK_CAUSAL, 0, 1, 0},       {1, 10, 8, 2, 4, 3, IHA_MASK_CAUSAL, 3, 1, 0},
        {1, 9, 8, 2, 4, 2, IHA_MASK_TOKEN_CAUSAL, 2, 1, 0}, {1, 10, 8, 2, 4, 2, IHA_MASK_TOKEN_CAUSAL, 0, 0, 0},
        {1, 9, 8, 2, 4, 2, IHA_MASK_NONE, 0, 1, 0},         {1, 10, 8, 2, 4, 2, IHA_MASK_NONE, 3, 1, 0},
        {2, 9, 8, 2, 4, 2, IHA_MASK_CAUSAL, 2, 1, 1},
    };
    static const iha_mpi_layout layouts[] = {IHA_MPI_CONTIGUOUS, IHA_MPI_ZIGZAG};
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; ++li)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
            if (layouts[li] != IHA_MPI_ZIGZAG || cases[i].N >= 2 * (size_t)R) run_case(ctx, R, &cases[i], layouts[li]);
    some_outputs(ctx, R);
    refusals(ctx, R);
    iha_context_free(ctx);
    const int code = mpi_test_finish("test_mpi_layer", R);
    MPI_Finalize();
    return code;
}
