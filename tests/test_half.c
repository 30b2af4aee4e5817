/* Half-precision storage (iha_attention_options.storage and weight_storage): the host
 * conversions bit for bit; every layer call with half activations and/or half weights within
 * doc/spec.md's half-storage contract against float64 on the float inputs, on each path (the
 * half-weight GEMV for few rows, converted weights and SGEMM for many, the identity shortcut,
 * element offsets counted in halves, guards around outputs); the layer's backward pass and the
 * saved training pair with half activations and/or weights; the decode step with half x, z,
 * weights and cache; and the refusals (unknown storage, a buffer one half short, overlaps
 * between tensors of different element sizes, the float-only unfused baseline). The per-call
 * checks are tests/test_storage.c's, shared with bfloat16; this file holds half's cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "test_layer.h"
#include "test_storage.h"

#define TOL_F16 2e-3 /* doc/spec.md: half storage, float accumulation */

/* ---- Host conversions ---- */

static uint16_t to_half(float x)
{
    uint16_t h;
    iha_half_from_float(&x, &h, 1);
    return h;
}

static void host_conversions_round_to_nearest_even(void **state)
{
    (void)state;
    assert_int_equal(to_half(0.0f), 0x0000);
    assert_int_equal(to_half(-0.0f), 0x8000);
    assert_int_equal(to_half(1.0f), 0x3c00);
    assert_int_equal(to_half(-2.0f), 0xc000);
    assert_int_equal(to_half(65504.0f), 0x7bff);        /* the largest half */
    assert_int_equal(to_half(65519.0f), 0x7bff);        /* below the midpoint to 65536 */
    assert_int_equal(to_half(65520.0f), 0x7c00);        /* the midpoint ties to even: infinity */
    assert_int_equal(to_half(INFINITY), 0x7c00);
    assert_int_equal(to_half(-INFINITY), 0xfc00);
    assert_true((to_half(NAN) & 0x7c00u) == 0x7c00u && (to_half(NAN) & 0x3ffu) != 0);
    assert_int_equal(to_half(1.0f + 0x1p-11f), 0x3c00); /* a tie: to the even neighbour 1 */
    assert_int_equal(to_half(1.0f + 0x3p-11f), 0x3c02); /* a tie: to the even neighbour above */
    assert_int_equal(to_half(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    assert_int_equal(to_half(0x1p-14f), 0x0400);        /* the smallest normal */
    assert_int_equal(to_half(0x1p-24f), 0x0001);        /* the smallest subnormal */
    assert_int_equal(to_half(0x1p-25f), 0x0000);        /* a tie between 0 and 2^-24: 0 */
    assert_int_equal(to_half(0x3p-26f), 0x0001);        /* 0.75 * 2^-24 rounds up */
    assert_int_equal(to_half(0x1.ffcp-15f), 0x0400);    /* the largest subnormal's round-up */
    assert_int_equal(to_half(-0x3p-24f), 0x8003);
    /* Every half that is not NaN survives half -> float -> half. */
    for (uint32_t h = 0; h < 0x10000u; ++h) {
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue;
        const uint16_t in = (uint16_t)h;
        float f;
        iha_half_to_float(&in, &f, 1);
        if (to_half(f) != in) fail_msg("half 0x%04x -> %a -> 0x%04x", h, (double)f, to_half(f));
    }
    float one;
    iha_half_to_float(&(uint16_t){0x3555}, &one, 1);
    assert_true(one == 0x1.554p-2f);
    iha_half_from_float(NULL, NULL, 0); /* n == 0 touches nothing */
}

/* ---- The layer ---- */

/* tu_options with half activations and weights. */
static iha_attention_options half_options(int mask, int64_t window, int rope)
{
    iha_attention_options o = tu_options(mask, window, rope);
    o.storage = IHA_STORAGE_F16;
    o.weight_storage = IHA_STORAGE_F16;
    return o;
}

/* The forward cases, each a CMocka case of its own name. */
static const tu_storage_forward_case kForwardCases[] = {
    /* B N D H d P mask window rope act weight offsets identity */
    /* 7 rows: the projections read half weights directly (the GEMV path). */
    {"few_rows_half_everything", {1, 7, 32, 2, 16, 2, IHA_MASK_CAUSAL, 0, 1, 1, 1, 0, 0}},
    /* 226 rows: half weights converted once per matrix, then CLBlast; odd d, a window, offsets. */
    {"many_rows_half_everything_offsets", {2, 113, 48, 3, 59, 3, IHA_MASK_TOKEN_CAUSAL, 5, 0, 1, 1, 1, 0}},
    {"half_weights_only_identity_mha", {1, 64, 64, 2, 32, 1, IHA_MASK_NONE, 0, 1, 0, 1, 0, 1}},
    {"half_activations_only", {1, 33, 40, 4, 10, 4, IHA_MASK_CAUSAL, 0, 1, 1, 0, 1, 0}},
    /* 12 rows of a tail-heavy shape: d = 5 and C = H*d = 15 columns, not a multiple of the GEMV's 8. */
    {"gemv_column_tail", {3, 4, 9, 3, 5, 2, IHA_MASK_NONE, 2, 0, 1, 1, 1, 0}},
};
#define FORWARD_CASE_COUNT (sizeof kForwardCases / sizeof kForwardCases[0])

/* A kForwardCases row, *state. */
static void forward_case(void **state)
{
    tu_storage_check_forward(&((const tu_storage_forward_case *)*state)->c, IHA_STORAGE_F16, TOL_F16, 77);
}

/* ---- The core and attention calls ---- */

static void core_and_attention_half(void **state)
{
    (void)state;
    const iha_shape s = {1, 57, 1, 2, 24, 3};
    tu_storage_check_core_and_attention(IHA_STORAGE_F16, TOL_F16, &s, 5, 9);
}

static void attention_backward_half(void **state)
{
    (void)state;
    const iha_shape shapes[3] = {{1, 23, 1, 2, 32, 3}, {2, 9, 1, 1, 7, 2}, {1, 30, 1, 1, 64, 2}};
    tu_storage_check_attention_backward(IHA_STORAGE_F16, TOL_F16, shapes, 61);
}

/* ---- The layer's backward pass ---- */

static void layer_backward_half(void **state)
{
    (void)state;
    tu_storage_check_layer_backward(IHA_STORAGE_F16, TOL_F16, 91, 5);
}

/* ---- Decoding ---- */

/* Token at a time with half x, z, weights and cache: the rows equal the full forward's. */
static void decode_step_half_everything(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape full = {2, 12, 32, 2, 16, 2};
    tu_storage_check_decode(&full, IHA_STORAGE_F16, IHA_STORAGE_F16, IHA_MASK_CAUSAL, 0, 1, 31, TOL_F16);
}

/* ---- Refusals ---- */

static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 8, 16, 2, 8, 2};
    tu_layer l;
    tu_layer_init(&l, &s, 3);
    const size_t nx = tu_count_x(&s), nw = tu_count_w(&s);
    iha_layer_weights w = tu_storage_upload_weights(&l, IHA_STORAGE_F16, 0);
    iha_attention_options o = half_options(IHA_MASK_CAUSAL, 0, 0);
    iha_buffer x = tu_storage_upload(IHA_STORAGE_F16, l.x, nx, 0);
    /* A buffer of exactly nx halves (no guard) fits z; one half fewer does not. */
    cl_int err;
    cl_mem exact = clCreateBuffer(iha_context_cl_context(tu_ctx), CL_MEM_READ_WRITE, nx * 2, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, (iha_buffer){exact, 0}), IHA_OK);
    cl_mem z = tu_storage_upload(IHA_STORAGE_F16, NULL, nx, 0).mem;
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, (iha_buffer){exact, 1}), IHA_ERROR_BUFFER_TOO_SMALL);
    /* The same buffer is too small for float storage. */
    iha_attention_options of = o;
    of.storage = IHA_STORAGE_F32;
    of.weight_storage = IHA_STORAGE_F32;
    cl_mem xf = tu_buffer_guarded(tu_ctx, l.x, nx, 0, 0, 0.0f);
    iha_layer_weights wf = tu_storage_upload_weights(&l, IHA_STORAGE_F32, 0);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &of, &wf, (iha_buffer){xf, 0}, (iha_buffer){exact, 0}),
                     IHA_ERROR_BUFFER_TOO_SMALL);
    /* Unknown storage values. */
    iha_attention_options bad = o;
    bad.storage = 7;
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &bad, &w, x, (iha_buffer){z, 0}), IHA_ERROR_INVALID_ARGUMENT);
    bad = o;
    bad.weight_storage = -1;
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &bad, &w, x, (iha_buffer){z, 0}), IHA_ERROR_INVALID_ARGUMENT);
    /* Overlaps are judged in bytes: float wq [0, 4*nw) bytes, a half z starting at half 2*nw-1
     * overlaps it, at half 2*nw it does not. */
    cl_mem shared = tu_buffer_guarded(tu_ctx, l.wq, nw, 0, (nx + 8) / 2 + 1, 0.0f);
    iha_attention_options omix = o;
    omix.weight_storage = IHA_STORAGE_F32;
    iha_layer_weights wmixf = wf;
    wmixf.wq = wmixf.wk = wmixf.wv = wmixf.wo = (iha_buffer){shared, 0};
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &omix, &wmixf, x, (iha_buffer){shared, 2 * nw - 1}),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &omix, &wmixf, x, (iha_buffer){shared, 2 * nw}), IHA_OK);
    /* The unfused baseline is float only. */
    const iha_shape one = {1, 8, 1, 1, 8, 2};
    const size_t nv = tu_count_virtual(&one);
    cl_mem a = tu_storage_upload(IHA_STORAGE_F16, NULL, nv, 0).mem;
    cl_mem b = tu_storage_upload(IHA_STORAGE_F16, NULL, nv, 0).mem;
    tu_assert_status(tu_ctx, iha_attention_unfused(tu_ctx, &one, &o, (iha_buffer){a, 0}, (iha_buffer){a, 0}, (iha_buffer){a, 0}, (iha_buffer){b, 0}),
                     IHA_ERROR_UNSUPPORTED);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);

    tu_buffer_release(a), tu_buffer_release(b), tu_buffer_release(exact), tu_buffer_release(z);
    tu_buffer_release(xf), tu_buffer_release(shared), tu_buffer_release(x.mem);
    tu_layer_weights_release(&w);
    tu_layer_weights_release(&wf);
    tu_layer_free(&l);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest others[] = {
        cmocka_unit_test(host_conversions_round_to_nearest_even),
        cmocka_unit_test(core_and_attention_half),
        cmocka_unit_test(attention_backward_half),
        cmocka_unit_test(layer_backward_half),
        cmocka_unit_test(decode_step_half_everything),
        cmocka_unit_test(refusals),
    };
    const tu_case_table table = {kForwardCases, sizeof kForwardCases[0], FORWARD_CASE_COUNT, forward_case};
    return tu_main_table(argc, argv, &table, others, sizeof others / sizeof others[0], tu_group_setup,
                         tu_group_teardown);
}
