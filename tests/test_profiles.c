/*
 * test_profiles.c - files, hand-written profiles and choices for the tuning tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "test_profiles.h"

char tp_dir[1024];
cJSON *tp_key;

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
    cJSON_AddNumberToObject(root, "format_version", 1);
    cJSON_AddItemToObject(root, "key", cJSON_Duplicate(tp_key, 1));
    cJSON_AddItemToObject(root, "entries", cJSON_CreateArray());
    return root;
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
    iha_context_options co;
    iha_context_options_init(&co);
    co.profile = path;
    iha_context *ctx = NULL;
    char message[1024] = "";
    if (iha_context_create(&ctx, &co, message, sizeof message) != IHA_OK) {
        fprintf(stderr, "iha_context_create: %s\n", message);
        return -1;
    }
    iha_tune_options to;
    iha_tune_options_init(&to);
    to.kernels = IHA_TUNE_ROWS;
    to.budget_s = 1;
    to.reps = 1;
    iha_attention_options o;
    iha_attention_options_init(&o);
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
