/*
 * test_errors.c - bad input gets a clear status and a non-empty message (iha_context_message),
 * never a crash and never a write: NULL pointers, zero dimensions, d > 256, unknown masks,
 * negative windows, bad scales, rotary with odd d, NULL mixing with P > 1, buffers smaller than
 * their shape and offset need (CL_MEM_SIZE), and size_t overflow of the shape's products. Every
 * refused call must leave its output buffer (sentinel-filled, with guards) untouched, and the
 * context must still compute correctly afterwards. Also: iha_context_create with a device spec
 * that matches nothing, the status name/description table, and iha_measure_attention_loops's
 * refusals (with its one success, since it shares the shape checks of iha_attention).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "test_layer.h"


/* A valid small layer on the device whose z buffer holds only sentinels. */
typedef struct fixture {
    tu_layer layer;
    tu_device_layer dev;
    size_t z_total; /* floats in dev.z.mem */
} fixture;

/* A buffer of n floats, all TU_SENTINEL. */
static cl_mem sentinel_buffer(size_t n)
{
    return tu_buffer_guarded(tu_ctx, NULL, 0, 0, n, TU_SENTINEL);
}

static void fixture_init(fixture *f, const iha_shape *shape, int offsets)
{
    tu_layer_init(&f->layer, shape, 77);
    tu_device_layer_upload(tu_ctx, &f->layer, offsets, &f->dev);
    f->z_total = f->dev.z.offset + tu_count_x(shape) + TU_GUARD;
    tu_buffer_release(f->dev.z.mem);
    f->dev.z.mem = sentinel_buffer(f->z_total);
}

static void fixture_free(fixture *f)
{
    tu_device_layer_release(&f->dev);
    tu_layer_free(&f->layer);
}

static iha_attention_options default_options(void)
{
    iha_attention_options o;
    iha_attention_options_init(&o);
    return o;
}

/* A refused call: status `expected`, a message, and the n floats of `out` all sentinels. */
static void assert_refused(iha_status got, iha_status expected, cl_mem out, size_t n)
{
    tu_assert_status(tu_ctx, got, expected);
    const char *message = iha_context_message(tu_ctx);
    if (!message || !message[0])
        fail_msg("%s came back without a message", iha_status_name(got));
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    tu_assert_buffer_all(tu_ctx, out, 0, n, TU_SENTINEL);
}

/* Either of two statuses (where the header allows both readings), with the same checks. */
static void assert_refused_either(iha_status got, iha_status a, iha_status b, cl_mem out, size_t n)
{
    assert_refused(got, got == b ? b : a, out, n);
}

static iha_status run_forward(const fixture *f, const iha_shape *shape, const iha_attention_options *o)
{
    return iha_forward(tu_ctx, shape, o, &f->dev.weights, f->dev.x, f->dev.z);
}

static const iha_shape kShape = {1, 5, 8, 2, 4, 2}; /* B N D H d P */

static void null_pointers(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    fixture f;
    fixture_init(&f, &kShape, 0);
    iha_attention_options o = default_options();
    iha_layer_weights w = f.dev.weights;

    assert_int_equal(iha_forward(NULL, &kShape, &o, &w, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT);
    assert_refused(iha_forward(tu_ctx, NULL, &o, &w, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    assert_refused(iha_forward(tu_ctx, &kShape, NULL, &w, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    assert_refused(iha_forward(tu_ctx, &kShape, &o, NULL, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    assert_refused(iha_forward(tu_ctx, &kShape, &o, &w, (iha_buffer){NULL, 0}, f.dev.z), IHA_ERROR_INVALID_ARGUMENT,
                   f.dev.z.mem, f.z_total);
    assert_int_equal(iha_forward(tu_ctx, &kShape, &o, &w, f.dev.x, (iha_buffer){NULL, 0}), IHA_ERROR_INVALID_ARGUMENT);
    assert_true(iha_context_message(tu_ctx)[0] != '\0');

    iha_buffer *slots[8] = {&w.wq, &w.wk, &w.wv, &w.wo, &w.alpha_q, &w.alpha_k, &w.alpha_v, &w.r};
    for (int i = 0; i < 8; i++) {
        iha_buffer saved = *slots[i];
        slots[i]->mem = NULL; /* P = 2: NULL mixing is not the identity shortcut */
        assert_refused(iha_forward(tu_ctx, &kShape, &o, &w, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT,
                       f.dev.z.mem, f.z_total);
        *slots[i] = saved;
    }
    /* All four mixing tensors NULL is the shortcut only when P = 1. */
    w.alpha_q.mem = w.alpha_k.mem = w.alpha_v.mem = w.r.mem = NULL;
    assert_refused(iha_forward(tu_ctx, &kShape, &o, &w, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem,
                   f.z_total);
    w = f.dev.weights;

    /* iha_attention_core */
    iha_buffer q = f.dev.x, y = f.dev.z; /* big enough stand-ins: B*N*D = 40 = B*N*H*d */
    assert_int_equal(iha_attention_core(NULL, &kShape, &o, &w, q, q, q, y), IHA_ERROR_INVALID_ARGUMENT);
    assert_refused(iha_attention_core(tu_ctx, NULL, &o, &w, q, q, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem, f.z_total);
    assert_refused(iha_attention_core(tu_ctx, &kShape, NULL, &w, q, q, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    assert_refused(iha_attention_core(tu_ctx, &kShape, &o, NULL, q, q, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    iha_buffer none = {NULL, 0};
    assert_refused(iha_attention_core(tu_ctx, &kShape, &o, &w, none, q, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    assert_refused(iha_attention_core(tu_ctx, &kShape, &o, &w, q, none, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    assert_refused(iha_attention_core(tu_ctx, &kShape, &o, &w, q, q, none, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    assert_int_equal(iha_attention_core(tu_ctx, &kShape, &o, &w, q, q, q, none), IHA_ERROR_INVALID_ARGUMENT);
    w.alpha_v.mem = NULL;
    assert_refused(iha_attention_core(tu_ctx, &kShape, &o, &w, q, q, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    w = f.dev.weights;

    /* iha_attention: qt, kt, vt, o are B*H*T*d = 80 floats here */
    cl_mem big = sentinel_buffer(200), out = sentinel_buffer(200);
    iha_buffer b = {big, 0}, ob = {out, 0};
    assert_int_equal(iha_attention(NULL, &kShape, &o, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT);
    assert_refused(iha_attention(tu_ctx, NULL, &o, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 200);
    assert_refused(iha_attention(tu_ctx, &kShape, NULL, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 200);
    assert_refused(iha_attention(tu_ctx, &kShape, &o, none, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 200);
    assert_refused(iha_attention(tu_ctx, &kShape, &o, b, none, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 200);
    assert_refused(iha_attention(tu_ctx, &kShape, &o, b, b, none, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 200);
    assert_int_equal(iha_attention(tu_ctx, &kShape, &o, b, b, b, none, none), IHA_ERROR_INVALID_ARGUMENT);
    tu_buffer_release(big);
    tu_buffer_release(out);

    /* iha_forward_host */
    tu_layer *l = &f.layer;
    size_t nz = tu_count_x(&kShape);
    float *z = tu_malloc(nz * sizeof *z);
    tu_fill_value(z, nz, TU_SENTINEL);
    iha_host_weights hw = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    assert_int_equal(iha_forward_host(NULL, &kShape, &o, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, NULL, &o, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &kShape, NULL, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &kShape, &o, NULL, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &kShape, &o, &hw, NULL, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &kShape, &o, &hw, l->x, NULL), IHA_ERROR_INVALID_ARGUMENT);
    const float **hslots[8] = {&hw.wq, &hw.wk, &hw.wv, &hw.wo, &hw.alpha_q, &hw.alpha_k, &hw.alpha_v, &hw.r};
    for (int i = 0; i < 8; i++) {
        const float *saved = *hslots[i];
        *hslots[i] = NULL;
        tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &kShape, &o, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
        assert_true(iha_context_message(tu_ctx)[0] != '\0');
        *hslots[i] = saved;
    }
    for (size_t i = 0; i < nz; i++)
        assert_memory_equal(&z[i], &(float){TU_SENTINEL}, sizeof(float));
    free(z);

    /* Context and device list */
    assert_int_equal(iha_context_create(NULL, NULL, NULL, 0), IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(iha_devices_list(NULL, 0, NULL), IHA_ERROR_INVALID_ARGUMENT);
    fixture_free(&f);
}

static void zero_dimensions(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    fixture f;
    fixture_init(&f, &kShape, 0);
    iha_attention_options o = default_options();
    tu_layer *l = &f.layer;
    iha_host_weights hw = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    size_t nz = tu_count_x(&kShape);
    float *z = tu_malloc(nz * sizeof *z);
    tu_fill_value(z, nz, TU_SENTINEL);
    cl_mem big = sentinel_buffer(400), out = sentinel_buffer(400);
    iha_buffer b = {big, 0}, ob = {out, 0}, none = {NULL, 0};
    for (int field = 0; field < 6; field++) {
        iha_shape s = kShape;
        size_t *fields[6] = {&s.batch, &s.tokens, &s.model_dim, &s.heads, &s.head_dim, &s.pseudo};
        *fields[field] = 0;
        assert_refused(run_forward(&f, &s, &o), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
        tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
        if (field == 2)
            continue; /* model_dim is ignored by the calls below */
        assert_refused(iha_attention_core(tu_ctx, &s, &o, &f.dev.weights, b, b, b, ob), IHA_ERROR_INVALID_ARGUMENT,
                       out, 400);
        assert_refused(iha_attention(tu_ctx, &s, &o, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 400);
    }
    for (size_t i = 0; i < nz; i++)
        assert_memory_equal(&z[i], &(float){TU_SENTINEL}, sizeof(float));
    free(z);
    tu_buffer_release(big);
    tu_buffer_release(out);
    fixture_free(&f);
}

/* d = 257 with buffers large enough for it: only the head width is wrong. */
static void head_dim_above_256(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 2, 4, 1, 257, 1};
    fixture f;
    fixture_init(&f, &s, 0);
    iha_attention_options o = default_options();
    assert_refused(run_forward(&f, &s, &o), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    size_t n = tu_count_virtual(&s);
    cl_mem big = sentinel_buffer(n), out = sentinel_buffer(n);
    iha_buffer b = {big, 0}, ob = {out, 0}, none = {NULL, 0};
    assert_refused(iha_attention_core(tu_ctx, &s, &o, &f.dev.weights, b, b, b, ob), IHA_ERROR_INVALID_ARGUMENT, out, n);
    assert_refused(iha_attention(tu_ctx, &s, &o, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, n);
    tu_layer *l = &f.layer;
    iha_host_weights hw = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    float z[8];
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_buffer_release(big);
    tu_buffer_release(out);
    fixture_free(&f);
}

static void bad_options(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    fixture f;
    fixture_init(&f, &kShape, 0);
    size_t n = tu_count_virtual(&kShape);
    cl_mem big = sentinel_buffer(n), out = sentinel_buffer(n + 40);
    iha_buffer b = {big, 0}, ob = {out, 0}, none = {NULL, 0};

    iha_attention_options bad[8];
    for (int i = 0; i < 8; i++)
        bad[i] = default_options();
    bad[0].mask = 7;
    bad[1].mask = -1;
    bad[2].window = -1;
    bad[3].window = INT64_MIN;
    bad[4].scale = NAN;
    bad[5].scale = INFINITY;
    bad[6].scale = -INFINITY;
    bad[7].mask = 3;
    for (int i = 0; i < 8; i++) {
        assert_refused(run_forward(&f, &kShape, &bad[i]), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
        assert_refused(iha_attention_core(tu_ctx, &kShape, &bad[i], &f.dev.weights, b, b, b, ob),
                       IHA_ERROR_INVALID_ARGUMENT, out, n + 40);
        assert_refused(iha_attention(tu_ctx, &kShape, &bad[i], b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out,
                       n + 40);
    }
    /* A rotary base that is not a finite positive number. */
    static const float bad_bases[3] = {NAN, INFINITY, -2.0f};
    for (int i = 0; i < 3; i++) {
        iha_attention_options rb = default_options();
        rb.rope = 1;
        rb.rope_base = bad_bases[i];
        assert_refused(run_forward(&f, &kShape, &rb), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    }
    /* iha_attention takes already rotated inputs: rope must be 0. */
    iha_attention_options rope = default_options();
    rope.rope = 1;
    assert_refused(iha_attention(tu_ctx, &kShape, &rope, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, n + 40);
    fixture_free(&f);

    /* Rotary needs an even head width. */
    const iha_shape odd = {1, 5, 8, 2, 5, 2};
    fixture_init(&f, &odd, 0);
    assert_refused(run_forward(&f, &odd, &rope), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    assert_refused(iha_attention_core(tu_ctx, &odd, &rope, &f.dev.weights, b, b, b, ob), IHA_ERROR_INVALID_ARGUMENT,
                   out, n + 40);
    tu_layer *l = &f.layer;
    iha_host_weights hw = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    float z[40];
    tu_fill_value(z, 40, TU_SENTINEL);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &odd, &rope, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &odd, &bad[0], &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < 40; i++)
        assert_memory_equal(&z[i], &(float){TU_SENTINEL}, sizeof(float));
    tu_buffer_release(big);
    tu_buffer_release(out);
    fixture_free(&f);
}

/* Each tensor in turn replaced by a buffer one float too short, then by the right size at an
 * offset of one, then at an offset near SIZE_MAX. */
static void forward_buffers_too_small(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    fixture f;
    fixture_init(&f, &kShape, 1);
    iha_attention_options o = default_options();
    size_t nx = tu_count_x(&kShape), nw = tu_count_w(&kShape), nm = tu_count_mix(&kShape);
    iha_buffer *slots[10] = {&f.dev.x, &f.dev.weights.wq, &f.dev.weights.wk, &f.dev.weights.wv,
                             &f.dev.weights.wo, &f.dev.weights.alpha_q, &f.dev.weights.alpha_k,
                             &f.dev.weights.alpha_v, &f.dev.weights.r, &f.dev.z};
    size_t need[10] = {nx, nw, nw, nw, nw, nm, nm, nm, nm, nx};
    for (int i = 0; i < 10; i++) {
        iha_buffer saved = *slots[i];
        int is_z = i == 9;
        cl_mem short_mem = sentinel_buffer(need[i] - 1);
        *slots[i] = (iha_buffer){short_mem, 0};
        assert_refused(run_forward(&f, &kShape, &o), IHA_ERROR_BUFFER_TOO_SMALL, is_z ? short_mem : f.dev.z.mem,
                       is_z ? need[i] - 1 : f.z_total);
        tu_buffer_release(short_mem);

        cl_mem exact = sentinel_buffer(need[i]);
        *slots[i] = (iha_buffer){exact, 1};
        assert_refused(run_forward(&f, &kShape, &o), IHA_ERROR_BUFFER_TOO_SMALL, is_z ? exact : f.dev.z.mem,
                       is_z ? need[i] : f.z_total);
        /* offset + count wraps around size_t: too small either way, never a pass */
        *slots[i] = (iha_buffer){exact, SIZE_MAX - 2};
        assert_refused_either(run_forward(&f, &kShape, &o), IHA_ERROR_BUFFER_TOO_SMALL, IHA_ERROR_SIZE_OVERFLOW,
                              is_z ? exact : f.dev.z.mem, is_z ? need[i] : f.z_total);
        tu_buffer_release(exact);
        *slots[i] = saved;
    }
    fixture_free(&f);
}

/* Calls iha_attention_core (is_core: q, k, v, y, alpha_q, alpha_k, alpha_v, r in bufs) or
 * iha_attention (qt, kt, vt, o, lse), expects a refusal with `expected`, and checks that the
 * outputs (bufs[3] and, for iha_attention, bufs[4]; floats[i] floats each) hold only sentinels. */
static void refused_call(int is_core, const iha_shape *s, const iha_layer_weights *w, const iha_buffer *bufs,
                         const size_t *floats, iha_status expected)
{
    iha_attention_options o = default_options();
    if (is_core) {
        iha_layer_weights mixed = *w;
        mixed.alpha_q = bufs[4];
        mixed.alpha_k = bufs[5];
        mixed.alpha_v = bufs[6];
        mixed.r = bufs[7];
        assert_refused(iha_attention_core(tu_ctx, s, &o, &mixed, bufs[0], bufs[1], bufs[2], bufs[3]), expected,
                       bufs[3].mem, floats[3]);
    } else {
        assert_refused(iha_attention(tu_ctx, s, &o, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]), expected,
                       bufs[3].mem, floats[3]);
        tu_assert_buffer_all(tu_ctx, bufs[4].mem, 0, floats[4], TU_SENTINEL);
    }
}

/* For the core (q, k, v, y, alpha_q, alpha_k, alpha_v, r) or attention (qt, kt, vt, o, lse):
 * each buffer in turn one float too short, then the right size pushed past its end by an
 * offset of one. */
static void inner_buffers_too_small(int is_core)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    fixture f;
    fixture_init(&f, &kShape, 0);
    size_t n = is_core ? tu_count_heads(&kShape) : tu_count_virtual(&kShape);
    size_t nm = tu_count_mix(&kShape), nl = kShape.batch * kShape.heads * kShape.tokens * kShape.pseudo;
    size_t count = is_core ? 8 : 5;
    size_t need[8] = {n, n, n, n, is_core ? nm : nl, nm, nm, nm};
    iha_buffer bufs[8];
    size_t floats[8];
    for (size_t i = 0; i < count; i++) {
        floats[i] = need[i] + TU_GUARD;
        bufs[i] = (iha_buffer){sentinel_buffer(floats[i]), 0};
    }
    for (size_t i = 0; i < count; i++) {
        iha_buffer saved = bufs[i];
        size_t saved_floats = floats[i];
        floats[i] = need[i] - 1;
        bufs[i] = (iha_buffer){sentinel_buffer(floats[i]), 0};
        refused_call(is_core, &kShape, &f.dev.weights, bufs, floats, IHA_ERROR_BUFFER_TOO_SMALL);
        tu_buffer_release(bufs[i].mem);
        floats[i] = need[i];
        bufs[i] = (iha_buffer){sentinel_buffer(floats[i]), 1};
        refused_call(is_core, &kShape, &f.dev.weights, bufs, floats, IHA_ERROR_BUFFER_TOO_SMALL);
        tu_buffer_release(bufs[i].mem);
        bufs[i] = saved;
        floats[i] = saved_floats;
    }
    for (size_t i = 0; i < count; i++)
        tu_buffer_release(bufs[i].mem);
    fixture_free(&f);
}

static void core_buffers_too_small(void **state)
{
    (void)state;
    inner_buffers_too_small(1);
}

static void attention_buffers_too_small(void **state)
{
    (void)state;
    inner_buffers_too_small(0);
}

#if SIZE_MAX > 0xffffffffu
#define BIT(k) ((size_t)1 << (k))

/* Shapes whose products overflow size_t while every single field is valid. */
static const struct {
    const char *what;
    iha_shape shape;   /* B N D H d P */
    int in_core, in_attention; /* whether iha_attention_core / iha_attention see it too */
} kOverflow[] = {
    {"T = N*P", {1, SIZE_MAX / 2, 8, 1, 4, 4}, 1, 1},
    {"T*d", {1, SIZE_MAX / 512 + 1, 1, 1, 256, 2}, 1, 1},
    {"B*N*D (X, Z)", {BIT(40), 1, BIT(30), 1, 1, 1}, 0, 0},
    {"D*H*d (weights)", {1, 1, BIT(40), BIT(20), 16, 1}, 0, 0},
    {"H*H*P (mixing)", {1, 1, 1, BIT(32), 1, 1}, 1, 0},
    {"B*H*T*d", {BIT(35), BIT(20), 1, 1, 256, 4}, 1, 1},
    {"bytes of X", {1, BIT(62) + 1, 1, 1, 1, 1}, 0, 0},
};

static void size_overflow(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    fixture f;
    fixture_init(&f, &kShape, 0);
    iha_attention_options o = default_options();
    tu_layer *l = &f.layer;
    iha_host_weights hw = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    size_t nz = tu_count_x(&kShape);
    float *z = tu_malloc(nz * sizeof *z);
    tu_fill_value(z, nz, TU_SENTINEL);
    cl_mem big = sentinel_buffer(400), out = sentinel_buffer(400);
    iha_buffer b = {big, 0}, ob = {out, 0}, lse = {sentinel_buffer(400), 0};
    for (size_t i = 0; i < sizeof kOverflow / sizeof kOverflow[0]; i++) {
        const iha_shape *s = &kOverflow[i].shape;
        print_message("overflow of %s\n", kOverflow[i].what);
        /* A tensor whose element count fits but whose byte count wraps is too small either way. */
        int bytes_only = i == 6;
        iha_status expected = IHA_ERROR_SIZE_OVERFLOW;
        iha_status st = run_forward(&f, s, &o);
        if (bytes_only)
            assert_refused_either(st, expected, IHA_ERROR_BUFFER_TOO_SMALL, f.dev.z.mem, f.z_total);
        else
            assert_refused(st, expected, f.dev.z.mem, f.z_total);
        st = iha_forward_host(tu_ctx, s, &o, &hw, l->x, z);
        if (bytes_only && st != IHA_ERROR_SIZE_OVERFLOW && st != IHA_ERROR_HOST_MEMORY)
            fail_msg("iha_forward_host: %s for a shape whose X has 2^62+1 elements", iha_status_name(st));
        if (!bytes_only)
            tu_assert_status(tu_ctx, st, expected);
        if (kOverflow[i].in_core)
            assert_refused(iha_attention_core(tu_ctx, s, &o, &f.dev.weights, b, b, b, ob), expected, out, 400);
        if (kOverflow[i].in_attention)
            assert_refused(iha_attention(tu_ctx, s, &o, b, b, b, ob, lse), expected, out, 400);
    }
    for (size_t i = 0; i < nz; i++)
        assert_memory_equal(&z[i], &(float){TU_SENTINEL}, sizeof(float));
    free(z);
    tu_buffer_release(big);
    tu_buffer_release(out);
    tu_buffer_release(lse.mem);
    fixture_free(&f);
}
#else
static void size_overflow(void **state)
{
    (void)state;
    skip(); /* the shapes above assume a 64-bit size_t */
}
#endif

/* Outputs that overlap an input in the same buffer ("must not overlap" in iha.h) are refused. */
static void overlapping_output_refused(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_attention_options o = default_options();
    fixture f;
    fixture_init(&f, &kShape, 0);
    size_t nx = tu_count_x(&kShape), nh = tu_count_heads(&kShape), nv = tu_count_virtual(&kShape);
    size_t total = 4 * nv + TU_GUARD;
    cl_mem arena = sentinel_buffer(total);
    /* z starts inside x (both B*N*D floats). */
    iha_buffer x = {arena, 0}, z = {arena, nx - 1};
    assert_refused(iha_forward(tu_ctx, &kShape, &o, &f.dev.weights, x, z), IHA_ERROR_INVALID_ARGUMENT, arena, total);
    /* y overlapping v, o overlapping kt. */
    iha_buffer q = {arena, 0}, k = {arena, nh}, v = {arena, 2 * nh}, y = {arena, 3 * nh - 1};
    assert_refused(iha_attention_core(tu_ctx, &kShape, &o, &f.dev.weights, q, k, v, y), IHA_ERROR_INVALID_ARGUMENT,
                   arena, total);
    iha_buffer qt = {arena, 0}, kt = {arena, nv}, vt = {arena, 2 * nv}, out = {arena, nv + 1}, none = {NULL, 0};
    assert_refused(iha_attention(tu_ctx, &kShape, &o, qt, kt, vt, out, none), IHA_ERROR_INVALID_ARGUMENT, arena,
                   total);
    tu_buffer_release(arena);
    fixture_free(&f);
}

/* A cl_mem of another OpenCL context (on the same device) is not usable on this context's queue
 * (undefined behaviour in OpenCL): it is refused up front, and nothing is written. */
static void buffer_of_another_context_refused(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_attention_options o = default_options();
    fixture f;
    fixture_init(&f, &kShape, 0);
    cl_device_id device = iha_context_cl_device(tu_ctx);
    cl_int err = CL_SUCCESS;
    cl_context other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_mem foreign = clCreateBuffer(other, CL_MEM_READ_WRITE, 4096 * sizeof(float), NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    iha_buffer saved = f.dev.x;
    f.dev.x = (iha_buffer){foreign, 0};
    iha_status st = run_forward(&f, &kShape, &o);
    f.dev.x = saved;
    /* Check before anything else runs on the context: the next call replaces the message. */
    assert_refused(st, IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    clReleaseMemObject(foreign);
    clReleaseContext(other);
    fixture_free(&f);
}

/* Valid buffers, but internal tensors (Q alone is 64 GiB here) beyond what a device allocates:
 * a clear refusal, not a crash, and z untouched. The header leaves the status open. */
static void workspace_beyond_device_limits(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, (size_t)1 << 24, 1, 4, 256, 4};
    iha_attention_options o = default_options();
    size_t nx = tu_count_x(&s), nw = tu_count_w(&s), nm = tu_count_mix(&s);
    cl_mem x = sentinel_buffer(nx), z = sentinel_buffer(nx), w = sentinel_buffer(nw), m = sentinel_buffer(nm);
    iha_buffer wb = {w, 0}, mb = {m, 0};
    iha_layer_weights weights = {wb, wb, wb, wb, mb, mb, mb, mb};
    iha_status st = iha_forward(tu_ctx, &s, &o, &weights, (iha_buffer){x, 0}, (iha_buffer){z, 0});
    if (st != IHA_ERROR_DEVICE_MEMORY && st != IHA_ERROR_UNSUPPORTED && st != IHA_ERROR_SIZE_OVERFLOW)
        fail_msg("a 256 GiB workspace: %s (%s)", iha_status_name(st), iha_context_message(tu_ctx));
    print_message("refused with %s: %s\n", iha_status_name(st), iha_context_message(tu_ctx));
    assert_refused(st, st, z, nx);
    tu_buffer_release(x);
    tu_buffer_release(z);
    tu_buffer_release(w);
    tu_buffer_release(m);
}

/* After all the refusals, the same context still computes the right answer, and a successful
 * call writes exactly its output: the guards before and after z hold. */
static void context_still_correct_after_errors(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_attention_options o = default_options();
    o.mask = IHA_MASK_TOKEN_CAUSAL;
    o.window = 2;
    tu_layer l;
    tu_layer_init(&l, &kShape, 78);
    double *zref = tu_layer_reference(&l, &o);
    tu_layer_check_forward(tu_ctx, &l, &o, TU_API_DEVICE_OFFSETS, zref, TU_TOL_F32);
    tu_layer_check_forward(tu_ctx, &l, &o, TU_API_HOST, zref, TU_TOL_F32);
    free(zref);
    tu_layer_free(&l);
}

static void context_create_without_match(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const char *specs[] = {"no-such-device-xyz", "99:0", "0:99", "-1:0"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        iha_context_options options;
        iha_context_options_init(&options);
        options.device = specs[i];
        iha_context *ctx = (iha_context *)&options; /* must be overwritten with NULL */
        char message[256];
        memset(message, 'x', sizeof message);
        iha_status st = iha_context_create(&ctx, &options, message, sizeof message);
        if (st != IHA_ERROR_NO_DEVICE)
            fail_msg("device \"%s\": %s, expected IHA_ERROR_NO_DEVICE", specs[i], iha_status_name(st));
        assert_null(ctx);
        assert_non_null(memchr(message, '\0', sizeof message));
        assert_true(strlen(message) > 0);
        /* A short message buffer is truncated and terminated; NULL is allowed. */
        char tiny[8];
        memset(tiny, 'x', sizeof tiny);
        assert_int_equal(iha_context_create(&ctx, &options, tiny, sizeof tiny), IHA_ERROR_NO_DEVICE);
        assert_non_null(memchr(tiny, '\0', sizeof tiny));
        assert_int_equal(iha_context_create(&ctx, &options, NULL, 0), IHA_ERROR_NO_DEVICE);
        assert_null(ctx);
    }
}

static void status_names_and_descriptions(void **state)
{
    (void)state;
#define CHECK_STATUS(name, value, text)                            \
    assert_int_equal((int)name, value);                            \
    assert_string_equal(iha_status_name(name), #name);             \
    assert_string_equal(iha_status_description(name), text);
    IHA_STATUS_MAP(CHECK_STATUS)
#undef CHECK_STATUS
    static const int unknown[] = {1, -999, 12345, -100000}; /* values no status will take */
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_string_equal(iha_status_name((iha_status)unknown[i]), "IHA_STATUS_UNKNOWN");
        const char *description = iha_status_description((iha_status)unknown[i]);
        assert_non_null(description);
        assert_true(strlen(description) > 0);
    }
}

/* The attention loops' measurement refuses what iha_attention refuses. On the register-tile
 * variant (the CPU built-in) both rates are positive and finite; a device whose configuration is
 * the local-memory variant (the GPU built-in) gets IHA_ERROR_UNSUPPORTED and says why. */
static void measure_attention_loops(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_context *ctx = tu_ctx;
    iha_shape s = {.batch = 1, .tokens = 32, .model_dim = 0, .heads = 2, .head_dim = 24, .pseudo = 2};
    iha_attention_options o;
    iha_attention_options_init(&o);
    double score = -1.0, pv = -1.0;

    assert_int_equal(iha_measure_attention_loops(NULL, &s, &o, &score, &pv), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(ctx, iha_measure_attention_loops(ctx, &s, &o, NULL, &pv), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(ctx, iha_measure_attention_loops(ctx, &s, &o, &score, NULL), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(ctx, iha_measure_attention_loops(ctx, NULL, &o, &score, &pv), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(ctx, iha_measure_attention_loops(ctx, &s, NULL, &score, &pv), IHA_ERROR_INVALID_ARGUMENT);
    iha_shape bad = s;
    bad.head_dim = 0;
    tu_assert_status(ctx, iha_measure_attention_loops(ctx, &bad, &o, &score, &pv), IHA_ERROR_INVALID_ARGUMENT);
    bad.head_dim = 257;
    tu_assert_status(ctx, iha_measure_attention_loops(ctx, &bad, &o, &score, &pv), IHA_ERROR_INVALID_ARGUMENT);
    iha_attention_options bad_o = o;
    bad_o.mask = 7;
    tu_assert_status(ctx, iha_measure_attention_loops(ctx, &s, &bad_o, &score, &pv), IHA_ERROR_INVALID_ARGUMENT);
    assert_true(score == -1.0 && pv == -1.0); /* refusals write nothing */

    const iha_status st = iha_measure_attention_loops(ctx, &s, &o, &score, &pv);
    if (st == IHA_ERROR_UNSUPPORTED) {
        assert_non_null(strstr(iha_context_message(ctx), "local-memory"));
        return;
    }
    tu_assert_status(ctx, st, IHA_OK);
    assert_true(isfinite(score) && score > 0.0);
    assert_true(isfinite(pv) && pv > 0.0);
}

int main(void)
{
    tu_init_environment();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_names_and_descriptions),
        cmocka_unit_test(null_pointers),
        cmocka_unit_test(zero_dimensions),
        cmocka_unit_test(head_dim_above_256),
        cmocka_unit_test(bad_options),
        cmocka_unit_test(forward_buffers_too_small),
        cmocka_unit_test(core_buffers_too_small),
        cmocka_unit_test(attention_buffers_too_small),
        cmocka_unit_test(size_overflow),
        cmocka_unit_test(overlapping_output_refused),
        cmocka_unit_test(buffer_of_another_context_refused),
        cmocka_unit_test(workspace_beyond_device_limits),
        cmocka_unit_test(context_still_correct_after_errors),
        cmocka_unit_test(context_create_without_match),
        cmocka_unit_test(measure_attention_loops),
    };
    return cmocka_run_group_tests(tests, tu_group_setup, tu_group_teardown);
}
