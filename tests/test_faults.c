/*
 * test_faults.c - the fault paths of the layer calls: each gives a clear status and message,
 * loses nothing (the output untouched, no OpenCL object leaked, the context still correct
 * afterwards) and crashes nothing.
 *   - one kernel source that fails to build (IHA_ERROR_BUILD with the compiler's log), then
 *     repaired under the same context;
 *   - a device allocation the OpenCL implementation refuses (a 4 GiB host tensor, above PoCL's
 *     largest allocation), and an internal buffer beyond the device between good calls;
 *   - a tuning profile truncated mid-write: ignored and reported, never fatal;
 *   - the context freed while its queue still holds work, and trimmed while it does.
 * On PoCL, where every OpenCL object holds a reference to its context, the context's reference
 * count shows that nothing was leaked (CLBlast's process-wide program cache is cleared first).
 * The program cache's faults are in test_disk_cache.c, PoCL's binaries in test_pocl_binary.c.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/attention.h"
#include "reliability.h"
#include "test_layer.h"
#include "test_util.h"

/* ---- A kernel that fails to build ---- */

#define BROKEN_TEXT "\n#error deliberately broken by test_faults\n"

static void one_kernel_fails_to_build(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char kdir[4096], cache[4096], from[4300], to[4300];
    tu_temp_dir(kdir, sizeof kdir);
    tu_temp_dir(cache, sizeof cache);
    tu_copy_job job = {kdir, NULL};
    assert_true(tu_for_each_file(IHA_TEST_SOURCE_DIR "/cl", tu_copy_into, &job) > 0);
    /* The three attention kernels are broken; the message must name the one this device builds
     * (the register-tile kernel on CPUs, a local-memory one on GPUs), indexed by variant. */
    static const char *const broken[3] = {"attention.cl", "attention_local.cl", "attention_local_tiles.cl"};
    for (int i = 0; i < 3; i++) {
        snprintf(from, sizeof from, "%s/cl/%s", IHA_TEST_SOURCE_DIR, broken[i]);
        snprintf(to, sizeof to, "%s/%s", kdir, broken[i]);
        tu_copy_file(from, to, BROKEN_TEXT);
    }
    iha_attention_config builtin;
    iha__attention_config_default(tu_ctx, rel_small.head_dim, &builtin);

    iha_context *ctx = rel_open_with(cache, kdir);
    const iha_attention_options o = rel_small_options();
    tu_layer l;
    tu_layer_init(&l, &rel_small, 18);
    tu_device_layer d;
    tu_device_layer_upload(ctx, &l, 1, &d);
    const size_t nz = tu_count_x(&rel_small);

    /* The other stages build and are enqueued first; the attention kernel does not build. */
    tu_assert_status(ctx, iha_forward(ctx, &rel_small, &o, &d.weights, d.x, d.z), IHA_ERROR_BUILD);
    rel_expect_message(ctx, broken[builtin.variant]);
    rel_expect_message(ctx, "build log");
    rel_expect_message(ctx, "deliberately broken by test_faults"); /* the compiler's own words */
    assert_int_equal(iha_context_cl_error(ctx), CL_BUILD_PROGRAM_FAILURE);
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    tu_assert_guard(ctx, d.z.mem, nz, d.z.offset, TU_GUARD, TU_SENTINEL);
    float *z = tu_malloc(nz * sizeof *z);
    tu_buffer_read(ctx, d.z.mem, d.z.offset, z, nz);
    assert_int_equal(tu_count_nonfinite(z, nz), nz); /* still the NaN poison: z was not written */

    /* The same failure from the attention call alone, again with the log. */
    iha_shape as = rel_small;
    iha_attention_options ao = tu_options(IHA_MASK_CAUSAL, 0, 0);
    const size_t nv = tu_count_virtual(&as);
    cl_mem in = tu_buffer_guarded(ctx, NULL, 0, 0, nv, 0.5f), out = tu_buffer_guarded(ctx, NULL, 0, 0, nv, 0.25f);
    iha_buffer ib = {in, 0}, ob = {out, 0}, none = {NULL, 0};
    tu_assert_status(ctx, iha_attention(ctx, &as, &ao, ib, ib, ib, ob, none), IHA_ERROR_BUILD);
    rel_expect_message(ctx, "deliberately broken by test_faults");
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    tu_assert_buffer_all(ctx, out, 0, nv, 0.25f);
    /* Failing again keeps no OpenCL object: the count after a trim is the same as after the
     * first failure (whose good programs, mixing and packing, the context keeps). */
    iha_context_trim(ctx);
    const unsigned refs = rel_context_refs_quiet(iha_context_cl_context(ctx));
    for (int i = 0; i < 3; i++) {
        tu_assert_status(ctx, iha_forward(ctx, &rel_small, &o, &d.weights, d.x, d.z), IHA_ERROR_BUILD);
        tu_assert_status(ctx, iha_attention(ctx, &as, &ao, ib, ib, ib, ob, none), IHA_ERROR_BUILD);
    }
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    iha_context_trim(ctx);
    if (rel_refs_count_objects(ctx))
        assert_true(rel_context_refs_settled(iha_context_cl_context(ctx), refs) <= refs);
    tu_buffer_release(in);
    tu_buffer_release(out);

    /* Repaired, the same context builds it on the next call and computes the right z. */
    for (int i = 0; i < 3; i++) {
        snprintf(from, sizeof from, "%s/cl/%s", IHA_TEST_SOURCE_DIR, broken[i]);
        snprintf(to, sizeof to, "%s/%s", kdir, broken[i]);
        tu_copy_file(from, to, NULL);
    }
    double *zref = tu_layer_reference(&l, &o);
    tu_assert_status(ctx, iha_forward(ctx, &rel_small, &o, &d.weights, d.x, d.z), IHA_OK);
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
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);

    cl_context cl = iha_context_cl_context(tu_ctx);
    iha_context_trim(tu_ctx);
    const unsigned refs = rel_context_refs_quiet(cl);
    iha_status st = iha_forward_host(tu_ctx, &s, &o, &hw, x, z);
    print_message("4 GiB host tensor: %s: %s\n", iha_status_name(st), iha_context_message(tu_ctx));
    tu_assert_status(tu_ctx, st, IHA_ERROR_DEVICE_MEMORY);
    rel_expect_message(tu_ctx, "clCreateBuffer");
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
    rel_check_small(tu_ctx, TU_API_HOST);
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
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    iha_status st = iha_forward(tu_ctx, big, &o, &weights, (iha_buffer){x, 0}, (iha_buffer){z, 0});
    tu_assert_status(tu_ctx, st, IHA_ERROR_DEVICE_MEMORY);
    rel_expect_message(tu_ctx, needle);
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
    rel_check_small(tu_ctx, TU_API_DEVICE);

    /* H = 2 heads of d = 256: 2 KiB per token in Q, and P = 4 times that in each pseudo tensor. */
    const size_t token_bytes = 2 * 256 * sizeof(float), P = 4;
    /* Q alone is too large (and so, on most devices, are all the buffers together: either refusal
     * comes first). */
    const iha_shape one = {1, (size_t)(max_alloc / token_bytes) + 1, 1, 2, 256, P};
    expect_refused(&one, "the device's");
    rel_check_small(tu_ctx, TU_API_DEVICE_OFFSETS);

    /* Q, K, V, Y of t bytes and 4 pseudo tensors of P*t (each within the largest allocation): 20t. */
    const iha_shape together = {1, (size_t)(max_alloc / (P * token_bytes)), 1, 2, 256, P};
    if ((cl_ulong)together.tokens * token_bytes * (4 + 4 * P) > global)
        expect_refused(&together, "exceed the device's memory");
    else
        printf("the device's largest allocation (%llu bytes) is under a fifth of its memory (%llu): "
               "no shape fits the one and not the other\n", (unsigned long long)max_alloc, (unsigned long long)global);
    rel_check_small(tu_ctx, TU_API_DEVICE_OFFSETS);
    rel_check_small(tu_ctx, TU_API_HOST);
}

/* ---- A tuning profile cut mid-write ---- */

static void profile_cut_mid_write(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[4096], path[4200];
    tu_temp_path(dir, sizeof dir, path, sizeof path, "profile.json");
    static const char whole[] =
        "{\"format\": \"iha-tuning-profile\", \"format_version\": 1, \"key\": {\"vendor_id\": 0}, \"entries\": []}";
    const size_t cuts[] = {0, 1, 20, sizeof whole / 2, sizeof whole - 2};
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(whole, 1, cuts[c], f), cuts[c]);
        assert_int_equal(fclose(f), 0);
        iha_context *ctx = NULL;
        char message[1024] = "";
        iha_status st = tu_context_create_at(&ctx, (tu_places){.profile = path}, message, sizeof message);
        if (st != IHA_OK)
            fail_msg("a profile cut at %zu bytes made iha_context_create fail: %s", cuts[c], message);
        iha_profile_info info;
        tu_assert_status(ctx, iha_context_profile(ctx, &info), IHA_ERROR_PROFILE);
        assert_int_equal(info.state, IHA_PROFILE_IGNORED);
        assert_true(strlen(info.message) > 0);
        assert_true(strlen(iha_context_message(ctx)) > 0);
        rel_check_small(ctx, TU_API_HOST);
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
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    iha_context *ctx = rel_open_with(NULL, NULL);
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
        zref[i] = tu_layer_with_reference(&l[i], &s, 40 + (uint64_t)i, &o);
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
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
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
    tu_init_environment(); /* before a child's work too */
    if (argc == 2 && strcmp(argv[1], "--exit-child") == 0)
        return 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_kernel_fails_to_build),
        cmocka_unit_test(device_refuses_an_allocation),
        cmocka_unit_test(workspace_refusal_between_good_calls),
        cmocka_unit_test(profile_cut_mid_write),
        cmocka_unit_test(free_while_queue_holds_work),
        cmocka_unit_test(trim_while_queue_holds_work),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
