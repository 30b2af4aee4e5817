/*
 * test_context.c - the context: version, create/free (free(NULL) too), borrowing the
 * application's cl_context and queue (which must keep working afterwards), stage times, trim,
 * and two contexts on two threads. Device choice is test_device.c's, kernel sources and the
 * program cache test_program.c's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "test_layer.h"

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

    iha_context *ctx = tu_context_create_or_fail(NULL);
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

/* The application's own OpenCL context on the shared context's device; fails the test when it
 * cannot be made. */
static cl_context app_context(cl_device_id device)
{
    cl_int err = CL_SUCCESS;
    cl_context app = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    return app;
}

static void borrow_application_queue(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    cl_device_id device = iha_context_cl_device(tu_ctx);
    cl_int err = CL_SUCCESS;
    cl_context app = app_context(device);
    cl_command_queue queue = clCreateCommandQueue(app, device, 0, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_uint context_refs = reference_count(app, NULL), queue_refs = reference_count(NULL, queue);

    iha_context_options options;
    iha_context_options_init(&options);
    options.opencl_context = app;
    options.opencl_queue = queue;
    options.device = "no-such-device-xyz"; /* ignored when borrowing */
    iha_context *ctx = tu_context_create_or_fail(&options);
    assert_ptr_equal(iha_context_cl_context(ctx), app);
    assert_ptr_equal(iha_context_cl_queue(ctx), queue);
    assert_ptr_equal(iha_context_cl_device(ctx), device);
    tu_check_small_forward(ctx, TU_API_DEVICE); /* buffers made in `app` */
    tu_check_small_forward(ctx, TU_API_HOST);

    /* Free the context while a forward may still be in flight: iha_context_free waits, and the
     * application's queue then reads the right z. */
    const iha_shape shape = {1, 40, 32, 2, 16, 2};
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &shape, 92, &o);
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

/* A borrow of this OpenCL context and queue (either may be NULL) is refused with a message; a
 * context the library creates anyway is freed first. */
static void expect_borrow_refused(cl_context app, cl_command_queue queue)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.opencl_context = app;
    options.opencl_queue = queue;
    iha_context *ctx = NULL;
    char message[512] = "";
    const iha_status st = iha_context_create(&ctx, &options, message, sizeof message);
    if (st == IHA_OK)
        iha_context_free(ctx);
    assert_int_equal(st, IHA_ERROR_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_true(strlen(message) > 0);
}

static void borrow_refuses_bad_objects(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    cl_device_id device = iha_context_cl_device(tu_ctx);
    cl_int err = CL_SUCCESS;
    cl_context app = app_context(device), other = app_context(device);
    cl_command_queue queue = clCreateCommandQueue(app, device, 0, &err);
    assert_int_equal(err, CL_SUCCESS);

    /* Half a borrow. */
    expect_borrow_refused(app, NULL);
    expect_borrow_refused(NULL, queue);
    /* A queue of another context. */
    expect_borrow_refused(other, queue);
    /* An out-of-order queue, where the device offers one. */
    cl_command_queue ooo = clCreateCommandQueue(app, device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    if (err == CL_SUCCESS) {
        expect_borrow_refused(app, ooo);
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
    tu_check_small_forward(tu_ctx, TU_API_DEVICE);
    iha_context_stage_times(tu_ctx, &t);
    assert_true(t.projections == 0.0 && t.mixing == 0.0 && t.attention == 0.0 && t.collapse == 0.0 &&
                t.output == 0.0);

    iha_context_options options;
    iha_context_options_init(&options);
    options.time_stages = 1;
    iha_context *ctx = tu_context_create_or_fail(&options);
    tu_check_small_forward(ctx, TU_API_DEVICE);
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
    tu_check_small_forward(tu_ctx, TU_API_DEVICE);
    iha_context_trim(tu_ctx);
    tu_check_small_forward(tu_ctx, TU_API_DEVICE_OFFSETS);
    iha_context_trim(tu_ctx);
    iha_context_trim(tu_ctx);
    tu_check_small_forward(tu_ctx, TU_API_HOST);
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

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(version_create_and_free),
        cmocka_unit_test(borrow_application_queue),
        cmocka_unit_test(borrow_refuses_bad_objects),
        cmocka_unit_test(stage_times_when_asked),
        cmocka_unit_test(trim_then_forward),
        cmocka_unit_test(two_contexts_on_two_threads),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
