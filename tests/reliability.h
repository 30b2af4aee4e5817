/*
 * reliability.h - helpers of the fault and concurrency tests (test_faults.c, test_threads.c):
 * a count of the OpenCL objects alive in a context, a check of every entry of a program cache
 * directory, and child processes that re-run the test binary itself with other arguments.
 * Include after <cmocka.h> and test_util.h.
 */
#ifndef IHA_TESTS_RELIABILITY_H
#define IHA_TESTS_RELIABILITY_H

#include <stddef.h>
#include <sys/types.h>

#include "iha.h"

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

#endif /* IHA_TESTS_RELIABILITY_H */
