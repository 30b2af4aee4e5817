/*
 * test_layer_stages_backward.c - the backward layer stages: iha_layer_collapse_backward and
 * iha_layer_expand_backward around iha_attention_backward (after iha_layer_expand and
 * iha_attention) give iha_backward's dx and every gradient on the forward test's cases, and with
 * accumulate add into prefilled outputs, both against the float64 reference; each output asked
 * for alone is what the call gives among all; iha_layer_expand_backward over two runs of one
 * sequence (first_token 0 and a, the second accumulating) gives the whole sequence's dx and
 * gradients. Refusals write nothing.
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

/* ---- The backward stages ---- */

enum { OUTS = 9 }; /* dx, then the gradients in iha_layer_grads order */
static const char *const out_names[OUTS] = {"dx", "dwq", "dwk", "dwv", "dwo", "dalpha_q", "dalpha_k", "dalpha_v", "dr"};

static size_t out_count(const iha_shape *s, int i)
{
    return i == 0 ? tu_count_x(s) : i < 5 ? tu_count_w(s) : tu_count_mix(s);
}

static iha_layer_grads grads_of(const iha_buffer out[OUTS])
{
    return (iha_layer_grads){out[1], out[2], out[3], out[4], out[5], out[6], out[7], out[8]};
}

/* The nine outputs in their storage, holding `prefill` (NULL: NaN). */
static void outputs_new(const iha_shape *s, const iha_attention_options *o, float *const prefill[OUTS],
                        iha_buffer out[OUTS])
{
    for (int i = 0; i < OUTS; ++i)
        out[i] = tu_storage_upload(i == 0 ? o->storage : o->weight_storage, prefill ? prefill[i] : NULL,
                                   out_count(s, i), 1 + (size_t)i);
}

static void outputs_release(iha_buffer out[OUTS])
{
    for (int i = 0; i < OUTS; ++i) tu_buffer_release(out[i].mem);
}

/* expand, attention, collapse_backward, attention_backward, expand_backward: iha_backward's
 * outputs from the stages. With options->accumulate the stages add into out, but the steps
 * between them (dout, and dqt, dkt, dvt of the attention backward, with its own options) start
 * from zero. */
static void stages_backward(const iha_shape *s, const iha_attention_options *o, const iha_layer_weights *w,
                            iha_buffer x, iha_buffer dz, const iha_buffer out[OUTS])
{
    iha_attention_options ao = st_attention_options(o);
    ao.accumulate = 0;
    const size_t nv = tu_count_virtual(s);
    float *zeros = calloc(nv, sizeof *zeros);
    assert_non_null(zeros);
    iha_buffer t[8]; /* qt, kt, vt, o, dout, dqt, dkt, dvt */
    for (int i = 0; i < 8; ++i) t[i] = tu_storage_upload(o->storage, i == 4 ? zeros : NULL, nv, (size_t)i);
    cl_mem lse = tu_buffer_guarded(tu_ctx, NULL, nv / s->head_dim, 0, TU_GUARD, TU_SENTINEL);
    const iha_layer_grads g = grads_of(out);
    tu_assert_status(tu_ctx, iha_layer_expand(tu_ctx, s, o, w, 0, x, t[0], t[1], t[2]), IHA_OK);
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, s, &ao, t[0], t[1], t[2], t[3], (iha_buffer){lse, 0}), IHA_OK);
    tu_assert_status(tu_ctx, iha_layer_collapse_backward(tu_ctx, s, o, w, t[3], dz, t[4], &g), IHA_OK);
    tu_assert_status(
        tu_ctx,
        iha_attention_backward(tu_ctx, s, &ao, t[0], t[1], t[2], t[3], (iha_buffer){lse, 0}, t[4], t[5], t[6], t[7]),
        IHA_OK);
    tu_assert_status(tu_ctx, iha_layer_expand_backward(tu_ctx, s, o, w, 0, x, t[5], t[6], t[7], out[0], &g), IHA_OK);
    for (int i = 0; i < 8; ++i) tu_buffer_release(t[i].mem);
    tu_buffer_release(lse);
    free(zeros);
}

/* The stages' outputs against iha_backward's and the float64 reference's (plus the prefill when
 * accumulating), every output prefilled when accumulating, NaN otherwise. */
static void run_backward_case(const st_case *c, int accumulate, uint64_t seed)
{
    tu_layer l;
    tu_layer_init(&l, &c->s, seed);
    if (c->identity) tu_layer_identity(&l, 1);
    iha_attention_options o = st_case_options(c);
    o.accumulate = accumulate;
    const size_t nx = tu_count_x(&c->s);
    tu_rng rng = tu_rng_seeded(seed + 1);
    float *dz = tu_random_array(&rng, nx, 1.0f), *prefill[OUTS];
    for (int i = 0; i < OUTS; ++i) prefill[i] = tu_random_array(&rng, out_count(&c->s, i), 0.5f);
    iha_layer_weights w = tu_storage_upload_weights(&l, c->weight, 3);
    const iha_buffer x = tu_storage_upload(c->act, l.x, nx, 5), bdz = tu_storage_upload(c->act, dz, nx, 2);
    iha_buffer whole[OUTS], staged[OUTS];
    outputs_new(&c->s, &o, accumulate ? prefill : NULL, whole);
    outputs_new(&c->s, &o, accumulate ? prefill : NULL, staged);
    const iha_layer_grads gw = grads_of(whole);
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &c->s, &o, &w, x, bdz, whole[0], &gw), IHA_OK);
    stages_backward(&c->s, &o, &w, x, bdz, staged);

    double *ref[OUTS];
    for (int i = 0; i < OUTS; ++i) ref[i] = tu_malloc(out_count(&c->s, i) * sizeof(double));
    const ref_grads rg = {ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], ref[6], ref[7], ref[8]};
    const ref_problem rp = tu_layer_problem(&l, &o);
    assert_int_equal(ref_backward(&rp, dz, &rg), 0);
    const int half = c->act != IHA_STORAGE_F32 || c->weight != IHA_STORAGE_F32;
    double worst = 0.0;
    for (int i = 0; i < OUTS; ++i) {
        const size_t n = out_count(&c->s, i);
        const int storage = i == 0 ? c->act : c->weight;
        /* The prefill as the output held it: rounded to its storage. */
        float *pre = tu_malloc(n * sizeof *pre);
        if (accumulate) {
            const iha_buffer b = tu_storage_upload(storage, prefill[i], n, 0);
            tu_storage_read(storage, b, n, pre, "prefill");
            tu_buffer_release(b.mem);
            for (size_t j = 0; j < n; ++j) ref[i][j] += pre[j];
        }
        float *a = st_read(storage, whole[i], n, out_names[i]), *b = st_read(storage, staged[i], n, out_names[i]);
        char what[64];
        snprintf(what, sizeof what, "%s (stages)", out_names[i]);
        tu_assert_close(what, b, ref[i], n, half ? ST_TOL_F16 : TU_TOL_F32);
        snprintf(what, sizeof what, "%s (iha_backward)", out_names[i]);
        tu_assert_close(what, a, ref[i], n, half ? ST_TOL_F16 : TU_TOL_F32);
        /* Float: the same kernels on the same values but for the order of a few sums (dX adds
         * its three products in the same order; the attention backward is the same call). */
        double *ad = st_to_double(a, n);
        snprintf(what, sizeof what, "%s (stages against iha_backward)", out_names[i]);
        tu_assert_close(what, b, ad, n, half ? ST_TOL_F16 : 1e-6);
        if (!half) worst = fmax(worst, st_max_diff(a, b, n));
        free(ad);
        free(a);
        free(b);
        free(pre);
        free(ref[i]);
        free(prefill[i]);
    }
    if (!half) printf("    backward stages: within %g of iha_backward's\n", worst);
    outputs_release(whole);
    outputs_release(staged);
    tu_buffer_release(x.mem);
    tu_buffer_release(bdz.mem);
    free(dz);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

static void backward_stages_equal_backward(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t i = 0; i < ST_CASES; ++i) run_backward_case(&st_cases[i], 0, 800 + i);
}

static void backward_stages_accumulate(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    run_backward_case(&st_cases[0], 1, 820); /* float, rotary, P = 3 */
    run_backward_case(&st_cases[1], 1, 821); /* a window */
    run_backward_case(&st_cases[6], 1, 822); /* half activations and weights */
    run_backward_case(&st_cases[7], 1, 823); /* half activations, float weights */
}

/* Bit for bit the n floats of a and b, or fail naming `what`. */
static void assert_same(iha_buffer a, iha_buffer b, size_t n, const char *what)
{
    float *x = st_read(IHA_STORAGE_F32, a, n, what), *y = st_read(IHA_STORAGE_F32, b, n, what);
    if (memcmp(x, y, n * sizeof *x) != 0) fail_msg("%s asked for alone differs from %s among all", what, what);
    free(x);
    free(y);
}

/* Each output of the two backward stages asked for alone (the others NULL) is what the call
 * gives it among all of them: the steps it needs run as they run for all. */
static void backward_outputs_one_at_a_time(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 7, 12, 2, 8, 2};
    tu_layer l;
    tu_layer_init(&l, &s, 930);
    const iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 3, 1), ao = st_attention_options(&o);
    const size_t nx = tu_count_x(&s), nv = tu_count_virtual(&s);
    tu_rng rng = tu_rng_seeded(931);
    float *dz = tu_random_array(&rng, nx, 1.0f);
    iha_layer_weights w = tu_storage_upload_weights(&l, IHA_STORAGE_F32, 0);
    const iha_buffer x = tu_storage_upload(IHA_STORAGE_F32, l.x, nx, 0),
                     bdz = tu_storage_upload(IHA_STORAGE_F32, dz, nx, 0);
    iha_buffer t[8]; /* qt, kt, vt, o, dout, dqt, dkt, dvt */
    for (int i = 0; i < 8; ++i) t[i] = tu_storage_upload(IHA_STORAGE_F32, NULL, nv, 0);
    cl_mem lse = tu_buffer_guarded(tu_ctx, NULL, nv / s.head_dim, 0, TU_GUARD, TU_SENTINEL);
    iha_buffer all[OUTS], one[OUTS];
    outputs_new(&s, &o, NULL, all);
    outputs_new(&s, &o, NULL, one);
    const iha_layer_grads g = grads_of(all);
    tu_assert_status(tu_ctx, iha_layer_expand(tu_ctx, &s, &o, &w, 0, x, t[0], t[1], t[2]), IHA_OK);
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, &s, &ao, t[0], t[1], t[2], t[3], (iha_buffer){lse, 0}), IHA_OK);
    tu_assert_status(tu_ctx, iha_layer_collapse_backward(tu_ctx, &s, &o, &w, t[3], bdz, t[4], &g), IHA_OK);
    tu_assert_status(
        tu_ctx,
        iha_attention_backward(tu_ctx, &s, &ao, t[0], t[1], t[2], t[3], (iha_buffer){lse, 0}, t[4], t[5], t[6], t[7]),
        IHA_OK);
    tu_assert_status(tu_ctx, iha_layer_expand_backward(tu_ctx, &s, &o, &w, 0, x, t[5], t[6], t[7], all[0], &g), IHA_OK);

    const iha_buffer none = {NULL, 0};
    const iha_buffer dout1 = tu_storage_upload(IHA_STORAGE_F32, NULL, nv, 0);
    tu_assert_status(tu_ctx, iha_layer_collapse_backward(tu_ctx, &s, &o, &w, t[3], bdz, dout1, NULL), IHA_OK);
    assert_same(dout1, t[4], nv, "dout");
    tu_buffer_release(dout1.mem);
    for (int i = 1; i < OUTS; ++i) {
        iha_buffer only[OUTS];
        for (int j = 0; j < OUTS; ++j) only[j] = j == i ? one[i] : none;
        const iha_layer_grads gi = grads_of(only);
        if (i == 4 || i == 8)
            tu_assert_status(tu_ctx, iha_layer_collapse_backward(tu_ctx, &s, &o, &w, t[3], bdz, none, &gi), IHA_OK);
        else
            tu_assert_status(tu_ctx, iha_layer_expand_backward(tu_ctx, &s, &o, &w, 0, x, t[5], t[6], t[7], none, &gi),
                             IHA_OK);
        assert_same(one[i], all[i], out_count(&s, i), out_names[i]);
    }
    tu_assert_status(tu_ctx, iha_layer_expand_backward(tu_ctx, &s, &o, &w, 0, x, t[5], t[6], t[7], one[0], NULL),
                     IHA_OK);
    assert_same(one[0], all[0], nx, "dx");

    outputs_release(all);
    outputs_release(one);
    for (int i = 0; i < 8; ++i) tu_buffer_release(t[i].mem);
    tu_buffer_release(lse);
    tu_buffer_release(x.mem);
    tu_buffer_release(bdz.mem);
    free(dz);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

/* iha_layer_expand_backward over tokens 0..a-1 and a..N-1 (first_token a), the second run
 * adding its gradients into the first's (accumulate): dx row for row, and the gradients, as one
 * call over the whole sequence. */
static void run_split_expand_backward(const iha_shape *s, size_t a, uint64_t seed)
{
    tu_layer l;
    tu_layer_init(&l, s, seed);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    const size_t nv = tu_count_virtual(s), D = s->model_dim, nx = tu_count_x(s);
    tu_rng rng = tu_rng_seeded(seed + 1);
    float *dt[3];
    iha_buffer bdt[3];
    for (int i = 0; i < 3; ++i) {
        dt[i] = tu_random_array(&rng, nv, 1.0f);
        bdt[i] = tu_storage_upload(IHA_STORAGE_F32, dt[i], nv, 1);
    }
    iha_layer_weights w = tu_storage_upload_weights(&l, IHA_STORAGE_F32, 0);
    const iha_buffer x = tu_storage_upload(IHA_STORAGE_F32, l.x, nx, 0);
    iha_buffer whole[OUTS], parts[OUTS];
    outputs_new(s, &o, NULL, whole);
    outputs_new(s, &o, NULL, parts);
    const iha_layer_grads gw = grads_of(whole), gp = grads_of(parts);
    tu_assert_status(tu_ctx, iha_layer_expand_backward(tu_ctx, s, &o, &w, 0, x, bdt[0], bdt[1], bdt[2], whole[0], &gw),
                     IHA_OK);
    float *dx_runs = tu_malloc(nx * sizeof *dx_runs);
    for (int run = 0; run < 2; ++run) {
        const size_t first = run ? a : 0, n = run ? s->tokens - a : a;
        iha_shape rs = *s;
        rs.tokens = n;
        const size_t rv = tu_count_virtual(&rs);
        o.accumulate = run;
        const iha_buffer rx = tu_storage_upload(IHA_STORAGE_F32, l.x + first * D, n * D, 3);
        /* The second run adds dx too: its own, into zeros. */
        float *zeros = calloc(n * D, sizeof *zeros);
        assert_non_null(zeros);
        const iha_buffer rdx = tu_storage_upload(IHA_STORAGE_F32, run ? zeros : NULL, n * D, 2);
        free(zeros);
        iha_buffer rdt[3];
        for (int i = 0; i < 3; ++i) {
            float *rows = st_rows_of(dt[i], s, first, n);
            rdt[i] = tu_storage_upload(IHA_STORAGE_F32, rows, rv, 4);
            free(rows);
        }
        tu_assert_status(tu_ctx,
                         iha_layer_expand_backward(tu_ctx, &rs, &o, &w, first, rx, rdt[0], rdt[1], rdt[2], rdx, &gp),
                         IHA_OK);
        tu_storage_read(IHA_STORAGE_F32, rdx, n * D, dx_runs + first * D, "dx of a run");
        for (int i = 0; i < 3; ++i) tu_buffer_release(rdt[i].mem);
        tu_buffer_release(rx.mem);
        tu_buffer_release(rdx.mem);
    }
    /* The outputs the call ignores (wo, r) are left as they were. */
    for (int i = 0; i < OUTS; ++i) {
        const size_t n = out_count(s, i);
        float *want = st_read(IHA_STORAGE_F32, whole[i], n, out_names[i]);
        float *got = i == 0 ? dx_runs : st_read(IHA_STORAGE_F32, parts[i], n, out_names[i]);
        if (i == 4 || i == 8) {
            if (tu_count_nonfinite(got, n) != n || tu_count_nonfinite(want, n) != n)
                fail_msg("%s was written by iha_layer_expand_backward", out_names[i]);
        } else {
            double *wd = st_to_double(want, n);
            tu_assert_close(out_names[i], got, wd, n, i == 0 ? 1e-6 : 1e-5);
            free(wd);
        }
        free(want);
        if (i != 0) free(got);
    }
    free(dx_runs);
    outputs_release(whole);
    outputs_release(parts);
    for (int i = 0; i < 3; ++i) {
        free(dt[i]);
        tu_buffer_release(bdt[i].mem);
    }
    tu_buffer_release(x.mem);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

static void expand_backward_runs_sum_to_whole(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    run_split_expand_backward(&(iha_shape){1, 13, 12, 2, 8, 3}, 5, 910);
    run_split_expand_backward(&(iha_shape){1, 24, 16, 2, 8, 2}, 17, 911);
}

static void backward_stage_refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 6, 8, 2, 4, 2};
    tu_layer l;
    tu_layer_init(&l, &s, 710);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    const size_t nx = tu_count_x(&s), nv = tu_count_virtual(&s);
    tu_rng rng = tu_rng_seeded(711);
    float *vals = tu_random_array(&rng, nv, 1.0f);
    iha_layer_weights w = tu_storage_upload_weights(&l, IHA_STORAGE_F32, 0);
    const iha_buffer x = tu_storage_upload(IHA_STORAGE_F32, l.x, nx, 0), none = {NULL, 0};
    const iha_buffer dz = tu_storage_upload(IHA_STORAGE_F32, l.x, nx, 1);
    iha_buffer t[4], out[OUTS]; /* o (or dqt), dkt, dvt, dout */
    for (int i = 0; i < 4; ++i) t[i] = tu_storage_upload(IHA_STORAGE_F32, i < 3 ? vals : NULL, nv, 0);
    outputs_new(&s, &o, NULL, out);
    iha_layer_grads g = grads_of(out), bad;
    const iha_status inv = IHA_ERROR_INVALID_ARGUMENT;

    st_assert_refused(iha_layer_collapse_backward(tu_ctx, &s, &o, &w, none, dz, t[3], &g), inv);
    st_assert_refused(iha_layer_collapse_backward(tu_ctx, &s, &o, &w, t[0], none, t[3], &g), inv);
    st_assert_refused(iha_layer_collapse_backward(tu_ctx, &s, &o, &w, t[0], dz, t[0], &g), inv);
    bad = g;
    bad.wo = w.wo;
    st_assert_refused(iha_layer_collapse_backward(tu_ctx, &s, &o, &w, t[0], dz, t[3], &bad), inv);
    bad = g;
    bad.r = (iha_buffer){t[3].mem, t[3].offset + 2}; /* inside dout */
    st_assert_refused(iha_layer_collapse_backward(tu_ctx, &s, &o, &w, t[0], dz, t[3], &bad), inv);
    bad = g;
    bad.r = (iha_buffer){out[8].mem, out[8].offset + TU_GUARD + 1};
    st_assert_refused(iha_layer_collapse_backward(tu_ctx, &s, &o, &w, t[0], dz, t[3], &bad),
                      IHA_ERROR_BUFFER_TOO_SMALL);

    st_assert_refused(iha_layer_expand_backward(tu_ctx, &s, &o, &w, 0, none, t[0], t[1], t[2], out[0], &g), inv);
    st_assert_refused(iha_layer_expand_backward(tu_ctx, &s, &o, &w, 0, x, t[0], none, t[2], out[0], &g), inv);
    st_assert_refused(iha_layer_expand_backward(tu_ctx, &s, &o, &w, 0, x, t[0], t[1], t[2], x, &g), inv);
    bad = g;
    bad.wq = (iha_buffer){t[1].mem, 0}; /* over dkt */
    st_assert_refused(iha_layer_expand_backward(tu_ctx, &s, &o, &w, 0, x, t[0], t[1], t[2], out[0], &bad), inv);
    bad = g;
    bad.alpha_v = bad.alpha_q;
    st_assert_refused(iha_layer_expand_backward(tu_ctx, &s, &o, &w, 0, x, t[0], t[1], t[2], out[0], &bad), inv);
    bad = g;
    bad.alpha_k = w.alpha_k;
    st_assert_refused(iha_layer_expand_backward(tu_ctx, &s, &o, &w, 0, x, t[0], t[1], t[2], out[0], &bad), inv);
    const size_t lens[2] = {4, 2};
    iha_attention_options packed = o;
    packed.seq_lens = lens;
    packed.seq_count = 2;
    st_assert_refused(iha_layer_expand_backward(tu_ctx, &s, &packed, &w, 2, x, t[0], t[1], t[2], out[0], &g),
                      IHA_ERROR_UNSUPPORTED);
    st_assert_refused(iha_layer_expand_backward(NULL, &s, &o, &w, 0, x, t[0], t[1], t[2], out[0], &g), inv);

    st_assert_unwritten(t[3], nv, "dout");
    for (int i = 0; i < OUTS; ++i) st_assert_unwritten(out[i], out_count(&s, i), out_names[i]);
    /* grads NULL: dout alone, and dx alone. */
    tu_assert_status(tu_ctx, iha_layer_collapse_backward(tu_ctx, &s, &o, &w, t[0], dz, t[3], NULL), IHA_OK);
    tu_assert_status(tu_ctx, iha_layer_expand_backward(tu_ctx, &s, &o, &w, 0, x, t[0], t[1], t[2], out[0], NULL),
                     IHA_OK);
    float *d = st_read(IHA_STORAGE_F32, t[3], nv, "dout");
    assert_int_equal(tu_count_nonfinite(d, nv), 0);
    free(d);
    d = st_read(IHA_STORAGE_F32, out[0], nx, "dx");
    assert_int_equal(tu_count_nonfinite(d, nx), 0);
    free(d);

    outputs_release(out);
    for (int i = 0; i < 4; ++i) tu_buffer_release(t[i].mem);
    tu_buffer_release(x.mem);
    tu_buffer_release(dz.mem);
    free(vals);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(backward_stages_equal_backward), cmocka_unit_test(backward_stages_accumulate),
        cmocka_unit_test(backward_outputs_one_at_a_time), cmocka_unit_test(expand_backward_runs_sum_to_whole),
        cmocka_unit_test(backward_stage_refusals),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
