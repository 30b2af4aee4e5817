/*
 * test_forward.c - iha_forward, iha_forward_host, iha_attention_core and iha_attention against
 * the float64 reference on a deterministic sample of the grid: N in {1, 7, 113, 257},
 * d in {1, 16, 40, 59, 64, 111, 128, 256}, H and P in {1..4}, B in {1, 2}, every mask, with and
 * without a window, with and without rotary (even d). Every output element is checked (relative
 * L2 error <= 1e-5, no NaN/Inf) on outputs poisoned with NaN, with guard regions around them.
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

#include "test_util.h"
#include "test_layer.h"

enum { CAUSAL = IHA_MASK_CAUSAL, TOKEN = IHA_MASK_TOKEN_CAUSAL, NONE = IHA_MASK_NONE };
enum { DEV = TU_API_DEVICE, OFF = TU_API_DEVICE_OFFSETS, HOST = TU_API_HOST };

typedef struct grid_case {
    size_t B, N, H, d, P;
    int mask;
    long long window; /* tokens; 0 = global */
    int rope;
    int api;          /* tu_api */
} grid_case;

/* The sample, chosen by hand so that every value of every axis appears, the tails (N = 113,
 * 257; odd d) appear with P > 1, P = 1 and d = 256 appear several times, each mask appears with
 * and without a window, and the float64 reference of the largest case (T = 1028) stays near a
 * second. D cycles through kGridD; the scale is custom in every fifth case and the rotary base
 * in every other rotary case. */
static const grid_case kGrid[] = {
    /*  B    N  H    d  P  mask  window rope api */
    {1, 1, 1, 1, 1, CAUSAL, 0, 0, HOST},
    {2, 1, 4, 256, 4, TOKEN, 0, 1, OFF},
    {1, 7, 2, 16, 3, CAUSAL, 0, 1, DEV},
    {2, 7, 3, 59, 2, TOKEN, 2, 0, HOST},
    {1, 7, 1, 40, 4, NONE, 3, 1, OFF},
    {1, 113, 2, 59, 3, CAUSAL, 0, 0, DEV},
    {2, 113, 1, 111, 2, NONE, 0, 0, HOST},
    {1, 113, 4, 64, 1, CAUSAL, 17, 1, OFF},
    {1, 257, 1, 64, 4, CAUSAL, 0, 1, DEV},
    {1, 257, 2, 1, 3, TOKEN, 9, 0, HOST},
    {2, 257, 1, 128, 2, NONE, 5, 0, OFF},
    {1, 257, 3, 256, 1, CAUSAL, 0, 1, DEV},
    {1, 113, 3, 256, 4, NONE, 0, 1, HOST},
    {1, 257, 4, 111, 4, TOKEN, 0, 0, OFF},
    {2, 7, 4, 128, 4, CAUSAL, 1, 1, DEV},
    {1, 113, 2, 128, 3, TOKEN, 0, 1, HOST},
    {2, 113, 3, 40, 4, CAUSAL, 4, 1, OFF},
    {1, 7, 3, 111, 1, NONE, 0, 0, DEV},
    {2, 257, 2, 16, 1, TOKEN, 0, 1, HOST},
    {1, 1, 3, 59, 2, NONE, 1, 0, DEV},
    {1, 113, 1, 1, 4, NONE, 0, 0, OFF},
    {2, 7, 2, 256, 2, NONE, 0, 1, HOST},
    {1, 257, 2, 40, 2, CAUSAL, 64, 0, DEV},
    {1, 113, 4, 16, 2, TOKEN, 5, 1, HOST},
    {2, 7, 1, 64, 3, TOKEN, 0, 0, OFF},
    {1, 257, 1, 59, 3, NONE, 11, 0, HOST},
    {1, 113, 2, 111, 4, CAUSAL, 0, 0, DEV},
    {2, 1, 2, 40, 1, CAUSAL, 0, 1, HOST},
    {1, 7, 4, 1, 2, CAUSAL, 0, 0, OFF},
    {1, 257, 4, 16, 3, CAUSAL, 0, 0, DEV},
    {2, 113, 1, 59, 1, TOKEN, 0, 0, HOST},
    {1, 7, 2, 64, 4, NONE, 0, 1, DEV},
    {1, 113, 3, 1, 1, NONE, 7, 0, HOST},
    {2, 257, 3, 64, 2, TOKEN, 3, 1, OFF},
    {1, 7, 1, 256, 3, CAUSAL, 2, 0, HOST},
    {1, 113, 4, 256, 2, CAUSAL, 0, 0, OFF},
    {1, 257, 2, 128, 4, TOKEN, 0, 1, DEV},
    {2, 113, 2, 16, 3, NONE, 0, 0, OFF},
    {1, 1, 4, 111, 3, TOKEN, 0, 0, HOST},
    {1, 7, 3, 40, 1, TOKEN, 1, 0, DEV},
    {1, 257, 1, 111, 1, NONE, 0, 0, HOST},
    {2, 113, 4, 128, 1, CAUSAL, 0, 0, DEV},
    {1, 113, 1, 40, 3, CAUSAL, 0, 1, OFF},
    {2, 257, 4, 59, 2, NONE, 0, 0, HOST},
    {1, 7, 4, 59, 4, CAUSAL, 0, 0, DEV},
    {1, 257, 3, 16, 4, CAUSAL, 2, 1, OFF},
    {1, 113, 2, 256, 2, TOKEN, 0, 0, HOST},
    {2, 1, 1, 16, 2, NONE, 0, 0, DEV},
};
#define GRID_COUNT (sizeof kGrid / sizeof kGrid[0])

static const size_t kGridD[] = {24, 33, 48, 64, 96, 17};


static const char *mask_name(int mask)
{
    return mask == CAUSAL ? "causal" : mask == TOKEN ? "token_causal" : "none";
}

static iha_attention_options grid_options(size_t index)
{
    const grid_case *c = &kGrid[index];
    iha_attention_options o = tu_options(c->mask, c->window, c->rope);
    if (index % 5 == 4)
        o.scale = 0.3f;
    if (c->rope && index % 2 == 1)
        o.rope_base = 500.0f;
    return o;
}

static void grid_forward(void **state)
{
    const grid_case *c = *state;
    size_t index = (size_t)(c - kGrid);
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_shape shape = {c->B, c->N, kGridD[index % 6], c->H, c->d, c->P};
    iha_attention_options options = grid_options(index);
    tu_check_random_layer(tu_ctx, &shape, 1000 + index, &options, (tu_api)c->api);
}

/* The sample covers what the header comment promises (a test of the table itself). */
static void grid_sample_covers_every_axis_value(void **state)
{
    (void)state;
    static const size_t Ns[] = {1, 7, 113, 257}, ds[] = {1, 16, 40, 59, 64, 111, 128, 256};
    int seen_odd_tail = 0, seen_p1 = 0, seen_d256 = 0;
    for (size_t i = 0; i < GRID_COUNT; i++) {
        const grid_case *c = &kGrid[i];
        assert_true(!c->rope || c->d % 2 == 0);
        seen_odd_tail |= (c->N >= 113 && c->d % 2 == 1 && c->P > 1);
        seen_p1 |= c->P == 1;
        seen_d256 |= c->d == 256;
    }
    assert_true(seen_odd_tail && seen_p1 && seen_d256);
#define COVERS(field, value)                          \
    do {                                              \
        int found = 0;                                \
        for (size_t k = 0; k < GRID_COUNT; k++)       \
            found |= kGrid[k].field == (value);       \
        if (!found)                                   \
            fail_msg(#field " = %zu missing", (size_t)(value)); \
    } while (0)
    for (size_t i = 0; i < 4; i++)
        COVERS(N, Ns[i]);
    for (size_t i = 0; i < 8; i++)
        COVERS(d, ds[i]);
    for (size_t v = 1; v <= 4; v++) {
        COVERS(H, v);
        COVERS(P, v);
    }
    COVERS(B, 1);
    COVERS(B, 2);
    for (int mask = 0; mask < 3; mask++) {
        int global = 0, windowed = 0, rope = 0, plain = 0;
        for (size_t i = 0; i < GRID_COUNT; i++) {
            if (kGrid[i].mask != mask)
                continue;
            global |= kGrid[i].window == 0;
            windowed |= kGrid[i].window > 0;
            rope |= kGrid[i].rope;
            plain |= !kGrid[i].rope;
        }
        assert_true(global && windowed && rope && plain);
    }
#undef COVERS
}

/* ---- iha_attention_core: projected Q, K, V [B][N][H][d] -> Y ---- */

typedef struct core_case {
    size_t B, N, H, d, P;
    int mask;
    long long window;
    int rope;
    int identity_null; /* P = 1 with the NULL identity shortcut */
    size_t model_dim;  /* ignored by the call; 0 checks that it is */
} core_case;

static const core_case kCore[] = {
    {1, 113, 3, 59, 4, CAUSAL, 0, 0, 0, 8},
    {2, 7, 2, 64, 2, TOKEN, 3, 1, 0, 8},
    {1, 257, 1, 16, 3, NONE, 0, 1, 0, 8},
    {2, 1, 4, 1, 1, CAUSAL, 0, 0, 1, 8},
    {1, 113, 2, 256, 2, CAUSAL, 5, 1, 0, 8},
    {1, 7, 4, 111, 3, TOKEN, 0, 0, 0, 0},
    {2, 113, 3, 40, 1, NONE, 2, 1, 1, 8},
};

static void core_forward(void **state)
{
    const core_case *c = *state;
    size_t index = (size_t)(c - kCore);
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_shape shape = {c->B, c->N, c->model_dim, c->H, c->d, c->P};
    iha_attention_options options = tu_options(c->mask, c->window, c->rope);
    const tu_core_layout at = {2, 5, 1, 3, {7, 7, 7, 7}, TU_GUARD};
    tu_check_random_core(tu_ctx, &shape, &options, 2000 + index, 2.5f, c->identity_null, &at);
}

/* ---- iha_attention: Qt, Kt, Vt [B][H][T][d] -> O and LSE ---- */

typedef struct attention_case {
    size_t B, N, H, d, P;
    int mask;
    long long window;
    float scale;
    int with_lse;
} attention_case;

static const attention_case kAttention[] = {
    {1, 113, 2, 59, 3, CAUSAL, 0, 0.0f, 1},
    {2, 257, 1, 64, 2, TOKEN, 4, 0.0f, 1},
    {1, 7, 3, 256, 4, NONE, 0, 0.0f, 1},
    {1, 113, 1, 1, 2, NONE, 3, 0.0f, 1},
    {2, 1, 2, 40, 1, CAUSAL, 0, 0.0f, 0},
    {1, 257, 4, 128, 1, CAUSAL, 0, 0.05f, 1},
    {1, 257, 2, 16, 4, CAUSAL, 7, 0.7f, 1},
    {2, 7, 1, 111, 3, TOKEN, 0, 0.0f, 1},
    /* Large scales spread the scores (base 2) over hundreds, so a row's running maximum grows by
     * more than the kernel's slack of 8 again and again: the rescaling path with a finite
     * earlier maximum runs, not only the first block's. */
    {1, 257, 2, 64, 4, CAUSAL, 0, 4.0f, 1},
    {1, 129, 1, 32, 2, TOKEN, 5, 3.0f, 1},
};

static void attention_forward(void **state)
{
    const attention_case *c = *state;
    size_t index = (size_t)(c - kAttention);
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_shape shape = {c->B, c->N, 0, c->H, c->d, c->P};
    iha_attention_options options = tu_options(c->mask, c->window, 0);
    options.scale = c->scale;
    tu_rng rng = tu_rng_seeded(3000 + index);
    size_t n = tu_count_virtual(&shape), nl = c->B * c->H * c->N * c->P;
    float *qt = tu_random_array(&rng, n, 1.5f), *kt = tu_random_array(&rng, n, 1.5f);
    float *vt = tu_random_array(&rng, n, 1.0f);

    const ref_problem p = tu_problem(&shape, &options);
    double *oref = tu_malloc(n * sizeof *oref), *lref = tu_malloc(nl * sizeof *lref);
    assert_int_equal(ref_attention(&p, qt, kt, vt, oref, lref), 0);

    const size_t offq = 1, offk = 4, offv = 9, offo = 2, offl = 3;
    iha_buffer qb = {tu_buffer_guarded(tu_ctx, qt, n, offq, TU_GUARD, TU_SENTINEL), offq};
    iha_buffer kb = {tu_buffer_guarded(tu_ctx, kt, n, offk, TU_GUARD, TU_SENTINEL), offk};
    iha_buffer vb = {tu_buffer_guarded(tu_ctx, vt, n, offv, TU_GUARD, TU_SENTINEL), offv};
    iha_buffer ob = {tu_buffer_guarded(tu_ctx, NULL, n, offo, TU_GUARD, TU_SENTINEL), offo};
    iha_buffer lb = {NULL, 0};
    if (c->with_lse)
        lb = (iha_buffer){tu_buffer_guarded(tu_ctx, NULL, nl, offl, TU_GUARD, TU_SENTINEL), offl};

    tu_assert_status(tu_ctx, iha_attention(tu_ctx, &shape, &options, qb, kb, vb, ob, lb), IHA_OK);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    tu_assert_buffer_close(tu_ctx, "o (iha_attention)", ob, n, oref, TU_TOL_F32);
    if (c->with_lse)
        tu_assert_buffer_close(tu_ctx, "lse (iha_attention)", lb, nl, lref, TU_TOL_F32);

    free(oref);
    free(lref);
    tu_buffer_release(qb.mem);
    tu_buffer_release(kb.mem);
    tu_buffer_release(vb.mem);
    tu_buffer_release(ob.mem);
    tu_buffer_release(lb.mem);
    free(qt);
    free(kt);
    free(vt);
}

/* ---- Windows near and beyond the sequence length ---- */

/* A window of N tokens or more hides nothing; values past 32 bits must not wrap into small
 * windows. Each mask, with windows from N - 1 up to INT64_MAX, against the reference. */
static void forward_huge_windows(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape shape = {1, 37, 16, 2, 16, 3};
    const int64_t windows[] = {36, 37, 38, INT32_MAX, (int64_t)INT32_MAX + 1, ((int64_t)1 << 32) + 1,
                               ((int64_t)1 << 62) / 3 + 1, INT64_MAX};
    tu_layer l;
    tu_layer_init(&l, &shape, 5000);
    for (int mask = 0; mask < 3; mask++) {
        for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
            iha_attention_options options = tu_options(mask, windows[i], 0);
            double *zref = tu_layer_reference(&l, &options);
            print_message("%s window %lld\n", mask_name(mask), (long long)windows[i]);
            tu_layer_check_forward(tu_ctx, &l, &options, TU_API_HOST, zref, TU_TOL_F32);
            free(zref);
        }
    }
    tu_layer_free(&l);
}

/* ---- All tensors of a layer in one application buffer ---- */

/* An application that carves every tensor out of one arena: x, the weights and z at odd element
 * offsets of a single cl_mem, with sentinel gaps. z is right; nothing else in the arena moves. */
static void forward_single_arena_buffer(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape shape = {2, 13, 24, 3, 16, 2};
    iha_attention_options options = tu_options(IHA_MASK_CAUSAL, 0, 1);
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &shape, 4000, &options);
    size_t nx = tu_count_x(&shape), nw = tu_count_w(&shape), nm = tu_count_mix(&shape);
    const float *parts[9] = {l.x, l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
    size_t counts[10] = {nx, nw, nw, nw, nw, nm, nm, nm, nm, nx}, offsets[10], total = 3;
    for (int i = 0; i < 10; i++) {
        offsets[i] = total;
        total += counts[i] + 3;
    }
    float *arena = tu_malloc(total * sizeof *arena);
    tu_fill_value(arena, total, TU_SENTINEL);
    for (int i = 0; i < 9; i++)
        memcpy(arena + offsets[i], parts[i], counts[i] * sizeof *arena);
    tu_fill_nan(arena + offsets[9], nx);
    cl_mem mem = tu_buffer_new(tu_ctx, total);
    tu_buffer_write(tu_ctx, mem, 0, arena, total);
    iha_buffer at[10];
    for (int i = 0; i < 10; i++)
        at[i] = (iha_buffer){mem, offsets[i]};
    iha_layer_weights w = {at[1], at[2], at[3], at[4], at[5], at[6], at[7], at[8]};

    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &shape, &options, &w, at[0], at[9]), IHA_OK);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    float *after = tu_malloc(total * sizeof *after);
    tu_buffer_read(tu_ctx, mem, 0, after, total);
    tu_assert_close("z (in the arena)", after + offsets[9], zref, nx, TU_TOL_F32);
    memcpy(after + offsets[9], arena + offsets[9], nx * sizeof *after); /* both NaN patterns */
    if (memcmp(after, arena, total * sizeof *arena) != 0)
        fail_msg("iha_forward changed the arena outside z");

    free(after);
    free(arena);
    tu_buffer_release(mem);
    free(zref);
    tu_layer_free(&l);
}

#define MAX_TESTS (3 + GRID_COUNT + sizeof kCore / sizeof kCore[0] + sizeof kAttention / sizeof kAttention[0])

int main(void)
{
    tu_init_environment();
    static struct CMUnitTest tests[MAX_TESTS];
    static char names[MAX_TESTS][128];
    size_t count = 0;

    tests[count++] = (struct CMUnitTest)cmocka_unit_test(grid_sample_covers_every_axis_value);
    for (size_t i = 0; i < GRID_COUNT; i++) {
        const grid_case *c = &kGrid[i];
        snprintf(names[count], sizeof names[count], "forward_%s_B%zu_N%zu_D%zu_H%zu_d%zu_P%zu_%s_w%lld%s%s",
                 tu_api_name((tu_api)c->api), c->B, c->N, kGridD[i % 6], c->H, c->d, c->P, mask_name(c->mask),
                 c->window, c->rope ? "_rope" : "", i % 5 == 4 ? "_scale" : "");
        tests[count] = (struct CMUnitTest){names[count], grid_forward, NULL, NULL, (void *)c};
        count++;
    }
    for (size_t i = 0; i < sizeof kCore / sizeof kCore[0]; i++) {
        const core_case *c = &kCore[i];
        snprintf(names[count], sizeof names[count], "attention_core_B%zu_N%zu_H%zu_d%zu_P%zu_%s_w%lld%s%s",
                 c->B, c->N, c->H, c->d, c->P, mask_name(c->mask), c->window, c->rope ? "_rope" : "",
                 c->identity_null ? "_identity" : "");
        tests[count] = (struct CMUnitTest){names[count], core_forward, NULL, NULL, (void *)c};
        count++;
    }
    for (size_t i = 0; i < sizeof kAttention / sizeof kAttention[0]; i++) {
        const attention_case *c = &kAttention[i];
        snprintf(names[count], sizeof names[count], "attention_B%zu_N%zu_H%zu_d%zu_P%zu_%s_w%lld%s%s", c->B,
                 c->N, c->H, c->d, c->P, mask_name(c->mask), c->window, c->scale != 0.0f ? "_scale" : "",
                 c->with_lse ? "_lse" : "");
        tests[count] = (struct CMUnitTest){names[count], attention_forward, NULL, NULL, (void *)c};
        count++;
    }
    tests[count++] = (struct CMUnitTest)cmocka_unit_test(forward_huge_windows);
    tests[count++] = (struct CMUnitTest)cmocka_unit_test(forward_single_arena_buffer);
    return _cmocka_run_group_tests("forward", tests, count, tu_group_setup, tu_group_teardown);
}
