/*
 * test_util.h - what every test file shares: a seeded random source (values never zero), NaN
 * poisoning, the error measure of doc/spec.md's numerical contract, device buffers with guard regions,
 * the shared iha_context (IHA_DEVICE honoured, IHA_ALLOW_NO_DEVICE=1 turns "no device" into a
 * skip), and small file-system helpers for the cache tests.
 * Include it after <cmocka.h> (and its prerequisites).
 */
#ifndef IHA_TESTS_TEST_UTIL_H
#define IHA_TESTS_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "iha.h"
#include "iha_measure.h"
#include "iha_tune.h"

/* doc/spec.md's float32 tolerance: relative L2 error against the float64 reference. */
#define TU_TOL_F32 1e-5

/* Call first in main(): points IHA_CACHE_DIR and POCL_CACHE_DIR at directories inside the build
 * tree unless the caller has set them, so that runs do not depend on the user's caches, and
 * runs only the cases that match IHA_TEST_ONLY and none that match IHA_TEST_SKIP (CMocka
 * patterns) when they are set. */
void tu_init_environment(void);

/* ---- Random inputs (xorshift64*, seeded) ---- */

typedef struct tu_rng {
    uint64_t state;
} tu_rng;

void tu_rng_seed(tu_rng *rng, uint64_t seed);
tu_rng tu_rng_seeded(uint64_t seed); /* a source seeded with tu_rng_seed */
uint64_t tu_rng_next(tu_rng *rng);
double tu_rng_uniform(tu_rng *rng); /* [0, 1) */
/* n values of magnitude in [0.1, 1] * amplitude with a random sign: never zero. */
void tu_fill_random(tu_rng *rng, float *x, size_t n, float amplitude);
/* malloc + tu_fill_random; fails the test when out of memory. */
float *tu_random_array(tu_rng *rng, size_t n, float amplitude);
/* malloc that fails the test when out of memory (n may be 0). */
void *tu_malloc(size_t bytes);

void tu_fill_value(float *x, size_t n, float value);
void tu_fill_nan(float *x, size_t n);

/* ---- Checks ---- */

size_t tu_count_nonfinite(const float *x, size_t n);
/* ||out - ref|| / ||ref|| (||out - ref|| itself when ref is all zero). */
double tu_rel_l2(const float *out, const double *ref, size_t n);
/* Fails the test unless out has no NaN/Inf and tu_rel_l2(out, ref) <= tol; `what` names the
 * output in the failure message. */
void tu_assert_close(const char *what, const float *out, const double *ref, size_t n, double tol);
/* Fails the test unless status is `expected`; prints the context's message when it is not. */
void tu_assert_status(iha_context *ctx, iha_status status, iha_status expected);
/* Fails the test unless the context's profile is unusable (IHA_ERROR_PROFILE) for a reason that
 * mentions `why`, and a tune of the rows kernels on the shape refuses at once (IHA_ERROR_IO, in
 * well under its budget) saying so: a profile that cannot be written stops a tune before it runs. */
void tu_assert_profile_refused(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                               const char *why);

/* ---- The device ---- */

/* Creates a context (options may be NULL; IHA_DEVICE applies as the library reads it).
 * Returns 0 with *out set; 1 with *out NULL when no device exists and IHA_ALLOW_NO_DEVICE=1
 * (the tests then skip); -1 on any other failure, after printing why. */
int tu_context_open(iha_context **out, const iha_context_options *options);
/* Creates a context from options (NULL: the defaults) or fails the test with the status and
 * the library's message. */
iha_context *tu_context_create_or_fail(const iha_context_options *options);
/* Where a context keeps its files; NULL: the defaults. */
typedef struct tu_places {
    const char *cache_dir, *kernel_dir, *profile;
} tu_places;
/* iha_context_create with the default options but for `at`; the library's message goes to
 * message[size] (NULL, 0: nowhere). */
iha_status tu_context_create_at(iha_context **ctx, tu_places at, char *message, size_t size);
/* The context a test file's tests share: tu_group_setup (a CMocka group setup) opens it with
 * default options, tu_group_teardown frees it. It stays NULL when no device exists and
 * IHA_ALLOW_NO_DEVICE=1; tests then skip through TU_REQUIRE_DEVICE(tu_ctx). */
extern iha_context *tu_ctx;
int tu_group_setup(void **state);
int tu_group_teardown(void **state);
/* The body of a test file's main: tu_init_environment, then the cases as one CMocka group with
 * setup and teardown (tu_group_setup and tu_group_teardown, or a file's own). A developer runs
 * some cases only with a name pattern as the one argument: test_context 'borrow*'. Returns the
 * number of failed cases. */
int tu_main(int argc, char **argv, const struct CMUnitTest *tests, size_t count, CMFixtureFunction setup,
            CMFixtureFunction teardown);
/* Cases as rows of a table: `count` rows of `row_size` bytes, each opening with its case's name
 * (a const char *), each run by `run` with *state pointing at the row. */
typedef struct tu_case_table {
    const void *rows;
    size_t row_size, count;
    CMUnitTestFunction run;
} tu_case_table;
/* tu_main over the table's cases, then the `others`. */
int tu_main_table(int argc, char **argv, const tu_case_table *table, const struct CMUnitTest *others,
                  size_t other_count, CMFixtureFunction setup, CMFixtureFunction teardown);
/* In a test: skip when the shared context could not be opened (allowed "no device"). */
#define TU_REQUIRE_DEVICE(ctx) \
    do {                       \
        if (!(ctx))            \
            skip();            \
    } while (0)

/* A new read-write buffer of n floats on the context's device; fails the test on error. */
cl_mem tu_buffer_new(iha_context *ctx, size_t n);
/* Blocking transfers of n floats at element offset `offset` on the context's queue. */
void tu_buffer_write(iha_context *ctx, cl_mem mem, size_t offset, const float *src, size_t n);
void tu_buffer_read(iha_context *ctx, cl_mem mem, size_t offset, float *dst, size_t n);
/* A buffer of offset + n + guard floats, all `sentinel`, then `data` (n floats; NULL: NaN) at
 * element `offset`. */
cl_mem tu_buffer_guarded(iha_context *ctx, const float *data, size_t n, size_t offset, size_t guard,
                         float sentinel);
/* Fails the test unless the first `offset` and the last `guard` floats of a tu_buffer_guarded
 * buffer still hold `sentinel` bit for bit. */
void tu_assert_guard(iha_context *ctx, cl_mem mem, size_t n, size_t offset, size_t guard, float sentinel);
/* Fails the test unless all n floats at `offset` hold `value` bit for bit. */
void tu_assert_buffer_all(iha_context *ctx, cl_mem mem, size_t offset, size_t n, float value);
void tu_buffer_release(cl_mem mem); /* NULL is allowed */
/* A tensor in `storage` (IHA_STORAGE_F32, or IHA_STORAGE_F16 as halves), guarded like
 * tu_buffer_guarded: offset + n + guard elements of `sentinel` (rounded to the storage), then
 * `data` (n floats rounded to the storage; NULL: NaN) at element `offset`. */
cl_mem tu_tensor_guarded(iha_context *ctx, int storage, const float *data, size_t n, size_t offset, size_t guard,
                         float sentinel);
/* Reads the n elements of a tu_tensor_guarded tensor into out as floats; fails the test unless
 * its guards still hold the sentinel bit for bit (`what` names it). */
void tu_tensor_read_checked(iha_context *ctx, int storage, cl_mem mem, size_t n, size_t offset, size_t guard,
                            float sentinel, float *out, const char *what);

/* Whether needle occurs in haystack, ignoring ASCII case. */
int tu_contains_nocase(const char *haystack, const char *needle);

/* ---- The environment ---- */

/* A variable's value, to put back after a test changed it. */
typedef struct tu_saved_env {
    const char *name;
    char *value; /* NULL: unset */
} tu_saved_env;
tu_saved_env tu_env_save(const char *name);
/* Restores the saved value (or unsets the variable) and frees the copy. */
void tu_env_restore(tu_saved_env *e);

/* ---- Files, for the cache tests ---- */

/* Creates a fresh empty directory under the build tree and writes its path to path[size]. */
void tu_temp_dir(char *path, size_t size);
/* tu_temp_dir, then dir/name into path[size]. */
void tu_temp_path(char *dir, size_t dir_size, char *path, size_t size, const char *name);
/* Calls fn(file path, arg) for every regular file under dir, recursively; returns the count. */
size_t tu_for_each_file(const char *dir, void (*fn)(const char *path, void *arg), void *arg);
/* Removes dir and everything below it (best effort). */
void tu_remove_tree(const char *dir);
/* Copies the file `from` to `to` and appends `append` (NULL: nothing); fails the test on any
 * error. */
void tu_copy_file(const char *from, const char *to, const char *append);
/* For tu_for_each_file: copies each file into job->to_dir under its own name, appending
 * job->append (NULL: nothing). */
typedef struct tu_copy_job {
    const char *to_dir, *append;
} tu_copy_job;
void tu_copy_into(const char *path, void *job);

#endif /* IHA_TESTS_TEST_UTIL_H */
