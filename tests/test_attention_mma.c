/*
 * test_attention_mma.c - the tensor-core attention (cl/attention_mma_nv.cl) through its emulated
 * path (IHA_MMA_EMULATE=1, set before the context opens), so that any OpenCL device runs the
 * kernel's fragment indexing, tiling and 16-bit rounding: every configuration of its space
 * (warps 1, 2, 4, 8 x key tiles 16, 32, 64 x half and bfloat16 inputs) on ragged shapes against
 * the float64 reference, launched through the kernel module; doc/spec.md's non-finite rule
 * (an infinite value, or one past half's range, reaches only the rows that see its key); then
 * the tuning space's rule, through iha_attention with a forced profile: 16-bit storage runs it,
 * float storage never; and a hardware build the driver refuses falls back without an error.
 *
 * Tolerances: the kernel rounds float inputs to 16 bits (relative 2^-11 for half, 2^-8 for
 * bfloat16, per element) and accumulates in float, which is what doc/spec.md's 16-bit storage
 * contract allows for: 2e-3 with half inputs and 1e-2 with bfloat16. A fragment or tile
 * mistake moves whole rows and shows as errors of order 1.
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

#include "attention_configs.h"
#include "iha_tune.h"
#include "kernels/attention.h"
#include "kernels/mix.h"
#include "reference.h"
#include "runtime/context.h"
#include "test_layer.h"
#include "test_util.h"
#include "tune/tunable.h"

#define HALF_TOL 2e-3
#define BF16_TOL 1e-2
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

typedef struct shape_case {
    size_t B, N, H, P;
    int mask;
    long long window;
} shape_case;

/* T against the row tiles (16 to 128 rows) and key tiles (16 to 64 keys): 69 and 22 leave
 * ragged ends everywhere; every mask, windows, B*H of 1 and 4. */
static const shape_case kShapes[] = {
    /* B   N  H  P  mask                   window */
    {1, 23, 1, 3, IHA_MASK_CAUSAL, 0},
    {2, 11, 2, 2, IHA_MASK_TOKEN_CAUSAL, 3},
    {1, 13, 2, 3, IHA_MASK_NONE, 2},
};

/* Head widths: whole k steps (64, 128) and a padded one (40). A configuration and d make a
 * program, which PoCL compiles for seconds: the regular tier runs every (warps, key tile) pair
 * once, in the 16-bit type of its parity, on every shape at one d (rotating, so that each d
 * meets every warp count, key tile and type); the full tier (cases named full_*) runs those
 * configurations at the other two widths and the other type's at all three. */
static const size_t kWidths[] = {64, 128, 40};

typedef struct mma_case {
    const char *name;
    int warps, keys, bf16;
    int full; /* 0: the width of the rotation; 1: the other two */
} mma_case;

#define CASES(prefix, full)                                                                                            \
    {prefix "W=1 KT=16 f16", 1, 16, 0, full}, {prefix "W=1 KT=32 f16", 1, 32, 0, full},                                \
        {prefix "W=1 KT=64 f16", 1, 64, 0, full}, {prefix "W=2 KT=16 f16", 2, 16, 0, full},                            \
        {prefix "W=2 KT=32 f16", 2, 32, 0, full}, {prefix "W=2 KT=64 f16", 2, 64, 0, full},                            \
        {prefix "W=4 KT=16 f16", 4, 16, 0, full}, {prefix "W=4 KT=32 f16", 4, 32, 0, full},                            \
        {prefix "W=4 KT=64 f16", 4, 64, 0, full}, {prefix "W=8 KT=16 f16", 8, 16, 0, full},                            \
        {prefix "W=8 KT=32 f16", 8, 32, 0, full}, {prefix "W=8 KT=64 f16", 8, 64, 0, full},                            \
        {prefix "W=1 KT=16 bf16", 1, 16, 1, full}, {prefix "W=1 KT=32 bf16", 1, 32, 1, full},                          \
        {prefix "W=1 KT=64 bf16", 1, 64, 1, full}, {prefix "W=2 KT=16 bf16", 2, 16, 1, full},                          \
        {prefix "W=2 KT=32 bf16", 2, 32, 1, full}, {prefix "W=2 KT=64 bf16", 2, 64, 1, full},                          \
        {prefix "W=4 KT=16 bf16", 4, 16, 1, full}, {prefix "W=4 KT=32 bf16", 4, 32, 1, full},                          \
        {prefix "W=4 KT=64 bf16", 4, 64, 1, full}, {prefix "W=8 KT=16 bf16", 8, 16, 1, full},                          \
        {prefix "W=8 KT=32 bf16", 8, 32, 1, full},                                                                     \
    {                                                                                                                  \
        prefix "W=8 KT=64 bf16", 8, 64, 1, full                                                                        \
    }

static const mma_case kCases[] = {CASES("", 0), CASES("full_", 1)};

/* log2 of the warps plus log2 of the key tile in 16s. */
static int steps(const mma_case *mc)
{
    int w = 0, k = 0;
    while ((1 << w) < mc->warps) ++w;
    while ((16 << k) < mc->keys) ++k;
    return w + k;
}

/* Whether the regular tier runs the configuration: the type of its (warps, key tile) parity. */
static int regular(const mma_case *mc) { return steps(mc) % 2 == mc->bf16; }

/* The rotation's width for a configuration, so that each width meets every warp count, key tile
 * and type. */
static size_t rotation(const mma_case *mc) { return (size_t)(steps(mc) + mc->bf16) % COUNT(kWidths); }

/* A configuration of the local variants (the tensor cores' among them): the register tiles'
 * parameters at the values the tuning space fixes for them. */
static iha_attention_config local_config(iha_attention_variant variant, int rows, int keys, int key_block)
{
    iha_attention_config c = {1, 1, key_block, 4, (size_t)rows, variant, keys, 0, 4, 4};
    return c;
}

static void problem_of(const shape_case *c, size_t d, iha_shape *s, iha_attention_options *o)
{
    *s = (iha_shape){c->B, c->N, 0, c->H, d, c->P};
    iha_attention_options_init(o);
    o->mask = c->mask;
    o->window = c->window;
}

/* One shape at head width d through iha__attention_enqueue in the case's configuration, o and
 * lse against float64. */
static void run_kernel(iha_context *ctx, const mma_case *mc, const shape_case *c, size_t d, int key_block,
                       uint64_t seed)
{
    iha_shape s;
    iha_attention_options o;
    problem_of(c, d, &s, &o);
    const iha_dims dims = {c->B, c->N, c->H, d, c->P, c->N * c->P, NULL};
    tu_rng rng = tu_rng_seeded(seed);
    const size_t n = tu_count_virtual(&s), nl = c->B * c->H * dims.T;
    float *qt = tu_random_array(&rng, n, 1.5f), *kt = tu_random_array(&rng, n, 1.5f);
    float *vt = tu_random_array(&rng, n, 1.0f);
    const ref_problem p = tu_problem(&s, &o);
    double *oref = tu_malloc(n * sizeof *oref), *lref = tu_malloc(nl * sizeof *lref);
    assert_int_equal(ref_attention(&p, qt, kt, vt, oref, lref), 0);

    cl_mem q = tu_buffer_new(ctx, n), k = tu_buffer_new(ctx, n), v = tu_buffer_new(ctx, n);
    cl_mem packed = tu_buffer_new(ctx, iha__packed_keys_elements(&dims, key_block));
    cl_mem out = tu_buffer_new(ctx, n), lse = tu_buffer_new(ctx, nl);
    tu_buffer_write(ctx, q, 0, qt, n);
    tu_buffer_write(ctx, k, 0, kt, n);
    tu_buffer_write(ctx, v, 0, vt, n);
    float *got = tu_malloc(n * sizeof *got), *got_lse = tu_malloc(nl * sizeof *got_lse);
    tu_fill_nan(got, n);
    tu_buffer_write(ctx, out, 0, got, n);
    tu_buffer_write(ctx, lse, 0, got, nl);
    const iha_attention_config cfg =
        local_config(mc->bf16 ? IHA_ATTENTION_MMA_BF16 : IHA_ATTENTION_MMA_F16, 16 * mc->warps, mc->keys, key_block);
    tu_assert_status(ctx, iha__pack_keys_enqueue(ctx, &dims, (iha_buffer){k, 0}, (iha_buffer){packed, 0}, key_block),
                     IHA_OK);
    const size_t window = c->window > 0 && (size_t)c->window < c->N ? (size_t)c->window : 0;
    tu_assert_status(ctx,
                     iha__attention_enqueue(ctx, &cfg, &dims, (iha_buffer){q, 0}, (iha_buffer){packed, 0},
                                            (iha_buffer){v, 0}, (iha_buffer){out, 0}, (iha_buffer){lse, 0}, c->mask,
                                            window, (float)(1.0 / sqrt((double)d))),
                     IHA_OK);
    tu_buffer_read(ctx, out, 0, got, n);
    tu_buffer_read(ctx, lse, 0, got_lse, nl);
    const double tol = mc->bf16 ? BF16_TOL : HALF_TOL;
    print_message("%s d=%zu T=%zu KB=%d: o %.2e, lse %.2e\n", mc->name, d, dims.T, key_block, tu_rel_l2(got, oref, n),
                  tu_rel_l2(got_lse, lref, nl));
    tu_assert_close("o", got, oref, n, tol);
    tu_assert_close("lse", got_lse, lref, nl, tol);
    cl_mem m[6] = {q, k, v, packed, out, lse};
    for (int i = 0; i < 6; i++) tu_buffer_release(m[i]);
    free(got), free(got_lse), free(oref), free(lref), free(qt), free(kt), free(vt);
}

/* Key blocks of 16, and of 8 for the widths of odd index. */
static void configuration_test(void **state)
{
    const mma_case *mc = *state;
    TU_REQUIRE_DEVICE(tu_ctx);
    assert_int_equal(tu_ctx->mma, IHA_MMA_EMULATED);
    for (size_t w = 0; w < COUNT(kWidths); w++) {
        if ((regular(mc) && w == rotation(mc)) == mc->full) continue;
        const size_t d = kWidths[w];
        const int key_block = w % 2 ? 8 : 16;
        if (!iha__attention_mma_fits(tu_ctx, d, 16 * mc->warps, mc->keys, key_block)) {
            print_message("%s d=%zu does not fit this device: skipped\n", mc->name, d);
            continue;
        }
        for (size_t i = 0; i < COUNT(kShapes); i++)
            run_kernel(tu_ctx, mc, &kShapes[i], d, key_block, 5300 + 17 * i + w);
    }
}

/* doc/spec.md's non-finite rule through the tensor cores: an infinite value (and, in half, a
 * finite one past half's range) makes NaN exactly the column of the rows that see its key, not
 * the rows for which the same tile masks it; a NaN query makes its own row NaN only. */
static void nonfinite_test(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    enum { N = 40, D = 24, KEY = 21, COL = 5, ROW = 9 };
    const iha_dims dims = {1, N, 1, D, 1, N, NULL};
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int big = 0; big < 2 - bf16; big++) {
            tu_rng rng = tu_rng_seeded(91 + (uint64_t)bf16);
            const size_t n = (size_t)N * D;
            float *qt = tu_random_array(&rng, n, 1.0f), *kt = tu_random_array(&rng, n, 1.0f);
            float *vt = tu_random_array(&rng, n, 1.0f);
            vt[KEY * D + COL] = big ? 1e5f : INFINITY;
            qt[ROW * D + 3] = NAN;
            cl_mem q = tu_buffer_new(tu_ctx, n), k = tu_buffer_new(tu_ctx, n), v = tu_buffer_new(tu_ctx, n);
            cl_mem packed = tu_buffer_new(tu_ctx, iha__packed_keys_elements(&dims, 16)), out = tu_buffer_new(tu_ctx, n);
            tu_buffer_write(tu_ctx, q, 0, qt, n);
            tu_buffer_write(tu_ctx, k, 0, kt, n);
            tu_buffer_write(tu_ctx, v, 0, vt, n);
            const iha_attention_config cfg =
                local_config(bf16 ? IHA_ATTENTION_MMA_BF16 : IHA_ATTENTION_MMA_F16, 32, 32, 16);
            tu_assert_status(
                tu_ctx, iha__pack_keys_enqueue(tu_ctx, &dims, (iha_buffer){k, 0}, (iha_buffer){packed, 0}, 16), IHA_OK);
            tu_assert_status(tu_ctx,
                             iha__attention_enqueue(tu_ctx, &cfg, &dims, (iha_buffer){q, 0}, (iha_buffer){packed, 0},
                                                    (iha_buffer){v, 0}, (iha_buffer){out, 0}, (iha_buffer){NULL, 0},
                                                    IHA_MASK_CAUSAL, 0, 0.2f),
                             IHA_OK);
            float *got = tu_malloc(n * sizeof *got);
            tu_buffer_read(tu_ctx, out, 0, got, n);
            for (int t = 0; t < N; t++)
                for (int c = 0; c < D; c++) {
                    const int nonfinite = t == ROW || (t >= KEY && c == COL);
                    if (nonfinite == !isfinite(got[t * D + c])) continue;
                    fail_msg("%s%s: o[%d][%d] = %g, expected %s", bf16 ? "bf16" : "f16", big ? " (1e5)" : "", t, c,
                             (double)got[t * D + c], nonfinite ? "non-finite" : "finite");
                }
            cl_mem m[5] = {q, k, v, packed, out};
            for (int i = 0; i < 5; i++) tu_buffer_release(m[i]);
            free(got), free(qt), free(kt), free(vt);
        }
}

/* Widths the rotation leaves out: d = 1 and an odd 13 (one k step, mostly padding) and 160,
 * the widest the register budget allows (with 16-key tiles), in one configuration. */
static void odd_widths_test(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const size_t widths[] = {1, 13, 160};
    const mma_case mc = {"W=2 KT=16 f16", 2, 16, 0, 0};
    for (size_t w = 0; w < COUNT(widths); w++) {
        assert_true(iha__attention_mma_live_words(widths[w], 16) <= IHA_ATTENTION_MMA_REGISTER_WORDS);
        run_kernel(tu_ctx, &mc, &kShapes[w], widths[w], 8, 6100 + w);
    }
}

/* What a tuning run's progress reports showed of the tensor cores. */
typedef struct tune_seen {
    int tried, passed;
} tune_seen;

static void on_progress(const iha_tune_progress *p, void *user)
{
    tune_seen *seen = user;
    if (strcmp(p->kernel, "attention") != 0 || strstr(p->candidate_config, "variant=3") == NULL) return;
    seen->tried++;
    seen->passed += p->candidate_s >= 0.0;
}

/* The tuner starts from the tensor cores on a 16-bit bucket and accepts them (verified within
 * its bound, then timed), and never tries them on a float bucket. */
static tune_seen tune_attention(int storage, double budget_s)
{
    iha_context_options co;
    iha_context_options_init(&co);
    co.profile = "off";
    iha_context *ctx = tu_context_create_or_fail(&co);
    const iha_shape s = {1, 64, 32, 2, 16, 1};
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.storage = storage;
    iha_tune_options to;
    iha_tune_options_init(&to);
    to.kernels = IHA_TUNE_ATTENTION;
    to.budget_s = budget_s;
    to.reps = 1;
    to.dry_run = 1;
    tune_seen seen = {0, 0};
    to.progress = on_progress;
    to.user = &seen;
    iha_tune_result r;
    size_t count = 0;
    tu_assert_status(ctx, iha_tune(ctx, &s, &o, 1, &to, &r, 1, &count), IHA_OK);
    iha_context_free(ctx);
    return seen;
}

static void tuner_test(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const tune_seen half = tune_attention(IHA_STORAGE_F16, 8.0);
    print_message("half storage: %d tensor-core candidates, %d verified and timed\n", half.tried, half.passed);
    assert_true(half.passed > 0);
    const tune_seen single = tune_attention(IHA_STORAGE_F32, 2.0);
    assert_int_equal(single.tried, 0);
}

/* A driver that does not build the hardware path (here any non-NVIDIA one, told that it offers
 * it) costs the caller nothing: the call runs the built-in and succeeds, and the context stops
 * offering the tensor cores. */
static void build_failure_test(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_context *ctx = tu_context_create_or_fail(NULL);
    ctx->mma = IHA_MMA_HARDWARE;
    const mma_case mc = {"hardware path refused", 2, 32, 0, 0};
    run_kernel(ctx, &mc, &kShapes[0], 24, 16, 7);
    assert_int_equal(ctx->mma, IHA_MMA_NONE);
    iha_context_free(ctx);
}

/* The lookup takes a forced mma configuration for 16-bit storage, runs it (the last choice says
 * so) within the half-storage contract, and passes over it for float storage or where the
 * context offers no tensor cores; the tuner's bound for it is 1e-3. */
static void storage_rule_test(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_attention_config cfg = local_config(IHA_ATTENTION_MMA_F16, 32, 32, 16);
    char expected[512];
    iha_context *ctx = ac_context_forcing(&cfg, expected, sizeof expected);
    assert_int_equal(ctx->mma, IHA_MMA_EMULATED);
    const iha_shape s = {1, 21, 0, 2, 24, 2};
    iha_attention_options o;
    iha_attention_options_init(&o);

    const iha_tunable *t = &iha__tunable_attention;
    const iha_tune_config config = ac_tune_config(&cfg);
    iha_tune_limits limits;
    iha__tune_limits(ctx, &limits);
    iha_tune_bucket bucket;
    assert_true(t->bucket_of(ctx, &s, &o, &bucket));
    assert_false(iha__space_valid(t->space, &config, &bucket, &limits, NULL));
    o.storage = IHA_STORAGE_F16;
    assert_true(t->bucket_of(ctx, &s, &o, &bucket));
    assert_true(iha__space_valid(t->space, &config, &bucket, &limits, NULL));
    /* The verification bound: 1e-3 for the tensor cores on a 16-bit bucket, float32's for the rest. */
    assert_true(iha__tune_tolerance(t, &bucket, &config) == 1e-3);
    const iha_attention_config float_cfg = local_config(IHA_ATTENTION_LOCAL_TILES, 64, 32, 16);
    const iha_tune_config float_config = ac_tune_config(&float_cfg);
    assert_true(iha__tune_tolerance(t, &bucket, &float_config) == 1e-5);
    limits.mma = 0;
    assert_false(iha__space_valid(t->space, &config, &bucket, &limits, NULL));

    tu_rng rng = tu_rng_seeded(77);
    const size_t n = tu_count_virtual(&s), nl = s.batch * s.heads * s.tokens * s.pseudo;
    float *qt = tu_random_array(&rng, n, 1.5f), *kt = tu_random_array(&rng, n, 1.5f),
          *vt = tu_random_array(&rng, n, 1.0f);
    iha_buffer qb = {tu_tensor_guarded(ctx, IHA_STORAGE_F16, qt, n, 3, TU_GUARD, TU_SENTINEL), 3};
    iha_buffer kb = {tu_tensor_guarded(ctx, IHA_STORAGE_F16, kt, n, 1, TU_GUARD, TU_SENTINEL), 1};
    iha_buffer vb = {tu_tensor_guarded(ctx, IHA_STORAGE_F16, vt, n, 2, TU_GUARD, TU_SENTINEL), 2};
    iha_buffer ob = {tu_tensor_guarded(ctx, IHA_STORAGE_F16, NULL, n, 5, TU_GUARD, TU_SENTINEL), 5};
    iha_buffer lb = {tu_buffer_guarded(ctx, NULL, nl, 4, TU_GUARD, TU_SENTINEL), 4};
    /* The reference sees the inputs as the storage holds them. */
    float *rounded = tu_malloc(n * sizeof *rounded);
    float *inputs[3] = {qt, kt, vt};
    iha_buffer bufs[3] = {qb, kb, vb};
    for (int i = 0; i < 3; i++) {
        tu_tensor_read_checked(ctx, IHA_STORAGE_F16, bufs[i].mem, n, bufs[i].offset, TU_GUARD, TU_SENTINEL, rounded,
                               "input");
        memcpy(inputs[i], rounded, n * sizeof *rounded);
    }
    const ref_problem p = tu_problem(&s, &o);
    double *oref = tu_malloc(n * sizeof *oref), *lref = tu_malloc(nl * sizeof *lref);
    assert_int_equal(ref_attention(&p, qt, kt, vt, oref, lref), 0);
    tu_assert_status(ctx, iha_attention(ctx, &s, &o, qb, kb, vb, ob, lb), IHA_OK);
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    ac_assert_last_ran(ctx, expected);
    tu_tensor_read_checked(ctx, IHA_STORAGE_F16, ob.mem, n, ob.offset, TU_GUARD, TU_SENTINEL, rounded, "o");
    tu_assert_close("o", rounded, oref, n, HALF_TOL);
    tu_assert_buffer_close(ctx, "lse", lb, nl, lref, HALF_TOL);
    cl_mem m[5] = {qb.mem, kb.mem, vb.mem, ob.mem, lb.mem};
    for (int i = 0; i < 5; i++) tu_buffer_release(m[i]);
    free(rounded), free(oref), free(lref), free(qt), free(kt), free(vt);
    iha_context_free(ctx);
}

int main(int argc, char **argv)
{
    /* Before any context opens: every context of this process offers the emulated path. */
    setenv("IHA_MMA_EMULATE", "1", 1);
    struct CMUnitTest tests[COUNT(kCases) + 5];
    size_t n = 0;
    for (size_t i = 0; i < COUNT(kCases); i++) {
        if (!kCases[i].full && !regular(&kCases[i])) continue; /* the full tier's alone */
        struct CMUnitTest t = {kCases[i].name, configuration_test, NULL, NULL, (void *)&kCases[i]};
        tests[n++] = t;
    }
    struct CMUnitTest rule = {"storage rule", storage_rule_test, NULL, NULL, NULL};
    tests[n++] = rule;
    struct CMUnitTest nonfinite = {"non-finite values", nonfinite_test, NULL, NULL, NULL};
    tests[n++] = nonfinite;
    struct CMUnitTest refused = {"build failure falls back", build_failure_test, NULL, NULL, NULL};
    tests[n++] = refused;
    struct CMUnitTest odd = {"odd widths", odd_widths_test, NULL, NULL, NULL};
    tests[n++] = odd;
    struct CMUnitTest tuner = {"tuner", tuner_test, NULL, NULL, NULL};
    tests[n++] = tuner;
    return tu_main(argc, argv, tests, n, tu_group_setup, tu_group_teardown);
}
