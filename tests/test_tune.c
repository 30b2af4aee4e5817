/*
 * test_tune.c - tuning (src/tune): a tune stores only verified configurations and later calls
 * use them (exact bucket) with results inside the float32 contract of doc/spec.md, as the
 * built-in defaults do; a candidate that is fast but wrong (attention's, the GEMM kernel's) is
 * rejected, never stored; tuning on first use happens only when asked, and never for a refused
 * call; bad tune options are refused; the GEMM entry names the backend (the library's kernel or
 * CLBlast). Candidate counts and budgets are tiny: every new configuration costs PoCL a
 * compile. The profile file itself is test_profile.c's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/attention.h"
#include "runtime/context.h"
#include "tune/state.h"
#include "test_layer.h"
#include "test_util.h"
#include "test_profiles.h"

/* ---- Tests ---- */

static void tune_stores_verified_configs_that_calls_use(void **state)
{
    (void)state;
    char path[1100];
    iha_context *ctx = tp_open_fresh(path, sizeof path, "verified.json", 0);
    /* One kernel per call: a task alone always gets its first candidates, however loaded the
     * machine is (in one call, a slow first task may leave the second no budget). 15 s: on a
     * loaded machine with a cold PoCL cache, the built-in's build and timing alone can take
     * most of a smaller budget and leave no time for a candidate. */
    iha_tune_result r[4];
    size_t n = 0;
    tp_tune_small(ctx, IHA_TUNE_ATTENTION, 15, r, &n);
    assert_int_equal(n, 1);
    tp_tune_small(ctx, IHA_TUNE_ROWS, 15, r + 1, &n);
    assert_int_equal(n, 1);
    n = 2;
    for (size_t i = 0; i < n; i++) {
        assert_true(r[i].stored);
        assert_true(r[i].tuned_config[0] != '\0');
        assert_true(r[i].error <= TU_TOL_F32);
        assert_true(r[i].tuned_s > 0 && r[i].default_s > 0);
    }
    /* Every stored entry records the error of its verification, inside the contract. */
    assert_int_equal(tp_count_verified(path, NULL), 4); /* a bucket entry and a device default per kernel */
    iha_context_free(ctx);

    /* A new context loads it; the layer uses the exact entries and stays inside the contract,
     * as the built-in defaults (profile off) do. */
    const iha_attention_options o = tp_causal(0);
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &tp_small_shape, 17, &o);
    const char *profiles[2] = {path, "off"};
    for (int i = 0; i < 2; i++) {
        ctx = tp_open_with_profile(profiles[i], 0);
        iha_profile_info info;
        assert_int_equal(iha_context_profile(ctx, &info), IHA_OK);
        assert_int_equal(info.state, i == 0 ? IHA_PROFILE_LOADED : IHA_PROFILE_OFF);
        tu_layer_check_forward(ctx, &l, &o, TU_API_DEVICE, zref, TU_TOL_F32);
        const int want = i == 0 ? IHA_CONFIG_PROFILE_EXACT : IHA_CONFIG_BUILTIN_TYPE;
        assert_int_equal(tp_choice_of(ctx, "attention").source, want);
        assert_int_equal(tp_choice_of(ctx, "rows").source, want);
        if (i == 0)
            assert_string_equal(tp_choice_of(ctx, "attention").config,
                                strcmp(r[0].kernel, "attention") == 0 ? r[0].tuned_config : r[1].tuned_config);
        iha_context_free(ctx);
    }
    free(zref);
    tu_layer_free(&l);
}

static int builtin_variant(void)
{
    iha_attention_config cfg;
    iha__attention_config_default(tu_ctx, tp_small_shape.head_dim, &cfg);
    return cfg.variant;
}

/* The prefix of a kernel file that plants a fault: every fma adds 1, which touches every output
 * whatever the kernel's internals (the kernel calls exp2 only when a row's reference maximum
 * moves, so a fault planted there could go unseen). The fault is keyed to a value the tuner's first
 * sweep around the device's built-in tries: ATT_ROWS 2 in attention.cl where the built-in is
 * the register-tile kernel; else ATT_KB 8, next to the local-memory kernels' 16, in every
 * attention file (every variant reads ATT_KB, so no correct candidate holds it). NULL for the
 * other files. */
static const char *attention_fault(const char *name)
{
    const size_t len = strlen(name);
    if (builtin_variant() != 0 && strncmp(name, "attention", 9) == 0 && strcmp(name + len - 3, ".cl") == 0)
        return "#if defined(ATT_KB) && ATT_KB == 8\n#define fma(a, b, c) ((a) * (b) + (c) + 1.0f)\n#endif\n";
    if (builtin_variant() == 0 && strcmp(name, "attention.cl") == 0)
        return "#if defined(ATT_ROWS) && ATT_ROWS == 2\n#define fma(a, b, c) ((a) * (b) + (c) + 1.0f)\n#endif\n";
    return NULL;
}

/* Every file of cl/ into dir, the attention files with the fault. */
static void broken_kernels(const char *dir) { tp_copy_kernels(dir, attention_fault); }

/* Tunes `kernels` on a context whose kernel directory `plant` filled, with the candidate
 * param=value planted wrong: the tuner's check must reject it, and neither the result nor the
 * profile may hold it. */
static void check_planted_candidate_rejected(void (*plant)(const char *dir), unsigned kernels, double budget,
                                             const char *param, int value)
{
    char dir[1024], path[1100];
    tu_temp_dir(dir, sizeof dir);
    plant(dir);
    snprintf(path, sizeof path, "%s/profile.json", dir);
    iha_context *ctx = NULL;
    const tu_places at = {.profile = path, .kernel_dir = dir, .cache_dir = "off"};
    assert_int_equal(tu_context_create_at(&ctx, at, NULL, 0), IHA_OK);
    iha_tune_result r[4];
    size_t n = 0;
    tp_tune_small(ctx, kernels, budget, r, &n);
    assert_int_equal(n, 1);
    assert_true(r[0].rejected >= 1);
    assert_true(r[0].stored);
    char planted[64];
    snprintf(planted, sizeof planted, "%s=%d ", param, value);
    assert_null(strstr(r[0].tuned_config, planted));
    tp_assert_no_entry_with(path, param, value);
    iha_context_free(ctx);
    tu_remove_tree(dir);
}

static void wrong_candidate_is_never_stored(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    /* The first sweep tries ATT_ROWS 1, 2 and 8 around the register-tile built-in, ATT_KB 4 and
     * 8 around the local-memory ones: the planted value fails its check. */
    if (builtin_variant() != 0)
        check_planted_candidate_rejected(broken_kernels, IHA_TUNE_ATTENTION, 20, "ATT_KB", 8);
    else
        check_planted_candidate_rejected(broken_kernels, IHA_TUNE_ATTENTION, 20, "ATT_ROWS", 2);
}

/* A kernel directory whose cl/gemm.cl drops the last k of every product when GEMM_MR is 4; the
 * other files as in cl/ (a program includes shared headers). */
static void broken_gemm_kernel(const char *dir)
{
    tp_copy_kernels(dir, NULL);
    char src[1200], dst[1200];
    snprintf(src, sizeof src, "%s/cl/gemm.cl", IHA_TEST_SOURCE_DIR);
    snprintf(dst, sizeof dst, "%s/gemm.cl", dir);
    char *text = tp_slurp(src);
    assert_non_null(text);
    const char *at = strstr(text, "const int k_main");
    assert_non_null(at);
    FILE *f = fopen(dst, "wb");
    assert_non_null(f);
    fwrite(text, 1, (size_t)(at - text), f);
    fputs("k -= GEMM_MR == 4;\n", f);
    fputs(at, f);
    fclose(f);
    free(text);
}

/* The GEMM's candidates are verified too: on a CPU, whose built-in is the library's kernel, the
 * descent tries GEMM_MR=4, which is planted wrong, and must reject it. The full tier's: the
 * descent builds a program per tile it tries, and the quick tier's wrong_candidate_is_never_stored
 * holds the same verification to a planted fault (test_gemm's quick tier fails on this one). */
static void full_wrong_gemm_tile_is_never_stored(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    cl_device_type type = 0;
    assert_int_equal(clGetDeviceInfo(iha_context_cl_device(tu_ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL), CL_SUCCESS);
    if (type & CL_DEVICE_TYPE_GPU) skip(); /* the built-in is CLBlast's database: no tile to descend from */
    /* The seeds are the library kernel's built-in tile and one CLBlast configuration, which PoCL
     * is slow to compile with a cold cache; the descent over the library kernel's tiles
     * takes a few seconds and ends by itself. */
    check_planted_candidate_rejected(broken_gemm_kernel, IHA_TUNE_GEMM, 150, "GEMM_MR", 4);
}

static void tuning_on_first_use_only_when_asked(void **state)
{
    (void)state;
    char path[1100];
    tp_fresh_path(path, sizeof path, "first-use.json");
    for (int asked = 0; asked < 2; asked++) {
        remove(path);
        iha_context *ctx = tp_open_with_profile(path, asked);
        tp_check_small(ctx);
        assert_int_equal(tp_file_exists(path), asked);
        const int want = asked ? IHA_CONFIG_PROFILE_EXACT : IHA_CONFIG_BUILTIN_TYPE;
        assert_int_equal(tp_choice_of(ctx, "attention").source, want);
        assert_int_equal(tp_choice_of(ctx, "rows").source, want);
        iha_context_free(ctx);
    }
}

/* A call that is refused (here for too small an output) neither tunes nor writes the profile,
 * even when the context tunes on first use; the same call with a big enough output then does. */
static void refused_call_does_not_tune(void **state)
{
    (void)state;
    char path[1100];
    iha_context *ctx = tp_open_fresh(path, sizeof path, "refused.json", 1);
    const iha_attention_options o = tp_causal(0);
    const size_t n = tu_count_virtual(&tp_small_shape);
    cl_mem in = tu_buffer_guarded(ctx, NULL, n, 0, 0, 0), small = tu_buffer_guarded(ctx, NULL, n - 1, 0, 0, 0);
    iha_status st = iha_attention(ctx, &tp_small_shape, &o, (iha_buffer){in, 0}, (iha_buffer){in, 0},
                                  (iha_buffer){in, 0}, (iha_buffer){small, 0}, (iha_buffer){NULL, 0});
    tu_assert_status(ctx, st, IHA_ERROR_BUFFER_TOO_SMALL);
    assert_false(tp_file_exists(path)); /* a first-use tune stores its result */
    tu_buffer_release(in), tu_buffer_release(small);
    tp_check_attention(ctx, &tp_small_shape, &o);
    assert_true(tp_file_exists(path));
    assert_int_equal(tp_choice_of(ctx, "attention").source, IHA_CONFIG_PROFILE_EXACT);
    iha_context_free(ctx);
}

/* Options iha_tune refuses before it measures anything: an exhaustive search that includes the
 * GEMM (explicitly or through kernels = 0), reps beyond 64, a NaN or negative budget. */
static void bad_tune_options_refused(void **state)
{
    (void)state;
    char path[1100];
    iha_context *ctx = tp_open_fresh(path, sizeof path, "refused-options.json", 0);
    const iha_attention_options o = tp_causal(0);
    iha_tune_options bad[5];
    for (int i = 0; i < 5; i++) iha_tune_options_init(&bad[i]);
    bad[0].exhaustive = 1;
    bad[1].exhaustive = 1, bad[1].kernels = IHA_TUNE_ATTENTION | IHA_TUNE_GEMM;
    bad[2].reps = 65;
    bad[3].budget_s = NAN;
    bad[4].budget_s = -1.0;
    for (int i = 0; i < 5; i++) {
        tu_assert_status(ctx, iha_tune(ctx, &tp_small_shape, &o, 1, &bad[i], NULL, 0, NULL), IHA_ERROR_INVALID_ARGUMENT);
        assert_true(strlen(iha_context_message(ctx)) > 0);
    }
    assert_false(tp_file_exists(path));
    iha_context_free(ctx);
}

/* A profile with a GEMM entry: `config` ("NAME=value ...") with the library kernel's tile
 * replaced by rows x vec, unrolling 2 and groups of 4. */
static void write_gemm_entry(const char *path, const char *config, long rows, long vec)
{
    cJSON *root = tp_profile_new(), *e = cJSON_CreateObject(), *b = cJSON_CreateObject(), *c = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "kernel", "gemm");
    cJSON_AddStringToObject(e, "role", "device_default");
    cJSON_AddNumberToObject(b, "elem_bytes", 4);
    cJSON_AddNumberToObject(b, "m", 24);
    cJSON_AddNumberToObject(b, "n", 16);
    cJSON_AddNumberToObject(b, "k", 16);
    char name[64];
    long value;
    int used;
    for (const char *p = config; sscanf(p, "%63[^=]=%ld%n", name, &value, &used) == 2; p += used + (p[used] == ' ')) {
        if (strcmp(name, "GEMM_MR") == 0) value = rows;
        if (strcmp(name, "GEMM_VW") == 0) value = vec;
        if (strcmp(name, "GEMM_KU") == 0) value = 2;
        if (strcmp(name, "GEMM_GROUP") == 0) value = 4;
        cJSON_AddNumberToObject(c, name, (double)value);
    }
    cJSON_AddItemToObject(e, "bucket", b);
    cJSON_AddItemToObject(e, "config", c);
    cJSON_AddItemToArray(cJSON_GetObjectItem(root, "entries"), e);
    tp_write_json(root, path);
    cJSON_Delete(root);
}

/* The GEMM entry names the backend: a CPU without one uses the library's kernel; an entry with
 * another tile of it is used by layer calls and by iha_measure_gemm_kernel; a tile outside the
 * space makes the profile ignored. */
static void gemm_entry_names_the_backend(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_attention_options o = tp_causal(0);
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &tp_small_shape, 17, &o);
    iha_context *ctx = tp_open_with_profile("off", 0);
    tu_layer_check_forward(ctx, &l, &o, TU_API_DEVICE, zref, TU_TOL_F32);
    iha_kernel_choice builtin = tp_choice_of(ctx, "gemm");
    iha_context_free(ctx);
    assert_int_equal(builtin.source, IHA_CONFIG_BUILTIN_TYPE);
    if (strstr(builtin.config, "backend=1") == NULL) {
        /* A GPU: CLBlast's database, nothing to rewrite. */
        assert_string_equal(builtin.config, "CLBlast database");
        free(zref), tu_layer_free(&l);
        skip();
    }
    assert_non_null(strstr(builtin.config, "GEMM_MR=6 GEMM_VW=16 GEMM_KU=4 GEMM_GROUP=16"));

    char path[1100];
    tp_path_in(path, sizeof path, "gemm.json");
    write_gemm_entry(path, builtin.config, 3, 8);
    ctx = tp_open_with_profile(path, 0);
    tu_layer_check_forward(ctx, &l, &o, TU_API_DEVICE_OFFSETS, zref, TU_TOL_F32);
    const iha_kernel_choice tuned = tp_choice_of(ctx, "gemm");
    assert_int_equal(tuned.source, IHA_CONFIG_PROFILE_DEVICE);
    assert_non_null(strstr(tuned.config, "backend=1 GEMM_MR=3 GEMM_VW=8 GEMM_KU=2 GEMM_GROUP=4"));
    double seconds = 0.0;
    tu_assert_status(ctx, iha_measure_gemm_kernel(ctx, 5, 7, 3, 1, &seconds), IHA_OK);
    assert_true(seconds > 0.0);
    iha_context_free(ctx);

    write_gemm_entry(path, builtin.config, 3, 5);
    ctx = tp_open_with_profile(path, 0);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_ERROR_PROFILE);
    assert_non_null(strstr(info.message, "gemm configuration is outside its space"));
    tu_layer_check_forward(ctx, &l, &o, TU_API_DEVICE, zref, TU_TOL_F32);
    assert_int_equal(tp_choice_of(ctx, "gemm").source, IHA_CONFIG_BUILTIN_TYPE);
    iha_context_free(ctx);
    free(zref);
    tu_layer_free(&l);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tune_stores_verified_configs_that_calls_use),
        cmocka_unit_test(wrong_candidate_is_never_stored),
        cmocka_unit_test(full_wrong_gemm_tile_is_never_stored),
        cmocka_unit_test(tuning_on_first_use_only_when_asked),
        cmocka_unit_test(refused_call_does_not_tune),
        cmocka_unit_test(bad_tune_options_refused),
        cmocka_unit_test(gemm_entry_names_the_backend),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tp_group_setup_small, tp_group_teardown);
}
