/* The compact KV cache (iha_kv_cache_options.compact): every decoding step's outputs equal the
 * rows of the float64 reference forward over the sequence so far, under every mask, windows,
 * rotary (keys cached rotated by their token's position), float, half and bfloat16 storage,
 * ragged batches, chunked and packed prefill, identity mixing, a ring many laps long, truncation
 * and reset; its bytes are 1/P of the pseudo-token cache's; and the
 * refusals its rotation on read brings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"
#include "test_layer.h"
#include "runtime/context.h" /* info.is_gpu: the launch geometry and built-in follow the device type */

/* doc/spec.md's contracts for half and bfloat16 storage. */
#define TOL_F16 2e-3
#define TOL_BF16 1e-2
#define MAX_B 3

typedef struct compact_case {
    const char *name;
    size_t B, N, D, H, d, P;
    int mask;
    int64_t window;
    size_t L; /* a ring of L tokens (0: every token kept) */
    int rope;
    iha_storage storage;
    size_t prompt, chunk;  /* the first step's tokens (0: chunk), then tokens per step */
    size_t lengths[MAX_B]; /* tokens per sequence (0: N) */
    int identity;          /* P = 1 with NULL mixing weights */
} compact_case;

/* A layer, its device copy, a compact cache and the tokens each sequence holds. */
typedef struct run {
    tu_layer l;
    tu_device_layer dev;
    iha_attention_options o;
    iha_kv_cache *cache;
    size_t done[MAX_B];
    double tol;
} run;

static iha_status compact_create(const iha_shape *shape, iha_storage storage, int64_t window, size_t L,
                                 iha_kv_cache **out)
{
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = (int)storage;
    co.window = window;
    co.cache_tokens = L;
    co.compact = 1;
    return iha_kv_cache_create_with(tu_ctx, shape, &co, out);
}

static void run_open(run *r, const compact_case *cs)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape shape = {cs->B, cs->N, cs->D, cs->H, cs->d, cs->P};
    tu_layer_init(&r->l, &shape, 3000 + cs->d * 3 + cs->P + cs->L);
    if (cs->identity) tu_layer_identity(&r->l, 1);
    tu_device_layer_upload(tu_ctx, &r->l, 0, &r->dev);
    r->o = tu_options(cs->mask, cs->window, cs->rope);
    r->tol = cs->storage == IHA_STORAGE_F16 ? TOL_F16 : cs->storage == IHA_STORAGE_BF16 ? TOL_BF16 : TU_TOL_F32;
    memset(r->done, 0, sizeof r->done);
    tu_assert_status(tu_ctx, compact_create(&shape, cs->storage, cs->window, cs->L, &r->cache), IHA_OK);
}

static void run_close(run *r)
{
    iha_kv_cache_free(r->cache);
    tu_device_layer_release(&r->dev);
    tu_layer_free(&r->l);
}

/* One step of k tokens (counts per sequence), each sequence's rows checked against the
 * reference over its tokens so far. packed: the step's x and z hold the new tokens back to back
 * (options seq_lens). */
static void run_step(run *r, size_t k, const uint32_t *counts, int packed)
{
    const iha_shape *s = &r->l.shape;
    const size_t B = s->batch, D = s->model_dim, n = B * k * D;
    float *xh = tu_malloc(n * sizeof *xh), *zh = tu_malloc(n * sizeof *zh);
    size_t at[MAX_B], total = 0;
    for (size_t b = 0; b < B; ++b) {
        at[b] = packed ? total : b * k;
        total += counts[b];
        for (size_t j = 0; j < k; ++j)
            for (size_t c = 0; c < D; ++c) /* rows past the count must not matter */
                if (!packed || j < counts[b])
                    xh[(at[b] + j) * D + c] = j < counts[b] ? r->l.x[(b * s->tokens + r->done[b] + j) * D + c] : 1e3f;
    }
    cl_mem xs = tu_buffer_new(tu_ctx, n), zs = tu_buffer_new(tu_ctx, n);
    tu_buffer_write(tu_ctx, xs, 0, xh, n);
    tu_fill_nan(zh, n);
    tu_buffer_write(tu_ctx, zs, 0, zh, n);
    const iha_shape step = {B, k, D, s->heads, s->head_dim, s->pseudo};
    iha_attention_options o = r->o;
    size_t lens[MAX_B];
    if (packed) {
        for (size_t b = 0; b < B; ++b) lens[b] = counts[b];
        o.seq_lens = lens;
        o.seq_count = B;
    }
    tu_assert_status(tu_ctx,
                     iha_decode_step(tu_ctx, r->cache, &step, &o, &r->dev.weights, packed ? NULL : counts,
                                     (iha_buffer){xs, 0}, (iha_buffer){zs, 0}),
                     IHA_OK);
    tu_buffer_read(tu_ctx, zs, 0, zh, n);
    for (size_t b = 0; b < B; ++b) {
        assert_int_equal(iha_kv_cache_length(r->cache, b), r->done[b] + counts[b]);
        if (!packed)
            for (size_t i = counts[b] * D; i < k * D; ++i)
                if (zh[b * k * D + i] != 0.0f) fail_msg("a row of sequence %zu past its count is not 0", b);
        if (counts[b] == 0) continue;
        ref_problem p = tu_layer_problem(&r->l, &r->o);
        p.B = 1;
        p.N = r->done[b] + counts[b];
        p.x = r->l.x + b * s->tokens * D;
        size_t *rows = tu_malloc(counts[b] * sizeof *rows);
        for (size_t j = 0; j < counts[b]; ++j) rows[j] = r->done[b] + j;
        double *ref = tu_malloc(counts[b] * D * sizeof *ref);
        assert_int_equal(ref_forward(&p, rows, counts[b], ref), 0);
        char what[96];
        snprintf(what, sizeof what, "z of sequence %zu, tokens %zu..%zu", b, r->done[b], r->done[b] + counts[b] - 1);
        tu_assert_close(what, zh + at[b] * D, ref, counts[b] * D, r->tol);
        free(ref);
        free(rows);
        r->done[b] += counts[b];
    }
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    free(xh);
    free(zh);
}

/* Feeds every sequence its tokens, the prompt first, then chunk at a time. */
static void run_case(void **state)
{
    const compact_case *cs = *state;
    run r;
    run_open(&r, cs);
    size_t want[MAX_B];
    for (size_t b = 0; b < cs->B; ++b) want[b] = cs->lengths[b] ? cs->lengths[b] : cs->N;
    for (size_t k = cs->prompt ? cs->prompt : cs->chunk;; k = cs->chunk) {
        uint32_t counts[MAX_B];
        size_t active = 0;
        for (size_t b = 0; b < cs->B; ++b) {
            counts[b] = (uint32_t)(want[b] - r.done[b] < k ? want[b] - r.done[b] : k);
            active += counts[b];
        }
        if (active == 0) break;
        run_step(&r, k, counts, 0);
    }
    run_close(&r);
}

/* {name, B, N, D, H, d, P, mask, window, L, rope, storage, prompt, chunk, lengths, identity} */
static const compact_case kCases[] = {
    {"causal_rope_token_at_a_time", 2, 9, 24, 3, 16, 3, IHA_MASK_CAUSAL, 0, 0, 1, IHA_STORAGE_F32, 0, 1, {0}, 0},
    {"token_causal_window_odd_d_chunks", 1, 11, 32, 3, 59, 2, IHA_MASK_TOKEN_CAUSAL, 2, 0, 0, IHA_STORAGE_F32, 0, 4,
     {0}, 0},
    {"bidirectional_rope_half", 1, 8, 16, 2, 32, 4, IHA_MASK_NONE, 0, 0, 1, IHA_STORAGE_F16, 0, 3, {0}, 0},
    {"bidirectional_window", 2, 7, 16, 2, 8, 2, IHA_MASK_NONE, 2, 0, 0, IHA_STORAGE_F32, 0, 2, {0}, 0},
    {"ragged_bf16_rope_window", 3, 9, 24, 2, 40, 3, IHA_MASK_CAUSAL, 3, 0, 1, IHA_STORAGE_BF16, 0, 2, {7, 4, 1}, 0},
    {"identity_p1", 1, 6, 8, 2, 4, 1, IHA_MASK_CAUSAL, 0, 0, 1, IHA_STORAGE_F32, 0, 1, {0}, 1},
    /* 300 tokens: several splits of the cached tokens, rows of two heads per work-item. */
    {"long_prompt_many_splits", 1, 300, 16, 2, 64, 4, IHA_MASK_CAUSAL, 0, 0, 1, IHA_STORAGE_F32, 296, 2, {0}, 0},
    /* Rings: token at a time twelve laps, L = W, chunked steps past what the ring takes at once. */
    {"ring_causal_rope_batch2", 2, 60, 24, 2, 16, 3, IHA_MASK_CAUSAL, 3, 5, 1, IHA_STORAGE_F32, 0, 1, {0}, 0},
    {"ring_token_causal_l_equals_w_half", 1, 40, 16, 2, 16, 2, IHA_MASK_TOKEN_CAUSAL, 4, 4, 1, IHA_STORAGE_F16, 0, 1,
     {0}, 0},
    {"ring_bidirectional_window", 2, 30, 16, 2, 8, 2, IHA_MASK_NONE, 2, 3, 1, IHA_STORAGE_F32, 0, 1, {0}, 0},
    {"ring_long_prompt_bf16_ragged", 2, 40, 16, 2, 24, 4, IHA_MASK_CAUSAL, 4, 10, 1, IHA_STORAGE_BF16, 30, 2,
     {40, 21}, 0},
    /* Without rotary a CPU's steps of one token score from the token's raw query rows. */
    {"causal_token_at_a_time_half", 2, 9, 24, 3, 16, 3, IHA_MASK_CAUSAL, 0, 0, 0, IHA_STORAGE_F16, 0, 1, {0}, 0},
    {"ring_causal_bf16_ragged", 2, 30, 16, 2, 24, 4, IHA_MASK_CAUSAL, 3, 6, 0, IHA_STORAGE_BF16, 8, 1, {30, 17}, 0},
    {"long_prompt_many_splits_no_rope", 1, 300, 16, 2, 64, 4, IHA_MASK_CAUSAL, 0, 0, 0, IHA_STORAGE_F32, 296, 1,
     {0}, 0},
    /* Nine heads: more raw rows and more query rows than one vector's lanes. */
    {"nine_heads_token_causal", 1, 6, 36, 9, 4, 2, IHA_MASK_TOKEN_CAUSAL, 0, 0, 0, IHA_STORAGE_F32, 0, 1, {0}, 0},
    /* With rotary a CPU's steps mix each token's pseudo-keys across lanes (head, p) and dot them
     * with the query rows rotated back by p: nine heads (lanes of several vectors), P = 5 (pseudo
     * indices across a vector's end), half, and a ragged bfloat16 ring token at a time. */
    {"nine_heads_rope_token_causal", 1, 6, 36, 9, 4, 2, IHA_MASK_TOKEN_CAUSAL, 0, 0, 1, IHA_STORAGE_F32, 0, 1, {0}, 0},
    {"rope_p5_token_at_a_time_half", 2, 9, 24, 3, 16, 5, IHA_MASK_CAUSAL, 0, 0, 1, IHA_STORAGE_F16, 0, 1, {0}, 0},
    {"ring_rope_bf16_ragged", 2, 30, 16, 2, 24, 4, IHA_MASK_CAUSAL, 3, 6, 1, IHA_STORAGE_BF16, 8, 1, {30, 17}, 0},
};
#define CASE_COUNT (sizeof kCases / sizeof kCases[0])

/* The compact cache holds 2*H*d elements per token: 1/P of the pseudo-token cache's. */
static void bytes_are_one_pth(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {2, 100, 1, 3, 64, 4};
    iha_kv_cache *pseudo = NULL, *compact = NULL, *half = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &s, IHA_STORAGE_F32, &pseudo), IHA_OK);
    tu_assert_status(tu_ctx, compact_create(&s, IHA_STORAGE_F32, 0, 0, &compact), IHA_OK);
    tu_assert_status(tu_ctx, compact_create(&s, IHA_STORAGE_BF16, 0, 0, &half), IHA_OK);
    assert_int_equal(iha_kv_cache_bytes(compact), 2 * 2 * 100 * 3 * 64 * 4);
    assert_int_equal(iha_kv_cache_bytes(compact) * 4, iha_kv_cache_bytes(pseudo));
    assert_int_equal(iha_kv_cache_bytes(half) * 2, iha_kv_cache_bytes(compact));
    iha_kv_cache_free(pseudo);
    iha_kv_cache_free(compact);
    iha_kv_cache_free(half);
    /* A ring of L tokens: L + 1 tokens and the angles of positions 0 .. P-1, whatever N is. */
    const iha_shape longer = {2, 100000, 1, 3, 64, 4};
    tu_assert_status(tu_ctx, compact_create(&longer, IHA_STORAGE_F32, 8, 20, &compact), IHA_OK);
    assert_int_equal(iha_kv_cache_bytes(compact), 2 * 2 * 21 * 3 * 64 * 4 + 4 * 64 * 4);
    iha_kv_cache_free(compact);
}

/* A packed prefill (seq_lens), then ragged generation. */
static void packed_prefill(void **state)
{
    (void)state;
    const compact_case cs = {"", 3, 12, 16, 2, 16, 2, IHA_MASK_CAUSAL, 0, 0, 1, IHA_STORAGE_F32, 0, 0, {0}, 0};
    run r;
    run_open(&r, &cs);
    const uint32_t prompt[3] = {5, 1, 3}, more[3] = {2, 0, 1};
    run_step(&r, 5, prompt, 1);
    run_step(&r, 2, more, 1);
    run_step(&r, 2, more, 0);
    run_close(&r);
}

/* Rewinds sequence 0 of `r` to `keep` tokens and gives it new tokens after them, so that a
 * decoder that still read the dropped ones would differ from the reference. */
static void rewind_to(run *r, size_t keep, uint64_t seed)
{
    const iha_shape *s = &r->l.shape;
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(r->cache, 0, keep), IHA_OK);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    tu_fill_random(&rng, r->l.x + keep * s->model_dim, (s->tokens - keep) * s->model_dim, 1.0f);
    r->done[0] = keep;
}

/* Truncation of an ordinary and a ring compact cache, then decoding on; a reset frees the
 * rotary setting. */
static void truncate_and_reset(void **state)
{
    (void)state;
    const compact_case plain = {"", 2, 20, 16, 2, 16, 2, IHA_MASK_TOKEN_CAUSAL, 3, 0, 1, IHA_STORAGE_F32, 0, 0, {0}, 0};
    const compact_case ring = {"", 1, 40, 16, 2, 16, 2, IHA_MASK_CAUSAL, 3, 6, 1, IHA_STORAGE_F32, 0, 0, {0}, 0};
    const uint32_t twelve[2] = {12, 12}, one[2] = {1, 0}, chunk[2] = {5, 2};
    run r;
    run_open(&r, &plain);
    run_step(&r, 12, twelve, 0);
    rewind_to(&r, 9, 41);
    for (int i = 0; i < 3; ++i) run_step(&r, 1, one, 0);
    rewind_to(&r, 4, 51);
    run_step(&r, 5, chunk, 0);
    run_close(&r);

    run_open(&r, &ring);
    for (int i = 0; i < 20; ++i) run_step(&r, 1, one, 0);
    /* n_max = 20, L = 6, W = 3: 15 is refused, 16 is held. */
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(r.cache, 0, 15), IHA_ERROR_INVALID_ARGUMENT);
    rewind_to(&r, 16, 78);
    for (int i = 0; i < 6; ++i) run_step(&r, 1, one, 0);
    /* Another rotary setting is refused until a reset. */
    r.o.rope = 0;
    cl_mem xs = tu_buffer_new(tu_ctx, 16), zs = tu_buffer_new(tu_ctx, 16);
    const iha_shape step = {1, 1, 16, 2, 16, 2};
    tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, r.cache, &step, &r.o, &r.dev.weights, NULL, (iha_buffer){xs, 0},
                                             (iha_buffer){zs, 0}),
                     IHA_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(iha_context_message(tu_ctx), "rotary"));
    assert_int_equal(iha_kv_cache_length(r.cache, 0), 22);
    iha_kv_cache_reset(r.cache);
    r.done[0] = 0;
    for (int i = 0; i < 9; ++i) run_step(&r, 1, one, 0);
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    run_close(&r);
}

/* The quick cases again in the other device type's launch geometry and built-in configuration:
 * a GPU's work-item per row on a CPU, and on a GPU a CPU's, whose steps put the rows across
 * vector lanes (cl/attention_decode_compact_lanes.cl). */
static const char *const kOtherGeometry[] = {"causal_rope_token_at_a_time", "token_causal_window_odd_d_chunks",
                                             "bidirectional_window",        "causal_token_at_a_time_half",
                                             "ring_causal_bf16_ragged",     "nine_heads_token_causal",
                                             "nine_heads_rope_token_causal"};
#define OTHER_COUNT (sizeof kOtherGeometry / sizeof kOtherGeometry[0])

static int native_is_gpu;

static int other_geometry_setup(void **state)
{
    (void)state;
    if (tu_ctx) {
        native_is_gpu = tu_ctx->info.is_gpu;
        tu_ctx->info.is_gpu = !native_is_gpu;
    }
    return 0;
}

/* Also after a failed assertion, so the next case runs in the device's own geometry. */
static int other_geometry_teardown(void **state)
{
    (void)state;
    if (tu_ctx) tu_ctx->info.is_gpu = native_is_gpu;
    return 0;
}

int main(int argc, char **argv)
{
    struct CMUnitTest tests[CASE_COUNT + OTHER_COUNT + 3] = {
        cmocka_unit_test(bytes_are_one_pth),
        cmocka_unit_test(packed_prefill),
        cmocka_unit_test(truncate_and_reset),
    };
    static char names[OTHER_COUNT][80];
    size_t n = 3;
    for (size_t i = 0; i < CASE_COUNT; ++i)
        tests[n++] = (struct CMUnitTest){kCases[i].name, run_case, NULL, NULL, (void *)&kCases[i]};
    for (size_t o = 0; o < OTHER_COUNT; ++o)
        for (size_t i = 0; i < CASE_COUNT; ++i) {
            if (strcmp(kCases[i].name, kOtherGeometry[o]) != 0) continue;
            snprintf(names[o], sizeof names[o], "%s_other_geometry", kCases[i].name);
            tests[n++] = (struct CMUnitTest){names[o], run_case, other_geometry_setup, other_geometry_teardown,
                                             (void *)&kCases[i]};
        }
    return tu_main(argc, argv, tests, n, tu_group_setup, tu_group_teardown);
}
