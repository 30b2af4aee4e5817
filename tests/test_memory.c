/* The forward pass never forms a T x T matrix: a causal layer with B=1, H=1, N=8192, P=4, d=64
 * (T = 32768, where one T x T float matrix alone is 4 GiB) must run with peak resident memory
 * under 1 GiB, and its sampled rows must still meet doc/spec.md's contract. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "reference.h"
#include "test_util.h"


static void long_causal_layer_stays_small(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const size_t B = 1, N = 8192, D = 64, H = 1, d = 64, P = 4;
    tu_rng rng = tu_rng_seeded(8192);
    float *x = tu_random_array(&rng, B * N * D, 1.0f);
    float *w[4], *mix[4];
    for (int i = 0; i < 4; ++i) w[i] = tu_random_array(&rng, D * H * d, 0.2f);
    for (int i = 0; i < 4; ++i) mix[i] = tu_random_array(&rng, H * H * P, 1.0f);
    float *z = tu_malloc(B * N * D * sizeof *z);
    tu_fill_nan(z, B * N * D);

    const iha_shape shape = {B, N, D, H, d, P};
    iha_attention_options o;
    iha_attention_options_init(&o);
    const iha_host_weights hw = {w[0], w[1], w[2], w[3], mix[0], mix[1], mix[2], mix[3]};
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &shape, &o, &hw, x, z), IHA_OK);

    struct rusage usage;
    assert_int_equal(getrusage(RUSAGE_SELF, &usage), 0);
    const double peak_mib = (double)usage.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
    if (peak_mib >= 1024.0) fail_msg("peak resident memory %.0f MiB, limit 1024 MiB", peak_mib);
    assert_int_equal(tu_count_nonfinite(z, B * N * D), 0);

    /* Rows spread over the sequence, the first and the last included. */
    size_t rows[8];
    for (size_t i = 0; i < 8; ++i) rows[i] = i * (N - 1) / 7;
    const ref_problem p = {B, N, D, H, d, P, IHA_MASK_CAUSAL, 0, 0.0, 0, 0.0,
                           x, w[0], w[1], w[2], w[3], mix[0], mix[1], mix[2], mix[3], NULL, 0};
    double *ref = tu_malloc(8 * D * sizeof *ref);
    float *got = tu_malloc(8 * D * sizeof *got);
    assert_int_equal(ref_forward(&p, rows, 8, ref), 0);
    for (size_t i = 0; i < 8; ++i)
        for (size_t c = 0; c < D; ++c) got[i * D + c] = z[rows[i] * D + c];
    tu_assert_close("z rows", got, ref, 8 * D, TU_TOL_F32);

    free(ref);
    free(got);
    free(z);
    free(x);
    for (int i = 0; i < 4; ++i) {
        free(w[i]);
        free(mix[i]);
    }
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(long_causal_layer_stays_small),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
