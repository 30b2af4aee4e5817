/* bfloat16 storage (IHA_STORAGE_BF16 in iha_attention_options.storage and weight_storage, and
 * in KV caches; its conversions bit for bit are tests/test_bf16_convert.c's): every call with
 * bfloat16 activations and/or weights within doc/spec.md's bfloat16 contract
 * against float64 on the float inputs (the forward on the GEMV and converted-weight paths,
 * iha_forward_host, the core, attention and its backward, the layer's backward pass and the
 * saved pair, decode steps with a bfloat16 cache after a chunked prefill, a ring cache); half
 * and bfloat16 calls on one context; non-finite inputs reaching the same outputs as with float
 * storage; and the refusals. The per-call checks are tests/test_storage.c's, shared with half;
 * this file holds bfloat16's cases. */
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

#define TOL_BF16 1e-2 /* doc/spec.md: bfloat16 storage, float arithmetic */

/* ---- The layer ---- */

static const tu_storage_forward_case kForwardCases[] = {
    /* B N D H d P mask window rope act weight offsets identity */
    /* 7 rows: the projections read the bfloat16 weights directly (the GEMV path). */
    {"few_rows_bf16_everything", {1, 7, 32, 2, 16, 2, IHA_MASK_CAUSAL, 0, 1, 1, 1, 0, 0}},
    /* 226 rows: weights converted once per matrix, then the GEMM; odd d, a window, offsets. */
    {"many_rows_bf16_everything_offsets", {2, 113, 48, 3, 59, 3, IHA_MASK_TOKEN_CAUSAL, 5, 0, 1, 1, 1, 0}},
    {"bf16_weights_only_identity_mha", {1, 64, 64, 2, 16, 1, IHA_MASK_NONE, 0, 1, 0, 1, 0, 1}},
    {"bf16_activations_only", {1, 33, 40, 4, 8, 4, IHA_MASK_CAUSAL, 0, 1, 1, 0, 1, 0}},
    /* 12 rows, d = 5 and H*d = 15 columns, not a multiple of the GEMV's 8. */
    {"gemv_column_tail", {3, 4, 9, 3, 5, 2, IHA_MASK_NONE, 2, 0, 1, 1, 1, 0}},
};
#define FORWARD_CASE_COUNT (sizeof kForwardCases / sizeof kForwardCases[0])

static void forward_case(void **state)
{
    tu_storage_check_forward(&((const tu_storage_forward_case *)*state)->c, IHA_STORAGE_BF16, TOL_BF16, 177);
}

/* ---- The core and attention calls ---- */

static void core_and_attention(void **state)
{
    (void)state;
    const iha_shape s = {1, 57, 1, 2, 16, 3};
    tu_storage_check_core_and_attention(IHA_STORAGE_BF16, TOL_BF16, &s, 15, 19);
}

static void attention_backward(void **state)
{
    (void)state;
    const iha_shape shapes[3] = {{1, 23, 1, 2, 16, 3}, {2, 9, 1, 1, 5, 2}, {1, 30, 1, 1, 59, 2}};
    tu_storage_check_attention_backward(IHA_STORAGE_BF16, TOL_BF16, shapes, 161);
}

/* ---- The layer's backward pass ---- */

static void layer_backward(void **state)
{
    (void)state;
    tu_storage_check_layer_backward(IHA_STORAGE_BF16, TOL_BF16, 191, 25);
}

/* ---- Decoding ---- */

/* A prompt of `prefill` tokens per sequence in one step, then a token at a time, with x, z and
 * the weights in bfloat16 or float and a bfloat16 cache. */
static void decode_steps(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    /* d = 16 reads whole vectors of the cache; d = 5 and 59 also the tails (load_tail). */
    const iha_shape shapes[3] = {{2, 12, 32, 2, 16, 3}, {1, 10, 9, 3, 5, 2}, {1, 9, 24, 1, 59, 2}};
    const int bf16 = IHA_STORAGE_BF16, f32 = IHA_STORAGE_F32;
    tu_storage_check_decode(&shapes[0], bf16, bf16, IHA_MASK_CAUSAL, 0, 5, 31 + 5, TOL_BF16);
    tu_storage_check_decode(&shapes[0], f32, bf16, IHA_MASK_TOKEN_CAUSAL, 4, 7, 31 + 7, TOL_BF16);
    tu_storage_check_decode(&shapes[1], bf16, bf16, IHA_MASK_CAUSAL, 3, 1, 31 + 1, TOL_BF16);
    tu_storage_check_decode(&shapes[2], bf16, bf16, IHA_MASK_TOKEN_CAUSAL, 0, 4, 31 + 4, TOL_BF16);
}

/* A prompt longer than a ring cache's tokens runs as chunks inside iha_decode_step. */
static void decode_ring_long_prompt(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape full = {1, 40, 16, 2, 16, 2};
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 4, 1);
    o.storage = o.weight_storage = IHA_STORAGE_BF16;
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &full, 47, &o);
    const size_t D = full.model_dim, N = full.tokens, first = 30;
    iha_layer_weights w = tu_storage_upload_weights(&l, IHA_STORAGE_BF16, 0);
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = IHA_STORAGE_BF16;
    co.window = 4;
    co.cache_tokens = 8;
    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create_with(tu_ctx, &full, &co, &cache), IHA_OK);
    float *z = tu_malloc(N * D * sizeof *z);
    for (size_t n = 0; n < N;) {
        const size_t k = n == 0 ? first : 1;
        const iha_shape step = {1, k, D, full.heads, full.head_dim, full.pseudo};
        const iha_buffer xb = tu_storage_upload(IHA_STORAGE_BF16, l.x + n * D, k * D, 0);
        const iha_buffer zb = tu_storage_upload(IHA_STORAGE_BF16, NULL, k * D, 2);
        tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &w, NULL, xb, zb), IHA_OK);
        tu_storage_read(IHA_STORAGE_BF16, zb, k * D, z + n * D, "z (ring decode step)");
        tu_buffer_release(xb.mem), tu_buffer_release(zb.mem);
        n += k;
    }
    tu_assert_close("z (ring decode, bfloat16)", z, zref, N * D, TOL_BF16);
    iha_kv_cache_free(cache);
    free(z), free(zref);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

/* Half and bfloat16 calls on one context, each on the GEMV path and the converted one: every
 * kernel of cl/convert.cl from one program. */
static void half_and_bf16_share_a_context(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape shapes[2] = {{1, 7, 16, 2, 8, 2}, {1, 40, 16, 2, 8, 2}};
    const int storages[2] = {IHA_STORAGE_F16, IHA_STORAGE_BF16};
    for (int i = 0; i < 2; ++i) {
        tu_layer l;
        tu_layer_init(&l, &shapes[i], 5 + (uint64_t)i);
        const size_t nx = tu_count_x(&shapes[i]);
        const iha_host_weights hw = tu_layer_host_weights(&l);
        float *z = tu_malloc(nx * sizeof *z);
        for (int k = 0; k < 2; ++k) {
            iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
            o.storage = o.weight_storage = storages[k];
            double *zref = tu_layer_reference(&l, &o);
            tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &shapes[i], &o, &hw, l.x, z), IHA_OK);
            tu_assert_close(k ? "z (bfloat16 after half)" : "z (half)", z, zref, nx, TOL_BF16);
            free(zref);
        }
        free(z);
        tu_layer_free(&l);
    }
}

/* ---- Non-finite inputs ---- */

/* A NaN and an infinity planted in x reach the same outputs (non-finite where float storage's
 * are, finite elsewhere) with bfloat16 storage: rounding keeps both, and the finite rows stay
 * within the contract of the float storage's. */
static void nonfinite_inputs(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 9, 16, 2, 8, 2};
    tu_layer l;
    tu_layer_init(&l, &s, 71);
    const size_t nx = tu_count_x(&s);
    l.x[3 * s.model_dim + 2] = NAN;
    l.x[6 * s.model_dim + 5] = INFINITY;
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    const iha_host_weights hw = tu_layer_host_weights(&l);
    float *zf = tu_malloc(nx * sizeof *zf), *zb = tu_malloc(nx * sizeof *zb);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &hw, l.x, zf), IHA_OK);
    o.storage = o.weight_storage = IHA_STORAGE_BF16;
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &hw, l.x, zb), IHA_OK);
    size_t finite = 0;
    for (size_t i = 0; i < nx; ++i) {
        if (isfinite(zf[i]) != isfinite(zb[i]))
            fail_msg("z[%zu]: %g with float storage, %g with bfloat16", i, (double)zf[i], (double)zb[i]);
        finite += isfinite(zf[i]) != 0;
    }
    /* Rows before the NaN's token see none of it under the causal mask. */
    assert_true(finite >= 3 * s.model_dim && finite < nx);
    free(zf), free(zb);
    tu_layer_free(&l);
}

/* ---- Refusals ---- */

static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 8, 16, 2, 8, 2};
    tu_layer l;
    tu_layer_init(&l, &s, 3);
    const size_t nx = tu_count_x(&s);
    iha_layer_weights w = tu_storage_upload_weights(&l, IHA_STORAGE_BF16, 0);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    o.storage = o.weight_storage = IHA_STORAGE_BF16;
    const iha_buffer x = tu_storage_upload(IHA_STORAGE_BF16, l.x, nx, 0);
    /* A buffer of exactly nx elements of 2 bytes fits z; at offset 1 it is one short. */
    cl_int err;
    cl_mem exact = clCreateBuffer(iha_context_cl_context(tu_ctx), CL_MEM_READ_WRITE, nx * 2, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, (iha_buffer){exact, 0}), IHA_OK);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, (iha_buffer){exact, 1}), IHA_ERROR_BUFFER_TOO_SMALL);
    /* Unknown storage values, with a message naming the three. */
    iha_attention_options bad = o;
    bad.storage = IHA_STORAGE_BF16 + 1;
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &bad, &w, x, (iha_buffer){exact, 0}), IHA_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(iha_context_message(tu_ctx), "IHA_STORAGE_BF16"));
    bad = o;
    bad.weight_storage = 3;
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &bad, &w, x, (iha_buffer){exact, 0}), IHA_ERROR_INVALID_ARGUMENT);
    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &s, (iha_storage)3, &cache), IHA_ERROR_INVALID_ARGUMENT);
    assert_null(cache);
    /* A bfloat16 cache holds 2 bytes an element, as a half one. */
    iha_kv_cache *c16 = NULL, *cb16 = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &s, IHA_STORAGE_F16, &c16), IHA_OK);
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &s, IHA_STORAGE_BF16, &cb16), IHA_OK);
    assert_int_equal(iha_kv_cache_bytes(c16), iha_kv_cache_bytes(cb16));
    /* The unfused baseline is float only. */
    const iha_shape one = {1, 8, 1, 1, 8, 2};
    const size_t nv = tu_count_virtual(&one);
    cl_mem a = tu_storage_upload(IHA_STORAGE_BF16, NULL, nv, 0).mem;
    cl_mem b = tu_storage_upload(IHA_STORAGE_BF16, NULL, nv, 0).mem;
    const iha_buffer ab = {a, 0};
    tu_assert_status(tu_ctx, iha_attention_unfused(tu_ctx, &one, &o, ab, ab, ab, (iha_buffer){b, 0}),
                     IHA_ERROR_UNSUPPORTED);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    iha_kv_cache_free(c16), iha_kv_cache_free(cb16);
    tu_buffer_release(a), tu_buffer_release(b), tu_buffer_release(exact), tu_buffer_release(x.mem);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest others[] = {
        cmocka_unit_test(core_and_attention),
        cmocka_unit_test(attention_backward),      cmocka_unit_test(layer_backward),
        cmocka_unit_test(decode_steps),            cmocka_unit_test(decode_ring_long_prompt),
        cmocka_unit_test(half_and_bf16_share_a_context), cmocka_unit_test(nonfinite_inputs),
        cmocka_unit_test(refusals),
    };
    const tu_case_table table = {kForwardCases, sizeof kForwardCases[0], FORWARD_CASE_COUNT, forward_case};
    return tu_main_table(argc, argv, &table, others, sizeof others / sizeof others[0], tu_group_setup,
                         tu_group_teardown);
}
