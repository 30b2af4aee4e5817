/*
 * test_layer_backward.c - iha_backward, the whole layer's backward pass, against the float64
 * reference (itself checked against finite differences in test_reference.c): every gradient
 * within doc/spec.md's 1e-5 on ragged shapes, every mask, windows, rotary, P = 1 with the identity
 * shortcut, odd head widths and widths the tile kernels take; gradients asked for one at a
 * time; and the refusals, which must leave every output as it was. Then the saved pair,
 * iha_forward_save and iha_backward_saved: bit for bit iha_forward's z and iha_backward's
 * gradients, and their own refusals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "layer/workspace.h"
#include "runtime/context.h" /* the device's largest allocation, lowered below */
#include "test_layer.h"
#include "test_util.h"

#define OUT_OFFSET 3 /* floats of sentinel before each output */
#define OUT_GUARD 29 /* and after it */
#define OUT_SENTINEL (-7.0f)

enum { OUTPUTS = 9 }; /* dx, then the gradients in iha_layer_grads order */
static const char *const output_names[OUTPUTS] = {"dx",      "dwq",     "dwk",     "dwv", "dwo",
                                                  "dalpha_q", "dalpha_k", "dalpha_v", "dr"};

typedef struct lb_case {
    iha_shape s;
    int mask;
    int64_t window;
    int rope;
    int identity; /* P = 1: the NULL identity shortcut for alpha and r */
} lb_case;

static size_t output_count(const iha_shape *s, int i)
{
    return i == 0 ? tu_count_x(s) : i < 5 ? tu_count_w(s) : tu_count_mix(s);
}

/* Guarded NaN-filled output buffers for the outputs `want` selects (bit i: output i). */
static void outputs_new(const iha_shape *s, unsigned want, iha_buffer out[OUTPUTS])
{
    for (int i = 0; i < OUTPUTS; i++)
        out[i] = (iha_buffer){want >> i & 1u ? tu_buffer_guarded(tu_ctx, NULL, output_count(s, i), OUT_OFFSET,
                                                                 OUT_GUARD, OUT_SENTINEL)
                                             : NULL,
                              OUT_OFFSET};
}

static void outputs_release(iha_buffer out[OUTPUTS])
{
    for (int i = 0; i < OUTPUTS; i++) tu_buffer_release(out[i].mem);
}

static iha_layer_grads grads_of(const iha_buffer out[OUTPUTS])
{
    iha_layer_grads g = {out[1], out[2], out[3], out[4], out[5], out[6], out[7], out[8]};
    return g;
}

static iha_attention_options options_of(const lb_case *c) { return tu_options(c->mask, c->window, c->rope); }

/* The outputs `want` selects, against the reference; the others are not given. With want == 1
 * (dx alone) and null_grads, the call gets grads == NULL. */
static void run_case_grads(const lb_case *c, unsigned want, int null_grads, uint64_t seed)
{
    tu_layer l;
    tu_layer_init(&l, &c->s, seed);
    if (c->identity) tu_layer_identity(&l, 1);
    tu_device_layer d;
    tu_device_layer_upload(tu_ctx, &l, 1, &d);
    const size_t nx = tu_count_x(&c->s);
    tu_rng rng = tu_rng_seeded(seed + 1);
    float *dz = tu_random_array(&rng, nx, 1.0f);
    cl_mem bdz = tu_buffer_guarded(tu_ctx, dz, nx, 11, 0, 0.0f);
    iha_buffer out[OUTPUTS];
    outputs_new(&c->s, want, out);
    const iha_layer_grads g = grads_of(out);
    const iha_attention_options o = options_of(c);
    tu_assert_status(tu_ctx,
                     iha_backward(tu_ctx, &c->s, &o, &d.weights, d.x, (iha_buffer){bdz, 11}, out[0],
                                  null_grads ? NULL : &g),
                     IHA_OK);

    double *ref[OUTPUTS];
    for (int i = 0; i < OUTPUTS; i++) ref[i] = tu_malloc(output_count(&c->s, i) * sizeof(double));
    const ref_grads rg = {ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], ref[6], ref[7], ref[8]};
    const ref_problem p = tu_layer_problem(&l, &o);
    assert_int_equal(ref_backward(&p, dz, &rg), 0);
    for (int i = 0; i < OUTPUTS; i++) {
        if (out[i].mem != NULL) {
            const size_t n = output_count(&c->s, i);
            float *got = tu_malloc(n * sizeof *got);
            tu_buffer_read(tu_ctx, out[i].mem, OUT_OFFSET, got, n);
            tu_assert_close(output_names[i], got, ref[i], n, TU_TOL_F32);
            tu_assert_guard(tu_ctx, out[i].mem, n, OUT_OFFSET, OUT_GUARD, OUT_SENTINEL);
            free(got);
        }
        free(ref[i]);
    }
    outputs_release(out);
    tu_buffer_release(bdz);
    free(dz);
    tu_device_layer_release(&d);
    tu_layer_free(&l);
}

static void run_case(const lb_case *c, unsigned want, uint64_t seed) { run_case_grads(c, want, 0, seed); }

#define ALL ((1u << OUTPUTS) - 1u)

/* Ragged shapes: each mask, windows, rotary, P = 1 with the identity shortcut, widths 1 and
 * odd, widths 16 divides and a partial last chunk of the attention backward's tile kernels
 * (CPUs run them for every width), and more tokens than one partial sum of the mixing
 * gradients. */
static const lb_case kCases[] = {
    {{2, 5, 12, 2, 8, 3}, IHA_MASK_CAUSAL, 0, 1, 0},
    {{1, 7, 9, 3, 5, 2}, IHA_MASK_TOKEN_CAUSAL, 3, 0, 0},
    {{1, 6, 10, 2, 6, 2}, IHA_MASK_NONE, 2, 1, 0},
    {{2, 9, 16, 2, 16, 1}, IHA_MASK_CAUSAL, 0, 1, 1},
    {{1, 11, 7, 1, 1, 4}, IHA_MASK_CAUSAL, 2, 0, 0},
    {{1, 19, 40, 2, 32, 2}, IHA_MASK_CAUSAL, 5, 1, 0},
    {{1, 24, 64, 1, 64, 3}, IHA_MASK_TOKEN_CAUSAL, 0, 0, 0},
    {{1, 5, 6, 3, 7, 1}, IHA_MASK_NONE, 0, 0, 1},
    /* more than one 32-token partial sum of the mixing gradients, and partial last chunks
     * of the attention backward's tiles (20 = 16 + 4) */
    {{3, 23, 12, 2, 8, 3}, IHA_MASK_TOKEN_CAUSAL, 4, 1, 0},
    {{2, 37, 16, 2, 20, 2}, IHA_MASK_CAUSAL, 0, 1, 0},
};

/* Every gradient on every case. */
static void gradients_against_reference(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; i++) run_case(&kCases[i], ALL, 300 + i);
}

/* Each output asked for alone (and the others NULL, grads NULL for dx alone), and a selection
 * without dx. */
static void gradients_one_at_a_time(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const lb_case c = {{1, 6, 8, 2, 4, 2}, IHA_MASK_CAUSAL, 0, 1, 0};
    for (int i = 0; i < OUTPUTS; i++) run_case(&c, 1u << i, 400 + (uint64_t)i);
    run_case(&c, (1u << 4) | (1u << 8) | (1u << 5), 420);
}

/* grads == NULL: only dx, against the reference. */
static void null_grads_gives_dx(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const lb_case c = {{1, 4, 6, 2, 4, 2}, IHA_MASK_CAUSAL, 0, 0, 0};
    run_case_grads(&c, 1u, 1, 77);
}

/* Every refusal leaves every output bit for bit as it was (NaN inside, sentinels around). */
static void assert_untouched(const iha_shape *s, const iha_buffer out[OUTPUTS])
{
    for (int i = 0; i < OUTPUTS; i++) {
        if (out[i].mem == NULL) continue;
        const size_t n = output_count(s, i);
        float *got = tu_malloc(n * sizeof *got);
        tu_buffer_read(tu_ctx, out[i].mem, OUT_OFFSET, got, n);
        assert_int_equal(tu_count_nonfinite(got, n), n);
        tu_assert_guard(tu_ctx, out[i].mem, n, OUT_OFFSET, OUT_GUARD, OUT_SENTINEL);
        free(got);
    }
}

/* The refusal tests' setting: a small layer on the device, every output NaN-filled inside
 * guards (fixture_init skips the test without a device). fixture_free checks that nothing was
 * written, then releases it all. */
typedef struct refusal_fixture {
    iha_shape s;
    tu_layer l;
    tu_device_layer d;
    iha_buffer out[OUTPUTS];
    iha_layer_grads g;
} refusal_fixture;

static void fixture_init(refusal_fixture *f, iha_shape s, uint64_t seed)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    f->s = s;
    tu_layer_init(&f->l, &f->s, seed);
    tu_device_layer_upload(tu_ctx, &f->l, 0, &f->d);
    outputs_new(&f->s, ALL, f->out);
    f->g = grads_of(f->out);
}

static void fixture_free(refusal_fixture *f)
{
    assert_untouched(&f->s, f->out);
    outputs_release(f->out);
    tu_device_layer_release(&f->d);
    tu_layer_free(&f->l);
}

static void refusals(void **state)
{
    (void)state;
    refusal_fixture f;
    fixture_init(&f, (iha_shape){1, 4, 6, 2, 4, 2}, 91);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    const iha_buffer dz = f.d.x; /* any float tensor of x's shape */

    /* An unknown storage. */
    o.storage = 7;
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, dz, f.out[0], &f.g), IHA_ERROR_INVALID_ARGUMENT);
    o.storage = IHA_STORAGE_F32;
    /* Rotary with an odd width, and the identity shortcut with P > 1. */
    const iha_shape odd = {1, 4, 6, 2, 3, 2};
    o.rope = 1;
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &odd, &o, &f.d.weights, f.d.x, dz, f.out[0], &f.g),
                     IHA_ERROR_INVALID_ARGUMENT);
    o.rope = 0;
    iha_layer_weights none = f.d.weights;
    none.alpha_q.mem = none.alpha_k.mem = none.alpha_v.mem = none.r.mem = NULL;
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, &none, f.d.x, dz, f.out[0], &f.g), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, NULL, f.d.x, dz, f.out[0], &f.g), IHA_ERROR_INVALID_ARGUMENT);
    /* Outputs overlapping x, dz, a weight, or each other; an output too small. */
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, dz, f.d.x, &f.g), IHA_ERROR_INVALID_ARGUMENT);
    const iha_buffer dz2 = f.d.z; /* a second tensor of x's shape, so that dx can overlap dz alone */
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, dz2, dz2, &f.g), IHA_ERROR_INVALID_ARGUMENT);
    iha_layer_grads onto_mixing = f.g;
    onto_mixing.r = f.d.weights.alpha_v;
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, dz, f.out[0], &onto_mixing),
                     IHA_ERROR_INVALID_ARGUMENT);
    iha_layer_grads bad = f.g;
    bad.wo = f.d.weights.wq;
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, dz, f.out[0], &bad),
                     IHA_ERROR_INVALID_ARGUMENT);
    bad = f.g;
    bad.alpha_k = f.out[5]; /* the same buffer as alpha_q's gradient */
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, dz, f.out[0], &bad),
                     IHA_ERROR_INVALID_ARGUMENT);
    bad = f.g;
    bad.r = (iha_buffer){f.out[8].mem, OUT_OFFSET + OUT_GUARD + 1}; /* ends one float past the buffer */
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, dz, f.out[0], &bad),
                     IHA_ERROR_BUFFER_TOO_SMALL);
    /* x or dz missing. */
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, &f.d.weights, (iha_buffer){NULL, 0}, dz, f.out[0], &f.g),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, (iha_buffer){NULL, 0}, f.out[0], &f.g),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(NULL, iha_backward(NULL, &f.s, &o, &f.d.weights, f.d.x, dz, f.out[0], &f.g), IHA_ERROR_INVALID_ARGUMENT);
    fixture_free(&f);
}

/* Reads n floats of a guarded buffer at `offset` into a malloc'ed array after checking its guards. */
static float *read_guarded(cl_mem mem, size_t n, size_t offset)
{
    float *got = tu_malloc(n * sizeof *got);
    tu_buffer_read(tu_ctx, mem, offset, got, n);
    tu_assert_guard(tu_ctx, mem, n, offset, OUT_GUARD, OUT_SENTINEL);
    return got;
}

/* iha_forward_save then iha_backward_saved against iha_forward then iha_backward on the same
 * inputs: z and every output bit for bit, since both pairs run the same kernels on the same
 * values and differ only in where O and its log-sum-exp come from (iha_backward's own outputs
 * are checked against the float64 reference above, on these shapes among others). */
static void run_saved_case(const lb_case *c, uint64_t seed)
{
    tu_layer l;
    tu_layer_init(&l, &c->s, seed);
    if (c->identity) tu_layer_identity(&l, 1);
    tu_device_layer d;
    tu_device_layer_upload(tu_ctx, &l, 1, &d);
    const size_t nx = tu_count_x(&c->s), virt = tu_count_virtual(&c->s);
    tu_rng rng = tu_rng_seeded(seed + 1);
    float *dz = tu_random_array(&rng, nx, 1.0f);
    cl_mem bdz = tu_buffer_guarded(tu_ctx, dz, nx, 11, 0, 0.0f);
    const iha_attention_options o = options_of(c);

    size_t ns = 0;
    tu_assert_status(tu_ctx, iha_saved_elements(tu_ctx, &c->s, &ns), IHA_OK);
    assert_int_equal(ns, virt + virt / c->s.head_dim); /* O and one log-sum-exp per row */
    cl_mem saved = tu_buffer_guarded(tu_ctx, NULL, ns, 5, OUT_GUARD, OUT_SENTINEL);
    cl_mem z2 = tu_buffer_guarded(tu_ctx, NULL, nx, OUT_OFFSET, OUT_GUARD, OUT_SENTINEL);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &c->s, &o, &d.weights, d.x, d.z), IHA_OK);
    tu_assert_status(tu_ctx,
                     iha_forward_save(tu_ctx, &c->s, &o, &d.weights, d.x, (iha_buffer){z2, OUT_OFFSET},
                                      (iha_buffer){saved, 5}),
                     IHA_OK);
    float *z_plain = tu_malloc(nx * sizeof *z_plain), *z_saved = read_guarded(z2, nx, OUT_OFFSET);
    tu_buffer_read(tu_ctx, d.z.mem, d.z.offset, z_plain, nx);
    assert_memory_equal(z_plain, z_saved, nx * sizeof *z_plain);
    free(read_guarded(saved, ns, 5)); /* only the guards: the layout is the library's */

    iha_buffer plain[OUTPUTS], from_saved[OUTPUTS];
    outputs_new(&c->s, ALL, plain);
    outputs_new(&c->s, ALL, from_saved);
    const iha_layer_grads gp = grads_of(plain), gs = grads_of(from_saved);
    const iha_buffer bz = {bdz, 11};
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &c->s, &o, &d.weights, d.x, bz, plain[0], &gp), IHA_OK);
    tu_assert_status(tu_ctx,
                     iha_backward_saved(tu_ctx, &c->s, &o, &d.weights, d.x, (iha_buffer){saved, 5}, bz,
                                        from_saved[0], &gs),
                     IHA_OK);
    for (int i = 0; i < OUTPUTS; i++) {
        const size_t n = output_count(&c->s, i);
        float *a = read_guarded(plain[i].mem, n, OUT_OFFSET), *b = read_guarded(from_saved[i].mem, n, OUT_OFFSET);
        if (memcmp(a, b, n * sizeof *a) != 0) fail_msg("%s: iha_backward_saved differs from iha_backward", output_names[i]);
        free(a);
        free(b);
    }
    /* The state is read, not recomputed: zeroed, it changes dx. */
    float *zeros = calloc(ns, sizeof *zeros);
    assert_non_null(zeros);
    tu_buffer_write(tu_ctx, saved, 5, zeros, ns);
    tu_assert_status(tu_ctx,
                     iha_backward_saved(tu_ctx, &c->s, &o, &d.weights, d.x, (iha_buffer){saved, 5}, bz,
                                        from_saved[0], NULL),
                     IHA_OK);
    float *a = read_guarded(plain[0].mem, nx, OUT_OFFSET), *b = read_guarded(from_saved[0].mem, nx, OUT_OFFSET);
    if (memcmp(a, b, nx * sizeof *a) == 0) fail_msg("iha_backward_saved gave the same dx from a zeroed state");
    free(a);
    free(b);
    free(zeros);
    outputs_release(plain);
    outputs_release(from_saved);
    free(z_plain);
    free(z_saved);
    tu_buffer_release(saved);
    tu_buffer_release(z2);
    tu_buffer_release(bdz);
    free(dz);
    tu_device_layer_release(&d);
    tu_layer_free(&l);
}

/* Four of the cases above: rotary, a window, the identity shortcut, and partial chunks of the
 * backward's tiles. */
static void saved_pair_matches(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const size_t picks[] = {0, 1, 3, 9};
    for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++) run_saved_case(&kCases[picks[i]], 500 + i);
}

/* Every refusal of the saved pair leaves z, saved and every output as they were. */
static void saved_pair_refusals(void **state)
{
    (void)state;
    refusal_fixture f;
    fixture_init(&f, (iha_shape){1, 4, 6, 2, 4, 2}, 93);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    const size_t nx = tu_count_x(&f.s);
    size_t ns = 0;
    tu_assert_status(NULL, iha_saved_elements(NULL, &f.s, &ns), IHA_OK);
    cl_mem bsaved = tu_buffer_guarded(tu_ctx, NULL, ns, OUT_OFFSET, OUT_GUARD, OUT_SENTINEL);
    cl_mem bz = tu_buffer_guarded(tu_ctx, NULL, nx, OUT_OFFSET, OUT_GUARD, OUT_SENTINEL);
    const iha_buffer saved = {bsaved, OUT_OFFSET}, z = {bz, OUT_OFFSET}, none = {NULL, 0};
    const iha_buffer dz = f.d.x; /* any float tensor of x's shape */

    /* An unknown weight storage. */
    o.weight_storage = -1;
    tu_assert_status(tu_ctx, iha_forward_save(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, z, saved), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_backward_saved(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, saved, dz, f.out[0], &f.g),
                     IHA_ERROR_INVALID_ARGUMENT);
    o.weight_storage = IHA_STORAGE_F32;
    /* No saved buffer, or one a float too small (it ends one float past its buffer). */
    tu_assert_status(tu_ctx, iha_forward_save(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, z, none), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_backward_saved(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, none, dz, f.out[0], &f.g),
                     IHA_ERROR_INVALID_ARGUMENT);
    const iha_buffer short_saved = {bsaved, OUT_OFFSET + OUT_GUARD + 1};
    tu_assert_status(tu_ctx, iha_forward_save(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, z, short_saved),
                     IHA_ERROR_BUFFER_TOO_SMALL);
    tu_assert_status(tu_ctx, iha_backward_saved(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, short_saved, dz, f.out[0], &f.g),
                     IHA_ERROR_BUFFER_TOO_SMALL);
    /* saved overlapping z, dz, x, a weight or an output. */
    const iha_buffer in_saved = {bsaved, OUT_OFFSET + 1};
    tu_assert_status(tu_ctx, iha_forward_save(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, in_saved, saved),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_backward_saved(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, saved, in_saved, f.out[0], &f.g),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_backward_saved(tu_ctx, &f.s, &o, &f.d.weights, in_saved, saved, dz, f.out[0], &f.g),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_backward_saved(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, saved, dz, in_saved, &f.g),
                     IHA_ERROR_INVALID_ARGUMENT);
    iha_layer_grads bad = f.g;
    bad.alpha_v = in_saved;
    tu_assert_status(tu_ctx, iha_backward_saved(tu_ctx, &f.s, &o, &f.d.weights, f.d.x, saved, dz, f.out[0], &bad),
                     IHA_ERROR_INVALID_ARGUMENT);
    iha_layer_weights onto_saved = f.d.weights;
    onto_saved.wo = in_saved;
    tu_assert_status(tu_ctx, iha_forward_save(tu_ctx, &f.s, &o, &onto_saved, f.d.x, z, saved), IHA_ERROR_INVALID_ARGUMENT);
    assert_untouched(&f.s, f.out);
    float *zs = read_guarded(bz, nx, OUT_OFFSET), *ss = read_guarded(bsaved, ns, OUT_OFFSET);
    assert_int_equal(tu_count_nonfinite(zs, nx), nx);
    assert_int_equal(tu_count_nonfinite(ss, ns), ns);
    free(zs);
    free(ss);

    /* iha_saved_elements: the count, and the shapes a layer call refuses. */
    const iha_shape zero = {1, 0, 6, 2, 4, 2}, huge = {SIZE_MAX / 2, 4, 6, 2, 4, 2};
    assert_int_equal(ns, 2 * 8 * 4 + 2 * 8);
    tu_assert_status(NULL, iha_saved_elements(NULL, &zero, &ns), IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(ns, 0);
    tu_assert_status(NULL, iha_saved_elements(NULL, &huge, &ns), IHA_ERROR_SIZE_OVERFLOW);
    tu_assert_status(tu_ctx, iha_saved_elements(tu_ctx, NULL, &ns), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_saved_elements(tu_ctx, &f.s, NULL), IHA_ERROR_INVALID_ARGUMENT);
    tu_buffer_release(bsaved);
    tu_buffer_release(bz);
    fixture_free(&f);
}

/* A device that cannot hold one of the attention backward's packed copies (on CPUs; T = 15 rows
 * pad to 16 there, one block more than any other buffer's) refuses the call before anything is
 * written, although the forward's packed keys already have a buffer large enough. */
static void device_memory_refused_before_writing(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    if (tu_ctx->info.is_gpu) skip(); /* GPUs run the row kernels, which pack nothing */
    refusal_fixture f;
    fixture_init(&f, (iha_shape){1, 5, 6, 2, 4, 3}, 92);
    const iha_shape s = f.s;
    const tu_device_layer d = f.d;
    iha_buffer *out = f.out;
    const iha_layer_grads g = f.g;
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    const size_t virt = tu_count_virtual(&s), packed = 2 * 16 * 4; /* B*H*16*d */
    iha_context_trim(tu_ctx);
    cl_mem keys;
    tu_assert_status(tu_ctx, iha__workspace_get(tu_ctx, IHA_WS_KT, packed * sizeof(float), &keys), IHA_OK);
    const cl_ulong keep = tu_ctx->info.max_alloc_bytes;
    tu_ctx->info.max_alloc_bytes = virt * sizeof(float);
    const iha_status st = iha_backward(tu_ctx, &s, &o, &d.weights, d.x, d.x, out[0], &g);
    tu_ctx->info.max_alloc_bytes = keep;
    tu_assert_status(tu_ctx, st, IHA_ERROR_DEVICE_MEMORY);
    fixture_free(&f);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gradients_against_reference),
        cmocka_unit_test(gradients_one_at_a_time),
        cmocka_unit_test(null_grads_gives_dx),
        cmocka_unit_test(refusals),
        cmocka_unit_test(device_memory_refused_before_writing),
        cmocka_unit_test(saved_pair_matches),
        cmocka_unit_test(saved_pair_refusals),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
