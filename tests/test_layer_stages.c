/*
 * test_layer_stages.c - the layer stages (include/iha.h, "Layer stages"): iha_layer_expand, then
 * iha_attention on its outputs (rope 0), then iha_layer_collapse gives iha_forward's z, for every
 * mask, windows, rotary, P = 1 (the identity shortcut too) and P = 3, packed sequences, float and
 * half storage; both against the float64 reference. iha_layer_expand over two runs of one
 * sequence (first_token 0 and a) gives the rows of one call over the whole sequence, which the
 * sequence-parallel layer relies on. The backward stages, iha_layer_collapse_backward and
 * iha_layer_expand_backward around iha_attention_backward, give iha_backward's dx and every
 * gradient, accumulating too, and over two runs their sums. Refusals write nothing.
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

#include "reference.h"
#include "test_layer.h"
#include "test_storage.h"
#include "test_util.h"

#define TOL_F16 2e-3 /* doc/spec.md: half storage, float accumulation */

typedef struct stage_case {
    iha_shape s;
    int mask;
    int64_t window;
    int rope;
    int act, weight; /* IHA_STORAGE_F32 or IHA_STORAGE_F16 */
    int identity;    /* P = 1: the NULL shortcut for the mixing and collapse */
    int packed;      /* two packed sequences per batch row (options->seq_lens) */
} stage_case;

static const stage_case kCases[] = {
    {{2, 5, 12, 2, 8, 3}, IHA_MASK_CAUSAL, 0, 1, IHA_STORAGE_F32, IHA_STORAGE_F32, 0, 0},
    {{1, 7, 9, 3, 6, 2}, IHA_MASK_TOKEN_CAUSAL, 3, 1, IHA_STORAGE_F32, IHA_STORAGE_F32, 0, 0},
    {{1, 6, 10, 2, 6, 1}, IHA_MASK_NONE, 2, 1, IHA_STORAGE_F32, IHA_STORAGE_F32, 1, 0},
    {{2, 9, 16, 2, 16, 1}, IHA_MASK_CAUSAL, 0, 0, IHA_STORAGE_F32, IHA_STORAGE_F32, 0, 0},
    {{1, 19, 24, 2, 8, 3}, IHA_MASK_CAUSAL, 5, 1, IHA_STORAGE_F32, IHA_STORAGE_F32, 0, 0},
    {{2, 8, 12, 2, 8, 3}, IHA_MASK_CAUSAL, 0, 1, IHA_STORAGE_F32, IHA_STORAGE_F32, 0, 1},
    {{1, 8, 12, 2, 8, 3}, IHA_MASK_CAUSAL, 3, 1, IHA_STORAGE_F16, IHA_STORAGE_F16, 0, 0},
    {{1, 20, 16, 2, 8, 3}, IHA_MASK_TOKEN_CAUSAL, 0, 1, IHA_STORAGE_F16, IHA_STORAGE_F32, 0, 0},
};

/* Two sequences per batch row: N/2 - 1 tokens, then the rest. */
static size_t packed_lens[8];

static iha_attention_options case_options(const stage_case *c)
{
    iha_attention_options o = tu_options(c->mask, c->window, c->rope);
    o.storage = c->act;
    o.weight_storage = c->weight;
    if (c->packed) {
        for (size_t b = 0; b < c->s.batch; ++b) {
            packed_lens[2 * b] = c->s.tokens / 2 - 1;
            packed_lens[2 * b + 1] = c->s.tokens - packed_lens[2 * b];
        }
        o.seq_lens = packed_lens;
        o.seq_count = 2 * c->s.batch;
    }
    return o;
}

/* The options of iha_attention and iha_attention_backward between the stages: the layer's,
 * with rope 0 (the expand stage has rotated the queries and keys). */
static iha_attention_options attention_options(const iha_attention_options *layer)
{
    iha_attention_options a = *layer;
    a.rope = 0;
    return a;
}

static float *read_new(int storage, iha_buffer b, size_t n, const char *what)
{
    float *out = tu_malloc(n * sizeof *out);
    tu_storage_read(storage, b, n, out, what);
    return out;
}

static double *to_double(const float *x, size_t n)
{
    double *out = tu_malloc(n * sizeof *out);
    for (size_t i = 0; i < n; ++i) out[i] = x[i];
    return out;
}

/* The largest |a - b| over n floats; 0 is bit for bit (no NaN in either: checked elsewhere). */
static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* ---- The forward stages ---- */

/* expand -> attention -> collapse against iha_forward and the float64 reference. */
static void run_forward_case(const stage_case *c, uint64_t seed)
{
    tu_layer l;
    tu_layer_init(&l, &c->s, seed);
    if (c->identity) tu_layer_identity(&l, 1);
    const iha_attention_options o = case_options(c), ao = attention_options(&o);
    const size_t nx = tu_count_x(&c->s), nv = tu_count_virtual(&c->s);
    iha_layer_weights w = tu_storage_upload_weights(&l, c->weight, 3);
    const iha_buffer x = tu_storage_upload(c->act, l.x, nx, 5), z = tu_storage_upload(c->act, NULL, nx, 2);
    const iha_buffer zs = tu_storage_upload(c->act, NULL, nx, 7);
    iha_buffer t[4];
    for (int i = 0; i < 4; ++i) t[i] = tu_storage_upload(c->act, NULL, nv, 1 + (size_t)i);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &c->s, &o, &w, x, z), IHA_OK);
    tu_assert_status(tu_ctx, iha_layer_expand(tu_ctx, &c->s, &o, &w, 0, x, t[0], t[1], t[2]), IHA_OK);
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, &c->s, &ao, t[0], t[1], t[2], t[3], (iha_buffer){NULL, 0}), IHA_OK);
    tu_assert_status(tu_ctx, iha_layer_collapse(tu_ctx, &c->s, &o, &w, t[3], zs), IHA_OK);

    float *zf = read_new(c->act, z, nx, "z (iha_forward)"), *zst = read_new(c->act, zs, nx, "z (stages)");
    double *ref = tu_layer_reference(&l, &o);
    const int half = c->act != IHA_STORAGE_F32 || c->weight != IHA_STORAGE_F32;
    const double tol = half ? TOL_F16 : TU_TOL_F32;
    tu_assert_close("z (iha_forward)", zf, ref, nx, tol);
    tu_assert_close("z (stages)", zst, ref, nx, tol);
    /* Float: the stages run iha_forward's kernels on the same values (the keys as rows, packed
     * by iha_attention, instead of packed by the mixing), and on PoCL z comes out bit for bit;
     * the check allows float rounding, which other devices' kernel choices may change. Half:
     * the stages round Qt, Kt, Vt and O to half between the calls, which iha_forward keeps in
     * float, so the two agree only within the half contract. */
    double *zd = to_double(zf, nx);
    tu_assert_close("z (stages against iha_forward)", zst, zd, nx, half ? TOL_F16 : 1e-6);
    if (!half) printf("    stages: z within %g of iha_forward's\n", max_diff(zf, zst, nx));
    free(zd);
    free(ref);
    free(zf);
    free(zst);
    for (int i = 0; i < 4; ++i) tu_buffer_release(t[i].mem);
    tu_buffer_release(x.mem);
    tu_buffer_release(z.mem);
    tu_buffer_release(zs.mem);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

static void forward_stages_equal_forward(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; ++i) run_forward_case(&kCases[i], 500 + i);
}

/* Rows [first*P, (first + n)*P) of each head of a [1][H][T][d] tensor, as [1][H][n*P][d]. */
static float *rows_of(const float *t, const iha_shape *s, size_t first, size_t n)
{
    const size_t P = s->pseudo, d = s->head_dim, T = s->tokens * P;
    float *out = tu_malloc(s->heads * n * P * d * sizeof *out);
    for (size_t h = 0; h < s->heads; ++h)
        memcpy(out + h * n * P * d, t + (h * T + first * P) * d, n * P * d * sizeof *out);
    return out;
}

/* iha_layer_expand over tokens 0..a-1 (first_token 0) and a..N-1 (first_token a), each on its
 * own [1][run][D] x, against one call over the whole sequence. */
static void run_split_expand(const iha_shape *s, int rope, size_t a, uint64_t seed)
{
    tu_layer l;
    tu_layer_init(&l, s, seed);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, rope);
    const size_t nv = tu_count_virtual(s), D = s->model_dim;
    iha_layer_weights w = tu_storage_upload_weights(&l, IHA_STORAGE_F32, 0);
    const iha_buffer x = tu_storage_upload(IHA_STORAGE_F32, l.x, tu_count_x(s), 0);
    iha_buffer whole[3];
    float *host[3];
    for (int i = 0; i < 3; ++i) whole[i] = tu_storage_upload(IHA_STORAGE_F32, NULL, nv, 0);
    tu_assert_status(tu_ctx, iha_layer_expand(tu_ctx, s, &o, &w, 0, x, whole[0], whole[1], whole[2]), IHA_OK);
    for (int i = 0; i < 3; ++i) host[i] = read_new(IHA_STORAGE_F32, whole[i], nv, "whole");
    static const char *const names[3] = {"qt", "kt", "vt"};
    double worst = 0.0;
    for (int run = 0; run < 2; ++run) {
        const size_t first = run ? a : 0, n = run ? s->tokens - a : a;
        iha_shape rs = *s;
        rs.tokens = n;
        const size_t rv = tu_count_virtual(&rs);
        const iha_buffer rx = tu_storage_upload(IHA_STORAGE_F32, l.x + first * D, n * D, 3);
        iha_buffer part[3];
        for (int i = 0; i < 3; ++i) part[i] = tu_storage_upload(IHA_STORAGE_F32, NULL, rv, 1);
        tu_assert_status(tu_ctx, iha_layer_expand(tu_ctx, &rs, &o, &w, first, rx, part[0], part[1], part[2]), IHA_OK);
        for (int i = 0; i < 3; ++i) {
            float *got = read_new(IHA_STORAGE_F32, part[i], rv, names[i]), *want = rows_of(host[i], s, first, n);
            double *wd = to_double(want, rv);
            tu_assert_close(names[i], got, wd, rv, 1e-6);
            worst = fmax(worst, max_diff(got, want, rv));
            free(wd);
            free(want);
            free(got);
            tu_buffer_release(part[i].mem);
        }
        tu_buffer_release(rx.mem);
    }
    printf("    two runs: qt, kt, vt within %g of the whole sequence's\n", worst);
    for (int i = 0; i < 3; ++i) {
        free(host[i]);
        tu_buffer_release(whole[i].mem);
    }
    tu_buffer_release(x.mem);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

static void expand_runs_equal_whole(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    run_split_expand(&(iha_shape){1, 13, 12, 2, 8, 3}, 1, 5, 610);
    run_split_expand(&(iha_shape){1, 9, 8, 3, 6, 1}, 1, 1, 611);
    run_split_expand(&(iha_shape){1, 24, 16, 2, 8, 2}, 1, 17, 612); /* runs past the GEMV's 16 rows */
    run_split_expand(&(iha_shape){1, 7, 8, 2, 4, 2}, 0, 3, 613);
}

/* ---- Refusals ---- */

/* Every element of the n floats of b is still NaN (and its guards are untouched). */
static void assert_unwritten(iha_buffer b, size_t n, const char *what)
{
    float *got = read_new(IHA_STORAGE_F32, b, n, what);
    if (tu_count_nonfinite(got, n) != n) fail_msg("%s was written by a refused call", what);
    free(got);
}

/* A refusal with this status and a message. */
static void assert_refused(iha_status st, iha_status expected)
{
    tu_assert_status(tu_ctx, st, expected);
    const char *m = iha_context_message(tu_ctx);
    if (m == NULL || m[0] == '\0') fail_msg("a refusal without a message");
}

static void forward_stage_refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 6, 8, 2, 4, 2};
    tu_layer l;
    tu_layer_init(&l, &s, 700);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    const size_t nx = tu_count_x(&s), nv = tu_count_virtual(&s);
    iha_layer_weights w = tu_storage_upload_weights(&l, IHA_STORAGE_F32, 0);
    const iha_buffer x = tu_storage_upload(IHA_STORAGE_F32, l.x, nx, 0), none = {NULL, 0};
    iha_buffer t[3], z = tu_storage_upload(IHA_STORAGE_F32, NULL, nx, 0);
    for (int i = 0; i < 3; ++i) t[i] = tu_storage_upload(IHA_STORAGE_F32, NULL, nv, 0);
    const iha_status bad = IHA_ERROR_INVALID_ARGUMENT;

    assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, none, t[0], t[1], t[2]), bad);
    assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, t[0], none, t[2]), bad);
    assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, t[0], t[0], t[2]), bad);
    /* qt over x's buffer, at offset 0: they overlap. */
    cl_mem big = tu_buffer_guarded(tu_ctx, l.x, nx, 0, nv + TU_GUARD, TU_SENTINEL);
    assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, (iha_buffer){big, 0}, (iha_buffer){big, 1}, t[1], t[2]),
                   bad);
    tu_buffer_release(big);
    assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, t[0], t[1], w.wq), bad);
    assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, t[0], w.wk, t[2]), bad);
    assert_refused(iha_layer_expand(tu_ctx, &s, &o, NULL, 0, x, t[0], t[1], t[2]), bad);
    assert_refused(iha_layer_expand(tu_ctx, &s, NULL, &w, 0, x, t[0], t[1], t[2]), bad);
    assert_refused(
        iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, (iha_buffer){t[0].mem, t[0].offset + TU_GUARD + 1}, t[1], t[2]),
        IHA_ERROR_BUFFER_TOO_SMALL);
    iha_layer_weights no_alpha = w;
    no_alpha.alpha_v.mem = NULL;
    assert_refused(iha_layer_expand(tu_ctx, &s, &o, &no_alpha, 0, x, t[0], t[1], t[2]), bad);
    /* Packed sequences start at position 0: a run with first_token > 0 is refused. */
    const size_t lens[2] = {2, 4};
    iha_attention_options packed = o;
    packed.seq_lens = lens;
    packed.seq_count = 2;
    assert_refused(iha_layer_expand(tu_ctx, &s, &packed, &w, 1, x, t[0], t[1], t[2]), IHA_ERROR_UNSUPPORTED);
    assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, (size_t)1 << 40, x, t[0], t[1], t[2]), IHA_ERROR_UNSUPPORTED);
    assert_refused(iha_layer_expand(NULL, &s, &o, &w, 0, x, t[0], t[1], t[2]), bad);

    assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &w, none, z), bad);
    assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &w, t[0], none), bad);
    assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &w, t[0], w.wo), bad);
    assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &w, t[0], w.r), bad);
    assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &w, t[0], (iha_buffer){t[0].mem, t[0].offset + 1}), bad);
    iha_layer_weights no_r = w;
    no_r.r.mem = NULL;
    assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &no_r, t[0], z), bad);

    for (int i = 0; i < 3; ++i) assert_unwritten(t[i], nv, "qt, kt or vt");
    assert_unwritten(z, nx, "z");
    /* The members a stage ignores may be anything: expand without wo and r, collapse without
     * the projections and alphas, and the options each ignores out of range. */
    iha_layer_weights ew = w, cw = w;
    ew.wo.mem = ew.r.mem = NULL;
    cw.wq.mem = cw.wk.mem = cw.wv.mem = cw.alpha_q.mem = cw.alpha_k.mem = cw.alpha_v.mem = NULL;
    iha_attention_options odd = o;
    odd.mask = 99;
    odd.window = -1;
    tu_assert_status(tu_ctx, iha_layer_expand(tu_ctx, &s, &odd, &ew, 0, x, t[0], t[1], t[2]), IHA_OK);
    odd.rope = 1;
    odd.rope_base = -1.0f;
    tu_assert_status(tu_ctx, iha_layer_collapse(tu_ctx, &s, &odd, &cw, t[0], z), IHA_OK);

    for (int i = 0; i < 3; ++i) tu_buffer_release(t[i].mem);
    tu_buffer_release(x.mem);
    tu_buffer_release(z.mem);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(forward_stages_equal_forward),
        cmocka_unit_test(expand_runs_equal_whole),
        cmocka_unit_test(forward_stage_refusals),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
