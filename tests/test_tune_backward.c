/*
 * test_tune_backward.c - tuning of the attention backward (src/tune/space_backward.c): iha_tune
 * with IHA_TUNE_BACKWARD stores a verified configuration that iha_attention_backward then uses,
 * with gradients inside doc/spec.md's contract; a hand-written profile's backward entry is used
 * and reported by iha_context_last_choices; a candidate that is fast but wrong is rejected and
 * never stored. Shapes are tiny: every new configuration costs PoCL a compile.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "test_layer.h"
#include "test_util.h"
#include "test_profiles.h"

/* iha_attention_backward of tp_small_shape (causal, global) on random inputs, whose O and LSE
 * come from the float64 reference, checked against its gradients; returns the call's
 * "backward" choice. */
static iha_kernel_choice backward_checked(iha_context *ctx)
{
    const iha_shape s = tp_small_shape;
    const size_t T = s.tokens * s.pseudo, n = s.batch * s.heads * T * s.head_dim, rows = s.batch * s.heads * T;
    tu_rng rng = tu_rng_seeded(77);
    float *in[4];
    for (int i = 0; i < 4; i++) in[i] = tu_random_array(&rng, n, 1.0f);
    const ref_problem p = {s.batch, s.tokens, 1, s.heads, s.head_dim, s.pseudo, IHA_MASK_CAUSAL, 0, 0.0, 0, 0.0,
                           NULL,    NULL,     NULL, NULL, NULL,      NULL,     NULL,            NULL, NULL, NULL, 0};
    double *o = tu_malloc(n * sizeof *o), *lse = tu_malloc(rows * sizeof *lse);
    assert_int_equal(ref_attention(&p, in[0], in[1], in[2], o, lse), 0);
    float *of = tu_malloc(n * sizeof *of), *lf = tu_malloc(rows * sizeof *lf);
    for (size_t i = 0; i < n; i++) of[i] = (float)o[i];
    for (size_t i = 0; i < rows; i++) lf[i] = (float)lse[i];
    cl_mem b[6] = {tu_buffer_new(ctx, n), tu_buffer_new(ctx, n), tu_buffer_new(ctx, n),
                   tu_buffer_new(ctx, n), tu_buffer_new(ctx, rows), tu_buffer_new(ctx, n)};
    const float *host[6] = {in[0], in[1], in[2], of, lf, in[3]};
    for (int i = 0; i < 6; i++) tu_buffer_write(ctx, b[i], 0, host[i], i == 4 ? rows : n);
    cl_mem out[3] = {tu_buffer_new(ctx, n), tu_buffer_new(ctx, n), tu_buffer_new(ctx, n)};
    iha_attention_options opt = tu_options(IHA_MASK_CAUSAL, 0, 0);
    tu_assert_status(ctx,
                     iha_attention_backward(ctx, &s, &opt, (iha_buffer){b[0], 0}, (iha_buffer){b[1], 0},
                                            (iha_buffer){b[2], 0}, (iha_buffer){b[3], 0}, (iha_buffer){b[4], 0},
                                            (iha_buffer){b[5], 0}, (iha_buffer){out[0], 0}, (iha_buffer){out[1], 0},
                                            (iha_buffer){out[2], 0}),
                     IHA_OK);
    const iha_kernel_choice choice = tp_choice_of(ctx, "backward");
    double *ref[3];
    for (int i = 0; i < 3; i++) ref[i] = tu_malloc(n * sizeof(double));
    assert_int_equal(ref_attention_backward(&p, in[0], in[1], in[2], in[3], ref[0], ref[1], ref[2]), 0);
    static const char *const names[3] = {"dqt", "dkt", "dvt"};
    float *got = tu_malloc(n * sizeof *got);
    for (int i = 0; i < 3; i++) {
        tu_buffer_read(ctx, out[i], 0, got, n);
        tu_assert_close(names[i], got, ref[i], n, TU_TOL_F32);
        free(ref[i]);
        tu_buffer_release(out[i]);
    }
    for (int i = 0; i < 6; i++) tu_buffer_release(b[i]);
    for (int i = 0; i < 4; i++) free(in[i]);
    free(got), free(o), free(lse), free(of), free(lf);
    return choice;
}

static void tune_stores_a_verified_config_that_calls_use(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    snprintf(path, sizeof path, "%s/verified.json", tp_dir);
    iha_context *ctx = tp_open_with_kernels(path, NULL);
    iha_tune_result r[4];
    size_t n = 0;
    tp_tune_small(ctx, IHA_TUNE_BACKWARD, 20, r, &n);
    assert_int_equal(n, 1);
    assert_string_equal(r[0].kernel, "backward");
    assert_non_null(strstr(r[0].bucket, "mask=0 windowed=0 elem_bytes=4 d=8 P=2 T=64"));
    assert_true(r[0].stored);
    assert_true(r[0].error <= TU_TOL_F32);
    assert_true(r[0].tuned_s > 0 && r[0].default_s > 0);
    assert_int_equal(tp_count_verified(path, "backward"), 2); /* the bucket and the device default */
    iha_context_free(ctx);

    /* A new context on the profile runs the exact entry; with profiles off, the built-in. */
    const char *profiles[2] = {path, "off"};
    for (int i = 0; i < 2; i++) {
        ctx = tp_open_with_kernels(profiles[i], NULL);
        const iha_kernel_choice c = backward_checked(ctx);
        assert_int_equal(c.source, i == 0 ? IHA_CONFIG_PROFILE_EXACT : IHA_CONFIG_BUILTIN_TYPE);
        assert_string_equal(c.bucket, r[0].bucket);
        assert_string_equal(c.config, i == 0 ? r[0].tuned_config : r[0].default_config);
        iha_context_free(ctx);
    }
}

static void profile_entry_is_used_and_reported(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    snprintf(path, sizeof path, "%s/entry.json", tp_dir);
    cJSON *root = tp_profile_new();
    cJSON *e = cJSON_CreateObject(), *b = cJSON_CreateObject(), *c = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "kernel", "backward");
    cJSON_AddStringToObject(e, "role", "device_default");
    static const char *const keys[7] = {"mask", "windowed", "elem_bytes", "d", "P", "T", "span"};
    static const long bucket[7] = {0, 0, 4, 8, 2, 64, 64};
    for (int i = 0; i < 7; i++) cJSON_AddNumberToObject(b, keys[i], (double)bucket[i]);
    /* The row kernels on a GPU, four tiles per work-item on a CPU: valid on every device. */
    static const char *const params[5] = {"kv_keys", "kv_queries", "q_rows", "q_keys", "tiles"};
    static const long cfg[5] = {0, 32, 0, 32, 4};
    for (int i = 0; i < 5; i++) cJSON_AddNumberToObject(c, params[i], (double)cfg[i]);
    cJSON_AddItemToObject(e, "bucket", b);
    cJSON_AddItemToObject(e, "config", c);
    cJSON_AddItemToArray(cJSON_GetObjectItem(root, "entries"), e);
    tp_write_json(root, path);
    cJSON_Delete(root);

    iha_context *ctx = tp_open_with_kernels(path, NULL);
    const iha_kernel_choice choice = backward_checked(ctx);
    assert_int_equal(choice.source, IHA_CONFIG_PROFILE_DEVICE);
    assert_string_equal(choice.config, "kv_keys=0 kv_queries=32 q_rows=0 q_keys=32 tiles=4");
    /* The call reports the two kernels it runs: backward and gemm (CLBlast's parameters). */
    size_t count = 0;
    assert_int_equal(iha_context_last_choices(ctx, NULL, 0, &count), IHA_OK);
    assert_int_equal(count, 2);
    iha_context_free(ctx);
}

/* The backward made wrong with four tiles per work-item (CPUs) or 16-key dK/dV tiles (GPUs):
 * both are candidates next to the built-ins at d = 8. */
static const char *backward_fault(const char *name)
{
    if (strcmp(name, "attention_backward_tiles.cl") == 0)
        return "#if BW_TILES == 4\n#define fma(a, b, c) ((a) * (b) + (c) + 0.01f)\n#endif\n";
    if (strcmp(name, "attention_backward_local.cl") == 0)
        return "#if BWL_KEYS == 16\n#define fma(a, b, c) ((a) * (b) + (c) + 0.01f)\n#endif\n";
    return NULL;
}

static void wrong_candidate_is_never_stored(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[1024], path[1100];
    tu_temp_dir(dir, sizeof dir);
    tp_copy_kernels(dir, backward_fault);
    snprintf(path, sizeof path, "%s/profile.json", dir);
    iha_context *ctx = tp_open_with_kernels(path, dir);
    iha_tune_result r[4];
    size_t n = 0;
    tp_tune_small(ctx, IHA_TUNE_BACKWARD, 20, r, &n);
    assert_int_equal(n, 1);
    assert_true(r[0].rejected >= 1);
    /* A CPU's entries keep kv_keys at 0 and a GPU's tiles at the built-in: neither fault is stored. */
    assert_null(strstr(r[0].tuned_config, "tiles=4"));
    assert_null(strstr(r[0].tuned_config, "kv_keys=16 "));
    tp_assert_no_entry_with(path, "tiles", 4);
    tp_assert_no_entry_with(path, "kv_keys", 16);
    iha_context_free(ctx);
    tu_remove_tree(dir);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tune_stores_a_verified_config_that_calls_use),
        cmocka_unit_test(profile_entry_is_used_and_reported),
        cmocka_unit_test(wrong_candidate_is_never_stored),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tp_group_setup_small, tp_group_teardown);
}
