/*
 * test_profile.c - the tuning profile (src/tune/profile.c, lookup.c): the fallback order exact
 * -> nearest of the same kind -> device default -> built-in; a profile for another driver,
 * library or kernel version, and a corrupt, truncated or invalid one, is reported
 * (IHA_ERROR_PROFILE), ignored and harmless; two writers at once leave a valid file and a later
 * writer merges; clear removes the file. A writer replaces only what it tuned (another's newer
 * entries, a clear in between and entries of unknown kernels stay), a newer format is never
 * overwritten, the key holds the device's strings whole, and cache directories over a thousand
 * bytes work while one too long for PATH_MAX is refused before tuning.
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

#include "kernels/attention.h"
#include "runtime/context.h"
#include "tune/state.h"
#include "test_layer.h"
#include "test_util.h"
#include "test_profiles.h"

/* ---- Lookup order ---- */

static void fallback_goes_from_specific_to_general(void **state)
{
    (void)state;
    char path[1100];
    tp_fresh_path(path, sizeof path, "fallback.json");
    static const long exact[5] = {1, 2, 8, 4, 16}, far[5] = {2, 1, 8, 8, 1}, device[5] = {1, 1, 16, 8, 1};
    cJSON *root = tp_profile_new();
    tp_add_attention(root, "bucket", 0, 0, 64, 64, exact);
    tp_add_attention(root, "bucket", 0, 0, 4096, 4096, far);
    tp_add_attention(root, "device_default", 0, 0, 64, 64, device);
    tp_write_json(root, path);
    cJSON_Delete(root);

    iha_context *ctx = tp_open_with_profile(path, 0);
    const iha_attention_options global = tp_causal(0);
    iha_attention_options none = tp_causal(0);
    none.mask = IHA_MASK_NONE;
    /* 1. T = 48 is in the bucket T = 64 exactly. */
    tp_check_attention(ctx, &tp_small_shape, &global);
    iha_kernel_choice c = tp_choice_of(ctx, "attention");
    assert_int_equal(c.source, IHA_CONFIG_PROFILE_EXACT);
    assert_string_equal(c.config, "ATT_ROWS=1 ATT_TILES=2 ATT_KB=8 ATT_VD=4 group=16 variant=0 LOC_KEYS=32 ATT_PREFETCH=0 TILE_RY=4 TILE_RX=4");
    /* 2. T = 2000 (bucket 2048) is nearest to the T = 4096 entry of the same kind. */
    const iha_shape longer = {1, 1000, 16, 1, 8, 2};
    tp_check_attention(ctx, &longer, &global);
    c = tp_choice_of(ctx, "attention");
    assert_int_equal(c.source, IHA_CONFIG_PROFILE_NEAREST);
    assert_string_equal(c.config, "ATT_ROWS=2 ATT_TILES=1 ATT_KB=8 ATT_VD=8 group=1 variant=0 LOC_KEYS=32 ATT_PREFETCH=0 TILE_RY=4 TILE_RX=4");
    assert_non_null(strstr(c.source_bucket, "T=4096"));
    /* 3. Another mask is another kind: the device default. */
    tp_check_attention(ctx, &tp_small_shape, &none);
    c = tp_choice_of(ctx, "attention");
    assert_int_equal(c.source, IHA_CONFIG_PROFILE_DEVICE);
    assert_string_equal(c.config, "ATT_ROWS=1 ATT_TILES=1 ATT_KB=16 ATT_VD=8 group=1 variant=0 LOC_KEYS=32 ATT_PREFETCH=0 TILE_RY=4 TILE_RX=4");
    /* The mixing kernels have no entry at all: 4. the built-in default of the device type. */
    assert_int_equal(tp_choice_of(ctx, "rows").source, IHA_CONFIG_BUILTIN_TYPE);
    iha_context_free(ctx);
}

/* Writes a copy of this device's valid profile with key field `field` replaced by `value`. */
static void write_with_key(const char *path, const char *field, cJSON *value)
{
    static const long cfg[5] = {1, 2, 8, 4, 16};
    cJSON *root = tp_profile_new();
    tp_add_attention(root, "bucket", 0, 0, 64, 64, cfg);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "key"), field, value);
    tp_write_json(root, path);
    cJSON_Delete(root);
}

/* The profile at path must be reported, ignored, and harmless to a call. */
static void expect_ignored(const char *path, const char *why)
{
    iha_context *ctx = tp_open_with_profile(path, 0);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_ERROR_PROFILE);
    assert_int_equal(info.state, IHA_PROFILE_IGNORED);
    assert_int_equal(info.entries, 0);
    if (why != NULL && strstr(info.message, why) == NULL)
        fail_msg("message \"%s\" does not mention %s", info.message, why);
    assert_non_null(strstr(iha_context_message(ctx), "ignored"));
    tp_check_small(ctx);
    assert_int_equal(tp_choice_of(ctx, "attention").source, IHA_CONFIG_BUILTIN_TYPE);
    iha_context_free(ctx);
}

static void key_mismatch_is_reported_and_ignored(void **state)
{
    (void)state;
    char path[1100];
    tp_fresh_path(path, sizeof path, "mismatch.json");
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
    char path[1100];
    tp_fresh_path(path, sizeof path, "corrupt.json");
    static const long good[5] = {1, 2, 8, 4, 16}, bad_kb[5] = {1, 2, 5, 4, 16}, big[5] = {1, 2, 8, 4, 1L << 40};
    cJSON *root = tp_profile_new();
    tp_add_attention(root, "bucket", 0, 0, 64, 64, good);
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
        tp_add_attention(root, "bucket", 0, 0, 64, 64, configs[i]);
        tp_write_json(root, path);
        cJSON_Delete(root);
        expect_ignored(path, "outside its space");
    }
    root = tp_profile_new(); /* a parameter missing, one of the wrong type */
    tp_add_attention(root, "bucket", 0, 0, 64, 64, good);
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
    iha_context *ctx = NULL;
    w->status = tu_context_create_at(&ctx, (tu_places){.profile = w->path}, NULL, 0);
    if (w->status != IHA_OK)
        return NULL;
    iha_tune_options to;
    iha_tune_options_init(&to);
    to.kernels = IHA_TUNE_ROWS;
    to.budget_s = 3;
    to.reps = 2;
    const iha_attention_options a = tp_causal(0);
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
    tu_temp_path(dir, sizeof dir, path, sizeof path, "profile.json");
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
    iha_context *ctx = tp_open_with_profile(path, 0);
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

/* The attention variant of the device's built-in for tp_small_shape: 0 register tiles
 * (cl/attention.cl, CPUs), 1 local memory (cl/attention_local.cl, GPUs). */
static void clear_removes_the_profile(void **state)
{
    (void)state;
    char path[1100];
    tp_fresh_path(path, sizeof path, "clear.json");
    static const long cfg[5] = {1, 2, 8, 4, 16};
    cJSON *root = tp_profile_new();
    tp_add_attention(root, "bucket", 0, 0, 64, 64, cfg);
    tp_write_json(root, path);
    cJSON_Delete(root);
    iha_context *ctx = tp_open_with_profile(path, 0);
    tp_check_small(ctx);
    assert_int_equal(tp_choice_of(ctx, "attention").source, IHA_CONFIG_PROFILE_EXACT);
    assert_int_equal(iha_profile_clear(ctx), IHA_OK);
    assert_false(tp_file_exists(path));
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_OK);
    assert_int_equal(info.state, IHA_PROFILE_NONE);
    tp_check_small(ctx);
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
    tp_add_attention(root, "bucket", 0, 0, 64, 64, a);
    tp_add_attention(root, "bucket", 0, 0, 4096, 4096, b);
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

/* A context on a fresh profile `name` (its path in path) of two buckets with 1 row each. */
static iha_context *open_on_two_buckets(char *path, size_t size, const char *name)
{
    tp_fresh_path(path, size, name);
    write_two_buckets(path, 1, 1);
    return tp_open_with_profile(path, 0);
}

/* A writer replaces only what it tuned: another process's newer result for a bucket this one
 * only loaded stays (it was written back stale, reverting the other's work). */
static void a_writer_keeps_what_others_wrote_meanwhile(void **state)
{
    (void)state;
    char path[1100];
    iha_context *ctx = open_on_two_buckets(path, sizeof path, "two_writers.json");
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
    char path[1100];
    tp_fresh_path(path, sizeof path, "cleared.json");
    write_two_buckets(path, 1, 1);
    iha_context *tuner = tp_open_with_profile(path, 0), *other = tp_open_with_profile(path, 0);
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
    char path[1100];
    tp_fresh_path(path, sizeof path, "unknown.json");
    const long cfg[5] = {1, 2, 8, 4, 16};
    cJSON *root = tp_profile_new();
    tp_add_attention(root, "bucket", 0, 0, 64, 64, cfg);
    tp_add_attention(root, "bucket", 0, 0, 4096, 4096, cfg);
    tp_add_attention(root, "device_default", 0, 0, 64, 64, cfg);
    tp_add_attention(root, "bucket", 0, 0, 128, 128, cfg);
    tp_add_attention(root, "bucket", 0, 0, 256, 256, cfg);
    cJSON *entries = cJSON_GetObjectItem(root, "entries");
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(entries, 3), "kernel", cJSON_CreateString("softmax"));
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(entries, 4), "role", cJSON_CreateString("per_sequence"));
    tp_write_json(root, path);
    cJSON_Delete(root);

    iha_context *ctx = tp_open_with_profile(path, 0);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_OK);
    assert_int_equal(info.state, IHA_PROFILE_LOADED);
    assert_int_equal(info.entries, 3);
    if (strstr(info.message, "does not know") == NULL)
        fail_msg("the note does not mention the unknown entries: \"%s\"", info.message);
    tp_check_small(ctx);
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
    char path[1100];
    iha_context *ctx = open_on_two_buckets(path, sizeof path, "newer.json");
    cJSON *root = tp_profile_new();
    cJSON_ReplaceItemInObject(root, "format_version", cJSON_CreateNumber(TP_FORMAT_VERSION + 1));
    tp_write_json(root, path);
    cJSON_Delete(root);
    iha_profile *p = &ctx->tune->profile;
    iha_profile_entry e = p->entries[0];
    assert_true(iha__profile_put(p, &e));
    tu_assert_status(ctx, iha__profile_save(ctx, p), IHA_ERROR_IO);
    char newer[32];
    snprintf(newer, sizeof newer, "format_version %d", TP_FORMAT_VERSION + 1);
    assert_non_null(strstr(iha_context_message(ctx), newer));
    iha_context_free(ctx);
    root = tp_parse_file(path);
    assert_int_equal((int)cJSON_GetObjectItem(root, "format_version")->valuedouble, TP_FORMAT_VERSION + 1);
    cJSON_Delete(root);
}

/* The config of an attention entry as a profile of format_version 1 wrote it: the local tiles
 * (variant 2), 64 query rows and 32 keys, without TILE_RY and TILE_RX, which that format
 * predates; the kernel then had 4 x 4 sub-tiles only. */
static cJSON *format_1_local_tiles(void)
{
    cJSON *root = tp_profile_new();
    cJSON_ReplaceItemInObject(root, "format_version", cJSON_CreateNumber(1));
    static const long cfg[5] = {1, 1, 16, 4, 64};
    tp_add_attention(root, "device_default", 0, 0, 64, 64, cfg);
    cJSON *config = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "entries"), 0), "config");
    cJSON_ReplaceItemInObject(config, "variant", cJSON_CreateNumber(2));
    cJSON_DeleteItemFromObject(config, "TILE_RY");
    cJSON_DeleteItemFromObject(config, "TILE_RX");
    return root;
}

/* doc/tuning.md, "The profile file": a file of format_version 1 is read, its local-tile entries
 * as the 4 x 4 sub-tiles they ran, and a writer rewrites its entries with TILE_RY and TILE_RX; the
 * same entry in a file of format_version 2 lacks them, so that file is reported and ignored,
 * never read as some other shape. */
static void format_1_local_tiles_read_as_4x4(void **state)
{
    (void)state;
    char path[1100];
    tp_fresh_path(path, sizeof path, "format1.json");
    cJSON *root = format_1_local_tiles();
    tp_write_json(root, path);
    iha_context *ctx = tp_open_with_profile(path, 0);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_OK);
    assert_int_equal(info.state, IHA_PROFILE_LOADED);
    assert_int_equal(info.entries, 1);
    tp_check_small(ctx);
    iha_kernel_choice c = tp_choice_of(ctx, "attention");
    assert_int_equal(c.source, IHA_CONFIG_PROFILE_DEVICE);
    assert_string_equal(c.config, "ATT_ROWS=1 ATT_TILES=1 ATT_KB=16 ATT_VD=4 group=64 variant=2 LOC_KEYS=32 "
                                  "ATT_PREFETCH=0 TILE_RY=4 TILE_RX=4");

    /* A tune's result for the call's bucket, saved: the version 1 entry stays, rewritten. */
    iha_profile *p = &ctx->tune->profile;
    iha_profile_entry e = p->entries[0];
    e.is_default = 0;
    const iha_attention_options o = tp_causal(0);
    assert_true(iha__tunable_attention.bucket_of(ctx, &tp_small_shape, &o, &e.bucket));
    assert_true(iha__profile_put(p, &e));
    tu_assert_status(ctx, iha__profile_save(ctx, p), IHA_OK);
    iha_context_free(ctx);
    cJSON *written = tp_parse_file(path);
    assert_int_equal((int)cJSON_GetObjectItem(written, "format_version")->valuedouble, TP_FORMAT_VERSION);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(written, "entries")), 2);
    const cJSON *entry;
    cJSON_ArrayForEach(entry, cJSON_GetObjectItem(written, "entries"))
    {
        const cJSON *config = cJSON_GetObjectItem(entry, "config");
        assert_int_equal(cJSON_GetObjectItem(config, "variant")->valueint, 2);
        assert_int_equal(cJSON_GetObjectItem(config, "TILE_RY")->valueint, 4);
        assert_int_equal(cJSON_GetObjectItem(config, "TILE_RX")->valueint, 4);
    }
    cJSON_Delete(written);

    cJSON_ReplaceItemInObject(root, "format_version", cJSON_CreateNumber(TP_FORMAT_VERSION));
    tp_write_json(root, path);
    cJSON_Delete(root);
    expect_ignored(path, "TILE_RY");
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
 * for PATH_MAX is refused at once, saying so, before any budget is spent. */
static void long_cache_dirs(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static char dir[PATH_MAX + 400];
    long_dir(dir, sizeof dir, tp_dir, 1100);
    iha_context *ctx = NULL;
    char message[1024] = "";
    const tu_places at = {.cache_dir = dir};
    assert_int_equal(tu_context_create_at(&ctx, at, message, sizeof message), IHA_OK);
    iha_profile_info info;
    assert_int_equal(iha_context_profile(ctx, &info), IHA_OK);
    assert_int_equal(strncmp(info.path, dir, strlen(dir)), 0);
    iha_context_free(ctx);

    long_dir(dir, sizeof dir, tp_dir, PATH_MAX - 40);
    ctx = NULL;
    assert_int_equal(tu_context_create_at(&ctx, at, message, sizeof message), IHA_OK);
    const iha_attention_options o = tp_causal(0);
    tu_assert_profile_refused(ctx, &tp_small_shape, &o, "PATH_MAX");
    iha_context_free(ctx);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fallback_goes_from_specific_to_general),
        cmocka_unit_test(key_mismatch_is_reported_and_ignored),
        cmocka_unit_test(corrupt_profile_is_reported_and_ignored),
        cmocka_unit_test(concurrent_writers_leave_a_valid_profile),
        cmocka_unit_test(clear_removes_the_profile),
        cmocka_unit_test(a_writer_keeps_what_others_wrote_meanwhile),
        cmocka_unit_test(a_clear_in_between_stays),
        cmocka_unit_test(unknown_entries_are_kept),
        cmocka_unit_test(newer_format_is_not_overwritten),
        cmocka_unit_test(format_1_local_tiles_read_as_4x4),
        cmocka_unit_test(key_holds_whole_device_strings),
        cmocka_unit_test(long_cache_dirs),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tp_group_setup_small, tp_group_teardown);
}
