/*
 * test_faults.c - the fault paths: each gives a clear status and message, loses nothing (the
 * output untouched, no OpenCL object leaked, the context still correct afterwards) and crashes
 * nothing.
 *   - one kernel source that fails to build (IHA_ERROR_BUILD with the compiler's log), then
 *     repaired under the same context;
 *   - a device allocation the OpenCL implementation refuses (a 4 GiB host tensor, above PoCL's
 *     largest allocation), and an internal buffer beyond the device between good calls;
 *   - a program cache directory that cannot be created (its parent is a regular file: chmod
 *     does not stop root, which CI runs as): the layer still runs; and a full disk
 *     (RLIMIT_FSIZE in a child process, so writes stop mid-entry): the writer leaves nothing
 *     half-written, and a layer that PoCL can no longer compile fails with a clear status;
 *   - cache entries cut at every boundary of their layout (as by a writer that died mid-write
 *     on a file system without atomic rename); a dead writer's temporary file beside them is
 *     removed, a live writer's kept;
 *   - PoCL binaries with an empty record (content or name) in a valid entry, which PoCL aborts
 *     on: later processes run right and the entries are rewritten; the binary check refuses
 *     every malformed variant; an entry whose load marker outlived its process is retired;
 *   - a FIFO in the place of an entry and of the profile: nothing waits on it;
 *   - an address-space limit that leaves no room for fetching binaries: the cache is skipped;
 *   - a tuning profile truncated mid-write: ignored and reported, never fatal;
 *   - the context freed while its queue still holds work, and trimmed while it does.
 * On PoCL, where every OpenCL object holds a reference to its context, the context's reference
 * count shows that nothing was leaked (CLBlast's process-wide program cache is cleared first).
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <clblast_c.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "reliability.h"
#include "runtime/disk_cache.h"
#include "runtime/pocl_binary.h"
#include "test_layer.h"
#include "test_util.h"


/* A small layer with every stage in use: P > 1, rotary, a window, odd sizes. */
static const iha_shape kSmall = {2, 11, 24, 2, 16, 3};

static iha_attention_options small_options(void)
{
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.rope = 1;
    o.window = 4;
    return o;
}

static iha_context *open_with(const char *cache_dir, const char *kernel_dir)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.cache_dir = cache_dir;
    options.kernel_dir = kernel_dir;
    iha_context *ctx = NULL;
    char message[1024] = "";
    iha_status st = iha_context_create(&ctx, &options, message, sizeof message);
    if (st != IHA_OK)
        fail_msg("iha_context_create: %s: %s", iha_status_name(st), message);
    return ctx;
}

/* Runs the small layer on ctx through `api` and checks every element of z. */
static void check_small(iha_context *ctx, tu_api api)
{
    const iha_attention_options o = small_options();
    tu_layer l;
    tu_layer_init(&l, &kSmall, 17);
    double *zref = tu_layer_reference(&l, &o);
    tu_layer_check_forward(ctx, &l, &o, api, zref, TU_TOL_F32);
    free(zref);
    tu_layer_free(&l);
}

/* check_small on a context of its own over the cache directory `cache`. */
static void check_small_with(const char *cache, tu_api api)
{
    iha_context *ctx = open_with(cache, NULL);
    check_small(ctx, api);
    iha_context_free(ctx);
}

static void expect_message(iha_context *ctx, const char *needle)
{
    const char *m = iha_context_message(ctx);
    if (!strstr(m, needle))
        fail_msg("the message does not mention \"%s\": \"%s\"", needle, m);
}

/* ---- Files ---- */

static void copy_file(const char *from, const char *to, const char *append)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof buffer, in)) > 0)
        assert_int_equal(fwrite(buffer, 1, n, out), n);
    if (append)
        assert_true(fputs(append, out) >= 0);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

static void copy_into(const char *path, void *arg)
{
    char to[4200];
    snprintf(to, sizeof to, "%s%s", (const char *)arg, strrchr(path, '/'));
    copy_file(path, to, NULL);
}

/* The pid of a process that has exited (and been reaped). */
static long dead_pid(void)
{
    const char *args[] = {"--exit-child", NULL};
    const pid_t pid = rel_spawn_self(args);
    assert_int_equal(rel_wait(pid), 0);
    return (long)pid;
}

static void touch_file(const char *path)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* ---- A kernel that fails to build ---- */

#define BROKEN_TEXT "\n#error deliberately broken by test_faults\n"

static void one_kernel_fails_to_build(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char kdir[4096], cache[4096], from[4300], to[4300];
    tu_temp_dir(kdir, sizeof kdir);
    tu_temp_dir(cache, sizeof cache);
    assert_true(tu_for_each_file(IHA_TEST_SOURCE_DIR "/cl", copy_into, kdir) > 0);
    /* Both attention kernels are broken; the message must name the one this device builds
     * (the register-tile kernel on CPUs, the local-memory one on GPUs). */
    static const char *const broken[2] = {"attention.cl", "attention_local.cl"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/cl/%s", IHA_TEST_SOURCE_DIR, broken[i]);
        snprintf(to, sizeof to, "%s/%s", kdir, broken[i]);
        copy_file(from, to, BROKEN_TEXT);
    }
    iha_attention_config builtin;
    iha__attention_config_default(tu_ctx, kSmall.head_dim, &builtin);

    iha_context *ctx = open_with(cache, kdir);
    const iha_attention_options o = small_options();
    tu_layer l;
    tu_layer_init(&l, &kSmall, 18);
    tu_device_layer d;
    tu_device_layer_upload(ctx, &l, 1, &d);
    const size_t nz = tu_count_x(&kSmall);

    /* The other stages build and are enqueued first; the attention kernel does not build. */
    tu_assert_status(ctx, iha_forward(ctx, &kSmall, &o, &d.weights, d.x, d.z), IHA_ERROR_BUILD);
    expect_message(ctx, broken[builtin.variant == 1]);
    expect_message(ctx, "build log");
    expect_message(ctx, "deliberately broken by test_faults"); /* the compiler's own words */
    assert_int_equal(iha_context_cl_error(ctx), CL_BUILD_PROGRAM_FAILURE);
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    tu_assert_guard(ctx, d.z.mem, nz, d.z.offset, TU_GUARD, TU_SENTINEL);
    float *z = tu_malloc(nz * sizeof *z);
    tu_buffer_read(ctx, d.z.mem, d.z.offset, z, nz);
    assert_int_equal(tu_count_nonfinite(z, nz), nz); /* still the NaN poison: z was not written */

    /* The same failure from the attention call alone, again with the log. */
    iha_shape as = kSmall;
    iha_attention_options ao;
    iha_attention_options_init(&ao);
    const size_t nv = tu_count_virtual(&as);
    cl_mem in = tu_buffer_guarded(ctx, NULL, 0, 0, nv, 0.5f), out = tu_buffer_guarded(ctx, NULL, 0, 0, nv, 0.25f);
    iha_buffer ib = {in, 0}, ob = {out, 0}, none = {NULL, 0};
    tu_assert_status(ctx, iha_attention(ctx, &as, &ao, ib, ib, ib, ob, none), IHA_ERROR_BUILD);
    expect_message(ctx, "deliberately broken by test_faults");
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    tu_assert_buffer_all(ctx, out, 0, nv, 0.25f);
    /* Failing again keeps no OpenCL object: the count after a trim is the same as after the
     * first failure (whose good programs, mixing and packing, the context keeps). */
    iha_context_trim(ctx);
    const unsigned refs = rel_context_refs_quiet(iha_context_cl_context(ctx));
    for (int i = 0; i < 3; i++) {
        tu_assert_status(ctx, iha_forward(ctx, &kSmall, &o, &d.weights, d.x, d.z), IHA_ERROR_BUILD);
        tu_assert_status(ctx, iha_attention(ctx, &as, &ao, ib, ib, ib, ob, none), IHA_ERROR_BUILD);
    }
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    iha_context_trim(ctx);
    if (rel_refs_count_objects(ctx))
        assert_true(rel_context_refs_settled(iha_context_cl_context(ctx), refs) <= refs);
    tu_buffer_release(in);
    tu_buffer_release(out);

    /* Repaired, the same context builds it on the next call and computes the right z. */
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/cl/%s", IHA_TEST_SOURCE_DIR, broken[i]);
        snprintf(to, sizeof to, "%s/%s", kdir, broken[i]);
        copy_file(from, to, NULL);
    }
    double *zref = tu_layer_reference(&l, &o);
    tu_assert_status(ctx, iha_forward(ctx, &kSmall, &o, &d.weights, d.x, d.z), IHA_OK);
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    tu_buffer_read(ctx, d.z.mem, d.z.offset, z, nz);
    tu_assert_close("z after the repair", z, zref, nz, TU_TOL_F32);
    free(z);
    free(zref);
    tu_device_layer_release(&d);
    tu_layer_free(&l);
    iha_context_free(ctx);

    /* The cache holds only whole entries: nothing of the failed build. */
    rel_cache_census c = rel_cache_scan(cache);
    assert_true(c.valid > 0);
    assert_int_equal(c.broken + c.temporary, 0);
    tu_remove_tree(kdir);
    tu_remove_tree(cache);
}

/* ---- Device allocations ---- */

/* x and z of 4 GiB (reserved, never touched): iha_forward_host's clCreateBuffer is refused by
 * the implementation (above PoCL's largest allocation), not by a check of the library. */
static void device_refuses_an_allocation(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const size_t D = (size_t)1 << 20, N = 1024; /* x: 2^30 floats */
    const iha_shape s = {1, N, D, 1, 1, 1};
    const size_t bytes = N * D * sizeof(float);
    cl_ulong max_alloc = 0;
    assert_int_equal(clGetDeviceInfo(iha_context_cl_device(tu_ctx), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc,
                                     &max_alloc, NULL),
                     CL_SUCCESS);
    if (max_alloc >= bytes)
        skip(); /* a device that would really allocate 4 GiB here */
    float *x = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    float *z = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert_true(x != MAP_FAILED && z != MAP_FAILED);
    float *w = tu_malloc(4 * D * sizeof *w);
    tu_fill_value(w, 4 * D, 0.5f);
    const iha_host_weights hw = {w, w + D, w + 2 * D, w + 3 * D, NULL, NULL, NULL, NULL};
    iha_attention_options o;
    iha_attention_options_init(&o);

    cl_context cl = iha_context_cl_context(tu_ctx);
    iha_context_trim(tu_ctx);
    const unsigned refs = rel_context_refs_quiet(cl);
    iha_status st = iha_forward_host(tu_ctx, &s, &o, &hw, x, z);
    print_message("4 GiB host tensor: %s: %s\n", iha_status_name(st), iha_context_message(tu_ctx));
    tu_assert_status(tu_ctx, st, IHA_ERROR_DEVICE_MEMORY);
    expect_message(tu_ctx, "clCreateBuffer");
    assert_int_not_equal(iha_context_cl_error(tu_ctx), 0);
    for (size_t i = 0; i < N * D; i += 4096) /* z never written: still the kernel's zero pages */
        if (z[i] != 0.0f)
            fail_msg("z[%zu] was written", i);
    iha_context_trim(tu_ctx);
    if (rel_refs_count_objects(tu_ctx))
        assert_true(rel_context_refs_settled(cl, refs) <= refs); /* the temporaries made before it are gone */
    munmap(x, bytes);
    munmap(z, bytes);
    free(w);
    check_small(tu_ctx, TU_API_HOST);
}

/* One iha_forward of `big` (D = 1, so x and z stay small) that must be refused with a
 * message holding `needle`, leaving z untouched and no buffer behind. */
static void expect_refused(const iha_shape *big, const char *needle)
{
    cl_context cl = iha_context_cl_context(tu_ctx);
    const unsigned refs = rel_context_refs_quiet(cl);
    const size_t nx = tu_count_x(big), nw = tu_count_w(big), nm = tu_count_mix(big);
    cl_mem x = tu_buffer_guarded(tu_ctx, NULL, 0, 0, nx, TU_SENTINEL);
    cl_mem z = tu_buffer_guarded(tu_ctx, NULL, 0, 0, nx, TU_SENTINEL);
    cl_mem w = tu_buffer_guarded(tu_ctx, NULL, 0, 0, nw, 0.5f), m = tu_buffer_guarded(tu_ctx, NULL, 0, 0, nm, 0.5f);
    const iha_buffer wb = {w, 0}, mb = {m, 0};
    const iha_layer_weights weights = {wb, wb, wb, wb, mb, mb, mb, mb};
    iha_attention_options o;
    iha_attention_options_init(&o);
    iha_status st = iha_forward(tu_ctx, big, &o, &weights, (iha_buffer){x, 0}, (iha_buffer){z, 0});
    tu_assert_status(tu_ctx, st, IHA_ERROR_DEVICE_MEMORY);
    expect_message(tu_ctx, needle);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    tu_assert_buffer_all(tu_ctx, z, 0, nx, TU_SENTINEL);
    tu_buffer_release(x);
    tu_buffer_release(z);
    tu_buffer_release(w);
    tu_buffer_release(m);
    if (rel_refs_count_objects(tu_ctx))
        assert_true(rel_context_refs_settled(cl, refs) <= refs);
}

/* Between good calls that grow and reuse the workspace, calls whose internal buffers exceed the
 * device, sized from its own limits (a fixed size passes on a GPU with 141 GB, which then fails
 * lazily at the first kernel): one buffer over the largest allocation, then buffers that each fit
 * it but not the device's memory together. Each is refused before anything is enqueued, z is
 * untouched, no buffer is leaked, and the next calls are right. */
static void workspace_refusal_between_good_calls(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    cl_ulong max_alloc = 0, global = 0;
    cl_device_id dev = iha_context_cl_device(tu_ctx);
    assert_int_equal(clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL), CL_SUCCESS);
    assert_int_equal(clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL), CL_SUCCESS);
    check_small(tu_ctx, TU_API_DEVICE);

    /* H = 2 heads of d = 256: 2 KiB per token in Q, and P = 4 times that in each pseudo tensor. */
    const size_t token_bytes = 2 * 256 * sizeof(float), P = 4;
    /* Q alone is too large (and so, on most devices, are all the buffers together: either refusal
     * comes first). */
    const iha_shape one = {1, (size_t)(max_alloc / token_bytes) + 1, 1, 2, 256, P};
    expect_refused(&one, "the device's");
    check_small(tu_ctx, TU_API_DEVICE_OFFSETS);

    /* Q, K, V, Y of t bytes and 4 pseudo tensors of P*t (each within the largest allocation): 20t. */
    const iha_shape together = {1, (size_t)(max_alloc / (P * token_bytes)), 1, 2, 256, P};
    if ((cl_ulong)together.tokens * token_bytes * (4 + 4 * P) > global)
        expect_refused(&together, "exceed the device's memory");
    else
        printf("the device's largest allocation (%llu bytes) is under a fifth of its memory (%llu): "
               "no shape fits the one and not the other\n", (unsigned long long)max_alloc, (unsigned long long)global);
    check_small(tu_ctx, TU_API_DEVICE_OFFSETS);
    check_small(tu_ctx, TU_API_HOST);
}

/* ---- The program cache directory ---- */

/* cache_dir below a regular file: no directory can be made there, by root either. */
static void cache_dir_cannot_be_created(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[4096], file[4200], cache[4300];
    tu_temp_dir(dir, sizeof dir);
    snprintf(file, sizeof file, "%s/file", dir);
    FILE *f = fopen(file, "wb");
    assert_non_null(f);
    assert_true(fputs("not a directory\n", f) >= 0);
    assert_int_equal(fclose(f), 0);
    snprintf(cache, sizeof cache, "%s/sub/iha", file);
    for (int i = 0; i < 2; i++) {
        iha_context *ctx = open_with(cache, NULL);
        check_small(ctx, TU_API_DEVICE);
        check_small(ctx, TU_API_HOST);
        iha_context_free(ctx);
    }
    assert_int_equal(file_size(file), 16);
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
     * there fails, ends the process with status 1 (H200, driver 580: with no room at all the
     * child exited 1 without a word, and passed with this variable). That cache is the
     * driver's, not the library's, whose writer this child tests. */
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

    iha_context_options options;
    iha_context_options_init(&options);
    options.cache_dir = cache;
    iha_context *ctx = NULL;
    char message[1024] = "";
    if (iha_context_create(&ctx, &options, message, sizeof message) != IHA_OK) {
        printf("full disk: no context: %s\n", message);
        return message[0] ? 0 : 5;
    }
    const iha_attention_options o = small_options();
    tu_layer l;
    tu_layer_init(&l, &kSmall, 17);
    double *zref = tu_layer_reference(&l, &o);
    const size_t nz = tu_count_x(&kSmall);
    float *z = tu_malloc(nz * sizeof *z);
    tu_fill_nan(z, nz);
    const iha_host_weights w = {l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
    iha_status st = iha_forward_host(ctx, &kSmall, &o, &w, l.x, z);
    int rc;
    if (st == IHA_OK)
        rc = tu_count_nonfinite(z, nz) == 0 && tu_rel_l2(z, zref, nz) <= TU_TOL_F32 ? 0 : 6;
    else
        rc = iha_context_message(ctx)[0] && tu_count_nonfinite(z, nz) == nz ? 0 : 7;
    printf("full disk (files limited to %ld bytes): %s%s%s\n", limit, iha_status_name(st), st ? ": " : "",
           iha_context_message(ctx));
    iha_context_free(ctx); /* writes the entries, or fails to */
    free(z);
    free(zref);
    tu_layer_free(&l);
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
        check_small_with(cache, TU_API_HOST);
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
    e->size = file_size(path);
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

/* A fresh cache directory (its path in cache) that one small layer has filled with entries. */
static void fill_cache(char *cache, size_t capacity)
{
    tu_temp_dir(cache, capacity);
    check_small_with(cache, TU_API_DEVICE);
}

/* Every entry cut to the same length, at each boundary of "magic | key | length | checksum |
 * binary" and one byte short of whole: each run rebuilds, is right, and writes whole entries
 * again. A dead writer's partial temporary file beside them is removed, a live writer's kept. */
static void cache_entries_cut_mid_write(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char cache[4096];
    fill_cache(cache, sizeof cache);
    saved_entries saved = {.count = 0};
    tu_for_each_file(cache, save_entry, &saved);
    assert_true(saved.count > 0);

    /* A dead writer's partial temporary file, and a live one's (this process's). */
    saved_entry dead = saved.items[0], live = saved.items[0];
    int n = snprintf(dead.path, sizeof dead.path, "%s.tmp.%ld.1.2", saved.items[0].path, dead_pid());
    assert_true(n > 0 && (size_t)n < sizeof dead.path);
    write_prefix(&dead, dead.size / 2);
    n = snprintf(live.path, sizeof live.path, "%s.tmp.%ld.1.2", saved.items[0].path, (long)getpid());
    assert_true(n > 0 && (size_t)n < sizeof live.path);
    write_prefix(&live, live.size / 3);

    const long cuts[] = {0, 1, 7, 8, 15, 16, 24, 31, 32, 33, -1};
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
        for (size_t i = 0; i < saved.count; i++)
            write_prefix(&saved.items[i], cuts[c] >= 0 ? cuts[c] : saved.items[i].size - 1);
        check_small_with(cache, TU_API_DEVICE);
        /* Whole means valid (magic, key, length and checksum), not the first size: a rebuilt
         * binary can differ from the first (seen in a parallel suite: 290900 bytes against
         * 260764; PoCL's binary of a program probably carries what its cache, shared by the
         * suite's processes, has compiled for it by then). */
        const rel_cache_census after = rel_cache_scan(cache);
        if (after.valid != saved.count || after.broken != 0)
            fail_msg("cut at %ld: %zu valid and %zu broken entries, not %zu whole ones", cuts[c], after.valid,
                     after.broken, saved.count);
        for (size_t i = 0; i < saved.count; i++)
            if (file_size(saved.items[i].path) <= (cuts[c] >= 0 ? cuts[c] : saved.items[i].size - 1))
                fail_msg("cut at %ld: %s was not rewritten (%ld bytes)", cuts[c], saved.items[i].path,
                         file_size(saved.items[i].path));
    }
    rel_cache_census census = rel_cache_scan(cache);
    assert_int_equal(census.valid, saved.count);
    assert_int_equal(census.broken, 0);
    assert_int_equal(census.temporary, 1); /* the live writer's; the dead one's is removed */
    assert_int_equal(file_size(dead.path), -1);
    assert_int_equal(file_size(live.path), live.size / 3);
    for (size_t i = 0; i < saved.count; i++)
        free(saved.items[i].bytes);
    tu_remove_tree(cache);
}

/* Empties the program.bc record of a PoCL binary in the entry at path, keeping the entry itself
 * valid (length and checksum rewritten): what clGetProgramInfo returned once while another
 * process rewrote PoCL's cache. Counts the entries changed in *arg. */
static void empty_program_bc(const char *path, void *arg)
{
    const char *name = strrchr(path, '/') + 1;
    unsigned long long key = 0;
    if (!strstr(name, ".clbin") || strstr(name, ".tmp.") || sscanf(name, "%16llx", &key) != 1)
        return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(name - 1 - path), path);
    size_t n = 0;
    unsigned char *b = iha__disk_cache_read(dir, key, &n);
    assert_non_null(b);
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
    free(b);
}

/* Entries whose PoCL binary has an empty program.bc (PoCL asserts and aborts the process when it
 * loads one): the next process rebuilds those programs from source instead of loading them, its
 * results are right, and it writes loadable entries in their place. */
static void cache_entry_pocl_cannot_load(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char cache[4096];
    fill_cache(cache, sizeof cache);
    int emptied = 0;
    tu_for_each_file(cache, empty_program_bc, &emptied);
    if (emptied == 0) {
        print_message("no PoCL binaries in the cache (another driver): nothing to check\n");
        tu_remove_tree(cache);
        return;
    }
    check_small_with(cache, TU_API_DEVICE);
    int still_empty = 0;
    tu_for_each_file(cache, empty_program_bc, &still_empty); /* empties them again: count only */
    assert_int_equal(still_empty, emptied);                  /* each one had been rewritten whole */
    tu_remove_tree(cache);
}

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
static void empty_record_in_entry(const char *path, void *arg)
{
    record_edit *edit = arg;
    const char *name = strrchr(path, '/') + 1;
    unsigned long long key = 0;
    if (strlen(name) != 22 || strcmp(name + 16, ".clbin") != 0 || sscanf(name, "%16llx", &key) != 1)
        return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(name - 1 - path), path);
    size_t n = 0;
    unsigned char *b = iha__disk_cache_read(dir, key, &n);
    assert_non_null(b);
    assert_true(iha__binary_loadable(b, n));
    const size_t m = empty_record(b, n, edit->fault);
    if (m != 0) {
        assert_false(iha__binary_loadable(b, m));
        assert_int_equal(iha__disk_cache_write(dir, key, b, m), 0);
        edit->changed++;
    }
    free(b);
}

/* The child of cache_entry_with_an_empty_record: the small layer with the cache in `cache` and
 * PoCL's own cache in `pocl_cache` (PoCL unpacks a loaded binary there, so a bad one must not
 * reach the suite's shared PoCL cache). Exit status 0 when z is right. */
/* The small layer through iha_forward_host on ctx: 0 when z is right. */
static int load_child_layer(iha_context *ctx)
{
    const iha_attention_options o = small_options();
    tu_layer l;
    tu_layer_init(&l, &kSmall, 17);
    double *zref = tu_layer_reference(&l, &o);
    const size_t nz = tu_count_x(&kSmall);
    float *z = tu_malloc(nz * sizeof *z);
    const iha_host_weights w = {l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
    const iha_status st = iha_forward_host(ctx, &kSmall, &o, &w, l.x, z);
    const int rc = st == IHA_OK && tu_rel_l2(z, zref, nz) <= TU_TOL_F32 ? 0 : 1;
    if (st != IHA_OK)
        fprintf(stderr, "child: %s: %s\n", iha_status_name(st), iha_context_message(ctx));
    free(z);
    free(zref);
    tu_layer_free(&l);
    return rc;
}

static int load_child(const char *cache, const char *pocl_cache)
{
    setenv("POCL_CACHE_DIR", pocl_cache, 1);
    iha_context *ctx = open_with(cache, NULL);
    const int rc = load_child_layer(ctx);
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
        fill_cache(cache, sizeof cache);
        tu_temp_dir(pocl, sizeof pocl);
        record_edit edit = {faults[f], 0};
        tu_for_each_file(cache, empty_record_in_entry, &edit);
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
        tu_for_each_file(cache, empty_record_in_entry, &again); /* counts the rewritten ones */
        assert_int_equal(again.changed, edit.changed);
        tu_remove_tree(cache);
        tu_remove_tree(pocl);
    }
}

/* The binary check itself: every entry a layer wrote passes; one byte less or more, a record
 * emptied, or an unknown layout version does not. */
static void check_entry_variants(const char *path, void *arg)
{
    const char *name = strrchr(path, '/') + 1;
    unsigned long long key = 0;
    if (strlen(name) != 22 || sscanf(name, "%16llx", &key) != 1)
        return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(name - 1 - path), path);
    size_t n = 0;
    unsigned char *b = iha__disk_cache_read(dir, key, &n);
    assert_non_null(b);
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
    free(b);
}

static void binary_check_refuses_malformed_records(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char cache[4096];
    fill_cache(cache, sizeof cache);
    int checked = 0;
    tu_for_each_file(cache, check_entry_variants, &checked);
    print_message("%d PoCL binaries checked\n", checked);
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
    TU_REQUIRE_DEVICE(tu_ctx);
    char cache[4096], dead[4300], live[4300];
    fill_cache(cache, sizeof cache);
    const first_entry e = first_entry_of(cache);
    date_back(e.path);
    snprintf(dead, sizeof dead, "%s.loading.%ld.1", e.path, dead_pid());
    touch_file(dead);
    check_small_with(cache, TU_API_DEVICE);
    assert_int_equal(file_size(dead), -1);
    assert_true(mtime_of(e.path) > 1000000000); /* rebuilt and written anew */
    const rel_cache_census c = rel_cache_scan(cache);
    assert_int_equal(c.broken + c.temporary + c.other, 0);

    date_back(e.path);
    snprintf(live, sizeof live, "%s.loading.%ld.1", e.path, (long)getpid());
    touch_file(live);
    check_small_with(cache, TU_API_DEVICE);
    assert_int_equal(mtime_of(e.path), 1000000000); /* loaded, untouched */
    assert_int_equal(file_size(live), 0);
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
    TU_REQUIRE_DEVICE(tu_ctx);
    char cache[4096], profile[4200];
    fill_cache(cache, sizeof cache);
    const first_entry e = first_entry_of(cache);
    fifo_instead(e.path);
    snprintf(profile, sizeof profile, "%s/profile.json", cache);
    fifo_instead(profile);
    alarm(300);
    iha_context_options options;
    iha_context_options_init(&options);
    options.cache_dir = cache;
    options.profile = profile;
    iha_context *ctx = NULL;
    char message[1024] = "";
    if (iha_context_create(&ctx, &options, message, sizeof message) != IHA_OK)
        fail_msg("iha_context_create: %s", message);
    check_small(ctx, TU_API_DEVICE);
    const iha_attention_options o = small_options();
    tu_assert_profile_refused(ctx, &kSmall, &o, "not a regular file");
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
    iha_context *ctx = open_with(full, NULL);
    if (load_child_layer(ctx) != 0)
        return 2;
    iha_context_free(ctx);
    ctx = open_with(limited, NULL);
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
    const int rc = load_child_layer(ctx);
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
    iha_context *ctx = open_with(limited, NULL);
    check_small(ctx, TU_API_HOST);
    iha_context_free(ctx);
    assert_true(rel_cache_scan(limited).valid > 0);
    tu_remove_tree(full);
    tu_remove_tree(limited);
}

/* ---- A tuning profile cut mid-write ---- */

static void profile_cut_mid_write(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[4096], path[4200];
    tu_temp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/profile.json", dir);
    static const char whole[] =
        "{\"format\": \"iha-tuning-profile\", \"format_version\": 1, \"key\": {\"vendor_id\": 0}, \"entries\": []}";
    const size_t cuts[] = {0, 1, 20, sizeof whole / 2, sizeof whole - 2};
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(whole, 1, cuts[c], f), cuts[c]);
        assert_int_equal(fclose(f), 0);
        iha_context_options options;
        iha_context_options_init(&options);
        options.profile = path;
        iha_context *ctx = NULL;
        char message[1024] = "";
        iha_status st = iha_context_create(&ctx, &options, message, sizeof message);
        if (st != IHA_OK)
            fail_msg("a profile cut at %zu bytes made iha_context_create fail: %s", cuts[c], message);
        iha_profile_info info;
        tu_assert_status(ctx, iha_context_profile(ctx, &info), IHA_ERROR_PROFILE);
        assert_int_equal(info.state, IHA_PROFILE_IGNORED);
        assert_true(strlen(info.message) > 0);
        assert_true(strlen(iha_context_message(ctx)) > 0);
        check_small(ctx, TU_API_HOST);
        iha_context_free(ctx);
    }
    tu_remove_tree(dir);
}

/* ---- Freeing and trimming while work is queued ---- */

/* Three layers enqueued, then iha_context_free at once: it waits, and the application reads
 * the right results through its own queue on the context it retained. The library releases
 * every OpenCL object it made. */
static void free_while_queue_holds_work(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 300, 64, 4, 32, 2};
    iha_attention_options o;
    iha_attention_options_init(&o);
    iha_context *ctx = open_with(NULL, NULL);
    cl_context cl = iha_context_cl_context(ctx);
    assert_int_equal(clRetainContext(cl), CL_SUCCESS);
    cl_int err = CL_SUCCESS;
    cl_command_queue queue = clCreateCommandQueue(cl, iha_context_cl_device(ctx), 0, &err);
    assert_int_equal(err, CL_SUCCESS);

    enum { LAYERS = 3 };
    tu_layer l[LAYERS];
    tu_device_layer d[LAYERS];
    double *zref[LAYERS];
    for (int i = 0; i < LAYERS; i++) {
        tu_layer_init(&l[i], &s, 40 + (uint64_t)i);
        zref[i] = tu_layer_reference(&l[i], &o);
        tu_device_layer_upload(ctx, &l[i], i == 1, &d[i]);
    }
    for (int i = 0; i < LAYERS; i++)
        tu_assert_status(ctx, iha_forward(ctx, &s, &o, &d[i].weights, d[i].x, d[i].z), IHA_OK);
    iha_context_free(ctx);

    const size_t nz = tu_count_x(&s);
    float *z = tu_malloc(nz * sizeof *z);
    for (int i = 0; i < LAYERS; i++) {
        assert_int_equal(clEnqueueReadBuffer(queue, d[i].z.mem, CL_TRUE, d[i].z.offset * sizeof(float),
                                             nz * sizeof(float), z, 0, NULL, NULL),
                         CL_SUCCESS);
        tu_assert_close("z read after iha_context_free", z, zref[i], nz, TU_TOL_F32);
        tu_device_layer_release(&d[i]);
        tu_layer_free(&l[i]);
        free(zref[i]);
    }
    free(z);
    assert_int_equal(clReleaseCommandQueue(queue), CL_SUCCESS);
    /* With the application's objects gone, only its own reference is left, once CLBlast's
     * process-wide cache lets go of the GEMM programs it compiled for this context. */
    if (rel_refs_count_objects(tu_ctx)) {
        const unsigned left = rel_context_refs_quiet(cl);
        assert_int_equal(CLBlastClearCache(), CLBlastSuccess);
        print_message("after iha_context_free: %u references besides ours, %u of them in CLBlast's cache\n",
                      left - 1, left - rel_context_refs(cl));
        assert_int_equal(rel_context_refs_settled(cl, 1), 1);
    }
    assert_int_equal(clReleaseContext(cl), CL_SUCCESS);
}

/* A trim right after enqueueing, then a call of another shape that grows the workspace anew:
 * both results right (the in-order queue keeps released buffers alive until their work ran). */
static void trim_while_queue_holds_work(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s1 = {1, 300, 64, 4, 32, 2}, s2 = {2, 45, 32, 3, 24, 3};
    iha_attention_options o;
    iha_attention_options_init(&o);
    tu_layer l1, l2;
    tu_layer_init(&l1, &s1, 50);
    tu_layer_init(&l2, &s2, 51);
    double *r1 = tu_layer_reference(&l1, &o), *r2 = tu_layer_reference(&l2, &o);
    tu_device_layer d1, d2;
    tu_device_layer_upload(tu_ctx, &l1, 0, &d1);
    tu_device_layer_upload(tu_ctx, &l2, 1, &d2);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s1, &o, &d1.weights, d1.x, d1.z), IHA_OK);
    iha_context_trim(tu_ctx);
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s2, &o, &d2.weights, d2.x, d2.z), IHA_OK);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    const size_t n1 = tu_count_x(&s1), n2 = tu_count_x(&s2);
    float *z = tu_malloc((n1 > n2 ? n1 : n2) * sizeof *z);
    tu_buffer_read(tu_ctx, d1.z.mem, d1.z.offset, z, n1);
    tu_assert_close("z of the call before the trim", z, r1, n1, TU_TOL_F32);
    tu_buffer_read(tu_ctx, d2.z.mem, d2.z.offset, z, n2);
    tu_assert_close("z of the call after the trim", z, r2, n2, TU_TOL_F32);
    free(z);
    free(r1);
    free(r2);
    tu_device_layer_release(&d1);
    tu_device_layer_release(&d2);
    tu_layer_free(&l1);
    tu_layer_free(&l2);
}

int main(int argc, char **argv)
{
    tu_init_environment();
    if (argc == 4 && strcmp(argv[1], "--cache-full-child") == 0)
        return cache_full_child(argv[2], atol(argv[3]));
    if (argc == 4 && strcmp(argv[1], "--load-child") == 0)
        return load_child(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "--address-space-child") == 0)
        return address_space_child(argv[2], argv[3]);
    if (argc == 2 && strcmp(argv[1], "--exit-child") == 0)
        return 0;
    if (argc == 2)
        cmocka_set_test_filter(argv[1]); /* a developer runs one case: test_faults NAME_PATTERN */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_kernel_fails_to_build),
        cmocka_unit_test(device_refuses_an_allocation),
        cmocka_unit_test(workspace_refusal_between_good_calls),
        cmocka_unit_test(cache_dir_cannot_be_created),
        cmocka_unit_test(cache_dir_full),
        cmocka_unit_test(cache_entries_cut_mid_write),
        cmocka_unit_test(cache_entry_pocl_cannot_load),
        cmocka_unit_test(cache_entry_with_an_empty_record),
        cmocka_unit_test(binary_check_refuses_malformed_records),
        cmocka_unit_test(entry_of_a_dead_loader_is_retired),
        cmocka_unit_test(fifo_in_place_of_cache_files),
        cmocka_unit_test(binaries_need_address_space),
        cmocka_unit_test(profile_cut_mid_write),
        cmocka_unit_test(free_while_queue_holds_work),
        cmocka_unit_test(trim_while_queue_holds_work),
    };
    return cmocka_run_group_tests(tests, tu_group_setup, tu_group_teardown);
}
