/* The library's SGEMM kernel (cl/gemm.cl through src/gemm/gemm.c) and the backend choice
 * of src/gemm/sgemm.c: products against a float64 host reference on ragged shapes (1x1x1,
 * 67x45x33, one to four rows, n not a multiple of the vector width, odd k, offsets, leading
 * dimensions beyond the row, alpha != 1) with NaN-filled outputs and guards around them, C += A B
 * (beta = 1), every tile of the tuning space (the full tier: every row count with every vector width), the refusals, and that a CPU context without a profile runs a
 * forward pass and a decoding step without calling into CLBlast. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gemm/sgemm.h"
#include "gemm/gemm.h"
#include "runtime/context.h"
#include "test_layer.h"
#include "test_util.h"

#define GUARD 19
#define SENTINEL (-777.25f)

/* One product: its shape, placement and scale. */
typedef struct gemm_case {
    size_t m, n, k;
    size_t a_off, lda, b_off, ldb, c_off, ldc; /* ld 0: the row length */
    float alpha;
} gemm_case;

static void fill_defaults(gemm_case *g)
{
    if (g->lda == 0) g->lda = g->k;
    if (g->ldb == 0) g->ldb = g->n;
    if (g->ldc == 0) g->ldc = g->n;
    if (g->alpha == 0.0f) g->alpha = 1.0f;
}

static size_t span(size_t rows, size_t cols, size_t ld) { return rows == 0 ? 0 : (rows - 1) * ld + cols; }

/* Runs the case through the kernel with `tile` (NULL: iha__sgemm_ex, the context's backend),
 * checks the result against float64, that C's padding between rows and the `guard` floats
 * around it keep their values. With guard 0 every buffer ends where its matrix does, so that a
 * read past it is out of bounds (reported under Oclgrind). */
static void check_case_guarded(gemm_case g, const iha_gemm_config *tile, uint64_t seed, size_t guard)
{
    fill_defaults(&g);
    tu_rng rng = tu_rng_seeded(seed);
    const size_t na = span(g.m, g.k, g.lda), nb = span(g.k, g.n, g.ldb), nc = span(g.m, g.n, g.ldc);
    float *a = tu_random_array(&rng, na ? na : 1, 1.0f), *b = tu_random_array(&rng, nb ? nb : 1, 1.0f);
    cl_mem da = tu_buffer_guarded(tu_ctx, a, na, g.a_off, guard, SENTINEL);
    cl_mem db = tu_buffer_guarded(tu_ctx, b, nb, g.b_off, guard, SENTINEL);
    cl_mem dc = tu_buffer_guarded(tu_ctx, NULL, nc, g.c_off, guard, SENTINEL);
    iha_status st = tile ? iha__gemm_kernel_enqueue(tu_ctx, tile, g.m, g.n, g.k, g.alpha, da, g.a_off, g.lda, db,
                                                    g.b_off, g.ldb, 0.0f, dc, g.c_off, g.ldc)
                         : iha__sgemm_ex(tu_ctx, 0, g.m, g.n, g.k, g.alpha, da, g.a_off, g.lda, db, g.b_off, g.ldb,
                                         dc, g.c_off, g.ldc);
    tu_assert_status(tu_ctx, st, IHA_OK);
    float *c = tu_malloc(nc * sizeof *c), *got = tu_malloc(g.m * g.n * sizeof *got);
    double *ref = tu_malloc(g.m * g.n * sizeof *ref);
    tu_buffer_read(tu_ctx, dc, g.c_off, c, nc);
    for (size_t i = 0; i < g.m; ++i)
        for (size_t j = 0; j < g.n; ++j) {
            double acc = 0.0;
            for (size_t l = 0; l < g.k; ++l) acc += (double)a[i * g.lda + l] * b[l * g.ldb + j];
            ref[i * g.n + j] = g.alpha * acc;
            got[i * g.n + j] = c[i * g.ldc + j];
        }
    char what[128];
    snprintf(what, sizeof what, "C of %zux%zux%zu (tile %dx%d ku %d group %zu)", g.m, g.n, g.k, tile ? tile->rows : 0,
             tile ? tile->vec : 0, tile ? tile->unroll : 0, tile ? tile->group : 0);
    tu_assert_close(what, got, ref, g.m * g.n, TU_TOL_F32);
    for (size_t i = 0; i + 1 < g.m; ++i)
        for (size_t j = g.n; j < g.ldc; ++j)
            if (!isnan(c[i * g.ldc + j])) fail_msg("%s: wrote padding at row %zu column %zu", what, i, j);
    tu_assert_guard(tu_ctx, dc, nc, g.c_off, guard, SENTINEL);
    tu_assert_guard(tu_ctx, da, na, g.a_off, guard, SENTINEL);
    tu_assert_guard(tu_ctx, db, nb, g.b_off, guard, SENTINEL);
    free(a), free(b), free(c), free(got), free(ref);
    tu_buffer_release(da), tu_buffer_release(db), tu_buffer_release(dc);
}

static void check_case(gemm_case g, const iha_gemm_config *tile, uint64_t seed)
{
    check_case_guarded(g, tile, seed, GUARD);
}

static const gemm_case ragged[] = {
    {1, 1, 1, 0, 0, 0, 0, 0, 0, 0},
    {67, 45, 33, 0, 0, 0, 0, 0, 0, 0},
    {1, 37, 29, 0, 0, 0, 0, 0, 0, 0},
    {2, 45, 33, 0, 0, 0, 0, 0, 0, 0},
    {3, 16, 7, 0, 0, 0, 0, 0, 0, 0},
    {4, 33, 64, 0, 0, 0, 0, 0, 0, 0},
    {5, 17, 1, 0, 0, 0, 0, 0, 0, 0},
    {13, 48, 31, 0, 0, 0, 0, 0, 0, 0},
    {64, 64, 64, 0, 0, 0, 0, 0, 0, 0},
    {67, 45, 33, 3, 40, 7, 50, 11, 61, -0.75f},
    {2, 19, 9, 1, 12, 5, 23, 2, 20, 2.5f},
};
#define RAGGED (sizeof ragged / sizeof ragged[0])

/* The context's backend (on a CPU without a profile: the kernel with its built-in tile). */
static void test_ragged_shapes_backend(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t i = 0; i < RAGGED; ++i) check_case(ragged[i], NULL, 100 + i);
}

/* Tiles of the tuning space's values on the ragged shapes: tunings other than the built-in must
 * be as correct. Unrolling and groups cycle with the tile, so every value appears without the
 * product of all four (each new tile is a new program). */
static const int kRows[] = {1, 2, 3, 4, 6, 8}, kVecs[] = {4, 8, 16}, kUnrolls[] = {1, 2, 4, 8};
static const size_t kGroups[] = {1, 4, 64};

static void check_tile(size_t r, size_t v, int t)
{
    const iha_gemm_config tile = {1, kRows[r], kVecs[v], kUnrolls[t % 4], kGroups[t % 3]};
    check_case(ragged[1], &tile, 200 + (uint64_t)t);
    check_case(ragged[9], &tile, 300 + (uint64_t)t);
    check_case(ragged[2], &tile, 400 + (uint64_t)t);
}

/* The vector width of each row count in test_tiles_of_every_value: with tile t = 3 r + v of
 * the full product, every width, unrolling and group size appears. */
static const size_t kQuickVec[] = {0, 2, 0, 2, 1, 1};

/* Every row count once, every vector width, unrolling and group size at least once. */
static void test_tiles_of_every_value(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t r = 0; r < sizeof kRows / sizeof kRows[0]; ++r) check_tile(r, kQuickVec[r], (int)(3 * r + kQuickVec[r]));
}

/* The full tier: every row count with every vector width. */
static void full_every_tile(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    int t = 0;
    for (size_t r = 0; r < sizeof kRows / sizeof kRows[0]; ++r)
        for (size_t v = 0; v < sizeof kVecs / sizeof kVecs[0]; ++v, ++t)
            if (v != kQuickVec[r]) check_tile(r, v, t);
}

/* Buffers that end where their matrices do: the edge tiles must not read or write past them. */
static void test_exact_buffers(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_gemm_config tiles[2];
    iha__gemm_kernel_default(tu_ctx, &tiles[0]);
    tiles[1] = (iha_gemm_config){1, 3, 8, 2, 4};
    for (int t = 0; t < 2; ++t) {
        check_case_guarded(ragged[1], &tiles[t], 500 + (uint64_t)t, 0);
        check_case_guarded(ragged[4], &tiles[t], 510 + (uint64_t)t, 0);
        check_case_guarded(ragged[10], &tiles[t], 520 + (uint64_t)t, 0);
    }
}

/* beta = 1 (iha__sgemm_acc, the layer backward's dX): C += A B on ragged shapes, with C's
 * padding between rows left alone; through the kernel's built-in tile and a tile whose vector
 * does not divide n, and through CLBlast. */
static void accumulate_case(const gemm_case *gc, const iha_gemm_config *tile, int clblast, uint64_t seed)
{
    gemm_case g = *gc;
    fill_defaults(&g);
    tu_rng rng = tu_rng_seeded(seed);
    const size_t na = span(g.m, g.k, g.lda), nb = span(g.k, g.n, g.ldb), nc = span(g.m, g.n, g.ldc);
    float *a = tu_random_array(&rng, na, 1.0f), *b = tu_random_array(&rng, nb, 1.0f);
    float *c0 = tu_random_array(&rng, nc, 1.0f), *c = tu_malloc(nc * sizeof *c);
    cl_mem da = tu_buffer_guarded(tu_ctx, a, na, g.a_off, GUARD, SENTINEL);
    cl_mem db = tu_buffer_guarded(tu_ctx, b, nb, g.b_off, GUARD, SENTINEL);
    cl_mem dc = tu_buffer_guarded(tu_ctx, c0, nc, g.c_off, GUARD, SENTINEL);
    /* The backend forced for this case: the kernel with its built-in tile (a GPU context on
     * CLBlast has none set), or CLBlast. */
    const iha_gemm_config backend = tu_ctx->gemm->config;
    if (tile == NULL && !clblast && !tu_ctx->gemm->config.own) iha__gemm_kernel_default(tu_ctx, &tu_ctx->gemm->config);
    if (tile == NULL) tu_ctx->gemm->config.own = !clblast;
    const iha_status st = tile ? iha__gemm_kernel_enqueue(tu_ctx, tile, g.m, g.n, g.k, 1.0f, da, g.a_off, g.lda, db,
                                                          g.b_off, g.ldb, 1.0f, dc, g.c_off, g.ldc)
                               : iha__sgemm_acc(tu_ctx, g.m, g.n, g.k, da, g.a_off, g.lda, db, g.b_off, g.ldb, dc,
                                                g.c_off, g.ldc);
    tu_ctx->gemm->config = backend;
    tu_assert_status(tu_ctx, st, IHA_OK);
    tu_buffer_read(tu_ctx, dc, g.c_off, c, nc);
    double *ref = tu_malloc(g.m * g.n * sizeof *ref);
    float *got = tu_malloc(g.m * g.n * sizeof *got);
    for (size_t i = 0; i < g.m; ++i)
        for (size_t j = 0; j < g.n; ++j) {
            double acc = c0[i * g.ldc + j];
            for (size_t l = 0; l < g.k; ++l) acc += (double)a[i * g.lda + l] * b[l * g.ldb + j];
            ref[i * g.n + j] = acc;
            got[i * g.n + j] = c[i * g.ldc + j];
        }
    tu_assert_close(clblast ? "C += A B (CLBlast)" : "C += A B", got, ref, g.m * g.n, TU_TOL_F32);
    for (size_t i = 0; i + 1 < g.m; ++i)
        for (size_t j = g.n; j < g.ldc; ++j)
            if (c[i * g.ldc + j] != c0[i * g.ldc + j]) fail_msg("C += A B changed padding at row %zu column %zu", i, j);
    tu_assert_guard(tu_ctx, dc, nc, g.c_off, GUARD, SENTINEL);
    free(a), free(b), free(c0), free(c), free(ref), free(got);
    tu_buffer_release(da), tu_buffer_release(db), tu_buffer_release(dc);
}

static void test_accumulate(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_gemm_config narrow = {1, 3, 8, 2, 4};
    for (size_t i = 0; i < RAGGED; ++i) {
        accumulate_case(&ragged[i], NULL, 0, 600 + i);
        accumulate_case(&ragged[i], &narrow, 0, 620 + i);
    }
    accumulate_case(&ragged[1], NULL, 1, 640);
    accumulate_case(&ragged[9], NULL, 1, 641);
}

/* k = 0: C = 0, NaN in C does not survive. */
static void test_empty_k_writes_zeros(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_gemm_config tile;
    iha__gemm_kernel_default(tu_ctx, &tile);
    cl_mem a = tu_buffer_new(tu_ctx, 1), b = tu_buffer_new(tu_ctx, 1);
    cl_mem c = tu_buffer_guarded(tu_ctx, NULL, 7 * 9, 0, GUARD, SENTINEL);
    tu_assert_status(tu_ctx, iha__gemm_kernel_enqueue(tu_ctx, &tile, 7, 9, 0, 1.0f, a, 0, 1, b, 0, 9, 0.0f, c, 0, 9), IHA_OK);
    tu_assert_buffer_all(tu_ctx, c, 0, 7 * 9, 0.0f);
    tu_assert_guard(tu_ctx, c, 7 * 9, 0, GUARD, SENTINEL);
    tu_buffer_release(a), tu_buffer_release(b), tu_buffer_release(c);
}

static void test_refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_gemm_config good;
    iha__gemm_kernel_default(tu_ctx, &good);
    cl_mem a = tu_buffer_new(tu_ctx, 6 * 5), b = tu_buffer_new(tu_ctx, 5 * 4), c = tu_buffer_new(tu_ctx, 6 * 4);
    const iha_gemm_config bad[] = {
        {1, 0, 16, 4, 1}, {1, 9, 16, 4, 1}, {1, 4, 5, 4, 1}, {1, 4, 8, 0, 1}, {1, 4, 8, 17, 1}, {1, 4, 8, 4, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
        tu_assert_status(tu_ctx, iha__gemm_kernel_enqueue(tu_ctx, &bad[i], 6, 4, 5, 1.0f, a, 0, 5, b, 0, 4, 0.0f, c, 0, 4),
                         IHA_ERROR_INVALID_ARGUMENT);
    /* Leading dimensions below the row, matrices one element past their buffers, and no A:
     * {a_off, lda, b_off, ldb, c_off, ldc, A missing}. */
    static const size_t layouts[][7] = {
        {0, 4, 0, 4, 0, 4, 0}, {0, 5, 0, 3, 0, 4, 0}, {1, 5, 0, 4, 0, 4, 0},
        {0, 5, 1, 4, 0, 4, 0}, {0, 5, 0, 4, 0, 5, 0}, {0, 5, 0, 4, 0, 4, 1},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; ++i) {
        const size_t *l = layouts[i];
        tu_assert_status(tu_ctx,
                         iha__gemm_kernel_enqueue(tu_ctx, &good, 6, 4, 5, 1.0f, l[6] ? NULL : a, l[0], l[1], b, l[2],
                                                  l[3], 0.0f, c, l[4], l[5]),
                         IHA_ERROR_INVALID_ARGUMENT);
    }
    /* Sizes beyond the kernel's int indices are refused before any buffer is read. */
    tu_assert_status(tu_ctx, iha__gemm_kernel_enqueue(tu_ctx, &good, (size_t)INT_MAX, 4, 5, 1.0f, a, 0, 5, b, 0, 4, 0.0f, c, 0, 4),
                     IHA_ERROR_UNSUPPORTED);
    tu_assert_status(tu_ctx, iha__gemm_kernel_enqueue(tu_ctx, &good, 6, 4, (size_t)INT_MAX + 1, 1.0f, a, 0, 5, b, 0, 4, 0.0f, c, 0, 4),
                     IHA_ERROR_UNSUPPORTED);
    /* Nothing to do. */
    tu_assert_status(tu_ctx, iha__gemm_kernel_enqueue(tu_ctx, &good, 0, 4, 5, 1.0f, a, 0, 5, b, 0, 4, 0.0f, c, 0, 4), IHA_OK);
    tu_buffer_release(a), tu_buffer_release(b), tu_buffer_release(c);
}

/* A CPU context without a profile multiplies with the library's kernel: a forward pass and a
 * decoding step are right and never call into CLBlast (src/gemm sets clblast_user at a
 * context's first CLBlast call). GPUs keep CLBlast. */
static void test_cpu_builtin_avoids_clblast(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_context_options co;
    iha_context_options_init(&co);
    co.profile = "off";
    iha_context *ctx;
    assert_int_equal(tu_context_open(&ctx, &co), 0);
    assert_int_equal(ctx->gemm->config.own, !ctx->info.is_gpu);
    const iha_shape shape = {1, 9, 24, 2, 8, 2};
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &shape, 91, &o);
    tu_layer_check_forward(ctx, &l, &o, TU_API_DEVICE_OFFSETS, zref, TU_TOL_F32);

    tu_device_layer dev;
    tu_device_layer_upload(ctx, &l, 0, &dev);
    tu_check_decode_tokens(ctx, &l, &dev, &o, zref, 3);
    if (!ctx->info.is_gpu) assert_int_equal(ctx->gemm->clblast_user, 0);
    tu_device_layer_release(&dev);
    free(zref);
    tu_layer_free(&l);
    iha_context_free(ctx);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ragged_shapes_backend), cmocka_unit_test(test_tiles_of_every_value),
        cmocka_unit_test(test_exact_buffers),         cmocka_unit_test(test_accumulate),
        cmocka_unit_test(test_empty_k_writes_zeros),  cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_cpu_builtin_avoids_clblast), cmocka_unit_test(full_every_tile),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
