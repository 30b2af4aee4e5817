/*
 * test_nonfinite.c - the non-finite rule of doc/numerics.md: an output is non-finite exactly
 * where the float64 reference over the visible keys is. One element of one input at a time
 * holds NaN, +inf or -inf, under every mask, global and windowed, and every output's pattern
 * of non-finite elements must be the reference's (its finite elements close to it). Float32
 * overflow of scores or of the scale must give non-finite outputs or a refusal, never zeros.
 * Covers the layer forward (float and half storage), the layer backward, iha_attention and
 * iha_attention_backward (both backward kernels), the GPU attention variants forced through
 * the profile as test_attention_variants.c does, and decoding through the KV cache (float and
 * half caches). With IHA_TEST_GRID=pairs each grid runs a pairwise cover of its cases
 * (test_grid.h).
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
#include "reference.h"
#include "test_grid.h"
#include "test_layer.h"
#include "test_util.h"

static const float kValues[] = {NAN, INFINITY, -INFINITY};
static const char *const kValueNames[] = {"NaN", "+inf", "-inf"};
#define VALUE_COUNT 3

static const int kMasks[] = {IHA_MASK_CAUSAL, IHA_MASK_TOKEN_CAUSAL, IHA_MASK_NONE};
static const char *const kMaskNames[] = {"causal", "token_causal", "none"};
#define MASK_COUNT 3
/* Windows in tokens: global, and one that hides most of the sequence from most queries. */
static const long long kWindows[] = {0, 3};
#define WINDOW_COUNT 2

/* Fails unless got and ref are non-finite at the same elements, and got's finite elements are
 * within tol (relative L2 over them) of ref's. */
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

/* Fails unless every element of got is non-finite or close to ref (|got - ref| at most tol
 * times the largest |ref|): float32 overflow may give NaN or infinity, never zeros or other
 * finite values the reference does not have. */
static void assert_nonfinite_or_close(const char *what, const float *got, const double *ref, size_t n, double tol)
{
    double top = 0.0;
    for (size_t i = 0; i < n; i++) top = fmax(top, fabs(ref[i]));
    for (size_t i = 0; i < n; i++)
        if (isfinite(got[i]) && fabs(got[i] - ref[i]) > tol * top)
            fail_msg("%s: element %zu is %g, finite, where the reference is %g", what, i, (double)got[i], ref[i]);
}

static float *read_floats(cl_mem mem, size_t n)
{
    float *out = tu_malloc(n * sizeof *out);
    tu_buffer_read(tu_ctx, mem, 0, out, n);
    return out;
}

/* ---- The layer: forward, backward, decoding ---- */

enum { IN_X, IN_WQ, IN_WK, IN_WV, IN_WO, IN_AQ, IN_AK, IN_AV, IN_R, IN_DZ, INPUTS };
static const char *const kInputNames[INPUTS] = {"x", "wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r", "dz"};

/* T = 24 virtual keys: two key blocks of 16, so a query meets whole and partial blocks; d = 16
 * takes the backward's tile kernel on CPUs. */
static const iha_shape kLayer = {1, 12, 16, 2, 16, 2};

/* The planted element of each input: token 5 of x and dz (tokens before and after it), and a
 * fixed element of each weight. */
static size_t plant_index(const iha_shape *s, int which, size_t token)
{
    const size_t D = s->model_dim, HD = s->heads * s->head_dim, H = s->heads, P = s->pseudo;
    switch (which) {
    case IN_X:
    case IN_DZ: return token * D + 3;
    case IN_WQ:
    case IN_WK:
    case IN_WV: return 2 * HD + 5;
    case IN_WO: return 3 * D + 7;
    default: return (1 * H + 0) * P + 1; /* alpha[1][0][1], R[1][0][1] */
    }
}

static float *input_of(tu_layer *l, float *dz, int which)
{
    float *const a[INPUTS] = {l->x, l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r, dz};
    return a[which];
}

static void case_name(char *out, size_t size, const char *what, int which, int v, int m, long long w)
{
    snprintf(out, size, "%s, %s in %s, %s mask, window %lld", what, kValueNames[v], kInputNames[which],
             kMaskNames[m], w);
}

/* z of iha_forward_host against the reference, in `storage` for activations and weights. */
static void layer_forward_case(const tu_layer *l, const iha_attention_options *o, const char *name)
{
    const size_t nx = tu_count_x(&l->shape);
    double *zref = tu_layer_reference(l, o);
    float *z = tu_malloc(nx * sizeof *z);
    tu_fill_nan(z, nx);
    const iha_host_weights w = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &l->shape, o, &w, l->x, z), IHA_OK);
    assert_same_pattern(name, z, zref, nx, o->storage == IHA_STORAGE_F16 ? 2e-3 : 1e-4);
    free(z);
    free(zref);
}

/* dx and every gradient of iha_backward against ref_backward. */
static void layer_backward_case(const tu_layer *l, const float *dz, const iha_attention_options *o, const char *name)
{
    const iha_shape *s = &l->shape;
    const size_t n[9] = {tu_count_x(s),   tu_count_w(s),   tu_count_w(s),   tu_count_w(s),  tu_count_w(s),
                         tu_count_mix(s), tu_count_mix(s), tu_count_mix(s), tu_count_mix(s)};
    static const char *const names[9] = {"dx", "dwq", "dwk", "dwv", "dwo", "dalpha_q", "dalpha_k", "dalpha_v", "dr"};
    tu_device_layer d;
    tu_device_layer_upload(tu_ctx, l, 0, &d);
    cl_mem bdz = tu_buffer_guarded(tu_ctx, dz, n[0], 0, 0, 0.0f);
    cl_mem out[9];
    for (int i = 0; i < 9; i++) out[i] = tu_buffer_guarded(tu_ctx, NULL, n[i], 0, 0, 0.0f);
    const iha_layer_grads g = {{out[1], 0}, {out[2], 0}, {out[3], 0}, {out[4], 0},
                               {out[5], 0}, {out[6], 0}, {out[7], 0}, {out[8], 0}};
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, s, o, &d.weights, d.x, (iha_buffer){bdz, 0}, (iha_buffer){out[0], 0}, &g),
                     IHA_OK);
    double *ref[9];
    for (int i = 0; i < 9; i++) ref[i] = tu_malloc(n[i] * sizeof(double));
    const ref_grads rg = {ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], ref[6], ref[7], ref[8]};
    const ref_problem p = tu_layer_problem(l, o);
    assert_int_equal(ref_backward(&p, dz, &rg), 0);
    for (int i = 0; i < 9; i++) {
        char what[256];
        snprintf(what, sizeof what, "%s: %s", name, names[i]);
        float *got = read_floats(out[i], n[i]);
        assert_same_pattern(what, got, ref[i], n[i], 1e-4);
        free(got);
        free(ref[i]);
        tu_buffer_release(out[i]);
    }
    tu_buffer_release(bdz);
    tu_device_layer_release(&d);
}

/* The factors of a grid of plants: the input, its value, the mask, the window, and for
 * decoding the cache's layout. */
enum { G_INPUT, G_VALUE, G_MASK, G_WINDOW, G_LAYOUT };

/* dz is planted only where the backward runs (data: the flag). */
static int layer_case_valid(const tu_grid_case *c, const void *data)
{
    return c->level[G_INPUT] != IN_DZ || *(const int *)data;
}

/* Every input of the layer, every value, mask and window (test_grid.h): z, and with
 * `backward` every gradient. */
static void layer_grid(int storage, int backward)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    const size_t nx = tu_count_x(&kLayer);
    const int levels[4] = {INPUTS, VALUE_COUNT, MASK_COUNT, WINDOW_COUNT};
    size_t cases = 0;
    tu_grid_case *grid = tu_grid_cases(levels, 4, layer_case_valid, &backward, &cases);
    for (size_t i = 0; i < cases; i++) {
        const int which = grid[i].level[G_INPUT], v = grid[i].level[G_VALUE], m = grid[i].level[G_MASK],
                  w = grid[i].level[G_WINDOW];
        tu_layer l;
        tu_layer_init(&l, &kLayer, 1900);
        tu_rng rng = tu_rng_seeded(1901);
        float *dz = tu_random_array(&rng, nx, 1.0f);
        input_of(&l, dz, which)[plant_index(&kLayer, which, 5)] = kValues[v];
        iha_attention_options o = tu_options(kMasks[m], kWindows[w], 0);
        o.storage = o.weight_storage = storage;
        char name[160];
        case_name(name, sizeof name, backward ? "backward" : "forward", which, v, m, kWindows[w]);
        if (which != IN_DZ) layer_forward_case(&l, &o, name);
        if (backward) layer_backward_case(&l, dz, &o, name);
        free(dz);
        tu_layer_free(&l);
    }
    free(grid);
    print_message("%zu cases\n", cases);
}

static void layer_forward_f32(void **state)
{
    (void)state;
    layer_grid(IHA_STORAGE_F32, 0);
}

static void layer_forward_half(void **state)
{
    (void)state;
    layer_grid(IHA_STORAGE_F16, 0);
}

static void layer_backward_f32(void **state)
{
    (void)state;
    layer_grid(IHA_STORAGE_F32, 1);
}

/* Decoding: a prefill of 8 tokens, then one token a step, each step's z against the reference's
 * rows; the planted x element reaches the cache's keys and values, so later steps read them.
 * compact: the compact cache, which mixes them as it reads them. */
static void decode_sequence(const tu_layer *l, const iha_attention_options *o, int cache_storage, int compact,
                            const char *name)
{
    const iha_shape *s = &l->shape;
    const size_t D = s->model_dim;
    iha_kv_cache *cache = NULL;
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = cache_storage;
    co.compact = compact;
    tu_assert_status(tu_ctx, iha_kv_cache_create_with(tu_ctx, s, &co, &cache), IHA_OK);
    tu_device_layer dev;
    tu_device_layer_upload(tu_ctx, l, 0, &dev);
    const size_t chunk = 8;
    cl_mem xs = tu_buffer_new(tu_ctx, chunk * D), zs = tu_buffer_new(tu_ctx, chunk * D);
    float *zh = tu_malloc(chunk * D * sizeof *zh);
    for (size_t done = 0; done < s->tokens;) {
        const size_t k = done == 0 ? chunk : 1;
        iha_shape step = *s;
        step.tokens = k;
        tu_buffer_write(tu_ctx, xs, 0, l->x + done * D, k * D);
        tu_fill_nan(zh, k * D);
        tu_buffer_write(tu_ctx, zs, 0, zh, k * D);
        tu_assert_status(tu_ctx,
                         iha_decode_step(tu_ctx, cache, &step, o, &dev.weights, NULL, (iha_buffer){xs, 0}, (iha_buffer){zs, 0}),
                         IHA_OK);
        tu_buffer_read(tu_ctx, zs, 0, zh, k * D);
        ref_problem p = tu_layer_problem(l, o);
        p.N = done + k;
        size_t rows[8];
        for (size_t j = 0; j < k; j++) rows[j] = done + j;
        double *ref = tu_malloc(k * D * sizeof *ref);
        assert_int_equal(ref_forward(&p, rows, k, ref), 0);
        char what[256];
        snprintf(what, sizeof what, "%s, %s%s cache, tokens %zu..%zu", name, cache_storage ? "half" : "float",
                 compact ? " compact" : "", done, done + k - 1);
        assert_same_pattern(what, zh, ref, k * D, cache_storage == IHA_STORAGE_F16 ? 2e-3 : 1e-4);
        free(ref);
        done += k;
    }
    free(zh);
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    tu_device_layer_release(&dev);
    iha_kv_cache_free(cache);
}

/* x in a prefill token (its keys and values sit in the cache for every later step) and in a
 * decoded token, and the weights whose element reaches every token's keys or values. */
static const struct {
    int which;
    size_t token;
} kDecodePlants[] = {{IN_X, 5}, {IN_X, 9}, {IN_WK, 0}, {IN_AV, 0}, {IN_R, 0}};
#define DECODE_PLANTS (sizeof kDecodePlants / sizeof kDecodePlants[0])

/* Layouts: float and half pseudo-token caches, and the compact cache in float; the half cache
 * only with x planted. */
static int decode_case_valid(const tu_grid_case *c, const void *data)
{
    (void)data;
    return c->level[G_LAYOUT] != 1 || kDecodePlants[c->level[G_INPUT]].which == IN_X;
}

static void decode_grid(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const int levels[5] = {(int)DECODE_PLANTS, VALUE_COUNT, MASK_COUNT, WINDOW_COUNT, 3};
    size_t cases = 0;
    tu_grid_case *grid = tu_grid_cases(levels, 5, decode_case_valid, NULL, &cases);
    for (size_t i = 0; i < cases; i++) {
        const int plant = grid[i].level[G_INPUT], v = grid[i].level[G_VALUE], m = grid[i].level[G_MASK],
                  w = grid[i].level[G_WINDOW], layout = grid[i].level[G_LAYOUT];
        const int which = kDecodePlants[plant].which;
        const size_t token = kDecodePlants[plant].token;
        const int storage = layout == 1 ? IHA_STORAGE_F16 : IHA_STORAGE_F32, compact = layout == 2;
        tu_layer l;
        tu_layer_init(&l, &kLayer, 1910);
        input_of(&l, NULL, which)[plant_index(&kLayer, which, token)] = kValues[v];
        const iha_attention_options o = tu_options(kMasks[m], kWindows[w], 0);
        char name[160];
        case_name(name, sizeof name, "decode", which, v, m, kWindows[w]);
        snprintf(name + strlen(name), sizeof name - strlen(name), " (token %zu)", token);
        decode_sequence(&l, &o, storage, compact, name);
        tu_layer_free(&l);
    }
    free(grid);
    print_message("%zu sequences\n", cases);
}

/* ---- Attention alone, in every variant, and its backward ---- */

enum { A_Q, A_K, A_V, A_DOUT, A_INPUTS };
static const char *const kAttentionInputs[A_INPUTS] = {"qt", "kt", "vt", "dout"};

/* Virtual tensors of kAttention: B = 1, H = 1, T = N*P = 24. */
static iha_shape attention_shape(size_t d) { return (iha_shape){1, 12, 0, 1, d, 2}; }

/* iha_attention's o and lse, then with `backward` iha_attention_backward's dqt, dkt, dvt, each
 * against the reference, with one element of one input planted (element 5 of row 11: rows
 * before and after it, in the same key block and the next). */
static void attention_case(iha_context *ctx, size_t d, int which, int v, int m, long long w, int backward,
                           const char *variant)
{
    const iha_shape s = attention_shape(d);
    const size_t n = tu_count_virtual(&s), T = s.tokens * s.pseudo;
    tu_rng rng = tu_rng_seeded(1920 + d);
    float *in[A_INPUTS];
    for (int i = 0; i < A_INPUTS; i++) in[i] = tu_random_array(&rng, n, i == A_V || i == A_DOUT ? 1.0f : 1.5f);
    in[which][11 * d + 5 % d] = kValues[v];
    iha_attention_options o = tu_options(kMasks[m], w, 0);
    ref_problem p;
    memset(&p, 0, sizeof p);
    p.B = s.batch, p.N = s.tokens, p.H = s.heads, p.d = s.head_dim, p.P = s.pseudo, p.mask = o.mask, p.window = w;
    double *oref = tu_malloc(n * sizeof *oref), *lref = tu_malloc(T * sizeof *lref);
    assert_int_equal(ref_attention(&p, in[A_Q], in[A_K], in[A_V], oref, lref), 0);

    cl_mem b[A_INPUTS];
    for (int i = 0; i < A_INPUTS; i++) b[i] = tu_buffer_guarded(ctx, in[i], n, 0, 0, 0.0f);
    cl_mem ob = tu_buffer_guarded(ctx, NULL, n, 0, 0, 0.0f), lb = tu_buffer_guarded(ctx, NULL, T, 0, 0, 0.0f);
    tu_assert_status(ctx, iha_attention(ctx, &s, &o, (iha_buffer){b[A_Q], 0}, (iha_buffer){b[A_K], 0},
                                        (iha_buffer){b[A_V], 0}, (iha_buffer){ob, 0}, (iha_buffer){lb, 0}),
                     IHA_OK);
    char name[256];
    snprintf(name, sizeof name, "attention (%s, d=%zu), %s in %s, %s mask, window %lld", variant, d, kValueNames[v],
             kAttentionInputs[which], kMaskNames[m], w);
    char what[300];
    float *got = tu_malloc(n * sizeof *got);
    tu_buffer_read(ctx, ob, 0, got, n);
    snprintf(what, sizeof what, "%s: o", name);
    assert_same_pattern(what, got, oref, n, 1e-4);
    tu_buffer_read(ctx, lb, 0, got, T);
    snprintf(what, sizeof what, "%s: lse", name);
    assert_same_pattern(what, got, lref, T, 1e-4);

    if (backward) {
        /* The backward reads the forward's o and lse as the device computed them; the reference
         * recomputes its own, which are non-finite at the same elements (checked above). */
        double *gref[3];
        cl_mem gb[3];
        for (int i = 0; i < 3; i++) {
            gref[i] = tu_malloc(n * sizeof(double));
            gb[i] = tu_buffer_guarded(ctx, NULL, n, 0, 0, 0.0f);
        }
        assert_int_equal(ref_attention_backward(&p, in[A_Q], in[A_K], in[A_V], in[A_DOUT], gref[0], gref[1], gref[2]), 0);
        tu_assert_status(ctx, iha_attention_backward(ctx, &s, &o, (iha_buffer){b[A_Q], 0}, (iha_buffer){b[A_K], 0},
                                                     (iha_buffer){b[A_V], 0}, (iha_buffer){ob, 0}, (iha_buffer){lb, 0},
                                                     (iha_buffer){b[A_DOUT], 0}, (iha_buffer){gb[0], 0},
                                                     (iha_buffer){gb[1], 0}, (iha_buffer){gb[2], 0}),
                         IHA_OK);
        static const char *const gnames[3] = {"dqt", "dkt", "dvt"};
        for (int i = 0; i < 3; i++) {
            tu_buffer_read(ctx, gb[i], 0, got, n);
            snprintf(what, sizeof what, "%s: %s", name, gnames[i]);
            assert_same_pattern(what, got, gref[i], n, 1e-4);
            free(gref[i]);
            tu_buffer_release(gb[i]);
        }
    }
    free(got);
    for (int i = 0; i < A_INPUTS; i++) {
        tu_buffer_release(b[i]);
        free(in[i]);
    }
    tu_buffer_release(ob);
    tu_buffer_release(lb);
    free(oref);
    free(lref);
}

static void attention_grid(iha_context *ctx, size_t d, int backward, const char *variant)
{
    const int levels[4] = {backward ? A_INPUTS : A_DOUT, VALUE_COUNT, MASK_COUNT, WINDOW_COUNT};
    size_t cases = 0;
    tu_grid_case *grid = tu_grid_cases(levels, 4, NULL, NULL, &cases);
    for (size_t i = 0; i < cases; i++)
        attention_case(ctx, d, grid[i].level[G_INPUT], grid[i].level[G_VALUE], grid[i].level[G_MASK],
                       kWindows[grid[i].level[G_WINDOW]], backward, variant);
    free(grid);
}

/* The device's own choice, forward and backward: d = 16 takes the backward's tile kernel on
 * CPUs, d = 5 the row kernel. */
static void attention_and_backward(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    attention_grid(tu_ctx, 16, 1, "built-in");
    attention_grid(tu_ctx, 5, 1, "built-in");
}

/* The forward's variants on any device: register tiles with GPU geometry, local memory with a
 * row per work-item, local memory with register sub-tiles of 4 x 4 and 8 x 8. */
static const ac_variant kVariants[] = {
    {"register tiles 4x1, KB 8", {4, 1, 8, 4, 128, 0, 32, 0, 4, 4}},
    {"local, 16 rows, 16 keys, KB 8", {1, 1, 8, 4, 16, 1, 16, 0, 4, 4}},
    {"local tiles, 16 rows, 16 keys, KB 4", {1, 1, 4, 4, 16, 2, 16, 0, 4, 4}},
    {"local tiles, 64 rows, 32 keys, KB 16", {1, 1, 16, 4, 64, 2, 32, 0, 4, 4}},
    {"local tiles 8x8, 64 rows, 64 keys, KB 16", {1, 1, 16, 4, 64, 2, 64, 0, 8, 8}},
};

static void attention_variants(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const size_t d = 8;
    for (size_t i = 0; i < sizeof kVariants / sizeof kVariants[0]; i++) {
        const ac_variant *v = &kVariants[i];
        char expected[512];
        iha_context *ctx = ac_context_forcing(&v->cfg, expected, sizeof expected);
        if (!ac_fits(ctx, &v->cfg, d)) {
            print_message("%s does not fit this device: skipped\n", v->name);
            iha_context_free(ctx);
            continue;
        }
        attention_grid(ctx, d, 0, v->name);
        ac_assert_last_ran(ctx, expected);
        iha_context_free(ctx);
    }
}

/* ---- Float32 overflow ---- */

/* x times 1e20: the scores overflow float32 (the float64 reference's do not). */
static void overflowing_scores_are_not_zeros(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    tu_layer l;
    tu_layer_init(&l, &kLayer, 1930);
    const size_t nx = tu_count_x(&kLayer);
    for (size_t i = 0; i < nx; i++) l.x[i] *= 1e20f;
    for (int m = 0; m < MASK_COUNT; m++) {
        const iha_attention_options o = tu_options(kMasks[m], 0, 0);
        double *zref = tu_layer_reference(&l, &o);
        float *z = tu_malloc(nx * sizeof *z);
        const iha_host_weights w = {l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
        tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &kLayer, &o, &w, l.x, z), IHA_OK);
        char what[96];
        snprintf(what, sizeof what, "z of x * 1e20, %s mask", kMaskNames[m]);
        assert_nonfinite_or_close(what, z, zref, nx, 1e-3);
        free(z);
        free(zref);
    }
    tu_layer_free(&l);
}

/* The layer: x = [[1]*8, [1.5e19]*8], W_Q = W_V = W_O = I, W_K = diag(-1 x4, 1 x4),
 * H = 1, d = 8, P = 1. Row 1's score against its own key is 0, but its float32 partial sums
 * reach -inf, which would read as a masked key and drop it silently (a finite, wrong row);
 * also with a scale of 2e38, where both rows overflow. Under every mask, through the
 * layer (the device's attention kernel) and decoding token by token (the decode kernels). */
static void overflowed_partial_sums_are_not_finite_rows(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 2, 8, 1, 8, 1};
    tu_layer l;
    tu_layer_init(&l, &s, 1940);
    tu_layer_identity(&l, 0);
    for (size_t i = 0; i < 64; i++) {
        const int diag = i % 9 == 0;
        l.wq[i] = l.wv[i] = l.wo[i] = diag ? 1.0f : 0.0f;
        l.wk[i] = diag ? (i < 32 ? -1.0f : 1.0f) : 0.0f;
    }
    for (size_t i = 0; i < 16; i++) l.x[i] = i < 8 ? 1.0f : 1.5e19f;
    static const float scales[2] = {0.0f, 2e38f};
    for (int m = 0; m < MASK_COUNT; m++)
        for (int sc = 0; sc < 2; sc++) {
            iha_attention_options o = tu_options(kMasks[m], 0, 0);
            o.scale = scales[sc];
            double *zref = tu_layer_reference(&l, &o);
            float z[16];
            const iha_host_weights w = {l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
            tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &w, l.x, z), IHA_OK);
            char what[96];
            snprintf(what, sizeof what, "layer, %s mask, scale %g", kMaskNames[m], (double)scales[sc]);
            /* Row 0 without a scale is beyond float32's precision (its scores cancel to 0 from
             * 1e19 terms under mask none): only the overflowing rows are checked. */
            const size_t from = sc == 0 ? 8 : 0;
            assert_nonfinite_or_close(what, z + from, zref + from, 16 - from, 1e-3);
            for (int compact = 0; m == 0 && compact < 2; compact++) { /* decoding is causal */
                iha_kv_cache_options co;
                iha_kv_cache_options_init(&co);
                co.compact = compact;
                iha_kv_cache *cache = NULL;
                tu_assert_status(tu_ctx, iha_kv_cache_create_with(tu_ctx, &s, &co, &cache), IHA_OK);
                tu_device_layer dev;
                tu_device_layer_upload(tu_ctx, &l, 0, &dev);
                cl_mem xs = tu_buffer_new(tu_ctx, 8), zs = tu_buffer_new(tu_ctx, 8);
                iha_shape step = s;
                step.tokens = 1;
                for (int t = 0; t < 2; t++) {
                    tu_buffer_write(tu_ctx, xs, 0, l.x + 8 * t, 8);
                    tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &dev.weights, NULL,
                                                             (iha_buffer){xs, 0}, (iha_buffer){zs, 0}),
                                     IHA_OK);
                    tu_buffer_read(tu_ctx, zs, 0, z + 8 * t, 8);
                }
                snprintf(what, sizeof what, "decoding, %s cache, scale %g", compact ? "compact" : "pseudo-token",
                         (double)scales[sc]);
                assert_nonfinite_or_close(what, z + from, zref + from, 16 - from, 1e-3);
                tu_buffer_release(xs);
                tu_buffer_release(zs);
                tu_device_layer_release(&dev);
                iha_kv_cache_free(cache);
            }
            free(zref);
        }
    tu_layer_free(&l);
}

/* Lane sums that overflow where no running sum over the columns does: key 1's products with
 * query 1 are -2.25e38 at columns 0 and 8 (one vector lane, or a pair of lanes, whichever the
 * kernel's vector width), +1.125e38 at columns 1 to 4 and +1e38 at column 5, so its true score
 * is 1e38 and the largest (key 0's is -3e19), yet a float32 sum over lanes reaches -inf with no
 * +inf beside it.
 * The layer, and decoding on either cache layout, must give token 1 non-finite or v1. */
static void overflowed_lane_sums_are_not_finite_rows(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 2, 16, 1, 16, 1};
    tu_layer l;
    tu_layer_init(&l, &s, 1941);
    tu_layer_identity(&l, 0);
    for (size_t i = 0; i < 256; i++) {
        const int diag = i % 17 == 0, c = (int)(i / 17);
        l.wq[i] = l.wv[i] = l.wo[i] = diag ? 1.0f : 0.0f;
        l.wk[i] = diag ? (c == 0 || c == 8 ? -1.0f : 1.0f) : 0.0f;
    }
    for (size_t c = 0; c < 16; c++) {
        l.x[c] = c == 0 || c == 8 ? 1.0f : 0.0f;
        l.x[16 + c] = c == 0 || c == 8 ? 1.5e19f : c >= 1 && c <= 4 ? 1.0606602e19f : c == 5 ? 1e19f : 0.0f;
    }
    const iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    double *zref = tu_layer_reference(&l, &o);
    float z[32];
    const iha_host_weights w = {l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &w, l.x, z), IHA_OK);
    assert_nonfinite_or_close("layer, token 1", z + 16, zref + 16, 16, 1e-3);
    tu_device_layer dev;
    tu_device_layer_upload(tu_ctx, &l, 0, &dev);
    cl_mem xs = tu_buffer_new(tu_ctx, 16), zs = tu_buffer_new(tu_ctx, 16);
    iha_shape step = s;
    step.tokens = 1;
    for (int compact = 0; compact < 2; compact++) {
        iha_kv_cache_options co;
        iha_kv_cache_options_init(&co);
        co.compact = compact;
        iha_kv_cache *cache = NULL;
        tu_assert_status(tu_ctx, iha_kv_cache_create_with(tu_ctx, &s, &co, &cache), IHA_OK);
        for (int t = 0; t < 2; t++) {
            tu_buffer_write(tu_ctx, xs, 0, l.x + 16 * t, 16);
            tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &dev.weights, NULL,
                                                     (iha_buffer){xs, 0}, (iha_buffer){zs, 0}),
                             IHA_OK);
            tu_buffer_read(tu_ctx, zs, 0, z + 16 * t, 16);
        }
        assert_nonfinite_or_close(compact ? "decoding, compact cache, token 1" : "decoding, pseudo-token cache, token 1",
                                  z + 16, zref + 16, 16, 1e-3);
        iha_kv_cache_free(cache);
    }
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    tu_device_layer_release(&dev);
    free(zref);
    tu_layer_free(&l);
}

/* iha_attention on every forward variant (kVariants) with the rows: query and key row
 * 11 cancel to a score of 0 through partial sums past -3.4e38, and every other key's elements
 * come in pairs (a, -a), so row 11's scores are all 0: dropping its own key would change its
 * mean of the values. Row 11 must be non-finite or right. */
static void overflowed_partial_sums_every_variant(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const size_t d = 8;
    const iha_shape s = attention_shape(d);
    const size_t n = tu_count_virtual(&s), T = s.tokens * s.pseudo;
    tu_rng rng = tu_rng_seeded(1941);
    float *q = tu_random_array(&rng, n, 1.0f), *k = tu_random_array(&rng, n, 1.0f), *v = tu_random_array(&rng, n, 1.0f);
    for (size_t i = 1; i < n; i += 2) k[i] = -k[i - 1]; /* row 11's scores with other keys: 0 */
    for (size_t c = 0; c < d; c++) {
        q[11 * d + c] = 1.5e19f;
        k[11 * d + c] = c < d / 2 ? -1.5e19f : 1.5e19f;
    }
    const size_t count = sizeof kVariants / sizeof kVariants[0];
    for (size_t i = 0; i <= count; i++) {
        char expected[512] = "";
        iha_context *ctx = i < count ? ac_context_forcing(&kVariants[i].cfg, expected, sizeof expected) : tu_ctx;
        if (i < count && !ac_fits(ctx, &kVariants[i].cfg, d)) {
            iha_context_free(ctx);
            continue;
        }
        cl_mem bq = tu_buffer_guarded(ctx, q, n, 0, 0, 0.0f), bk = tu_buffer_guarded(ctx, k, n, 0, 0, 0.0f);
        cl_mem bv = tu_buffer_guarded(ctx, v, n, 0, 0, 0.0f), ob = tu_buffer_guarded(ctx, NULL, n, 0, 0, 0.0f);
        for (int m = 0; m < MASK_COUNT; m++) {
            const iha_attention_options o = tu_options(kMasks[m], 0, 0);
            ref_problem p;
            memset(&p, 0, sizeof p);
            p.B = s.batch, p.N = s.tokens, p.H = s.heads, p.d = s.head_dim, p.P = s.pseudo, p.mask = o.mask;
            double *oref = tu_malloc(n * sizeof *oref), *lref = tu_malloc(T * sizeof *lref);
            assert_int_equal(ref_attention(&p, q, k, v, oref, lref), 0);
            tu_assert_status(ctx, iha_attention(ctx, &s, &o, (iha_buffer){bq, 0}, (iha_buffer){bk, 0},
                                                (iha_buffer){bv, 0}, (iha_buffer){ob, 0}, (iha_buffer){NULL, 0}),
                             IHA_OK);
            if (i < count) ac_assert_last_ran(ctx, expected);
            float *got = tu_malloc(n * sizeof *got);
            tu_buffer_read(ctx, ob, 0, got, n);
            char what[160];
            snprintf(what, sizeof what, "%s, %s mask", i < count ? kVariants[i].name : "built-in", kMaskNames[m]);
            assert_nonfinite_or_close(what, got, oref, n, 1e-3);
            free(got);
            free(oref);
            free(lref);
        }
        tu_buffer_release(bq);
        tu_buffer_release(bk);
        tu_buffer_release(bv);
        tu_buffer_release(ob);
        if (i < count) iha_context_free(ctx);
    }
    free(q);
    free(k);
    free(v);
}

/* iha_attention with scales that overflow many scores (dots of up to 16 * 4 * 4), the largest
 * scale accepted among them. */
static void huge_scales_are_not_garbage(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = attention_shape(16);
    const size_t n = tu_count_virtual(&s);
    tu_rng rng = tu_rng_seeded(1940);
    float *q = tu_random_array(&rng, n, 4.0f), *k = tu_random_array(&rng, n, 4.0f), *v = tu_random_array(&rng, n, 1.0f);
    cl_mem qb = tu_buffer_guarded(tu_ctx, q, n, 0, 0, 0.0f), kb = tu_buffer_guarded(tu_ctx, k, n, 0, 0, 0.0f);
    cl_mem vb = tu_buffer_guarded(tu_ctx, v, n, 0, 0, 0.0f), ob = tu_buffer_new(tu_ctx, n);
    const float scales[] = {1e37f, 2.35e38f};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
        iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
        o.scale = scales[i];
        ref_problem p;
        memset(&p, 0, sizeof p);
        p.B = s.batch, p.N = s.tokens, p.H = s.heads, p.d = s.head_dim, p.P = s.pseudo, p.mask = o.mask;
        p.scale = o.scale;
        double *oref = tu_malloc(n * sizeof *oref);
        assert_int_equal(ref_attention(&p, q, k, v, oref, NULL), 0);
        float *got = tu_malloc(n * sizeof *got);
        tu_fill_nan(got, n);
        tu_buffer_write(tu_ctx, ob, 0, got, n);
        tu_assert_status(tu_ctx, iha_attention(tu_ctx, &s, &o, (iha_buffer){qb, 0}, (iha_buffer){kb, 0},
                                               (iha_buffer){vb, 0}, (iha_buffer){ob, 0}, (iha_buffer){NULL, 0}),
                         IHA_OK);
        tu_buffer_read(tu_ctx, ob, 0, got, n);
        char what[64];
        snprintf(what, sizeof what, "o at scale %g", (double)scales[i]);
        assert_nonfinite_or_close(what, got, oref, n, 1e-3);
        free(got);
        free(oref);
    }
    free(q);
    free(k);
    free(v);
    cl_mem m[4] = {qb, kb, vb, ob};
    for (int i = 0; i < 4; i++) tu_buffer_release(m[i]);
}

/* A scale whose product with log2(e) is no float is refused, with a message naming it. */
static void unrepresentable_scale_is_refused(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = attention_shape(8);
    const size_t n = tu_count_virtual(&s);
    cl_mem b[4];
    for (int i = 0; i < 4; i++) b[i] = tu_buffer_guarded(tu_ctx, NULL, n, 0, 0, 0.0f);
    const float scales[] = {3.4e38f, -3.0e38f};
    for (size_t i = 0; i < 2; i++) {
        iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
        o.scale = scales[i];
        tu_assert_status(tu_ctx, iha_attention(tu_ctx, &s, &o, (iha_buffer){b[0], 0}, (iha_buffer){b[1], 0},
                                               (iha_buffer){b[2], 0}, (iha_buffer){b[3], 0}, (iha_buffer){NULL, 0}),
                         IHA_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(iha_context_message(tu_ctx), "scale"));
        tu_layer l;
        tu_layer_init(&l, &kLayer, 1950);
        float *z = tu_malloc(tu_count_x(&kLayer) * sizeof *z);
        const iha_host_weights w = {l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
        tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &kLayer, &o, &w, l.x, z), IHA_ERROR_INVALID_ARGUMENT);
        free(z);
        tu_layer_free(&l);
    }
    for (int i = 0; i < 4; i++) tu_buffer_release(b[i]);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layer_forward_f32),
        cmocka_unit_test(layer_forward_half),
        cmocka_unit_test(layer_backward_f32),
        cmocka_unit_test(decode_grid),
        cmocka_unit_test(attention_and_backward),
        cmocka_unit_test(attention_variants),
        cmocka_unit_test(overflowing_scores_are_not_zeros),
        cmocka_unit_test(overflowed_partial_sums_are_not_finite_rows),
        cmocka_unit_test(overflowed_partial_sums_every_variant),
        cmocka_unit_test(overflowed_lane_sums_are_not_finite_rows),
        cmocka_unit_test(huge_scales_are_not_garbage),
        cmocka_unit_test(unrepresentable_scale_is_refused),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
