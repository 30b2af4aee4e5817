/*
 * test_mpi_attention.c - iha_mpi_attention and iha_mpi_attention_backward under
 * mpirun: every rank builds the same random sequence, runs the single-process
 * iha_attention and iha_attention_backward on the whole of it, runs the ring on
 * its own tokens, and compares its rows (and the forward against the float64
 * reference); every mask, windows spanning ranks, N not divisible by R (or 2R),
 * gradients added into with accumulate, each in both layouts (contiguous and
 * zig-zag, a rank's two runs gathered into place); iha_mpi_runs' cover of the
 * sequence; the refusals agreed by every rank. A plain main: nonzero when any
 * rank saw a failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"
#include "reference.h"

#define CHECK MPI_CHECK
#define rank_id mpi_test_rank
#define rnd mpi_test_random
#define dev mpi_test_buffer
#define get mpi_test_read

/* This rank's tokens of a layout: its runs and their virtual rows. */
typedef struct rank_rows {
    iha_mpi_run runs[2];
    size_t P, rows;
} rank_rows;

static rank_rows rank_rows_of(size_t N, int R, iha_mpi_layout layout, size_t P)
{
    rank_rows rr;
    iha_mpi_runs(N, R, rank_id, layout, rr.runs);
    rr.P = P;
    rr.rows = (rr.runs[0].count + rr.runs[1].count) * P;
    return rr;
}

/* Where row i of this rank's [BH][rows][w] tensor lies in the whole [BH][T][w] one: run 0's
 * rows then run 1's in each slab. */
static size_t whole_row(const rank_rows *rr, size_t T, size_t i)
{
    const size_t bh = i / rr->rows, t = i % rr->rows, r0 = rr->runs[0].count * rr->P;
    return bh * T + (t < r0 ? rr->runs[0].first * rr->P + t : rr->runs[1].first * rr->P + t - r0);
}

static void rows_of(const float *whole, float *mine, size_t BH, size_t T, const rank_rows *rr, size_t w)
{
    for (size_t i = 0; i < BH * rr->rows; ++i) memcpy(mine + i * w, whole + whole_row(rr, T, i) * w, w * sizeof(float));
}

static void rows_of_d(const double *whole, double *mine, size_t BH, size_t T, const rank_rows *rr, size_t w)
{
    for (size_t i = 0; i < BH * rr->rows; ++i)
        memcpy(mine + i * w, whole + whole_row(rr, T, i) * w, w * sizeof(double));
}

static double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        const double e = (double)a[i] - (double)b[i];
        num += e * e;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct mpi_case {
    size_t B, N, H, d, P;
    int mask;
    int64_t window;
    int accumulate;
} mpi_case;

static void run_case(iha_context *ctx, int R, const mpi_case *c, iha_mpi_layout layout)
{
    const size_t BH = c->B * c->H, T = c->N * c->P, d = c->d, n = BH * T * d;
    const iha_shape whole = {c->B, c->N, 1, c->H, d, c->P};
    iha_attention_options op;
    iha_attention_options_init(&op);
    op.mask = c->mask;
    op.window = c->window;
    mpi_test_seed(12345 + c->N * 31 + (uint64_t)c->mask * 7 + (uint64_t)c->window);
    float *x[4];
    for (int i = 0; i < 4; ++i) {
        x[i] = malloc(n * sizeof(float));
        for (size_t e = 0; e < n; ++e) x[i][e] = rnd(i == 0 || i == 1 ? 1.5f : 1.0f);
    }
    /* The whole sequence, single process. */
    cl_mem w[4], wo = dev(ctx, NULL, n), wl = dev(ctx, NULL, BH * T), wd[3];
    for (int i = 0; i < 4; ++i) w[i] = dev(ctx, x[i], n);
    for (int i = 0; i < 3; ++i) wd[i] = dev(ctx, NULL, n);
    CHECK(iha_attention(ctx, &whole, &op, (iha_buffer){w[0], 0}, (iha_buffer){w[1], 0}, (iha_buffer){w[2], 0},
                        (iha_buffer){wo, 0}, (iha_buffer){wl, 0}) == IHA_OK,
          "iha_attention: %s", iha_context_message(ctx));
    CHECK(iha_attention_backward(ctx, &whole, &op, (iha_buffer){w[0], 0}, (iha_buffer){w[1], 0}, (iha_buffer){w[2], 0},
                                 (iha_buffer){wo, 0}, (iha_buffer){wl, 0}, (iha_buffer){w[3], 0},
                                 (iha_buffer){wd[0], 0}, (iha_buffer){wd[1], 0}, (iha_buffer){wd[2], 0}) == IHA_OK,
          "iha_attention_backward: %s", iha_context_message(ctx));
    float *ref[6];
    for (int i = 0; i < 6; ++i) ref[i] = malloc(n * sizeof(float));
    get(ctx, wo, ref[0], n);
    get(ctx, wl, ref[1], BH * T);
    for (int i = 0; i < 3; ++i) get(ctx, wd[i], ref[2 + i], n);

    /* This rank's tokens through the ring. */
    const rank_rows rr = rank_rows_of(c->N, R, layout, c->P);
    const size_t rows = rr.rows, nm = BH * rows * d;
    float *mine = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    cl_mem m[4], mo = dev(ctx, NULL, nm), ml = dev(ctx, NULL, BH * rows), md[3];
    for (int i = 0; i < 4; ++i) {
        rows_of(x[i], mine, BH, T, &rr, d);
        m[i] = dev(ctx, mine, nm);
    }
    for (int i = 0; i < 3; ++i) {
        for (size_t e = 0; e < nm; ++e) mine[e] = c->accumulate ? 0.25f * (float)(e % 7) : NAN;
        md[i] = dev(ctx, mine, nm);
    }
    const iha_status sf =
        iha_mpi_attention(ctx, MPI_COMM_WORLD, layout, &whole, &op, (iha_buffer){m[0], 0}, (iha_buffer){m[1], 0},
                          (iha_buffer){m[2], 0}, (iha_buffer){mo, 0}, (iha_buffer){ml, 0});
    CHECK(sf == IHA_OK, "iha_mpi_attention: %s: %s", iha_status_name(sf), iha_mpi_message());
    const char *what = "";
    char label[160];
    snprintf(label, sizeof label, "R=%d %s N=%zu P=%zu mask=%d window=%lld accumulate=%d", R,
             layout == IHA_MPI_ZIGZAG ? "zig-zag" : "contiguous", c->N, c->P, c->mask, (long long)c->window,
             c->accumulate);
    get(ctx, mo, got, nm);
    rows_of(ref[0], want, BH, T, &rr, d);
    double e = rel_l2(got, want, nm);
    CHECK(e <= 1e-5, "%s o: relative L2 %.3g against iha_attention", label, e);
    get(ctx, ml, got, BH * rows);
    rows_of(ref[1], want, BH, T, &rr, 1);
    e = rel_l2(got, want, BH * rows);
    CHECK(e <= 1e-5, "%s lse: relative L2 %.3g against iha_attention", label, e);
    if (!c->accumulate) {
        ref_problem rp = {.B = c->B, .N = c->N, .H = c->H, .d = d, .P = c->P, .mask = c->mask, .window = c->window};
        double *ro = malloc(n * sizeof(double)), *rl = malloc(BH * T * sizeof(double));
        if (ref_attention(&rp, x[0], x[1], x[2], ro, rl) == 0) {
            double *rm = malloc(nm * sizeof(double));
            rows_of_d(ro, rm, BH, T, &rr, d);
            get(ctx, mo, got, nm);
            e = mpi_test_rel_l2(got, rm, nm);
            CHECK(e <= 1e-5, "%s o: relative L2 %.3g against the float64 reference", label, e);
            free(rm);
        } else
            CHECK(0, "%s: ref_attention failed", label);
        free(ro);
        free(rl);
    }

    iha_attention_options ob = op;
    ob.accumulate = c->accumulate;
    const iha_status sb = iha_mpi_attention_backward(ctx, MPI_COMM_WORLD, layout, &whole, &ob, (iha_buffer){m[0], 0},
                                                     (iha_buffer){m[1], 0}, (iha_buffer){m[2], 0}, (iha_buffer){mo, 0},
                                                     (iha_buffer){ml, 0}, (iha_buffer){m[3], 0}, (iha_buffer){md[0], 0},
                                                     (iha_buffer){md[1], 0}, (iha_buffer){md[2], 0});
    CHECK(sb == IHA_OK, "iha_mpi_attention_backward: %s: %s", iha_status_name(sb), iha_mpi_message());
    for (int i = 0; i < 3; ++i) {
        what = i == 0 ? "dqt" : i == 1 ? "dkt" : "dvt";
        get(ctx, md[i], got, nm);
        rows_of(ref[2 + i], want, BH, T, &rr, d);
        if (c->accumulate)
            for (size_t q = 0; q < nm; ++q) want[q] += 0.25f * (float)(q % 7);
        e = rel_l2(got, want, nm);
        CHECK(e <= 2e-5, "%s %s: relative L2 %.3g against iha_attention_backward", label, what, e);
    }
    for (int i = 0; i < 4; ++i) {
        clReleaseMemObject(w[i]);
        clReleaseMemObject(m[i]);
        free(x[i]);
    }
    for (int i = 0; i < 3; ++i) {
        clReleaseMemObject(wd[i]);
        clReleaseMemObject(md[i]);
    }
    for (int i = 0; i < 6; ++i) free(ref[i]);
    clReleaseMemObject(wo);
    clReleaseMemObject(wl);
    clReleaseMemObject(mo);
    clReleaseMemObject(ml);
    free(mine);
    free(got);
    free(want);
}

/* Refusals are agreed: a bad buffer on one rank is refused on every rank,
 * nothing written. */
static void refusals(iha_context *ctx, int R)
{
    const iha_shape s = {1, 8, 1, 1, 4, 2};
    iha_attention_options op;
    iha_attention_options_init(&op);
    size_t first, count;
    iha_mpi_split(s.tokens, R, rank_id, &first, &count);
    const size_t nm = count * 2 * 4;
    float *fill = malloc(nm * sizeof(float)), *back = malloc(nm * sizeof(float));
    for (size_t i = 0; i < nm; ++i) fill[i] = 7.0f;
    cl_mem a = dev(ctx, fill, nm), o = dev(ctx, fill, nm), small = dev(ctx, fill, 1);
    const iha_buffer q = {rank_id == R - 1 ? small : a, 0};
    iha_status st = iha_mpi_attention(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, q, (iha_buffer){a, 0},
                                      (iha_buffer){a, 0}, (iha_buffer){o, 0}, (iha_buffer){NULL, 0});
    if (rank_id == R - 1)
        CHECK(st == IHA_ERROR_BUFFER_TOO_SMALL, "short qt: %s", iha_status_name(st));
    else
        CHECK(st == IHA_ERROR_INVALID_ARGUMENT && strstr(iha_mpi_message(), "rank") != NULL,
              "short qt elsewhere: %s (%s)", iha_status_name(st), iha_mpi_message());
    get(ctx, o, back, nm);
    CHECK(memcmp(back, fill, nm * sizeof(float)) == 0, "a refused call wrote o");
    op.rope = 1;
    st = iha_mpi_attention(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, (iha_buffer){a, 0}, (iha_buffer){a, 0},
                           (iha_buffer){a, 0}, (iha_buffer){o, 0}, (iha_buffer){NULL, 0});
    CHECK(st == IHA_ERROR_UNSUPPORTED, "rope: %s", iha_status_name(st));
    op.rope = 0;
    const iha_shape tiny = {1, (size_t)R - 1, 1, 1, 4, 2};
    if (R > 1) {
        st = iha_mpi_attention(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &tiny, &op, (iha_buffer){a, 0},
                               (iha_buffer){a, 0}, (iha_buffer){a, 0}, (iha_buffer){o, 0}, (iha_buffer){NULL, 0});
        CHECK(st == IHA_ERROR_INVALID_ARGUMENT, "fewer tokens than ranks: %s", iha_status_name(st));
    }
    /* Arguments that differ between ranks (the mask on the last rank, the tokens on rank 0):
     * refused on every rank with the field named, never a hang or an aborted job. */
    if (R > 1) {
        iha_attention_options other = op;
        if (rank_id == R - 1) other.mask = IHA_MASK_NONE;
        st = iha_mpi_attention(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &other, (iha_buffer){a, 0},
                               (iha_buffer){a, 0}, (iha_buffer){a, 0}, (iha_buffer){o, 0}, (iha_buffer){NULL, 0});
        CHECK(st == IHA_ERROR_INVALID_ARGUMENT && strstr(iha_mpi_message(), "options->mask") != NULL,
              "masks differing between ranks: %s (%s)", iha_status_name(st), iha_mpi_message());
        iha_shape longer = s;
        if (rank_id == 0) longer.tokens = s.tokens + 3;
        st = iha_mpi_attention(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &longer, &op, (iha_buffer){a, 0},
                               (iha_buffer){a, 0}, (iha_buffer){a, 0}, (iha_buffer){o, 0}, (iha_buffer){NULL, 0});
        CHECK(st == IHA_ERROR_INVALID_ARGUMENT && strstr(iha_mpi_message(), "shape->tokens") != NULL,
              "tokens differing between ranks: %s (%s)", iha_status_name(st), iha_mpi_message());
        get(ctx, o, back, nm);
        CHECK(memcmp(back, fill, nm * sizeof(float)) == 0, "a refused call wrote o");
    }
    /* Zig-zag needs two chunks of at least one token per rank: 2R - 1 tokens are refused on
     * every rank, forward and backward, nothing written. */
    const iha_shape short_zz = {1, 2 * (size_t)R - 1, 1, 1, 4, 2};
    st = iha_mpi_attention(ctx, MPI_COMM_WORLD, IHA_MPI_ZIGZAG, &short_zz, &op, (iha_buffer){a, 0}, (iha_buffer){a, 0},
                           (iha_buffer){a, 0}, (iha_buffer){o, 0}, (iha_buffer){NULL, 0});
    CHECK(st == IHA_ERROR_INVALID_ARGUMENT && strstr(iha_mpi_message(), "zig-zag") != NULL,
          "zig-zag with 2R - 1 tokens: %s (%s)", iha_status_name(st), iha_mpi_message());
    st = iha_mpi_attention_backward(ctx, MPI_COMM_WORLD, IHA_MPI_ZIGZAG, &short_zz, &op, (iha_buffer){a, 0},
                                    (iha_buffer){a, 0}, (iha_buffer){a, 0}, (iha_buffer){a, 0}, (iha_buffer){a, 0},
                                    (iha_buffer){a, 0}, (iha_buffer){o, 0}, (iha_buffer){o, 0}, (iha_buffer){o, 0});
    CHECK(st == IHA_ERROR_INVALID_ARGUMENT && strstr(iha_mpi_message(), "zig-zag") != NULL,
          "zig-zag backward with 2R - 1 tokens: %s (%s)", iha_status_name(st), iha_mpi_message());
    get(ctx, o, back, nm);
    CHECK(memcmp(back, fill, nm * sizeof(float)) == 0, "a refused zig-zag call wrote o");
    /* o sharing qt's memory on one rank: the run-major copies must not hide it from the check. */
    iha_mpi_run zr[2];
    iha_mpi_runs(s.tokens, R, rank_id, IHA_MPI_ZIGZAG, zr);
    const size_t nz = (zr[0].count + zr[1].count) * 2 * 4;
    float *zfill = malloc(nz * sizeof(float)), *zback = malloc(nz * sizeof(float));
    for (size_t i = 0; i < nz; ++i) zfill[i] = 7.0f;
    cl_mem za = dev(ctx, zfill, nz), zo = dev(ctx, zfill, nz);
    st = iha_mpi_attention(ctx, MPI_COMM_WORLD, IHA_MPI_ZIGZAG, &s, &op, (iha_buffer){rank_id == R - 1 ? zo : za, 0},
                           (iha_buffer){za, 0}, (iha_buffer){za, 0}, (iha_buffer){zo, 0}, (iha_buffer){NULL, 0});
    CHECK(st == IHA_ERROR_INVALID_ARGUMENT, "zig-zag with o on qt on rank %d: %s (%s)", R - 1, iha_status_name(st),
          iha_mpi_message());
    get(ctx, zo, zback, nz);
    CHECK(memcmp(zback, zfill, nz * sizeof(float)) == 0, "a refused zig-zag call wrote o");
    clReleaseMemObject(za);
    clReleaseMemObject(zo);
    free(zfill);
    free(zback);
    /* The backward: lse is required; one rank without it refuses, every rank agrees, and no
     * gradient is written anywhere. */
    cl_mem dq = dev(ctx, fill, nm), lb = dev(ctx, fill, nm);
    const iha_buffer l = {rank_id == 0 ? NULL : lb, 0};
    st = iha_mpi_attention_backward(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &s, &op, (iha_buffer){a, 0},
                                    (iha_buffer){a, 0}, (iha_buffer){a, 0}, (iha_buffer){a, 0}, l, (iha_buffer){a, 0},
                                    (iha_buffer){dq, 0}, (iha_buffer){o, 0}, (iha_buffer){o, 0});
    CHECK(st == IHA_ERROR_INVALID_ARGUMENT, "backward without lse on rank 0: %s (%s)", iha_status_name(st),
          iha_mpi_message());
    get(ctx, dq, back, nm);
    CHECK(memcmp(back, fill, nm * sizeof(float)) == 0, "a refused backward wrote dqt");
    clReleaseMemObject(dq);
    clReleaseMemObject(lb);
    clReleaseMemObject(a);
    clReleaseMemObject(o);
    clReleaseMemObject(small);
    free(fill);
    free(back);
}

/* iha_mpi_runs: every layout's runs cover the sequence exactly once, in order within a rank;
 * zig-zag rank r holds chunks r and 2R - 1 - r of the split into 2R; out of range is 0 runs. */
static void runs_cover(void)
{
    static const size_t Ns[4] = {8, 9, 17, 100};
    unsigned char seen[100];
    for (int R = 1; R <= 5; ++R)
        for (int ni = 0; ni < 4; ++ni)
            for (int layout = 0; layout < 2; ++layout) {
                const size_t N = Ns[ni];
                memset(seen, 0, sizeof seen);
                for (int r = 0; r < R; ++r) {
                    iha_mpi_run runs[2];
                    const int k = iha_mpi_runs(N, R, r, (iha_mpi_layout)layout, runs);
                    CHECK(k == (layout == IHA_MPI_ZIGZAG ? 2 : 1), "runs of N=%zu R=%d r=%d: %d", N, R, r, k);
                    if (layout == IHA_MPI_ZIGZAG) {
                        size_t f0, c0, f1, c1;
                        iha_mpi_split(N, 2 * R, r, &f0, &c0);
                        iha_mpi_split(N, 2 * R, 2 * R - 1 - r, &f1, &c1);
                        CHECK(runs[0].first == f0 && runs[0].count == c0 && runs[1].first == f1 &&
                                  runs[1].count == c1 && (N < 2 * (size_t)R || (c0 > 0 && c1 > 0)) && f0 + c0 <= f1,
                              "zig-zag runs of N=%zu R=%d r=%d: %zu+%zu, %zu+%zu", N, R, r, runs[0].first,
                              runs[0].count, runs[1].first, runs[1].count);
                    } else
                        CHECK(runs[1].count == 0, "contiguous second run of N=%zu R=%d r=%d", N, R, r);
                    for (int b = 0; b < 2; ++b)
                        for (size_t t = runs[b].first; t < runs[b].first + runs[b].count && t < N; ++t) ++seen[t];
                    CHECK(runs[0].first + runs[0].count <= N && runs[1].first + runs[1].count <= N,
                          "runs of N=%zu R=%d r=%d end past the sequence", N, R, r);
                }
                for (size_t t = 0; t < N; ++t)
                    CHECK(seen[t] == 1, "layout %d N=%zu R=%d: token %zu held %d times", layout, N, R, t, seen[t]);
            }
    iha_mpi_run runs[2] = {{5, 5}, {5, 5}};
    CHECK(iha_mpi_runs(10, 2, 2, IHA_MPI_ZIGZAG, runs) == 0 && runs[0].count == 0 && runs[1].count == 0,
          "iha_mpi_runs of rank 2 of 2");
    CHECK(iha_mpi_runs(10, 2, 0, (iha_mpi_layout)7, runs) == 0, "iha_mpi_runs of layout 7");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int R;
    MPI_Comm_size(MPI_COMM_WORLD, &R);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_id);
    iha_context *ctx;
    if (mpi_test_context(&ctx)) {
        MPI_Finalize();
        return 1;
    }
    size_t s0, s1;
    iha_mpi_split(10, 4, 0, &s0, &s1);
    CHECK(s0 == 0 && s1 == 3, "split of 10 over 4, rank 0: %zu %zu", s0, s1);
    iha_mpi_split(10, 4, 3, &s0, &s1);
    CHECK(s0 == 8 && s1 == 2, "split of 10 over 4, rank 3: %zu %zu", s0, s1);
    runs_cover();
    /* N = 7 and 10 split unevenly over 2, 3 and 4 ranks (zig-zag: over 2R chunks, 2R + 1
     * tokens where 7 are fewer than 2R); windows of 2 and 3 tokens span ranks and chunks. H = 2 (B = 2
     * with accumulate) makes a run a row range in each of several slabs. */
    static const size_t Ns[2] = {7, 10};
    static const int64_t windows[3] = {0, 2, 3};
    for (int layout = 0; layout < 2; ++layout) {
        for (int ni = 0; ni < 2; ++ni)
            for (int mask = 0; mask < 3; ++mask)
                for (int wi = 0; wi < 3; ++wi) {
                    const size_t N = layout == IHA_MPI_ZIGZAG && Ns[ni] < 2 * (size_t)R ? 2 * (size_t)R + 1 : Ns[ni];
                    const mpi_case c = {1, N, 2, 8, ni == 0 ? 3 : 2, mask, windows[wi], 0};
                    run_case(ctx, R, &c, (iha_mpi_layout)layout);
                }
        const mpi_case acc = {2, 9, 1, 4, 2, IHA_MASK_CAUSAL, 0, 1};
        run_case(ctx, R, &acc, (iha_mpi_layout)layout);
    }
    refusals(ctx, R);
    iha_context_free(ctx);
    const int code = mpi_test_finish("test_mpi_attention", R);
    MPI_Finalize();
    return code;
}
