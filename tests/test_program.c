/*
 * test_program.c - where programs come from (src/runtime/program.c, kernel_sources.c,
 * disk_cache.c): kernel sources read from a directory (and a build failure that reports its
 * log), and the on-disk program cache: files appear, a warm cache and a corrupted cache
 * (truncated, garbage, emptied, damaged payload) still give correct results, "off" (in any case)
 * writes nothing, and its location follows IHA_CACHE_DIR, XDG_CACHE_HOME and HOME. Cache tests
 * look only at what appears in the directory, never at file names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "test_layer.h"

/* ---- Kernel sources from a directory ---- */

static void kernel_dir_from_source_tree(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_context_options options;
    iha_context_options_init(&options);
    options.kernel_dir = IHA_TEST_SOURCE_DIR "/cl";
    options.cache_dir = "off";
    iha_context *ctx = tu_context_create_or_fail(&options);
    tu_check_small_forward(ctx, TU_API_DEVICE);
    iha_context_free(ctx);
}

/* A context that builds its programs at its first call: a tiny layer (P = 1, no mixing) through
 * iha_forward_host; *log becomes the context's message. */
static iha_status first_build(iha_context *ctx, const char **log)
{
    const iha_shape shape = {1, 3, 8, 1, 4, 1};
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    tu_layer l;
    tu_layer_init(&l, &shape, 5);
    float z[24];
    iha_host_weights w = {l.wq, l.wk, l.wv, l.wo, NULL, NULL, NULL, NULL};
    const iha_status st = iha_forward_host(ctx, &shape, &o, &w, l.x, z);
    *log = iha_context_message(ctx);
    tu_layer_free(&l);
    return st;
}

/* Every kernel source broken: the failure is IHA_ERROR_BUILD with the build log in the message
 * (at creation or at the first call, whichever builds). A missing directory is an error too. */
static void broken_kernel_source_reports_build_log(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[4096];
    tu_temp_dir(dir, sizeof dir);
    tu_copy_job job = {dir, "\n#error deliberately broken by test_context\nthis is not OpenCL C;\n"};
    assert_true(tu_for_each_file(IHA_TEST_SOURCE_DIR "/cl", tu_copy_into, &job) > 0);

    iha_context *ctx = NULL;
    char message[4096] = "";
    tu_places at = {.kernel_dir = dir, .cache_dir = "off"};
    iha_status st = tu_context_create_at(&ctx, at, message, sizeof message);
    const char *log = message;
    if (st == IHA_OK)
        st = first_build(ctx, &log);
    if (st != IHA_ERROR_BUILD)
        fail_msg("broken kernels: %s (%s), expected IHA_ERROR_BUILD", iha_status_name(st), log);
    if (!strstr(log, "deliberately broken") && !tu_contains_nocase(log, "error"))
        fail_msg("the message does not carry the build log: \"%s\"", log);
    iha_context_free(ctx);
    tu_remove_tree(dir);

    /* A kernel directory that does not exist. */
    at.kernel_dir = IHA_TEST_BINARY_DIR "/no-such-kernel-dir";
    ctx = NULL;
    message[0] = '\0';
    st = tu_context_create_at(&ctx, at, message, sizeof message);
    log = message;
    if (st == IHA_OK)
        st = first_build(ctx, &log);
    if (st == IHA_OK || strlen(log) == 0)
        fail_msg("missing kernel directory: %s with message \"%s\"", iha_status_name(st), log);
    iha_context_free(ctx);
}

/* ---- The disk cache ---- */

static size_t count_files(const char *dir)
{
    return tu_for_each_file(dir, NULL, NULL);
}

/* One context with this cache setting: runs and checks a forward, then frees the context
 * (entries may be written at any point until then). */
static void run_with_cache(const char *cache_dir)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.cache_dir = cache_dir;
    iha_context *ctx = tu_context_create_or_fail(&options);
    tu_check_small_forward(ctx, TU_API_DEVICE);
    iha_context_free(ctx);
}

static void corrupt_truncate(const char *path, void *arg)
{
    (void)arg;
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size / 2), 0);
}

static void corrupt_empty(const char *path, void *arg)
{
    (void)arg;
    assert_int_equal(truncate(path, 0), 0);
}

/* Overwrites the file from byte `*(long *)arg` to its end (at least 256 bytes) with garbage. */
static void corrupt_garbage(const char *path, void *arg)
{
    long from = *(const long *)arg;
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    long size = st.st_size > 256 ? (long)st.st_size : 256;
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, from < size ? from : 0, SEEK_SET), 0);
    tu_rng rng = tu_rng_seeded((uint64_t)size);
    for (long i = from < size ? from : 0; i < size; i++)
        assert_int_not_equal(fputc((int)(tu_rng_next(&rng) & 0xff), f), EOF);
    assert_int_equal(fclose(f), 0);
}

static void count_nonempty(const char *path, void *arg)
{
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size > 0)
        ++*(size_t *)arg;
}

static void disk_cache_survives_corruption(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[4096];
    tu_temp_dir(dir, sizeof dir);

    run_with_cache(dir); /* cold: builds from source and writes entries */
    size_t entries = count_files(dir);
    if (entries == 0)
        fail_msg("no cache entries were written to %s", dir);
    run_with_cache(dir); /* warm: loads the entries */
    assert_true(count_files(dir) >= entries);

    long from_start = 0, after_header = 64;
    tu_for_each_file(dir, corrupt_truncate, NULL);
    run_with_cache(dir);
    tu_for_each_file(dir, corrupt_garbage, &from_start);
    run_with_cache(dir);
    tu_for_each_file(dir, corrupt_empty, NULL);
    run_with_cache(dir);
    /* Rebuilt programs are stored again in place of the broken entries. */
    size_t nonempty = 0;
    tu_for_each_file(dir, count_nonempty, &nonempty);
    if (nonempty == 0)
        fail_msg("after a rebuild every cache entry is still empty");
    run_with_cache(dir);
    /* Damage after an intact header is caught too. */
    tu_for_each_file(dir, corrupt_garbage, &after_header);
    run_with_cache(dir);
    run_with_cache(dir);
    tu_remove_tree(dir);
}

/* Runs with options.cache_dir = option after pointing IHA_CACHE_DIR (NULL: unset), XDG_CACHE_HOME
 * and HOME at the given values (NULL: unset), restoring them afterwards. */
static void run_with_env(const char *option, const char *iha_cache_dir, const char *xdg, const char *home)
{
    tu_saved_env saved[3] = {tu_env_save("IHA_CACHE_DIR"), tu_env_save("XDG_CACHE_HOME"), tu_env_save("HOME")};
    const char *values[3] = {iha_cache_dir, xdg, home};
    for (int i = 0; i < 3; i++) {
        if (values[i])
            setenv(saved[i].name, values[i], 1);
        else
            unsetenv(saved[i].name);
    }
    iha_context *ctx = NULL;
    char message[1024] = "";
    iha_status st = tu_context_create_at(&ctx, (tu_places){.cache_dir = option}, message, sizeof message);
    for (int i = 0; i < 3; i++)
        tu_env_restore(&saved[i]);
    if (st != IHA_OK)
        fail_msg("iha_context_create: %s: %s", iha_status_name(st), message);
    tu_check_small_forward(ctx, TU_API_DEVICE);
    iha_context_free(ctx);
}

static void disk_cache_off_writes_nothing(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char env_dir[4096], xdg[4096], home[4096];
    tu_temp_dir(env_dir, sizeof env_dir);
    tu_temp_dir(xdg, sizeof xdg);
    tu_temp_dir(home, sizeof home);
    run_with_env("off", env_dir, xdg, home); /* the option wins over the environment */
    run_with_env(NULL, "off", xdg, home);    /* IHA_CACHE_DIR=off */
    assert_int_equal(count_files(env_dir), 0);
    assert_int_equal(count_files(xdg), 0);
    assert_int_equal(count_files(home), 0);
    tu_remove_tree(env_dir);
    tu_remove_tree(xdg);
    tu_remove_tree(home);
}

/* "off" in any case, as the option and in IHA_CACHE_DIR (and IHA_PROFILE): no directory named
 * after it appears where the process runs, nor anywhere else. */
static void disk_cache_off_in_any_case(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char cwd[4096], here[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    tu_temp_dir(here, sizeof here);
    assert_int_equal(chdir(here), 0);
    tu_saved_env profile = tu_env_save("IHA_PROFILE");
    setenv("IHA_PROFILE", "Off", 1);
    run_with_env("OFF", NULL, here, here);
    run_with_env(NULL, "Off", here, here);
    run_with_env(NULL, "oFF", here, here);
    tu_env_restore(&profile);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(count_files(here), 0);
    tu_remove_tree(here);
}

static void disk_cache_location_defaults(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char env_dir[4096], option_dir[4096], xdg[4096], home[4096], path[4200];
    tu_temp_dir(env_dir, sizeof env_dir);
    tu_temp_dir(option_dir, sizeof option_dir);
    tu_temp_dir(xdg, sizeof xdg);
    tu_temp_dir(home, sizeof home);

    /* The option overrides IHA_CACHE_DIR. */
    run_with_env(option_dir, env_dir, xdg, home);
    assert_true(count_files(option_dir) > 0);
    assert_int_equal(count_files(env_dir), 0);
    /* IHA_CACHE_DIR, then $XDG_CACHE_HOME/iha, then ~/.cache/iha. */
    run_with_env(NULL, env_dir, xdg, home);
    assert_true(count_files(env_dir) > 0);
    assert_int_equal(count_files(xdg) + count_files(home), 0);
    run_with_env(NULL, NULL, xdg, home);
    snprintf(path, sizeof path, "%s/iha", xdg);
    assert_true(count_files(path) > 0);
    assert_int_equal(count_files(xdg), count_files(path));
    assert_int_equal(count_files(home), 0);
    run_with_env(NULL, NULL, NULL, home);
    snprintf(path, sizeof path, "%s/.cache/iha", home);
    assert_true(count_files(path) > 0);
    assert_int_equal(count_files(home), count_files(path));

    tu_remove_tree(env_dir);
    tu_remove_tree(option_dir);
    tu_remove_tree(xdg);
    tu_remove_tree(home);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kernel_dir_from_source_tree),
        cmocka_unit_test(broken_kernel_source_reports_build_log),
        cmocka_unit_test(disk_cache_survives_corruption),
        cmocka_unit_test(disk_cache_off_writes_nothing),
        cmocka_unit_test(disk_cache_off_in_any_case),
        cmocka_unit_test(disk_cache_location_defaults),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
