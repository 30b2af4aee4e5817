/*
 * test_disk_cache_trust.c - the program cache's trust model (disk_cache.h): what the library
 * asks of the cache directory, and what one bad entry may cost.
 *   - a cache directory that its group or others may write is not used (nothing is written to
 *     it, and the profile says why); one that the library makes is this user's alone, whatever
 *     the umask;
 *   - an entry forged with its checksum fixed up (a byte of PoCL's program.bc or of a kernel
 *     object flipped) may fail the one process that loads it, never a later one, with PoCL's
 *     own cache fresh so that the forged files are all PoCL has.
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

#include "reliability.h"
#include "runtime/disk_cache.h"
#include "runtime/pocl_binary.h"
#include "test_layer.h"
#include "test_util.h"

/* ---- The cache directory ---- */

/* A directory of mode 0777: a context over it runs right, writes nothing there, and its profile
 * names the reason; at 0700 the same directory is used again. */
static void cache_dir_writable_by_others_is_refused(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char cache[4096];
    tu_temp_dir(cache, sizeof cache);
    assert_int_equal(chmod(cache, 0777), 0);
    iha_context *ctx = rel_open_with(cache, NULL);
    rel_check_small(ctx, TU_API_HOST);
    const iha_attention_options o = rel_small_options();
    tu_assert_profile_refused(ctx, &rel_small, &o, "writable by its group or others (mode 0777)");
    iha_context_free(ctx);
    const rel_cache_census refused = rel_cache_scan(cache);
    assert_int_equal(refused.valid + refused.broken + refused.temporary + refused.other, 0);

    assert_int_equal(chmod(cache, 0700), 0);
    rel_check_small_with(cache, TU_API_HOST);
    assert_true(rel_cache_scan(cache).valid > 0);
    tu_remove_tree(cache);
}

/* The directory the cache makes for itself, under a umask that would leave it group-writable,
 * is this user's alone; so the next context uses it. */
static void made_cache_dir_is_private(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char parent[4096], cache[4200];
    tu_temp_dir(parent, sizeof parent);
    snprintf(cache, sizeof cache, "%s/made/cache", parent);
    const mode_t saved = umask(002);
    const int made = iha__mkdir_p(cache);
    umask(saved);
    assert_int_equal(made, 0);
    struct stat st;
    assert_int_equal(stat(cache, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    rel_check_small_with(cache, TU_API_HOST);
    assert_true(rel_cache_scan(cache).valid > 0);
    tu_remove_tree(parent);
}

/* ---- A forged entry ---- */

typedef struct forgery {
    const char *needle; /* bytes whose first one is flipped: the start of a file in the binary */
    size_t length;
    int done;
} forgery;

/* Flips the first byte of every copy of the needle in the first PoCL entry holding it (each of
 * its kernel objects: the small layer may launch any one), keeping the binary well-formed and
 * the entry's checksum right: what the library's checks cannot tell apart. */
static void forge_entry(const char *dir, unsigned long long key, unsigned char *b, size_t n, void *arg)
{
    forgery *f = arg;
    if (f->done || n < 8 || memcmp(b, "poclbin", 8) != 0)
        return;
    for (size_t i = 0; i + f->length <= n; ++i) {
        if (memcmp(b + i, f->needle, f->length) == 0) {
            b[i] ^= 1;
            f->done = 1;
        }
    }
    if (!f->done)
        return;
    assert_true(iha__binary_loadable(b, n));
    assert_int_equal(iha__disk_cache_write(dir, key, b, n), 0);
}

/* The child of forged_entry_fails_one_process: the small layer over `cache`, then the context
 * freed, as a program would. */
static int forged_child(const char *cache)
{
    iha_context *ctx = rel_open_with(cache, NULL);
    const int rc = rel_child_small_layer(ctx);
    iha_context_free(ctx);
    return rc;
}

static void forged_entry_fails_one_process(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const struct {
        const char *what, *needle;
    } files[] = {{"program.bc", "BC\xc0\xde"}, {"a kernel object", "\x7f" "ELF"}};
    const char *pocl_env = getenv("POCL_CACHE_DIR");
    char *saved = pocl_env ? strdup(pocl_env) : NULL;
    for (size_t k = 0; k < sizeof files / sizeof files[0]; ++k) {
        char cache[4096], pocl[4096];
        rel_fill_cache(cache, sizeof cache);
        forgery f = {files[k].needle, strlen(files[k].needle), 0};
        rel_for_each_entry(cache, forge_entry, &f);
        if (!f.done) {
            print_message("no PoCL binary holds %s (another driver): nothing to check\n", files[k].what);
            tu_remove_tree(cache);
            continue;
        }
        tu_temp_dir(pocl, sizeof pocl);
        setenv("POCL_CACHE_DIR", pocl, 1); /* the children's PoCL starts with nothing cached */
        const char *args[] = {"--forged-child", cache, NULL};
        const int first = rel_wait(rel_spawn_self(args));
        print_message("%s forged: the process that loaded it exited with %d\n", files[k].what, first);
        for (int run = 1; run <= 2; ++run) {
            const int rc = rel_wait(rel_spawn_self(args));
            if (rc != 0)
                fail_msg("%s forged: process %d after the one that loaded it exited with %d", files[k].what, run, rc);
        }
        assert_true(rel_cache_scan(cache).valid > 0);
        tu_remove_tree(cache);
        tu_remove_tree(pocl);
    }
    if (saved)
        setenv("POCL_CACHE_DIR", saved, 1);
    else
        unsetenv("POCL_CACHE_DIR");
    free(saved);
}

int main(int argc, char **argv)
{
    tu_init_environment(); /* before a child's work too */
    if (argc == 3 && strcmp(argv[1], "--forged-child") == 0)
        return forged_child(argv[2]);
    if (argc == 2 && strcmp(argv[1], "--exit-child") == 0)
        return 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cache_dir_writable_by_others_is_refused),
        cmocka_unit_test(made_cache_dir_is_private),
        cmocka_unit_test(forged_entry_fails_one_process),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
