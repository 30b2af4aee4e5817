/*
 * test_multi_layer.c - iha_multi_backward (include/iha_multi.h): the layer's backward over a
 * sequence split across 1, 2 and 3 contexts on the one PoCL device (10 tokens: N not divisible
 * by 3), every mask, rotary at the parts' global positions, a window spanning parts, B = 2;
 * each part's dx and every context's summed weight gradients against iha_backward on one
 * context and the float64 reference (ref_backward); accumulate into prefilled outputs (a
 * different prefill per context); some gradients only, differing between the parts, and a part
 * without dx; refusals with nothing written and the message in the right context.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "iha_multi.h"
#include "reference.h"
#include "test_layer.h"
#include "test_contexts.h"
#include "test_util.h"

#define GRADS 8

static iha_buffer at(cl_mem m) { return (iha_buffer){m, m != NULL ? OFFSET : 0}; }

static size_t grad_elems(const iha_shape *s, int k) { return k < 4 ? tu_count_w(s) : tu_count_mix(s); }

static iha_layer_grads as_grads(const iha_buffer b[GRADS])
{
    return (iha_layer_grads){b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]};
}

/* Rows first .. first+count-1 of each batch row of x [B][N][D], to or from a [B][count][D] part. */
static void copy_tokens(float *whole, float *part, size_t B, size_t N, size_t D, size_t first, size_t count, int out)
{
    for (size_t b = 0; b < B; ++b) {
        float *a = whole + (b * N + first) * D, *p = part + b * count * D;
        memcpy(out ? a : p, out ? p : a, count * D * sizeof(float));
    }
}

static double *plus(const double *a, const float *b, size_t n)
{
    double *r = tu_malloc(n * sizeof *r);
    for (size_t i = 0; i < n; ++i) r[i] = a[i] + (b != NULL ? b[i] : 0.0f);
    return r;
}

static double *widen(const float *a, size_t n)
{
    double *r = tu_malloc(n * sizeof *r);
    for (size_t i = 0; i < n; ++i) r[i] = a[i];
    return r;
}

/* One case: `ask[i]` is part i's gradients as bits in iha_layer_grads order, `dx_parts` the
 * parts that ask for dx (bits). */
typedef struct layer_case {
    size_t R;
    int mask;
    int64_t window;
    int rope, accumulate;
    unsigned ask[MAX_R], dx_parts;
} layer_case;

static void run_case(const iha_shape *s, const layer_case *c, uint64_t seed)
{
    const size_t B = s->batch, N = s->tokens, D = s->model_dim, nx = tu_count_x(s), R = c->R;
    iha_attention_options o = tu_options(c->mask, c->window, c->rope);
    o.accumulate = c->accumulate;
    tu_layer l;
    tu_layer_init(&l, s, seed);
    tu_rng rng = tu_rng_seeded(seed + 1);
    float *dz = tu_random_array(&rng, nx, 1.0f);

    /* The float64 reference and iha_backward on one context (nothing prefilled). */
    double *ref[1 + GRADS];
    ref[0] = tu_malloc(nx * sizeof(double));
    for (int k = 0; k < GRADS; ++k) ref[1 + k] = tu_malloc(grad_elems(s, k) * sizeof(double));
    const ref_grads rg = {ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], ref[6], ref[7], ref[8]};
    iha_attention_options plain = o;
    plain.accumulate = 0;
    const ref_problem rp = tu_layer_problem(&l, &plain);
    assert_int_equal(ref_backward(&rp, dz, &rg), 0);
    tu_device_layer one;
    tu_device_layer_upload(tu_ctx, &l, 0, &one);
    const iha_buffer dz1 = {tu_buffer_guarded(tu_ctx, dz, nx, 0, GUARD, SENTINEL), 0};
    const iha_buffer dx1 = {tu_buffer_guarded(tu_ctx, NULL, nx, 0, GUARD, SENTINEL), 0};
    iha_buffer g1[GRADS];
    for (int k = 0; k < GRADS; ++k)
        g1[k] = (iha_buffer){tu_buffer_guarded(tu_ctx, NULL, grad_elems(s, k), 0, GUARD, SENTINEL), 0};
    const iha_layer_grads gg1 = as_grads(g1);
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, s, &plain, &one.weights, one.x, dz1, dx1, &gg1), IHA_OK);
    float *single[1 + GRADS];
    single[0] = tu_malloc(nx * sizeof(float));
    tu_buffer_read(tu_ctx, dx1.mem, 0, single[0], nx);
    for (int k = 0; k < GRADS; ++k) {
        single[1 + k] = tu_malloc(grad_elems(s, k) * sizeof(float));
        tu_buffer_read(tu_ctx, g1[k].mem, 0, single[1 + k], grad_elems(s, k));
    }

    /* The parts, each output prefilled (accumulate) or NaN. */
    tu_device_layer dev[MAX_R];
    iha_layer_weights w[MAX_R];
    iha_buffer x[MAX_R], bdz[MAX_R], dx[MAX_R], g[MAX_R][GRADS];
    iha_layer_grads grads[MAX_R];
    size_t first[MAX_R], count[MAX_R];
    float *pre_dx = tu_random_array(&rng, nx, 0.5f), *pre_g[MAX_R][GRADS];
    float *tmp = tu_malloc(nx * sizeof(float));
    for (size_t i = 0; i < R; ++i) {
        tu_device_layer_upload(ctxs[i], &l, 0, &dev[i]);
        w[i] = dev[i].weights;
        iha_multi_split(N, R, i, &first[i], &count[i]);
        const size_t n = B * count[i] * D;
        copy_tokens(l.x, tmp, B, N, D, first[i], count[i], 0);
        x[i] = at(tu_buffer_guarded(ctxs[i], tmp, n, OFFSET, GUARD, SENTINEL));
        copy_tokens(dz, tmp, B, N, D, first[i], count[i], 0);
        bdz[i] = at(tu_buffer_guarded(ctxs[i], tmp, n, OFFSET, GUARD, SENTINEL));
        copy_tokens(pre_dx, tmp, B, N, D, first[i], count[i], 0);
        dx[i] =
            at(c->dx_parts >> i & 1 ? tu_buffer_guarded(ctxs[i], c->accumulate ? tmp : NULL, n, OFFSET, GUARD, SENTINEL)
                                    : NULL);
        for (int k = 0; k < GRADS; ++k) {
            pre_g[i][k] = tu_random_array(&rng, grad_elems(s, k), 0.5f);
            g[i][k] = at(c->ask[i] >> k & 1 ? tu_buffer_guarded(ctxs[i], c->accumulate ? pre_g[i][k] : NULL,
                                                                grad_elems(s, k), OFFSET, GUARD, SENTINEL)
                                            : NULL);
        }
        grads[i] = as_grads(g[i]);
    }
    tu_assert_status(ctxs[0], iha_multi_backward(ctxs, R, s, &o, w, x, bdz, dx, grads), IHA_OK);

    /* dx: the parts' rows together, against iha_backward's and the reference's. */
    if (c->dx_parts == (1u << R) - 1) {
        float *got = tu_malloc(nx * sizeof(float));
        for (size_t i = 0; i < R; ++i) {
            const size_t n = B * count[i] * D;
            tu_buffer_read(ctxs[i], dx[i].mem, OFFSET, tmp, n);
            tu_assert_guard(ctxs[i], dx[i].mem, n, OFFSET, GUARD, SENTINEL);
            copy_tokens(got, tmp, B, N, D, first[i], count[i], 1);
        }
        double *want = plus(ref[0], c->accumulate ? pre_dx : NULL, nx);
        tu_assert_close("dx against the reference", got, want, nx, TU_TOL_F32);
        free(want);
        double *s1 = widen(single[0], nx);
        for (size_t e = 0; e < nx && c->accumulate; ++e) s1[e] += pre_dx[e];
        tu_assert_close("dx against iha_backward", got, s1, nx, 1e-6);
        free(s1);
        free(got);
    } else
        /* Only some parts ask: each asking part's rows against the reference's rows. */
        for (size_t i = 0; i < R; ++i) {
            if (dx[i].mem == NULL) continue;
            const size_t n = B * count[i] * D;
            tu_buffer_read(ctxs[i], dx[i].mem, OFFSET, tmp, n);
            tu_assert_guard(ctxs[i], dx[i].mem, n, OFFSET, GUARD, SENTINEL);
            double *want = tu_malloc(n * sizeof(double));
            for (size_t b = 0; b < B; ++b)
                for (size_t e = 0; e < count[i] * D; ++e) {
                    const size_t from = (b * N + first[i]) * D + e;
                    want[b * count[i] * D + e] = ref[0][from] + (c->accumulate ? pre_dx[from] : 0.0f);
                }
            tu_assert_close("an asking part's dx against the reference", tmp, want, n, TU_TOL_F32);
            free(want);
        }
    /* Every asked-for gradient on every context: the whole sequence's sum (plus its prefill);
     * without accumulate the same floats on every context. */
    for (int k = 0; k < GRADS; ++k) {
        const size_t n = grad_elems(s, k);
        float *got = tu_malloc(n * sizeof(float)), *seen = NULL;
        for (size_t i = 0; i < R; ++i) {
            if (g[i][k].mem == NULL) continue;
            tu_buffer_read(ctxs[i], g[i][k].mem, OFFSET, got, n);
            tu_assert_guard(ctxs[i], g[i][k].mem, n, OFFSET, GUARD, SENTINEL);
            double *want = plus(ref[1 + k], c->accumulate ? pre_g[i][k] : NULL, n);
            tu_assert_close("a gradient against the reference", got, want, n, TU_TOL_F32);
            free(want);
            double *s1 = widen(single[1 + k], n);
            for (size_t e = 0; e < n && c->accumulate; ++e) s1[e] += pre_g[i][k][e];
            tu_assert_close("a gradient against iha_backward", got, s1, n, 1e-5);
            free(s1);
            if (!c->accumulate) {
                if (seen == NULL) {
                    seen = tu_malloc(n * sizeof(float));
                    memcpy(seen, got, n * sizeof(float));
                } else
                    assert_memory_equal(seen, got, n * sizeof(float));
            }
        }
        free(seen);
        free(got);
    }

    for (size_t i = 0; i < R; ++i) {
        tu_device_layer_release(&dev[i]);
        tu_buffer_release(x[i].mem), tu_buffer_release(bdz[i].mem), tu_buffer_release(dx[i].mem);
        for (int k = 0; k < GRADS; ++k) tu_buffer_release(g[i][k].mem), free(pre_g[i][k]);
    }
    tu_device_layer_release(&one);
    tu_buffer_release(dz1.mem), tu_buffer_release(dx1.mem);
    for (int k = 0; k < GRADS; ++k) tu_buffer_release(g1[k].mem);
    for (int k = 0; k < 1 + GRADS; ++k) free(ref[k]), free(single[k]);
    tu_layer_free(&l);
    free(dz), free(pre_dx), free(tmp);
}

static const iha_shape layer_shape = {2, 10, 16, 2, 8, 2}; /* one shape: one set of kernels to build */

/* 1 to 3 contexts, every mask, rotary, a window of 2 tokens spanning parts; every output. */
static void backward_equals_backward(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t R = 1; R <= MAX_R; ++R)
        for (int mask = 0; mask < 3; ++mask) {
            const layer_case c = {R, mask, mask == 1 ? 2 : 0, mask != 2, 0, {0xff, 0xff, 0xff}, 7};
            run_case(&layer_shape, &c, 1000 + R * 3 + (uint64_t)mask);
        }
}

/* Accumulate into prefilled outputs, a different prefill per context; then some gradients only
 * (differing between the parts, one part asking for none) and a part without dx. */
static void accumulate_and_some_outputs(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const layer_case acc = {3, IHA_MASK_CAUSAL, 0, 1, 1, {0xff, 0xff, 0xff}, 7};
    run_case(&layer_shape, &acc, 1100);
    const layer_case acc2 = {2, IHA_MASK_TOKEN_CAUSAL, 1, 0, 1, {0xff, 0xff, 0xff}, 3};
    run_case(&layer_shape, &acc2, 1101);
    const layer_case some = {3, IHA_MASK_CAUSAL, 2, 1, 0, {0x81, 0x10, 0x00}, 5};
    run_case(&layer_shape, &some, 1102);
    const layer_case grads_only = {2, IHA_MASK_NONE, 0, 1, 1, {0x0f, 0xf0, 0}, 0};
    run_case(&layer_shape, &grads_only, 1103);
}

/* Each refusal leaves every output untouched and says why in the context it concerns. */
static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 6, 16, 2, 8, 2};
    const size_t R = 2, nx = 3 * 16;
    tu_layer l;
    tu_layer_init(&l, &s, 77);
    tu_device_layer dev[2];
    iha_layer_weights w[2];
    iha_buffer x[2], dz[2], dx[2], g[2][GRADS];
    iha_layer_grads grads[2];
    float *fill = tu_malloc(tu_count_w(&s) * sizeof(float));
    tu_fill_value(fill, tu_count_w(&s), 3.0f);
    for (size_t i = 0; i < R; ++i) {
        tu_device_layer_upload(ctxs[i], &l, 0, &dev[i]);
        w[i] = dev[i].weights;
        x[i] = at(tu_buffer_guarded(ctxs[i], l.x, nx, OFFSET, GUARD, SENTINEL));
        dz[i] = at(tu_buffer_guarded(ctxs[i], l.x, nx, OFFSET, GUARD, SENTINEL));
        dx[i] = at(tu_buffer_guarded(ctxs[i], fill, nx, OFFSET, GUARD, SENTINEL));
        for (int k = 0; k < GRADS; ++k)
            g[i][k] = at(tu_buffer_guarded(ctxs[i], fill, grad_elems(&s, k), OFFSET, GUARD, SENTINEL));
        grads[i] = as_grads(g[i]);
    }
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    /* A gradient too small on part 1. */
    iha_layer_grads bad[2] = {grads[0], grads[1]};
    bad[1].r.offset = OFFSET + GUARD + 1;
    tu_assert_status(ctxs[1], iha_multi_backward(ctxs, R, &s, &o, w, x, dz, dx, bad), IHA_ERROR_BUFFER_TOO_SMALL);
    assert_true(tu_contains_nocase(iha_context_message(ctxs[1]), "contexts[1]"));
    assert_true(tu_contains_nocase(iha_context_message(ctxs[1]), "grads[1].r"));
    assert_string_equal(iha_context_message(ctxs[0]), "");
    /* A gradient overlapping dx of its part. */
    memcpy(bad, grads, sizeof bad);
    bad[0].alpha_q = dx[0];
    tu_assert_status(ctxs[0], iha_multi_backward(ctxs, R, &s, &o, w, x, dz, dx, bad), IHA_ERROR_INVALID_ARGUMENT);
    assert_true(tu_contains_nocase(iha_context_message(ctxs[0]), "contexts[0]"));
    /* dx of part 1 on part 0's context. */
    iha_buffer wrong[2] = {dx[0], x[0]};
    tu_assert_status(ctxs[1], iha_multi_backward(ctxs, R, &s, &o, w, x, dz, wrong, grads), IHA_ERROR_INVALID_ARGUMENT);
    assert_true(tu_contains_nocase(iha_context_message(ctxs[1]), "contexts[1]"));
    /* dx overlapping a weight. */
    iha_buffer on_weight[2] = {dx[0], w[1].wq};
    tu_assert_status(ctxs[1], iha_multi_backward(ctxs, R, &s, &o, w, x, dz, on_weight, grads),
                     IHA_ERROR_INVALID_ARGUMENT);
    /* The common arguments: in every context. */
    tu_assert_status(ctxs[0], iha_multi_backward(ctxs, R, &s, &o, w, x, NULL, dx, grads), IHA_ERROR_INVALID_ARGUMENT);
    assert_true(tu_contains_nocase(iha_context_message(ctxs[1]), "dz"));
    iha_attention_options half = o;
    half.weight_storage = IHA_STORAGE_F16;
    tu_assert_status(ctxs[0], iha_multi_backward(ctxs, R, &s, &half, w, x, dz, dx, grads), IHA_ERROR_UNSUPPORTED);
    assert_true(tu_contains_nocase(iha_context_message(ctxs[1]), "weight_storage"));
    iha_shape big = s;
    big.tokens = 1;
    tu_assert_status(ctxs[1], iha_multi_backward(ctxs, R, &big, &o, w, x, dz, dx, grads), IHA_ERROR_INVALID_ARGUMENT);
    iha_context *twice[2] = {ctxs[0], ctxs[0]};
    tu_assert_status(ctxs[0], iha_multi_backward(twice, R, &s, &o, w, x, dz, dx, grads), IHA_ERROR_INVALID_ARGUMENT);
    /* Nothing written by any refusal. */
    for (size_t i = 0; i < R; ++i) {
        tu_assert_buffer_all(ctxs[i], dx[i].mem, OFFSET, nx, 3.0f);
        for (int k = 0; k < GRADS; ++k) tu_assert_buffer_all(ctxs[i], g[i][k].mem, OFFSET, grad_elems(&s, k), 3.0f);
    }
    /* The same arguments without the fault succeed. */
    tu_assert_status(ctxs[0], iha_multi_backward(ctxs, R, &s, &o, w, x, dz, dx, grads), IHA_OK);
    for (size_t i = 0; i < R; ++i) {
        tu_device_layer_release(&dev[i]);
        tu_buffer_release(x[i].mem), tu_buffer_release(dz[i].mem), tu_buffer_release(dx[i].mem);
        for (int k = 0; k < GRADS; ++k) tu_buffer_release(g[i][k].mem);
    }
    tu_layer_free(&l);
    free(fill);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(backward_equals_backward),
        cmocka_unit_test(accumulate_and_some_outputs),
        cmocka_unit_test(refusals),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], setup, teardown);
}
