/* Half-precision storage (iha_attention_options.storage and weight_storage): the host
 * conversions bit for bit; every layer call with half activations and/or half weights within
 * doc/spec.md's half-storage contract against float64 on the float inputs, on each path (the
 * half-weight GEMV for few rows, converted weights and SGEMM for many, the identity shortcut,
 * element offsets counted in halves, guards around outputs); the layer's backward pass and the
 * saved training pair with half activations and/or weights; the decode step with half x, z,
 * weights and cache; and the refusals (unknown storage, a buffer one half short, overlaps
 * between tensors of different element sizes, the float-only unfused baseline). */
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

#define TOL_F16 2e-3 /* doc/spec.md: half storage, float accumulation */
#define GUARD 32     /* halves of sentinel after every half tensor (and before, with an offset) */
#define SENTINEL 0xABCDu


/* ---- Half buffers ---- */

/* offset + n + GUARD halves: SENTINEL, then data rounded to half at `offset` (NULL: NaN). */
static cl_mem half_buffer(const float *data, size_t n, size_t offset)
{
    const size_t total = offset + n + GUARD;
    uint16_t *h = tu_malloc(total * sizeof *h);
    for (size_t i = 0; i < total; ++i) h[i] = SENTINEL;
    if (data)
        iha_half_from_float(data, h + offset, n);
    else
        for (size_t i = 0; i < n; ++i) h[offset + i] = 0x7e00u;
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(iha_context_cl_context(tu_ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                              total * sizeof *h, h, &err);
    free(h);
    if (err != CL_SUCCESS) fail_msg("clCreateBuffer: %d", err);
    return m;
}

/* Reads n halves at `offset` as floats, and checks that the guards still hold SENTINEL. */
static void half_read_checked(cl_mem m, size_t offset, size_t n, float *out, const char *what)
{
    const size_t total = offset + n + GUARD;
    uint16_t *h = tu_malloc(total * sizeof *h);
    cl_int err = clEnqueueReadBuffer(iha_context_cl_queue(tu_ctx), m, CL_TRUE, 0, total * sizeof *h, h, 0, NULL, NULL);
    if (err != CL_SUCCESS) fail_msg("clEnqueueReadBuffer: %d", err);
    for (size_t i = 0; i < total; ++i)
        if ((i < offset || i >= offset + n) && h[i] != SENTINEL)
            fail_msg("%s: the library wrote outside the tensor (half %zu of the buffer)", what, i);
    iha_half_to_float(h + offset, out, n);
    free(h);
}

/* ---- Host conversions ---- */

static uint16_t to_half(float x)
{
    uint16_t h;
    iha_half_from_float(&x, &h, 1);
    return h;
}

static void host_conversions_round_to_nearest_even(void **state)
{
    (void)state;
    assert_int_equal(to_half(0.0f), 0x0000);
    assert_int_equal(to_half(-0.0f), 0x8000);
    assert_int_equal(to_half(1.0f), 0x3c00);
    assert_int_equal(to_half(-2.0f), 0xc000);
    assert_int_equal(to_half(65504.0f), 0x7bff);        /* the largest half */
    assert_int_equal(to_half(65519.0f), 0x7bff);        /* below the midpoint to 65536 */
    assert_int_equal(to_half(65520.0f), 0x7c00);        /* the midpoint ties to even: infinity */
    assert_int_equal(to_half(INFINITY), 0x7c00);
    assert_int_equal(to_half(-INFINITY), 0xfc00);
    assert_true((to_half(NAN) & 0x7c00u) == 0x7c00u && (to_half(NAN) & 0x3ffu) != 0);
    assert_int_equal(to_half(1.0f + 0x1p-11f), 0x3c00); /* a tie: to the even neighbour 1 */
    assert_int_equal(to_half(1.0f + 0x3p-11f), 0x3c02); /* a tie: to the even neighbour above */
    assert_int_equal(to_half(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    assert_int_equal(to_half(0x1p-14f), 0x0400);        /* the smallest normal */
    assert_int_equal(to_half(0x1p-24f), 0x0001);        /* the smallest subnormal */
    assert_int_equal(to_half(0x1p-25f), 0x0000);        /* a tie between 0 and 2^-24: 0 */
    assert_int_equal(to_half(0x3p-26f), 0x0001);        /* 0.75 * 2^-24 rounds up */
    assert_int_equal(to_half(0x1.ffcp-15f), 0x0400);    /* the largest subnormal's round-up */
    assert_int_equal(to_half(-0x3p-24f), 0x8003);
    /* Every half that is not NaN survives half -> float -> half. */
    for (uint32_t h = 0; h < 0x10000u; ++h) {
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue;
        const uint16_t in = (uint16_t)h;
        float f;
        iha_half_to_float(&in, &f, 1);
        if (to_half(f) != in) fail_msg("half 0x%04x -> %a -> 0x%04x", h, (double)f, to_half(f));
    }
    float one;
    iha_half_to_float(&(uint16_t){0x3555}, &one, 1);
    assert_true(one == 0x1.554p-2f);
    iha_half_from_float(NULL, NULL, 0); /* n == 0 touches nothing */
}

/* ---- The layer ---- */

typedef struct half_case {
    size_t B, N, D, H, d, P;
    int mask;
    int64_t window;
    int rope;
    int act_half, weight_half;
    int offsets;      /* tensors at odd element offsets */
    int identity;     /* P = 1 with NULL mixing and collapse */
} half_case;

/* tu_options with half activations and weights. */
static iha_attention_options half_options(int mask, int64_t window, int rope)
{
    iha_attention_options o = tu_options(mask, window, rope);
    o.storage = IHA_STORAGE_F16;
    o.weight_storage = IHA_STORAGE_F16;
    return o;
}

/* A tensor in the storage the case asks for, at `offset` elements. */
static iha_buffer upload_as(const float *data, size_t n, int half, size_t offset)
{
    if (data == NULL) return (iha_buffer){NULL, 0};
    if (half) return (iha_buffer){half_buffer(data, n, offset), offset};
    return (iha_buffer){tu_buffer_guarded(tu_ctx, data, n, offset, TU_GUARD, TU_SENTINEL), offset};
}

/* The layer's eight weights at offset 0, in half (half = 1) or float storage. */
static iha_layer_weights upload_weights(const tu_layer *l, int half)
{
    const size_t nw = tu_count_w(&l->shape), nm = tu_count_mix(&l->shape);
    return (iha_layer_weights){upload_as(l->wq, nw, half, 0),      upload_as(l->wk, nw, half, 0),
                               upload_as(l->wv, nw, half, 0),      upload_as(l->wo, nw, half, 0),
                               upload_as(l->alpha_q, nm, half, 0), upload_as(l->alpha_k, nm, half, 0),
                               upload_as(l->alpha_v, nm, half, 0), upload_as(l->r, nm, half, 0)};
}

/* The case's random layer, and its options with the activations and weights in the case's storage. */
static iha_attention_options case_layer(const half_case *c, uint64_t seed, tu_layer *l)
{
    const iha_shape s = {c->B, c->N, c->D, c->H, c->d, c->P};
    tu_layer_init(l, &s, seed);
    if (c->identity) tu_layer_identity(l, 1);
    iha_attention_options o = tu_options(c->mask, c->window, c->rope);
    o.storage = c->act_half ? IHA_STORAGE_F16 : IHA_STORAGE_F32;
    o.weight_storage = c->weight_half ? IHA_STORAGE_F16 : IHA_STORAGE_F32;
    return o;
}

static void run_forward_case(const half_case *c)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    tu_layer l;
    const iha_attention_options o = case_layer(c, 77 + c->d + 13 * c->P, &l);
    const iha_shape s = l.shape;
    double *zref = tu_layer_reference(&l, &o);

    const size_t nx = tu_count_x(&s), nw = tu_count_w(&s), nm = tu_count_mix(&s), off = c->offsets ? 3 : 0;
    iha_layer_weights w;
    w.wq = upload_as(l.wq, nw, c->weight_half, off);
    w.wk = upload_as(l.wk, nw, c->weight_half, off + 2);
    w.wv = upload_as(l.wv, nw, c->weight_half, off * 3);
    w.wo = upload_as(l.wo, nw, c->weight_half, off + 4);
    w.alpha_q = upload_as(l.alpha_q, nm, c->weight_half, off);
    w.alpha_k = upload_as(l.alpha_k, nm, c->weight_half, off + 1);
    w.alpha_v = upload_as(l.alpha_v, nm, c->weight_half, off);
    w.r = upload_as(l.r, nm, c->weight_half, off + 5);
    const iha_buffer x = upload_as(l.x, nx, c->act_half, off);
    iha_buffer z = {c->act_half ? half_buffer(NULL, nx, off + 2) : tu_buffer_guarded(tu_ctx, NULL, nx, off + 2, TU_GUARD, TU_SENTINEL),
                    off + 2};

    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, z), IHA_OK);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    float *out = tu_malloc(nx * sizeof *out);
    if (c->act_half) {
        half_read_checked(z.mem, z.offset, nx, out, "z");
    } else {
        tu_buffer_read(tu_ctx, z.mem, z.offset, out, nx);
        tu_assert_guard(tu_ctx, z.mem, nx, z.offset, TU_GUARD, TU_SENTINEL);
    }
    tu_assert_close("z (half storage)", out, zref, nx, TOL_F16);

    /* The host call rounds the same way on upload: the same result within rounding. */
    float *zh = tu_malloc(nx * sizeof *zh);
    const iha_host_weights hw = {l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &hw, l.x, zh), IHA_OK);
    tu_assert_close("z (iha_forward_host, half storage)", zh, zref, nx, TOL_F16);

    free(zh);
    free(out);
    free(zref);
    tu_layer_weights_release(&w);
    tu_buffer_release(x.mem), tu_buffer_release(z.mem);
    tu_layer_free(&l);
}

/* The forward cases, each a CMocka case of its own name. */
static const struct forward_case {
    const char *name;
    half_case c;
} kForwardCases[] = {
    /* 7 rows: the projections read half weights directly (the GEMV path). */
    {"few_rows_half_everything", {1, 7, 32, 2, 16, 2, IHA_MASK_CAUSAL, 0, 1, 1, 1, 0, 0}},
    /* 226 rows: half weights converted once per matrix, then CLBlast; odd d, a window, offsets. */
    {"many_rows_half_everything_offsets", {2, 113, 48, 3, 59, 3, IHA_MASK_TOKEN_CAUSAL, 5, 0, 1, 1, 1, 0}},
    {"half_weights_only_identity_mha", {1, 64, 64, 2, 32, 1, IHA_MASK_NONE, 0, 1, 0, 1, 0, 1}},
    {"half_activations_only", {1, 33, 40, 4, 10, 4, IHA_MASK_CAUSAL, 0, 1, 1, 0, 1, 0}},
    /* 12 rows of a tail-heavy shape: d = 5 and C = H*d = 15 columns, not a multiple of the GEMV's 8. */
    {"gemv_column_tail", {3, 4, 9, 3, 5, 2, IHA_MASK_NONE, 2, 0, 1, 1, 1, 0}},
};
#define FORWARD_CASE_COUNT (sizeof kForwardCases / sizeof kForwardCases[0])

/* A kForwardCases row, *state. */
static void forward_case(void **state)
{
    run_forward_case(&((const struct forward_case *)*state)->c);
}

/* ---- The core and attention calls ---- */

static void core_and_attention_half(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 57, 1, 2, 24, 3};
    tu_layer l;
    tu_layer_init(&l, &s, 5);
    iha_attention_options o = half_options(IHA_MASK_CAUSAL, 0, 1);
    tu_rng rng = tu_rng_seeded(9);
    const size_t nh = tu_count_heads(&s), nv = tu_count_virtual(&s), T = s.tokens * s.pseudo;
    float *q = tu_random_array(&rng, nh, 1.0f), *k = tu_random_array(&rng, nh, 1.0f), *v = tu_random_array(&rng, nh, 1.0f);
    ref_problem rp = tu_layer_problem(&l, &o);
    double *yref = tu_malloc(nh * sizeof *yref);
    assert_int_equal(ref_attention_core(&rp, q, k, v, yref), 0);

    iha_layer_weights w = {0};
    w.alpha_q = upload_as(l.alpha_q, tu_count_mix(&s), 1, 1);
    w.alpha_k = upload_as(l.alpha_k, tu_count_mix(&s), 1, 0);
    w.alpha_v = upload_as(l.alpha_v, tu_count_mix(&s), 1, 2);
    w.r = upload_as(l.r, tu_count_mix(&s), 1, 0);
    iha_buffer qb = upload_as(q, nh, 1, 1), kb = upload_as(k, nh, 1, 0), vb = upload_as(v, nh, 1, 5);
    iha_buffer yb = {half_buffer(NULL, nh, 7), 7};
    tu_assert_status(tu_ctx, iha_attention_core(tu_ctx, &s, &o, &w, qb, kb, vb, yb), IHA_OK);
    float *y = tu_malloc(nh * sizeof *y);
    half_read_checked(yb.mem, yb.offset, nh, y, "y");
    tu_assert_close("y (iha_attention_core, half)", y, yref, nh, TOL_F16);

    /* iha_attention: half qt, kt, vt and o; the log-sum-exp stays float. */
    o.rope = 0;
    rp = tu_layer_problem(&l, &o);
    float *qt = tu_random_array(&rng, nv, 1.0f), *kt = tu_random_array(&rng, nv, 1.0f), *vt = tu_random_array(&rng, nv, 1.0f);
    const size_t nl = s.batch * s.heads * T;
    double *oref = tu_malloc(nv * sizeof *oref), *lref = tu_malloc(nl * sizeof *lref);
    assert_int_equal(ref_attention(&rp, qt, kt, vt, oref, lref), 0);
    iha_buffer qtb = upload_as(qt, nv, 1, 0), ktb = upload_as(kt, nv, 1, 3), vtb = upload_as(vt, nv, 1, 0);
    iha_buffer ob = {half_buffer(NULL, nv, 1), 1};
    iha_buffer lb = {tu_buffer_guarded(tu_ctx, NULL, nl, 0, TU_GUARD, TU_SENTINEL), 0};
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, &s, &o, qtb, ktb, vtb, ob, lb), IHA_OK);
    float *out = tu_malloc(nv * sizeof *out);
    half_read_checked(ob.mem, ob.offset, nv, out, "o");
    tu_assert_close("o (iha_attention, half)", out, oref, nv, TOL_F16);
    tu_assert_buffer_close(tu_ctx, "lse (iha_attention, half inputs)", lb, nl, lref, TOL_F16);

    free(q), free(k), free(v), free(y), free(yref), free(qt), free(kt), free(vt), free(out);
    free(oref), free(lref);
    iha_buffer all[13] = {w.alpha_q, w.alpha_k, w.alpha_v, w.r, qb, kb, vb, yb, qtb, ktb, vtb, ob, lb};
    for (int i = 0; i < 13; ++i) tu_buffer_release(all[i].mem);
    tu_layer_free(&l);
}

/* iha_attention_backward with half qt, kt, vt, o, dout and gradients (lse float), o and lse
 * from a half iha_attention call, against the float64 reference on the float inputs. */
static void attention_backward_case(const iha_shape *s, int mask, int64_t window, uint64_t seed)
{
    iha_attention_options o = tu_options(mask, window, 0);
    o.storage = IHA_STORAGE_F16;
    const size_t nv = tu_count_virtual(s), nl = s->batch * s->heads * s->tokens * s->pseudo;
    tu_rng rng = tu_rng_seeded(seed);
    float *in[4];
    for (int i = 0; i < 4; ++i) in[i] = tu_random_array(&rng, nv, 1.0f); /* qt, kt, vt, dout */
    const ref_problem rp = {.B = s->batch, .N = s->tokens, .H = s->heads, .d = s->head_dim, .P = s->pseudo,
                            .mask = mask, .window = window};
    double *ref[3];
    for (int i = 0; i < 3; ++i) ref[i] = tu_malloc(nv * sizeof(double));
    assert_int_equal(ref_attention_backward(&rp, in[0], in[1], in[2], in[3], ref[0], ref[1], ref[2]), 0);

    iha_buffer b[4];
    for (int i = 0; i < 4; ++i) b[i] = upload_as(in[i], nv, 1, (size_t)i);
    iha_buffer ob = {half_buffer(NULL, nv, 2), 2};
    iha_buffer lb = {tu_buffer_guarded(tu_ctx, NULL, nl, 0, TU_GUARD, TU_SENTINEL), 0};
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, s, &o, b[0], b[1], b[2], ob, lb), IHA_OK);
    iha_buffer g[3];
    for (int i = 0; i < 3; ++i) g[i] = (iha_buffer){half_buffer(NULL, nv, 3), 3};
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, s, &o, b[0], b[1], b[2], ob, lb, b[3], g[0], g[1], g[2]),
                     IHA_OK);
    static const char *const names[3] = {"dqt (half)", "dkt (half)", "dvt (half)"};
    float *got = tu_malloc(nv * sizeof *got);
    for (int i = 0; i < 3; ++i) {
        half_read_checked(g[i].mem, g[i].offset, nv, got, names[i]);
        tu_assert_close(names[i], got, ref[i], nv, TOL_F16);
        tu_buffer_release(g[i].mem);
        free(ref[i]);
    }
    for (int i = 0; i < 4; ++i) tu_buffer_release(b[i].mem), free(in[i]);
    tu_buffer_release(ob.mem), tu_buffer_release(lb.mem);
    free(got);
}

static void attention_backward_half(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape shapes[3] = {{1, 23, 1, 2, 32, 3}, {2, 9, 1, 1, 7, 2}, {1, 30, 1, 1, 64, 2}};
    attention_backward_case(&shapes[0], IHA_MASK_CAUSAL, 0, 61);
    attention_backward_case(&shapes[1], IHA_MASK_TOKEN_CAUSAL, 3, 62);
    attention_backward_case(&shapes[2], IHA_MASK_NONE, 0, 63);
}

/* ---- The layer's backward pass ---- */

/* An output of n elements in the given storage at `offset`, NaN-filled with guards. */
static iha_buffer output_as(size_t n, int half, size_t offset)
{
    if (half) return (iha_buffer){half_buffer(NULL, n, offset), offset};
    return (iha_buffer){tu_buffer_guarded(tu_ctx, NULL, n, offset, TU_GUARD, TU_SENTINEL), offset};
}

static void read_as(iha_buffer b, size_t n, int half, float *out, const char *what)
{
    if (half) {
        half_read_checked(b.mem, b.offset, n, out, what);
        return;
    }
    tu_buffer_read(tu_ctx, b.mem, b.offset, out, n);
    tu_assert_guard(tu_ctx, b.mem, n, b.offset, TU_GUARD, TU_SENTINEL);
}

/* iha_backward with dx, x and dz in the activations' storage and the gradients in the weights',
 * against the float64 reference on the float inputs (doc/spec.md's half-storage contract); then the
 * saved pair on the same storage, bit for bit iha_backward's outputs. */
static void run_backward_case(const half_case *c)
{
    tu_layer l;
    const iha_attention_options o = case_layer(c, 91 + c->d + 7 * c->P, &l);
    const iha_shape s = l.shape;
    const size_t nx = tu_count_x(&s), nw = tu_count_w(&s), nm = tu_count_mix(&s);
    tu_rng rng = tu_rng_seeded(5 + c->d);
    float *dz = tu_random_array(&rng, nx, 1.0f);
    const float *host_w[8] = {l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
    iha_buffer wb[8];
    for (int i = 0; i < 8; ++i) wb[i] = upload_as(host_w[i], i < 4 ? nw : nm, c->weight_half, (size_t)i % 3);
    const iha_layer_weights w = {wb[0], wb[1], wb[2], wb[3], wb[4], wb[5], wb[6], wb[7]};
    const iha_buffer x = upload_as(l.x, nx, c->act_half, 1), bdz = upload_as(dz, nx, c->act_half, 2);

    enum { OUTS = 9 };
    size_t count[OUTS];
    int half[OUTS];
    iha_buffer out[OUTS], again[OUTS];
    for (int i = 0; i < OUTS; ++i) {
        count[i] = i == 0 ? nx : i < 5 ? nw : nm;
        half[i] = i == 0 ? c->act_half : c->weight_half;
        out[i] = output_as(count[i], half[i], 3);
        again[i] = output_as(count[i], half[i], 1);
    }
    const iha_layer_grads g = {out[1], out[2], out[3], out[4], out[5], out[6], out[7], out[8]};
    const iha_layer_grads g2 = {again[1], again[2], again[3], again[4], again[5], again[6], again[7], again[8]};
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &s, &o, &w, x, bdz, out[0], &g), IHA_OK);

    size_t ns = 0;
    tu_assert_status(tu_ctx, iha_saved_elements(tu_ctx, &s, &ns), IHA_OK);
    cl_mem saved = tu_buffer_guarded(tu_ctx, NULL, ns, 0, TU_GUARD, TU_SENTINEL);
    const iha_buffer z = output_as(nx, c->act_half, 0);
    tu_assert_status(tu_ctx, iha_forward_save(tu_ctx, &s, &o, &w, x, z, (iha_buffer){saved, 0}), IHA_OK);
    tu_assert_status(tu_ctx, iha_backward_saved(tu_ctx, &s, &o, &w, x, (iha_buffer){saved, 0}, bdz, again[0], &g2),
                     IHA_OK);
    tu_assert_guard(tu_ctx, saved, ns, 0, TU_GUARD, TU_SENTINEL);
    float *zs = tu_malloc(nx * sizeof *zs);
    read_as(z, nx, c->act_half, zs, "z (iha_forward_save)");
    assert_int_equal(tu_count_nonfinite(zs, nx), 0);
    free(zs);

    double *ref[OUTS];
    for (int i = 0; i < OUTS; ++i) ref[i] = tu_malloc(count[i] * sizeof(double));
    const ref_grads rg = {ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], ref[6], ref[7], ref[8]};
    const ref_problem rp = tu_layer_problem(&l, &o);
    assert_int_equal(ref_backward(&rp, dz, &rg), 0);
    static const char *const names[OUTS] = {"dx", "dwq", "dwk", "dwv", "dwo", "dalpha_q", "dalpha_k", "dalpha_v", "dr"};
    for (int i = 0; i < OUTS; ++i) {
        float *got = tu_malloc(count[i] * sizeof *got), *got2 = tu_malloc(count[i] * sizeof *got2);
        read_as(out[i], count[i], half[i], got, names[i]);
        read_as(again[i], count[i], half[i], got2, names[i]);
        tu_assert_close(names[i], got, ref[i], count[i], TOL_F16);
        if (memcmp(got, got2, count[i] * sizeof *got) != 0)
            fail_msg("%s: iha_backward_saved differs from iha_backward with half storage", names[i]);
        free(got), free(got2), free(ref[i]);
        tu_buffer_release(out[i].mem), tu_buffer_release(again[i].mem);
    }
    for (int i = 0; i < 8; ++i) tu_buffer_release(wb[i].mem);
    tu_buffer_release(x.mem), tu_buffer_release(bdz.mem), tu_buffer_release(z.mem), tu_buffer_release(saved);
    free(dz);
    tu_layer_free(&l);
}

static void layer_backward_half(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const half_case cases[] = {
        /* B N D H d P mask window rope act weight offsets identity */
        {2, 5, 12, 2, 8, 3, IHA_MASK_CAUSAL, 0, 1, 1, 1, 0, 0},
        {1, 9, 16, 2, 16, 1, IHA_MASK_CAUSAL, 0, 1, 0, 1, 0, 1},
        {1, 7, 9, 3, 5, 2, IHA_MASK_TOKEN_CAUSAL, 3, 0, 1, 0, 0, 0},
        /* 24 rows: the forward's projections convert the half weights instead of the GEMV */
        {2, 12, 16, 2, 8, 2, IHA_MASK_CAUSAL, 0, 1, 1, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_backward_case(&cases[i]);
}

/* ---- Decoding ---- */

/* Token at a time with half x, z, weights and cache: the rows equal the full forward's. */
static void decode_step_half_everything(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape full = {2, 12, 32, 2, 16, 2};
    iha_attention_options o = half_options(IHA_MASK_CAUSAL, 0, 1);
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &full, 31, &o);
    const size_t D = full.model_dim, B = full.batch, N = full.tokens;
    iha_layer_weights w = upload_weights(&l, 1);
    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &full, IHA_STORAGE_F16, &cache), IHA_OK);
    const iha_shape step = {B, 1, D, full.heads, full.head_dim, full.pseudo};
    float *xs = tu_malloc(B * D * sizeof *xs), *zs = tu_malloc(B * D * sizeof *zs);
    float *z = tu_malloc(B * N * D * sizeof *z);
    for (size_t n = 0; n < N; ++n) {
        for (size_t b = 0; b < B; ++b) memcpy(xs + b * D, l.x + (b * N + n) * D, D * sizeof *xs);
        cl_mem xm = half_buffer(xs, B * D, 0), zm = half_buffer(NULL, B * D, 0);
        tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &w, NULL, (iha_buffer){xm, 0}, (iha_buffer){zm, 0}),
                         IHA_OK);
        half_read_checked(zm, 0, B * D, zs, "z (decode step)");
        for (size_t b = 0; b < B; ++b) memcpy(z + (b * N + n) * D, zs + b * D, D * sizeof *z);
        tu_buffer_release(xm);
        tu_buffer_release(zm);
    }
    tu_assert_close("z (decode, half everything)", z, zref, B * N * D, TOL_F16);
    iha_kv_cache_free(cache);
    free(xs), free(zs), free(z), free(zref);
    tu_layer_weights_release(&w);
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
    const size_t nx = tu_count_x(&s), nw = tu_count_w(&s);
    iha_layer_weights w = upload_weights(&l, 1);
    iha_attention_options o = half_options(IHA_MASK_CAUSAL, 0, 0);
    iha_buffer x = upload_as(l.x, nx, 1, 0);
    /* A buffer of exactly nx halves (no guard) fits z; one half fewer does not. */
    cl_int err;
    cl_mem exact = clCreateBuffer(iha_context_cl_context(tu_ctx), CL_MEM_READ_WRITE, nx * 2, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, (iha_buffer){exact, 0}), IHA_OK);
    cl_mem z = half_buffer(NULL, nx, 0);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, (iha_buffer){exact, 1}), IHA_ERROR_BUFFER_TOO_SMALL);
    /* The same buffer is too small for float storage. */
    iha_attention_options of = o;
    of.storage = IHA_STORAGE_F32;
    of.weight_storage = IHA_STORAGE_F32;
    cl_mem xf = tu_buffer_guarded(tu_ctx, l.x, nx, 0, 0, 0.0f);
    iha_layer_weights wf = upload_weights(&l, 0);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &of, &wf, (iha_buffer){xf, 0}, (iha_buffer){exact, 0}),
                     IHA_ERROR_BUFFER_TOO_SMALL);
    /* Unknown storage values. */
    iha_attention_options bad = o;
    bad.storage = 7;
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &bad, &w, x, (iha_buffer){z, 0}), IHA_ERROR_INVALID_ARGUMENT);
    bad = o;
    bad.weight_storage = -1;
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &bad, &w, x, (iha_buffer){z, 0}), IHA_ERROR_INVALID_ARGUMENT);
    /* Overlaps are judged in bytes: float wq [0, 4*nw) bytes, a half z starting at half 2*nw-1
     * overlaps it, at half 2*nw it does not. */
    cl_mem shared = tu_buffer_guarded(tu_ctx, l.wq, nw, 0, (nx + 8) / 2 + 1, 0.0f);
    iha_attention_options omix = o;
    omix.weight_storage = IHA_STORAGE_F32;
    iha_layer_weights wmixf = wf;
    wmixf.wq = wmixf.wk = wmixf.wv = wmixf.wo = (iha_buffer){shared, 0};
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &omix, &wmixf, x, (iha_buffer){shared, 2 * nw - 1}),
                     IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &omix, &wmixf, x, (iha_buffer){shared, 2 * nw}), IHA_OK);
    /* The unfused baseline is float only. */
    const iha_shape one = {1, 8, 1, 1, 8, 2};
    const size_t nv = tu_count_virtual(&one);
    cl_mem a = half_buffer(NULL, nv, 0), b = half_buffer(NULL, nv, 0);
    tu_assert_status(tu_ctx, iha_attention_unfused(tu_ctx, &one, &o, (iha_buffer){a, 0}, (iha_buffer){a, 0}, (iha_buffer){a, 0}, (iha_buffer){b, 0}),
                     IHA_ERROR_UNSUPPORTED);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);

    tu_buffer_release(a), tu_buffer_release(b), tu_buffer_release(exact), tu_buffer_release(z);
    tu_buffer_release(xf), tu_buffer_release(shared), tu_buffer_release(x.mem);
    tu_layer_weights_release(&w);
    tu_layer_weights_release(&wf);
    tu_layer_free(&l);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest others[] = {
        cmocka_unit_test(host_conversions_round_to_nearest_even),
        cmocka_unit_test(core_and_attention_half),
        cmocka_unit_test(attention_backward_half),
        cmocka_unit_test(layer_backward_half),
        cmocka_unit_test(decode_step_half_everything),
        cmocka_unit_test(refusals),
    };
    const tu_case_table table = {kForwardCases, sizeof kForwardCases[0], FORWARD_CASE_COUNT, forward_case};
    return tu_main_table(argc, argv, &table, others, sizeof others / sizeof others[0], tu_group_setup,
                         tu_group_teardown);
}
