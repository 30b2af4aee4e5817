/* Built OpenCL programs: an in-memory cache per context, backed by the on-disk cache
 * (disk_cache.h). A program is identified by its source file in cl/ and its build options. */
#ifndef IHA_RUNTIME_PROGRAM_H
#define IHA_RUNTIME_PROGRAM_H
#include <stddef.h>
#include <stdint.h>

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include "iha.h"

/* The most kernels one program hands out: cl/convert.cl has six (two storages each converted
 * both ways, and a GEMV for each). */
#define IHA_PROGRAM_MAX_KERNELS 8

typedef struct iha_program_entry {
    uint64_t key;   /* disk-cache key: source, options, device, driver, platform, library version */
    char *file;
    char *options;
    cl_program program;
    int on_disk;    /* loaded from or already written to the disk cache */
    char *marker;   /* loaded from disk and not yet proven by a finished queue: the load marker
                       (disk_cache.h) that stays until then, NULL otherwise */
    int launched;   /* a kernel of it was handed out, so PoCL has compiled machine code */
    int candidate;  /* first built by a tuning search: not written to the disk cache, where
                       asking PoCL for the binary compiles every kernel of the program, which for
                       a search's many candidates would overrun its budget */
    size_t kernel_count;
    char *kernel_names[IHA_PROGRAM_MAX_KERNELS];
    cl_kernel kernels[IHA_PROGRAM_MAX_KERNELS];
} iha_program_entry;

typedef struct iha_program_cache {
    iha_program_entry *entries;
    size_t count, capacity;
    int candidates; /* set while a tuning search runs: the programs built meanwhile are candidates */
} iha_program_cache;

struct iha_context;

/* The kernel `name` of cl/`file` built with `options` (e.g. "-DHEAD_DIM=64"), built or loaded
 * on first use. The kernel is owned by the context; do not release it. */
iha_status iha__kernel_get(struct iha_context *ctx, const char *file, const char *options, const char *name,
                           cl_kernel *out);
/* Removes the load markers of programs loaded from disk, after waiting for the queue: PoCL
 * opens a loaded binary's kernel objects only at their first launch, where a damaged one aborts
 * the process, so a load is proven only by a finished queue. Every call ends with it; it waits
 * only when a marker is pending. */
void iha__program_cache_end_loads(struct iha_context *ctx);
/* iha__program_cache_end_loads, then writes the binaries of launched programs that are not on
 * disk yet. It waits for the queue: PoCL compiles machine code at the first launch, and a binary
 * taken earlier would have to be compiled again by the next process. Not at the end of a call:
 * PoCL serialises a program by compiling every kernel in it once more for any work-group size,
 * which costs about as much as the first launch did, so the call that built a program would pay
 * for it twice. iha_context_trim and iha_context_free write them. No-op when the disk cache is
 * off; binaries are not fetched where the process's limits leave no room (headroom.h). Failures
 * to write are ignored: the cache is an optimisation. */
void iha__program_cache_flush(struct iha_context *ctx);
/* Releases the programs; load markers not yet removed stay on disk (a queue that never finished
 * proves nothing) for the next context's tidy-up. */
void iha__program_cache_release(iha_program_cache *cache);
#endif
