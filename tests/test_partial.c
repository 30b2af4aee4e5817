/*
 * test_partial.c - iha_attention_partial and iha_attention_partial_backward: a sequence split into
 * R = 2, 3, 4 key and query blocks (N not divisible by R), every mask, windows spanning blocks,
 * the blocks merged in ring order and in reverse, key blocks cut apart from the query blocks;
 * the merged o and lse against iha_attention on the whole sequence and the float64 reference,
 * the summed block gradients against iha_attention_backward on the whole; rows that see no key
 * of a block; the refusals. Devices that are not GPUs run the forward and the backward as
 * register tiles and GPUs as rows: other_geometry runs a share of the cases down the other device
 * type's path (reading the private context, as tests/test_small_shapes.c does), so both kinds of
 * kernel are checked on every device, Oclgrind's included.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "runtime/context.h" /* info.is_gpu: the kernels follow the device type */
#include "test_util.h"

#define MAX_R 4

typedef struct partial_case {
    size_t B, N, H, d, P;
    int mask;
    int64_t window;
    size_t R;    /* blocks */
    int reverse; /* merge key blocks i, i+1, ... instead of the ring's i, i-1, ... */
    float scale; /* 0: 1/sqrt(d) */
    size_t Rk;   /* key blocks when they differ from the R query blocks; 0: R */
} partial_case;

/* Token boundaries of R nearly equal blocks: block j is tokens start[j] .. start[j+1]-1. */
static void split(size_t N, size_t R, size_t start[MAX_R + 1])
{
    for (size_t j = 0; j <= R; ++j) start[j] = j * N / R;
}

/* Rows [b][h][t0 .. t0+rows) of a [B][H][T][w] tensor to or from a [B][H][rows][w] block. */
static void copy_rows(float *whole, float *block, size_t BH, size_t T, size_t t0, size_t rows, size_t w, int out)
{
    for (size_t bh = 0; bh < BH; ++bh) {
        float *a = whole + (bh * T + t0) * w, *b = block + bh * rows * w;
        if (out)
            memcpy(a, b, rows * w * sizeof(float));
        else
            memcpy(b, a, rows * w * sizeof(float));
    }
}

static cl_mem upload(const float *x, size_t n)
{
    cl_mem m = tu_buffer_new(tu_ctx, n);
    if (x != NULL) tu_buffer_write(tu_ctx, m, 0, x, n);
    return m;
}

static double rel_l2_f(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        const double e = (double)a[i] - (double)b[i];
        num += e * e;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void assert_close_f(const char *what, const partial_case *c, const float *a, const float *b, size_t n,
                           double tol)
{
    const double e = rel_l2_f(a, b, n);
    if (!(e <= tol))
        fail_msg("%s: relative L2 %.3g > %.3g (N=%zu P=%zu d=%zu mask=%d window=%lld R=%zu)", what, e, tol, c->N, c->P,
                 c->d, c->mask, (long long)c->window, c->R);
}

static void run_case(const partial_case *c)
{
    const size_t BH = c->B * c->H, T = c->N * c->P, d = c->d, n = BH * T * d, rows = BH * T;
    const iha_shape whole = {c->B, c->N, 1, c->H, d, c->P};
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.mask = c->mask;
    o.window = c->window;
    o.scale = c->scale;
    tu_rng rng = tu_rng_seeded(1000 + c->N * 7 + c->R * 13 + (size_t)c->mask * 3 + (size_t)c->window);
    float *q = tu_random_array(&rng, n, 1.5f), *k = tu_random_array(&rng, n, 1.5f);
    float *v = tu_random_array(&rng, n, 1.0f), *g = tu_random_array(&rng, n, 1.0f);
    float *o_whole = tu_malloc(n * sizeof(float)), *l_whole = tu_malloc(rows * sizeof(float));
    float *o_part = tu_malloc(n * sizeof(float)), *l_part = tu_malloc(rows * sizeof(float));
    float *grad_whole = tu_malloc(3 * n * sizeof(float)), *grad_part = tu_malloc(3 * n * sizeof(float));
    float *tmp = tu_malloc(n * sizeof(float));

    /* The whole sequence through iha_attention and iha_attention_backward. */
    cl_mem bq = upload(q, n), bk = upload(k, n), bv = upload(v, n), bg = upload(g, n);
    cl_mem bo = upload(NULL, n), bl = upload(NULL, rows), bd[3];
    for (int i = 0; i < 3; ++i) bd[i] = upload(NULL, n);
    tu_assert_status(tu_ctx,
                     iha_attention(tu_ctx, &whole, &o, (iha_buffer){bq, 0}, (iha_buffer){bk, 0}, (iha_buffer){bv, 0},
                                   (iha_buffer){bo, 0}, (iha_buffer){bl, 0}),
                     IHA_OK);
    tu_assert_status(tu_ctx,
                     iha_attention_backward(tu_ctx, &whole, &o, (iha_buffer){bq, 0}, (iha_buffer){bk, 0},
                                            (iha_buffer){bv, 0}, (iha_buffer){bo, 0}, (iha_buffer){bl, 0},
                                            (iha_buffer){bg, 0}, (iha_buffer){bd[0], 0}, (iha_buffer){bd[1], 0},
                                            (iha_buffer){bd[2], 0}),
                     IHA_OK);
    tu_buffer_read(tu_ctx, bo, 0, o_whole, n);
    tu_buffer_read(tu_ctx, bl, 0, l_whole, rows);
    for (int i = 0; i < 3; ++i) tu_buffer_read(tu_ctx, bd[i], 0, grad_whole + i * n, n);

    /* Per-block device tensors: query blocks from one split, key blocks from another (the
     * same one unless Rk is set); slots q, k, v, dout, o, lse, dq, dk, dv. */
    const size_t Rk = c->Rk ? c->Rk : c->R;
    size_t start[MAX_R + 1], kstart[MAX_R + 1];
    split(c->N, c->R, start);
    split(c->N, Rk, kstart);
    cl_mem blk[MAX_R][9], kblk[MAX_R][9];
    for (size_t j = 0; j < Rk; ++j) {
        const size_t tj = (kstart[j + 1] - kstart[j]) * c->P, nj = BH * tj * d;
        const float *src[2] = {k, v};
        for (int s = 0; s < 2; ++s) {
            copy_rows((float *)src[s], tmp, BH, T, kstart[j] * c->P, tj, d, 0);
            kblk[j][1 + s] = upload(tmp, nj);
        }
        kblk[j][7] = upload(NULL, nj);
        kblk[j][8] = upload(NULL, nj);
    }
    for (size_t j = 0; j < c->R; ++j) {
        const size_t tj = (start[j + 1] - start[j]) * c->P, nj = BH * tj * d;
        const float *src[4] = {q, k, v, g};
        for (int s = 0; s < 4; ++s) {
            copy_rows((float *)src[s], tmp, BH, T, start[j] * c->P, tj, d, 0);
            blk[j][s] = upload(tmp, nj);
        }
        blk[j][4] = upload(NULL, nj);
        blk[j][5] = upload(NULL, BH * tj);
        for (int s = 6; s < 9; ++s) blk[j][s] = upload(NULL, nj);
    }

    /* Forward: each query block merges every key block, its own first. */
    for (size_t i = 0; i < c->R; ++i) {
        const iha_shape sq = {c->B, start[i + 1] - start[i], 1, c->H, d, c->P};
        for (size_t s = 0; s < Rk; ++s) {
            const size_t j = c->reverse ? (i + s) % Rk : (i + Rk - s) % Rk;
            const iha_partial_block pb = {start[i], kstart[j], kstart[j + 1] - kstart[j], s == 0};
            tu_assert_status(tu_ctx,
                             iha_attention_partial(tu_ctx, &sq, &o, &pb, (iha_buffer){blk[i][0], 0},
                                                   (iha_buffer){kblk[j][1], 0}, (iha_buffer){kblk[j][2], 0},
                                                   (iha_buffer){blk[i][4], 0}, (iha_buffer){blk[i][5], 0}),
                             IHA_OK);
        }
        const size_t ti = sq.tokens * c->P;
        tu_buffer_read(tu_ctx, blk[i][4], 0, tmp, BH * ti * d);
        copy_rows(o_part, tmp, BH, T, start[i] * c->P, ti, d, 1);
        tu_buffer_read(tu_ctx, blk[i][5], 0, tmp, BH * ti);
        copy_rows(l_part, tmp, BH, T, start[i] * c->P, ti, 1, 1);
    }
    assert_close_f("o against iha_attention", c, o_part, o_whole, n, 1e-5);
    assert_close_f("lse against iha_attention", c, l_part, l_whole, rows, 1e-5);
    ref_problem rp = {.B = c->B, .N = c->N, .H = c->H, .d = d, .P = c->P, .mask = c->mask, .window = c->window,
                      .scale = c->scale};
    double *ro = tu_malloc(3 * n * sizeof(double)), *rl = tu_malloc(rows * sizeof(double));
    assert_int_equal(ref_attention(&rp, q, k, v, ro, rl), 0);
    tu_assert_close("o against the reference", o_part, ro, n, 1e-5);
    tu_assert_close("lse against the reference", l_part, rl, rows, 1e-5);

    /* Backward from the merged state: dq summed over key blocks (first overwrites), dk and dv
     * over query blocks (accumulate after the first query block). */
    for (size_t i = 0; i < c->R; ++i) {
        const iha_shape sq = {c->B, start[i + 1] - start[i], 1, c->H, d, c->P};
        iha_attention_options ob = o;
        ob.accumulate = i > 0;
        for (size_t s = 0; s < Rk; ++s) {
            const size_t j = c->reverse ? (i + s) % Rk : (i + Rk - s) % Rk;
            const iha_partial_block pb = {start[i], kstart[j], kstart[j + 1] - kstart[j], s == 0};
            tu_assert_status(
                tu_ctx,
                iha_attention_partial_backward(
                    tu_ctx, &sq, &ob, &pb, (iha_buffer){blk[i][0], 0}, (iha_buffer){kblk[j][1], 0},
                    (iha_buffer){kblk[j][2], 0}, (iha_buffer){blk[i][4], 0}, (iha_buffer){blk[i][5], 0},
                    (iha_buffer){blk[i][3], 0}, (iha_buffer){blk[i][6], 0}, (iha_buffer){kblk[j][7], 0},
                    (iha_buffer){kblk[j][8], 0}),
                IHA_OK);
        }
    }
    for (size_t i = 0; i < c->R; ++i) {
        const size_t ti = (start[i + 1] - start[i]) * c->P;
        tu_buffer_read(tu_ctx, blk[i][6], 0, tmp, BH * ti * d);
        copy_rows(grad_part, tmp, BH, T, start[i] * c->P, ti, d, 1);
    }
    for (size_t j = 0; j < Rk; ++j) {
        const size_t tj = (kstart[j + 1] - kstart[j]) * c->P;
        for (int s = 1; s < 3; ++s) {
            tu_buffer_read(tu_ctx, kblk[j][6 + s], 0, tmp, BH * tj * d);
            copy_rows(grad_part + s * n, tmp, BH, T, kstart[j] * c->P, tj, d, 1);
        }
    }
    static const char *const what[3] = {"dqt", "dkt", "dvt"};
    for (int s = 0; s < 3; ++s) assert_close_f(what[s], c, grad_part + s * n, grad_whole + s * n, n, 1e-5);
    assert_int_equal(ref_attention_backward(&rp, q, k, v, g, ro, ro + n, ro + 2 * n), 0);
    for (int s = 0; s < 3; ++s) tu_assert_close(what[s], grad_part + s * n, ro + s * n, n, 1e-4);

    for (size_t j = 0; j < c->R; ++j)
        for (int s = 0; s < 9; ++s) tu_buffer_release(blk[j][s]);
    for (size_t j = 0; j < Rk; ++j)
        for (int s = 1; s < 9; s += s == 2 ? 5 : 1) tu_buffer_release(kblk[j][s]);
    tu_buffer_release(bq), tu_buffer_release(bk), tu_buffer_release(bv), tu_buffer_release(bg);
    tu_buffer_release(bo), tu_buffer_release(bl);
    for (int i = 0; i < 3; ++i) tu_buffer_release(bd[i]);
    free(q), free(k), free(v), free(g), free(o_whole), free(l_whole), free(o_part), free(l_part);
    free(grad_whole), free(grad_part), free(tmp), free(ro), free(rl);
}

static void blocks_merge_to_whole(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    /* Windows of 2 and 4 tokens span block boundaries at N = 11 and 13. */
    static const int64_t windows[3] = {0, 2, 4};
    for (size_t R = 2; R <= MAX_R; ++R)
        for (int mask = 0; mask < 3; ++mask)
            for (int w = 0; w < 3; ++w) {
                const partial_case c = {1, R == 3 ? 11 : 13, 2, R == 4 ? 6 : 16, R == 2 ? 1 : 3,
                                        mask, windows[w], R, (int)((R + (size_t)mask + (size_t)w) % 2), 0.0f, 0};
                run_case(&c);
            }
    /* B = 2, d = 64, a scale of its own, both orders; then key blocks cut apart from the query
     * blocks (3 query blocks against 2 and 4 key blocks), every mask. */
    for (int reverse = 0; reverse < 2; ++reverse) {
        const partial_case c = {2, 10, 2, 64, 2, IHA_MASK_CAUSAL, 3, 3, reverse, 0.3f, 0};
        run_case(&c);
    }
    for (size_t Rk = 2; Rk <= MAX_R; Rk += 2)
        for (int mask = 0; mask < 3; ++mask) {
            const partial_case c = {1, 11, 1, 8, 3, mask, mask == 1 ? 3 : 0, 3, 0, 0.0f, Rk};
            run_case(&c);
        }
    /* Blocks of 48 and 32 rows: several 16-query blocks and, on CPUs, several key groups and
     * partial dq sums per (b, h) inside one call. */
    for (int mask = 0; mask < 3; mask += 2) {
        const partial_case c = {1, 48, 2, 16, 2, mask, mask == 0 ? 5 : 0, 2, 1, 0.0f, mask == 0 ? 3 : 0};
        run_case(&c);
    }
}

/* The device's own geometry; restore_geometry, the teardown, puts it back after a failure. */
static int native_is_gpu = -1;

static int restore_geometry(void **state)
{
    (void)state;
    if (tu_ctx && native_is_gpu >= 0) tu_ctx->info.is_gpu = native_is_gpu;
    return 0;
}

/* Every mask, a window spanning blocks, ragged and padded head widths, down the other device
 * type's kernels, forward and backward. */
static void other_geometry(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    native_is_gpu = tu_ctx->info.is_gpu;
    tu_ctx->info.is_gpu = !native_is_gpu;
    for (int mask = 0; mask < 3; ++mask) {
        const partial_case c = {1, 11, 2, mask == 1 ? 16 : 6, 3, mask, mask == 2 ? 2 : 0, 3, mask == 0, 0.0f, 0};
        run_case(&c);
    }
    const partial_case c = {2, 10, 1, 64, 2, IHA_MASK_CAUSAL, 3, 2, 0, 0.3f, 3};
    run_case(&c);
    restore_geometry(NULL);
}

/* A causal key block after the queries: the state stays bit for bit; with `first` it becomes
 * empty (o = 0, lse = -inf). */
static void invisible_block_keeps_state(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 4, 1, 2, 8, 2};
    const size_t n = 2 * 8 * 8, rows = 2 * 8;
    iha_attention_options o;
    iha_attention_options_init(&o);
    tu_rng rng = tu_rng_seeded(7);
    float *x = tu_random_array(&rng, n, 1.0f);
    cl_mem bq = upload(x, n), bk = upload(x, n), bo = upload(NULL, n), bl = upload(NULL, rows);
    float *fill = tu_malloc(n * sizeof(float));
    tu_fill_value(fill, n, 3.0f);
    tu_buffer_write(tu_ctx, bo, 0, fill, n);
    tu_buffer_write(tu_ctx, bl, 0, fill, rows);
    iha_partial_block pb = {0, 4, 4, 0};
    tu_assert_status(tu_ctx,
                     iha_attention_partial(tu_ctx, &s, &o, &pb, (iha_buffer){bq, 0}, (iha_buffer){bk, 0},
                                           (iha_buffer){bk, 0}, (iha_buffer){bo, 0}, (iha_buffer){bl, 0}),
                     IHA_OK);
    tu_assert_buffer_all(tu_ctx, bo, 0, n, 3.0f);
    tu_assert_buffer_all(tu_ctx, bl, 0, rows, 3.0f);
    pb.first = 1;
    tu_assert_status(tu_ctx,
                     iha_attention_partial(tu_ctx, &s, &o, &pb, (iha_buffer){bq, 0}, (iha_buffer){bk, 0},
                                           (iha_buffer){bk, 0}, (iha_buffer){bo, 0}, (iha_buffer){bl, 0}),
                     IHA_OK);
    tu_assert_buffer_all(tu_ctx, bo, 0, n, 0.0f);
    tu_assert_buffer_all(tu_ctx, bl, 0, rows, -INFINITY);
    free(x), free(fill);
    tu_buffer_release(bq), tu_buffer_release(bk), tu_buffer_release(bo), tu_buffer_release(bl);
}

static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 4, 1, 2, 8, 2};
    const size_t n = 2 * 8 * 8, rows = 2 * 8;
    iha_attention_options o;
    iha_attention_options_init(&o);
    float *fill = tu_malloc(4 * n * sizeof(float));
    tu_fill_value(fill, 4 * n, 3.0f);
    cl_mem in = upload(fill, 4 * n), out = upload(fill, 4 * n), lse = upload(fill, rows);
    const iha_buffer q = {in, 0}, k = {in, n}, v = {in, 2 * n}, g = {in, 3 * n}, l = {lse, 0};
    const iha_buffer ob = {out, 0}, d0 = {out, n}, d1 = {out, 2 * n}, d2 = {out, 3 * n};
    iha_partial_block pb = {4, 0, 4, 0};
    /* The forward's state o, lse live in `out` and `lse`; the backward's outputs in `out`. */
    tu_assert_status(tu_ctx, iha_attention_partial(tu_ctx, &s, &o, NULL, q, k, v, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_attention_partial_backward(tu_ctx, &s, &o, NULL, q, k, v, ob, l, g, d0, d1, d2),
                     IHA_ERROR_INVALID_ARGUMENT);
    pb.k_tokens = 0;
    tu_assert_status(tu_ctx, iha_attention_partial(tu_ctx, &s, &o, &pb, q, k, v, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    pb.k_tokens = 5; /* kt and vt hold 4 tokens: vt's buffer ends short of 5 after 2n */
    tu_assert_status(tu_ctx, iha_attention_partial(tu_ctx, &s, &o, &pb, q, k, (iha_buffer){in, 3 * n}, ob, l),
                     IHA_ERROR_BUFFER_TOO_SMALL);
    pb.k_tokens = 4;
    pb.q_offset = SIZE_MAX - 2;
    tu_assert_status(tu_ctx, iha_attention_partial(tu_ctx, &s, &o, &pb, q, k, v, ob, l), IHA_ERROR_SIZE_OVERFLOW);
    pb.q_offset = 4;
    pb.k_offset = (size_t)1 << 30; /* ends past virtual row INT_MAX/4 */
    tu_assert_status(tu_ctx, iha_attention_partial(tu_ctx, &s, &o, &pb, q, k, v, ob, l), IHA_ERROR_UNSUPPORTED);
    pb.k_offset = 0;
    iha_attention_options bad = o;
    bad.storage = IHA_STORAGE_F16;
    tu_assert_status(tu_ctx, iha_attention_partial(tu_ctx, &s, &bad, &pb, q, k, v, ob, l), IHA_ERROR_UNSUPPORTED);
    bad = o;
    const size_t lens[2] = {2, 2};
    bad.seq_lens = lens;
    bad.seq_count = 2;
    tu_assert_status(tu_ctx, iha_attention_partial(tu_ctx, &s, &bad, &pb, q, k, v, ob, l), IHA_ERROR_UNSUPPORTED);
    bad = o;
    bad.rope = 1;
    tu_assert_status(tu_ctx, iha_attention_partial(tu_ctx, &s, &bad, &pb, q, k, v, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    /* The state overlapping an input, or the backward's outputs overlapping each other. */
    tu_assert_status(tu_ctx, iha_attention_partial(tu_ctx, &s, &o, &pb, q, k, v, (iha_buffer){in, n / 2}, l),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_attention_partial_backward(tu_ctx, &s, &o, &pb, q, k, v, q, l, g, d0, d0, d2),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_attention_partial_backward(tu_ctx, &s, &o, &pb, q, k, v, q, l, g, d0, d1, g),
                     IHA_ERROR_INVALID_ARGUMENT);
    const iha_shape zero = {1, 0, 1, 2, 8, 2};
    tu_assert_status(tu_ctx, iha_attention_partial(tu_ctx, &zero, &o, &pb, q, k, v, ob, l),
                     IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(iha_attention_partial(NULL, &s, &o, &pb, q, k, v, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    tu_assert_buffer_all(tu_ctx, out, 0, 4 * n, 3.0f);
    tu_assert_buffer_all(tu_ctx, lse, 0, rows, 3.0f);
    free(fill);
    tu_buffer_release(in), tu_buffer_release(out), tu_buffer_release(lse);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(blocks_merge_to_whole),
        cmocka_unit_test(invisible_block_keeps_state),
        cmocka_unit_test_teardown(other_geometry, restore_geometry),
        cmocka_unit_test(refusals),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
