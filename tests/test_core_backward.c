/*
 * test_core_backward.c - iha_attention_core_backward, the backward pass of the layer's core,
 * against the float64 reference (itself checked here against central differences of
 * ref_attention_core): every gradient within doc/spec.md's 1e-5 under every mask, windows,
 * rotary, P = 1 with the identity shortcut, ragged and odd head widths, packed sequences; half
 * and bfloat16 storage within their contracts; outputs left out (mem NULL, grads NULL); and the refusals (a device
 * too small among them), which must leave every output as it was.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "runtime/context.h" /* the device's largest allocation, lowered below */
#include "test_layer.h"
#include "test_util.h"

#define TOL_F16 2e-3  /* doc/spec.md: half storage, float accumulation */
#define TOL_BF16 1e-2 /* and bfloat16 storage */
#define GUARD 19     /* elements of sentinel after each tensor */
#define SENTINEL (-7.0f)

enum { INPUTS = 4, OUTPUTS = 7, MIX = 4 }; /* q, k, v, dy; dq, dk, dv, then the mixing gradients */
static const char *const out_names[OUTPUTS] = {"dq", "dk", "dv", "dalpha_q", "dalpha_k", "dalpha_v", "dr"};

typedef struct core_case {
    iha_shape s; /* model_dim unused */
    int mask;
    int64_t window;
    int rope;
    int identity; /* P = 1: the NULL identity shortcut for alpha and r */
} core_case;

/* A core problem on the host: q, k, v, dy [B][N][H][d] and the mixing arrays (NULL: identity). */
typedef struct core_data {
    iha_shape s;
    float *in[INPUTS];
    float *mix[MIX];
} core_data;

static size_t out_count(const iha_shape *s, int i) { return i < 3 ? tu_count_heads(s) : tu_count_mix(s); }

static void data_init(core_data *c, const iha_shape *s, int identity, uint64_t seed)
{
    c->s = *s;
    tu_rng rng = tu_rng_seeded(seed);
    for (int i = 0; i < INPUTS; i++) c->in[i] = tu_random_array(&rng, tu_count_heads(s), 1.0f);
    for (int i = 0; i < MIX; i++)
        c->mix[i] = identity ? NULL
                             : tu_random_array(&rng, tu_count_mix(s),
                                               1.0f / sqrtf((float)(s->heads * (i == 3 ? s->pseudo : 1))));
}

static void data_free(core_data *c)
{
    for (int i = 0; i < INPUTS; i++) free(c->in[i]);
    for (int i = 0; i < MIX; i++) free(c->mix[i]);
}

static ref_problem problem_of(const core_data *c, const iha_attention_options *o)
{
    ref_problem p = tu_problem(&c->s, o);
    p.alpha_q = c->mix[0], p.alpha_k = c->mix[1], p.alpha_v = c->mix[2], p.r = c->mix[3];
    return p;
}

/* The reference's seven gradients (malloc'ed; free each). */
static void reference_grads(const core_data *c, const iha_attention_options *o, double *ref[OUTPUTS])
{
    for (int i = 0; i < OUTPUTS; i++) ref[i] = tu_malloc(out_count(&c->s, i) * sizeof(double));
    const ref_core_grads g = {ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], ref[6]};
    const ref_problem p = problem_of(c, o);
    assert_int_equal(ref_attention_core_backward(&p, c->in[0], c->in[1], c->in[2], c->in[3], &g), 0);
}

/* The problem on the device: inputs at odd offsets in the activations' storage, the mixing
 * arrays in the weights', the outputs `want` selects (bit i: output i) NaN-filled at offset 3
 * inside guards. */
typedef struct core_device {
    int act, weight; /* iha_storage of each */
    iha_buffer in[INPUTS], out[OUTPUTS];
    iha_layer_weights w;
} core_device;

static void device_upload(const core_data *c, int act, int weight, unsigned want, core_device *d)
{
    memset(d, 0, sizeof *d);
    d->act = act, d->weight = weight;
    const size_t n = tu_count_heads(&c->s), nm = tu_count_mix(&c->s);
    for (int i = 0; i < INPUTS; i++) {
        const size_t at = 1 + 2 * (size_t)i;
        d->in[i] = (iha_buffer){tu_tensor_guarded(tu_ctx, act, c->in[i], n, at, 0, 0.0f), at};
    }
    iha_buffer *mix[MIX] = {&d->w.alpha_q, &d->w.alpha_k, &d->w.alpha_v, &d->w.r};
    for (int i = 0; i < MIX && c->mix[0]; i++)
        *mix[i] = (iha_buffer){tu_tensor_guarded(tu_ctx, weight, c->mix[i], nm, (size_t)i, 0, 0.0f), (size_t)i};
    for (int i = 0; i < OUTPUTS; i++)
        if (want >> i & 1u)
            d->out[i] = (iha_buffer){
                tu_tensor_guarded(tu_ctx, i < 3 ? act : weight, NULL, out_count(&c->s, i), 3, GUARD, SENTINEL), 3};
}

static void device_release(core_device *d)
{
    for (int i = 0; i < INPUTS; i++) tu_buffer_release(d->in[i].mem);
    for (int i = 0; i < OUTPUTS; i++) tu_buffer_release(d->out[i].mem);
    tu_layer_weights_release(&d->w);
}

static iha_status run_call(const core_device *d, const iha_shape *s, const iha_attention_options *o, int null_grads)
{
    const iha_layer_grads g = {.alpha_q = d->out[3], .alpha_k = d->out[4], .alpha_v = d->out[5], .r = d->out[6]};
    return iha_attention_core_backward(tu_ctx, s, o, &d->w, d->in[0], d->in[1], d->in[2], d->in[3], d->out[0],
                                       d->out[1], d->out[2], null_grads ? NULL : &g);
}

/* Output i of the device, read back as floats (malloc'ed) after checking its guards. */
static float *read_output(const core_device *d, const iha_shape *s, int i)
{
    const size_t n = out_count(s, i);
    float *got = tu_malloc(n * sizeof *got);
    tu_tensor_read_checked(tu_ctx, i < 3 ? d->act : d->weight, d->out[i].mem, n, 3, GUARD, SENTINEL, got,
                           out_names[i]);
    return got;
}

/* The outputs `want` selects (the others not given; grads NULL with null_grads) in the given
 * storage, against the reference within tol; lens (0-terminated, or NULL) packs sequences. */
static void run_packed_case(const core_case *cc, const size_t *lens, int act, int weight, unsigned want,
                            int null_grads, double tol, uint64_t seed)
{
    core_data c;
    data_init(&c, &cc->s, cc->identity, seed);
    iha_attention_options o = tu_options(cc->mask, cc->window, cc->rope);
    o.storage = act, o.weight_storage = weight;
    while (lens != NULL && lens[o.seq_count]) ++o.seq_count;
    o.seq_lens = o.seq_count ? lens : NULL;
    core_device d;
    device_upload(&c, act, weight, want, &d);
    tu_assert_status(tu_ctx, run_call(&d, &c.s, &o, null_grads), IHA_OK);
    double *ref[OUTPUTS];
    reference_grads(&c, &o, ref);
    for (int i = 0; i < OUTPUTS; i++) {
        if (d.out[i].mem != NULL) {
            float *got = read_output(&d, &c.s, i);
            tu_assert_close(out_names[i], got, ref[i], out_count(&c.s, i), tol);
            free(got);
        }
        free(ref[i]);
    }
    device_release(&d);
    data_free(&c);
}

static void run_case(const core_case *cc, int act, int weight, unsigned want, int null_grads, double tol,
                     uint64_t seed)
{
    run_packed_case(cc, NULL, act, weight, want, null_grads, tol, seed);
}

#define ALL ((1u << OUTPUTS) - 1u)

/* Ragged shapes: each mask, windows, rotary, P = 1 with the identity shortcut, width 1 and odd
 * widths, widths the attention backward's tiles divide and a partial last chunk, and more
 * tokens than one partial sum of the mixing gradients. */
static const core_case kCases[] = {
    {{2, 5, 1, 2, 8, 3}, IHA_MASK_CAUSAL, 0, 1, 0},
    {{1, 7, 1, 3, 5, 2}, IHA_MASK_TOKEN_CAUSAL, 3, 0, 0},
    {{1, 6, 1, 2, 6, 2}, IHA_MASK_NONE, 2, 1, 0},
    {{2, 9, 1, 2, 16, 1}, IHA_MASK_CAUSAL, 0, 1, 1},
    {{1, 11, 1, 1, 1, 4}, IHA_MASK_CAUSAL, 2, 0, 0},
    {{1, 5, 1, 3, 7, 1}, IHA_MASK_NONE, 0, 0, 1},
    {{3, 23, 1, 2, 8, 3}, IHA_MASK_TOKEN_CAUSAL, 4, 1, 0},
    {{2, 37, 1, 2, 20, 2}, IHA_MASK_CAUSAL, 5, 1, 0},
};

static void gradients_against_reference(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; i++)
        run_case(&kCases[i], IHA_STORAGE_F32, IHA_STORAGE_F32, ALL, 0, TU_TOL_F32, 600 + i);
}

/* Each output alone, grads NULL with dq, dk and dv, and one mixing gradient without any of
 * dq, dk, dv. */
static void outputs_left_out(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const core_case c = {{1, 6, 1, 2, 4, 2}, IHA_MASK_CAUSAL, 0, 1, 0};
    for (int i = 0; i < OUTPUTS; i++)
        run_case(&c, IHA_STORAGE_F32, IHA_STORAGE_F32, 1u << i, 0, TU_TOL_F32, 640 + (uint64_t)i);
    run_case(&c, IHA_STORAGE_F32, IHA_STORAGE_F32, 7u, 1, TU_TOL_F32, 650);
    run_case(&c, IHA_STORAGE_F32, IHA_STORAGE_F32, 1u << 5 | 1u << 1, 0, TU_TOL_F32, 651);
}

/* Half activations and/or half mixing weights, each with every output, against float64 on the
 * float inputs; the identity shortcut with half activations. */
static void half_storage(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const int h = IHA_STORAGE_F16, f = IHA_STORAGE_F32;
    run_case(&kCases[0], h, h, ALL, 0, TOL_F16, 660);
    run_case(&kCases[1], h, f, ALL, 0, TOL_F16, 661);
    run_case(&kCases[2], f, h, ALL, 0, TOL_F16, 662);
    run_case(&kCases[3], h, h, ALL, 0, TOL_F16, 663);
}

/* bfloat16 activations and mixing weights, together and apart. */
static void bf16_storage(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const int b = IHA_STORAGE_BF16, f = IHA_STORAGE_F32;
    run_case(&kCases[0], b, b, ALL, 0, TOL_BF16, 670);
    run_case(&kCases[2], b, f, ALL, 0, TOL_BF16, 671);
    run_case(&kCases[6], f, b, ALL, 0, TOL_BF16, 672);
}

/* Packed sequences: attention and rotary stay within each sequence (the reference runs each
 * alone), on every mask, with windows, lengths of one token and batch rows packed differently. */
static void packed_sequences(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const core_case cases[] = {
        {{1, 9, 1, 2, 8, 2}, IHA_MASK_CAUSAL, 0, 1, 0},
        {{2, 7, 1, 2, 6, 3}, IHA_MASK_TOKEN_CAUSAL, 2, 1, 0},
        {{1, 12, 1, 1, 5, 2}, IHA_MASK_NONE, 3, 0, 0},
        {{2, 6, 1, 2, 16, 1}, IHA_MASK_CAUSAL, 0, 1, 1},
    };
    static const size_t lens[][5] = {{4, 1, 4, 0}, {3, 4, 7, 0}, {5, 7, 0}, {1, 5, 2, 4, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_packed_case(&cases[i], lens[i], IHA_STORAGE_F32, IHA_STORAGE_F32, ALL, 0, TU_TOL_F32, 680 + i);
}

/* The reference against central differences of ref_attention_core, element by element of q, k,
 * v and the mixing arrays, for the loss sum(dy * y): the steps are the exact differences of the
 * perturbed floats, so the quotient has only its O(h^2) truncation error. */
static double core_loss(const ref_problem *p, const core_data *c)
{
    const size_t n = tu_count_heads(&c->s);
    double *y = tu_malloc(n * sizeof *y), loss = 0.0;
    assert_int_equal(ref_attention_core(p, c->in[0], c->in[1], c->in[2], y), 0);
    for (size_t i = 0; i < n; i++) loss += c->in[3][i] * y[i];
    free(y);
    return loss;
}

static void reference_matches_differences(void **state)
{
    (void)state;
    static const core_case cases[] = {
        {{2, 3, 1, 2, 4, 2}, IHA_MASK_CAUSAL, 0, 1, 0},
        {{1, 4, 1, 3, 3, 3}, IHA_MASK_TOKEN_CAUSAL, 2, 0, 0},
        {{1, 5, 1, 1, 6, 2}, IHA_MASK_NONE, 2, 1, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        core_data c;
        data_init(&c, &cases[k].s, 0, 700 + k);
        const iha_attention_options o = tu_options(cases[k].mask, cases[k].window, cases[k].rope);
        double *ref[OUTPUTS];
        reference_grads(&c, &o, ref);
        float *const tensors[OUTPUTS] = {c.in[0], c.in[1], c.in[2], c.mix[0], c.mix[1], c.mix[2], c.mix[3]};
        const ref_problem p = problem_of(&c, &o); /* points at the arrays perturbed below */
        for (int t = 0; t < OUTPUTS; t++) {
            double err = 0.0, norm = 0.0;
            for (size_t i = 0; i < out_count(&c.s, t); i++) {
                const float keep = tensors[t][i];
                tensors[t][i] = keep + 1e-4f;
                const double up = tensors[t][i], plus = core_loss(&p, &c);
                tensors[t][i] = keep - 1e-4f;
                const double down = tensors[t][i], minus = core_loss(&p, &c);
                tensors[t][i] = keep;
                const double fd = (plus - minus) / (up - down);
                err += (fd - ref[t][i]) * (fd - ref[t][i]);
                norm += ref[t][i] * ref[t][i];
            }
            if (!(sqrt(err) <= 1e-6 * sqrt(norm)))
                fail_msg("%s: relative L2 distance %.3g from central differences", out_names[t], sqrt(err / norm));
        }
        for (int i = 0; i < OUTPUTS; i++) free(ref[i]);
        data_free(&c);
    }
}

/* Fails unless every output still holds NaN inside its guards. */
static void assert_untouched(const core_device *d, const iha_shape *s)
{
    for (int i = 0; i < OUTPUTS; i++) {
        if (d->out[i].mem == NULL) continue;
        float *got = read_output(d, s, i);
        assert_int_equal(tu_count_nonfinite(got, out_count(s, i)), out_count(s, i));
        free(got);
    }
}

static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    core_data c;
    const iha_shape s = {1, 4, 1, 2, 4, 2};
    data_init(&c, &s, 0, 710);
    core_device d;
    device_upload(&c, IHA_STORAGE_F32, IHA_STORAGE_F32, ALL, &d);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    const iha_status bad = IHA_ERROR_INVALID_ARGUMENT;
    const iha_buffer none = {NULL, 0};
    const iha_layer_grads g = {.alpha_q = d.out[3], .alpha_k = d.out[4], .alpha_v = d.out[5], .r = d.out[6]};
#define CALL(w, q, dy, dq, dk, grads) \
    iha_attention_core_backward(tu_ctx, &s, &o, (w), (q), d.in[1], d.in[2], (dy), (dq), (dk), d.out[2], (grads))

    /* Unknown storage; rotary with an odd width; the identity shortcut with P > 1; no weights. */
    o.storage = 5;
    tu_assert_status(tu_ctx, CALL(&d.w, d.in[0], d.in[3], d.out[0], d.out[1], &g), bad);
    o.storage = IHA_STORAGE_F32;
    const iha_shape odd = {1, 4, 1, 2, 3, 2};
    o.rope = 1;
    tu_assert_status(tu_ctx,
                     iha_attention_core_backward(tu_ctx, &odd, &o, &d.w, d.in[0], d.in[1], d.in[2], d.in[3], d.out[0],
                                                 d.out[1], d.out[2], &g),
                     bad);
    o.rope = 0;
    const iha_layer_weights identity = {0};
    tu_assert_status(tu_ctx, CALL(&identity, d.in[0], d.in[3], d.out[0], d.out[1], &g), bad);
    tu_assert_status(tu_ctx, CALL(NULL, d.in[0], d.in[3], d.out[0], d.out[1], &g), bad);
    /* An input missing. */
    tu_assert_status(tu_ctx, CALL(&d.w, none, d.in[3], d.out[0], d.out[1], &g), bad);
    tu_assert_status(tu_ctx, CALL(&d.w, d.in[0], none, d.out[0], d.out[1], &g), bad);
    /* Outputs overlapping q, dy, a mixing weight or each other. */
    tu_assert_status(tu_ctx, CALL(&d.w, d.in[0], d.in[3], d.in[0], d.out[1], &g), bad);
    tu_assert_status(tu_ctx, CALL(&d.w, d.in[0], d.in[3], d.out[0], d.in[3], &g), bad);
    iha_layer_grads onto = g;
    onto.r = d.w.alpha_k;
    tu_assert_status(tu_ctx, CALL(&d.w, d.in[0], d.in[3], d.out[0], d.out[1], &onto), bad);
    onto = g;
    onto.alpha_v = d.out[3];
    tu_assert_status(tu_ctx, CALL(&d.w, d.in[0], d.in[3], d.out[0], d.out[1], &onto), bad);
    const iha_buffer inside_dq = {d.out[0].mem, d.out[0].offset + 1};
    tu_assert_status(tu_ctx, CALL(&d.w, d.in[0], d.in[3], d.out[0], inside_dq, &g), bad);
    /* An output one element past its buffer. */
    const iha_buffer short_dk = {d.out[1].mem, 3 + GUARD + 1};
    tu_assert_status(tu_ctx, CALL(&d.w, d.in[0], d.in[3], d.out[0], short_dk, &g), IHA_ERROR_BUFFER_TOO_SMALL);
    onto = g;
    onto.alpha_q = (iha_buffer){d.out[3].mem, 3 + GUARD + 1};
    tu_assert_status(tu_ctx, CALL(&d.w, d.in[0], d.in[3], d.out[0], d.out[1], &onto), IHA_ERROR_BUFFER_TOO_SMALL);
    tu_assert_status(NULL,
                     iha_attention_core_backward(NULL, &s, &o, &d.w, d.in[0], d.in[1], d.in[2], d.in[3], d.out[0],
                                                 d.out[1], d.out[2], &g),
                     bad);
#undef CALL
    assert_untouched(&d, &s);
    device_release(&d);
    data_free(&c);
}

/* A device that cannot hold one pseudo tensor refuses the call before anything is written. */
static void device_memory_refused_before_writing(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    core_data c;
    const iha_shape s = {1, 5, 1, 2, 4, 3};
    data_init(&c, &s, 0, 720);
    core_device d;
    device_upload(&c, IHA_STORAGE_F32, IHA_STORAGE_F32, ALL, &d);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    o.accumulate = 1;
    iha_context_trim(tu_ctx);
    const cl_ulong keep = tu_ctx->info.max_alloc_bytes;
    tu_ctx->info.max_alloc_bytes = tu_count_virtual(&s) * sizeof(float) - sizeof(float);
    const iha_status st = run_call(&d, &s, &o, 0);
    tu_ctx->info.max_alloc_bytes = keep;
    tu_assert_status(tu_ctx, st, IHA_ERROR_DEVICE_MEMORY);
    assert_untouched(&d, &s);
    device_release(&d);
    data_free(&c);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reference_matches_differences),
        cmocka_unit_test(gradients_against_reference),
        cmocka_unit_test(outputs_left_out),
        cmocka_unit_test(half_storage),
        cmocka_unit_test(bf16_storage),
        cmocka_unit_test(packed_sequences),
        cmocka_unit_test(refusals),
        cmocka_unit_test(device_memory_refused_before_writing),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
