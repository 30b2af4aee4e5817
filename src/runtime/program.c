/* Building programs from cl/ sources, with an in-memory cache per context and the disk cache. */
#include "runtime/program.h"
#include "common/hash.h"
#include "runtime/context.h"
#include "runtime/disk_cache.h"
#include "runtime/error.h"
#include "runtime/headroom.h"
#include "runtime/kernel_text.h"
#include "runtime/loop_limit.h"
#include "runtime/pocl_binary.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t program_key(const iha_context *ctx, const char *source, const char *options)
{
    uint64_t h = IHA_HASH_SEED;
    h = iha__hash_string(h, source);
    h = iha__hash_string(h, options);
    h = iha__hash_string(h, ctx->identity.device_name);
    h = iha__hash_string(h, ctx->identity.driver_version);
    h = iha__hash_string(h, ctx->identity.platform_version);
    h = iha__hash_string(h, IHA_VERSION_STRING);
    return h;
}

static iha_status build_log_failure(iha_context *ctx, cl_program program, const char *file, const char *options,
                                    cl_int err)
{
    iha__fail(ctx, IHA_ERROR_BUILD, "building cl/%s with options \"%s\" failed: %s (%d); build log:\n", file, options,
              iha__cl_error_name(err), (int)err);
    ctx->cl_error = err;
    size_t size = 0;
    if (clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size) == CL_SUCCESS && size) {
        char *log = malloc(size + 1);
        if (log && clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, size, log, NULL) == CL_SUCCESS) {
            log[size] = '\0';
            iha__message_append(&ctx->message, log);
        }
        free(log);
    }
    return IHA_ERROR_BUILD;
}

/* The driver's program from a binary; NULL when it refuses the binary. */
static cl_program program_from_binary(iha_context *ctx, const unsigned char *binary, size_t length,
                                      const char *options)
{
    const unsigned char *bins[1] = {binary};
    cl_int status = CL_SUCCESS, err = CL_SUCCESS;
    cl_program program = clCreateProgramWithBinary(ctx->cl_ctx, 1, &ctx->device, &length, bins, &status, &err);
    if (err != CL_SUCCESS || status != CL_SUCCESS) {
        if (err == CL_SUCCESS) clReleaseProgram(program);
        return NULL;
    }
    if (clBuildProgram(program, 1, &ctx->device, options, NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(program);
        return NULL;
    }
    return program;
}

/* Tries the disk cache; returns a built program or NULL, and in *marker the load marker that
 * stays until a finished queue proves the program (malloc'ed; NULL when none could be made). An
 * entry that fails the binary check or that the driver refuses is retired, so that no later
 * process tries it again (the caller builds from source and writes a new one). */
static cl_program load_cached(iha_context *ctx, uint64_t key, const char *options, char **marker)
{
    *marker = NULL;
    if (ctx->cache_dir == NULL) return NULL;
    if (!ctx->cache_tidied) {
        iha__disk_cache_tidy(ctx->cache_dir);
        ctx->cache_tidied = 1;
    }
    size_t length = 0;
    unsigned char *binary = iha__disk_cache_read(ctx->cache_dir, key, &length);
    if (binary == NULL) return NULL;
    cl_program program = NULL;
    if (iha__binary_loadable(binary, length)) {
        iha__binary_own_build_hash(binary, length);
        char path[4200];
        iha__disk_cache_load_begin(ctx->cache_dir, key, path, sizeof path);
        program = program_from_binary(ctx, binary, length, options);
        if (program != NULL && path[0] != '\0') *marker = strdup(path);
        if (program == NULL || *marker == NULL) iha__disk_cache_load_end(path);
    }
    free(binary);
    if (program == NULL) iha__disk_cache_retire(ctx->cache_dir, key);
    return program;
}

static iha_status build_from_source(iha_context *ctx, const char *file, const char *source, size_t length,
                                    const char *options, cl_program *out)
{
    cl_int err = CL_SUCCESS;
    cl_program program = clCreateProgramWithSource(ctx->cl_ctx, 1, &source, &length, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateProgramWithSource");
    err = clBuildProgram(program, 1, &ctx->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        iha_status st = build_log_failure(ctx, program, file, options, err);
        clReleaseProgram(program);
        return st;
    }
    *out = program;
    return IHA_OK;
}

/* "-w": compilers such as PoCL's clang print warning counts to stderr themselves, and the
 * library must not print; a failing build still returns its errors in the log. */
#define IHA_BASE_BUILD_OPTIONS "-w"

static iha_status program_get(iha_context *ctx, const char *file, const char *kernel_options,
                              iha_program_entry **out)
{
    char options[512];
    int n = snprintf(options, sizeof options, "%s %s %s", IHA_BASE_BUILD_OPTIONS, iha__loop_probe_option(ctx),
                     kernel_options);
    IHA_RETURN_ERROR_IF(n < 0 || (size_t)n >= sizeof options, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "build options too long for cl/%s", file);
    iha_program_cache *cache = &ctx->programs;
    for (size_t i = 0; i < cache->count; ++i) {
        if (strcmp(cache->entries[i].file, file) == 0 && strcmp(cache->entries[i].options, options) == 0) {
            *out = &cache->entries[i];
            return IHA_OK;
        }
    }
    if (cache->count == cache->capacity) {
        size_t cap = cache->capacity ? cache->capacity * 2 : 16;
        iha_program_entry *grown = realloc(cache->entries, cap * sizeof *grown);
        IHA_RETURN_ERROR_IF(grown == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the program cache");
        cache->entries = grown;
        cache->capacity = cap;
    }

    size_t length = 0;
    char *source = NULL;
    IHA_FORWARD_IF_ERROR(iha__kernel_text(ctx, file, &source, &length));

    iha_program_entry e;
    memset(&e, 0, sizeof e);
    e.key = program_key(ctx, source, options);
    e.program = load_cached(ctx, e.key, options, &e.marker);
    e.on_disk = e.program != NULL;
    e.candidate = ctx->programs.candidates;
    iha_status st = IHA_OK;
    if (e.program == NULL) st = build_from_source(ctx, file, source, length, options, &e.program);
    free(source);
    if (st != IHA_OK) return st;
    e.file = strdup(file);
    e.options = strdup(options);
    if (e.file == NULL || e.options == NULL) {
        free(e.file);
        free(e.options);
        free(e.marker);
        clReleaseProgram(e.program);
        return iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the program cache");
    }
    cache->entries[cache->count] = e;
    *out = &cache->entries[cache->count++];
    return IHA_OK;
}

iha_status iha__kernel_get(iha_context *ctx, const char *file, const char *options, const char *name, cl_kernel *out)
{
    iha_program_entry *e = NULL;
    IHA_FORWARD_IF_ERROR(program_get(ctx, file, options, &e));
    for (size_t i = 0; i < e->kernel_count; ++i) {
        if (strcmp(e->kernel_names[i], name) == 0) {
            *out = e->kernels[i];
            e->launched = 1;
            return IHA_OK;
        }
    }
    IHA_RETURN_ERROR_IF(e->kernel_count == IHA_PROGRAM_MAX_KERNELS, ctx, IHA_ERROR_UNSUPPORTED,
                        "too many kernels taken from cl/%s", file);
    cl_int err = CL_SUCCESS;
    cl_kernel k = clCreateKernel(e->program, name, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateKernel");
    char *copy = strdup(name);
    if (copy == NULL) {
        clReleaseKernel(k);
        return iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the kernel cache");
    }
    e->kernel_names[e->kernel_count] = copy;
    e->kernels[e->kernel_count++] = k;
    e->launched = 1;
    *out = k;
    return IHA_OK;
}

static void write_binary(iha_context *ctx, iha_program_entry *e)
{
    /* Asking for the size already makes PoCL serialise the program (headroom.h). */
    if (!iha__room_for_binaries()) return;
    size_t size = 0;
    if (clGetProgramInfo(e->program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS || size == 0)
        return;
    unsigned char *binary = malloc(size);
    if (binary == NULL) return;
    unsigned char *bins[1] = {binary};
    if (clGetProgramInfo(e->program, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) == CL_SUCCESS &&
        iha__binary_loadable(binary, size) && iha__disk_cache_write(ctx->cache_dir, e->key, binary, size) == 0)
        e->on_disk = 1;
    free(binary);
}

/* Launched (so compiled to machine code), not on disk yet, and not a tuning candidate. */
static int worth_writing(const iha_program_entry *e) { return e->launched && !e->on_disk && !e->candidate; }

void iha__program_cache_end_loads(iha_context *ctx)
{
    int pending = 0;
    for (size_t i = 0; i < ctx->programs.count; ++i) pending |= ctx->programs.entries[i].marker != NULL;
    if (!pending || clFinish(ctx->queue) != CL_SUCCESS) return;
    for (size_t i = 0; i < ctx->programs.count; ++i) {
        iha_program_entry *e = &ctx->programs.entries[i];
        if (e->marker == NULL) continue;
        iha__disk_cache_load_end(e->marker);
        free(e->marker);
        e->marker = NULL;
    }
}

void iha__program_cache_flush(iha_context *ctx)
{
    if (ctx->cache_dir == NULL) return;
    iha__program_cache_end_loads(ctx);
    int pending = 0;
    for (size_t i = 0; i < ctx->programs.count; ++i) pending |= worth_writing(&ctx->programs.entries[i]);
    if (!pending || clFinish(ctx->queue) != CL_SUCCESS) return;
    for (size_t i = 0; i < ctx->programs.count; ++i) {
        iha_program_entry *e = &ctx->programs.entries[i];
        if (worth_writing(e)) {
            write_binary(ctx, e);
            e->on_disk = 1; /* one attempt per process: a failing disk must not cost every call */
        }
    }
}

void iha__program_cache_release(iha_program_cache *cache)
{
    for (size_t i = 0; i < cache->count; ++i) {
        iha_program_entry *e = &cache->entries[i];
        for (size_t k = 0; k < e->kernel_count; ++k) {
            clReleaseKernel(e->kernels[k]);
            free(e->kernel_names[k]);
        }
        clReleaseProgram(e->program);
        free(e->marker);
        free(e->file);
        free(e->options);
    }
    free(cache->entries);
    cache->entries = NULL;
    cache->count = cache->capacity = 0;
}
