/*
 * test_errors.c - bad input gets a clear status and a non-empty message (iha_context_message),
 * never a crash and never a write: NULL pointers, zero dimensions, d > 256, unknown masks,
 * negative windows, bad scales, rotary with odd d, NULL mixing with P > 1, outputs that overlap
 * an input, buffers of another context, workspace beyond the device. Every refused call must
 * leave its output buffer (sentinel-filled, with guards) untouched, and the context must still
 * compute correctly afterwards. Also: iha_context_create with a device spec that matches
 * nothing, the status name/description table, and iha_measure_attention_loops's refusals (with
 * its one success, since it shares the shape checks of iha_attention). Buffers smaller than
 * their shape needs and size overflow are test_buffer_sizes.c's.
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

static void null_pointers(void **state)
{
    (void)state;
    tr_fixture f;
    tr_fixture_init(&f, &tr_shape, 0);
    iha_layer_weights w = f.dev.weights;

    assert_int_equal(iha_forward(NULL, &tr_shape, &f.o, &w, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT);
    tr_assert_refused(iha_forward(tu_ctx, NULL, &f.o, &w, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    tr_assert_refused(iha_forward(tu_ctx, &tr_shape, NULL, &w, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    tr_assert_refused(iha_forward(tu_ctx, &tr_shape, &f.o, NULL, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    tr_assert_refused(iha_forward(tu_ctx, &tr_shape, &f.o, &w, (iha_buffer){NULL, 0}, f.dev.z), IHA_ERROR_INVALID_ARGUMENT,
                   f.dev.z.mem, f.z_total);
    assert_int_equal(iha_forward(tu_ctx, &tr_shape, &f.o, &w, f.dev.x, (iha_buffer){NULL, 0}), IHA_ERROR_INVALID_ARGUMENT);
    assert_true(iha_context_message(tu_ctx)[0] != '\0');

    iha_buffer *slots[8] = {&w.wq, &w.wk, &w.wv, &w.wo, &w.alpha_q, &w.alpha_k, &w.alpha_v, &w.r};
    for (int i = 0; i < 8; i++) {
        iha_buffer saved = *slots[i];
        slots[i]->mem = NULL; /* P = 2: NULL mixing is not the identity shortcut */
        tr_assert_refused(iha_forward(tu_ctx, &tr_shape, &f.o, &w, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT,
                       f.dev.z.mem, f.z_total);
        *slots[i] = saved;
    }
    /* All four mixing tensors NULL is the shortcut only when P = 1. */
    w.alpha_q.mem = w.alpha_k.mem = w.alpha_v.mem = w.r.mem = NULL;
    tr_assert_refused(iha_forward(tu_ctx, &tr_shape, &f.o, &w, f.dev.x, f.dev.z), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem,
                   f.z_total);
    w = f.dev.weights;

    /* iha_attention_core */
    iha_buffer q = f.dev.x, y = f.dev.z; /* big enough stand-ins: B*N*D = 40 = B*N*H*d */
    assert_int_equal(iha_attention_core(NULL, &tr_shape, &f.o, &w, q, q, q, y), IHA_ERROR_INVALID_ARGUMENT);
    tr_assert_refused(iha_attention_core(tu_ctx, NULL, &f.o, &w, q, q, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem, f.z_total);
    tr_assert_refused(iha_attention_core(tu_ctx, &tr_shape, NULL, &w, q, q, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    tr_assert_refused(iha_attention_core(tu_ctx, &tr_shape, &f.o, NULL, q, q, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    iha_buffer none = {NULL, 0};
    tr_assert_refused(iha_attention_core(tu_ctx, &tr_shape, &f.o, &w, none, q, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    tr_assert_refused(iha_attention_core(tu_ctx, &tr_shape, &f.o, &w, q, none, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    tr_assert_refused(iha_attention_core(tu_ctx, &tr_shape, &f.o, &w, q, q, none, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    assert_int_equal(iha_attention_core(tu_ctx, &tr_shape, &f.o, &w, q, q, q, none), IHA_ERROR_INVALID_ARGUMENT);
    w.alpha_v.mem = NULL;
    tr_assert_refused(iha_attention_core(tu_ctx, &tr_shape, &f.o, &w, q, q, q, y), IHA_ERROR_INVALID_ARGUMENT, y.mem,
                   f.z_total);
    w = f.dev.weights;

    /* iha_attention: qt, kt, vt, o are B*H*T*d = 80 floats here */
    cl_mem big = tr_sentinel_buffer(200), out = tr_sentinel_buffer(200);
    iha_buffer b = {big, 0}, ob = {out, 0};
    assert_int_equal(iha_attention(NULL, &tr_shape, &f.o, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT);
    tr_assert_refused(iha_attention(tu_ctx, NULL, &f.o, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 200);
    tr_assert_refused(iha_attention(tu_ctx, &tr_shape, NULL, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 200);
    tr_assert_refused(iha_attention(tu_ctx, &tr_shape, &f.o, none, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 200);
    tr_assert_refused(iha_attention(tu_ctx, &tr_shape, &f.o, b, none, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 200);
    tr_assert_refused(iha_attention(tu_ctx, &tr_shape, &f.o, b, b, none, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, 200);
    assert_int_equal(iha_attention(tu_ctx, &tr_shape, &f.o, b, b, b, none, none), IHA_ERROR_INVALID_ARGUMENT);
    tu_buffer_release(big);
    tu_buffer_release(out);

    /* iha_forward_host */
    tu_layer *l = &f.layer;
    size_t nz = tu_count_x(&tr_shape);
    float *z = tu_malloc(nz * sizeof *z);
    tu_fill_value(z, nz, TU_SENTINEL);
    iha_host_weights hw = tu_layer_host_weights(l);
    assert_int_equal(iha_forward_host(NULL, &tr_shape, &f.o, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, NULL, &f.o, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &tr_shape, NULL, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &tr_shape, &f.o, NULL, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &tr_shape, &f.o, &hw, NULL, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &tr_shape, &f.o, &hw, l->x, NULL), IHA_ERROR_INVALID_ARGUMENT);
    const float **hslots[8] = {&hw.wq, &hw.wk, &hw.wv, &hw.wo, &hw.alpha_q, &hw.alpha_k, &hw.alpha_v, &hw.r};
    for (int i = 0; i < 8; i++) {
        const float *saved = *hslots[i];
        *hslots[i] = NULL;
        tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &tr_shape, &f.o, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
        assert_true(iha_context_message(tu_ctx)[0] != '\0');
        *hslots[i] = saved;
    }
    tr_assert_host_untouched(z, nz);
    free(z);

    /* Context and device list */
    assert_int_equal(iha_context_create(NULL, NULL, NULL, 0), IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(iha_devices_list(NULL, 0, NULL), IHA_ERROR_INVALID_ARGUMENT);
    tr_fixture_free(&f);
}

static void zero_dimensions(void **state)
{
    (void)state;
    tr_fixture f;
    tr_fixture_init(&f, &tr_shape, 0);
    tu_layer *l = &f.layer;
    iha_buffer b = {f.big, 0}, ob = {f.out, 0}, none = {NULL, 0};
    for (int field = 0; field < 6; field++) {
        iha_shape s = tr_shape;
        size_t *fields[6] = {&s.batch, &s.tokens, &s.model_dim, &s.heads, &s.head_dim, &s.pseudo};
        *fields[field] = 0;
        tr_assert_refused(tr_run_forward(&f, &s, &f.o), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
        tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &f.o, &f.hw, l->x, f.z), IHA_ERROR_INVALID_ARGUMENT);
        if (field == 2)
            continue; /* model_dim is ignored by the calls below */
        tr_assert_refused(iha_attention_core(tu_ctx, &s, &f.o, &f.dev.weights, b, b, b, ob), IHA_ERROR_INVALID_ARGUMENT,
                       f.out, TR_SPARE);
        tr_assert_refused(iha_attention(tu_ctx, &s, &f.o, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, f.out, TR_SPARE);
    }
    tr_assert_host_untouched(f.z, f.nz);
    tr_fixture_free(&f);
}

/* d = 257 with buffers large enough for it: only the head width is wrong. */
static void head_dim_above_256(void **state)
{
    (void)state;
    const iha_shape s = {1, 2, 4, 1, 257, 1};
    tr_fixture f;
    tr_fixture_init(&f, &s, 0);
    tr_assert_refused(tr_run_forward(&f, &s, &f.o), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    size_t n = tu_count_virtual(&s);
    cl_mem big = tr_sentinel_buffer(n), out = tr_sentinel_buffer(n);
    iha_buffer b = {big, 0}, ob = {out, 0}, none = {NULL, 0};
    tr_assert_refused(iha_attention_core(tu_ctx, &s, &f.o, &f.dev.weights, b, b, b, ob), IHA_ERROR_INVALID_ARGUMENT, out, n);
    tr_assert_refused(iha_attention(tu_ctx, &s, &f.o, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, n);
    tu_layer *l = &f.layer;
    iha_host_weights hw = tu_layer_host_weights(l);
    float z[8];
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &f.o, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_buffer_release(big);
    tu_buffer_release(out);
    tr_fixture_free(&f);
}

static void bad_options(void **state)
{
    (void)state;
    tr_fixture f;
    tr_fixture_init(&f, &tr_shape, 0);
    size_t n = tu_count_virtual(&tr_shape);
    cl_mem big = tr_sentinel_buffer(n), out = tr_sentinel_buffer(n + 40);
    iha_buffer b = {big, 0}, ob = {out, 0}, none = {NULL, 0};

    iha_attention_options bad[8];
    for (int i = 0; i < 8; i++)
        bad[i] = tr_default_options();
    bad[0].mask = 7;
    bad[1].mask = -1;
    bad[2].window = -1;
    bad[3].window = INT64_MIN;
    bad[4].scale = NAN;
    bad[5].scale = INFINITY;
    bad[6].scale = -INFINITY;
    bad[7].mask = 3;
    for (int i = 0; i < 8; i++) {
        tr_assert_refused(tr_run_forward(&f, &tr_shape, &bad[i]), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
        tr_assert_refused(iha_attention_core(tu_ctx, &tr_shape, &bad[i], &f.dev.weights, b, b, b, ob),
                       IHA_ERROR_INVALID_ARGUMENT, out, n + 40);
        tr_assert_refused(iha_attention(tu_ctx, &tr_shape, &bad[i], b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out,
                       n + 40);
    }
    /* A rotary base that is not a finite positive number. */
    static const float bad_bases[3] = {NAN, INFINITY, -2.0f};
    for (int i = 0; i < 3; i++) {
        iha_attention_options rb = tr_default_options();
        rb.rope = 1;
        rb.rope_base = bad_bases[i];
        tr_assert_refused(tr_run_forward(&f, &tr_shape, &rb), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    }
    /* iha_attention takes already rotated inputs: rope must be 0. */
    iha_attention_options rope = tr_default_options();
    rope.rope = 1;
    tr_assert_refused(iha_attention(tu_ctx, &tr_shape, &rope, b, b, b, ob, none), IHA_ERROR_INVALID_ARGUMENT, out, n + 40);
    tr_fixture_free(&f);

    /* Rotary needs an even head width. */
    const iha_shape odd = {1, 5, 8, 2, 5, 2};
    tr_fixture_init(&f, &odd, 0);
    tr_assert_refused(tr_run_forward(&f, &odd, &rope), IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    tr_assert_refused(iha_attention_core(tu_ctx, &odd, &rope, &f.dev.weights, b, b, b, ob), IHA_ERROR_INVALID_ARGUMENT,
                   out, n + 40);
    tu_layer *l = &f.layer;
    iha_host_weights hw = tu_layer_host_weights(l);
    float z[40];
    tu_fill_value(z, 40, TU_SENTINEL);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &odd, &rope, &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &odd, &bad[0], &hw, l->x, z), IHA_ERROR_INVALID_ARGUMENT);
    tr_assert_host_untouched(z, 40);
    tu_buffer_release(big);
    tu_buffer_release(out);
    tr_fixture_free(&f);
}

/* Outputs that overlap an input in the same buffer ("must not overlap" in iha.h) are refused. */
static void overlapping_output_refused(void **state)
{
    (void)state;
    tr_fixture f;
    tr_fixture_init(&f, &tr_shape, 0);
    size_t nx = tu_count_x(&tr_shape), nh = tu_count_heads(&tr_shape), nv = tu_count_virtual(&tr_shape);
    size_t total = 4 * nv + TU_GUARD;
    cl_mem arena = tr_sentinel_buffer(total);
    /* z starts inside x (both B*N*D floats). */
    iha_buffer x = {arena, 0}, z = {arena, nx - 1};
    tr_assert_refused(iha_forward(tu_ctx, &tr_shape, &f.o, &f.dev.weights, x, z), IHA_ERROR_INVALID_ARGUMENT, arena, total);
    /* y overlapping v, o overlapping kt. */
    iha_buffer q = {arena, 0}, k = {arena, nh}, v = {arena, 2 * nh}, y = {arena, 3 * nh - 1};
    tr_assert_refused(iha_attention_core(tu_ctx, &tr_shape, &f.o, &f.dev.weights, q, k, v, y), IHA_ERROR_INVALID_ARGUMENT,
                   arena, total);
    iha_buffer qt = {arena, 0}, kt = {arena, nv}, vt = {arena, 2 * nv}, out = {arena, nv + 1}, none = {NULL, 0};
    tr_assert_refused(iha_attention(tu_ctx, &tr_shape, &f.o, qt, kt, vt, out, none), IHA_ERROR_INVALID_ARGUMENT, arena,
                   total);
    tu_buffer_release(arena);
    tr_fixture_free(&f);
}

/* A cl_mem of another OpenCL context (on the same device) is not usable on this context's queue
 * (undefined behaviour in OpenCL): it is refused up front, and nothing is written. */
static void buffer_of_another_context_refused(void **state)
{
    (void)state;
    tr_fixture f;
    tr_fixture_init(&f, &tr_shape, 0);
    cl_device_id device = iha_context_cl_device(tu_ctx);
    cl_int err = CL_SUCCESS;
    cl_context other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_mem foreign = clCreateBuffer(other, CL_MEM_READ_WRITE, 4096 * sizeof(float), NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    iha_buffer saved = f.dev.x;
    f.dev.x = (iha_buffer){foreign, 0};
    iha_status st = tr_run_forward(&f, &tr_shape, &f.o);
    f.dev.x = saved;
    /* Check before anything else runs on the context: the next call replaces the message. */
    tr_assert_refused(st, IHA_ERROR_INVALID_ARGUMENT, f.dev.z.mem, f.z_total);
    clReleaseMemObject(foreign);
    clReleaseContext(other);
    tr_fixture_free(&f);
}

/* Valid buffers, but internal tensors (Q alone is 64 GiB here) beyond what a device allocates:
 * a clear refusal, not a crash, and z untouched. The header leaves the status open. */
static void workspace_beyond_device_limits(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, (size_t)1 << 24, 1, 4, 256, 4};
    iha_attention_options o = tr_default_options();
    size_t nx = tu_count_x(&s), nw = tu_count_w(&s), nm = tu_count_mix(&s);
    cl_mem x = tr_sentinel_buffer(nx), z = tr_sentinel_buffer(nx), w = tr_sentinel_buffer(nw), m = tr_sentinel_buffer(nm);
    iha_buffer wb = {w, 0}, mb = {m, 0};
    iha_layer_weights weights = {wb, wb, wb, wb, mb, mb, mb, mb};
    iha_status st = iha_forward(tu_ctx, &s, &o, &weights, (iha_buffer){x, 0}, (iha_buffer){z, 0});
    if (st != IHA_ERROR_DEVICE_MEMORY && st != IHA_ERROR_UNSUPPORTED && st != IHA_ERROR_SIZE_OVERFLOW)
        fail_msg("a 256 GiB workspace: %s (%s)", iha_status_name(st), iha_context_message(tu_ctx));
    print_message("refused with %s: %s\n", iha_status_name(st), iha_context_message(tu_ctx));
    tr_assert_refused(st, st, z, nx);
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
    iha_attention_options o = tu_options(IHA_MASK_TOKEN_CAUSAL, 2, 0);
    tu_check_random_layer(tu_ctx, &tr_shape, 78, &o, TU_API_DEVICE_OFFSETS);
    tu_check_random_layer(tu_ctx, &tr_shape, 78, &o, TU_API_HOST);
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
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
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

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_names_and_descriptions),
        cmocka_unit_test(null_pointers),
        cmocka_unit_test(zero_dimensions),
        cmocka_unit_test(head_dim_above_256),
        cmocka_unit_test(bad_options),
        cmocka_unit_test(overlapping_output_refused),
        cmocka_unit_test(buffer_of_another_context_refused),
        cmocka_unit_test(workspace_beyond_device_limits),
        cmocka_unit_test(context_still_correct_after_errors),
        cmocka_unit_test(context_create_without_match),
        cmocka_unit_test(measure_attention_loops),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}

