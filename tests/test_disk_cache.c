/*
 * test_disk_cache.c - the fault paths of the on-disk program cache (src/runtime/disk_cache.c):
 * the layer runs right and nothing is left half-written.
 *   - a program cache directory that cannot be created (its parent is a regular file: chmod
 *     does not stop root, which CI runs as): the layer still runs; and a full disk
 *     (RLIMIT_FSIZE in a child process, so writes stop mid-entry): the writer leaves nothing
 *     half-written, and a layer that PoCL can no longer compile fails with a clear status;
 *   - cache entries cut at every boundary of their layout (as by a writer that died mid-write
 *     on a file system without atomic rename); a dead writer's temporary file beside them is
 *     removed, a live writer's kept; entries whose PoCL binary cannot be loaded are rebuilt;
 *   - an entry whose load marker outlived its process is retired;
 *   - a FIFO in the place of an entry and of the profile: nothing waits on it;
 *   - an address-space limit that leaves no room for fetching binaries: the cache is skipped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "reliability.h"
#include "runtime/disk_cache.h"
#include "runtime/pocl_binary.h"
#include "test_layer.h"
#include "test_util.h"

/* ---- The program cache directory ---- */

/* cache_dir below a regular file: no directory can be made there, by root either. */
static void cache_dir_cannot_be_created(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[4096], file[4200], cache[4300];
    tu_temp_path(dir, sizeof dir, file, sizeof file, "file");
    FILE *f = fopen(file, "wb");
    assert_non_null(f);
    assert_true(fputs("not a directory\n", f) >= 0);
    assert_int_equal(fclose(f), 0);
    snprintf(cache, sizeof cache, "%s/sub/iha", file);
    for (int i = 0; i < 2; i++) {
        iha_context *ctx = rel_open_with(cache, NULL);
        rel_check_small(ctx, TU_API_DEVICE);
        rel_check_small(ctx, TU_API_HOST);
        iha_context_free(ctx);
    }
    assert_int_equal(rel_file_size(file), 16);
    assert_int_equal(tu_for_each_file(dir, NULL, NULL), 1);
    tu_remove_tree(dir);
}

/* The child of cache_dir_full, where writes stop at `limit` bytes per file (SIGXFSZ ignored,
 * so a write fails with EFBIG):
 *  1. the disk cache's writer alone, on an entry longer than the limit: it fails and leaves
 *     nothing;
 *  2. a layer with the cache in `cache`. PoCL writes each program's source to a file of its
 *     own before it compiles (even when its own cache has the binary), so on a full disk it
 *     cannot build: then the call must fail with a status and a message and leave z alone. If
 *     it runs, z must be right.
 * Returns the exit status: 0 when all holds. */
static int cache_full_child(const char *cache, long limit)
{
    signal(SIGXFSZ, SIG_IGN);
    /* NVIDIA's driver keeps a compute cache of its own (~/.nv/ComputeCache) and, when a write
     * there fails, ends the process with status 1 without a word. That cache is the driver's,
     * not the library's, whose writer this child tests. */
    setenv("CUDA_CACHE_DISABLE", "1", 1);
    struct rlimit r;
    if (getrlimit(RLIMIT_FSIZE, &r) != 0)
        return 3;
    r.rlim_cur = (rlim_t)limit;
    if (setrlimit(RLIMIT_FSIZE, &r) != 0)
        return 3;
    const size_t size = limit > 0 ? (size_t)limit : 100000; /* with the header, always too long */
    unsigned char *binary = tu_malloc(size);
    memset(binary, 0x5a, size);
    const int written = iha__disk_cache_write(cache, 0x0123456789abcdefULL, binary, size);
    free(binary);
    rel_cache_census c = rel_cache_scan(cache);
    if (written != -1 || c.valid + c.broken + c.temporary + c.other != 0) {
        fprintf(stderr, "cache-full child: the writer returned %d and left %zu files\n", written,
                c.valid + c.broken + c.temporary + c.other);
        return 4;
    }

    iha_context *ctx = NULL;
    char message[1024] = "";
    if (tu_context_create_at(&ctx, (tu_places){.cache_dir = cache}, message, sizeof message) != IHA_OK) {
        printf("full disk: no context: %s\n", message);
        return message[0] ? 0 : 5;
    }
    int right, untouched;
    const iha_status st = rel_child_run_small(ctx, &right, &untouched);
    const int rc = st == IHA_OK ? (right ? 0 : 6) : (iha_context_message(ctx)[0] && untouched ? 0 : 7);
    printf("full disk (files limited to %ld bytes): %s%s%s\n", limit, iha_status_name(st), st ? ": " : "",
           iha_context_message(ctx));
    iha_context_free(ctx); /* writes the entries, or fails to */
    return rc;
}

/* A disk that fills up: room for 40 bytes per file (an entry's header fits, its binary not),
 * and for nothing. The child gives a clear outcome, no entry stays behind, and once there is
 * space again the next process fills the cache with whole entries. (With room for most files
 * but not all, PoCL's LLVM ends the process itself: "LLVM ERROR: IO failure on output stream";
 * the writer's behaviour there is what step 1 of the child checks.) */
static void cache_dir_full(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const char *limits[] = {"40", "0"};
    for (int i = 0; i < 2; i++) {
        char cache[4096];
        tu_temp_dir(cache, sizeof cache);
        const char *args[] = {"--cache-full-child", cache, limits[i], NULL};
        int rc = rel_wait(rel_spawn_self(args));
        if (rc != 0)
            fail_msg("the child with files limited to %s bytes exited with %d", limits[i], rc);
        rel_cache_census c = rel_cache_scan(cache);
        if (c.valid + c.broken + c.temporary != 0)
            fail_msg("files limited to %s bytes: %zu valid, %zu broken and %zu temporary entries", limits[i], c.valid,
                     c.broken, c.temporary);
        rel_check_small_with(cache, TU_API_HOST);
        c = rel_cache_scan(cache);
        assert_true(c.valid > 0);
        assert_int_equal(c.broken + c.temporary, 0);
        tu_remove_tree(cache);
    }
}

/* ---- Entries cut mid-write ---- */

typedef struct saved_entry {
    char path[4200];
    unsigned char *bytes;
    long size;
} saved_entry;

typedef struct saved_entries {
    saved_entry items[64];
    size_t count;
} saved_entries;

static void save_entry(const char *path, void *arg)
{
    saved_entries *s = arg;
    if (!strstr(path, ".clbin") || s->count == 64)
        return;
    saved_entry *e = &s->items[s->count++];
    snprintf(e->path, sizeof e->path, "%s", path);
    e->size = rel_file_size(path);
    e->bytes = tu_malloc((size_t)e->size);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(e->bytes, 1, (size_t)e->size, f), (size_t)e->size);
    fclose(f);
}

static void write_prefix(const saved_entry *e, long length)
{
    FILE *f = fopen(e->path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(e->bytes, 1, (size_t)length, f), (size_t)length);
    assert_int_equal(fclose(f), 0);
}

/* Every entry cut to the same length, at each boundary of "magic | key | length | checksum |
 * binary" and one byte short of whole: each run rebuilds, is right, and writes whole entries
 * again. A dead writer's partial temporary file beside them is removed, a live writer's kept. */
static void cache_entries_cut_mid_write(void **state)
{
    (void)state;
    char cache[4096];
    rel_fill_cache(cache, sizeof cache);
    saved_entries saved = {.count = 0};
    tu_for_each_file(cache, save_entry, &saved);
    assert_true(saved.count > 0);

    /* A dead writer's partial temporary file, and a live one's (this process's). */
    saved_entry dead = saved.items[0], live = saved.items[0];
    int n = snprintf(dead.path, sizeof dead.path, "%s.tmp.%ld.1.2", saved.items[0].path, rel_dead_pid());
    assert_true(n > 0 && (size_t)n < sizeof dead.path);
    write_prefix(&dead, dead.size / 2);
    n = snprintf(live.path, sizeof live.path, "%s.tmp.%ld.1.2", saved.items[0].path, (long)getpid());
    assert_true(n > 0 && (size_t)n < sizeof live.path);
    write_prefix(&live, live.size / 3);

    const long cuts[] = {0, 1, 7, 8, 15, 16, 24, 31, 32, 33, -1};
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
        for (size_t i = 0; i < saved.count; i++)
            write_prefix(&saved.items[i], cuts[c] >= 0 ? cuts[c] : saved.items[i].size - 1);
        rel_check_small_with(cache, TU_API_DEVICE);
        /* Whole means valid (magic, key, length and checksum), not the first size: a rebuilt
         * binary can differ in size from the first (PoCL's binary of a program carries what its
         * cache, shared by the suite's processes, has compiled for it by then). */
        const rel_cache_census after = rel_cache_scan(cache);
        if (after.valid != saved.count || after.broken != 0)
            fail_msg("cut at %ld: %zu valid and %zu broken entries, not %zu whole ones", cuts[c], after.valid,
                     after.broken, saved.count);
        for (size_t i = 0; i < saved.count; i++)
            if (rel_file_size(saved.items[i].path) <= (cuts[c] >= 0 ? cuts[c] : saved.items[i].size - 1))
                fail_msg("cut at %ld: %s was not rewritten (%ld bytes)", cuts[c], saved.items[i].path,
                         rel_file_size(saved.items[i].path));
    }
    rel_cache_census census = rel_cache_scan(cache);
    assert_int_equal(census.valid, saved.count);
    assert_int_equal(census.broken, 0);
    assert_int_equal(census.temporary, 1); /* the live writer's; the dead one's is removed */
    assert_int_equal(rel_file_size(dead.path), -1);
    assert_int_equal(rel_file_size(live.path), live.size / 3);
    for (size_t i = 0; i < saved.count; i++)
        free(saved.items[i].bytes);
    tu_remove_tree(cache);
}

/* Empties the program.bc record of a PoCL binary in the entry at path, keeping the entry itself
 * valid (length and checksum rewritten): what clGetProgramInfo can return while another
 * process rewrites PoCL's cache. Counts the entries changed in *arg. */
static void empty_program_bc(const char *dir, unsigned long long key, unsigned char *b, size_t n, void *arg)
{
    static const char record[] = "/program.bc";
    const size_t rl = sizeof record - 1;
    for (size_t i = 4; n >= 8 && memcmp(b, "poclbin", 8) == 0 && i + rl + 4 <= n && i < 512; ++i) {
        if (memcmp(b + i, record, rl) != 0)
            continue;
        unsigned char *len = b + i + rl;
        const size_t content = (size_t)len[0] | (size_t)len[1] << 8 | (size_t)len[2] << 16 | (size_t)len[3] << 24;
        memmove(len + 4, len + 4 + content, n - (size_t)(len + 4 + content - b));
        n -= content;
        memset(len, 0, 4);
        assert_false(iha__binary_loadable(b, n));
        assert_int_equal(iha__disk_cache_write(dir, key, b, n), 0);
        ++*(int *)arg;
        break;
    }
}

/* Entries whose PoCL binary has an empty program.bc (PoCL asserts and aborts the process when it
 * loads one): the next process rebuilds those programs from source instead of loading them, its
 * results are right, and it writes loadable entries in their place. */
static void cache_entry_pocl_cannot_load(void **state)
{
    (void)state;
    char cache[4096];
    rel_fill_cache(cache, sizeof cache);
    int emptied = 0;
    rel_for_each_entry(cache, empty_program_bc, &emptied);
    if (emptied == 0) {
        print_message("no PoCL binaries in the cache (another driver): nothing to check\n");
        tu_remove_tree(cache);
        return;
    }
    rel_check_small_with(cache, TU_API_DEVICE);
    int still_empty = 0;
    rel_for_each_entry(cache, empty_program_bc, &still_empty); /* empties them again: count only */
    assert_int_equal(still_empty, emptied);                  /* each one had been rewritten whole */
    tu_remove_tree(cache);
}

/* ---- A process that died while the driver loaded an entry ---- */

/* Dates a file back to 2001 (plain mtime, whole seconds): a file written later is newer. */
static void date_back(const char *path)
{
    const struct timespec times[2] = {{1000000000, 0}, {1000000000, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
}

static time_t mtime_of(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_mtime;
}

typedef struct first_entry {
    char path[4200];
} first_entry;

static void take_first_entry(const char *path, void *arg)
{
    first_entry *e = arg;
    const char *name = strrchr(path, '/') + 1;
    if (e->path[0] == '\0' && strlen(name) == 22 && strcmp(name + 16, ".clbin") == 0)
        snprintf(e->path, sizeof e->path, "%s", path);
}

/* The first program entry found under cache; fails the test when there is none. */
static first_entry first_entry_of(const char *cache)
{
    first_entry e = {""};
    tu_for_each_file(cache, take_first_entry, &e);
    assert_true(e.path[0] != '\0');
    return e;
}

/* A load marker left by a process that died (PoCL aborted it, say) retires its entry, which the
 * next run rebuilds and writes anew; a marker of a live process leaves its entry alone. */
static void entry_of_a_dead_loader_is_retired(void **state)
{
    (void)state;
    char cache[4096], dead[4300], live[4300];
    rel_fill_cache(cache, sizeof cache);
    const first_entry e = first_entry_of(cache);
    date_back(e.path);
    snprintf(dead, sizeof dead, "%s.loading.%ld.1", e.path, rel_dead_pid());
    rel_touch_file(dead);
    rel_check_small_with(cache, TU_API_DEVICE);
    assert_int_equal(rel_file_size(dead), -1);
    assert_true(mtime_of(e.path) > 1000000000); /* rebuilt and written anew */
    const rel_cache_census c = rel_cache_scan(cache);
    assert_int_equal(c.broken + c.temporary + c.other, 0);

    date_back(e.path);
    snprintf(live, sizeof live, "%s.loading.%ld.1", e.path, (long)getpid());
    rel_touch_file(live);
    rel_check_small_with(cache, TU_API_DEVICE);
    assert_int_equal(mtime_of(e.path), 1000000000); /* loaded, untouched */
    assert_int_equal(rel_file_size(live), 0);
    tu_remove_tree(cache);
}

/* The tidy-up removes only names the library makes, whole: a user's files in the cache
 * directory that merely hold ".tmp.<digits>" or ".loading." (a dead pid's, dated back past
 * IHA_STALE_SECONDS) stay, and so does the entry such a lookalike names. */
static void tidy_keeps_files_not_ours(void **state)
{
    (void)state;
    char cache[4096], dir[4200];
    rel_fill_cache(cache, sizeof cache);
    const first_entry e = first_entry_of(cache);
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(e.path, '/') - e.path), e.path);
    const long dead = rel_dead_pid();
    char names[7][300];
    snprintf(names[0], sizeof names[0], "thesis.tmp.999999.docx");
    snprintf(names[1], sizeof names[1], "backup.tmp.2024.tar");
    snprintf(names[2], sizeof names[2], "notes.tmp.%ld.1.2", dead);
    snprintf(names[3], sizeof names[3], "%s.tmp.%ld.1.2.docx", strrchr(e.path, '/') + 1, dead);
    snprintf(names[4], sizeof names[4], "%s.loading.%ld.1.txt", strrchr(e.path, '/') + 1, dead);
    snprintf(names[5], sizeof names[5], "report.clbin.loading.%ld.1", dead);
    snprintf(names[6], sizeof names[6], "%s.tmp.%ld.1.2", strrchr(e.path, '/') + 1, dead); /* ours */
    char paths[7][4520];
    for (int i = 0; i < 7; ++i) {
        const int n = snprintf(paths[i], sizeof paths[i], "%s/%s", dir, names[i]);
        assert_true(n > 0 && (size_t)n < sizeof paths[i]);
        rel_touch_file(paths[i]);
        date_back(paths[i]);
    }
    date_back(e.path);
    rel_check_small_with(cache, TU_API_DEVICE);
    for (int i = 0; i < 6; ++i)
        if (rel_file_size(paths[i]) != 0) fail_msg("the tidy-up removed %s", names[i]);
    assert_int_equal(rel_file_size(paths[6]), -1);
    assert_int_equal(mtime_of(e.path), 1000000000); /* no lookalike marker retired it */
    tu_remove_tree(cache);
}

/* ---- FIFOs in the place of cache files ---- */

static void fifo_instead(const char *path)
{
    assert_true(unlink(path) == 0 || errno == ENOENT);
    assert_int_equal(mkfifo(path, 0644), 0);
}

/* A FIFO where an entry and where the profile should be: the layer runs (the program is
 * rebuilt and its entry written over the FIFO), the profile is reported as not a regular file,
 * and a tune refuses at once. Nothing may wait on a FIFO: an alarm ends the test if anything
 * does. */
static void fifo_in_place_of_cache_files(void **state)
{
    (void)state;
    char cache[4096], profile[4200];
    rel_fill_cache(cache, sizeof cache);
    const first_entry e = first_entry_of(cache);
    fifo_instead(e.path);
    snprintf(profile, sizeof profile, "%s/profile.json", cache);
    fifo_instead(profile);
    alarm(300);
    const tu_places at = {.cache_dir = cache, .profile = profile};
    iha_context *ctx = NULL;
    char message[1024] = "";
    if (tu_context_create_at(&ctx, at, message, sizeof message) != IHA_OK)
        fail_msg("iha_context_create: %s", message);
    rel_check_small(ctx, TU_API_DEVICE);
    const iha_attention_options o = rel_small_options();
    tu_assert_profile_refused(ctx, &rel_small, &o, "not a regular file");
    iha_context_free(ctx);
    alarm(0);
    struct stat st;
    assert_int_equal(stat(e.path, &st), 0);
    assert_true(S_ISREG(st.st_mode)); /* rewritten whole */
    tu_remove_tree(cache);
}

/* ---- No room for the driver to serialise binaries ---- */

/* The child of binaries_need_address_space: a layer that writes the cache in `full`, then, with
 * RLIMIT_AS 128 MiB above what the process maps (PoCL's serialiser needs a 256 MiB scratch), a
 * layer with the empty cache `limited`. The second must run right and write nothing. */
static int address_space_child(const char *full, const char *limited)
{
    iha_context *ctx = rel_open_with(full, NULL);
    if (rel_child_small_layer(ctx) != 0)
        return 2;
    iha_context_free(ctx);
    ctx = rel_open_with(limited, NULL);
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (f == NULL || fscanf(f, "%llu", &pages) != 1)
        return 3;
    fclose(f);
    struct rlimit r;
    if (getrlimit(RLIMIT_AS, &r) != 0)
        return 3;
    r.rlim_cur = (rlim_t)(pages * (unsigned long long)sysconf(_SC_PAGESIZE) + (128ull << 20));
    if (setrlimit(RLIMIT_AS, &r) != 0)
        return 3;
    const int rc = rel_child_small_layer(ctx);
    iha_context_free(ctx);
    const rel_cache_census c = rel_cache_scan(limited);
    if (c.valid + c.broken + c.temporary != 0)
        return 4;
    return rc;
}

/* Under an address-space limit (ulimit -v) that leaves too little room for fetching program
 * binaries, the disk cache is skipped and the run is right; without the limit the next process
 * writes the cache. */
static void binaries_need_address_space(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char full[4096], limited[4096];
    tu_temp_dir(full, sizeof full);
    tu_temp_dir(limited, sizeof limited);
    const char *args[] = {"--address-space-child", full, limited, NULL};
    const int rc = rel_wait(rel_spawn_self(args));
    if (rc != 0)
        fail_msg("the child under an address-space limit exited with %d", rc);
    iha_context *ctx = rel_open_with(limited, NULL);
    rel_check_small(ctx, TU_API_HOST);
    iha_context_free(ctx);
    assert_true(rel_cache_scan(limited).valid > 0);
    tu_remove_tree(full);
    tu_remove_tree(limited);
}

int main(int argc, char **argv)
{
    tu_init_environment(); /* before a child's work too */
    if (argc == 4 && strcmp(argv[1], "--cache-full-child") == 0)
        return cache_full_child(argv[2], atol(argv[3]));
    if (argc == 4 && strcmp(argv[1], "--address-space-child") == 0)
        return address_space_child(argv[2], argv[3]);
    if (argc == 2 && strcmp(argv[1], "--exit-child") == 0)
        return 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cache_dir_cannot_be_created),
        cmocka_unit_test(cache_dir_full),
        cmocka_unit_test(cache_entries_cut_mid_write),
        cmocka_unit_test(cache_entry_pocl_cannot_load),
        cmocka_unit_test(entry_of_a_dead_loader_is_retired),
        cmocka_unit_test(tidy_keeps_files_not_ours),
        cmocka_unit_test(fifo_in_place_of_cache_files),
        cmocka_unit_test(binaries_need_address_space),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
