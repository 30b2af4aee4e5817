/* The window-bounded ring KV cache (iha_kv_cache_create_with, cache_tokens below the sequence
 * length) and decoding after iha_kv_cache_truncate: every step's outputs equal the rows of the
 * float64 reference forward over the sequence so far, with sequences many times longer than the
 * ring, every mask, rotary, P = 1 and P > 1, batches with ragged counts, half storage, prompts
 * longer than the ring; the ring's bytes do not grow with the sequence; and the refusals. */
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
#define MAX_B 3

/* A layer, its device copy, its sequences' tokens and a cache, fed step by step. */
typedef struct feed {
    tu_layer l;
    tu_device_layer dev;
    iha_attention_options o;
    iha_kv_cache *cache;
    float *x;      /* [B][N][D]: the tokens each sequence holds or will append */
    double *full;  /* causal masks: the reference's z over all of x (a row depends on no later token) */
    size_t done[MAX_B];
    double tol;
} feed;

static void feed_open(feed *f, const iha_shape *shape, int mask, int64_t window, int rope, uint64_t seed)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    tu_layer_init(&f->l, shape, seed);
    tu_device_layer_upload(tu_ctx, &f->l, 0, &f->dev);
    f->o = tu_options(mask, window, rope);
    f->cache = NULL;
    const size_t n = tu_count_x(shape);
    f->x = tu_malloc(n * sizeof *f->x);
    memcpy(f->x, f->l.x, n * sizeof *f->x);
    f->full = NULL;
    memset(f->done, 0, sizeof f->done);
    f->tol = TU_TOL_F32;
}

static void feed_close(feed *f)
{
    iha_kv_cache_free(f->cache);
    free(f->full);
    free(f->x);
    tu_device_layer_release(&f->dev);
    tu_layer_free(&f->l);
}

/* The reference's rows n0 .. n0+count-1 of sequence b over its tokens 0 .. n0+count-1. */
static double *reference_rows(feed *f, size_t b, size_t n0, size_t count)
{
    const iha_shape *s = &f->l.shape;
    const size_t D = s->model_dim;
    ref_problem p = tu_layer_problem(&f->l, &f->o);
    double *out = tu_malloc(count * D * sizeof *out);
    if (f->o.mask != IHA_MASK_NONE) {
        if (f->full == NULL) {
            f->full = tu_malloc(tu_count_x(s) * sizeof *f->full);
            p.x = f->x;
            assert_int_equal(ref_forward(&p, NULL, s->batch * s->tokens, f->full), 0);
        }
        memcpy(out, f->full + (b * s->tokens + n0) * D, count * D * sizeof *out);
        return out;
    }
    p.B = 1;
    p.N = n0 + count;
    p.x = f->x + b * s->tokens * D;
    size_t *rows = tu_malloc(count * sizeof *rows);
    for (size_t j = 0; j < count; ++j) rows[j] = n0 + j;
    assert_int_equal(ref_forward(&p, rows, count, out), 0);
    free(rows);
    return out;
}

/* One step of k tokens (counts per sequence; NULL: k each), checked against the reference. */
static void feed_step(feed *f, size_t k, const uint32_t *counts)
{
    const iha_shape *s = &f->l.shape;
    const size_t B = s->batch, D = s->model_dim, n = B * k * D;
    float *xh = tu_malloc(n * sizeof *xh), *zh = tu_malloc(n * sizeof *zh);
    size_t count[MAX_B];
    for (size_t b = 0; b < B; ++b) {
        count[b] = counts ? counts[b] : k;
        for (size_t j = 0; j < k; ++j)
            for (size_t c = 0; c < D; ++c) /* rows past the count must not matter */
                xh[(b * k + j) * D + c] = j < count[b] ? f->x[(b * s->tokens + f->done[b] + j) * D + c] : 1e3f;
    }
    cl_mem xs = tu_buffer_new(tu_ctx, n), zs = tu_buffer_new(tu_ctx, n);
    tu_buffer_write(tu_ctx, xs, 0, xh, n);
    tu_fill_nan(zh, n);
    tu_buffer_write(tu_ctx, zs, 0, zh, n);
    const iha_shape step = {B, k, D, s->heads, s->head_dim, s->pseudo};
    tu_assert_status(tu_ctx,
                     iha_decode_step(tu_ctx, f->cache, &step, &f->o, &f->dev.weights, counts, (iha_buffer){xs, 0},
                                     (iha_buffer){zs, 0}),
                     IHA_OK);
    tu_buffer_read(tu_ctx, zs, 0, zh, n);
    for (size_t b = 0; b < B; ++b) {
        assert_int_equal(iha_kv_cache_length(f->cache, b), f->done[b] + count[b]);
        for (size_t i = count[b] * D; i < k * D; ++i)
            if (zh[b * k * D + i] != 0.0f) fail_msg("a row of sequence %zu past its count is not 0", b);
        if (count[b] == 0) continue;
        double *ref = reference_rows(f, b, f->done[b], count[b]);
        char what[96];
        snprintf(what, sizeof what, "z of sequence %zu, tokens %zu..%zu", b, f->done[b], f->done[b] + count[b] - 1);
        tu_assert_close(what, zh + b * k * D, ref, count[b] * D, f->tol);
        free(ref);
        f->done[b] += count[b];
    }
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    free(xh);
    free(zh);
}

/* A ring cache of L tokens for window W, or the ordinary cache for L = 0. */
static iha_status ring_create(const iha_shape *shape, iha_storage storage, int64_t window, size_t L,
                              iha_kv_cache **out)
{
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = (int)storage;
    co.window = window;
    co.cache_tokens = L;
    return iha_kv_cache_create_with(tu_ctx, shape, &co, out);
}

typedef struct ring_case {
    const char *name;
    size_t B, N, D, H, d, P;
    int mask;
    int64_t window, cache_window; /* the steps' window and the ring's (0: the steps') */
    size_t L;                     /* cache_tokens */
    int rope;
    iha_storage storage;
    size_t prompt, chunk;          /* the first step's tokens (0: chunk), then tokens per step */
    size_t lengths[MAX_B];         /* tokens per sequence (0: N) */
} ring_case;

static void run_ring(void **state)
{
    const ring_case *cs = *state;
    const iha_shape shape = {cs->B, cs->N, cs->D, cs->H, cs->d, cs->P};
    feed f;
    feed_open(&f, &shape, cs->mask, cs->window, cs->rope, 2000 + cs->d * 5 + cs->P + cs->L);
    if (cs->storage == IHA_STORAGE_F16) f.tol = TOL_F16;
    const int64_t W = cs->cache_window ? cs->cache_window : cs->window;
    tu_assert_status(tu_ctx, ring_create(&shape, cs->storage, W, cs->L, &f.cache), IHA_OK);

    /* The ring's bytes: L*P + P - 1 rows rounded up to a key block (4, 8 or 16 keys), whatever N is. */
    const size_t bytes = iha_kv_cache_bytes(f.cache), elem = cs->storage == IHA_STORAGE_F16 ? 2 : 4;
    const size_t per_row = 2 * cs->B * cs->H * cs->d * elem, rows = (cs->L + 1) * cs->P - 1;
    assert_int_equal(bytes % per_row, 0);
    assert_true(bytes / per_row >= rows && bytes / per_row < rows + 16);
    iha_kv_cache *longer = NULL;
    const iha_shape longer_shape = {cs->B, cs->N * 100, cs->D, cs->H, cs->d, cs->P};
    tu_assert_status(tu_ctx, ring_create(&longer_shape, cs->storage, W, cs->L, &longer), IHA_OK);
    assert_int_equal(iha_kv_cache_bytes(longer), bytes);
    iha_kv_cache_free(longer);

    size_t want[MAX_B];
    for (size_t b = 0; b < cs->B; ++b) want[b] = cs->lengths[b] ? cs->lengths[b] : cs->N;
    for (size_t k = cs->prompt ? cs->prompt : cs->chunk;; k = cs->chunk) {
        uint32_t counts[MAX_B];
        size_t active = 0;
        for (size_t b = 0; b < cs->B; ++b) {
            counts[b] = (uint32_t)(want[b] - f.done[b] < k ? want[b] - f.done[b] : k);
            active += counts[b];
        }
        if (active == 0) break;
        feed_step(&f, k, counts);
    }
    assert_int_equal(iha_kv_cache_bytes(f.cache), bytes);
    feed_close(&f);
}

/* {name, B, N, D, H, d, P, mask, window, cache_window, L, rope, storage, prompt, chunk, lengths} */
static const ring_case kRings[] = {
    /* Token at a time, 60 tokens through a ring of 5: twelve laps. */
    {"ring_causal_rope_p3_batch2", 2, 60, 24, 2, 16, 3, IHA_MASK_CAUSAL, 3, 0, 5, 1, IHA_STORAGE_F32, 0, 1, {0}},
    /* L = W, the least a ring may hold. */
    {"ring_token_causal_l_equals_w", 1, 50, 16, 2, 16, 2, IHA_MASK_TOKEN_CAUSAL, 4, 0, 4, 1, IHA_STORAGE_F32, 0, 1, {0}},
    {"ring_bidirectional_window", 2, 40, 16, 2, 8, 2, IHA_MASK_NONE, 2, 0, 3, 1, IHA_STORAGE_F32, 0, 1, {0}},
    /* P = 1, steps of 3 tokens on a ring that takes 1 besides the window: run in chunks; ragged. */
    {"ring_p1_chunked_ragged", 2, 40, 16, 2, 16, 1, IHA_MASK_CAUSAL, 5, 0, 5, 1, IHA_STORAGE_F32, 0, 3, {40, 23}},
    /* A 30-token prompt into a ring of 10 keeps its last 10, then token at a time; half storage. */
    {"ring_long_prompt_half", 1, 60, 16, 2, 32, 2, IHA_MASK_CAUSAL, 4, 0, 10, 1, IHA_STORAGE_F16, 30, 1, {0}},
    {"ring_token_causal_half_ragged", 3, 36, 16, 2, 24, 4, IHA_MASK_TOKEN_CAUSAL, 2, 0, 6, 1, IHA_STORAGE_F16, 7, 2,
     {36, 20, 9}},
    /* Steps with a window below the ring's. */
    {"ring_step_window_below_rings", 1, 40, 16, 1, 16, 2, IHA_MASK_CAUSAL, 2, 6, 7, 1, IHA_STORAGE_F32, 0, 2, {0}},
    /* A chunked prompt whose count is below the step's rows: the rows past it are 0. */
    {"ring_prompt_past_counts", 1, 12, 16, 2, 16, 2, IHA_MASK_CAUSAL, 3, 0, 5, 1, IHA_STORAGE_F32, 12, 1, {9}},
    /* A ring of more than 256 keys: the attention splits them, and splits wrap around the ring. */
    {"ring_many_splits_wrap", 1, 400, 16, 1, 32, 2, IHA_MASK_CAUSAL, 140, 0, 150, 1, IHA_STORAGE_F32, 200, 1, {0}},
};
#define RING_COUNT (sizeof kRings / sizeof kRings[0])

/* Rewinds sequence 0 of `f` to `keep` tokens and replaces its later tokens, so that a decoder
 * that still read the dropped ones would differ from the reference. */
static void rewind_with_new_tokens(feed *f, size_t keep, uint64_t seed)
{
    const iha_shape *s = &f->l.shape;
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(f->cache, 0, keep), IHA_OK);
    assert_int_equal(iha_kv_cache_length(f->cache, 0), keep);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    tu_fill_random(&rng, f->x + keep * s->model_dim, (s->tokens - keep) * s->model_dim, 1.0f);
    free(f->full);
    f->full = NULL;
    f->done[0] = keep;
}

/* An ordinary cache: rewind by k tokens, decode others, compare with the new sequence's forward. */
static void truncate_then_decode(void **state)
{
    const iha_shape shape = *(const iha_shape *)*state;
    static const int masks[3] = {IHA_MASK_CAUSAL, IHA_MASK_TOKEN_CAUSAL, IHA_MASK_NONE};
    for (int m = 0; m < 3; ++m) {
        feed f;
        feed_open(&f, &shape, masks[m], m == 1 ? 3 : 0, 1, 300 + (uint64_t)m);
        tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &shape, IHA_STORAGE_F32, &f.cache), IHA_OK);
        feed_step(&f, 12, NULL);
        rewind_with_new_tokens(&f, 9, 41 + (uint64_t)m);
        const uint32_t one_each[2] = {1, 0};
        for (int i = 0; i < 3; ++i) feed_step(&f, 1, one_each);
        /* Back again, into tokens already rewritten once, then a chunk. */
        rewind_with_new_tokens(&f, 4, 51 + (uint64_t)m);
        const uint32_t chunk[2] = {5, 2};
        feed_step(&f, 5, chunk);
        feed_close(&f);
    }
}

/* A ring rewinds within what it holds: n_max - L + W - 1 tokens and more, not fewer. */
static void ring_truncate_within_what_it_holds(void **state)
{
    const iha_shape shape = *(const iha_shape *)*state;
    feed f;
    feed_open(&f, &shape, IHA_MASK_CAUSAL, 3, 1, 77);
    tu_assert_status(tu_ctx, ring_create(&shape, IHA_STORAGE_F32, 3, 6, &f.cache), IHA_OK);
    feed_step(&f, 4, NULL);
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(f.cache, 0, 0), IHA_OK); /* 4 <= L: all held */
    f.done[0] = 0;
    for (int i = 0; i < 20; ++i) feed_step(&f, 1, NULL);
    /* n_max = 20, L = 6, W = 3: rewinding to 15 is refused and changes nothing. */
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(f.cache, 0, 15), IHA_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(iha_context_message(tu_ctx), "from token 16"));
    assert_int_equal(iha_kv_cache_length(f.cache, 0), 20);
    rewind_with_new_tokens(&f, 16, 78);
    for (int i = 0; i < 10; ++i) feed_step(&f, 1, NULL);
    /* Rewinding by less than n_max: n_max stays 26, so 22 is the limit. */
    rewind_with_new_tokens(&f, 22, 79);
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(f.cache, 0, 21), IHA_ERROR_INVALID_ARGUMENT);
    feed_step(&f, 3, NULL);
    /* A reset forgets n_max. */
    iha_kv_cache_reset(f.cache);
    f.done[0] = 0;
    feed_step(&f, 2, NULL);
    tu_assert_status(tu_ctx, iha_kv_cache_truncate(f.cache, 0, 0), IHA_OK);
    feed_close(&f);
}

/* Refused ring options and steps; a refused step changes neither the cache nor z. */
static void ring_refusals(void **state)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape shape = *(const iha_shape *)*state;
    iha_kv_cache *c = NULL;
    tu_assert_status(tu_ctx, ring_create(&shape, IHA_STORAGE_F32, 0, 10, &c), IHA_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(iha_context_message(tu_ctx), "window"));
    tu_assert_status(tu_ctx, ring_create(&shape, IHA_STORAGE_F32, 11, 10, &c), IHA_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(iha_context_message(tu_ctx), "at least"));
    tu_assert_status(tu_ctx, ring_create(&shape, IHA_STORAGE_F32, -1, 10, &c), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, ring_create(&shape, (iha_storage)5, 4, 10, &c), IHA_ERROR_INVALID_ARGUMENT);
    assert_null(c);

    /* cache_tokens 0 or at least N, and NULL options: the ordinary cache. */
    iha_kv_cache *plain = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &shape, IHA_STORAGE_F32, &plain), IHA_OK);
    tu_assert_status(tu_ctx, ring_create(&shape, IHA_STORAGE_F32, 0, 30, &c), IHA_OK);
    assert_int_equal(iha_kv_cache_bytes(c), iha_kv_cache_bytes(plain));
    iha_kv_cache_free(c);
    tu_assert_status(tu_ctx, iha_kv_cache_create_with(tu_ctx, &shape, NULL, &c), IHA_OK);
    assert_int_equal(iha_kv_cache_bytes(c), iha_kv_cache_bytes(plain));
    iha_kv_cache_free(c);
    iha_kv_cache_free(plain);

    feed f;
    feed_open(&f, &shape, IHA_MASK_CAUSAL, 4, 0, 9);
    tu_assert_status(tu_ctx, ring_create(&shape, IHA_STORAGE_F32, 4, 6, &f.cache), IHA_OK);
    feed_step(&f, 5, NULL);
    const size_t k = 4, n = k * 8;
    const iha_shape step = {1, k, 8, 2, 8, 2};
    cl_mem xs = tu_buffer_new(tu_ctx, n), zs = tu_buffer_guarded(tu_ctx, NULL, n, 0, TU_GUARD, TU_SENTINEL);
    tu_buffer_write(tu_ctx, xs, 0, f.x, n);
    float poison[32];
    tu_fill_value(poison, n, TU_SENTINEL);
    tu_buffer_write(tu_ctx, zs, 0, poison, n);
    const int64_t bad_windows[2] = {0, 5}; /* global, and wider than the ring's window */
    for (int i = 0; i < 2; ++i) {
        iha_attention_options o = tu_options(IHA_MASK_CAUSAL, bad_windows[i], 0);
        tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, f.cache, &step, &o, &f.dev.weights, NULL, (iha_buffer){xs, 0},
                                                 (iha_buffer){zs, 0}),
                         IHA_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(iha_context_message(tu_ctx), "ring"));
    }
    /* Bidirectional: 4 tokens > L - W + 1 = 3 at once. */
    iha_attention_options o = tu_options(IHA_MASK_NONE, 4, 0);
    tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, f.cache, &step, &o, &f.dev.weights, NULL, (iha_buffer){xs, 0},
                                             (iha_buffer){zs, 0}),
                     IHA_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(iha_context_message(tu_ctx), "at most 3"));
    assert_int_equal(iha_kv_cache_length(f.cache, 0), 5);
    tu_assert_buffer_all(tu_ctx, zs, 0, n, TU_SENTINEL);
    tu_assert_guard(tu_ctx, zs, n, 0, TU_GUARD, TU_SENTINEL);
    /* Past the sequence length N = 30. */
    const iha_shape long_step = {1, 26, 8, 2, 8, 2};
    cl_mem xl = tu_buffer_new(tu_ctx, 26 * 8), zl = tu_buffer_new(tu_ctx, 26 * 8);
    tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, f.cache, &long_step, &f.o, &f.dev.weights, NULL,
                                             (iha_buffer){xl, 0}, (iha_buffer){zl, 0}),
                     IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(iha_kv_cache_length(f.cache, 0), 5);
    /* The rest of the sequence still decodes right after the refusals. */
    feed_step(&f, 4, NULL);
    tu_buffer_release(xl);
    tu_buffer_release(zl);
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    feed_close(&f);
}

int main(int argc, char **argv)
{
    /* The shapes of the cases that are not in kRings: truncation of an ordinary cache and of a
     * ring, and the refusals (the last one's 8 x 4 floats fit its z). */
    static const iha_shape rewound = {2, 20, 16, 2, 16, 2}, ring = {1, 40, 16, 2, 16, 2}, refused = {1, 30, 8, 2, 8, 2};
    struct CMUnitTest tests[RING_COUNT + 3] = {
        cmocka_unit_test_prestate(truncate_then_decode, (void *)&rewound),
        cmocka_unit_test_prestate(ring_truncate_within_what_it_holds, (void *)&ring),
        cmocka_unit_test_prestate(ring_refusals, (void *)&refused),
    };
    for (size_t i = 0; i < RING_COUNT; ++i)
        tests[3 + i] = (struct CMUnitTest){kRings[i].name, run_ring, NULL, NULL, (void *)&kRings[i]};
    return tu_main(argc, argv, tests, RING_COUNT + 3, tu_group_setup, tu_group_teardown);
}
