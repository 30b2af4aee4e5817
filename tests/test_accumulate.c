/*
 * test_accumulate.c - iha_attention_options.accumulate: every backward call (iha_attention_backward,
 * iha_backward, iha_backward_saved, iha_attention_core_backward) adds its gradients into outputs
 * that already hold values, in float, half and bfloat16 storage: prefilled outputs end as the prefill
 * plus what the same call writes into NaN-poisoned ones, within one rounding of the storage.
 * And the use it exists for: two accumulated calls on the two halves of a batch give the weight
 * gradients of the whole batch.
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

#include "gemm/sgemm.h" /* the context's GEMM backend, forced to CLBlast below */
#include "test_layer.h"
#include "test_util.h"

/* The sum is rounded once into the storage: float outputs differ from prefill + overwrite by an
 * ulp or so, half ones by a half ulp of each term. */
#define TOL_SUM_F32 1e-6
#define TOL_F16 2e-3  /* doc/spec.md: half storage */
#define TOL_BF16 1e-2 /* and bfloat16 storage */
#define GUARD 13
#define SENTINEL (-3.0f)
#define OUT_OFFSET 2

enum { MAX_OUTPUTS = 9, MIX = 4 };

/* Every input of every call, on the device in one storage of activations and one of weights. */
typedef struct fixture {
    iha_shape s;
    int act, weight;
    tu_layer l;
    iha_layer_weights w;
    iha_buffer x, dz;              /* [B][N][D] */
    iha_buffer q, k, v, dy;        /* [B][N][H][d] */
    iha_buffer qt, kt, vt, o, dout; /* [B][H][T][d]; o from iha_attention */
    iha_buffer lse, saved;         /* float */
} fixture;

static iha_buffer upload(int storage, const float *data, size_t n, size_t offset)
{
    return (iha_buffer){tu_tensor_guarded(tu_ctx, storage, data, n, offset, 0, 0.0f), offset};
}

static iha_buffer upload_random(tu_rng *rng, int storage, size_t n, size_t offset)
{
    float *h = tu_random_array(rng, n, 1.0f);
    const iha_buffer b = upload(storage, h, n, offset);
    free(h);
    return b;
}

static void fixture_init(fixture *f, const iha_shape *s, int act, int weight, const iha_attention_options *o)
{
    memset(f, 0, sizeof *f);
    f->s = *s, f->act = act, f->weight = weight;
    tu_layer_init(&f->l, s, 31);
    const size_t nw = tu_count_w(s), nm = tu_count_mix(s), nx = tu_count_x(s), nh = tu_count_heads(s);
    const size_t nv = tu_count_virtual(s);
    const float *ws[8] = {f->l.wq, f->l.wk, f->l.wv, f->l.wo, f->l.alpha_q, f->l.alpha_k, f->l.alpha_v, f->l.r};
    iha_buffer *wd[8] = {&f->w.wq, &f->w.wk, &f->w.wv, &f->w.wo, &f->w.alpha_q, &f->w.alpha_k, &f->w.alpha_v, &f->w.r};
    for (int i = 0; i < 8; i++) *wd[i] = upload(weight, ws[i], i < 4 ? nw : nm, (size_t)i);
    f->x = upload(act, f->l.x, nx, 1);
    tu_rng rng = tu_rng_seeded(32);
    f->dz = upload_random(&rng, act, nx, 3);
    iha_buffer *heads[4] = {&f->q, &f->k, &f->v, &f->dy};
    for (int i = 0; i < 4; i++) *heads[i] = upload_random(&rng, act, nh, (size_t)i);
    iha_buffer *pseudo[4] = {&f->qt, &f->kt, &f->vt, &f->dout};
    for (int i = 0; i < 4; i++) *pseudo[i] = upload_random(&rng, act, nv, (size_t)i + 1);
    const size_t rows = nv / s->head_dim;
    f->o = upload(act, NULL, nv, 0);
    f->lse = upload(IHA_STORAGE_F32, NULL, rows, 0);
    iha_attention_options plain = *o;
    plain.rope = 0;
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, s, &plain, f->qt, f->kt, f->vt, f->o, f->lse), IHA_OK);
    size_t ns = 0;
    tu_assert_status(tu_ctx, iha_saved_elements(tu_ctx, s, &ns), IHA_OK);
    f->saved = upload(IHA_STORAGE_F32, NULL, ns, 0);
    const iha_buffer z = upload(act, NULL, nx, 0);
    tu_assert_status(tu_ctx, iha_forward_save(tu_ctx, s, o, &f->w, f->x, z, f->saved), IHA_OK);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    tu_buffer_release(z.mem);
}

static void fixture_free(fixture *f)
{
    const iha_buffer all[] = {f->x,  f->dz, f->q, f->k,    f->v,   f->dy,   f->qt,
                              f->kt, f->vt, f->o, f->dout, f->lse, f->saved};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tu_buffer_release(all[i].mem);
    tu_layer_weights_release(&f->w);
    tu_layer_free(&f->l);
}

/* One backward call: its outputs' counts and storage, and how to run it on them. */
typedef struct call {
    const char *name;
    int outputs;
    iha_status (*run)(const fixture *f, const iha_attention_options *o, const iha_buffer *out);
} call;

static iha_layer_grads layer_grads(const iha_buffer *out)
{
    return (iha_layer_grads){out[1], out[2], out[3], out[4], out[5], out[6], out[7], out[8]};
}

static iha_status run_attention(const fixture *f, const iha_attention_options *o, const iha_buffer *out)
{
    iha_attention_options plain = *o;
    plain.rope = 0;
    return iha_attention_backward(tu_ctx, &f->s, &plain, f->qt, f->kt, f->vt, f->o, f->lse, f->dout, out[0], out[1],
                                  out[2]);
}

static iha_status run_layer(const fixture *f, const iha_attention_options *o, const iha_buffer *out)
{
    const iha_layer_grads g = layer_grads(out);
    return iha_backward(tu_ctx, &f->s, o, &f->w, f->x, f->dz, out[0], &g);
}

static iha_status run_saved(const fixture *f, const iha_attention_options *o, const iha_buffer *out)
{
    const iha_layer_grads g = layer_grads(out);
    return iha_backward_saved(tu_ctx, &f->s, o, &f->w, f->x, f->saved, f->dz, out[0], &g);
}

static iha_status run_core(const fixture *f, const iha_attention_options *o, const iha_buffer *out)
{
    const iha_layer_grads g = {.alpha_q = out[3], .alpha_k = out[4], .alpha_v = out[5], .r = out[6]};
    return iha_attention_core_backward(tu_ctx, &f->s, o, &f->w, f->q, f->k, f->v, f->dy, out[0], out[1], out[2], &g);
}

static const call kCalls[] = {
    {"iha_attention_backward", 3, run_attention},
    {"iha_backward", 9, run_layer},
    {"iha_backward_saved", 9, run_saved},
    {"iha_attention_core_backward", 7, run_core},
};

/* Output i of call c: its element count, and whether it is an activation (else a weight's
 * gradient). */
static int is_activation(const call *c, int i)
{
    return c->run == run_attention || i == 0 || (c->run == run_core && i < 3);
}
static size_t output_count(const call *c, const iha_shape *s, int i)
{
    if (c->run == run_attention) return tu_count_virtual(s);
    if (c->run == run_core) return i < 3 ? tu_count_heads(s) : tu_count_mix(s);
    return i == 0 ? tu_count_x(s) : i < 5 ? tu_count_w(s) : tu_count_mix(s);
}

static float *read_output(const call *c, const fixture *f, iha_buffer b, int i)
{
    const size_t n = output_count(c, &f->s, i);
    float *got = tu_malloc(n * sizeof *got);
    tu_tensor_read_checked(tu_ctx, is_activation(c, i) ? f->act : f->weight, b.mem, n, OUT_OFFSET, GUARD, SENTINEL,
                           got, c->name);
    return got;
}

/* The call into NaN-poisoned outputs, then with accumulate into outputs prefilled with random
 * values about as large as its results: each accumulated output is the prefill plus the
 * overwritten one. */
static void prefill_plus_overwrite(const call *c, fixture *f, const iha_attention_options *base)
{
    iha_buffer fresh[MAX_OUTPUTS], added[MAX_OUTPUTS];
    float *result[MAX_OUTPUTS], *prefill[MAX_OUTPUTS];
    tu_rng rng = tu_rng_seeded(77);
    for (int i = 0; i < c->outputs; i++) {
        const int st = is_activation(c, i) ? f->act : f->weight;
        const size_t n = output_count(c, &f->s, i);
        fresh[i] = (iha_buffer){tu_tensor_guarded(tu_ctx, st, NULL, n, OUT_OFFSET, GUARD, SENTINEL), OUT_OFFSET};
    }
    iha_attention_options o = *base;
    tu_assert_status(tu_ctx, c->run(f, &o, fresh), IHA_OK);
    for (int i = 0; i < c->outputs; i++) {
        const size_t n = output_count(c, &f->s, i);
        result[i] = read_output(c, f, fresh[i], i);
        double ss = 0.0;
        for (size_t j = 0; j < n; j++) ss += (double)result[i][j] * result[i][j];
        prefill[i] = tu_random_array(&rng, n, (float)sqrt(ss / (double)n) + 1e-3f);
        const int st = is_activation(c, i) ? f->act : f->weight;
        added[i] = (iha_buffer){tu_tensor_guarded(tu_ctx, st, prefill[i], n, OUT_OFFSET, GUARD, SENTINEL), OUT_OFFSET};
        /* The prefill as the device holds it (rounded to half with half storage). */
        free(prefill[i]);
        prefill[i] = read_output(c, f, added[i], i);
    }
    o.accumulate = 1;
    tu_assert_status(tu_ctx, c->run(f, &o, added), IHA_OK);
    for (int i = 0; i < c->outputs; i++) {
        const size_t n = output_count(c, &f->s, i);
        float *got = read_output(c, f, added[i], i);
        double *want = tu_malloc(n * sizeof *want);
        for (size_t j = 0; j < n; j++) want[j] = (double)prefill[i][j] + result[i][j];
        const int st = is_activation(c, i) ? f->act : f->weight;
        char what[96];
        snprintf(what, sizeof what, "%s, output %d accumulated", c->name, i);
        tu_assert_close(what, got, want, n,
                        st == IHA_STORAGE_F16 ? TOL_F16 : st == IHA_STORAGE_BF16 ? TOL_BF16 : TOL_SUM_F32);
        free(got), free(want), free(result[i]), free(prefill[i]);
        tu_buffer_release(fresh[i].mem), tu_buffer_release(added[i].mem);
    }
}

static const iha_shape kShape = {2, 6, 8, 2, 4, 2};

static void each_call(int act, int weight)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    o.storage = act, o.weight_storage = weight;
    fixture f;
    fixture_init(&f, &kShape, act, weight, &o);
    for (size_t i = 0; i < sizeof kCalls / sizeof kCalls[0]; i++) prefill_plus_overwrite(&kCalls[i], &f, &o);
    fixture_free(&f);
}

static void float_storage(void **state)
{
    (void)state;
    each_call(IHA_STORAGE_F32, IHA_STORAGE_F32);
}

static void half_storage(void **state)
{
    (void)state;
    each_call(IHA_STORAGE_F16, IHA_STORAGE_F16);
}

static void bf16_storage(void **state)
{
    (void)state;
    each_call(IHA_STORAGE_BF16, IHA_STORAGE_BF16);
}

/* Float storage with CLBlast as the GEMM backend, whatever the device's default: its beta = 1
 * products add dx and the projections' gradients. */
static void float_storage_clblast(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    if (tu_ctx->loop_flag != NULL) skip(); /* CLBlast is refused on such drivers */
    const iha_gemm_config backend = tu_ctx->gemm->config;
    tu_ctx->gemm->config.own = 0;
    each_call(IHA_STORAGE_F32, IHA_STORAGE_F32);
    tu_ctx->gemm->config = backend;
}

/* Half activations with float weights: dx and dq, dk, dv are added in half, the products that
 * give the weights' gradients add themselves (beta = 1). */
static void half_activations_float_weights(void **state)
{
    (void)state;
    each_call(IHA_STORAGE_F16, IHA_STORAGE_F32);
}

/* The weight gradients of the two-sequence batch, against an overwriting call on its first
 * sequence followed by an accumulating one on its second (each a batch of one, at offsets into
 * the same buffers). */
static void micro_batches(const call *c, int weight)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_attention_options o = tu_options(IHA_MASK_TOKEN_CAUSAL, 2, 1);
    o.weight_storage = weight;
    fixture f;
    fixture_init(&f, &kShape, IHA_STORAGE_F32, weight, &o);
    iha_buffer whole[MAX_OUTPUTS], parts[MAX_OUTPUTS];
    const int first = c->run == run_core ? 3 : 1; /* the weight gradients */
    for (int i = 0; i < c->outputs; i++) {
        whole[i] = parts[i] = (iha_buffer){NULL, 0};
        if (i < first) continue;
        const size_t n = output_count(c, &f.s, i);
        whole[i] = (iha_buffer){tu_tensor_guarded(tu_ctx, weight, NULL, n, OUT_OFFSET, GUARD, SENTINEL), OUT_OFFSET};
        parts[i] = (iha_buffer){tu_tensor_guarded(tu_ctx, weight, NULL, n, OUT_OFFSET, GUARD, SENTINEL), OUT_OFFSET};
    }
    tu_assert_status(tu_ctx, c->run(&f, &o, whole), IHA_OK);
    fixture half = f;
    half.s.batch = 1;
    const size_t nx = tu_count_x(&half.s), nh = tu_count_heads(&half.s);
    for (size_t b = 0; b < 2; b++) {
        iha_buffer *shifted[6] = {&half.x, &half.dz, &half.q, &half.k, &half.v, &half.dy};
        const iha_buffer *from[6] = {&f.x, &f.dz, &f.q, &f.k, &f.v, &f.dy};
        for (int t = 0; t < 6; t++) *shifted[t] = (iha_buffer){from[t]->mem, from[t]->offset + b * (t < 2 ? nx : nh)};
        o.accumulate = b > 0;
        tu_assert_status(tu_ctx, c->run(&half, &o, parts), IHA_OK);
    }
    for (int i = first; i < c->outputs; i++) {
        const size_t n = output_count(c, &f.s, i);
        float *want = read_output(c, &f, whole[i], i), *got = read_output(c, &f, parts[i], i);
        double *wd = tu_malloc(n * sizeof *wd);
        for (size_t j = 0; j < n; j++) wd[j] = want[j];
        char what[96];
        snprintf(what, sizeof what, "%s, weight gradient %d over two micro-batches", c->name, i);
        tu_assert_close(what, got, wd, n, weight == IHA_STORAGE_F16 ? TOL_F16 : TU_TOL_F32);
        free(want), free(got), free(wd);
        tu_buffer_release(whole[i].mem), tu_buffer_release(parts[i].mem);
    }
    fixture_free(&f);
}

static void micro_batches_layer(void **state)
{
    (void)state;
    micro_batches(&kCalls[1], IHA_STORAGE_F32);
    micro_batches(&kCalls[1], IHA_STORAGE_F16);
}

static void micro_batches_core(void **state)
{
    (void)state;
    micro_batches(&kCalls[3], IHA_STORAGE_F32);
    micro_batches(&kCalls[3], IHA_STORAGE_F16);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(float_storage),
        cmocka_unit_test(float_storage_clblast),
        cmocka_unit_test(half_storage),
        cmocka_unit_test(bf16_storage),
        cmocka_unit_test(half_activations_float_weights),
        cmocka_unit_test(micro_batches_layer),
        cmocka_unit_test(micro_batches_core),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
