/*
 * test_backward.c - iha_attention_backward against the float64 reference of doc/spec.md's backward
 * pass, on ragged shapes under every mask, windows, P = 1 and odd head widths; the reference
 * itself against finite differences of the reference forward; and the refusals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_backward.h"
#include "kernels/mix.h"
#include "reference.h"
#include "test_util.h"

#define GUARD 37 /* floats of sentinel after each output, and OFFSET before it */
#define OFFSET 5

typedef struct bwd_case {
    size_t B, N, H, d, P;
    int mask;
    int64_t window;
    float scale;     /* 0: 1/sqrt(d) */
    size_t in_off;   /* element offset of every input in its buffer */
} bwd_case;

static ref_problem problem_of(const bwd_case *c)
{
    ref_problem p = {.B = c->B, .N = c->N, .H = c->H, .d = c->d, .P = c->P, .mask = c->mask, .window = c->window,
                     .scale = c->scale};
    return p;
}

/* Forward on the device (o and lse as iha_attention writes them), then the backward, checked
 * against the reference; outputs sit at an offset inside guarded buffers poisoned with NaN. */
static void check_case(const bwd_case *c, const float *q, const float *k, const float *v, const float *g, double tol)
{
    const iha_shape s = {c->B, c->N, 1, c->H, c->d, c->P};
    const size_t n = c->B * c->H * c->N * c->P * c->d, rows = c->B * c->H * c->N * c->P;
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.mask = c->mask;
    o.window = c->window;
    o.scale = c->scale;
    const size_t f = c->in_off; /* inputs sit at this offset, their buffers end where they do */
    cl_mem bq = tu_buffer_guarded(tu_ctx, q, n, f, 0, 0), bk = tu_buffer_guarded(tu_ctx, k, n, f, 0, 0);
    cl_mem bv = tu_buffer_guarded(tu_ctx, v, n, f, 0, 0), bg = tu_buffer_guarded(tu_ctx, g, n, f, 0, 0);
    cl_mem bo = tu_buffer_guarded(tu_ctx, NULL, n, f, 0, 0), bl = tu_buffer_guarded(tu_ctx, NULL, rows, f, 0, 0);
    tu_assert_status(tu_ctx,
                     iha_attention(tu_ctx, &s, &o, (iha_buffer){bq, f}, (iha_buffer){bk, f}, (iha_buffer){bv, f},
                                   (iha_buffer){bo, f}, (iha_buffer){bl, f}),
                     IHA_OK);
    cl_mem out[3];
    for (int i = 0; i < 3; i++) out[i] = tu_buffer_guarded(tu_ctx, NULL, n, OFFSET, GUARD, -7.0f);
    tu_assert_status(tu_ctx,
                     iha_attention_backward(tu_ctx, &s, &o, (iha_buffer){bq, f}, (iha_buffer){bk, f},
                                            (iha_buffer){bv, f}, (iha_buffer){bo, f}, (iha_buffer){bl, f},
                                            (iha_buffer){bg, f}, (iha_buffer){out[0], OFFSET},
                                            (iha_buffer){out[1], OFFSET}, (iha_buffer){out[2], OFFSET}),
                     IHA_OK);

    double *ref[3];
    for (int i = 0; i < 3; i++) ref[i] = tu_malloc(n * sizeof(double));
    const ref_problem p = problem_of(c);
    assert_int_equal(ref_attention_backward(&p, q, k, v, g, ref[0], ref[1], ref[2]), 0);
    static const char *const names[3] = {"dqt", "dkt", "dvt"};
    float *got = tu_malloc(n * sizeof *got);
    for (int i = 0; i < 3; i++) {
        tu_buffer_read(tu_ctx, out[i], OFFSET, got, n);
        tu_assert_close(names[i], got, ref[i], n, tol);
        tu_assert_guard(tu_ctx, out[i], n, OFFSET, GUARD, -7.0f);
        tu_buffer_release(out[i]);
        free(ref[i]);
    }
    free(got);
    tu_buffer_release(bq), tu_buffer_release(bk), tu_buffer_release(bv), tu_buffer_release(bg);
    tu_buffer_release(bo), tu_buffer_release(bl);
}

static void run_case(const bwd_case *c, uint64_t seed)
{
    const size_t n = c->B * c->H * c->N * c->P * c->d;
    tu_rng rng = tu_rng_seeded(seed);
    float *q = tu_random_array(&rng, n, 1.0f), *k = tu_random_array(&rng, n, 1.0f);
    float *v = tu_random_array(&rng, n, 1.0f), *g = tu_random_array(&rng, n, 1.0f);
    check_case(c, q, k, v, g, TU_TOL_F32);
    free(q), free(k), free(v), free(g);
}

/* Ragged shapes under every mask, windows, P = 1 and head widths from 1 to 256, with more rows
 * than a work-group. On CPUs every width takes the register-tile kernels (ragged T: not a
 * multiple of their 4 rows or 16 columns); GPUs, and drivers that end loops early, take the row
 * kernels, whose rows are chunks of 4: kShapes' widths leave every remainder mod 4, and take
 * each of the forward's vector widths (4, 8 and 16) with a tail and without. The tiles_ sets
 * add what concerns the tile kernels: more widths (their chunks of 16 whole and cut) and their
 * split of the keys over work-items. .ci/rusticl.sh, a slow compiler's stage on a driver that
 * runs the row kernels, skips them. */
static const bwd_case kShapes[] = {
    {1, 7, 2, 8, 3, IHA_MASK_CAUSAL, 0, 0.0f, 0},           {2, 5, 1, 17, 2, IHA_MASK_TOKEN_CAUSAL, 0, 0.0f, 0},
    {1, 6, 2, 9, 1, IHA_MASK_NONE, 0, 0.0f, 0},             {1, 8, 2, 6, 3, IHA_MASK_TOKEN_CAUSAL, 3, 0.0f, 0},
    {1, 5, 1, 1, 4, IHA_MASK_CAUSAL, 0, 0.0f, 0},           {1, 4, 1, 3, 1, IHA_MASK_NONE, 0, 0.0f, 0},
    {1, 33, 1, 130, 2, IHA_MASK_CAUSAL, 5, 0.0f, 0},        {1, 20, 2, 256, 1, IHA_MASK_NONE, 0, 0.0f, 0},
    {1, 30, 1, 64, 2, IHA_MASK_CAUSAL, 4, 0.0f, 0},
    /* P = 1 under the causal masks, windows of N and beyond, other scales, input offsets */
    {1, 9, 2, 8, 1, IHA_MASK_CAUSAL, 0, 0.7f, 3},   {1, 11, 1, 9, 1, IHA_MASK_TOKEN_CAUSAL, 4, -0.3f, 1},
    {1, 6, 1, 64, 2, IHA_MASK_CAUSAL, 6, 0.0f, 5},  {1, 5, 1, 3, 3, IHA_MASK_NONE, 9, 0.25f, 2},
};

static const bwd_case kTileWidths[] = {
    {1, 9, 1, 16, 2, IHA_MASK_CAUSAL, 2, 0.0f, 0},       {2, 7, 1, 5, 2, IHA_MASK_NONE, 2, 0.0f, 0},
    {1, 40, 1, 64, 2, IHA_MASK_CAUSAL, 0, 0.0f, 0},      {1, 7, 1, 48, 3, IHA_MASK_CAUSAL, 0, 0.0f, 0},
    {2, 9, 2, 32, 3, IHA_MASK_TOKEN_CAUSAL, 2, 0.0f, 0}, {1, 21, 1, 16, 3, IHA_MASK_TOKEN_CAUSAL, 0, 0.0f, 0},
    {1, 13, 1, 32, 3, IHA_MASK_NONE, 3, 0.0f, 0},        {1, 5, 1, 7, 3, IHA_MASK_NONE, 9, 0.25f, 2},
    {1, 9, 2, 16, 1, IHA_MASK_CAUSAL, 0, 0.7f, 3},       {1, 6, 1, 32, 2, IHA_MASK_CAUSAL, 6, 0.0f, 5},
};

static const bwd_case kTileKeyGroups[] = {
    /* several key groups at d > 64 (64 rows each), each in a work-item of its own */
    {1, 75, 1, 128, 2, IHA_MASK_CAUSAL, 0, 0.0f, 0}, {1, 50, 1, 256, 3, IHA_MASK_TOKEN_CAUSAL, 20, 0.0f, 0},
    /* work-items that take several key groups, adding into one partial dq: on 2 compute
     * units B*H = 8 makes one per sequence (two groups of 32 keys) and B*H = 2 four (five
     * groups: the first work-item takes groups 0 and 4) */
    {2, 20, 4, 24, 3, IHA_MASK_CAUSAL, 0, 0.0f, 0}, {1, 45, 2, 16, 3, IHA_MASK_TOKEN_CAUSAL, 0, 0.0f, 0},
    /* more key groups (10) than work-items per sequence (at most 64 / B*H = 8), whatever the
     * compute units */
    {2, 100, 4, 8, 3, IHA_MASK_CAUSAL, 0, 0.0f, 0},
};

/* A set of shapes, a CMocka case of its own (its state). */
typedef struct case_set {
    const bwd_case *cases;
    size_t count;
    uint64_t seed;
} case_set;

static const case_set kSets[] = {
    {kShapes, sizeof kShapes / sizeof kShapes[0], 100},
    {kTileWidths, sizeof kTileWidths / sizeof kTileWidths[0], 200},
    {kTileKeyGroups, sizeof kTileKeyGroups / sizeof kTileKeyGroups[0], 300},
};

static void against_reference(void **state)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    const case_set *set = *state;
    for (size_t i = 0; i < set->count; i++) run_case(&set->cases[i], set->seed + i);
}

/* Both kernel families through the internal enqueue, whatever the device would choose:
 * `tiles` forces the register-tile kernels (Oclgrind, a GPU to the library, runs them too in
 * CI), else the row kernels. Inputs and outputs end exactly where their tensors do. With
 * `dead_row`, virtual row 1 of each sequence is given lse = -inf and o = 0, as for a query that
 * sees no key (no mask of the library makes one yet; doc/spec.md defines it): it must contribute no
 * gradient, which is the reference's answer with that row's dout set to 0. */
static void internal_case(const bwd_case *c, int tiles, int dead_row, uint64_t seed)
{
    const size_t T = c->N * c->P, n = c->B * c->H * T * c->d, rows = c->B * c->H * T;
    const iha_dims dims = {c->B, c->N, c->H, c->d, c->P, T, NULL};
    tu_rng rng = tu_rng_seeded(seed);
    float *in[4] = {tu_random_array(&rng, n, 1.0f), tu_random_array(&rng, n, 1.0f), tu_random_array(&rng, n, 1.0f),
                    tu_random_array(&rng, n, 1.0f)};
    const ref_problem p = problem_of(c);
    double *o = tu_malloc(n * sizeof *o), *lse = tu_malloc(rows * sizeof *lse);
    assert_int_equal(ref_attention(&p, in[0], in[1], in[2], o, lse), 0);
    float *of = tu_malloc(n * sizeof *of), *lf = tu_malloc(rows * sizeof *lf);
    for (size_t i = 0; i < n; i++) of[i] = (float)o[i];
    for (size_t i = 0; i < rows; i++) lf[i] = (float)lse[i];
    float *gref = tu_malloc(n * sizeof *gref); /* the reference's dout */
    memcpy(gref, in[3], n * sizeof *gref);
    for (size_t bh = 0; dead_row && bh < c->B * c->H; bh++) {
        lf[bh * T + 1] = -INFINITY;
        for (size_t x = 0; x < c->d; x++) of[(bh * T + 1) * c->d + x] = 0.0f, gref[(bh * T + 1) * c->d + x] = 0.0f;
    }
    cl_mem b[6], out[3], packed[3] = {NULL, NULL, NULL}, delta = tu_buffer_new(tu_ctx, rows);
    for (int i = 0; i < 3; i++) b[i] = tu_buffer_guarded(tu_ctx, in[i], n, 0, 0, 0);
    b[3] = tu_buffer_guarded(tu_ctx, of, n, 0, 0, 0);
    b[4] = tu_buffer_guarded(tu_ctx, lf, rows, 0, 0, 0);
    b[5] = tu_buffer_guarded(tu_ctx, in[3], n, 0, 0, 0);
    for (int i = 0; i < 3; i++) out[i] = tu_buffer_guarded(tu_ctx, NULL, n, 0, 0, 0);
    /* The tile kernel's workspace: packed Q and dO, then its partial dq sums, each followed by
     * a guard that must come back untouched. */
    size_t work[3] = {iha__packed_keys_elements(&dims, 16), iha__packed_keys_elements(&dims, 16), 0};
    assert_true(iha__attention_backward_partial_elements(tu_ctx, &dims, &work[2]));
    for (int i = 0; tiles && i < 3; i++) packed[i] = tu_buffer_guarded(tu_ctx, NULL, work[i], 0, GUARD, -7.0f);
    iha_backward_refs r = {{b[0], 0},   {b[1], 0},   {b[2], 0},   {b[3], 0}, {b[4], 0},
                           {b[5], 0},   {out[0], 0}, {out[1], 0}, {out[2], 0}, delta,
                           {packed[0], packed[1]}, packed[2]};
    const float scale = c->scale != 0.0f ? c->scale : 1.0f / sqrtf((float)c->d);
    tu_assert_status(tu_ctx, iha__attention_backward_enqueue(tu_ctx, &dims, &r, NULL, c->mask, (size_t)c->window, scale),
                     IHA_OK);
    double *ref[3];
    for (int i = 0; i < 3; i++) ref[i] = tu_malloc(n * sizeof(double));
    assert_int_equal(ref_attention_backward(&p, in[0], in[1], in[2], gref, ref[0], ref[1], ref[2]), 0);
    float *got = tu_malloc(n * sizeof *got);
    static const char *const names[2][3] = {{"dqt (rows)", "dkt (rows)", "dvt (rows)"},
                                            {"dqt (tiles)", "dkt (tiles)", "dvt (tiles)"}};
    for (int i = 0; i < 3; i++) {
        tu_buffer_read(tu_ctx, out[i], 0, got, n);
        tu_assert_close(names[tiles][i], got, ref[i], n, TU_TOL_F32);
        free(ref[i]);
    }
    for (int i = 0; tiles && i < 3; i++) tu_assert_guard(tu_ctx, packed[i], work[i], 0, GUARD, -7.0f);
    free(got), free(o), free(lse), free(of), free(lf), free(gref);
    for (int i = 0; i < 4; i++) free(in[i]);
    for (int i = 0; i < 3; i++) tu_buffer_release(packed[i]);
    for (int i = 0; i < 6; i++) tu_buffer_release(b[i]);
    for (int i = 0; i < 3; i++) tu_buffer_release(out[i]);
    tu_buffer_release(delta);
}

/* Log-sum-exps near -89: every score near -92 (the queries along one direction, every key
 * against it), 20 keys per query at most, and T = 20 short of one 32-key group, so the tile
 * kernel's work-item repeats its last key row 12 times. 2 raised to a score minus such an lse
 * overflows float unless the mask selects it away (zeroing their keys instead would make dq
 * NaN). The common direction cancels in dq (its gradients sum
 * to 0 over the keys), so float32's rounding of scores of that size (92 * 2^-24) shows at 5e-4
 * of dq: checked at 1e-3. */
static void very_negative_lse(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const bwd_case cases[] = {
        {1, 10, 1, 16, 2, IHA_MASK_NONE, 0, 0.0625f, 0},         /* lse = -92 + ln 20 */
        {1, 10, 1, 16, 2, IHA_MASK_TOKEN_CAUSAL, 0, 0.0625f, 0}, /* down to -92 + ln 2 */
    };
    const size_t n = 10 * 2 * 16;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tu_rng rng = tu_rng_seeded(700 + c);
        float *q = tu_random_array(&rng, n, 1.0f), *k = tu_random_array(&rng, n, 1.0f);
        float *v = tu_random_array(&rng, n, 1.0f), *g = tu_random_array(&rng, n, 1.0f);
        for (size_t i = 0; i < n; i++) { /* scale * 16 * 92 * -1 */
            q[i] = 92.0f * (1.0f + 0.02f * q[i]);
            k[i] = -1.0f - 0.02f * k[i];
        }
        check_case(&cases[c], q, k, v, g, 1e-3);
        free(q), free(k), free(v), free(g);
    }
}

static void tiles_and_rows_forced(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const bwd_case cases[] = {
        {1, 7, 1, 16, 3, IHA_MASK_CAUSAL, 0, 0.0f, 0},
        {1, 9, 2, 32, 2, IHA_MASK_TOKEN_CAUSAL, 3, 0.0f, 0},
        {2, 5, 1, 16, 3, IHA_MASK_NONE, 2, 0.6f, 0},
        /* partial last chunks: whole 4-, 8- and 12-float tails, an odd one, and d < 16 */
        {1, 6, 1, 20, 3, IHA_MASK_CAUSAL, 0, 0.0f, 0},
        {1, 5, 2, 72, 2, IHA_MASK_TOKEN_CAUSAL, 0, 0.0f, 0},
        {1, 7, 1, 28, 2, IHA_MASK_NONE, 3, 0.0f, 0},
        {1, 6, 1, 37, 3, IHA_MASK_CAUSAL, 2, 0.0f, 0},
        {2, 5, 1, 3, 2, IHA_MASK_CAUSAL, 0, 0.0f, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int tiles = 0; tiles < 2; tiles++)
            for (int dead = 0; dead < 2; dead++) internal_case(&cases[ci], tiles, dead, 400 + ci);
}

/* sum(dout * O) as a function of one input element, in double through the reference forward. */
static double loss_of(const ref_problem *p, const float *q, const float *k, const float *v, const float *g,
                      size_t n)
{
    double *o = tu_malloc(n * sizeof *o);
    assert_int_equal(ref_attention(p, q, k, v, o, NULL), 0);
    double loss = 0.0;
    for (size_t i = 0; i < n; i++) loss += (double)g[i] * o[i];
    free(o);
    return loss;
}

/* The reference backward against central differences of the reference forward, so the
 * device is checked against formulas that are themselves checked. Inputs are floats, so the
 * step is large (2^-8) and the tolerance loose; a wrong term (a sign, a missing scale, the
 * Dt correction) is off by far more. */
static void reference_matches_finite_differences(void **state)
{
    (void)state;
    static const bwd_case cases[] = {
        {1, 4, 1, 3, 2, IHA_MASK_CAUSAL, 0, 0.0f, 0},
        {1, 3, 1, 2, 2, IHA_MASK_TOKEN_CAUSAL, 2, 0.0f, 0},
        {1, 3, 1, 2, 2, IHA_MASK_NONE, 0, 0.0f, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const bwd_case *c = &cases[ci];
        const size_t n = c->B * c->H * c->N * c->P * c->d;
        tu_rng rng = tu_rng_seeded(300 + ci);
        float *in[3] = {tu_random_array(&rng, n, 1.0f), tu_random_array(&rng, n, 1.0f), tu_random_array(&rng, n, 1.0f)};
        float *g = tu_random_array(&rng, n, 1.0f);
        const ref_problem p = problem_of(c);
        double *grad[3];
        for (int i = 0; i < 3; i++) grad[i] = tu_malloc(n * sizeof(double));
        assert_int_equal(ref_attention_backward(&p, in[0], in[1], in[2], g, grad[0], grad[1], grad[2]), 0);
        const float h = 1.0f / 256.0f;
        for (int which = 0; which < 3; which++)
            for (size_t e = 0; e < n; e++) {
                const float keep = in[which][e];
                in[which][e] = keep + h;
                const double up = loss_of(&p, in[0], in[1], in[2], g, n);
                in[which][e] = keep - h;
                const double down = loss_of(&p, in[0], in[1], in[2], g, n);
                in[which][e] = keep;
                const double fd = (up - down) / (2.0 * (double)h);
                if (fabs(fd - grad[which][e]) > 2e-3 * (1.0 + fabs(fd)))
                    fail_msg("case %zu, input %d, element %zu: finite difference %.6g, reference %.6g", ci, which, e,
                             fd, grad[which][e]);
            }
        for (int i = 0; i < 3; i++) free(in[i]), free(grad[i]);
        free(g);
    }
}

/* Refusals write nothing: the outputs keep their sentinel. */
static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 4, 1, 2, 8, 2};
    const size_t n = 1 * 2 * 8 * 8, rows = 2 * 8;
    cl_mem in = tu_buffer_guarded(tu_ctx, NULL, n, 0, 0, 0), lse = tu_buffer_guarded(tu_ctx, NULL, rows, 0, 0, 0);
    cl_mem out = tu_buffer_guarded(tu_ctx, NULL, 3 * n, 0, 0, 3.0f);
    float *three = tu_malloc(3 * n * sizeof *three);
    tu_fill_value(three, 3 * n, 3.0f);
    tu_buffer_write(tu_ctx, out, 0, three, 3 * n);
    const iha_buffer b = {in, 0}, l = {lse, 0}, none = {NULL, 0};
    const iha_buffer d0 = {out, 0}, d1 = {out, n}, d2 = {out, 2 * n};
    iha_attention_options o;
    iha_attention_options_init(&o);

    /* No lse: it is required here. */
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, &s, &o, b, b, b, b, none, b, d0, d1, d2),
                     IHA_ERROR_INVALID_ARGUMENT);
    /* Outputs that overlap each other, or an input. */
    tu_assert_status(tu_ctx,
                     iha_attention_backward(tu_ctx, &s, &o, b, b, b, b, l, b, d0, (iha_buffer){out, n - 1}, d2),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, &s, &o, b, b, b, b, l, d1, d0, d1, d2),
                     IHA_ERROR_INVALID_ARGUMENT);
    /* An output one float short of its tensor. */
    tu_assert_status(tu_ctx,
                     iha_attention_backward(tu_ctx, &s, &o, b, b, b, b, l, b, d0, d1, (iha_buffer){out, 2 * n + 1}),
                     IHA_ERROR_BUFFER_TOO_SMALL);
    /* lse one float short, and an output on top of lse. */
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, &s, &o, b, b, b, b, (iha_buffer){lse, 1}, b, d0, d1, d2),
                     IHA_ERROR_BUFFER_TOO_SMALL);
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, &s, &o, b, b, b, b, (iha_buffer){out, 0}, b, d0, d1, d2),
                     IHA_ERROR_INVALID_ARGUMENT);
    /* Rotary and an unknown storage (half storage is tests/test_half.c's). */
    iha_attention_options bad = o;
    bad.rope = 1;
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, &s, &bad, b, b, b, b, l, b, d0, d1, d2),
                     IHA_ERROR_INVALID_ARGUMENT);
    bad = o;
    bad.storage = 7;
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, &s, &bad, b, b, b, b, l, b, d0, d1, d2),
                     IHA_ERROR_INVALID_ARGUMENT);
    bad = o;
    bad.mask = 9;
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, &s, &bad, b, b, b, b, l, b, d0, d1, d2),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, NULL, &o, b, b, b, b, l, b, d0, d1, d2),
                     IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(iha_attention_backward(NULL, &s, &o, b, b, b, b, l, b, d0, d1, d2), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    tu_assert_buffer_all(tu_ctx, out, 0, 3 * n, 3.0f);
    /* weight_storage is ignored (the call has no weights), as by iha_attention. */
    bad = o;
    bad.weight_storage = IHA_STORAGE_F16;
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, &s, &bad, b, b, b, b, l, b, d0, d1, d2), IHA_OK);
    free(three);
    tu_buffer_release(in), tu_buffer_release(lse), tu_buffer_release(out);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reference_matches_finite_differences),
        {"shapes_against_reference", against_reference, NULL, NULL, (void *)&kSets[0]},
        {"tiles_widths_against_reference", against_reference, NULL, NULL, (void *)&kSets[1]},
        {"tiles_key_groups_against_reference", against_reference, NULL, NULL, (void *)&kSets[2]},
        cmocka_unit_test(very_negative_lse),
        cmocka_unit_test(tiles_and_rows_forced),
        cmocka_unit_test(refusals),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
