/*
 * test_profiles.c - files, hand-written profiles, contexts, calls and choices for the tuning
 * tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "reference.h"
#include "test_layer.h"
#include "test_util.h"
#include "test_profiles.h"

char tp_dir[1024];
cJSON *tp_key;
const iha_shape tp_small_shape = {1, 24, 16, 2, 8, 2};

char *tp_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = tu_malloc((size_t)n + 1);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    text[n] = '\0';
    fclose(f);
    return text;
}

void tp_write_text(const char *path, const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

cJSON *tp_parse_file(const char *path)
{
    char *text = tp_slurp(path);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    return root;
}

void tp_write_json(cJSON *root, const char *path)
{
    char *text = cJSON_Print(root);
    tp_write_text(path, text, strlen(text));
    free(text);
}

cJSON *tp_profile_new(void)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "iha-tuning-profile");
    cJSON_AddNumberToObject(root, "format_version", TP_FORMAT_VERSION);
    cJSON_AddItemToObject(root, "key", cJSON_Duplicate(tp_key, 1));
    cJSON_AddItemToObject(root, "entries", cJSON_CreateArray());
    return root;
}

int tp_count_verified(const char *path, const char *kernel)
{
    cJSON *root = tp_parse_file(path);
    const cJSON *e;
    int entries = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "entries"))
    {
        if (kernel)
            assert_string_equal(cJSON_GetObjectItem(e, "kernel")->valuestring, kernel);
        assert_true(cJSON_GetObjectItem(e, "error")->valuedouble <= TU_TOL_F32);
        entries++;
    }
    cJSON_Delete(root);
    return entries;
}

void tp_assert_no_entry_with(const char *path, const char *param, int value)
{
    cJSON *root = tp_parse_file(path);
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "entries"))
    {
        const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "config"), param);
        if (v != NULL && v->valueint == value)
            fail_msg("profile %s stores an entry with %s=%d", path, param, value);
    }
    cJSON_Delete(root);
}

iha_kernel_choice tp_choice_of(iha_context *ctx, const char *kernel)
{
    iha_kernel_choice c[8];
    size_t n = 0;
    assert_int_equal(iha_context_last_choices(ctx, c, 8, &n), IHA_OK);
    for (size_t i = 0; i < n && i < 8; i++)
        if (strcmp(c[i].kernel, kernel) == 0)
            return c[i];
    fail_msg("no choice reported for %s", kernel);
    return c[0];
}

int tp_group_setup(const iha_shape *shape)
{
    if (tu_group_setup(NULL) < 0)
        return -1;
    if (tu_ctx == NULL)
        return 0; /* no device, allowed: the tests skip */
    tu_temp_dir(tp_dir, sizeof tp_dir);
    char path[1100];
    snprintf(path, sizeof path, "%s/key.json", tp_dir);
    iha_context *ctx = NULL;
    char message[1024] = "";
    if (tu_context_create_at(&ctx, (tu_places){.profile = path}, message, sizeof message) != IHA_OK) {
        fprintf(stderr, "iha_context_create: %s\n", message);
        return -1;
    }
    iha_tune_options to;
    iha_tune_options_init(&to);
    to.kernels = IHA_TUNE_ROWS;
    to.budget_s = 1;
    to.reps = 1;
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    iha_status st = iha_tune(ctx, shape, &o, 1, &to, NULL, 0, NULL);
    iha_context_free(ctx);
    if (st != IHA_OK)
        return -1;
    cJSON *root = tp_parse_file(path);
    tp_key = cJSON_Duplicate(cJSON_GetObjectItem(root, "key"), 1);
    cJSON_Delete(root);
    return tp_key ? 0 : -1;
}

int tp_group_teardown(void **state)
{
    cJSON_Delete(tp_key);
    tp_key = NULL;
    if (tp_dir[0])
        tu_remove_tree(tp_dir);
    return tu_group_teardown(state);
}

typedef struct copy_job {
    const char *dir;
    const char *(*fault)(const char *name);
} copy_job;

static void copy_one(const char *src, void *arg)
{
    const copy_job *job = arg;
    const char *name = strrchr(src, '/') + 1;
    const size_t len = strlen(name);
    if (!(len > 3 && strcmp(name + len - 3, ".cl") == 0) && !(len > 4 && strcmp(name + len - 4, ".clh") == 0))
        return;
    char dst[1200];
    snprintf(dst, sizeof dst, "%s/%s", job->dir, name);
    char *text = tp_slurp(src);
    assert_non_null(text);
    FILE *f = fopen(dst, "wb");
    assert_non_null(f);
    const char *prefix = job->fault ? job->fault(name) : NULL;
    if (prefix) fputs(prefix, f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    free(text);
}

void tp_copy_kernels(const char *dir, const char *(*fault)(const char *name))
{
    char cl_dir[1100];
    snprintf(cl_dir, sizeof cl_dir, "%s/cl", IHA_TEST_SOURCE_DIR);
    copy_job job = {dir, fault};
    assert_true(tu_for_each_file(cl_dir, copy_one, &job) > 0);
}

void tp_path_in(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/%s", tp_dir, name);
}

void tp_fresh_path(char *out, size_t size, const char *name)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    tp_path_in(out, size, name);
    remove(out);
}

iha_context *tp_open_fresh(char *path, size_t size, const char *name, int first_use)
{
    tp_fresh_path(path, size, name);
    return tp_open_with_profile(path, first_use);
}

int tp_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* An attention entry of the register-tile variant (variant 0, LOC_KEYS at its canonical 32,
 * TILE_RY and TILE_RX at their canonical 4); role "bucket" or "device_default". */
void tp_add_attention(cJSON *root, const char *role, long mask, long windowed, long T, long span, const long cfg[5])
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
    cJSON_AddNumberToObject(c, "TILE_RY", 4);
    cJSON_AddNumberToObject(c, "TILE_RX", 4);
    cJSON_AddItemToObject(e, "bucket", b);
    cJSON_AddItemToObject(e, "config", c);
    cJSON_AddItemToArray(cJSON_GetObjectItem(root, "entries"), e);
}


iha_context *tp_open_with_profile(const char *profile, int first_use)
{
    iha_context_options o;
    iha_context_options_init(&o);
    o.profile = profile;
    o.tune_on_first_use = first_use;
    o.tune_budget_s = 6;
    return tu_context_create_or_fail(&o);
}

/* iha_attention on random inputs of `shape` and `options`, checked against the float64
 * reference within doc/spec.md's float32 contract. */
void tp_check_attention(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options)
{
    const size_t n = tu_count_virtual(shape);
    tu_rng rng = tu_rng_seeded(5);
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

void tp_check_small(iha_context *ctx)
{
    const iha_attention_options o = tp_causal(0);
    tp_check_attention(ctx, &tp_small_shape, &o);
}

iha_attention_options tp_causal(int64_t window)
{
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, window, 0);
    return o;
}

/* A tiny budgeted tune of `kernels` for tp_small_shape (causal, global) into `profile`. */
void tp_tune_small(iha_context *ctx, unsigned kernels, double budget, iha_tune_result *results, size_t *count)
{
    iha_tune_options to;
    iha_tune_options_init(&to);
    to.kernels = kernels;
    to.budget_s = budget;
    to.reps = 3;
    const iha_attention_options o = tp_causal(0);
    iha_status st = iha_tune(ctx, &tp_small_shape, &o, 1, &to, results, 4, count);
    tu_assert_status(ctx, st, IHA_OK);
}

int tp_group_setup_small(void **state)
{
    (void)state;
    return tp_group_setup(&tp_small_shape);
}

iha_context *tp_open_with_kernels(const char *profile, const char *kernel_dir)
{
    iha_context_options o;
    iha_context_options_init(&o);
    o.profile = profile;
    o.kernel_dir = kernel_dir;
    if (kernel_dir) o.cache_dir = "off";
    iha_context *ctx = NULL;
    char message[1024] = "";
    iha_status st = iha_context_create(&ctx, &o, message, sizeof message);
    if (st != IHA_OK) fail_msg("iha_context_create: %s: %s", iha_status_name(st), message);
    return ctx;
}
