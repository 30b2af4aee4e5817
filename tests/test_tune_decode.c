/*
 * test_tune_decode.c - tuning of the decode kernels (src/tune/space_decode.c): iha_tune with
 * IHA_TUNE_DECODE stores verified configurations for a float and a half cache, and a decoding
 * step then uses the exact entry with outputs inside doc/spec.md's contract; a hand-written profile's
 * decode entries are used in the fallback order (exact, nearest of the same kind, device
 * default) and reported by iha_context_last_choices; a candidate that is fast but wrong is
 * rejected and never stored. Shapes are tiny: every new configuration costs PoCL a compile.
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

#include "test_layer.h"
#include "test_util.h"
#include "test_profiles.h"
#include "test_tune_steps.h"



/* The layer every test here decodes: 24 tokens of 2 heads, d = 8, P = 4. The last token's step
 * has 23 tokens (92 keys) cached: bucket cached=128, as iha_tune's for N = 24 (96 keys). */
static const iha_shape shape = {1, 24, 16, 2, 8, 4};

/* ---- Files and profiles ---- */

/* A decode entry for shape's heads (BH = 2, d = 8, P = 4), causal and global. */
static void add_decode(cJSON *entries, const char *role, long elem_bytes, long k, long cached, const long cfg[5])
{
    static const char *const params[7] = {"ATT_ROWS", "ATT_VD", "group", "min_split_keys", "per_cu", "variant", "keys"};
    static const char *const keys[8] = {"mask", "windowed", "elem_bytes", "d", "P", "k", "cached", "BH"};
    const long values[8] = {0, 0, elem_bytes, 8, 4, k, cached, 2};
    cJSON *e = cJSON_CreateObject(), *b = cJSON_CreateObject(), *c = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "kernel", "decode");
    cJSON_AddStringToObject(e, "role", role);
    for (int i = 0; i < 8; i++)
        cJSON_AddNumberToObject(b, keys[i], (double)values[i]);
    for (int i = 0; i < 7; i++) /* register tiles (variant 0, keys 1) */
        cJSON_AddNumberToObject(c, params[i], (double)(i < 5 ? cfg[i] : i == 5 ? 0 : 1));
    cJSON_AddItemToObject(e, "bucket", b);
    cJSON_AddItemToObject(e, "config", c);
    cJSON_AddItemToArray(entries, e);
}

/* ---- Decoding ---- */

/* How every test here decodes: causal, through a pseudo-token cache. */
static ts_decoding decoding(void)
{
    return (ts_decoding){&shape, tu_options(IHA_MASK_CAUSAL, 0, 0), 0, "decode", IHA_TUNE_DECODE};
}

/* ---- Tests ---- */

static void tune_stores_verified_configs_that_steps_use(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    snprintf(path, sizeof path, "%s/verified.json", tp_dir);
    iha_context *ctx = tp_open_with_kernels(path, NULL);
    iha_tune_result r[4];
    size_t n = 0;
    /* Both tasks must get their built-in and a candidate timed, also on a loaded machine. */
    const ts_decoding how = decoding();
    ts_tune(ctx, &how, 30, r, 4, &n);
    assert_int_equal(n, 2); /* float and half cache */
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(r[i].kernel, "decode");
        assert_non_null(strstr(r[i].bucket, i == 0 ? "elem_bytes=4" : "elem_bytes=2"));
        assert_non_null(strstr(r[i].bucket, "k=1 cached=128 BH=2"));
        assert_true(r[i].stored);
        assert_true(r[i].error <= TU_TOL_F32);
        assert_true(r[i].tuned_s > 0 && r[i].default_s > 0);
    }
    /* Every stored entry records the error of its verification, inside the contract. */
    assert_int_equal(tp_count_verified(path, "decode"), 3); /* two buckets and the device default */
    iha_context_free(ctx);

    /* A new context loads it: the last token's step uses the exact entry, the prompt chunk (k = 23
     * tokens, bucket k=32) the nearest; with profiles off, the built-in. Outputs stay inside the
     * contract either way. */
    ts_check_profile_serves_steps(&how, path, r, 23);
}

static void profile_entries_are_used_from_specific_to_general(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    snprintf(path, sizeof path, "%s/fallback.json", tp_dir);
    static const long exact[5] = {2, 4, 4, 64, 32}, device[5] = {1, 8, 0, 128, 2};
    cJSON *root = tp_profile_new();
    cJSON *entries = cJSON_GetObjectItem(root, "entries");
    add_decode(entries, "bucket", 4, 1, 128, exact);
    add_decode(entries, "device_default", 4, 1, 128, device);
    tp_write_json(root, path);
    cJSON_Delete(root);

    const ts_decoding how = decoding();
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &shape, 29, &how.options);
    iha_context *ctx = tp_open_with_kernels(path, NULL);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_OK);
    assert_int_equal(info.state, IHA_PROFILE_LOADED);
    /* 1. The last token's step is in the entry's bucket; 2. the prompt chunk is nearest to it. */
    ts_decoded d = ts_decode_layer(ctx, &how, &l, zref, IHA_STORAGE_F32);
    assert_int_equal(d.step.source, IHA_CONFIG_PROFILE_EXACT);
    assert_string_equal(d.step.config, "ATT_ROWS=2 ATT_VD=4 group=4 min_split_keys=64 per_cu=32 variant=0 keys=1");
    assert_int_equal(d.prefill.source, IHA_CONFIG_PROFILE_NEAREST);
    assert_string_equal(d.prefill.config, "ATT_ROWS=2 ATT_VD=4 group=4 min_split_keys=64 per_cu=32 variant=0 keys=1");
    assert_non_null(strstr(d.prefill.source_bucket, "k=1 cached=128"));
    assert_non_null(strstr(d.prefill.bucket, "k=32 cached=1 "));
    /* 3. A half cache is another kind: the device default. */
    d = ts_decode_layer(ctx, &how, &l, zref, IHA_STORAGE_F16);
    assert_int_equal(d.step.source, IHA_CONFIG_PROFILE_DEVICE);
    assert_string_equal(d.step.config, "ATT_ROWS=1 ATT_VD=8 group=0 min_split_keys=128 per_cu=2 variant=0 keys=1");
    /* The step reports the layer's other kernels too: attention, rows, decode and gemm. */
    size_t count = 0;
    assert_int_equal(iha_context_last_choices(ctx, NULL, 0, &count), IHA_OK);
    assert_int_equal(count, 4);
    iha_context_free(ctx);
    free(zref);
    tu_layer_free(&l);
}

/* The decode kernels made wrong when ATT_ROWS is 2 (only the decode kernels are built with
 * KV_HALF defined; variant 1 takes ATT_ROWS as DEC_ROWS). */
static const char *decode_fault(const char *name)
{
    if (strcmp(name, "attention_decode_groups.cl") == 0)
        return "#if DEC_ROWS == 2\n#define fma(a, b, c) ((a) * (b) + (c) + 0.01f)\n#endif\n";
    return strcmp(name, "attention.cl") == 0
               ? "#if defined(KV_HALF) && ATT_ROWS == 2\n#define fma(a, b, c) ((a) * (b) + (c) + 0.01f)\n#endif\n"
               : NULL;
}

static void wrong_candidate_is_never_stored(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[1024], path[1100];
    tu_temp_dir(dir, sizeof dir);
    tp_copy_kernels(dir, decode_fault);
    snprintf(path, sizeof path, "%s/profile.json", dir);
    iha_context *ctx = tp_open_with_kernels(path, dir);
    iha_tune_result r[4];
    size_t n = 0;
    const ts_decoding how = decoding();
    ts_tune(ctx, &how, 30, r, 4, &n);
    assert_int_equal(n, 2);
    /* The first sweep tries ATT_ROWS 1 and 2 around the built-in 4: 2 fails its check. */
    assert_true(r[0].rejected >= 1);
    assert_true(r[0].stored);
    assert_null(strstr(r[0].tuned_config, "ATT_ROWS=2 "));
    tp_assert_no_entry_with(path, "ATT_ROWS", 2);
    iha_context_free(ctx);
    tu_remove_tree(dir);
}

/* ---- Setup: the key comes from a profile the library writes itself ---- */

static int group_setup(void **state)
{
    (void)state;
    return tp_group_setup(&shape);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tune_stores_verified_configs_that_steps_use),
        cmocka_unit_test(profile_entries_are_used_from_specific_to_general),
        cmocka_unit_test(wrong_candidate_is_never_stored),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], group_setup, tp_group_teardown);
}
