/* Drivers that end kernel loops early (src/runtime/loop_limit.h): the probe is on exactly on
 * such a driver, a long sequence there is right or refused with IHA_ERROR_UNSUPPORTED, never
 * wrong, and a refusal does not leak into the next call. On other drivers the probe is off and
 * the long sequence is right. CI runs this file on PoCL and on Mesa rusticl (llvmpipe). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "runtime/context.h"
#include "test_util.h"

static int mesa_driver(const iha_context *ctx)
{
    return strstr(ctx->info.platform_name, "rusticl") != NULL || strstr(ctx->info.platform_name, "Clover") != NULL ||
           strstr(ctx->info.device_vendor, "Mesa") != NULL;
}

/* iha_attention over one sequence of T = n * p virtual tokens: its status, and on success the
 * relative L2 error of o against the float64 reference (with `check`). */
static iha_status attention_once(iha_context *ctx, size_t n, size_t p, size_t d, int mask, int check, double *error)
{
    iha_shape s = {1, n, 1, 1, d, p};
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.mask = mask;
    const size_t elems = n * p * d;
    tu_rng rng = tu_rng_seeded(7 + n);
    float *qt = tu_random_array(&rng, elems, 1.5f), *kt = tu_random_array(&rng, elems, 1.5f),
          *vt = tu_random_array(&rng, elems, 1.0f), *out = tu_malloc(elems * sizeof *out);
    cl_mem qb = tu_buffer_new(ctx, elems), kb = tu_buffer_new(ctx, elems), vb = tu_buffer_new(ctx, elems),
           ob = tu_buffer_new(ctx, elems);
    tu_buffer_write(ctx, qb, 0, qt, elems);
    tu_buffer_write(ctx, kb, 0, kt, elems);
    tu_buffer_write(ctx, vb, 0, vt, elems);
    iha_status st = iha_attention(ctx, &s, &o, (iha_buffer){qb, 0}, (iha_buffer){kb, 0}, (iha_buffer){vb, 0},
                                  (iha_buffer){ob, 0}, (iha_buffer){NULL, 0});
    if (st == IHA_OK) st = iha_context_finish(ctx);
    if (st == IHA_OK && check) {
        ref_problem rp;
        memset(&rp, 0, sizeof rp);
        rp.B = 1, rp.N = n, rp.H = 1, rp.d = d, rp.P = p, rp.mask = mask;
        double *ref = tu_malloc(elems * sizeof *ref);
        assert_int_equal(ref_attention(&rp, qt, kt, vt, ref, NULL), 0);
        tu_buffer_read(ctx, ob, 0, out, elems);
        *error = tu_rel_l2(out, ref, elems);
        free(ref);
    }
    cl_mem m[4] = {qb, kb, vb, ob};
    for (int i = 0; i < 4; i++) tu_buffer_release(m[i]);
    free(qt), free(kt), free(vt), free(out);
    return st;
}

static void probe_matches_driver(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    if (mesa_driver(tu_ctx)) {
        /* Mesa 22.3's gallivm stops after 65535 iterations; a later Mesa may lift the limit. */
        if (tu_ctx->loop_flag != NULL) assert_true(tu_ctx->loop_limit > 0 && tu_ctx->loop_limit < (1 << 17));
        else assert_int_equal(tu_ctx->loop_limit, 0);
    } else {
        assert_null(tu_ctx->loop_flag);
        assert_int_equal(tu_ctx->loop_limit, 0);
    }
}

/* 2048 virtual tokens, causal: within the probe's budget on llvmpipe in the configuration the
 * library builds in there, where a work-item's loops spend 2d iterations on each block of 16
 * keys (d for the scores, d/16 chunks of 16 keys' values): the last row's 128 blocks at d = 64
 * take 16384. So it must be right everywhere. */
static void long_sequence_is_right(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    double error = 1.0;
    tu_assert_status(tu_ctx, attention_once(tu_ctx, 512, 4, 64, IHA_MASK_CAUSAL, 1, &error), IHA_OK);
    if (error > TU_TOL_F32) fail_msg("T = 2048, causal: relative L2 error %.3e", error);
}

/* Past the budget the call is refused, names the driver, and the next call is not affected.
 * The shape is about the cheapest that the configuration of long_sequence_is_right cuts: at
 * d = 256 a key block takes 512 iterations, so the last of 2176 causal rows needs 136 * 512 =
 * 69632, and the causal rows before it, most of them within the budget, keep the run short. */
static void too_long_is_refused(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    if (tu_ctx->loop_flag == NULL) skip(); /* loops run to completion: nothing to refuse */
    double error = 1.0;
    assert_int_equal(attention_once(tu_ctx, 1088, 2, 256, IHA_MASK_CAUSAL, 0, &error), IHA_ERROR_UNSUPPORTED);
    const char *msg = iha_context_message(tu_ctx);
    if (strstr(msg, "ends a kernel's loops") == NULL || strstr(msg, tu_ctx->info.device_name) == NULL)
        fail_msg("the refusal does not say why: \"%s\"", msg);
    tu_assert_status(tu_ctx, attention_once(tu_ctx, 64, 2, 16, IHA_MASK_CAUSAL, 1, &error), IHA_OK);
    if (error > TU_TOL_F32) fail_msg("the call after a refusal: relative L2 error %.3e", error);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(probe_matches_driver),
        cmocka_unit_test(long_sequence_is_right),
        cmocka_unit_test(too_long_is_refused),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
