/*
 * test_profile_files.c - what the profile's writers and `clear` may touch (src/tune/profile.c):
 * only a regular file that is an iha tuning profile is replaced or removed; a user's JSON, a
 * link, a FIFO or a device node in the profile's place is refused with IHA_ERROR_IO, left as
 * it is and gets no <path>.lock; a replaced profile keeps its mode.
 */
#define _DEFAULT_SOURCE /* mknod, S_IF* */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "test_util.h"
#include "test_profiles.h"
#include "runtime/context.h"
#include "tune/profile.h"
#include "tune/state.h"

static const char user_json[] = "{\"thesis\": \"chapter 1\"}\n";

/* A valid profile of this device with one attention entry at path. */
static void write_profile(const char *path)
{
    static const long cfg[5] = {1, 2, 8, 4, 16};
    cJSON *root = tp_profile_new();
    tp_add_attention(root, "bucket", 0, 0, 64, 64, cfg);
    tp_write_json(root, path);
    cJSON_Delete(root);
}

static int lock_exists(const char *path)
{
    char lock[1200];
    snprintf(lock, sizeof lock, "%s.lock", path);
    return tp_file_exists(lock);
}

static mode_t mode_of(const char *path)
{
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    return st.st_mode;
}

/* iha_profile_clear on a context whose profile path names `path`: refused, path unchanged. */
static void expect_clear_refused(const char *path, mode_t type)
{
    iha_context *ctx = tp_open_with_profile(path, 0);
    tu_assert_status(ctx, iha_profile_clear(ctx), IHA_ERROR_IO);
    assert_non_null(strstr(iha_context_message(ctx), "not"));
    iha_context_free(ctx);
    if ((mode_of(path) & S_IFMT) != type) fail_msg("clear changed or removed %s", path);
    if (lock_exists(path)) fail_msg("clear left %s.lock", path);
}

static void clear_removes_only_profiles(void **state)
{
    (void)state;
    char path[1100], target[1100];
    tp_fresh_path(path, sizeof path, "user.json");
    tp_write_text(path, user_json, strlen(user_json));
    expect_clear_refused(path, S_IFREG);
    char *text = tp_slurp(path);
    assert_string_equal(text, user_json);
    free(text);

    tp_fresh_path(path, sizeof path, "fifo.json");
    assert_int_equal(mkfifo(path, 0644), 0);
    expect_clear_refused(path, S_IFIFO);

    tp_fresh_path(target, sizeof target, "linked.json");
    write_profile(target);
    tp_fresh_path(path, sizeof path, "link.json");
    assert_int_equal(symlink(target, path), 0);
    expect_clear_refused(path, S_IFLNK);
    assert_true(tp_file_exists(target));

    /* A node like /dev/null's, where the process may make one (root): never unlinked. */
    tp_fresh_path(path, sizeof path, "null.json");
    if (mknod(path, S_IFCHR | 0666, makedev(1, 3)) == 0) expect_clear_refused(path, S_IFCHR);

    tp_fresh_path(path, sizeof path, "mine.json");
    write_profile(path);
    iha_context *ctx = tp_open_with_profile(path, 0);
    tu_assert_status(ctx, iha_profile_clear(ctx), IHA_OK);
    iha_context_free(ctx);
    assert_false(tp_file_exists(path));
}

/* A context loaded from a profile at path, with its first entry put back as pending. */
static iha_context *open_with_pending(const char *path)
{
    write_profile(path);
    iha_context *ctx = tp_open_with_profile(path, 0);
    iha_profile *p = &ctx->tune->profile;
    assert_true(p->count > 0);
    iha_profile_entry e = p->entries[0];
    assert_true(iha__profile_put(p, &e));
    return ctx;
}

static void save_replaces_only_profiles_keeping_mode(void **state)
{
    (void)state;
    char path[1100], target[1100];
    tp_fresh_path(path, sizeof path, "save_user.json");
    iha_context *ctx = open_with_pending(path);
    tp_write_text(path, user_json, strlen(user_json));
    tu_assert_status(ctx, iha__profile_save(ctx, &ctx->tune->profile), IHA_ERROR_IO);
    assert_non_null(strstr(iha_context_message(ctx), "not an iha-tuning-profile"));
    iha_context_free(ctx);
    char *text = tp_slurp(path);
    assert_string_equal(text, user_json);
    free(text);

    tp_fresh_path(target, sizeof target, "save_target.json");
    write_profile(target);
    tp_fresh_path(path, sizeof path, "save_link.json");
    ctx = open_with_pending(path);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink(target, path), 0);
    tu_assert_status(ctx, iha__profile_save(ctx, &ctx->tune->profile), IHA_ERROR_IO);
    iha_context_free(ctx);
    assert_true((mode_of(path) & S_IFMT) == S_IFLNK);

    tp_fresh_path(path, sizeof path, "save_private.json");
    ctx = open_with_pending(path);
    assert_int_equal(chmod(path, 0600), 0);
    tu_assert_status(ctx, iha__profile_save(ctx, &ctx->tune->profile), IHA_OK);
    iha_context_free(ctx);
    assert_int_equal(mode_of(path) & 07777, 0600);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(clear_removes_only_profiles),
        cmocka_unit_test(save_replaces_only_profiles_keeping_mode),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tp_group_setup_small, tp_group_teardown);
}
