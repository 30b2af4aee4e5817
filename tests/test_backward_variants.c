/*
 * test_backward_variants.c - every configuration of the attention backward's GPU passes
 * (cl/attention_backward_local.cl's local tiles, each pass on its own, and the row kernels of
 * cl/attention_backward.cl) forced through iha__attention_backward_enqueue_config, whatever
 * the device's built-in, against the float64 reference for dq, dk and dv: ragged shapes under
 * every mask, windows, P = 1 and P > 1, d = 1 to 256, packed sequences, rows that saw no key,
 * and non-finite inputs. A CPU's built-in never takes the local tiles, so this is where they
 * run in GPU geometry on PoCL, under Oclgrind's race detection (.ci/oclgrind.sh) and rusticl
 * (.ci/rusticl.sh, whose loop probe they carry). A configuration that does not fit the device
 * is skipped with a message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_backward.h"
#include "reference.h"
#include "test_layer.h"
#include "test_util.h"

enum { CAUSAL = IHA_MASK_CAUSAL, TOKEN = IHA_MASK_TOKEN_CAUSAL, NONE = IHA_MASK_NONE };
#define MAX_SEQS 6

typedef struct bwd_case {
    size_t B, N, H, d, P;
    int mask;
    long long window;
    int dead;              /* virtual row 1 of each (b, h) gets LSE = -inf: it saw no key */
    size_t lens[MAX_SEQS]; /* packed sequences' lengths in tokens, 0 ends the list; none: one per row */
} bwd_case;

typedef struct bwd_variant {
    const char *name;
    iha_backward_config cfg;
} bwd_variant;

/* Tiles from the smallest (one work-item across queries: every column its own) to the GPU
 * built-ins' shapes, 64-row groups past a 64-row T, and each pass alone beside the other's row
 * kernel. */
static const bwd_variant kVariants[] = {
    {"rows", {0, 0, 0, 0, 0}},
    {"local dkv 8x4, dq 4x8", {8, 4, 4, 8, 0}},
    {"local dkv 16x16, dq 16x16", {16, 16, 16, 16, 0}},
    {"local dkv 32x32, dq 32x32", {32, 32, 32, 32, 0}},
    {"local dkv 64x32, dq 64x32", {64, 32, 64, 32, 0}},
    {"local dkv 32x64, dq 32x64", {32, 64, 32, 64, 0}},
    {"local dkv 16x32, rows dq", {16, 32, 0, 0, 0}},
    {"rows dkv, local dq 16x32", {0, 0, 16, 32, 0}},
};
#define VARIANT_COUNT (sizeof kVariants / sizeof kVariants[0])

static int variant_fits(const bwd_variant *v, size_t d)
{
    return (v->cfg.kv_keys == 0 || iha__backward_kv_fits(tu_ctx, d, v->cfg.kv_keys, v->cfg.kv_queries)) &&
           (v->cfg.q_rows == 0 || iha__backward_q_fits(tu_ctx, d, v->cfg.q_rows, v->cfg.q_keys));
}

static size_t seq_count_of(const bwd_case *c)
{
    size_t n = 0;
    while (n < MAX_SEQS && c->lens[n]) ++n;
    return n;
}

/* Each token's (first, end) within its batch row, as the kernels take them. */
static cl_mem bounds_buffer(const bwd_case *c)
{
    const size_t tokens = c->B * c->N;
    cl_int *host = tu_malloc(2 * tokens * sizeof *host);
    for (size_t i = 0, start = 0; i < seq_count_of(c); start += c->lens[i++])
        for (size_t n = start; n < start + c->lens[i]; ++n)
            host[2 * n] = (cl_int)(start % c->N), host[2 * n + 1] = (cl_int)(start % c->N + c->lens[i]);
    cl_int err;
    cl_mem m = clCreateBuffer(iha_context_cl_context(tu_ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                              2 * tokens * sizeof *host, host, &err);
    assert_int_equal(err, CL_SUCCESS);
    free(host);
    return m;
}

/* Fails unless got and ref are non-finite at the same elements and close at the others. */
static void assert_same_pattern(const char *what, const float *got, const double *ref, size_t n, double tol)
{
    size_t mismatches = 0, first = 0;
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        const int fg = isfinite(got[i]) != 0, fr = isfinite(ref[i]) != 0;
        if (fg != fr) {
            if (mismatches++ == 0) first = i;
            continue;
        }
        if (fg) {
            err += (got[i] - ref[i]) * (got[i] - ref[i]);
            norm += ref[i] * ref[i];
        }
    }
    if (mismatches)
        fail_msg("%s: %zu of %zu elements differ in finiteness from the reference; first at %zu: %g, reference %g",
                 what, mismatches, n, first, (double)got[first], ref[first]);
    if (norm > 0.0 && sqrt(err / norm) > tol)
        fail_msg("%s: the finite elements are off by %g (relative L2) from the reference", what, sqrt(err / norm));
}

/* One case's inputs (q, k, v, dout), with o and lse from the float64 forward and the reference
 * gradients; `plant` >= 0 puts `value` at element 11 * d + 5 % d of input `plant`. */
typedef struct bwd_problem {
    iha_dims dims;
    size_t n, rows;
    float scale;
    float *in[4], *o, *lse;
    double *ref[3];
} bwd_problem;

static void problem_make(const bwd_case *c, uint64_t seed, int plant, float value, bwd_problem *pr)
{
    const iha_shape s = {c->B, c->N, 0, c->H, c->d, c->P};
    iha_attention_options o = tu_options(c->mask, c->window, 0);
    o.seq_lens = seq_count_of(c) ? c->lens : NULL;
    o.seq_count = seq_count_of(c);
    const size_t T = c->N * c->P, n = tu_count_virtual(&s), rows = n / c->d;
    pr->dims = (iha_dims){c->B, c->N, c->H, c->d, c->P, T, o.seq_count ? bounds_buffer(c) : NULL};
    pr->n = n, pr->rows = rows;
    pr->scale = 1.0f / sqrtf((float)c->d);
    tu_rng rng = tu_rng_seeded(seed);
    for (int i = 0; i < 4; i++) pr->in[i] = tu_random_array(&rng, n, i < 2 ? 1.5f : 1.0f);
    if (plant >= 0) pr->in[plant][11 * c->d + 5 % c->d] = value;
    const ref_problem p = tu_problem(&s, &o);
    double *od = tu_malloc(n * sizeof *od), *ld = tu_malloc(rows * sizeof *ld);
    assert_int_equal(ref_attention(&p, pr->in[0], pr->in[1], pr->in[2], od, ld), 0);
    pr->o = tu_malloc(n * sizeof *pr->o), pr->lse = tu_malloc(rows * sizeof *pr->lse);
    for (size_t i = 0; i < n; i++) pr->o[i] = (float)od[i];
    for (size_t i = 0; i < rows; i++) pr->lse[i] = (float)ld[i];
    /* A dead row: LSE = -inf and o = 0 (doc/spec.md's row that sees no key) contributes no
     * gradient, the reference's answer with its dout set to 0. */
    float *gref = tu_malloc(n * sizeof *gref);
    memcpy(gref, pr->in[3], n * sizeof *gref);
    for (size_t bh = 0; c->dead && bh < c->B * c->H; bh++) {
        pr->lse[bh * T + 1] = -INFINITY;
        for (size_t x = 0; x < c->d; x++) pr->o[(bh * T + 1) * c->d + x] = 0.0f, gref[(bh * T + 1) * c->d + x] = 0.0f;
    }
    for (int i = 0; i < 3; i++) pr->ref[i] = tu_malloc(n * sizeof(double));
    assert_int_equal(ref_attention_backward(&p, pr->in[0], pr->in[1], pr->in[2], gref, pr->ref[0], pr->ref[1], pr->ref[2]),
                     0);
    free(od), free(ld), free(gref);
}

static void problem_free(bwd_problem *pr)
{
    for (int i = 0; i < 4; i++) free(pr->in[i]);
    for (int i = 0; i < 3; i++) free(pr->ref[i]);
    free(pr->o), free(pr->lse);
    if (pr->dims.seq_bounds) tu_buffer_release(pr->dims.seq_bounds);
}

/* The backward of pr in variant v; outputs inside guards that must come back untouched. With
 * `pattern`, the outputs' non-finite elements must be the reference's (the finite ones close). */
static void run_variant(const bwd_problem *pr, const bwd_case *c, const bwd_variant *v, int pattern, const char *label)
{
    const size_t n = pr->n;
    cl_mem b[6], out[3], delta = tu_buffer_new(tu_ctx, pr->rows);
    for (int i = 0; i < 3; i++) b[i] = tu_buffer_guarded(tu_ctx, pr->in[i], n, 0, 0, 0);
    b[3] = tu_buffer_guarded(tu_ctx, pr->o, n, 0, 0, 0);
    b[4] = tu_buffer_guarded(tu_ctx, pr->lse, pr->rows, 0, 0, 0);
    b[5] = tu_buffer_guarded(tu_ctx, pr->in[3], n, 0, 0, 0);
    for (int i = 0; i < 3; i++) out[i] = tu_buffer_guarded(tu_ctx, NULL, n, 3, TU_GUARD, TU_SENTINEL);
    const iha_backward_refs r = {{b[0], 0},   {b[1], 0},   {b[2], 0},   {b[3], 0}, {b[4], 0}, {b[5], 0},
                                 {out[0], 3}, {out[1], 3}, {out[2], 3}, delta,     {NULL, NULL}, NULL};
    tu_assert_status(tu_ctx,
                     iha__attention_backward_enqueue_config(tu_ctx, &pr->dims, &r, &v->cfg, c->mask, (size_t)c->window,
                                                            pr->scale),
                     IHA_OK);
    static const char *const names[3] = {"dqt", "dkt", "dvt"};
    float *got = tu_malloc(n * sizeof *got);
    for (int i = 0; i < 3; i++) {
        char what[320];
        snprintf(what, sizeof what, "%s, %s (B=%zu N=%zu H=%zu d=%zu P=%zu mask %d window %lld%s%s): %s", label,
                 v->name, c->B, c->N, c->H, c->d, c->P, c->mask, c->window, seq_count_of(c) ? ", packed" : "",
                 c->dead ? ", a dead row" : "", names[i]);
        tu_buffer_read(tu_ctx, out[i], 3, got, n);
        if (pattern)
            assert_same_pattern(what, got, pr->ref[i], n, 1e-4);
        else
            tu_assert_close(what, got, pr->ref[i], n, TU_TOL_F32);
        tu_assert_guard(tu_ctx, out[i], n, 3, TU_GUARD, TU_SENTINEL);
    }
    free(got);
    for (int i = 0; i < 6; i++) tu_buffer_release(b[i]);
    for (int i = 0; i < 3; i++) tu_buffer_release(out[i]);
    tu_buffer_release(delta);
}

/* Each case in the variants `picks` names (indices into kVariants), or in all of them when
 * picks is NULL. */
static void run_cases_in(const bwd_case *cases, size_t count, uint64_t seed, const size_t *picks, size_t pick_count)
{
    for (size_t i = 0; i < count; i++) {
        bwd_problem pr;
        problem_make(&cases[i], seed + i, -1, 0.0f, &pr);
        for (size_t j = 0; j < (picks ? pick_count : VARIANT_COUNT); j++) {
            const bwd_variant *v = &kVariants[picks ? picks[j] : j];
            if (!variant_fits(v, cases[i].d)) {
                print_message("%s does not fit d=%zu on this device: skipped\n", v->name, cases[i].d);
                continue;
            }
            run_variant(&pr, &cases[i], v, 0, "backward");
        }
        problem_free(&pr);
    }
}

static void run_cases(const bwd_case *cases, size_t count, uint64_t seed)
{
    run_cases_in(cases, count, seed, NULL, 0);
}

/* T = N*P against the tiles (4 to 64 rows and keys) and the 4 x 4 sub-tiles, windows that skip
 * tiles; d = 1, odd, and between column sets. */
static const bwd_case kSmallCases[] = {
    /* B   N  H   d  P  mask    window */
    {1,  7, 2,  9, 3, CAUSAL, 2, 0, {0}},
    {2,  5, 2,  1, 1, TOKEN,  0, 0, {0}},
    {1,  6, 1,  5, 2, NONE,   2, 0, {0}},
    {1, 11, 1, 12, 1, CAUSAL, 0, 0, {0}},
};
#define SMALL_COUNT (sizeof kSmallCases / sizeof kSmallCases[0])

/* Each d is a program per variant: each case runs half the variants, so that every variant
 * meets two of the widths and two of the masks (packed_sequences and dead_rows run all of them
 * at d = 8 and 16); the full tier runs every variant on every case. */
static void small_shapes(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const size_t picks[SMALL_COUNT][4] = {{1, 2, 4, 7}, {0, 3, 5, 6}, {1, 3, 4, 6}, {0, 2, 5, 7}};
    for (size_t i = 0; i < SMALL_COUNT; i++) run_cases_in(&kSmallCases[i], 1, 7100 + i, picks[i], 4);
}

static void full_small_shapes_every_tile(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    run_cases(kSmallCases, SMALL_COUNT, 7100);
}

/* Widths of the GPU layers and beyond: several 64-row groups, a window that skips query tiles,
 * d past 128 with padded column sets (only the widest tiles fit their 16 columns per work-item). */
static const bwd_case kWideCases[] = {
    /* B   N  H    d  P  mask    window */
    {1, 23, 1,  64, 3, CAUSAL, 0, 0, {0}}, /* T = 69 */
    {1, 40, 1,  64, 2, CAUSAL, 5, 0, {0}}, /* T = 80, 10-row windows */
    {1, 11, 1, 100, 4, TOKEN,  0, 0, {0}},
    {1,  6, 1, 130, 1, NONE,   2, 0, {0}},
    {1, 20, 1, 256, 1, NONE,   0, 0, {0}},
    {2,  9, 2,  32, 3, TOKEN,  2, 0, {0}},
};
#define WIDE_COUNT (sizeof kWideCases / sizeof kWideCases[0])

/* The wide shapes in the variants whose code paths differ there: the row kernels, the smallest
 * tiles (one work-item across queries), the 64-row groups, the 32 x 64 tiles (the only ones
 * whose dK/dV pass fits d > 128: the column sets past 128), and each pass alone beside the
 * other's row kernel: all of them at d = 64 (both of its cases share the programs), the 32 x 64
 * tiles and half of the others at each other width. Each d is a program per variant, so the
 * other tile sizes and pairings, which take the same paths, are the full tier's
 * (full_wide_shapes_every_tile). */
static void wide_shapes(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const size_t picks[WIDE_COUNT][6] = {
        {0, 1, 4, 5, 6, 7}, {0, 1, 4, 5, 6, 7}, {0, 1, 5, 7}, {4, 5, 6}, {0, 5}, {1, 4, 6, 7},
    };
    static const size_t pick_counts[WIDE_COUNT] = {6, 6, 4, 3, 2, 4};
    for (size_t i = 0; i < WIDE_COUNT; i++) run_cases_in(&kWideCases[i], 1, 7200 + i, picks[i], pick_counts[i]);
}

static void full_wide_shapes_every_tile(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    run_cases(kWideCases, WIDE_COUNT, 7200);
}

/* Packed sequences that start and end inside tiles, of length 1, batch rows of several beside
 * rows of one; T = 120 with 32-row tiles: tiles wholly in other sequences are skipped. */
static void packed_sequences(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const bwd_case cases[] = {
        /* B   N  H   d  P  mask    window dead lengths */
        {1, 13, 2,  8, 2, CAUSAL, 0, 0, {5, 1, 7}},
        {2,  9, 2,  8, 3, TOKEN,  2, 0, {4, 5, 1, 8}},
        {2, 10, 1, 16, 2, NONE,   3, 0, {10, 3, 3, 1, 3}},
        {1, 40, 1, 16, 3, NONE,   0, 0, {17, 23}},
    };
    run_cases(cases, sizeof cases / sizeof cases[0], 7300);
}

/* Rows that saw no key (LSE = -inf): no gradient from them, whatever their dO. */
static void dead_rows(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const bwd_case cases[] = {
        {1, 9, 2, 16, 2, CAUSAL, 0, 1, {0}},
        {1, 7, 1, 5, 3, NONE, 2, 1, {0}},
    };
    run_cases(cases, sizeof cases / sizeof cases[0], 7400);
}

/* doc/numerics.md's rule: one element of one input NaN or +inf under every mask, global and
 * windowed; the gradients are non-finite exactly where the reference's are (masked keys'
 * values never reach a pair). */
static void nonfinite_inputs(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const float values[] = {NAN, INFINITY, -INFINITY};
    static const int masks[] = {CAUSAL, TOKEN, NONE};
    static const long long windows[] = {0, 3};
    static const bwd_variant variants[] = {
        {"local dkv 16x16, dq 16x16", {16, 16, 16, 16, 0}},
        {"local dkv 8x4, dq 4x8", {8, 4, 4, 8, 0}},
    };
    for (int which = 0; which < 4; which++)
        for (int v = 0; v < 3; v++)
            for (int m = 0; m < 3; m++)
                for (int w = 0; w < 2; w++) {
                    const bwd_case c = {1, 12, 1, 8, 2, masks[m], windows[w], 0, {0}};
                    bwd_problem pr;
                    problem_make(&c, 7500, which, values[v], &pr);
                    char label[64];
                    snprintf(label, sizeof label, "%s in input %d", isnan(values[v]) ? "NaN" : "inf", which);
                    for (size_t j = 0; j < sizeof variants / sizeof variants[0]; j++)
                        if (variant_fits(&variants[j], c.d)) run_variant(&pr, &c, &variants[j], 1, label);
                    problem_free(&pr);
                }
}

/* The cases CI runs under Oclgrind's race detection and on rusticl, whose programs and runs are
 * slow: a window and P > 1 with a ragged T, packed sequences with a dead row, in the smallest
 * tiles, the square 16 x 16 and the 32 x 32 of the GPU built-ins. */
static void small_packed_and_dead(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const bwd_case cases[] = {
        {1, 7, 2, 9, 3, CAUSAL, 2, 0, {0}},
        {1, 13, 1, 8, 2, TOKEN, 0, 1, {5, 1, 7}},
    };
    static const size_t picks[] = {1, 2, 3};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bwd_problem pr;
        problem_make(&cases[i], 7700 + i, -1, 0.0f, &pr);
        for (size_t j = 0; j < sizeof picks / sizeof picks[0]; j++)
            if (variant_fits(&kVariants[picks[j]], cases[i].d))
                run_variant(&pr, &cases[i], &kVariants[picks[j]], 0, "backward");
            else
                print_message("%s does not fit d=%zu on this device: skipped\n", kVariants[picks[j]].name, cases[i].d);
        problem_free(&pr);
    }
}

/* A tile that does not fit is refused with a message, nothing written. */
static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const iha_backward_config bad[] = {{6, 32, 0, 0, 0}, {0, 0, 32, 2, 0}, {32, 4, 0, 0, 0}};
    const bwd_case c = {1, 4, 1, 256, 1, CAUSAL, 0, 0, {0}};
    bwd_problem pr;
    problem_make(&c, 7600, -1, 0.0f, &pr);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const size_t n = pr.n;
        cl_mem b = tu_buffer_guarded(tu_ctx, pr.in[0], n, 0, 0, 0), delta = tu_buffer_new(tu_ctx, pr.rows);
        cl_mem lse = tu_buffer_guarded(tu_ctx, pr.lse, pr.rows, 0, 0, 0);
        cl_mem out = tu_buffer_guarded(tu_ctx, NULL, n, 0, TU_GUARD, TU_SENTINEL);
        const iha_backward_refs r = {{b, 0},   {b, 0},   {b, 0},   {b, 0}, {lse, 0}, {b, 0},
                                     {out, 0}, {out, 0}, {out, 0}, delta,  {NULL, NULL}, NULL};
        assert_int_equal(iha__attention_backward_enqueue_config(tu_ctx, &pr.dims, &r, &bad[i], c.mask, 0, pr.scale),
                         IHA_ERROR_UNSUPPORTED);
        assert_non_null(strstr(iha_context_message(tu_ctx), "does not fit"));
        tu_buffer_release(b), tu_buffer_release(delta), tu_buffer_release(lse), tu_buffer_release(out);
    }
    problem_free(&pr);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(small_shapes),     cmocka_unit_test(wide_shapes),      cmocka_unit_test(packed_sequences),
        cmocka_unit_test(dead_rows),        cmocka_unit_test(nonfinite_inputs), cmocka_unit_test(refusals),
        cmocka_unit_test(small_packed_and_dead), cmocka_unit_test(full_wide_shapes_every_tile),
        cmocka_unit_test(full_small_shapes_every_tile),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
