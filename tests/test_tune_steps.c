/* The decode tuning tests' shared decoding and checks (test_tune_steps.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdlib.h>

#include "test_layer.h"
#include "test_profiles.h"
#include "test_tune_steps.h"
#include "test_util.h"

#define TOL_F16 2e-3 /* doc/spec.md's half-storage contract */

ts_decoded ts_decode_layer(iha_context *ctx, const ts_decoding *how, const tu_layer *l, const double *zref,
                           iha_storage storage)
{
    const size_t N = how->shape->tokens, D = how->shape->model_dim;
    tu_device_layer dev;
    tu_device_layer_upload(ctx, l, 0, &dev);
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = (int)storage;
    co.compact = how->compact;
    iha_kv_cache *cache = NULL;
    tu_assert_status(ctx, iha_kv_cache_create_with(ctx, how->shape, &co, &cache), IHA_OK);
    cl_mem xs = tu_buffer_new(ctx, N * D), zs = tu_buffer_new(ctx, N * D);
    tu_buffer_write(ctx, xs, 0, l->x, (N - 1) * D);
    ts_decoded out;
    iha_shape step = *how->shape;
    step.tokens = N - 1;
    tu_assert_status(ctx,
                     iha_decode_step(ctx, cache, &step, &how->options, &dev.weights, NULL, (iha_buffer){xs, 0},
                                     (iha_buffer){zs, 0}),
                     IHA_OK);
    out.prefill = tp_choice_of(ctx, how->kernel);
    float *z = tu_malloc(D * sizeof *z);
    tu_fill_nan(z, D);
    tu_buffer_write(ctx, zs, 0, z, D);
    tu_buffer_write(ctx, xs, 0, l->x + (N - 1) * D, D);
    step.tokens = 1;
    tu_assert_status(ctx,
                     iha_decode_step(ctx, cache, &step, &how->options, &dev.weights, NULL, (iha_buffer){xs, 0},
                                     (iha_buffer){zs, 0}),
                     IHA_OK);
    out.step = tp_choice_of(ctx, how->kernel);
    tu_buffer_read(ctx, zs, 0, z, D);
    tu_assert_close("the last token's output", z, zref + (N - 1) * D, D,
                    storage == IHA_STORAGE_F32 ? TU_TOL_F32 : TOL_F16);
    free(z);
    tu_buffer_release(xs), tu_buffer_release(zs);
    iha_kv_cache_free(cache);
    tu_device_layer_release(&dev);
    return out;
}

void ts_tune(iha_context *ctx, const ts_decoding *how, double budget, iha_tune_result *results, size_t capacity,
             size_t *count)
{
    iha_tune_options to;
    iha_tune_options_init(&to);
    to.kernels = how->tune_kernels;
    to.budget_s = budget;
    to.reps = 3;
    tu_assert_status(ctx, iha_tune(ctx, how->shape, &how->options, 1, &to, results, capacity, count), IHA_OK);
}

void ts_check_profile_serves_steps(const ts_decoding *how, const char *path, const iha_tune_result r[2], int seed)
{
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, how->shape, seed, &how->options);
    const char *profiles[2] = {path, "off"};
    for (int i = 0; i < 2; i++) {
        iha_context *ctx = tp_open_with_kernels(profiles[i], NULL);
        for (int half = 0; half < 2; half++) {
            const ts_decoded d = ts_decode_layer(ctx, how, &l, zref, half ? IHA_STORAGE_F16 : IHA_STORAGE_F32);
            assert_int_equal(d.step.source, i == 0 ? IHA_CONFIG_PROFILE_EXACT : IHA_CONFIG_BUILTIN_TYPE);
            assert_int_equal(d.prefill.source, i == 0 ? IHA_CONFIG_PROFILE_NEAREST : IHA_CONFIG_BUILTIN_TYPE);
            assert_string_equal(d.step.bucket, r[half].bucket);
            assert_string_equal(d.step.config, i == 0 ? r[half].tuned_config : r[half].default_config);
        }
        iha_context_free(ctx);
    }
    free(zref);
    tu_layer_free(&l);
}
