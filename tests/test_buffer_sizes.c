/*
 * test_buffer_sizes.c - buffers smaller than their shape and offset need (CL_MEM_SIZE), for
 * every tensor of iha_forward, iha_attention_core and iha_attention, and size_t overflow of the
 * shape's products: each refused with a clear status and a message, its output untouched.
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
#include "test_refusals.h"

/* Each tensor in turn replaced by a buffer one float too short, then by the right size at an
 * offset of one, then at an offset near SIZE_MAX. */
static void forward_buffers_too_small(void **state)
{
    (void)state;
    tr_fixture f;
    tr_fixture_init(&f, &tr_shape, 1);
    size_t nx = tu_count_x(&tr_shape), nw = tu_count_w(&tr_shape), nm = tu_count_mix(&tr_shape);
    iha_buffer *slots[10] = {&f.dev.x, &f.dev.weights.wq, &f.dev.weights.wk, &f.dev.weights.wv,
                             &f.dev.weights.wo, &f.dev.weights.alpha_q, &f.dev.weights.alpha_k,
                             &f.dev.weights.alpha_v, &f.dev.weights.r, &f.dev.z};
    size_t need[10] = {nx, nw, nw, nw, nw, nm, nm, nm, nm, nx};
    for (int i = 0; i < 10; i++) {
        iha_buffer saved = *slots[i];
        int is_z = i == 9;
        cl_mem short_mem = tr_sentinel_buffer(need[i] - 1);
        *slots[i] = (iha_buffer){short_mem, 0};
        tr_assert_refused(tr_run_forward(&f, &tr_shape, &f.o), IHA_ERROR_BUFFER_TOO_SMALL, is_z ? short_mem : f.dev.z.mem,
                       is_z ? need[i] - 1 : f.z_total);
        tu_buffer_release(short_mem);

        cl_mem exact = tr_sentinel_buffer(need[i]);
        *slots[i] = (iha_buffer){exact, 1};
        tr_assert_refused(tr_run_forward(&f, &tr_shape, &f.o), IHA_ERROR_BUFFER_TOO_SMALL, is_z ? exact : f.dev.z.mem,
                       is_z ? need[i] : f.z_total);
        /* offset + count wraps around size_t: too small either way, never a pass */
        *slots[i] = (iha_buffer){exact, SIZE_MAX - 2};
        tr_assert_refused_either(tr_run_forward(&f, &tr_shape, &f.o), IHA_ERROR_BUFFER_TOO_SMALL, IHA_ERROR_SIZE_OVERFLOW,
                              is_z ? exact : f.dev.z.mem, is_z ? need[i] : f.z_total);
        tu_buffer_release(exact);
        *slots[i] = saved;
    }
    tr_fixture_free(&f);
}

/* Calls iha_attention_core (is_core: q, k, v, y, alpha_q, alpha_k, alpha_v, r in bufs) or
 * iha_attention (qt, kt, vt, o, lse), expects a refusal with `expected`, and checks that the
 * outputs (bufs[3] and, for iha_attention, bufs[4]; floats[i] floats each) hold only sentinels. */
static void refused_call(int is_core, const iha_shape *s, const iha_layer_weights *w, const iha_buffer *bufs,
                         const size_t *floats, iha_status expected)
{
    iha_attention_options o = tr_default_options();
    if (is_core) {
        iha_layer_weights mixed = *w;
        mixed.alpha_q = bufs[4];
        mixed.alpha_k = bufs[5];
        mixed.alpha_v = bufs[6];
        mixed.r = bufs[7];
        tr_assert_refused(iha_attention_core(tu_ctx, s, &o, &mixed, bufs[0], bufs[1], bufs[2], bufs[3]), expected,
                       bufs[3].mem, floats[3]);
    } else {
        tr_assert_refused(iha_attention(tu_ctx, s, &o, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]), expected,
                       bufs[3].mem, floats[3]);
        tu_assert_buffer_all(tu_ctx, bufs[4].mem, 0, floats[4], TU_SENTINEL);
    }
}

/* For the core (q, k, v, y, alpha_q, alpha_k, alpha_v, r) or attention (qt, kt, vt, o, lse):
 * each buffer in turn one float too short, then the right size pushed past its end by an
 * offset of one. */
static void inner_buffers_too_small(int is_core)
{
    tr_fixture f;
    tr_fixture_init(&f, &tr_shape, 0);
    size_t n = is_core ? tu_count_heads(&tr_shape) : tu_count_virtual(&tr_shape);
    size_t nm = tu_count_mix(&tr_shape), nl = tr_shape.batch * tr_shape.heads * tr_shape.tokens * tr_shape.pseudo;
    size_t count = is_core ? 8 : 5;
    size_t need[8] = {n, n, n, n, is_core ? nm : nl, nm, nm, nm};
    iha_buffer bufs[8];
    size_t floats[8];
    for (size_t i = 0; i < count; i++) {
        floats[i] = need[i] + TU_GUARD;
        bufs[i] = (iha_buffer){tr_sentinel_buffer(floats[i]), 0};
    }
    for (size_t i = 0; i < count; i++) {
        iha_buffer saved = bufs[i];
        size_t saved_floats = floats[i];
        floats[i] = need[i] - 1;
        bufs[i] = (iha_buffer){tr_sentinel_buffer(floats[i]), 0};
        refused_call(is_core, &tr_shape, &f.dev.weights, bufs, floats, IHA_ERROR_BUFFER_TOO_SMALL);
        tu_buffer_release(bufs[i].mem);
        floats[i] = need[i];
        bufs[i] = (iha_buffer){tr_sentinel_buffer(floats[i]), 1};
        refused_call(is_core, &tr_shape, &f.dev.weights, bufs, floats, IHA_ERROR_BUFFER_TOO_SMALL);
        tu_buffer_release(bufs[i].mem);
        bufs[i] = saved;
        floats[i] = saved_floats;
    }
    for (size_t i = 0; i < count; i++)
        tu_buffer_release(bufs[i].mem);
    tr_fixture_free(&f);
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
    tr_fixture f;
    tr_fixture_init(&f, &tr_shape, 0);
    tu_layer *l = &f.layer;
    iha_buffer b = {f.big, 0}, ob = {f.out, 0}, lse = {tr_sentinel_buffer(400), 0};
    for (size_t i = 0; i < sizeof kOverflow / sizeof kOverflow[0]; i++) {
        const iha_shape *s = &kOverflow[i].shape;
        print_message("overflow of %s\n", kOverflow[i].what);
        /* A tensor whose element count fits but whose byte count wraps is too small either way. */
        int bytes_only = i == 6;
        iha_status expected = IHA_ERROR_SIZE_OVERFLOW;
        iha_status st = tr_run_forward(&f, s, &f.o);
        if (bytes_only)
            tr_assert_refused_either(st, expected, IHA_ERROR_BUFFER_TOO_SMALL, f.dev.z.mem, f.z_total);
        else
            tr_assert_refused(st, expected, f.dev.z.mem, f.z_total);
        st = iha_forward_host(tu_ctx, s, &f.o, &f.hw, l->x, f.z);
        if (bytes_only && st != IHA_ERROR_SIZE_OVERFLOW && st != IHA_ERROR_HOST_MEMORY)
            fail_msg("iha_forward_host: %s for a shape whose X has 2^62+1 elements", iha_status_name(st));
        if (!bytes_only)
            tu_assert_status(tu_ctx, st, expected);
        if (kOverflow[i].in_core)
            tr_assert_refused(iha_attention_core(tu_ctx, s, &f.o, &f.dev.weights, b, b, b, ob), expected, f.out, TR_SPARE);
        if (kOverflow[i].in_attention)
            tr_assert_refused(iha_attention(tu_ctx, s, &f.o, b, b, b, ob, lse), expected, f.out, TR_SPARE);
    }
    tr_assert_host_untouched(f.z, f.nz);
    tu_buffer_release(lse.mem);
    tr_fixture_free(&f);
}
#else
static void size_overflow(void **state)
{
    (void)state;
    skip(); /* the shapes above assume a 64-bit size_t */
}
#endif

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(forward_buffers_too_small),
        cmocka_unit_test(core_buffers_too_small),
        cmocka_unit_test(attention_buffers_too_small),
        cmocka_unit_test(size_overflow),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
