/*
 * test_tune.c - tuning and the profile: a tune stores only verified configurations and later
 * calls use them (exact bucket) with results inside SPEC's contract, as the built-in defaults
 * do; the fallback order exact -> nearest of the same kind -> device default -> built-in; a
 * profile for another driver, library or kernel version, and a corrupt, truncated or invalid
 * one, is reported (IHA_ERROR_PROFILE), ignored and harmless; two writers at once leave a valid
 * file and a later writer merges; a candidate that is fast but wrong (attention's, the GEMM kernel's)
 * is rejected, never stored;
 * tuning on first use happens only when asked; the GEMM entry names the backend (the library's
 * kernel or CLBlast); clear removes the file. A writer replaces only what it tuned (another's
 * newer entries, a clear in between and entries of unknown kernels stay), a newer format is
 * never overwritten, the key holds the device's strings whole, and cache directories over a
 * thousand bytes work while one too long for PATH_MAX is refused before tuning. Candidate counts and
 * budgets are tiny: every new configuration costs PoCL a compile.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "runtime/context.h"
#include "tune/state.h"
#include "test_layer.h"
#include "test_util.h"
#include "test_profiles.h"


/* The shape every tuning here uses: T = 48 virtual tokens, d = 8. */
static const iha_shape small_shape = {1, 24, 16, 2, 8, 2};

/* ---- Files ---- */

static void path_in(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/%s", tp_dir, name);
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- Profiles written by hand, with this device's key ---- */

/* An attention entry of the register-tile variant (variant 0, LOC_KEYS at its canonical 32);
 * role "bucket" or "device_default". */
static void add_attention(cJSON *root, const char *role, long mask, long windowed, long T, long span, const long cfg[5])
{
    static const char *const params[5] = {"ATT_ROWS", "ATT_TILES", "ATT_KB", "ATT_VD", "group"};
    cJSON *e = cJSON_CreateObject(), *b = cJSON_CreateObject(), *c = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "kernel", "attention");
    cJSON_AddStringToObject(e, "role", role);
    cJSON_AddNumberToObject(b, "mask", (double)mask);
    cJSON_AddNumberToObject(b, "windowed", (double)windowed);
    cJSON_AddNumberToObject(b, "elem_bytes", 4);
    cJSON_AddNumberToObject(b, "d", 8);
    cJSON_AddNumberToObject(b, "P", 2);
    cJSON_AddNumberToObject(b, "T", (double)T);
    cJSON_AddNumberToObject(b, "span", (double)span);
    for (int i = 0; i < 5; i++)
        cJSON_AddNumberToObject(c, params[i], (double)cfg[i]);
    cJSON_AddNumberToObject(c, "variant", 0);
    cJSON_AddNumberToObject(c, "LOC_KEYS", 32);
    cJSON_AddNumberToObject(c, "ATT_PREFETCH", 0);
    cJSON_AddItemToObject(e, "bucket", b);
    cJSON_AddItemToObject(e, "config", c);
    cJSON_AddItemToArray(cJSON_GetObjectItem(root, "entries"), e);
}

/* ---- Contexts and calls ---- */

static iha_context *open_with_profile(const char *profile, int first_use)
{
    iha_context_options o;
    iha_context_options_init(&o);
    o.profile = profile;
    o.tune_on_first_use = first_use;
    o.tune_budget_s = 6;
    iha_context *ctx = NULL;
    char message[1024] = "";
    iha_status st = iha_context_create(&ctx, &o, message, sizeof message);
    if (st != IHA_OK)
        fail_msg("iha_context_create: %s: %s", iha_status_name(st), message);
    return ctx;
}

/* iha_attention on random inputs of `shape` and `options`, checked against the float64
 * reference within SPEC's float32 contract. */
static void check_attention(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options)
{
    const size_t n = tu_count_virtual(shape);
    tu_rng rng;
    tu_rng_seed(&rng, 5);
    float *q = tu_random_array(&rng, n, 1.0f), *k = tu_random_array(&rng, n, 1.0f), *v = tu_random_array(&rng, n, 1.0f);
    float *o = tu_malloc(n * sizeof *o);
    double *ref = tu_malloc(n * sizeof *ref);
    cl_mem bq = tu_buffer_guarded(ctx, q, n, 0, 0, 0), bk = tu_buffer_guarded(ctx, k, n, 0, 0, 0);
    cl_mem bv = tu_buffer_guarded(ctx, v, n, 0, 0, 0), bo = tu_buffer_guarded(ctx, NULL, n, 0, 0, 0);
    iha_status st = iha_attention(ctx, shape, options, (iha_buffer){bq, 0}, (iha_buffer){bk, 0}, (iha_buffer){bv, 0},
                                  (iha_buffer){bo, 0}, (iha_buffer){NULL, 0});
    tu_assert_status(ctx, st, IHA_OK);
    tu_buffer_read(ctx, bo, 0, o, n);
    ref_problem p = {.B = shape->batch, .N = shape->tokens, .H = shape->heads, .d = shape->head_dim,
                     .P = shape->pseudo, .mask = options->mask, .window = options->window};
    assert_int_equal(ref_attention(&p, q, k, v, ref, NULL), 0);
    tu_assert_close("attention output", o, ref, n, TU_TOL_F32);
    tu_buffer_release(bq), tu_buffer_release(bk), tu_buffer_release(bv), tu_buffer_release(bo);
    free(q), free(k), free(v), free(o), free(ref);
}

static iha_attention_options causal(int64_t window)
{
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.window = window;
    return o;
}

/* A tiny budgeted tune of `kernels` for small_shape (causal, global) into `profile`. */
static void tune_small(iha_context *ctx, unsigned kernels, double budget, iha_tune_result *results, size_t *count)
{
    iha_tune_options to;
    iha_tune_options_init(&to);
    to.kernels = kernels;
    to.budget_s = budget;
    to.reps = 3;
    const iha_attention_options o = causal(0);
    iha_status st = iha_tune(ctx, &small_shape, &o, 1, &to, results, 4, count);
    tu_assert_status(ctx, st, IHA_OK);
}

/* ---- Tests ---- */

static void tune_stores_verified_configs_that_calls_use(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "verified.json");
    iha_context *ctx = open_with_profile(path, 0);
    /* One kernel per call: a task alone always gets its first candidates, however loaded the
     * machine is (in one call, a slow first task may leave the second no budget). 15 s: with 6 s
     * this stored nothing once, at load 4-5 on 2 cores right after a kernel source change (cold
     * PoCL cache: the built-in's build and timing left no time for a candidate). */
    iha_tune_result r[4];
    size_t n = 0;
    tune_small(ctx, IHA_TUNE_ATTENTION, 15, r, &n);
    assert_int_equal(n, 1);
    tune_small(ctx, IHA_TUNE_ROWS, 15, r + 1, &n);
    assert_int_equal(n, 1);
    n = 2;
    for (size_t i = 0; i < n; i++) {
        assert_true(r[i].stored);
        assert_true(r[i].tuned_config[0] != '\0');
        assert_true(r[i].error <= TU_TOL_F32);
        assert_true(r[i].tuned_s > 0 && r[i].default_s > 0);
    }
    /* Every stored entry records the error of its verification, inside the contract. */
    cJSON *root = tp_parse_file(path);
    const cJSON *e;
    int entries = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "entries"))
    {
        assert_true(cJSON_GetObjectItem(e, "error")->valuedouble <= TU_TOL_F32);
        entries++;
    }
    assert_int_equal(entries, 4); /* a bucket entry and a device default per kernel */
    cJSON_Delete(root);
    iha_context_free(ctx);

    /* A new context loads it; the layer uses the exact entries and stays inside the contract,
     * as the built-in defaults (profile off) do. */
    const iha_attention_options o = causal(0);
    tu_layer l;
    tu_layer_init(&l, &small_shape, 17);
    double *zref = tu_layer_reference(&l, &o);
    const char *profiles[2] = {path, "off"};
    for (int i = 0; i < 2; i++) {
        ctx = open_with_profile(profiles[i], 0);
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

static void fallback_goes_from_specific_to_general(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "fallback.json");
    static const long exact[5] = {1, 2, 8, 4, 16}, far[5] = {2, 1, 8, 8, 1}, device[5] = {1, 1, 16, 8, 1};
    cJSON *root = tp_profile_new();
    add_attention(root, "bucket", 0, 0, 64, 64, exact);
    add_attention(root, "bucket", 0, 0, 4096, 4096, far);
    add_attention(root, "device_default", 0, 0, 64, 64, device);
    tp_write_json(root, path);
    cJSON_Delete(root);

    iha_context *ctx = open_with_profile(path, 0);
    const iha_attention_options global = causal(0);
    iha_attention_options none = causal(0);
    none.mask = IHA_MASK_NONE;
    /* 1. T = 48 is in the bucket T = 64 exactly. */
    check_attention(ctx, &small_shape, &global);
    iha_kernel_choice c = tp_choice_of(ctx, "attention");
    assert_int_equal(c.source, IHA_CONFIG_PROFILE_EXACT);
    assert_string_equal(c.config, "ATT_ROWS=1 ATT_TILES=2 ATT_KB=8 ATT_VD=4 group=16 variant=0 LOC_KEYS=32 ATT_PREFETCH=0");
    /* 2. T = 2000 (bucket 2048) is nearest to the T = 4096 entry of the same kind. */
    const iha_shape longer = {1, 1000, 16, 1, 8, 2};
    check_attention(ctx, &longer, &global);
    c = tp_choice_of(ctx, "attention");
    assert_int_equal(c.source, IHA_CONFIG_PROFILE_NEAREST);
    assert_string_equal(c.config, "ATT_ROWS=2 ATT_TILES=1 ATT_KB=8 ATT_VD=8 group=1 variant=0 LOC_KEYS=32 ATT_PREFETCH=0");
    assert_non_null(strstr(c.source_bucket, "T=4096"));
    /* 3. Another mask is another kind: the device default. */
    check_attention(ctx, &small_shape, &none);
    c = tp_choice_of(ctx, "attention");
    assert_int_equal(c.source, IHA_CONFIG_PROFILE_DEVICE);
    assert_string_equal(c.config, "ATT_ROWS=1 ATT_TILES=1 ATT_KB=16 ATT_VD=8 group=1 variant=0 LOC_KEYS=32 ATT_PREFETCH=0");
    /* The mixing kernels have no entry at all: 4. the built-in default of the device type. */
    assert_int_equal(tp_choice_of(ctx, "rows").source, IHA_CONFIG_BUILTIN_TYPE);
    iha_context_free(ctx);
}

/* Writes a copy of this device's valid profile with key field `field` replaced by `value`. */
static void write_with_key(const char *path, const char *field, cJSON *value)
{
    static const long cfg[5] = {1, 2, 8, 4, 16};
    cJSON *root = tp_profile_new();
    add_attention(root, "bucket", 0, 0, 64, 64, cfg);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "key"), field, value);
    tp_write_json(root, path);
    cJSON_Delete(root);
}

/* The profile at path must be reported, ignored, and harmless to a call. */
static void expect_ignored(const char *path, const char *why)
{
    iha_context *ctx = open_with_profile(path, 0);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_ERROR_PROFILE);
    assert_int_equal(info.state, IHA_PROFILE_IGNORED);
    assert_int_equal(info.entries, 0);
    if (why != NULL && strstr(info.message, why) == NULL)
        fail_msg("message \"%s\" does not mention %s", info.message, why);
    assert_non_null(strstr(iha_context_message(ctx), "ignored"));
    const iha_attention_options o = causal(0);
    check_attention(ctx, &small_shape, &o);
    assert_int_equal(tp_choice_of(ctx, "attention").source, IHA_CONFIG_BUILTIN_TYPE);
    iha_context_free(ctx);
}

static void key_mismatch_is_reported_and_ignored(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "mismatch.json");
    write_with_key(path, "driver_version", cJSON_CreateString("0.0-older-driver"));
    expect_ignored(path, "driver_version");
    write_with_key(path, "library_version", cJSON_CreateString("0.0.1"));
    expect_ignored(path, "library_version");
    write_with_key(path, "kernel_sources", cJSON_CreateString("0123456789abcdef"));
    expect_ignored(path, "kernel_sources");
    write_with_key(path, "compute_units", cJSON_CreateNumber(999));
    expect_ignored(path, "compute_units");
    write_with_key(path, "local_mem_type", cJSON_CreateString("none"));
    expect_ignored(path, "local_mem_type");
}

static void corrupt_profile_is_reported_and_ignored(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "corrupt.json");
    static const long good[5] = {1, 2, 8, 4, 16}, bad_kb[5] = {1, 2, 5, 4, 16}, big[5] = {1, 2, 8, 4, 1L << 40};
    cJSON *root = tp_profile_new();
    add_attention(root, "bucket", 0, 0, 64, 64, good);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    const size_t len = strlen(text);

    tp_write_text(path, text, len / 2); /* truncated */
    expect_ignored(path, "JSON");
    tp_write_text(path, "", 0);
    expect_ignored(path, NULL);
    tp_write_text(path, "\x01\x7f garbage \xff{{[", 15);
    expect_ignored(path, "JSON");
    tp_write_text(path, "{}", 2);
    expect_ignored(path, "format");
    free(text);

    const long *configs[2] = {bad_kb, big};
    for (int i = 0; i < 2; i++) { /* a configuration outside the space */
        root = tp_profile_new();
        add_attention(root, "bucket", 0, 0, 64, 64, configs[i]);
        tp_write_json(root, path);
        cJSON_Delete(root);
        expect_ignored(path, "outside its space");
    }
    root = tp_profile_new(); /* a parameter missing, one of the wrong type */
    add_attention(root, "bucket", 0, 0, 64, 64, good);
    cJSON *config = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "entries"), 0), "config");
    cJSON_DeleteItemFromObject(config, "ATT_VD");
    tp_write_json(root, path);
    expect_ignored(path, "ATT_VD");
    cJSON_AddStringToObject(config, "ATT_VD", "4");
    tp_write_json(root, path);
    cJSON_Delete(root);
    expect_ignored(path, "ATT_VD");
}

typedef struct writer {
    const char *path;
    iha_shape shape;
    iha_status status;
} writer;

static void *write_profile(void *arg)
{
    writer *w = arg;
    iha_context_options o;
    iha_context_options_init(&o);
    o.profile = w->path;
    iha_context *ctx = NULL;
    w->status = iha_context_create(&ctx, &o, NULL, 0);
    if (w->status != IHA_OK)
        return NULL;
    iha_tune_options to;
    iha_tune_options_init(&to);
    to.kernels = IHA_TUNE_ROWS;
    to.budget_s = 3;
    to.reps = 2;
    const iha_attention_options a = causal(0);
    w->status = iha_tune(ctx, &w->shape, &a, 1, &to, NULL, 0, NULL);
    iha_context_free(ctx);
    return NULL;
}

static size_t count_entries(const char *path, const char *kernel)
{
    cJSON *root = tp_parse_file(path);
    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "entries"))
    {
        n += strcmp(cJSON_GetObjectItem(e, "kernel")->valuestring, kernel) == 0 &&
             strcmp(cJSON_GetObjectItem(e, "role")->valuestring, "bucket") == 0;
    }
    cJSON_Delete(root);
    return n;
}

static void count_temp(const char *file, void *arg)
{
    *(int *)arg += strstr(file, ".tmp.") != NULL;
}

static void concurrent_writers_leave_a_valid_profile(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[1024], path[1100];
    tu_temp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/profile.json", dir);
    writer w[3] = {{path, {1, 24, 16, 2, 8, 2}, IHA_OK}, {path, {1, 40, 16, 3, 8, 2}, IHA_OK},
                   {path, {1, 80, 16, 2, 8, 3}, IHA_OK}};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, write_profile, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    assert_int_equal(w[0].status, IHA_OK);
    assert_int_equal(w[1].status, IHA_OK);
    /* Whichever finished last, the file is whole, loads, and no temporary file is left. */
    iha_context *ctx = open_with_profile(path, 0);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_OK);
    assert_int_equal(info.state, IHA_PROFILE_LOADED);
    iha_context_free(ctx);
    const size_t before = count_entries(path, "rows");
    assert_true(before >= 1);
    int temps = 0;
    tu_for_each_file(dir, count_temp, &temps);
    assert_int_equal(temps, 0);
    /* A later writer keeps what is on disk and adds its own bucket. */
    write_profile(&w[2]);
    assert_int_equal(w[2].status, IHA_OK);
    assert_int_equal(count_entries(path, "rows"), before + 1);
    tu_remove_tree(dir);
}

/* The attention variant of the device's built-in for small_shape: 0 register tiles
 * (cl/attention.cl, CPUs), 1 local memory (cl/attention_local.cl, GPUs). */
static int builtin_variant(void)
{
    iha_attention_config cfg;
    iha__attention_config_default(tu_ctx, small_shape.head_dim, &cfg);
    return cfg.variant;
}

/* The prefix of a kernel file that plants a fault: every fma adds 1, which touches every output
 * whatever the kernel's internals (a planted exp2 stopped mattering once the kernel called it
 * only when a row's reference maximum moves). The fault is keyed to a value the tuner's first
 * sweep around the device's built-in tries: ATT_ROWS 2 in attention.cl where the built-in is
 * the register-tile kernel; else ATT_KB 8, next to the local-memory kernel's 16, in both
 * attention files (both variants read ATT_KB, so no correct candidate holds it). NULL for the
 * other files. */
static const char *attention_fault(const char *name)
{
    const size_t len = strlen(name);
    if (builtin_variant() == 1 && strncmp(name, "attention", 9) == 0 && strcmp(name + len - 3, ".cl") == 0)
        return "#if defined(ATT_KB) && ATT_KB == 8\n#define fma(a, b, c) ((a) * (b) + (c) + 1.0f)\n#endif\n";
    if (builtin_variant() != 1 && strcmp(name, "attention.cl") == 0)
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
    iha_context_options o;
    iha_context_options_init(&o);
    o.profile = path;
    o.kernel_dir = dir;
    o.cache_dir = "off";
    iha_context *ctx = NULL;
    assert_int_equal(iha_context_create(&ctx, &o, NULL, 0), IHA_OK);
    iha_tune_result r[4];
    size_t n = 0;
    tune_small(ctx, kernels, budget, r, &n);
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
    /* The first sweep tries ATT_ROWS 1, 2 and 8 around the register-tile built-in, ATT_KB 8 and
     * 16 around the local-memory one: the planted value fails its check. */
    if (builtin_variant() == 1)
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
 * descent tries GEMM_MR=4, which is planted wrong, and must reject it. */
static void wrong_gemm_tile_is_never_stored(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    cl_device_type type = 0;
    assert_int_equal(clGetDeviceInfo(iha_context_cl_device(tu_ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL), CL_SUCCESS);
    if (type & CL_DEVICE_TYPE_GPU) skip(); /* the built-in is CLBlast's database: no tile to descend from */
    /* The seeds are the library kernel's built-in tile and one CLBlast configuration, which costs
     * PoCL 15-60 s to compile with a cold cache; the descent over the library kernel's tiles
     * takes a few seconds and ends by itself. */
    check_planted_candidate_rejected(broken_gemm_kernel, IHA_TUNE_GEMM, 150, "GEMM_MR", 4);
}

static void tuning_on_first_use_only_when_asked(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "first-use.json");
    const iha_attention_options o = causal(0);
    for (int asked = 0; asked < 2; asked++) {
        remove(path);
        iha_context *ctx = open_with_profile(path, asked);
        check_attention(ctx, &small_shape, &o);
        assert_int_equal(file_exists(path), asked);
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
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "refused.json");
    remove(path);
    iha_context *ctx = open_with_profile(path, 1);
    const iha_attention_options o = causal(0);
    const size_t n = tu_count_virtual(&small_shape);
    cl_mem in = tu_buffer_guarded(ctx, NULL, n, 0, 0, 0), small = tu_buffer_guarded(ctx, NULL, n - 1, 0, 0, 0);
    iha_status st = iha_attention(ctx, &small_shape, &o, (iha_buffer){in, 0}, (iha_buffer){in, 0},
                                  (iha_buffer){in, 0}, (iha_buffer){small, 0}, (iha_buffer){NULL, 0});
    tu_assert_status(ctx, st, IHA_ERROR_BUFFER_TOO_SMALL);
    assert_false(file_exists(path)); /* a first-use tune stores its result */
    tu_buffer_release(in), tu_buffer_release(small);
    check_attention(ctx, &small_shape, &o);
    assert_true(file_exists(path));
    assert_int_equal(tp_choice_of(ctx, "attention").source, IHA_CONFIG_PROFILE_EXACT);
    iha_context_free(ctx);
}

/* Options iha_tune refuses before it measures anything: an exhaustive search that includes the
 * GEMM (explicitly or through kernels = 0), reps beyond 64, a NaN or negative budget. */
static void bad_tune_options_refused(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "refused-options.json");
    remove(path);
    iha_context *ctx = open_with_profile(path, 0);
    const iha_attention_options o = causal(0);
    iha_tune_options bad[5];
    for (int i = 0; i < 5; i++) iha_tune_options_init(&bad[i]);
    bad[0].exhaustive = 1;
    bad[1].exhaustive = 1, bad[1].kernels = IHA_TUNE_ATTENTION | IHA_TUNE_GEMM;
    bad[2].reps = 65;
    bad[3].budget_s = NAN;
    bad[4].budget_s = -1.0;
    for (int i = 0; i < 5; i++) {
        tu_assert_status(ctx, iha_tune(ctx, &small_shape, &o, 1, &bad[i], NULL, 0, NULL), IHA_ERROR_INVALID_ARGUMENT);
        assert_true(strlen(iha_context_message(ctx)) > 0);
    }
    assert_false(file_exists(path));
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
    tu_layer l;
    tu_layer_init(&l, &small_shape, 17);
    const iha_attention_options o = causal(0);
    double *zref = tu_layer_reference(&l, &o);
    iha_context *ctx = open_with_profile("off", 0);
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
    path_in(path, sizeof path, "gemm.json");
    write_gemm_entry(path, builtin.config, 3, 8);
    ctx = open_with_profile(path, 0);
    tu_layer_check_forward(ctx, &l, &o, TU_API_DEVICE_OFFSETS, zref, TU_TOL_F32);
    const iha_kernel_choice tuned = tp_choice_of(ctx, "gemm");
    assert_int_equal(tuned.source, IHA_CONFIG_PROFILE_DEVICE);
    assert_non_null(strstr(tuned.config, "backend=1 GEMM_MR=3 GEMM_VW=8 GEMM_KU=2 GEMM_GROUP=4"));
    double seconds = 0.0;
    tu_assert_status(ctx, iha_measure_gemm_kernel(ctx, 5, 7, 3, 1, &seconds), IHA_OK);
    assert_true(seconds > 0.0);
    iha_context_free(ctx);

    write_gemm_entry(path, builtin.config, 3, 5);
    ctx = open_with_profile(path, 0);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_ERROR_PROFILE);
    assert_non_null(strstr(info.message, "gemm configuration is outside its space"));
    tu_layer_check_forward(ctx, &l, &o, TU_API_DEVICE, zref, TU_TOL_F32);
    assert_int_equal(tp_choice_of(ctx, "gemm").source, IHA_CONFIG_BUILTIN_TYPE);
    iha_context_free(ctx);
    free(zref);
    tu_layer_free(&l);
}

static void clear_removes_the_profile(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "clear.json");
    static const long cfg[5] = {1, 2, 8, 4, 16};
    cJSON *root = tp_profile_new();
    add_attention(root, "bucket", 0, 0, 64, 64, cfg);
    tp_write_json(root, path);
    cJSON_Delete(root);
    iha_context *ctx = open_with_profile(path, 0);
    const iha_attention_options o = causal(0);
    check_attention(ctx, &small_shape, &o);
    assert_int_equal(tp_choice_of(ctx, "attention").source, IHA_CONFIG_PROFILE_EXACT);
    assert_int_equal(iha_profile_clear(ctx), IHA_OK);
    assert_false(file_exists(path));
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_OK);
    assert_int_equal(info.state, IHA_PROFILE_NONE);
    check_attention(ctx, &small_shape, &o);
    assert_int_equal(tp_choice_of(ctx, "attention").source, IHA_CONFIG_BUILTIN_TYPE);
    iha_context_free(ctx);
}

/* ---- Writers that share a profile ---- */

/* config[param] of the attention bucket entry with T = `T` in the profile at path; -1 when there
 * is none. */
static long attention_param(const char *path, long T, const char *param)
{
    cJSON *root = tp_parse_file(path);
    long v = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "entries"))
    {
        const cJSON *b = cJSON_GetObjectItem(e, "bucket"), *t = b ? cJSON_GetObjectItem(b, "T") : NULL;
        if (strcmp(cJSON_GetObjectItem(e, "kernel")->valuestring, "attention") == 0 &&
            strcmp(cJSON_GetObjectItem(e, "role")->valuestring, "bucket") == 0 && cJSON_IsNumber(t) &&
            (long)t->valuedouble == T)
            v = (long)cJSON_GetObjectItem(cJSON_GetObjectItem(e, "config"), param)->valuedouble;
    }
    cJSON_Delete(root);
    return v;
}

static size_t entries_in(const char *path)
{
    cJSON *root = tp_parse_file(path);
    const size_t n = (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(root, "entries"));
    cJSON_Delete(root);
    return n;
}

/* Two attention buckets, T = 64 and T = 4096, with ATT_ROWS rows64 and rows4096. */
static void write_two_buckets(const char *path, long rows64, long rows4096)
{
    const long a[5] = {rows64, 2, 8, 4, 16}, b[5] = {rows4096, 2, 8, 4, 16};
    cJSON *root = tp_profile_new();
    add_attention(root, "bucket", 0, 0, 64, 64, a);
    add_attention(root, "bucket", 0, 0, 4096, 4096, b);
    tp_write_json(root, path);
    cJSON_Delete(root);
}

/* What a tune stores in ctx's profile: the loaded T = 4096 entry with ATT_ROWS `rows` (or, with
 * T other than 4096, that entry moved to bucket T), then the save. */
static void store_tuned(iha_context *ctx, long T, long rows)
{
    iha_profile *p = &ctx->tune->profile;
    const iha_profile_entry *base = NULL;
    for (size_t i = 0; i < p->count; i++)
        if (p->entries[i].tunable == &iha__tunable_attention && !p->entries[i].is_default)
            base = &p->entries[i];
    assert_non_null(base);
    iha_profile_entry e = *base;
    const iha_tune_space *space = e.tunable->space;
    for (int k = 0; k < space->key_count; k++)
        if (strcmp(space->keys[k].name, "T") == 0 || strcmp(space->keys[k].name, "span") == 0)
            e.bucket.values[k] = T;
    for (int k = 0; k < space->param_count; k++)
        if (strcmp(space->params[k].name, "ATT_ROWS") == 0)
            e.config.v[k] = rows;
    assert_true(iha__profile_put(p, &e));
    tu_assert_status(ctx, iha__profile_save(ctx, p), IHA_OK);
}

/* A writer replaces only what it tuned: another process's newer result for a bucket this one
 * only loaded stays (it was written back stale, reverting the other's work). */
static void a_writer_keeps_what_others_wrote_meanwhile(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "two_writers.json");
    write_two_buckets(path, 1, 1);
    iha_context *ctx = open_with_profile(path, 0);
    write_two_buckets(path, 4, 1); /* the other writer's T = 64 result */
    store_tuned(ctx, 4096, 2);     /* this one tuned T = 4096 */
    assert_int_equal(attention_param(path, 64, "ATT_ROWS"), 4);
    assert_int_equal(attention_param(path, 4096, "ATT_ROWS"), 2);
    assert_int_equal(entries_in(path), 2);
    /* The context now uses what the file holds, the other writer's entry included. */
    assert_int_equal(ctx->tune->profile.count, 2);
    iha_context_free(ctx);
}

/* A clear between a writer's load and its save stays a clear: the save writes only what this
 * writer tuned (26 loaded entries came back). */
static void a_clear_in_between_stays(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "cleared.json");
    write_two_buckets(path, 1, 1);
    iha_context *tuner = open_with_profile(path, 0), *other = open_with_profile(path, 0);
    assert_int_equal(iha_profile_clear(other), IHA_OK);
    iha_context_free(other);
    store_tuned(tuner, 1024, 2);
    assert_int_equal(entries_in(path), 1);
    assert_int_equal(attention_param(path, 1024, "ATT_ROWS"), 2);
    assert_int_equal(attention_param(path, 64, "ATT_ROWS"), -1);
    iha_context_free(tuner);
}

/* Entries for a kernel or role this library does not know (a newer library's) are reported,
 * not used, and kept by a writer together with every other entry (before, the profile was
 * ignored and the next tune wrote only its own entries). */
static void unknown_entries_are_kept(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "unknown.json");
    const long cfg[5] = {1, 2, 8, 4, 16};
    cJSON *root = tp_profile_new();
    add_attention(root, "bucket", 0, 0, 64, 64, cfg);
    add_attention(root, "bucket", 0, 0, 4096, 4096, cfg);
    add_attention(root, "device_default", 0, 0, 64, 64, cfg);
    add_attention(root, "bucket", 0, 0, 128, 128, cfg);
    add_attention(root, "bucket", 0, 0, 256, 256, cfg);
    cJSON *entries = cJSON_GetObjectItem(root, "entries");
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(entries, 3), "kernel", cJSON_CreateString("softmax"));
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(entries, 4), "role", cJSON_CreateString("per_sequence"));
    tp_write_json(root, path);
    cJSON_Delete(root);

    iha_context *ctx = open_with_profile(path, 0);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_OK);
    assert_int_equal(info.state, IHA_PROFILE_LOADED);
    assert_int_equal(info.entries, 3);
    if (strstr(info.message, "does not know") == NULL)
        fail_msg("the note does not mention the unknown entries: \"%s\"", info.message);
    const iha_attention_options o = causal(0);
    check_attention(ctx, &small_shape, &o);
    assert_int_equal(tp_choice_of(ctx, "attention").source, IHA_CONFIG_PROFILE_EXACT);
    store_tuned(ctx, 1024, 2);
    iha_context_free(ctx);
    assert_int_equal(entries_in(path), 6);
    root = tp_parse_file(path);
    int softmax = 0, per_sequence = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "entries"))
    {
        softmax += strcmp(cJSON_GetObjectItem(e, "kernel")->valuestring, "softmax") == 0;
        per_sequence += strcmp(cJSON_GetObjectItem(e, "role")->valuestring, "per_sequence") == 0;
    }
    cJSON_Delete(root);
    assert_int_equal(softmax, 1);
    assert_int_equal(per_sequence, 1);
}

/* A profile of a newer format_version is reported and never overwritten. */
static void newer_format_is_not_overwritten(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char path[1100];
    path_in(path, sizeof path, "newer.json");
    write_two_buckets(path, 1, 1);
    iha_context *ctx = open_with_profile(path, 0);
    cJSON *root = tp_profile_new();
    cJSON_ReplaceItemInObject(root, "format_version", cJSON_CreateNumber(2));
    tp_write_json(root, path);
    cJSON_Delete(root);
    iha_profile *p = &ctx->tune->profile;
    iha_profile_entry e = p->entries[0];
    assert_true(iha__profile_put(p, &e));
    tu_assert_status(ctx, iha__profile_save(ctx, p), IHA_ERROR_IO);
    assert_non_null(strstr(iha_context_message(ctx), "format_version 2"));
    iha_context_free(ctx);
    root = tp_parse_file(path);
    assert_int_equal((int)cJSON_GetObjectItem(root, "format_version")->valuedouble, 2);
    cJSON_Delete(root);
}

/* The profile's key holds the driver's strings whole (a 64-character version string came out
 * empty). */
static void key_holds_whole_device_strings(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const cl_device_id device = iha_context_cl_device(tu_ctx);
    const struct {
        const char *field;
        cl_device_info what;
    } fields[] = {{"opencl_version", CL_DEVICE_VERSION}, {"driver_version", CL_DRIVER_VERSION},
                  {"name", CL_DEVICE_NAME}, {"vendor", CL_DEVICE_VENDOR}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        size_t size = 0;
        assert_int_equal(clGetDeviceInfo(device, fields[i].what, 0, NULL, &size), CL_SUCCESS);
        char *whole = tu_malloc(size + 1);
        assert_int_equal(clGetDeviceInfo(device, fields[i].what, size, whole, NULL), CL_SUCCESS);
        whole[size] = '\0';
        const cJSON *v = cJSON_GetObjectItem(tp_key, fields[i].field);
        assert_true(cJSON_IsString(v));
        if (strcmp(v->valuestring, whole) != 0)
            fail_msg("key %s is \"%s\", the driver says \"%s\"", fields[i].field, v->valuestring, whole);
        free(whole);
    }
}

/* A directory path of n bytes under base, made of 200-byte components. */
static void long_dir(char *out, size_t cap, const char *base, size_t n)
{
    size_t len = (size_t)snprintf(out, cap, "%s", base);
    while (len < n && len + 2 < cap) {
        out[len++] = '/';
        for (int i = 0; i < 200 && len < n && len + 1 < cap; i++)
            out[len++] = 'd';
    }
    out[len] = '\0';
}

/* A cache directory over a thousand bytes long holds the profile like any other; one too long
 * for PATH_MAX is refused at once, saying so (iha tune spent its budget, then blamed a cache
 * directory that was not off). */
static void long_cache_dirs(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static char dir[PATH_MAX + 400];
    long_dir(dir, sizeof dir, tp_dir, 1100);
    iha_context_options options;
    iha_context_options_init(&options);
    options.cache_dir = dir;
    iha_context *ctx = NULL;
    char message[1024] = "";
    assert_int_equal(iha_context_create(&ctx, &options, message, sizeof message), IHA_OK);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_OK);
    assert_int_equal(strncmp(info.path, dir, strlen(dir)), 0);
    iha_context_free(ctx);

    long_dir(dir, sizeof dir, tp_dir, PATH_MAX - 40);
    ctx = NULL;
    assert_int_equal(iha_context_create(&ctx, &options, message, sizeof message), IHA_OK);
    const iha_attention_options o = causal(0);
    tu_assert_profile_refused(ctx, &small_shape, &o, "PATH_MAX");
    iha_context_free(ctx);
}

/* ---- Setup: the key comes from a profile the library writes itself ---- */

static int group_setup(void **state)
{
    (void)state;
    return tp_group_setup(&small_shape);
}

int main(int argc, char **argv)
{
    tu_init_environment();
    if (argc == 2)
        cmocka_set_test_filter(argv[1]); /* a developer runs one case: test_tune NAME_PATTERN */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tune_stores_verified_configs_that_calls_use),
        cmocka_unit_test(fallback_goes_from_specific_to_general),
        cmocka_unit_test(key_mismatch_is_reported_and_ignored),
        cmocka_unit_test(corrupt_profile_is_reported_and_ignored),
        cmocka_unit_test(concurrent_writers_leave_a_valid_profile),
        cmocka_unit_test(wrong_candidate_is_never_stored),
        cmocka_unit_test(wrong_gemm_tile_is_never_stored),
        cmocka_unit_test(tuning_on_first_use_only_when_asked),
        cmocka_unit_test(refused_call_does_not_tune),
        cmocka_unit_test(bad_tune_options_refused),
        cmocka_unit_test(gemm_entry_names_the_backend),
        cmocka_unit_test(clear_removes_the_profile),
        cmocka_unit_test(a_writer_keeps_what_others_wrote_meanwhile),
        cmocka_unit_test(a_clear_in_between_stays),
        cmocka_unit_test(unknown_entries_are_kept),
        cmocka_unit_test(newer_format_is_not_overwritten),
        cmocka_unit_test(key_holds_whole_device_strings),
        cmocka_unit_test(long_cache_dirs),
    };
    return cmocka_run_group_tests(tests, group_setup, tp_group_teardown);
}
