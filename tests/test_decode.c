/* Incremental decoding (iha_decode_step with an iha_kv_cache): every step's outputs equal the
 * rows of the float64 reference forward over that sequence's prefix, token at a time and in
 * chunks, every mask, windows, rotary at virtual positions, ragged batches, float and half
 * cache storage; and the refusals: overflow, mismatched shapes, bad storage, bad truncation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"
#include "test_layer.h"

/* doc/spec.md's half-storage contract. */
#define TOL_F16 2e-3


typedef struct decode_case {
    const char *name;         /* the CMocka case's name */
    size_t B, N, D, H, d, P; /* N: the cache's max tokens per sequence */
    int mask;
    int64_t window;
    int rope;
    iha_storage storage;
    size_t chunk;             /* k, tokens per step */
    size_t lengths[4];        /* tokens to feed per sequence (0 entries: N) */
    float scale;              /* score scale, 0: doc/spec.md's default */
    size_t prefill;           /* tokens of each sequence's first step (0: chunk) */
} decode_case;

/* Feeds each sequence its tokens, `prefill` in the first step and then steps of `chunk`,
 * checking every step against the reference over the prefix so far; *state is the decode_case. */
static void run_case(void **state)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    const decode_case *cs = *state;
    const iha_shape full = {cs->B, cs->N, cs->D, cs->H, cs->d, cs->P};
    tu_layer l;
    tu_layer_init(&l, &full, 1000 + cs->d * 7 + cs->P);
    tu_device_layer dev;
    tu_device_layer_upload(tu_ctx, &l, 0, &dev);
    iha_attention_options o = tu_options(cs->mask, cs->window, cs->rope);
    o.scale = cs->scale;

    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &full, cs->storage, &cache), IHA_OK);
    const size_t k = cs->prefill > cs->chunk ? cs->prefill : cs->chunk, D = cs->D, row_elems = cs->B * k * D;
    iha_shape step_shape = {cs->B, k, D, cs->H, cs->d, cs->P};
    cl_mem xs = tu_buffer_new(tu_ctx, row_elems), zs = tu_buffer_new(tu_ctx, row_elems);
    float *xh = tu_malloc(row_elems * sizeof *xh), *zh = tu_malloc(row_elems * sizeof *zh);
    const double tol = cs->storage == IHA_STORAGE_F16 ? TOL_F16 : TU_TOL_F32;

    size_t want[4], done[4] = {0};
    for (size_t b = 0; b < cs->B; ++b) want[b] = cs->lengths[b] ? cs->lengths[b] : cs->N;
    for (size_t step = 0;; ++step) {
        uint32_t counts[4];
        size_t active = 0;
        const size_t most = step == 0 && cs->prefill ? cs->prefill : cs->chunk;
        step_shape.tokens = most;
        for (size_t b = 0; b < cs->B; ++b) {
            counts[b] = (uint32_t)(want[b] - done[b] < most ? want[b] - done[b] : most);
            active += counts[b];
        }
        if (active == 0) break;
        /* Rows past counts[b] get values that must not matter. */
        for (size_t b = 0; b < cs->B; ++b)
            for (size_t j = 0; j < most; ++j)
                for (size_t c = 0; c < D; ++c)
                    xh[(b * most + j) * D + c] = j < counts[b] ? l.x[(b * cs->N + done[b] + j) * D + c] : 1e3f;
        tu_buffer_write(tu_ctx, xs, 0, xh, cs->B * most * D);
        tu_fill_nan(zh, cs->B * most * D);
        tu_buffer_write(tu_ctx, zs, 0, zh, cs->B * most * D);
        tu_assert_status(tu_ctx,
                         iha_decode_step(tu_ctx, cache, &step_shape, &o, &dev.weights, counts, (iha_buffer){xs, 0},
                                         (iha_buffer){zs, 0}),
                         IHA_OK);
        tu_buffer_read(tu_ctx, zs, 0, zh, cs->B * most * D);
        for (size_t b = 0; b < cs->B; ++b) {
            assert_int_equal(iha_kv_cache_length(cache, b), done[b] + counts[b]);
            for (size_t j = counts[b]; j < most; ++j)
                for (size_t c = 0; c < D; ++c)
                    if (zh[(b * most + j) * D + c] != 0.0f) fail_msg("row %zu of sequence %zu past its count is not 0", j, b);
            if (counts[b] == 0) continue;
            ref_problem p = tu_layer_problem(&l, &o);
            p.B = 1;
            p.N = done[b] + counts[b];
            p.x = l.x + b * cs->N * D;
            size_t *rows = tu_malloc(counts[b] * sizeof *rows);
            for (size_t j = 0; j < counts[b]; ++j) rows[j] = done[b] + j;
            double *ref = tu_malloc(counts[b] * D * sizeof *ref);
            assert_int_equal(ref_forward(&p, rows, counts[b], ref), 0);
            char what[96];
            snprintf(what, sizeof what, "z of sequence %zu, tokens %zu..%zu", b, done[b], done[b] + counts[b] - 1);
            tu_assert_close(what, zh + b * most * D, ref, counts[b] * D, tol);
            free(ref);
            free(rows);
            done[b] += counts[b];
        }
    }
    free(xh);
    free(zh);
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    iha_kv_cache_free(cache);
    tu_device_layer_release(&dev);
    tu_layer_free(&l);
}

/* The cases run_case feeds. long_cache_* and split_keys_small: a long prefill, then steps of
 * one or two tokens over the whole cache, whose few query rows leave the device idle unless the
 * cache's keys are split over several work-items (at least 256 virtual keys a split): 300
 * tokens * P = 4 give five splits, split_keys_small's 72 * 4 two (a case small enough for a
 * simulator: .ci/oclgrind.sh runs it in place of the long ones). At scale 3 the scores (base 2)
 * spread over tens to hundreds, so rows move their reference point within a split and the
 * combine kernel weighs splits whose points differ by far more than the slack. */
static const decode_case kCases[] = {
    {"token_at_a_time_causal_rope", 2, 9, 24, 2, 16, 3, IHA_MASK_CAUSAL, 0, 1, IHA_STORAGE_F32, 1, {0}, 0.0f, 0},
    {"chunked_token_causal_window_odd_d", 1, 11, 32, 3, 59, 2, IHA_MASK_TOKEN_CAUSAL, 2, 0, IHA_STORAGE_F32, 4, {0},
     0.0f, 0},
    {"bidirectional_prefix_half", 1, 8, 16, 2, 32, 4, IHA_MASK_NONE, 0, 1, IHA_STORAGE_F16, 3, {0}, 0.0f, 0},
    {"bidirectional_window_float", 2, 7, 16, 2, 8, 2, IHA_MASK_NONE, 2, 0, IHA_STORAGE_F32, 2, {0}, 0.0f, 0},
    {"ragged_batch_half_window", 3, 9, 24, 2, 40, 3, IHA_MASK_CAUSAL, 3, 1, IHA_STORAGE_F16, 2, {7, 4, 1}, 0.0f, 0},
    {"long_cache_many_splits", 1, 300, 16, 1, 64, 4, IHA_MASK_CAUSAL, 0, 1, IHA_STORAGE_F32, 2, {0}, 0.0f, 296},
    {"long_cache_large_scale", 1, 300, 16, 1, 64, 4, IHA_MASK_CAUSAL, 0, 1, IHA_STORAGE_F32, 1, {0}, 3.0f, 297},
    {"split_keys_small", 1, 72, 16, 1, 16, 4, IHA_MASK_CAUSAL, 0, 1, IHA_STORAGE_F32, 1, {0}, 3.0f, 68},
};
#define CASE_COUNT (sizeof kCases / sizeof kCases[0])

static void plain_mha_identity(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    /* P = 1 with the NULL identity shortcut and d = 1. */
    const iha_shape full = {1, 5, 8, 2, 1, 1};
    tu_layer l;
    tu_layer_init(&l, &full, 77);
    tu_layer_identity(&l, 1);
    tu_device_layer dev;
    tu_device_layer_upload(tu_ctx, &l, 0, &dev);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    double *ref = tu_layer_reference(&l, &o);
    tu_check_decode_tokens(tu_ctx, &l, &dev, &o, ref, full.tokens);
    free(ref);
    tu_device_layer_release(&dev);
    tu_layer_free(&l);
}

static void half_storage_halves_bytes(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {2, 100, 1, 3, 64, 4};
    iha_kv_cache *f32, *f16;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &s, IHA_STORAGE_F32, &f32), IHA_OK);
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &s, IHA_STORAGE_F16, &f16), IHA_OK);
    assert_int_equal(iha_kv_cache_bytes(f32), 2 * 2 * 3 * 100 * 4 * 64 * 4);
    assert_int_equal(iha_kv_cache_bytes(f16) * 2, iha_kv_cache_bytes(f32));
    iha_kv_cache_free(f32);
    iha_kv_cache_free(f16);
}

/* A step in which no sequence appends a token (every count 0) on an empty cache: valid, writes
 * zero rows and leaves the cache empty (found by fuzz_api: the key split divided by zero). */
static void step_with_nothing_to_append(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape full = {2, 4, 8, 2, 8, 2}, step = {2, 1, 8, 2, 8, 2};
    tu_layer l;
    tu_layer_init(&l, &full, 6);
    tu_device_layer dev;
    tu_device_layer_upload(tu_ctx, &l, 0, &dev);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &full, IHA_STORAGE_F32, &cache), IHA_OK);
    const uint32_t counts[2] = {0, 0};
    cl_mem xs = tu_buffer_new(tu_ctx, 2 * 8), zs = tu_buffer_new(tu_ctx, 2 * 8);
    float x[16], z[16];
    tu_fill_value(x, 16, 0.5f);
    tu_fill_nan(z, 16);
    tu_buffer_write(tu_ctx, xs, 0, x, 16);
    tu_buffer_write(tu_ctx, zs, 0, z, 16);
    tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &dev.weights, counts, (iha_buffer){xs, 0},
                                             (iha_buffer){zs, 0}),
                     IHA_OK);
    tu_buffer_read(tu_ctx, zs, 0, z, 16);
    for (int i = 0; i < 16; i++) assert_true(z[i] == 0.0f);
    assert_int_equal(iha_kv_cache_length(cache, 0), 0);
    assert_int_equal(iha_kv_cache_length(cache, 1), 0);
    iha_kv_cache_free(cache);
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    tu_device_layer_release(&dev);
    tu_layer_free(&l);
}

/* Refusals leave the cache and z as they were. */
static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape full = {1, 4, 8, 2, 8, 2};
    tu_layer l;
    tu_layer_init(&l, &full, 5);
    tu_device_layer dev;
    tu_device_layer_upload(tu_ctx, &l, 0, &dev);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    iha_kv_cache *cache = NULL;

    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &full, (iha_storage)7, &cache), IHA_ERROR_INVALID_ARGUMENT);
    assert_null(cache);
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, NULL, IHA_STORAGE_F32, &cache), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &full, IHA_STORAGE_F32, &cache), IHA_OK);

    const iha_shape step3 = {1, 3, 8, 2, 8, 2};
    cl_mem xs = tu_buffer_new(tu_ctx, 24);
    cl_mem zs = tu_buffer_guarded(tu_ctx, NULL, 24, 0, TU_GUARD, TU_SENTINEL);
    tu_buffer_write(tu_ctx, xs, 0, l.x, 24);
    tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step3, &o, &dev.weights, NULL, (iha_buffer){xs, 0}, (iha_buffer){zs, 0}),
                     IHA_OK);
    assert_int_equal(iha_kv_cache_length(cache, 0), 3);

    /* 3 + 3 > 4 tokens: refused, nothing written. */
    float poison[24];
    tu_fill_value(poison, 24, TU_SENTINEL);
    tu_buffer_write(tu_ctx, zs, 0, poison, 24);
    iha_status st = iha_decode_step(tu_ctx, cache, &step3, &o, &dev.weights, NULL, (iha_buffer){xs, 0}, (iha_buffer){zs, 0});
    tu_assert_status(tu_ctx, st, IHA_ERROR_INVALID_ARGUMENT);
    assert_true(strlen(iha_context_message(tu_ctx)) > 0);
    assert_int_equal(iha_kv_cache_length(cache, 0), 3);
    tu_assert_buffer_all(tu_ctx, zs, 0, 24, TU_SENTINEL);

    /* A step shape that does not match the cache. */
    const iha_shape wrong = {1, 1, 8, 3, 8, 2};
    st = iha_decode_step(tu_ctx, cache, &wrong, &o, &dev.weights, NULL, (iha_buffer){xs, 0}, (iha_buffer){zs, 0});
    tu_assert_status(tu_ctx, st, IHA_ERROR_INVALID_ARGUMENT);
    const uint32_t too_many[1] = {5};
    st = iha_decode_step(tu_ctx, cache, &step3, &o, &dev.weights, too_many, (iha_buffer){xs, 0}, (iha_buffer){zs, 0});
    tu_assert_status(tu_ctx, st, IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_buffer_all(tu_ctx, zs, 0, 24, TU_SENTINEL);
    tu_assert_guard(tu_ctx, zs, 24, 0, TU_GUARD, TU_SENTINEL);

    /* An output on top of a weight is refused (the weight would be overwritten). */
    const uint32_t one[1] = {1}; /* fits the cache, so only the overlap can refuse it */
    st = iha_decode_step(tu_ctx, cache, &step3, &o, &dev.weights, one, (iha_buffer){xs, 0}, dev.weights.wq);
    tu_assert_status(tu_ctx, st, IHA_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(iha_context_message(tu_ctx), "z"));
    assert_int_equal(iha_kv_cache_length(cache, 0), 3);

    /* Truncation: not past the length, not a missing sequence; rewinding then works. */
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(cache, 0, 4), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(cache, 1, 0), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(cache, 0, 1), IHA_OK);
    assert_int_equal(iha_kv_cache_length(cache, 0), 1);
    iha_kv_cache_reset(cache);
    assert_int_equal(iha_kv_cache_length(cache, 0), 0);
    iha_kv_cache_free(cache);
    iha_kv_cache_free(NULL);
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    tu_device_layer_release(&dev);
    tu_layer_free(&l);
}

/* A cache may outlive its context: freeing the context detaches it, its host-side calls still
 * work, a step with another context is refused, and freeing it afterwards touches nothing of
 * the freed context (AddressSanitizer's use-after-free check in CI's sanitize stage). */
static void cache_outlives_its_context(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape full = {2, 4, 8, 2, 8, 2};
    iha_context *own = NULL;
    assert_int_equal(tu_context_open(&own, NULL), 0);
    iha_kv_cache *kept = NULL, *freed_first = NULL;
    tu_assert_status(own, iha_kv_cache_create(own, &full, IHA_STORAGE_F32, &kept), IHA_OK);
    tu_assert_status(own, iha_kv_cache_create(own, &full, IHA_STORAGE_F16, &freed_first), IHA_OK);
    const size_t bytes = iha_kv_cache_bytes(kept);
    iha_kv_cache_free(freed_first); /* unlinks itself from the context's list */
    iha_context_free(own);

    assert_int_equal(iha_kv_cache_bytes(kept), bytes);
    assert_int_equal(iha_kv_cache_length(kept, 1), 0);
    assert_int_equal(iha_kv_cache_truncate(kept, 0, 0), IHA_OK);
    assert_int_equal(iha_kv_cache_truncate(kept, 0, 1), IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(iha_kv_cache_truncate(kept, 2, 0), IHA_ERROR_INVALID_ARGUMENT);
    iha_kv_cache_reset(kept);

    tu_layer l;
    tu_layer_init(&l, &full, 7);
    tu_device_layer dev;
    tu_device_layer_upload(tu_ctx, &l, 0, &dev);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    const iha_shape step = {2, 1, 8, 2, 8, 2};
    cl_mem xs = tu_buffer_new(tu_ctx, 16), zs = tu_buffer_new(tu_ctx, 16);
    iha_status st = iha_decode_step(tu_ctx, kept, &step, &o, &dev.weights, NULL, (iha_buffer){xs, 0},
                                    (iha_buffer){zs, 0});
    tu_assert_status(tu_ctx, st, IHA_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(iha_context_message(tu_ctx), "freed"));
    iha_kv_cache_free(kept);
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    tu_device_layer_release(&dev);
    tu_layer_free(&l);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest others[] = {
        cmocka_unit_test(plain_mha_identity),
        cmocka_unit_test(half_storage_halves_bytes),
        cmocka_unit_test(step_with_nothing_to_append),
        cmocka_unit_test(refusals),
        cmocka_unit_test(cache_outlives_its_context),
    };
    const tu_case_table table = {kCases, sizeof kCases[0], CASE_COUNT, run_case};
    return tu_main_table(argc, argv, &table, others, sizeof others / sizeof others[0], tu_group_setup,
                         tu_group_teardown);
}
