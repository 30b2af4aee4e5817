/*
 * test_small_shapes.c - every kernel of the library on small shapes, checked against the float64
 * reference: ragged tails (T not a multiple of the key block or of a work-item's rows, d not a
 * multiple of the vector width), every mask, windows, P = 1 and P > 1, odd d and d = 1, d > 128,
 * rotary, element offsets, the LSE output, the unfused baseline (a kernel with barriers and
 * local memory) and the measurement kernels. Each case runs with the device's own launch
 * geometry and with the other device type's (GPU: a work-item per element and per query row;
 * CPU: a row per work-item and register tiles), so a CPU runs the GPU code paths too.
 *
 * The shapes are small because .ci/oclgrind.sh runs this file under Oclgrind, an OpenCL
 * simulator that reports out-of-bounds accesses and data races (IHA_DEVICE=oclgrind); it is
 * also an ordinary, fast test on any device. IHA_SMALL_SHAPES_GEOMETRY=native (or other) runs
 * one of the two geometries only, IHA_SMALL_SHAPES_FILTER (a CMocka pattern such as "core*")
 * some of the cases only.
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

#include "runtime/context.h" /* info.is_gpu: the launch geometry follows the device type */
#include "test_layer.h"
#include "test_util.h"


enum { CAUSAL = IHA_MASK_CAUSAL, TOKEN = IHA_MASK_TOKEN_CAUSAL, NONE = IHA_MASK_NONE };
typedef enum call { FORWARD, FORWARD_HOST, CORE, ATTENTION, UNFUSED } call;

typedef struct small_case {
    call call;
    size_t B, N, D, H, d, P;
    int mask;
    long long window;
    int rope;
} small_case;

/* T = N*P against the key block (16) and the CPU's 16 rows per work-item; d against the vector
 * widths 4 (d < 8), 8 (d < 16) and 16, and the d > 128 tile. Few distinct d values, because each
 * one is a program to build (twice: both geometries). */
static const small_case kCases[] = {
    /* call        B   N   D  H    d  P  mask    window rope */
    /* Mixing reads the rotary table's rows in whole vectors, cos and sin, up to the last row's;
     * the table is a workspace, trimmed before each call (exact_workspaces). */
    {CORE,         1,  4,  0, 2,  12, 3, CAUSAL, 0,     1}, /* d < 16, rotary */
    {CORE,         1,  5,  0, 2,   3, 2, CAUSAL, 0,     0}, /* T = 10 < one key block, vec 4 */
    {CORE,         2,  7,  0, 2,   9, 3, TOKEN,  2,     0}, /* vec 8 with a tail */
    {CORE,         1,  9,  0, 1,  17, 2, NONE,   3,     0}, /* vec 16 with a 1-wide tail */
    {CORE,         1, 13,  0, 2,   8, 4, NONE,   0,     1}, /* T = 52: 4 key blocks, rotary */
    {CORE,         1, 17,  0, 2,   8, 2, CAUSAL, 0,     1}, /* T = 34: 3 work-items on a CPU */
    {CORE,         2,  3,  0, 1,   1, 1, TOKEN,  0,     0}, /* d = 1, P = 1 */
    {CORE,         1,  6,  0, 1, 130, 1, CAUSAL, 2,     1}, /* d > 128, window */
    {CORE,         1, 11,  0, 3,   3, 3, TOKEN,  0,     0}, /* H = 3 */
    {ATTENTION,    1,  7,  0, 2,   9, 3, CAUSAL, 2,     0}, /* with LSE */
    {ATTENTION,    2,  9,  0, 1,   3, 2, TOKEN,  0,     0},
    {ATTENTION,    1, 10,  0, 1,  17, 2, NONE,   4,     0},
    {ATTENTION,    1,  9,  0, 1,  24, 2, CAUSAL, 0,     0}, /* vec 16, an 8-wide tail: vector tail load */
    {ATTENTION,    1,  7,  0, 1,  28, 3, NONE,   0,     0}, /* vec 16, a 12-wide tail (8 + 4) */
    {CORE,         1,  6,  0, 2,  20, 2, TOKEN,  2,     1}, /* vec 16, a 4-wide tail, rotary */
    {CORE,         1,  5,  0, 1,  12, 2, CAUSAL, 0,     0}, /* vec 8, a 4-wide tail */
    /* Mixing and collapse (vec 16 on a CPU): a head row's last chunk is one load that runs into
     * the next head's row or the next token's, except near a sequence's (collapse: a pseudo-head's)
     * end, where it would leave those rows and takes the element path (run_core's inputs and the
     * trimmed workspaces end where their tensors do). */
    {CORE,         2,  9,  0, 4,   1, 1, NONE,   0,     0}, /* d = 1, P = 1: both paths per sequence */
    {CORE,         2,  7,  0, 3,  17, 2, TOKEN,  0,     0}, /* odd d, a 1-wide tail, 3 heads */
    {FORWARD,      1,  7, 12, 2,   8, 2, CAUSAL, 3,     1}, /* every stage, tensors at offsets */
    {FORWARD,      2,  5,  9, 3,   3, 1, NONE,   0,     0},
    {FORWARD_HOST, 1,  9, 16, 2,   8, 3, TOKEN,  2,     1},
    {UNFUSED,      1,  9,  0, 2,   8, 2, CAUSAL, 0,     0}, /* measure_softmax.cl */
    {UNFUSED,      1,  6,  0, 1,   3, 3, NONE,   2,     0},
};
#define CASE_COUNT (sizeof kCases / sizeof kCases[0])

static iha_attention_options case_options(const small_case *c) { return tu_options(c->mask, c->window, c->rope); }

static ref_problem case_problem(const small_case *c)
{
    const iha_shape shape = {c->B, c->N, c->D, c->H, c->d, c->P};
    const iha_attention_options options = case_options(c);
    return tu_problem(&shape, &options);
}

/* A device copy of data at element offset `off`, with sentinel guards. */
static iha_buffer guarded(const float *data, size_t n, size_t off)
{
    return (iha_buffer){tu_buffer_guarded(tu_ctx, data, n, off, TU_GUARD, TU_SENTINEL), off};
}

/* Releases the context's workspaces, so that the call's own (the attention output O that the
 * collapse reads, the rotary table) are made anew for it and end where its tensors do: under
 * Oclgrind a whole-vector read past one (cl/collapse.cl, cl/mix.cl) is reported rather than
 * landing in a larger case's leftover buffer. */
static void exact_workspaces(void)
{
    iha_context_trim(tu_ctx);
}

/* iha_attention_core: Q, K, V [B][N][H][d] at offsets -> Y. */
static void run_core(const small_case *c, uint64_t seed)
{
    const iha_shape s = {c->B, c->N, 0, c->H, c->d, c->P};
    const iha_attention_options o = case_options(c);
    /* Each input's buffer ends where its data does: under Oclgrind a read past the tensor (the
     * mixing kernels read whole vectors beyond a head row) is reported rather than landing in a guard. */
    const tu_core_layout at = {3, 1, 6, 5, {1, 2, 3, 4}, 0};
    exact_workspaces();
    tu_check_random_core(tu_ctx, &s, &o, seed, 2.0f, 0, &at);
}

/* iha_attention (with LSE) or iha_attention_unfused: Qt, Kt, Vt [B][H][T][d] -> O. */
static void run_attention(const small_case *c, uint64_t seed)
{
    const iha_shape s = {c->B, c->N, 0, c->H, c->d, c->P};
    const iha_attention_options o = case_options(c);
    tu_rng rng = tu_rng_seeded(seed);
    const size_t n = tu_count_virtual(&s), nl = c->B * c->H * c->N * c->P;
    float *qt = tu_random_array(&rng, n, 1.5f), *kt = tu_random_array(&rng, n, 1.5f), *vt = tu_random_array(&rng, n, 1.0f);
    const ref_problem p = case_problem(c);
    double *oref = tu_malloc(n * sizeof *oref), *lref = tu_malloc(nl * sizeof *lref);
    assert_int_equal(ref_attention(&p, qt, kt, vt, oref, lref), 0);

    iha_buffer qb = guarded(qt, n, 2), kb = guarded(kt, n, 7), vb = guarded(vt, n, 1), ob = guarded(NULL, n, 4);
    iha_buffer lb = c->call == ATTENTION ? guarded(NULL, nl, 3) : (iha_buffer){NULL, 0};
    iha_status st = c->call == ATTENTION ? iha_attention(tu_ctx, &s, &o, qb, kb, vb, ob, lb)
                                         : iha_attention_unfused(tu_ctx, &s, &o, qb, kb, vb, ob);
    /* Where the driver cuts loops, CLBlast (the baseline's score product) is refused; the
     * guards around o must still hold. */
    const int refused = c->call != ATTENTION && tu_ctx->loop_flag != NULL;
    tu_assert_status(tu_ctx, st, refused ? IHA_ERROR_UNSUPPORTED : IHA_OK);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    if (refused)
        tu_assert_guard(tu_ctx, ob.mem, n, ob.offset, TU_GUARD, TU_SENTINEL);
    else
        tu_assert_buffer_close(tu_ctx, c->call == ATTENTION ? "o (iha_attention)" : "o (iha_attention_unfused)", ob, n, oref, TU_TOL_F32);
    if (lb.mem)
        tu_assert_buffer_close(tu_ctx, "lse (iha_attention)", lb, nl, lref, TU_TOL_F32);

    tu_buffer_release(qb.mem);
    tu_buffer_release(kb.mem);
    tu_buffer_release(vb.mem);
    tu_buffer_release(ob.mem);
    tu_buffer_release(lb.mem);
    free(oref);
    free(lref);
    free(qt);
    free(kt);
    free(vt);
}

static void run_forward(const small_case *c, uint64_t seed)
{
    const iha_shape s = {c->B, c->N, c->D, c->H, c->d, c->P};
    const iha_attention_options o = case_options(c);
    exact_workspaces();
    tu_check_random_layer(tu_ctx, &s, seed, &o, c->call == FORWARD ? TU_API_DEVICE_OFFSETS : TU_API_HOST);
}

/* Bit 0: the device's own geometry, bit 1: the other device type's. */
static int geometries(void)
{
    const char *g = getenv("IHA_SMALL_SHAPES_GEOMETRY");
    return g && strcmp(g, "native") == 0 ? 1 : g && strcmp(g, "other") == 0 ? 2 : 3;
}

/* The device's own geometry, saved by group_setup. Tests flip tu_ctx->info.is_gpu to run the
 * other device type's code paths; restore_geometry, every test's teardown, puts it back, so a
 * failed assertion (cmocka leaves the test by longjmp) cannot leave later tests in the wrong
 * geometry. */
static int native_is_gpu;

static int restore_geometry(void **state)
{
    (void)state;
    if (tu_ctx)
        tu_ctx->info.is_gpu = native_is_gpu;
    return 0;
}

static void small_case_test(void **state)
{
    const small_case *c = *state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const int native = native_is_gpu;
    for (int g = 0; g < 2; g++) {
        if (!(geometries() & (1 << g)))
            continue;
        tu_ctx->info.is_gpu = g ? !native : native;
        print_message("%s geometry\n", tu_ctx->info.is_gpu ? "GPU" : "CPU");
        const uint64_t seed = 7000 + (uint64_t)(c - kCases);
        if (c->call == CORE)
            run_core(c, seed);
        else if (c->call == ATTENTION || c->call == UNFUSED)
            run_attention(c, seed);
        else
            run_forward(c, seed);
        tu_ctx->info.is_gpu = native;
    }
}

/* The measurement kernels (cl/measure_copy.cl; the peak-FMA kernel's run length is calibrated
 * to 0.1 s per run, too long for a simulator, so it is left to `iha bench`). */
static void measure_copy_kernel(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    double bytes_per_second = 0.0;
    tu_assert_status(tu_ctx, iha_measure_copy_bandwidth(tu_ctx, 4096 + 64, &bytes_per_second), IHA_OK);
    assert_true(bytes_per_second > 0.0);
}

/* The attention loops' kernel (cl/measure_attention_loops.cl) with the register-tile
 * configuration of the CPU geometry, which every device can run: on d = 1, a d that no vector
 * width divides and a d > 128 (2-row tiles), so that Oclgrind sees its loads of a key block and
 * its value rows at every tail (d = 64 runs in the bench test). The GPU geometry's built-in is
 * the local-memory variant, which the call refuses. */
static void measure_attention_loops_kernel(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const size_t dims[] = {1, 19, 136};
    tu_ctx->info.is_gpu = 0; /* restore_geometry puts it back, also after a failed assertion */
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        iha_shape s = {.batch = 1, .tokens = 8, .model_dim = 2 * dims[i], .heads = 2, .head_dim = dims[i], .pseudo = 2};
        iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
        double score = 0.0, pv = 0.0;
        print_message("d=%zu\n", dims[i]);
        const iha_status st = iha_measure_attention_loops(tu_ctx, &s, &o, &score, &pv);
        /* Its calibrated loops outrun a driver that cuts loops short: a refusal, not a rate. */
        if (st == IHA_ERROR_UNSUPPORTED && tu_ctx->loop_flag != NULL &&
            strstr(iha_context_message(tu_ctx), "ends a kernel's loops") != NULL)
            continue;
        tu_assert_status(tu_ctx, st, IHA_OK);
        assert_true(score > 0.0 && isfinite(score));
        assert_true(pv > 0.0 && isfinite(pv));
    }
}

static int group_setup(void **state)
{
    (void)state;
    /* No tuning profile: the built-in configuration of each device type is what is flipped. */
    iha_context_options options;
    iha_context_options_init(&options);
    options.profile = "off";
    if (tu_context_open(&tu_ctx, &options) < 0)
        return -1;
    if (tu_ctx)
        native_is_gpu = tu_ctx->info.is_gpu;
    return 0;
}

int main(void)
{
    tu_init_environment();
    struct CMUnitTest tests[CASE_COUNT + 2];
    char names[CASE_COUNT][96];
    static const char *const call_names[] = {"forward", "forward_host", "core", "attention", "unfused"};
    static const char *const mask_names[] = {"causal", "token_causal", "none"};
    for (size_t i = 0; i < CASE_COUNT; i++) {
        const small_case *c = &kCases[i];
        snprintf(names[i], sizeof names[i], "%s B%zu N%zu H%zu d%zu P%zu %s w%lld%s", call_names[c->call], c->B, c->N,
                 c->H, c->d, c->P, mask_names[c->mask], c->window, c->rope ? " rope" : "");
        tests[i] = (struct CMUnitTest){names[i], small_case_test, NULL, restore_geometry, (void *)c};
    }
    tests[CASE_COUNT] = (struct CMUnitTest)cmocka_unit_test_teardown(measure_copy_kernel, restore_geometry);
    tests[CASE_COUNT + 1] =
        (struct CMUnitTest)cmocka_unit_test_teardown(measure_attention_loops_kernel, restore_geometry);
    const char *filter = getenv("IHA_SMALL_SHAPES_FILTER");
    if (filter && filter[0])
        cmocka_set_test_filter(filter);
    return _cmocka_run_group_tests("small_shapes", tests, CASE_COUNT + 2, group_setup, tu_group_teardown);
}
