/*
 * test_pocl_binary.c - PoCL binaries with an empty record (content or name) in a valid cache
 * entry, which PoCL aborts on (src/runtime/pocl_binary.c): later processes run right and the
 * entries are rewritten; the binary check refuses every malformed variant.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "reliability.h"
#include "runtime/disk_cache.h"
#include "runtime/pocl_binary.h"
#include "test_layer.h"
#include "test_util.h"

/* ---- PoCL binaries with an empty record ---- */

/* The PoCL binary inside a cache entry file: where its records are. */
typedef struct pocl_layout {
    size_t first_kernel;  /* offset of the first kernel struct */
    size_t first_record;  /* offset of that kernel's first file record ("<name>.so"), or 0 */
} pocl_layout;

static uint64_t le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Version 9 to 12 of PoCL's layout (pocl_binary.c), root entries and no program-scope field. */
static int pocl_find(const unsigned char *b, size_t n, pocl_layout *out)
{
    if (n < 77 || memcmp(b, "poclbin", 8) != 0)
        return 0;
    size_t at = 77;
    if (le(b + 16, 4) >= 10 && (le(b + 24, 8) & 2))
        at += 8;
    for (uint64_t r = le(b + 32, 4); r > 0; r--)
        at += 8 + (size_t)le(b + at, 8);
    out->first_kernel = at;
    const uint64_t size = le(b + at, 8), binaries = le(b + at + 8, 8);
    out->first_record = binaries ? at + (size_t)(size - binaries) : 0;
    return at + size <= n;
}

typedef enum { EMPTY_CONTENT, EMPTY_NAME } record_fault;

/* Empties the content (or the name) of the first kernel's first file record in a PoCL binary,
 * keeping the kernel's sizes consistent: what clGetProgramInfo hands out while another process
 * rewrites the .so that PoCL serialises. Returns the new length, 0 when there is no such record. */
static size_t empty_record(unsigned char *b, size_t n, record_fault fault)
{
    pocl_layout l;
    if (!pocl_find(b, n, &l) || l.first_record == 0)
        return 0;
    const size_t name = (size_t)le(b + l.first_record, 4);
    const size_t field = fault == EMPTY_NAME ? l.first_record : l.first_record + 4 + name;
    const size_t cut = (size_t)le(b + field, 4);
    memmove(b + field + 4, b + field + 4 + cut, n - (field + 4 + cut));
    put_le(b + field, 0, 4);
    put_le(b + l.first_kernel, le(b + l.first_kernel, 8) - cut, 8);
    put_le(b + l.first_kernel + 8, le(b + l.first_kernel + 8, 8) - cut, 8);
    return n - cut;
}

typedef struct record_edit {
    record_fault fault;
    int changed;
} record_edit;

/* For tu_for_each_file: empties a record of every entry that holds a PoCL binary with one,
 * rewriting the entry valid (length and checksum), and counts them. */
static void empty_record_in_entry(const char *dir, unsigned long long key, unsigned char *b, size_t n, void *arg)
{
    record_edit *edit = arg;
    assert_true(iha__binary_loadable(b, n));
    const size_t m = empty_record(b, n, edit->fault);
    if (m != 0) {
        assert_false(iha__binary_loadable(b, m));
        assert_int_equal(iha__disk_cache_write(dir, key, b, m), 0);
        edit->changed++;
    }
}

/* The child of cache_entry_with_an_empty_record: the small layer with the cache in `cache` and
 * PoCL's own cache in `pocl_cache` (PoCL unpacks a loaded binary there, so a bad one must not
 * reach the suite's shared PoCL cache). Exit status 0 when z is right. */
static int load_child(const char *cache, const char *pocl_cache)
{
    setenv("POCL_CACHE_DIR", pocl_cache, 1);
    iha_context *ctx = rel_open_with(cache, NULL);
    const int rc = rel_child_small_layer(ctx);
    iha_context_free(ctx);
    return rc;
}

/* Entries whose PoCL binary has a kernel file record with empty content (PoCL unpacks it as an
 * empty .so into its own cache, where dlopen fails and PoCL aborts in this and every later
 * process) or with an empty name (PoCL's assertion `len > 0` aborts): the next process and the
 * ones after it run right, and the entries are rewritten loadable. */
static void cache_entry_with_an_empty_record(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const record_fault faults[2] = {EMPTY_CONTENT, EMPTY_NAME};
    for (int f = 0; f < 2; f++) {
        char cache[4096], pocl[4096];
        rel_fill_cache(cache, sizeof cache);
        tu_temp_dir(pocl, sizeof pocl);
        record_edit edit = {faults[f], 0};
        rel_for_each_entry(cache, empty_record_in_entry, &edit);
        if (edit.changed == 0) {
            print_message("no PoCL binaries with kernel files in the cache (another driver): nothing to check\n");
            tu_remove_tree(cache);
            tu_remove_tree(pocl);
            return;
        }
        for (int run = 0; run < 2; run++) {
            const char *args[] = {"--load-child", cache, pocl, NULL};
            const int rc = rel_wait(rel_spawn_self(args));
            if (rc != 0)
                fail_msg("%s record: process %d after the bad entries exited with %d",
                         f == 0 ? "an empty content" : "an empty name", run + 1, rc);
        }
        record_edit again = {faults[f], 0};
        rel_for_each_entry(cache, empty_record_in_entry, &again); /* counts the rewritten ones */
        assert_int_equal(again.changed, edit.changed);
        tu_remove_tree(cache);
        tu_remove_tree(pocl);
    }
}

/* The binary check itself: every entry a layer wrote passes; one byte less or more, a record
 * emptied, or an unknown layout version does not. */
static void check_entry_variants(const char *dir, unsigned long long key, unsigned char *b, size_t n, void *arg)
{
    (void)dir, (void)key;
    assert_true(iha__binary_loadable(b, n));
    if (memcmp(b, "poclbin", 8) == 0) {
        unsigned char *c = tu_malloc(n + 1);
        memcpy(c, b, n);
        c[n] = 0;
        assert_false(iha__binary_loadable(c, n - 1));
        assert_false(iha__binary_loadable(c, n + 1));
        put_le(c + 16, 99, 4);
        assert_false(iha__binary_loadable(c, n));
        for (int f = 0; f < 2; f++) {
            memcpy(c, b, n);
            const size_t m = empty_record(c, n, (record_fault)f);
            if (m)
                assert_false(iha__binary_loadable(c, m));
        }
        free(c);
        ++*(int *)arg;
    }
}

static void binary_check_refuses_malformed_records(void **state)
{
    (void)state;
    char cache[4096];
    rel_fill_cache(cache, sizeof cache);
    int checked = 0;
    rel_for_each_entry(cache, check_entry_variants, &checked);
    print_message("%d PoCL binaries checked\n", checked);
    tu_remove_tree(cache);
}

int main(int argc, char **argv)
{
    tu_init_environment(); /* before a child's work too */
    if (argc == 4 && strcmp(argv[1], "--load-child") == 0)
        return load_child(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cache_entry_with_an_empty_record),
        cmocka_unit_test(binary_check_refuses_malformed_records),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
