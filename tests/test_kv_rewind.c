/* Decoding after iha_kv_cache_truncate, on the ordinary cache and on a ring: a sequence grows,
 * is rewound (to 0, to a middle token, to its own length, to the least a ring allows), gets new
 * tokens from there, and every step's outputs equal the rows of the float64 reference forward
 * over the sequence as it stands; float and half caches, float and half activations, steps of
 * one token and chunks, and on a ring chunks longer than L - W + 1 tokens (run as sub-steps).
 * A second sequence of the batch appends alongside and is never rewound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"
#include "test_layer.h"

/* doc/spec.md's half-storage contract. */
#define TOL_F16 2e-3
#define MAX_B 2
#define MAX_OPS 6

typedef struct rewind_case {
    const char *name;
    size_t B, N, D, H, d, P;
    int mask; /* causal or token-causal: a row of the full forward depends on no later token */
    int64_t window;
    size_t L; /* cache_tokens: 0 the ordinary cache, else a ring for the window */
    int rope;
    iha_storage cache, act; /* the cache's storage and the activations' (x and z) */
    size_t k;               /* tokens per step */
    /* {grow sequence 0 to this many tokens, then rewind it to this many}, until {0, 0}. */
    size_t ops[MAX_OPS][2];
} rewind_case;

typedef struct run {
    const rewind_case *cs;
    tu_layer l;
    tu_device_layer dev;
    iha_attention_options o;
    iha_kv_cache *cache;
    float *x;     /* [B][N][D]: each sequence's tokens as they stand */
    double *full; /* the reference's z over all of x; NULL once x changed */
    size_t done[MAX_B];
    uint64_t seed;
} run;

static void upload(cl_mem m, const float *src, size_t n, int half)
{
    if (!half) {
        tu_buffer_write(tu_ctx, m, 0, src, n);
        return;
    }
    uint16_t *h = tu_malloc(n * sizeof *h);
    iha_half_from_float(src, h, n);
    assert_int_equal(clEnqueueWriteBuffer(iha_context_cl_queue(tu_ctx), m, CL_TRUE, 0, n * sizeof *h, h, 0, NULL, NULL),
                     CL_SUCCESS);
    free(h);
}

static void download(cl_mem m, float *dst, size_t n, int half)
{
    if (!half) {
        tu_buffer_read(tu_ctx, m, 0, dst, n);
        return;
    }
    uint16_t *h = tu_malloc(n * sizeof *h);
    assert_int_equal(clEnqueueReadBuffer(iha_context_cl_queue(tu_ctx), m, CL_TRUE, 0, n * sizeof *h, h, 0, NULL, NULL),
                     CL_SUCCESS);
    iha_half_to_float(h, dst, n);
    free(h);
}

/* One step: sequence 0 appends min(k, until - done) tokens, the others min(k, what is left). */
static void step(run *r, size_t until)
{
    const rewind_case *cs = r->cs;
    const size_t B = cs->B, D = cs->D, k = cs->k, n = B * k * D;
    const int half = cs->act == IHA_STORAGE_F16;
    uint32_t counts[MAX_B];
    for (size_t b = 0; b < B; ++b) {
        const size_t end = b == 0 ? until : cs->N;
        counts[b] = (uint32_t)(end - r->done[b] < k ? end - r->done[b] : k);
    }
    float *xh = tu_malloc(n * sizeof *xh), *zh = tu_malloc(n * sizeof *zh);
    for (size_t b = 0; b < B; ++b)
        for (size_t j = 0; j < k; ++j)
            for (size_t c = 0; c < D; ++c) /* rows past the count must not matter */
                xh[(b * k + j) * D + c] = j < counts[b] ? r->x[(b * cs->N + r->done[b] + j) * D + c] : 1e3f;
    cl_mem xs = tu_buffer_new(tu_ctx, n), zs = tu_buffer_new(tu_ctx, n);
    upload(xs, xh, n, half);
    tu_fill_nan(zh, n);
    upload(zs, zh, n, half);
    const iha_shape shape = {B, k, D, cs->H, cs->d, cs->P};
    tu_assert_status(tu_ctx,
                     iha_decode_step(tu_ctx, r->cache, &shape, &r->o, &r->dev.weights, counts, (iha_buffer){xs, 0},
                                     (iha_buffer){zs, 0}),
                     IHA_OK);
    download(zs, zh, n, half);
    if (r->full == NULL) {
        r->full = tu_malloc(B * cs->N * D * sizeof *r->full);
        ref_problem p = tu_layer_problem(&r->l, &r->o);
        p.x = r->x;
        assert_int_equal(ref_forward(&p, NULL, B * cs->N, r->full), 0);
    }
    const double tol = cs->cache == IHA_STORAGE_F16 || half ? TOL_F16 : TU_TOL_F32;
    for (size_t b = 0; b < B; ++b) {
        assert_int_equal(iha_kv_cache_length(r->cache, b), r->done[b] + counts[b]);
        for (size_t i = counts[b] * D; i < k * D; ++i)
            if (zh[b * k * D + i] != 0.0f) fail_msg("a row of sequence %zu past its count is not 0", b);
        if (counts[b] == 0) continue;
        char what[96];
        snprintf(what, sizeof what, "z of sequence %zu, tokens %zu..%zu", b, r->done[b], r->done[b] + counts[b] - 1);
        tu_assert_close(what, zh + b * k * D, r->full + (b * cs->N + r->done[b]) * D, counts[b] * D, tol);
        r->done[b] += counts[b];
    }
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    free(xh);
    free(zh);
}

/* Rewinds sequence 0 to `keep` tokens and draws new tokens for the rest of it, so that a step
 * that still read a dropped token would differ from the reference. */
static void rewind_to(run *r, size_t keep)
{
    const rewind_case *cs = r->cs;
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(r->cache, 0, keep), IHA_OK);
    assert_int_equal(iha_kv_cache_length(r->cache, 0), keep);
    tu_rng rng;
    tu_rng_seed(&rng, r->seed++);
    tu_fill_random(&rng, r->x + keep * cs->D, (cs->N - keep) * cs->D, 1.0f);
    free(r->full);
    r->full = NULL;
    r->done[0] = keep;
}

static void run_case(void **state)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    const rewind_case *cs = *state;
    const iha_shape shape = {cs->B, cs->N, cs->D, cs->H, cs->d, cs->P};
    run r = {cs, .seed = 7000 + cs->N + cs->k};
    tu_layer_init(&r.l, &shape, 900 + cs->d + cs->P + cs->L);
    tu_device_layer_upload(tu_ctx, &r.l, 0, &r.dev);
    r.o = tu_options(cs->mask, cs->window, cs->rope);
    r.o.storage = (int)cs->act;
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = (int)cs->cache;
    co.window = cs->window;
    co.cache_tokens = cs->L;
    tu_assert_status(tu_ctx, iha_kv_cache_create_with(tu_ctx, &shape, &co, &r.cache), IHA_OK);
    const size_t bytes = iha_kv_cache_bytes(r.cache);
    r.x = tu_malloc(tu_count_x(&shape) * sizeof *r.x);
    memcpy(r.x, r.l.x, tu_count_x(&shape) * sizeof *r.x);
    for (size_t i = 0; i < MAX_OPS && cs->ops[i][0] != 0; ++i) {
        while (r.done[0] < cs->ops[i][0]) step(&r, cs->ops[i][0]);
        rewind_to(&r, cs->ops[i][1]);
    }
    while (r.done[0] < cs->N) step(&r, cs->N); /* and on to the end after the last rewind */
    assert_int_equal(iha_kv_cache_bytes(r.cache), bytes);
    iha_kv_cache_free(r.cache);
    free(r.full);
    free(r.x);
    tu_device_layer_release(&r.dev);
    tu_layer_free(&r.l);
}

#define F32 IHA_STORAGE_F32
#define F16 IHA_STORAGE_F16
#define CAUSAL IHA_MASK_CAUSAL
#define TOKEN_CAUSAL IHA_MASK_TOKEN_CAUSAL

/* {name, B, N, D, H, d, P, mask, window, L, rope, cache, act, k, ops}. On a ring of L tokens
 * for window W, a rewind from a longest length n_max > L goes to n_max - L + W - 1 at least. */
static const rewind_case kCases[] = {
    /* The ordinary cache: to 0, into the middle, to its own length, back again. */
    {"plain_token_float", 2, 24, 16, 2, 16, 2, CAUSAL, 0, 0, 1, F32, F32, 1, {{10, 0}, {14, 6}, {9, 9}, {16, 3}}},
    {"plain_chunk_half_cache", 2, 30, 16, 2, 16, 3, TOKEN_CAUSAL, 4, 0, 1, F16, F32, 5, {{15, 0}, {20, 7}, {22, 13}}},
    {"plain_chunk_half_activations", 1, 24, 16, 2, 16, 2, CAUSAL, 0, 0, 1, F32, F16, 4, {{12, 5}, {20, 0}}},
    /* A ring of 8 for window 3: rewinds while it held everything (to 0), then to the least it
     * allows (30 - 8 + 3 - 1 = 24), within that, and to its own length. */
    {"ring_token_float", 2, 60, 16, 2, 16, 2, CAUSAL, 3, 8, 1, F32, F32, 1, {{6, 0}, {30, 24}, {40, 38}, {45, 45}}},
    {"ring_token_half_cache", 1, 60, 16, 2, 16, 3, TOKEN_CAUSAL, 3, 8, 1, F16, F32, 1, {{7, 2}, {33, 27}, {44, 40}}},
    /* Chunks of 4 on a ring that takes 6 at once (L - W + 1), and of 9 (two sub-steps). */
    {"ring_chunk_float", 2, 64, 16, 2, 16, 2, CAUSAL, 3, 8, 1, F32, F32, 4, {{8, 0}, {32, 26}, {48, 43}}},
    {"ring_long_chunk_float", 2, 64, 16, 2, 16, 2, CAUSAL, 3, 8, 1, F32, F32, 9, {{8, 1}, {27, 21}, {45, 42}}},
    {"ring_long_chunk_half_cache", 1, 64, 16, 2, 16, 2, TOKEN_CAUSAL, 3, 8, 1, F16, F32, 9, {{18, 12}, {36, 30}}},
    /* Half activations through sub-steps: x and z move through half chunk buffers. */
    {"ring_long_chunk_half_activations", 2, 64, 16, 2, 16, 2, CAUSAL, 3, 8, 1, F32, F16, 9, {{27, 21}, {45, 40}}},
    {"ring_long_chunk_half_all_p1", 2, 56, 16, 2, 16, 1, CAUSAL, 4, 6, 1, F16, F16, 7, {{6, 0}, {28, 25}}},
};
#define CASE_COUNT (sizeof kCases / sizeof kCases[0])

int main(int argc, char **argv)
{
    struct CMUnitTest tests[CASE_COUNT];
    for (size_t i = 0; i < CASE_COUNT; ++i)
        tests[i] = (struct CMUnitTest){kCases[i].name, run_case, NULL, NULL, (void *)&kCases[i]};
    return tu_main(argc, argv, tests, CASE_COUNT, tu_group_setup, tu_group_teardown);
}
