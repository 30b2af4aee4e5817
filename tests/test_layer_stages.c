/*
 * test_layer_stages.c - the forward layer stages (include/iha.h, "Layer stages"): iha_layer_expand,
 * then iha_attention on its outputs (rope 0), then iha_layer_collapse gives iha_forward's z, for
 * every mask, windows, rotary, P = 1 (the identity shortcut too) to 3, packed sequences, float and
 * half storage; both against the float64 reference. iha_layer_expand over two runs of one sequence
 * (first_token 0 and a) gives the rows of one call over the whole sequence, which the
 * sequence-parallel layer relies on. Refusals write nothing. The backward stages:
 * tests/test_layer_stages_backward.c.
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
#include "test_stages.h"
#include "test_storage.h"
#include "test_util.h"

/* ---- The forward stages ---- */

/* expand -> attention -> collapse against iha_forward and the float64 reference. */
static void run_forward_case(const st_case *c, uint64_t seed)
{
    tu_layer l;
    tu_layer_init(&l, &c->s, seed);
    if (c->identity) tu_layer_identity(&l, 1);
    const iha_attention_options o = st_case_options(c), ao = st_attention_options(&o);
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

    float *zf = st_read(c->act, z, nx, "z (iha_forward)"), *zst = st_read(c->act, zs, nx, "z (stages)");
    double *ref = tu_layer_reference(&l, &o);
    const int half = c->act != IHA_STORAGE_F32 || c->weight != IHA_STORAGE_F32;
    const double tol = half ? ST_TOL_F16 : TU_TOL_F32;
    tu_assert_close("z (iha_forward)", zf, ref, nx, tol);
    tu_assert_close("z (stages)", zst, ref, nx, tol);
    /* Float: the stages run iha_forward's kernels on the same values (the keys as rows, packed
     * by iha_attention, instead of packed by the mixing), and on PoCL z comes out bit for bit;
     * the check allows float rounding, which other devices' kernel choices may change. Half:
     * the stages round Qt, Kt, Vt and O to half between the calls, which iha_forward keeps in
     * float, so the two agree only within the half contract. */
    double *zd = st_to_double(zf, nx);
    tu_assert_close("z (stages against iha_forward)", zst, zd, nx, half ? ST_TOL_F16 : 1e-6);
    if (!half) printf("    stages: z within %g of iha_forward's\n", st_max_diff(zf, zst, nx));
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
    for (size_t i = 0; i < ST_CASES; ++i) run_forward_case(&st_cases[i], 500 + i);
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
    for (int i = 0; i < 3; ++i) host[i] = st_read(IHA_STORAGE_F32, whole[i], nv, "whole");
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
            float *got = st_read(IHA_STORAGE_F32, part[i], rv, names[i]), *want = st_rows_of(host[i], s, first, n);
            double *wd = st_to_double(want, rv);
            tu_assert_close(names[i], got, wd, rv, 1e-6);
            worst = fmax(worst, st_max_diff(got, want, rv));
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

    st_assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, none, t[0], t[1], t[2]), bad);
    st_assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, t[0], none, t[2]), bad);
    st_assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, t[0], t[0], t[2]), bad);
    /* qt over x's buffer, at offset 0: they overlap. */
    cl_mem big = tu_buffer_guarded(tu_ctx, l.x, nx, 0, nv + TU_GUARD, TU_SENTINEL);
    st_assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, (iha_buffer){big, 0}, (iha_buffer){big, 1}, t[1], t[2]),
                      bad);
    tu_buffer_release(big);
    st_assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, t[0], t[1], w.wq), bad);
    st_assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, t[0], w.wk, t[2]), bad);
    st_assert_refused(iha_layer_expand(tu_ctx, &s, &o, NULL, 0, x, t[0], t[1], t[2]), bad);
    st_assert_refused(iha_layer_expand(tu_ctx, &s, NULL, &w, 0, x, t[0], t[1], t[2]), bad);
    st_assert_refused(
        iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, (iha_buffer){t[0].mem, t[0].offset + TU_GUARD + 1}, t[1], t[2]),
        IHA_ERROR_BUFFER_TOO_SMALL);
    iha_layer_weights no_alpha = w;
    no_alpha.alpha_v.mem = NULL;
    st_assert_refused(iha_layer_expand(tu_ctx, &s, &o, &no_alpha, 0, x, t[0], t[1], t[2]), bad);
    /* Packed sequences start at position 0: a run with first_token > 0 is refused. */
    const size_t lens[2] = {2, 4};
    iha_attention_options packed = o;
    packed.seq_lens = lens;
    packed.seq_count = 2;
    st_assert_refused(iha_layer_expand(tu_ctx, &s, &packed, &w, 1, x, t[0], t[1], t[2]), IHA_ERROR_UNSUPPORTED);
    st_assert_refused(iha_layer_expand(tu_ctx, &s, &o, &w, (size_t)1 << 40, x, t[0], t[1], t[2]),
                      IHA_ERROR_UNSUPPORTED);
    st_assert_refused(iha_layer_expand(NULL, &s, &o, &w, 0, x, t[0], t[1], t[2]), bad);

    st_assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &w, none, z), bad);
    st_assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &w, t[0], none), bad);
    st_assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &w, t[0], w.wo), bad);
    st_assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &w, t[0], w.r), bad);
    st_assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &w, t[0], (iha_buffer){t[0].mem, t[0].offset + 1}), bad);
    iha_layer_weights no_r = w;
    no_r.r.mem = NULL;
    st_assert_refused(iha_layer_collapse(tu_ctx, &s, &o, &no_r, t[0], z), bad);

    for (int i = 0; i < 3; ++i) st_assert_unwritten(t[i], nv, "qt, kt or vt");
    st_assert_unwritten(z, nx, "z");
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
