/* bfloat16 storage (IHA_STORAGE_BF16 in iha_attention_options.storage and weight_storage, and
 * in KV caches; its conversions bit for bit are tests/test_bf16_convert.c's): every call with
 * bfloat16 activations and/or weights within doc/spec.md's bfloat16 contract
 * against float64 on the float inputs (the forward on the GEMV and converted-weight paths,
 * iha_forward_host, the core, attention and its backward, the layer's backward pass and the
 * saved pair, decode steps with a bfloat16 cache after a chunked prefill, a ring cache); half
 * and bfloat16 calls on one context; non-finite inputs reaching the same outputs as with float
 * storage; and the refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "test_layer.h"

#define TOL_BF16 1e-2 /* doc/spec.md: bfloat16 storage, float arithmetic */
#define GUARD 32      /* elements of sentinel after every bfloat16 tensor (and before, with an offset) */
#define SENTINEL 0xABCDu

/* ---- bfloat16 buffers ---- */

/* offset + n + GUARD elements: SENTINEL, then data rounded to bfloat16 at `offset` (NULL: NaN). */
static cl_mem bf16_buffer(const float *data, size_t n, size_t offset)
{
    const size_t total = offset + n + GUARD;
    uint16_t *h = tu_malloc(total * sizeof *h);
    for (size_t i = 0; i < total; ++i) h[i] = SENTINEL;
    if (data)
        iha_bf16_from_float(data, h + offset, n);
    else
        for (size_t i = 0; i < n; ++i) h[offset + i] = 0x7fc0u;
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(iha_context_cl_context(tu_ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                              total * sizeof *h, h, &err);
    free(h);
    if (err != CL_SUCCESS) fail_msg("clCreateBuffer: %d", err);
    return m;
}

/* Reads n elements at `offset` as floats, and checks that the guards still hold SENTINEL. */
static void bf16_read_checked(cl_mem m, size_t offset, size_t n, float *out, const char *what)
{
    const size_t total = offset + n + GUARD;
    uint16_t *h = tu_malloc(total * sizeof *h);
    cl_int err = clEnqueueReadBuffer(iha_context_cl_queue(tu_ctx), m, CL_TRUE, 0, total * sizeof *h, h, 0, NULL, NULL);
    if (err != CL_SUCCESS) fail_msg("clEnqueueReadBuffer: %d", err);
    for (size_t i = 0; i < total; ++i)
        if ((i < offset || i >= offset + n) && h[i] != SENTINEL)
            fail_msg("%s: the library wrote outside the tensor (element %zu of the buffer)", what, i);
    iha_bf16_to_float(h + offset, out, n);
    free(h);
}

/* A tensor in bfloat16 (bf16 = 1) or float storage at `offset` elements; NULL data: NaN-filled. */
static iha_buffer upload_as(const float *data, size_t n, int bf16, size_t offset)
{
    if (bf16) return (iha_buffer){bf16_buffer(data, n, offset), offset};
    return (iha_buffer){tu_buffer_guarded(tu_ctx, data, n, offset, TU_GUARD, TU_SENTINEL), offset};
}

static void read_as(iha_buffer b, size_t n, int bf16, float *out, const char *what)
{
    if (bf16) {
        bf16_read_checked(b.mem, b.offset, n, out, what);
        return;
    }
    tu_buffer_read(tu_ctx, b.mem, b.offset, out, n);
    tu_assert_guard(tu_ctx, b.mem, n, b.offset, TU_GUARD, TU_SENTINEL);
}

/* The layer's eight weights at offsets 0, 1, 2, ... in bfloat16 or float storage. */
static iha_layer_weights upload_weights(const tu_layer *l, int bf16)
{
    const size_t nw = tu_count_w(&l->shape), nm = tu_count_mix(&l->shape);
    const float *host[8] = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    iha_buffer b[8];
    for (int i = 0; i < 8; ++i)
        b[i] = host[i] ? upload_as(host[i], i < 4 ? nw : nm, bf16, (size_t)i % 3) : (iha_buffer){NULL, 0};
    return (iha_layer_weights){b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]};
}

/* ---- The layer ---- */

typedef struct bf16_case {
    size_t B, N, D, H, d, P;
    int mask;
    int64_t window;
    int rope;
    int act, weight; /* 1: bfloat16 activations, weights */
    int offsets;     /* tensors at odd element offsets */
    int identity;    /* P = 1 with NULL mixing and collapse */
} bf16_case;

static iha_attention_options case_layer(const bf16_case *c, uint64_t seed, tu_layer *l)
{
    const iha_shape s = {c->B, c->N, c->D, c->H, c->d, c->P};
    tu_layer_init(l, &s, seed);
    if (c->identity) tu_layer_identity(l, 1);
    iha_attention_options o = tu_options(c->mask, c->window, c->rope);
    o.storage = c->act ? IHA_STORAGE_BF16 : IHA_STORAGE_F32;
    o.weight_storage = c->weight ? IHA_STORAGE_BF16 : IHA_STORAGE_F32;
    return o;
}

static void run_forward_case(const bf16_case *c)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    tu_layer l;
    const iha_attention_options o = case_layer(c, 177 + c->d + 13 * c->P, &l);
    const iha_shape s = l.shape;
    double *zref = tu_layer_reference(&l, &o);
    const size_t nx = tu_count_x(&s), nw = tu_count_w(&s), nm = tu_count_mix(&s), off = c->offsets ? 3 : 0;
    const float *host[8] = {l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
    iha_buffer b[8];
    for (int i = 0; i < 8; ++i)
        b[i] = host[i] ? upload_as(host[i], i < 4 ? nw : nm, c->weight, off + (size_t)i) : (iha_buffer){NULL, 0};
    iha_layer_weights w = {b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]};
    const iha_buffer x = upload_as(l.x, nx, c->act, off), z = upload_as(NULL, nx, c->act, off + 2);

    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, z), IHA_OK);
    float *out = tu_malloc(nx * sizeof *out);
    read_as(z, nx, c->act, out, "z");
    tu_assert_close("z (bfloat16 storage)", out, zref, nx, TOL_BF16);

    /* The host call rounds the same way on upload. */
    const iha_host_weights hw = tu_layer_host_weights(&l);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &hw, l.x, out), IHA_OK);
    tu_assert_close("z (iha_forward_host, bfloat16 storage)", out, zref, nx, TOL_BF16);

    free(out), free(zref);
    tu_layer_weights_release(&w);
    tu_buffer_release(x.mem), tu_buffer_release(z.mem);
    tu_layer_free(&l);
}

static const struct forward_case {
    const char *name;
    bf16_case c;
} kForwardCases[] = {
    /* B N D H d P mask window rope act weight offsets identity */
    /* 7 rows: the projections read the bfloat16 weights directly (the GEMV path). */
    {"few_rows_bf16_everything", {1, 7, 32, 2, 16, 2, IHA_MASK_CAUSAL, 0, 1, 1, 1, 0, 0}},
    /* 226 rows: weights converted once per matrix, then the GEMM; odd d, a window, offsets. */
    {"many_rows_bf16_everything_offsets", {2, 113, 48, 3, 59, 3, IHA_MASK_TOKEN_CAUSAL, 5, 0, 1, 1, 1, 0}},
    {"bf16_weights_only_identity_mha", {1, 64, 64, 2, 16, 1, IHA_MASK_NONE, 0, 1, 0, 1, 0, 1}},
    {"bf16_activations_only", {1, 33, 40, 4, 8, 4, IHA_MASK_CAUSAL, 0, 1, 1, 0, 1, 0}},
    /* 12 rows, d = 5 and H*d = 15 columns, not a multiple of the GEMV's 8. */
    {"gemv_column_tail", {3, 4, 9, 3, 5, 2, IHA_MASK_NONE, 2, 0, 1, 1, 1, 0}},
};
#define FORWARD_CASE_COUNT (sizeof kForwardCases / sizeof kForwardCases[0])

static void forward_case(void **state)
{
    run_forward_case(&((const struct forward_case *)*state)->c);
}

/* ---- The core and attention calls ---- */

static void core_and_attention(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 57, 1, 2, 16, 3};
    tu_layer l;
    tu_layer_init(&l, &s, 15);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    o.storage = o.weight_storage = IHA_STORAGE_BF16;
    tu_rng rng = tu_rng_seeded(19);
    const size_t nh = tu_count_heads(&s), nv = tu_count_virtual(&s), nl = s.batch * s.heads * s.tokens * s.pseudo;
    float *q = tu_random_array(&rng, nh, 1.0f), *k = tu_random_array(&rng, nh, 1.0f);
    float *v = tu_random_array(&rng, nh, 1.0f);
    ref_problem rp = tu_layer_problem(&l, &o);
    double *yref = tu_malloc(nh * sizeof *yref);
    assert_int_equal(ref_attention_core(&rp, q, k, v, yref), 0);
    iha_layer_weights w = upload_weights(&l, 1);
    w.wq = w.wk = w.wv = w.wo = (iha_buffer){NULL, 0};
    const iha_buffer qb = upload_as(q, nh, 1, 1), kb = upload_as(k, nh, 1, 0), vb = upload_as(v, nh, 1, 5);
    const iha_buffer yb = upload_as(NULL, nh, 1, 7);
    tu_assert_status(tu_ctx, iha_attention_core(tu_ctx, &s, &o, &w, qb, kb, vb, yb), IHA_OK);
    float *y = tu_malloc(nh * sizeof *y);
    read_as(yb, nh, 1, y, "y");
    tu_assert_close("y (iha_attention_core, bfloat16)", y, yref, nh, TOL_BF16);

    /* iha_attention: bfloat16 qt, kt, vt and o; the log-sum-exp stays float. */
    o.rope = 0;
    rp = tu_layer_problem(&l, &o);
    float *qt = tu_random_array(&rng, nv, 1.0f), *kt = tu_random_array(&rng, nv, 1.0f);
    float *vt = tu_random_array(&rng, nv, 1.0f);
    double *oref = tu_malloc(nv * sizeof *oref), *lref = tu_malloc(nl * sizeof *lref);
    assert_int_equal(ref_attention(&rp, qt, kt, vt, oref, lref), 0);
    const iha_buffer qtb = upload_as(qt, nv, 1, 0), ktb = upload_as(kt, nv, 1, 3), vtb = upload_as(vt, nv, 1, 0);
    const iha_buffer ob = upload_as(NULL, nv, 1, 1), lb = upload_as(NULL, nl, 0, 0);
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, &s, &o, qtb, ktb, vtb, ob, lb), IHA_OK);
    float *out = tu_malloc(nv * sizeof *out);
    read_as(ob, nv, 1, out, "o");
    tu_assert_close("o (iha_attention, bfloat16)", out, oref, nv, TOL_BF16);
    tu_assert_buffer_close(tu_ctx, "lse (iha_attention, bfloat16 inputs)", lb, nl, lref, TOL_BF16);

    free(q), free(k), free(v), free(y), free(yref), free(qt), free(kt), free(vt), free(out), free(oref), free(lref);
    const iha_buffer all[9] = {qb, kb, vb, yb, qtb, ktb, vtb, ob, lb};
    for (int i = 0; i < 9; ++i) tu_buffer_release(all[i].mem);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

/* iha_attention_backward with bfloat16 qt, kt, vt, o, dout and gradients (lse float). */
static void attention_backward_case(const iha_shape *s, int mask, int64_t window, uint64_t seed)
{
    iha_attention_options o = tu_options(mask, window, 0);
    o.storage = IHA_STORAGE_BF16;
    const size_t nv = tu_count_virtual(s), nl = s->batch * s->heads * s->tokens * s->pseudo;
    tu_rng rng = tu_rng_seeded(seed);
    float *in[4];
    for (int i = 0; i < 4; ++i) in[i] = tu_random_array(&rng, nv, 1.0f); /* qt, kt, vt, dout */
    const ref_problem rp = {.B = s->batch, .N = s->tokens, .H = s->heads, .d = s->head_dim, .P = s->pseudo,
                            .mask = mask, .window = window};
    double *ref[3];
    for (int i = 0; i < 3; ++i) ref[i] = tu_malloc(nv * sizeof(double));
    assert_int_equal(ref_attention_backward(&rp, in[0], in[1], in[2], in[3], ref[0], ref[1], ref[2]), 0);
    iha_buffer b[4], g[3];
    for (int i = 0; i < 4; ++i) b[i] = upload_as(in[i], nv, 1, (size_t)i);
    const iha_buffer ob = upload_as(NULL, nv, 1, 2), lb = upload_as(NULL, nl, 0, 0);
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, s, &o, b[0], b[1], b[2], ob, lb), IHA_OK);
    for (int i = 0; i < 3; ++i) g[i] = upload_as(NULL, nv, 1, 3);
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, s, &o, b[0], b[1], b[2], ob, lb, b[3], g[0], g[1], g[2]),
                     IHA_OK);
    static const char *const names[3] = {"dqt (bfloat16)", "dkt (bfloat16)", "dvt (bfloat16)"};
    float *got = tu_malloc(nv * sizeof *got);
    for (int i = 0; i < 3; ++i) {
        read_as(g[i], nv, 1, got, names[i]);
        tu_assert_close(names[i], got, ref[i], nv, TOL_BF16);
        tu_buffer_release(g[i].mem);
        free(ref[i]);
    }
    for (int i = 0; i < 4; ++i) tu_buffer_release(b[i].mem), free(in[i]);
    tu_buffer_release(ob.mem), tu_buffer_release(lb.mem);
    free(got);
}

static void attention_backward(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape shapes[3] = {{1, 23, 1, 2, 16, 3}, {2, 9, 1, 1, 5, 2}, {1, 30, 1, 1, 59, 2}};
    attention_backward_case(&shapes[0], IHA_MASK_CAUSAL, 0, 161);
    attention_backward_case(&shapes[1], IHA_MASK_TOKEN_CAUSAL, 3, 162);
    attention_backward_case(&shapes[2], IHA_MASK_NONE, 0, 163);
}

/* ---- The layer's backward pass ---- */

/* iha_backward with dx, x and dz in the activations' storage and the gradients in the weights',
 * against the float64 reference on the float inputs; then the saved pair, bit for bit the same. */
static void run_backward_case(const bf16_case *c)
{
    tu_layer l;
    const iha_attention_options o = case_layer(c, 191 + c->d + 7 * c->P, &l);
    const iha_shape s = l.shape;
    const size_t nx = tu_count_x(&s), nw = tu_count_w(&s), nm = tu_count_mix(&s);
    tu_rng rng = tu_rng_seeded(25 + c->d);
    float *dz = tu_random_array(&rng, nx, 1.0f);
    iha_layer_weights w = upload_weights(&l, c->weight);
    const iha_buffer x = upload_as(l.x, nx, c->act, 1), bdz = upload_as(dz, nx, c->act, 2);

    enum { OUTS = 9 };
    size_t count[OUTS];
    int bf16[OUTS];
    iha_buffer out[OUTS], again[OUTS];
    for (int i = 0; i < OUTS; ++i) {
        count[i] = i == 0 ? nx : i < 5 ? nw : nm;
        bf16[i] = i == 0 ? c->act : c->weight;
        out[i] = upload_as(NULL, count[i], bf16[i], 3);
        again[i] = upload_as(NULL, count[i], bf16[i], 1);
    }
    const iha_layer_grads g = {out[1], out[2], out[3], out[4], out[5], out[6], out[7], out[8]};
    const iha_layer_grads g2 = {again[1], again[2], again[3], again[4], again[5], again[6], again[7], again[8]};
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &s, &o, &w, x, bdz, out[0], &g), IHA_OK);

    size_t ns = 0;
    tu_assert_status(tu_ctx, iha_saved_elements(tu_ctx, &s, &ns), IHA_OK);
    cl_mem saved = tu_buffer_guarded(tu_ctx, NULL, ns, 0, TU_GUARD, TU_SENTINEL);
    const iha_buffer z = upload_as(NULL, nx, c->act, 0);
    tu_assert_status(tu_ctx, iha_forward_save(tu_ctx, &s, &o, &w, x, z, (iha_buffer){saved, 0}), IHA_OK);
    tu_assert_status(tu_ctx, iha_backward_saved(tu_ctx, &s, &o, &w, x, (iha_buffer){saved, 0}, bdz, again[0], &g2),
                     IHA_OK);
    tu_assert_guard(tu_ctx, saved, ns, 0, TU_GUARD, TU_SENTINEL);
    double *zref = tu_layer_reference(&l, &o);
    float *zs = tu_malloc(nx * sizeof *zs);
    read_as(z, nx, c->act, zs, "z (iha_forward_save)");
    tu_assert_close("z (iha_forward_save, bfloat16)", zs, zref, nx, TOL_BF16);
    free(zs), free(zref);

    double *ref[OUTS];
    for (int i = 0; i < OUTS; ++i) ref[i] = tu_malloc(count[i] * sizeof(double));
    const ref_grads rg = {ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], ref[6], ref[7], ref[8]};
    const ref_problem rp = tu_layer_problem(&l, &o);
    assert_int_equal(ref_backward(&rp, dz, &rg), 0);
    static const char *const names[OUTS] = {"dx", "dwq", "dwk", "dwv", "dwo", "dalpha_q", "dalpha_k", "dalpha_v", "dr"};
    for (int i = 0; i < OUTS; ++i) {
        float *got = tu_malloc(count[i] * sizeof *got), *got2 = tu_malloc(count[i] * sizeof *got2);
        read_as(out[i], count[i], bf16[i], got, names[i]);
        read_as(again[i], count[i], bf16[i], got2, names[i]);
        tu_assert_close(names[i], got, ref[i], count[i], TOL_BF16);
        if (memcmp(got, got2, count[i] * sizeof *got) != 0)
            fail_msg("%s: iha_backward_saved differs from iha_backward with bfloat16 storage", names[i]);
        free(got), free(got2), free(ref[i]);
        tu_buffer_release(out[i].mem), tu_buffer_release(again[i].mem);
    }
    tu_layer_weights_release(&w);
    tu_buffer_release(x.mem), tu_buffer_release(bdz.mem), tu_buffer_release(z.mem), tu_buffer_release(saved);
    free(dz);
    tu_layer_free(&l);
}

static void layer_backward(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const bf16_case cases[] = {
        /* B N D H d P mask window rope act weight offsets identity */
        {2, 5, 12, 2, 8, 3, IHA_MASK_CAUSAL, 0, 1, 1, 1, 0, 0},
        {1, 9, 16, 2, 16, 1, IHA_MASK_CAUSAL, 0, 1, 0, 1, 0, 1},
        {1, 7, 9, 3, 5, 2, IHA_MASK_TOKEN_CAUSAL, 3, 0, 1, 0, 0, 0},
        /* 24 rows: the forward's projections convert the weights instead of the GEMV */
        {2, 12, 16, 2, 8, 2, IHA_MASK_CAUSAL, 0, 1, 1, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_backward_case(&cases[i]);
}

/* ---- Decoding ---- */

/* A prompt of `prefill` tokens per sequence in one step, then a token at a time, with x, z and
 * the weights in `storage` and a bfloat16 cache: every step's rows against the float64 forward
 * over the prefix. */
static void decode_case(const iha_shape *shape, int storage, int mask, int64_t window, size_t prefill)
{
    const iha_shape full = *shape;
    iha_attention_options o = tu_options(mask, window, shape->head_dim % 2 == 0); /* rotary needs an even d */
    o.storage = o.weight_storage = storage;
    const int bf16 = storage == IHA_STORAGE_BF16;
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &full, 31 + (uint64_t)prefill, &o);
    const size_t D = full.model_dim, B = full.batch, N = full.tokens;
    iha_layer_weights w = upload_weights(&l, bf16);
    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &full, IHA_STORAGE_BF16, &cache), IHA_OK);
    float *xs = tu_malloc(B * prefill * D * sizeof *xs), *zs = tu_malloc(B * prefill * D * sizeof *zs);
    float *z = tu_malloc(B * N * D * sizeof *z);
    for (size_t n = 0; n < N;) {
        const size_t k = n == 0 ? prefill : 1;
        const iha_shape step = {B, k, D, full.heads, full.head_dim, full.pseudo};
        for (size_t b = 0; b < B; ++b) memcpy(xs + b * k * D, l.x + (b * N + n) * D, k * D * sizeof *xs);
        const iha_buffer xb = upload_as(xs, B * k * D, bf16, 1), zb = upload_as(NULL, B * k * D, bf16, 0);
        tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &w, NULL, xb, zb), IHA_OK);
        read_as(zb, B * k * D, bf16, zs, "z (decode step)");
        for (size_t b = 0; b < B; ++b) memcpy(z + (b * N + n) * D, zs + b * k * D, k * D * sizeof *z);
        tu_buffer_release(xb.mem), tu_buffer_release(zb.mem);
        n += k;
    }
    assert_int_equal(iha_kv_cache_length(cache, B - 1), N);
    tu_assert_close("z (decode, bfloat16 cache)", z, zref, B * N * D, TOL_BF16);
    iha_kv_cache_free(cache);
    free(xs), free(zs), free(z), free(zref);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

static void decode_steps(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    /* d = 16 reads whole vectors of the cache; d = 5 and 59 also the tails (load_tail). */
    const iha_shape shapes[3] = {{2, 12, 32, 2, 16, 3}, {1, 10, 9, 3, 5, 2}, {1, 9, 24, 1, 59, 2}};
    decode_case(&shapes[0], IHA_STORAGE_BF16, IHA_MASK_CAUSAL, 0, 5);
    decode_case(&shapes[0], IHA_STORAGE_F32, IHA_MASK_TOKEN_CAUSAL, 4, 7);
    decode_case(&shapes[1], IHA_STORAGE_BF16, IHA_MASK_CAUSAL, 3, 1);
    decode_case(&shapes[2], IHA_STORAGE_BF16, IHA_MASK_TOKEN_CAUSAL, 0, 4);
}

/* A prompt longer than a ring cache's tokens runs as chunks inside iha_decode_step. */
static void decode_ring_long_prompt(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape full = {1, 40, 16, 2, 16, 2};
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 4, 1);
    o.storage = o.weight_storage = IHA_STORAGE_BF16;
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &full, 47, &o);
    const size_t D = full.model_dim, N = full.tokens, first = 30;
    iha_layer_weights w = upload_weights(&l, 1);
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = IHA_STORAGE_BF16;
    co.window = 4;
    co.cache_tokens = 8;
    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create_with(tu_ctx, &full, &co, &cache), IHA_OK);
    float *z = tu_malloc(N * D * sizeof *z);
    for (size_t n = 0; n < N;) {
        const size_t k = n == 0 ? first : 1;
        const iha_shape step = {1, k, D, full.heads, full.head_dim, full.pseudo};
        const iha_buffer xb = upload_as(l.x + n * D, k * D, 1, 0), zb = upload_as(NULL, k * D, 1, 2);
        tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &w, NULL, xb, zb), IHA_OK);
        read_as(zb, k * D, 1, z + n * D, "z (ring decode step)");
        tu_buffer_release(xb.mem), tu_buffer_release(zb.mem);
        n += k;
    }
    tu_assert_close("z (ring decode, bfloat16)", z, zref, N * D, TOL_BF16);
    iha_kv_cache_free(cache);
    free(z), free(zref);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

/* Half and bfloat16 calls on one context, each on the GEMV path and the converted one: every
 * kernel of cl/convert.cl from one program. */
static void half_and_bf16_share_a_context(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape shapes[2] = {{1, 7, 16, 2, 8, 2}, {1, 40, 16, 2, 8, 2}};
    const int storages[2] = {IHA_STORAGE_F16, IHA_STORAGE_BF16};
    for (int i = 0; i < 2; ++i) {
        tu_layer l;
        tu_layer_init(&l, &shapes[i], 5 + (uint64_t)i);
        const size_t nx = tu_count_x(&shapes[i]);
        const iha_host_weights hw = tu_layer_host_weights(&l);
        float *z = tu_malloc(nx * sizeof *z);
        for (int k = 0; k < 2; ++k) {
            iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
            o.storage = o.weight_storage = storages[k];
            double *zref = tu_layer_reference(&l, &o);
            tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &shapes[i], &o, &hw, l.x, z), IHA_OK);
            tu_assert_close(k ? "z (bfloat16 after half)" : "z (half)", z, zref, nx, TOL_BF16);
            free(zref);
        }
        free(z);
        tu_layer_free(&l);
    }
}

/* ---- Non-finite inputs ---- */

/* A NaN and an infinity planted in x reach the same outputs (non-finite where float storage's
 * are, finite elsewhere) with bfloat16 storage: rounding keeps both, and the finite rows stay
 * within the contract of the float storage's. */
static void nonfinite_inputs(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 9, 16, 2, 8, 2};
    tu_layer l;
    tu_layer_init(&l, &s, 71);
    const size_t nx = tu_count_x(&s);
    l.x[3 * s.model_dim + 2] = NAN;
    l.x[6 * s.model_dim + 5] = INFINITY;
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    const iha_host_weights hw = tu_layer_host_weights(&l);
    float *zf = tu_malloc(nx * sizeof *zf), *zb = tu_malloc(nx * sizeof *zb);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &hw, l.x, zf), IHA_OK);
    o.storage = o.weight_storage = IHA_STORAGE_BF16;
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &hw, l.x, zb), IHA_OK);
    size_t finite = 0;
    for (size_t i = 0; i < nx; ++i) {
        if (isfinite(zf[i]) != isfinite(zb[i]))
            fail_msg("z[%zu]: %g with float storage, %g with bfloat16", i, (double)zf[i], (double)zb[i]);
        finite += isfinite(zf[i]) != 0;
    }
    /* Rows before the NaN's token see none of it under the causal mask. */
    assert_true(finite >= 3 * s.model_dim && finite < nx);
    free(zf), free(zb);
    tu_layer_free(&l);
}

/* ---- Refusals ---- */

static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 8, 16, 2, 8, 2};
    tu_layer l;
    tu_layer_init(&l, &s, 3);
    const size_t nx = tu_count_x(&s);
    iha_layer_weights w = upload_weights(&l, 1);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    o.storage = o.weight_storage = IHA_STORAGE_BF16;
    const iha_buffer x = upload_as(l.x, nx, 1, 0);
    /* A buffer of exactly nx elements of 2 bytes fits z; at offset 1 it is one short. */
    cl_int err;
    cl_mem exact = clCreateBuffer(iha_context_cl_context(tu_ctx), CL_MEM_READ_WRITE, nx * 2, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, (iha_buffer){exact, 0}), IHA_OK);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, (iha_buffer){exact, 1}), IHA_ERROR_BUFFER_TOO_SMALL);
    /* Unknown storage values, with a message naming the three. */
    iha_attention_options bad = o;
    bad.storage = IHA_STORAGE_BF16 + 1;
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &bad, &w, x, (iha_buffer){exact, 0}), IHA_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(iha_context_message(tu_ctx), "IHA_STORAGE_BF16"));
    bad = o;
    bad.weight_storage = 3;
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &bad, &w, x, (iha_buffer){exact, 0}), IHA_ERROR_INVALID_ARGUMENT);
    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &s, (iha_storage)3, &cache), IHA_ERROR_INVALID_ARGUMENT);
    assert_null(cache);
    /* A bfloat16 cache holds 2 bytes an element, as a half one. */
    iha_kv_cache *c16 = NULL, *cb16 = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &s, IHA_STORAGE_F16, &c16), IHA_OK);
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &s, IHA_STORAGE_BF16, &cb16), IHA_OK);
    assert_int_equal(iha_kv_cache_bytes(c16), iha_kv_cache_bytes(cb16));
    /* The unfused baseline is float only. */
    const iha_shape one = {1, 8, 1, 1, 8, 2};
    const size_t nv = tu_count_virtual(&one);
    cl_mem a = bf16_buffer(NULL, nv, 0), b = bf16_buffer(NULL, nv, 0);
    const iha_buffer ab = {a, 0};
    tu_assert_status(tu_ctx, iha_attention_unfused(tu_ctx, &one, &o, ab, ab, ab, (iha_buffer){b, 0}),
                     IHA_ERROR_UNSUPPORTED);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    iha_kv_cache_free(c16), iha_kv_cache_free(cb16);
    tu_buffer_release(a), tu_buffer_release(b), tu_buffer_release(exact), tu_buffer_release(x.mem);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest others[] = {
        cmocka_unit_test(core_and_attention),
        cmocka_unit_test(attention_backward),      cmocka_unit_test(layer_backward),
        cmocka_unit_test(decode_steps),            cmocka_unit_test(decode_ring_long_prompt),
        cmocka_unit_test(half_and_bf16_share_a_context), cmocka_unit_test(nonfinite_inputs),
        cmocka_unit_test(refusals),
    };
    const tu_case_table table = {kForwardCases, sizeof kForwardCases[0], FORWARD_CASE_COUNT, forward_case};
    return tu_main_table(argc, argv, &table, others, sizeof others / sizeof others[0], tu_group_setup,
                         tu_group_teardown);
}
