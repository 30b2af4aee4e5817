/*
 * reliability.h - helpers of the fault and concurrency tests (test_faults.c, test_disk_cache.c,
 * test_pocl_binary.c, test_threads.c, test_small_shapes.c): a count of the OpenCL objects alive
 * in a context, a check of every entry of a program cache directory, child processes that re-run
 * the test binary itself with other arguments, and the small layer the fault tests run.
 * Include after <cmocka.h> and test_util.h.
 */
#ifndef IHA_TESTS_RELIABILITY_H
#define IHA_TESTS_RELIABILITY_H

#include <stddef.h>
#include <sys/types.h>

#include "iha.h"
#include "test_layer.h"

/* CL_CONTEXT_REFERENCE_COUNT. PoCL counts a reference for every buffer, queue, program and
 * kernel of the context, so on PoCL an unchanged count means no OpenCL object was leaked. */
unsigned rel_context_refs(cl_context context);
/* The count once it has settled: PoCL drops the references its finished commands hold from its
 * worker threads a moment after clFinish returns, so a count read at once can still include
 * them (seen under load). _settled waits up to 2 s for the count to fall to `want`; _quiet
 * returns it once two reads 20 ms apart agree (at most 1 s), for a baseline to compare with. */
unsigned rel_context_refs_settled(cl_context context, unsigned want);
unsigned rel_context_refs_quiet(cl_context context);
/* Nonzero on platforms whose objects retain their context (PoCL), where counts are exact. */
int rel_refs_count_objects(iha_context *ctx);

/* What a program cache directory holds: well-formed entries (magic, key matching the file
 * name, length and checksum), broken ones, leftover temporary files, and anything else. */
typedef struct rel_cache_census {
    size_t valid, broken, temporary, other;
} rel_cache_census;
rel_cache_census rel_cache_scan(const char *dir);

/* Starts this test binary again (/proc/self/exe) with argv[1..] = args (NULL-terminated) and
 * returns its pid; fails the test when it cannot. */
pid_t rel_spawn_self(const char *const *args);
/* Waits for pid; returns its exit status, or 128 + signal when it was killed. */
int rel_wait(pid_t pid);

/* ---- The small layer of the fault tests ---- */

/* A small layer with every stage in use: P > 1, rotary (rel_small_options), a window, odd sizes. */
extern const iha_shape rel_small;
iha_attention_options rel_small_options(void);
/* A context over the program cache directory cache_dir and the kernel sources of kernel_dir
 * (either NULL: the defaults); fails the test when it cannot be created. */
iha_context *rel_open_with(const char *cache_dir, const char *kernel_dir);
/* Runs the small layer on ctx through `api` and checks every element of z. */
void rel_check_small(iha_context *ctx, tu_api api);
/* rel_check_small on a context of its own over the cache directory `cache`. */
void rel_check_small_with(const char *cache, tu_api api);
/* A fresh cache directory (its path in cache) that one small layer has filled with entries; skips
 * the test when there is no device. */
void rel_fill_cache(char *cache, size_t capacity);
/* Fails the test unless the context's message contains needle. */
void rel_expect_message(iha_context *ctx, const char *needle);
/* For a child process, which reports by its exit status rather than by assertions: the small
 * layer through iha_forward_host on ctx into a NaN-filled z. Returns the call's status; *right
 * says whether z is finite and within the float32 tolerance, *untouched whether it is all NaN
 * still. */
iha_status rel_child_run_small(iha_context *ctx, int *right, int *untouched);
/* rel_child_run_small as an exit status: 0 when the call succeeded and z is right, else 1 after
 * printing the status. */
int rel_child_small_layer(iha_context *ctx);

/* ---- Files and processes ---- */

/* Calls fn for every whole entry (16 hex digits and ".clbin") below the program cache
 * directory `cache`, with the entry's directory and key and its n bytes as the disk cache's
 * reader returns them (the test fails when it cannot read them); fn may change the bytes, which
 * are freed after it returns. */
typedef void (*rel_entry_fn)(const char *dir, unsigned long long key, unsigned char *bytes, size_t n, void *arg);
void rel_for_each_entry(const char *cache, rel_entry_fn fn, void *arg);

/* The pid of a process that has exited (and been reaped): this binary run with "--exit-child",
 * which its main must answer by returning 0. */
long rel_dead_pid(void);
/* Creates an empty file; fails the test when it cannot. */
void rel_touch_file(const char *path);
/* The file's size in bytes, -1 when it does not exist. */
long rel_file_size(const char *path);

#endif /* IHA_TESTS_RELIABILITY_H */
