/*
 * test_context.c - the context: version, create/free (free(NULL) too), device choice ("P:D",
 * case-insensitive name substrings, "cpu"/"gpu", IHA_DEVICE and its override by the option),
 * borrowing the application's cl_context and queue (which must keep working afterwards), stage
 * times, trim, kernel sources read from a directory (and a build failure that reports its log),
 * and the on-disk program cache: files appear, a warm cache and a corrupted cache (truncated,
 * garbage, emptied, damaged payload) still give correct results, and "off" (in any case)
 * writes nothing; a NULL out gets its reason in the caller's buffer; device strings come whole.
 * Cache tests look only at what appears in the directory, never at file names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "test_layer.h"


/* One small layer with every stage in use (rotary, window, P > 1), run and checked on ctx. */
static void check_small_forward(iha_context *ctx, tu_api api)
{
    const iha_shape shape = {2, 9, 16, 2, 16, 2};
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.rope = 1;
    o.window = 3;
    tu_layer l;
    tu_layer_init(&l, &shape, 91);
    double *zref = tu_layer_reference(&l, &o);
    tu_layer_check_forward(ctx, &l, &o, api, zref, TU_TOL_F32);
    free(zref);
    tu_layer_free(&l);
}

/* Creates a context from options or fails the test with the status and message. */
static iha_context *open_or_fail(const iha_context_options *options)
{
    iha_context *ctx = NULL;
    char message[1024] = "";
    iha_status st = iha_context_create(&ctx, options, message, sizeof message);
    if (st != IHA_OK)
        fail_msg("iha_context_create: %s: %s", iha_status_name(st), message);
    assert_non_null(ctx);
    return ctx;
}

/* ---- Environment save and restore ---- */

typedef struct saved_env {
    const char *name;
    char *value; /* NULL: was unset */
} saved_env;

static saved_env env_save(const char *name)
{
    const char *value = getenv(name);
    saved_env e = {name, value ? strdup(value) : NULL};
    return e;
}

static void env_restore(saved_env *e)
{
    if (e->value)
        setenv(e->name, e->value, 1);
    else
        unsetenv(e->name);
    free(e->value);
    e->value = NULL;
}

/* ---- Version, create and free ---- */

static void version_create_and_free(void **state)
{
    (void)state;
    assert_int_equal(iha_version_number(), IHA_VERSION_NUMBER);
    assert_string_equal(iha_version_string(), IHA_VERSION_STRING);
    iha_context_free(NULL);
    TU_REQUIRE_DEVICE(tu_ctx);

    iha_context_options options;
    memset(&options, 0x5a, sizeof options);
    iha_context_options_init(&options);
    assert_null(options.device);
    assert_null(options.cache_dir);
    assert_null(options.kernel_dir);
    assert_null(options.opencl_context);
    assert_null(options.opencl_queue);
    assert_int_equal(options.time_stages, 0);

    iha_context *ctx = open_or_fail(NULL);
    assert_non_null(iha_context_cl_context(ctx));
    assert_non_null(iha_context_cl_queue(ctx));
    assert_non_null(iha_context_cl_device(ctx));
    assert_non_null(iha_context_device_name(ctx));
    assert_true(strlen(iha_context_device_name(ctx)) > 0);
    assert_string_equal(iha_context_message(ctx), "");
    assert_int_equal(iha_context_cl_error(ctx), 0);
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    iha_context_trim(ctx); /* nothing allocated yet */
    iha_context_free(ctx);

    iha_attention_options ao;
    memset(&ao, 0x5a, sizeof ao);
    iha_attention_options_init(&ao);
    assert_int_equal(ao.mask, IHA_MASK_CAUSAL);
    assert_int_equal(ao.window, 0);
    assert_true(ao.scale == 0.0f);
    assert_int_equal(ao.rope, 0);
    assert_true(ao.rope_base == 0.0f);
}

/* ---- Device choice ---- */

/* Every device iha_devices_list reports (malloc'ed; free it). */
static iha_device_info *list_devices(size_t *count)
{
    assert_int_equal(iha_devices_list(NULL, 0, count), IHA_OK);
    assert_true(*count > 0);
    iha_device_info *info = tu_malloc(*count * sizeof *info);
    size_t again = 0;
    assert_int_equal(iha_devices_list(info, *count, &again), IHA_OK);
    assert_int_equal(again, *count);
    return info;
}

static int contains_nocase(const char *haystack, const char *needle)
{
    size_t n = strlen(needle);
    for (; *haystack; haystack++) {
        size_t i = 0;
        while (i < n && haystack[i] && tolower((unsigned char)haystack[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return 1;
    }
    return 0;
}

static cl_device_type device_type(iha_context *ctx)
{
    cl_device_type type = 0;
    assert_int_equal(clGetDeviceInfo(iha_context_cl_device(ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL),
                     CL_SUCCESS);
    return type;
}

static iha_status try_spec(const char *spec, iha_context **out)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.device = spec;
    char message[512] = "";
    iha_status st = iha_context_create(out, &options, message, sizeof message);
    if (st != IHA_OK) {
        assert_null(*out);
        assert_true(strlen(message) > 0);
    }
    return st;
}

/* Without a context there is nowhere else for the reason: it goes to the caller's buffer. */
static void create_with_null_out_says_why(void **state)
{
    (void)state;
    char message[256] = "unchanged";
    assert_int_equal(iha_context_create(NULL, NULL, message, sizeof message), IHA_ERROR_INVALID_ARGUMENT);
    if (strstr(message, "out") == NULL)
        fail_msg("the message does not say that out is NULL: \"%s\"", message);
    assert_int_equal(iha_context_create(NULL, NULL, NULL, 0), IHA_ERROR_INVALID_ARGUMENT);
}

/* The whole string of clGetDeviceInfo, malloc'ed. */
static char *device_string(cl_device_id device, cl_device_info what)
{
    size_t size = 0;
    assert_int_equal(clGetDeviceInfo(device, what, 0, NULL, &size), CL_SUCCESS);
    char *s = tu_malloc(size + 1);
    assert_int_equal(clGetDeviceInfo(device, what, size, s, NULL), CL_SUCCESS);
    s[size] = '\0';
    return s;
}

/* A field holds the driver's string whole when it fits, else a non-empty prefix of it. */
static void assert_string_kept(const char *what, const char *field, size_t capacity, const char *whole)
{
    if (strlen(whole) < capacity) {
        if (strcmp(field, whole) != 0)
            fail_msg("%s is \"%s\", the driver says \"%s\"", what, field, whole);
    } else if (field[0] == '\0' || strncmp(field, whole, strlen(field)) != 0) {
        fail_msg("%s is \"%s\", not a prefix of the driver's \"%s\"", what, field, whole);
    }
}

/* Every device's strings as the driver reports them, however long (PoCL's version string is
 * exactly 64 characters on Debian 12's PoCL 3.1). */
static void device_strings_are_whole(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    size_t count = 0;
    assert_int_equal(iha_devices_list(NULL, 0, &count), IHA_OK);
    iha_device_info *info = tu_malloc(count * sizeof *info);
    assert_int_equal(iha_devices_list(info, count, &count), IHA_OK);
    cl_platform_id platforms[16];
    cl_uint np = 0;
    assert_int_equal(clGetPlatformIDs(16, platforms, &np), CL_SUCCESS);
    for (size_t i = 0; i < count; i++) {
        cl_device_id devices[64];
        cl_uint nd = 0;
        assert_true(info[i].platform_index < np);
        assert_int_equal(clGetDeviceIDs(platforms[info[i].platform_index], CL_DEVICE_TYPE_ALL, 64, devices, &nd),
                         CL_SUCCESS);
        const cl_device_id d = devices[info[i].device_index];
        const struct {
            const char *name;
            cl_device_info what;
            const char *field;
            size_t capacity;
        } strings[] = {
            {"device_name", CL_DEVICE_NAME, info[i].device_name, sizeof info[i].device_name},
            {"device_vendor", CL_DEVICE_VENDOR, info[i].device_vendor, sizeof info[i].device_vendor},
            {"driver_version", CL_DRIVER_VERSION, info[i].driver_version, sizeof info[i].driver_version},
            {"device_version", CL_DEVICE_VERSION, info[i].device_version, sizeof info[i].device_version},
        };
        for (size_t k = 0; k < sizeof strings / sizeof *strings; k++) {
            char *whole = device_string(d, strings[k].what);
            assert_string_kept(strings[k].name, strings[k].field, strings[k].capacity, whole);
            free(whole);
        }
    }
    free(info);
}

static void device_by_index(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    size_t count;
    iha_device_info *info = list_devices(&count);
    for (size_t i = 0; i < count && i < 4; i++) {
        char spec[32];
        snprintf(spec, sizeof spec, "%u:%u", info[i].platform_index, info[i].device_index);
        iha_context *ctx = NULL;
        iha_status st = try_spec(spec, &ctx);
        if (st != IHA_OK)
            fail_msg("device \"%s\" (%s): %s", spec, info[i].device_name, iha_status_name(st));
        assert_string_equal(iha_context_device_name(ctx), info[i].device_name);
        iha_context_free(ctx);
    }
    free(info);
}

/* What kinds of device are installed. */
static void installed_kinds(int *pocl, int *cpu, int *gpu)
{
    size_t count;
    iha_device_info *info = list_devices(&count);
    *pocl = *cpu = *gpu = 0;
    for (size_t i = 0; i < count; i++) {
        *pocl |= contains_nocase(info[i].platform_name, "pocl") || contains_nocase(info[i].platform_version, "pocl") ||
                 contains_nocase(info[i].platform_name, "Portable Computing Language");
        *cpu |= info[i].is_cpu;
        *gpu |= info[i].is_gpu;
    }
    free(info);
}

/* The header's own example: "pocl" in any case picks the PoCL platform (whose platform name is
 * "Portable Computing Language"; "PoCL" appears in its version and vendor strings). */
static void device_by_name_pocl(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    int pocl, cpu, gpu;
    installed_kinds(&pocl, &cpu, &gpu);
    if (!pocl)
        skip();
    static const char *specs[] = {"pocl", "PoCL", "POCL"};
    for (size_t i = 0; i < 3; i++) {
        iha_context *ctx = NULL;
        iha_status st = try_spec(specs[i], &ctx);
        if (st != IHA_OK)
            fail_msg("device \"%s\": %s although a PoCL platform is installed", specs[i], iha_status_name(st));
        iha_context_free(ctx);
    }
}

static void device_by_type(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    int pocl, cpu, gpu;
    installed_kinds(&pocl, &cpu, &gpu);
    iha_context *ctx = NULL;
    if (cpu) {
        assert_int_equal(try_spec("cpu", &ctx), IHA_OK);
        assert_true(device_type(ctx) & CL_DEVICE_TYPE_CPU);
        iha_context_free(ctx);
    }
    if (gpu) {
        assert_int_equal(try_spec("GPU", &ctx), IHA_OK);
        assert_true(device_type(ctx) & CL_DEVICE_TYPE_GPU);
        iha_context_free(ctx);
    } else {
        assert_int_equal(try_spec("gpu", &ctx), IHA_ERROR_NO_DEVICE);
    }
}

/* A piece of the first device's name, with its case flipped. */
static void device_by_name_piece(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    size_t count;
    iha_device_info *info = list_devices(&count);
    char piece[8] = "";
    const char *name = info[0].device_name;
    size_t len = strlen(name), start = len > 6 ? len / 3 : 0, take = len - start < 5 ? len - start : 5;
    for (size_t i = 0; i < take; i++) {
        unsigned char c = (unsigned char)name[start + i];
        piece[i] = (char)(isupper(c) ? tolower(c) : toupper(c));
    }
    piece[take] = '\0';
    iha_context *ctx = NULL;
    iha_status st = try_spec(piece, &ctx);
    if (st != IHA_OK)
        fail_msg("device \"%s\" (a piece of \"%s\"): %s", piece, name, iha_status_name(st));
    iha_context_free(ctx);
    free(info);
}

/* IHA_DEVICE applies when options.device is NULL; the option overrides it. */
static void device_from_environment(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    saved_env e = env_save("IHA_DEVICE");
    setenv("IHA_DEVICE", "no-such-device-xyz", 1);
    iha_context *ctx = NULL;
    iha_status from_env = try_spec(NULL, &ctx);
    iha_context_free(ctx);
    ctx = NULL;
    iha_status overridden = try_spec("0:0", &ctx);
    iha_context_free(ctx);
    env_restore(&e);
    assert_int_equal(from_env, IHA_ERROR_NO_DEVICE);
    assert_int_equal(overridden, IHA_OK);
}

/* ---- Borrowing the application's OpenCL objects ---- */

static cl_uint reference_count(cl_context context, cl_command_queue queue)
{
    cl_uint count = 0;
    if (context)
        assert_int_equal(clGetContextInfo(context, CL_CONTEXT_REFERENCE_COUNT, sizeof count, &count, NULL), CL_SUCCESS);
    else
        assert_int_equal(clGetCommandQueueInfo(queue, CL_QUEUE_REFERENCE_COUNT, sizeof count, &count, NULL),
                         CL_SUCCESS);
    return count;
}

/* The queue's reference count once it has settled at `want` or above: PoCL drops the
 * references its finished commands hold on their queue from its worker threads, a moment after
 * clFinish has returned, so a count read at once can still include them (seen under load). */
static cl_uint settled_queue_references(cl_command_queue queue, cl_uint want)
{
    cl_uint count = reference_count(NULL, queue);
    int waited = 0;
    for (; waited < 200 && count > want; waited++) {
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        count = reference_count(NULL, queue);
    }
    if (waited > 0) print_message("the queue's reference count settled after %d ms\n", 10 * waited);
    return count;
}

static void borrow_application_queue(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    cl_device_id device = iha_context_cl_device(tu_ctx);
    cl_int err = CL_SUCCESS;
    cl_context app = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_command_queue queue = clCreateCommandQueue(app, device, 0, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_uint context_refs = reference_count(app, NULL), queue_refs = reference_count(NULL, queue);

    iha_context_options options;
    iha_context_options_init(&options);
    options.opencl_context = app;
    options.opencl_queue = queue;
    options.device = "no-such-device-xyz"; /* ignored when borrowing */
    iha_context *ctx = open_or_fail(&options);
    assert_ptr_equal(iha_context_cl_context(ctx), app);
    assert_ptr_equal(iha_context_cl_queue(ctx), queue);
    assert_ptr_equal(iha_context_cl_device(ctx), device);
    check_small_forward(ctx, TU_API_DEVICE); /* buffers made in `app` */
    check_small_forward(ctx, TU_API_HOST);

    /* Free the context while a forward may still be in flight: iha_context_free waits, and the
     * application's queue then reads the right z. */
    const iha_shape shape = {1, 40, 32, 2, 16, 2};
    iha_attention_options o;
    iha_attention_options_init(&o);
    tu_layer l;
    tu_layer_init(&l, &shape, 92);
    double *zref = tu_layer_reference(&l, &o);
    tu_device_layer d;
    tu_device_layer_upload(ctx, &l, 0, &d);
    tu_assert_status(ctx, iha_forward(ctx, &shape, &o, &d.weights, d.x, d.z), IHA_OK);
    iha_context_free(ctx);
    size_t nz = tu_count_x(&shape);
    float *z = tu_malloc(nz * sizeof *z);
    assert_int_equal(clEnqueueReadBuffer(queue, d.z.mem, CL_TRUE, 0, nz * sizeof *z, z, 0, NULL, NULL), CL_SUCCESS);
    tu_assert_close("z (read by the application after iha_context_free)", z, zref, nz, TU_TOL_F32);
    free(z);
    free(zref);
    tu_device_layer_release(&d);
    tu_layer_free(&l);

    /* The library released exactly its own references; the application's objects still work. */
    assert_int_equal(settled_queue_references(queue, queue_refs), queue_refs);
    assert_true(reference_count(app, NULL) >= context_refs);
    float in[16], out[16];
    for (int i = 0; i < 16; i++)
        in[i] = (float)i + 0.5f;
    cl_mem mem = clCreateBuffer(app, CL_MEM_READ_WRITE, sizeof in, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    assert_int_equal(clEnqueueWriteBuffer(queue, mem, CL_TRUE, 0, sizeof in, in, 0, NULL, NULL), CL_SUCCESS);
    assert_int_equal(clEnqueueReadBuffer(queue, mem, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL), CL_SUCCESS);
    assert_int_equal(clFinish(queue), CL_SUCCESS);
    assert_memory_equal(in, out, sizeof in);
    clReleaseMemObject(mem);
    assert_int_equal(clReleaseCommandQueue(queue), CL_SUCCESS);
    assert_int_equal(clReleaseContext(app), CL_SUCCESS);
}

static void borrow_refuses_bad_objects(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    cl_device_id device = iha_context_cl_device(tu_ctx);
    cl_int err = CL_SUCCESS;
    cl_context app = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_context other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_command_queue queue = clCreateCommandQueue(app, device, 0, &err);
    assert_int_equal(err, CL_SUCCESS);

    iha_context_options options;
    iha_context *ctx = NULL;
    char message[512];

    /* Half a borrow. */
    iha_context_options_init(&options);
    options.opencl_context = app;
    message[0] = '\0';
    assert_int_equal(iha_context_create(&ctx, &options, message, sizeof message), IHA_ERROR_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_true(strlen(message) > 0);
    iha_context_options_init(&options);
    options.opencl_queue = queue;
    message[0] = '\0';
    assert_int_equal(iha_context_create(&ctx, &options, message, sizeof message), IHA_ERROR_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_true(strlen(message) > 0);

    /* A queue of another context. */
    iha_context_options_init(&options);
    options.opencl_context = other;
    options.opencl_queue = queue;
    message[0] = '\0';
    iha_status st = iha_context_create(&ctx, &options, message, sizeof message);
    if (st == IHA_OK)
        iha_context_free(ctx);
    assert_int_equal(st, IHA_ERROR_INVALID_ARGUMENT);
    assert_true(strlen(message) > 0);

    /* An out-of-order queue, where the device offers one. */
    cl_command_queue ooo = clCreateCommandQueue(app, device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    if (err == CL_SUCCESS) {
        iha_context_options_init(&options);
        options.opencl_context = app;
        options.opencl_queue = ooo;
        message[0] = '\0';
        st = iha_context_create(&ctx, &options, message, sizeof message);
        if (st == IHA_OK)
            iha_context_free(ctx);
        assert_int_equal(st, IHA_ERROR_INVALID_ARGUMENT);
        assert_true(strlen(message) > 0);
        clReleaseCommandQueue(ooo);
    }
    clReleaseCommandQueue(queue);
    clReleaseContext(other);
    clReleaseContext(app);
}

/* ---- Stage times and trim ---- */

static void stage_times_when_asked(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_stage_times t;
    memset(&t, 0x5a, sizeof t);
    check_small_forward(tu_ctx, TU_API_DEVICE);
    iha_context_stage_times(tu_ctx, &t);
    assert_true(t.projections == 0.0 && t.mixing == 0.0 && t.attention == 0.0 && t.collapse == 0.0 &&
                t.output == 0.0);

    iha_context_options options;
    iha_context_options_init(&options);
    options.time_stages = 1;
    iha_context *ctx = open_or_fail(&options);
    check_small_forward(ctx, TU_API_DEVICE);
    iha_context_stage_times(ctx, &t);
    double all[5] = {t.projections, t.mixing, t.attention, t.collapse, t.output};
    for (int i = 0; i < 5; i++)
        if (!(all[i] > 0.0 && all[i] < 60.0))
            fail_msg("stage %d took %g s", i, all[i]);
    iha_context_free(ctx);
}

static void trim_then_forward(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    check_small_forward(tu_ctx, TU_API_DEVICE);
    iha_context_trim(tu_ctx);
    check_small_forward(tu_ctx, TU_API_DEVICE_OFFSETS);
    iha_context_trim(tu_ctx);
    iha_context_trim(tu_ctx);
    check_small_forward(tu_ctx, TU_API_HOST);
}

/* ---- Two contexts on two threads ---- */

/* What one thread does, without cmocka (its assertions must stay on the main thread). */
typedef struct thread_job {
    const tu_layer *layer;
    iha_attention_options options;
    float *z;
    iha_status status;
} thread_job;

static void *thread_run(void *arg)
{
    thread_job *job = arg;
    iha_context *ctx = NULL;
    job->status = iha_context_create(&ctx, NULL, NULL, 0);
    const tu_layer *l = job->layer;
    iha_host_weights w = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    for (int i = 0; i < 3 && job->status == IHA_OK; i++)
        job->status = iha_forward_host(ctx, &l->shape, &job->options, &w, l->x, job->z);
    iha_context_free(ctx);
    return NULL;
}

/* Different contexts may be used from different threads at the same time (iha.h). The two
 * layers differ in head width so that both threads build programs at once. */
static void two_contexts_on_two_threads(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape shapes[2] = {{1, 31, 24, 2, 40, 3}, {2, 17, 20, 3, 64, 2}};
    tu_layer layers[2];
    thread_job jobs[2];
    double *zref[2];
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) {
        tu_layer_init(&layers[i], &shapes[i], 300 + (uint64_t)i);
        iha_attention_options_init(&jobs[i].options);
        jobs[i].options.mask = i == 0 ? IHA_MASK_TOKEN_CAUSAL : IHA_MASK_CAUSAL;
        jobs[i].options.rope = 1;
        jobs[i].layer = &layers[i];
        jobs[i].z = tu_malloc(tu_count_x(&shapes[i]) * sizeof(float));
        tu_fill_nan(jobs[i].z, tu_count_x(&shapes[i]));
        zref[i] = tu_layer_reference(&layers[i], &jobs[i].options);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, thread_run, &jobs[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    for (int i = 0; i < 2; i++) {
        if (jobs[i].status != IHA_OK)
            fail_msg("thread %d: %s", i, iha_status_name(jobs[i].status));
        tu_assert_close(i == 0 ? "z (thread 0)" : "z (thread 1)", jobs[i].z, zref[i], tu_count_x(&shapes[i]),
                        TU_TOL_F32);
        free(jobs[i].z);
        free(zref[i]);
        tu_layer_free(&layers[i]);
    }
}

/* ---- Kernel sources from a directory ---- */

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

typedef struct copy_job {
    const char *to_dir, *append;
} copy_job;

static void copy_into(const char *path, void *arg)
{
    const copy_job *job = arg;
    const char *base = strrchr(path, '/');
    char to[4096];
    snprintf(to, sizeof to, "%s%s", job->to_dir, base);
    copy_file(path, to, job->append);
}

static void kernel_dir_from_source_tree(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_context_options options;
    iha_context_options_init(&options);
    options.kernel_dir = IHA_TEST_SOURCE_DIR "/cl";
    options.cache_dir = "off";
    iha_context *ctx = open_or_fail(&options);
    check_small_forward(ctx, TU_API_DEVICE);
    iha_context_free(ctx);
}

/* Every kernel source broken: the failure is IHA_ERROR_BUILD with the build log in the message
 * (at creation or at the first call, whichever builds). A missing directory is an error too. */
static void broken_kernel_source_reports_build_log(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[4096];
    tu_temp_dir(dir, sizeof dir);
    copy_job job = {dir, "\n#error deliberately broken by test_context\nthis is not OpenCL C;\n"};
    assert_true(tu_for_each_file(IHA_TEST_SOURCE_DIR "/cl", copy_into, &job) > 0);

    iha_context_options options;
    iha_context_options_init(&options);
    options.kernel_dir = dir;
    options.cache_dir = "off";
    iha_context *ctx = NULL;
    char message[4096] = "";
    iha_status st = iha_context_create(&ctx, &options, message, sizeof message);
    const char *log = message;
    if (st == IHA_OK) {
        const iha_shape shape = {1, 3, 8, 1, 4, 1};
        iha_attention_options o;
        iha_attention_options_init(&o);
        tu_layer l;
        tu_layer_init(&l, &shape, 5);
        float z[24];
        iha_host_weights w = {l.wq, l.wk, l.wv, l.wo, NULL, NULL, NULL, NULL};
        st = iha_forward_host(ctx, &shape, &o, &w, l.x, z);
        log = iha_context_message(ctx);
        tu_layer_free(&l);
    }
    if (st != IHA_ERROR_BUILD)
        fail_msg("broken kernels: %s (%s), expected IHA_ERROR_BUILD", iha_status_name(st), log);
    if (!strstr(log, "deliberately broken") && !contains_nocase(log, "error"))
        fail_msg("the message does not carry the build log: \"%s\"", log);
    iha_context_free(ctx);
    tu_remove_tree(dir);

    /* A kernel directory that does not exist. */
    options.kernel_dir = IHA_TEST_BINARY_DIR "/no-such-kernel-dir";
    ctx = NULL;
    message[0] = '\0';
    st = iha_context_create(&ctx, &options, message, sizeof message);
    log = message;
    if (st == IHA_OK) {
        const iha_shape shape = {1, 3, 8, 1, 4, 1};
        iha_attention_options o;
        iha_attention_options_init(&o);
        tu_layer l;
        tu_layer_init(&l, &shape, 5);
        float z[24];
        iha_host_weights w = {l.wq, l.wk, l.wv, l.wo, NULL, NULL, NULL, NULL};
        st = iha_forward_host(ctx, &shape, &o, &w, l.x, z);
        log = iha_context_message(ctx);
        tu_layer_free(&l);
    }
    if (st == IHA_OK || strlen(log) == 0)
        fail_msg("missing kernel directory: %s with message \"%s\"", iha_status_name(st), log);
    iha_context_free(ctx);
}

/* ---- The disk cache ---- */

static size_t count_files(const char *dir)
{
    return tu_for_each_file(dir, NULL, NULL);
}

/* One context with this cache setting: runs and checks a forward, then frees the context
 * (entries may be written at any point until then). */
static void run_with_cache(const char *cache_dir)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.cache_dir = cache_dir;
    iha_context *ctx = open_or_fail(&options);
    check_small_forward(ctx, TU_API_DEVICE);
    iha_context_free(ctx);
}

static void corrupt_truncate(const char *path, void *arg)
{
    (void)arg;
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size / 2), 0);
}

static void corrupt_empty(const char *path, void *arg)
{
    (void)arg;
    assert_int_equal(truncate(path, 0), 0);
}

/* Overwrites the file from byte `*(long *)arg` to its end (at least 256 bytes) with garbage. */
static void corrupt_garbage(const char *path, void *arg)
{
    long from = *(const long *)arg;
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    long size = st.st_size > 256 ? (long)st.st_size : 256;
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, from < size ? from : 0, SEEK_SET), 0);
    tu_rng rng;
    tu_rng_seed(&rng, (uint64_t)size);
    for (long i = from < size ? from : 0; i < size; i++)
        assert_int_not_equal(fputc((int)(tu_rng_next(&rng) & 0xff), f), EOF);
    assert_int_equal(fclose(f), 0);
}

static void count_nonempty(const char *path, void *arg)
{
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size > 0)
        ++*(size_t *)arg;
}

static void disk_cache_survives_corruption(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[4096];
    tu_temp_dir(dir, sizeof dir);

    run_with_cache(dir); /* cold: builds from source and writes entries */
    size_t entries = count_files(dir);
    if (entries == 0)
        fail_msg("no cache entries were written to %s", dir);
    run_with_cache(dir); /* warm: loads the entries */
    assert_true(count_files(dir) >= entries);

    long from_start = 0, after_header = 64;
    tu_for_each_file(dir, corrupt_truncate, NULL);
    run_with_cache(dir);
    tu_for_each_file(dir, corrupt_garbage, &from_start);
    run_with_cache(dir);
    tu_for_each_file(dir, corrupt_empty, NULL);
    run_with_cache(dir);
    /* Rebuilt programs are stored again in place of the broken entries. */
    size_t nonempty = 0;
    tu_for_each_file(dir, count_nonempty, &nonempty);
    if (nonempty == 0)
        fail_msg("after a rebuild every cache entry is still empty");
    run_with_cache(dir);
    /* Damage after an intact header is caught too. */
    tu_for_each_file(dir, corrupt_garbage, &after_header);
    run_with_cache(dir);
    run_with_cache(dir);
    tu_remove_tree(dir);
}

/* Runs with options.cache_dir = option after pointing IHA_CACHE_DIR (NULL: unset), XDG_CACHE_HOME
 * and HOME at the given values (NULL: unset), restoring them afterwards. */
static void run_with_env(const char *option, const char *iha_cache_dir, const char *xdg, const char *home)
{
    saved_env saved[3] = {env_save("IHA_CACHE_DIR"), env_save("XDG_CACHE_HOME"), env_save("HOME")};
    const char *values[3] = {iha_cache_dir, xdg, home};
    for (int i = 0; i < 3; i++) {
        if (values[i])
            setenv(saved[i].name, values[i], 1);
        else
            unsetenv(saved[i].name);
    }
    iha_context_options options;
    iha_context_options_init(&options);
    options.cache_dir = option;
    iha_context *ctx = NULL;
    char message[1024] = "";
    iha_status st = iha_context_create(&ctx, &options, message, sizeof message);
    for (int i = 0; i < 3; i++)
        env_restore(&saved[i]);
    if (st != IHA_OK)
        fail_msg("iha_context_create: %s: %s", iha_status_name(st), message);
    check_small_forward(ctx, TU_API_DEVICE);
    iha_context_free(ctx);
}

static void disk_cache_off_writes_nothing(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char env_dir[4096], xdg[4096], home[4096];
    tu_temp_dir(env_dir, sizeof env_dir);
    tu_temp_dir(xdg, sizeof xdg);
    tu_temp_dir(home, sizeof home);
    run_with_env("off", env_dir, xdg, home); /* the option wins over the environment */
    run_with_env(NULL, "off", xdg, home);    /* IHA_CACHE_DIR=off */
    assert_int_equal(count_files(env_dir), 0);
    assert_int_equal(count_files(xdg), 0);
    assert_int_equal(count_files(home), 0);
    tu_remove_tree(env_dir);
    tu_remove_tree(xdg);
    tu_remove_tree(home);
}

/* "off" in any case, as the option and in IHA_CACHE_DIR (and IHA_PROFILE): no directory named
 * after it appears where the process runs, nor anywhere else. */
static void disk_cache_off_in_any_case(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char cwd[4096], here[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    tu_temp_dir(here, sizeof here);
    assert_int_equal(chdir(here), 0);
    saved_env profile = env_save("IHA_PROFILE");
    setenv("IHA_PROFILE", "Off", 1);
    run_with_env("OFF", NULL, here, here);
    run_with_env(NULL, "Off", here, here);
    run_with_env(NULL, "oFF", here, here);
    env_restore(&profile);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(count_files(here), 0);
    tu_remove_tree(here);
}

static void disk_cache_location_defaults(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char env_dir[4096], option_dir[4096], xdg[4096], home[4096], path[4200];
    tu_temp_dir(env_dir, sizeof env_dir);
    tu_temp_dir(option_dir, sizeof option_dir);
    tu_temp_dir(xdg, sizeof xdg);
    tu_temp_dir(home, sizeof home);

    /* The option overrides IHA_CACHE_DIR. */
    run_with_env(option_dir, env_dir, xdg, home);
    assert_true(count_files(option_dir) > 0);
    assert_int_equal(count_files(env_dir), 0);
    /* IHA_CACHE_DIR, then $XDG_CACHE_HOME/iha, then ~/.cache/iha. */
    run_with_env(NULL, env_dir, xdg, home);
    assert_true(count_files(env_dir) > 0);
    assert_int_equal(count_files(xdg) + count_files(home), 0);
    run_with_env(NULL, NULL, xdg, home);
    snprintf(path, sizeof path, "%s/iha", xdg);
    assert_true(count_files(path) > 0);
    assert_int_equal(count_files(xdg), count_files(path));
    assert_int_equal(count_files(home), 0);
    run_with_env(NULL, NULL, NULL, home);
    snprintf(path, sizeof path, "%s/.cache/iha", home);
    assert_true(count_files(path) > 0);
    assert_int_equal(count_files(home), count_files(path));

    tu_remove_tree(env_dir);
    tu_remove_tree(option_dir);
    tu_remove_tree(xdg);
    tu_remove_tree(home);
}

int main(int argc, char **argv)
{
    tu_init_environment();
    if (argc == 2)
        cmocka_set_test_filter(argv[1]); /* a developer runs one case: test_context NAME_PATTERN */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(version_create_and_free),
        cmocka_unit_test(create_with_null_out_says_why),
        cmocka_unit_test(device_strings_are_whole),
        cmocka_unit_test(device_by_index),
        cmocka_unit_test(device_by_name_pocl),
        cmocka_unit_test(device_by_type),
        cmocka_unit_test(device_by_name_piece),
        cmocka_unit_test(device_from_environment),
        cmocka_unit_test(borrow_application_queue),
        cmocka_unit_test(borrow_refuses_bad_objects),
        cmocka_unit_test(stage_times_when_asked),
        cmocka_unit_test(trim_then_forward),
        cmocka_unit_test(two_contexts_on_two_threads),
        cmocka_unit_test(kernel_dir_from_source_tree),
        cmocka_unit_test(broken_kernel_source_reports_build_log),
        cmocka_unit_test(disk_cache_survives_corruption),
        cmocka_unit_test(disk_cache_off_writes_nothing),
        cmocka_unit_test(disk_cache_off_in_any_case),
        cmocka_unit_test(disk_cache_location_defaults),
    };
    return cmocka_run_group_tests(tests, tu_group_setup, tu_group_teardown);
}
