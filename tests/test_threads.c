/*
 * test_threads.c - the concurrency guarantees of iha.h:
 *   - several threads, each with its own context, at once, filling one cold program cache;
 *   - several threads sharing one context behind the application's mutex, each with its own
 *     buffers and its own queue on the shared cl_context for transfers, one of them failing on
 *     purpose (the message read under the lock is its own);
 *   - two processes filling the same cache directory at the same moment, then a third that
 *     loads what they wrote.
 * Threads do no CMocka assertions (CMocka is not thread-safe): they record, the main thread
 * checks. Every result is compared with the float64 reference.
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
#include <unistd.h>

#include "reliability.h"
#include "test_layer.h"
#include "test_util.h"


enum { THREADS = 4, ROUNDS = 3 };

/* Different head widths, so that the threads build different programs at the same time. */
static const iha_shape kShapes[THREADS] = {
    {1, 21, 24, 2, 40, 3}, {2, 13, 20, 3, 16, 2}, {1, 30, 16, 1, 9, 4}, {2, 9, 32, 2, 64, 1}};

static iha_attention_options shape_options(int i)
{
    iha_attention_options o = tu_options(i % 3, i == 1 ? 3 : 0, kShapes[i].head_dim % 2 == 0);
    return o;
}

typedef struct job {
    int index;
    const char *cache_dir;
    const tu_layer *layer;
    iha_attention_options options;
    float *z[ROUNDS];
    iha_status status;
    char message[512];
} job;

static void record(job *j, iha_status st, const char *message)
{
    if (j->status == IHA_OK && st != IHA_OK) {
        j->status = st;
        snprintf(j->message, sizeof j->message, "%s", message);
    }
}

/* ---- Threads with their own contexts ---- */

static void *own_context_thread(void *arg)
{
    job *j = arg;
    iha_context *ctx = NULL;
    char message[512] = "";
    record(j, tu_context_create_at(&ctx, (tu_places){.cache_dir = j->cache_dir}, message, sizeof message), message);
    const tu_layer *l = j->layer;
    const iha_host_weights w = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    for (int r = 0; r < ROUNDS && j->status == IHA_OK; r++) {
        iha_status st = iha_forward_host(ctx, &l->shape, &j->options, &w, l->x, j->z[r]);
        record(j, st, iha_context_message(ctx));
    }
    iha_context_free(ctx);
    return NULL;
}

static void jobs_init(job *jobs, tu_layer *layers, double **zref, const char *cache_dir)
{
    for (int i = 0; i < THREADS; i++) {
        tu_layer_init(&layers[i], &kShapes[i], 600 + (uint64_t)i);
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].index = i;
        jobs[i].cache_dir = cache_dir;
        jobs[i].layer = &layers[i];
        jobs[i].options = shape_options(i);
        for (int r = 0; r < ROUNDS; r++) {
            jobs[i].z[r] = tu_malloc(tu_count_x(&kShapes[i]) * sizeof(float));
            tu_fill_nan(jobs[i].z[r], tu_count_x(&kShapes[i]));
        }
        zref[i] = tu_layer_reference(&layers[i], &jobs[i].options);
    }
}

static void jobs_check_and_free(job *jobs, tu_layer *layers, double **zref)
{
    for (int i = 0; i < THREADS; i++) {
        if (jobs[i].status != IHA_OK)
            fail_msg("thread %d: %s: %s", i, iha_status_name(jobs[i].status), jobs[i].message);
        for (int r = 0; r < ROUNDS; r++) {
            char what[64];
            snprintf(what, sizeof what, "z of thread %d, round %d", i, r);
            tu_assert_close(what, jobs[i].z[r], zref[i], tu_count_x(&kShapes[i]), TU_TOL_F32);
            free(jobs[i].z[r]);
        }
        free(zref[i]);
        tu_layer_free(&layers[i]);
    }
}

static void threads_with_own_contexts(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char cache[4096];
    tu_temp_dir(cache, sizeof cache);
    job jobs[THREADS];
    tu_layer layers[THREADS];
    double *zref[THREADS];
    pthread_t threads[THREADS];
    jobs_init(jobs, layers, zref, cache);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, own_context_thread, &jobs[i]), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    jobs_check_and_free(jobs, layers, zref);
    rel_cache_census c = rel_cache_scan(cache);
    assert_true(c.valid > 0);
    assert_int_equal(c.broken + c.temporary, 0);
    tu_remove_tree(cache);
}

/* ---- Threads sharing one context behind a mutex ---- */

typedef struct shared {
    iha_context *ctx;
    pthread_mutex_t lock;
} shared;

typedef struct shared_job {
    job base;
    shared *s;
    int wrong_message; /* the failing call's message, read under the lock, was not its own */
} shared_job;

static cl_mem new_buffer(cl_context cl, cl_command_queue q, const float *data, size_t n, cl_int *err)
{
    cl_mem m = clCreateBuffer(cl, CL_MEM_READ_WRITE, n * sizeof(float), NULL, err);
    if (*err == CL_SUCCESS && data)
        *err = clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n * sizeof(float), data, 0, NULL, NULL);
    return m;
}

static void *shared_context_thread(void *arg)
{
    shared_job *sj = arg;
    job *j = &sj->base;
    const tu_layer *l = j->layer;
    iha_context *ctx = sj->s->ctx;
    /* Outside the lock the thread uses OpenCL directly: its own queue on the shared context. */
    cl_context cl = iha_context_cl_context(ctx);
    cl_int err = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueue(cl, iha_context_cl_device(ctx), 0, &err);
    const size_t nx = tu_count_x(&l->shape), nw = tu_count_w(&l->shape), nm = tu_count_mix(&l->shape);
    const float *src[10] = {l->x, NULL, l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    const size_t len[10] = {nx, nx, nw, nw, nw, nw, nm, nm, nm, nm};
    cl_mem m[10] = {NULL};
    for (int i = 0; i < 10 && err == CL_SUCCESS; i++)
        m[i] = new_buffer(cl, q, src[i], len[i], &err);
    if (err != CL_SUCCESS)
        record(j, IHA_ERROR_OPENCL, "buffer setup failed");
    const iha_layer_weights w = {{m[2], 0}, {m[3], 0}, {m[4], 0}, {m[5], 0},
                                 {m[6], 0}, {m[7], 0}, {m[8], 0}, {m[9], 0}};
    for (int r = 0; r < ROUNDS && j->status == IHA_OK; r++) {
        pthread_mutex_lock(&sj->s->lock);
        iha_status st = iha_forward(ctx, &l->shape, &j->options, &w, (iha_buffer){m[0], 0}, (iha_buffer){m[1], 0});
        if (st == IHA_OK)
            st = iha_context_finish(ctx);
        record(j, st, iha_context_message(ctx));
        if (j->index == 0 && r == 1) { /* a refused call: z is too small for an offset of nx */
            iha_status refused =
                iha_forward(ctx, &l->shape, &j->options, &w, (iha_buffer){m[0], 0}, (iha_buffer){m[1], nx});
            sj->wrong_message = refused != IHA_ERROR_BUFFER_TOO_SMALL || !strstr(iha_context_message(ctx), "buffer z");
        }
        pthread_mutex_unlock(&sj->s->lock);
        if (st == IHA_OK &&
            clEnqueueReadBuffer(q, m[1], CL_TRUE, 0, nx * sizeof(float), j->z[r], 0, NULL, NULL) != CL_SUCCESS)
            record(j, IHA_ERROR_OPENCL, "reading z failed");
    }
    for (int i = 0; i < 10; i++)
        if (m[i])
            clReleaseMemObject(m[i]);
    if (q)
        clReleaseCommandQueue(q);
    return NULL;
}

static void threads_share_one_context(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    shared s = {tu_ctx, PTHREAD_MUTEX_INITIALIZER};
    job jobs[THREADS];
    shared_job sjobs[THREADS];
    tu_layer layers[THREADS];
    double *zref[THREADS];
    pthread_t threads[THREADS];
    jobs_init(jobs, layers, zref, NULL);
    for (int i = 0; i < THREADS; i++) {
        sjobs[i] = (shared_job){jobs[i], &s, 0};
        assert_int_equal(pthread_create(&threads[i], NULL, shared_context_thread, &sjobs[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        jobs[i] = sjobs[i].base;
        assert_false(sjobs[i].wrong_message);
    }
    jobs_check_and_free(jobs, layers, zref);
}

/* ---- Two processes filling one cache directory ---- */

/* A child: waits until `go` exists (so that both start together), then runs every shape of
 * kShapes with the cache in `dir` and checks the results. Exit 0 when all are right. */
static int fill_cache_child(const char *dir, const char *go)
{
    for (int i = 0; i < 30000 && access(go, F_OK) != 0; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    iha_context *ctx = NULL;
    char message[512] = "";
    if (tu_context_create_at(&ctx, (tu_places){.cache_dir = dir}, message, sizeof message) != IHA_OK) {
        fprintf(stderr, "fill-cache child: %s\n", message);
        return 2;
    }
    int rc = 0;
    for (int i = 0; i < THREADS && rc == 0; i++) {
        const iha_attention_options o = shape_options(i);
        tu_layer l;
        double *zref = tu_layer_with_reference(&l, &kShapes[i], 600 + (uint64_t)i, &o);
        const size_t nz = tu_count_x(&kShapes[i]);
        float *z = tu_malloc(nz * sizeof *z);
        tu_fill_nan(z, nz);
        const iha_host_weights w = {l.wq, l.wk, l.wv, l.wo, l.alpha_q, l.alpha_k, l.alpha_v, l.r};
        iha_status st = iha_forward_host(ctx, &kShapes[i], &o, &w, l.x, z);
        if (st != IHA_OK || tu_count_nonfinite(z, nz) || tu_rel_l2(z, zref, nz) > TU_TOL_F32) {
            fprintf(stderr, "fill-cache child, shape %d: %s: %s\n", i, iha_status_name(st), iha_context_message(ctx));
            rc = 3;
        }
        free(z);
        free(zref);
        tu_layer_free(&l);
    }
    iha_context_free(ctx);
    return rc;
}

static void two_processes_fill_one_cache(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    char dir[4096], cache[4200], go[4200];
    tu_temp_path(dir, sizeof dir, cache, sizeof cache, "cache");
    snprintf(go, sizeof go, "%s/go", dir);
    const char *args[] = {"--fill-cache-child", cache, go, NULL};
    pid_t a = rel_spawn_self(args), b = rel_spawn_self(args);
    FILE *f = fopen(go, "wb");
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
    int ra = rel_wait(a), rb = rel_wait(b);
    if (ra != 0 || rb != 0)
        fail_msg("the processes exited with %d and %d", ra, rb);
    rel_cache_census c = rel_cache_scan(cache);
    if (c.valid == 0 || c.broken || c.temporary)
        fail_msg("after two writers: %zu valid, %zu broken, %zu temporary entries", c.valid, c.broken, c.temporary);
    /* A third process loads what they wrote (and has nothing left to add). */
    unlink(go);
    f = fopen(go, "wb");
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(rel_wait(rel_spawn_self(args)), 0);
    rel_cache_census after = rel_cache_scan(cache);
    assert_int_equal(after.valid, c.valid);
    assert_int_equal(after.broken + after.temporary, 0);
    tu_remove_tree(dir);
}

int main(int argc, char **argv)
{
    tu_init_environment(); /* before a child's work too */
    if (argc == 4 && strcmp(argv[1], "--fill-cache-child") == 0)
        return fill_cache_child(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(threads_with_own_contexts),
        cmocka_unit_test(threads_share_one_context),
        cmocka_unit_test(two_processes_fill_one_cache),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
