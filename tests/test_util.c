/*
 * test_util.c - shared test helpers: random inputs, error measures, device buffers with guard
 * regions, the context that honours IHA_DEVICE / IHA_ALLOW_NO_DEVICE, temporary directories.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#ifndef IHA_TEST_BINARY_DIR
#error "IHA_TEST_BINARY_DIR must name the tests' build directory"
#endif

void tu_init_environment(void)
{
    /* setenv(..., 0) keeps a value the caller chose. */
    setenv("IHA_CACHE_DIR", IHA_TEST_BINARY_DIR "/cache/iha", 0);
    setenv("POCL_CACHE_DIR", IHA_TEST_BINARY_DIR "/cache/pocl", 0);
    /* IHA_TEST_ONLY and IHA_TEST_SKIP: CMocka patterns of the cases to run and to skip, for a
     * slow device that runs the quick cases only (.ci/rusticl.sh). */
    const char *only = getenv("IHA_TEST_ONLY"), *skip_pattern = getenv("IHA_TEST_SKIP");
    if (only && only[0]) cmocka_set_test_filter(only);
    if (skip_pattern && skip_pattern[0]) cmocka_set_skip_filter(skip_pattern);
}

void tu_rng_seed(tu_rng *rng, uint64_t seed)
{
    rng->state = seed * 0x9E3779B97F4A7C15ULL + 0x2545F4914F6CDD1DULL;
    if (rng->state == 0)
        rng->state = 1;
    for (int i = 0; i < 4; i++)
        tu_rng_next(rng);
}

tu_rng tu_rng_seeded(uint64_t seed)
{
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    return rng;
}

uint64_t tu_rng_next(tu_rng *rng)
{
    uint64_t x = rng->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng->state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

double tu_rng_uniform(tu_rng *rng)
{
    return (double)(tu_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

void tu_fill_random(tu_rng *rng, float *x, size_t n, float amplitude)
{
    for (size_t i = 0; i < n; i++) {
        double magnitude = 0.1 + 0.9 * tu_rng_uniform(rng);
        double sign = (tu_rng_next(rng) >> 63) ? -1.0 : 1.0;
        x[i] = (float)(sign * magnitude * amplitude);
    }
}

void *tu_malloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        fail_msg("out of host memory (%zu bytes)", bytes);
    return p;
}

float *tu_random_array(tu_rng *rng, size_t n, float amplitude)
{
    float *x = tu_malloc(n * sizeof *x);
    tu_fill_random(rng, x, n, amplitude);
    return x;
}

void tu_fill_value(float *x, size_t n, float value)
{
    for (size_t i = 0; i < n; i++)
        x[i] = value;
}

void tu_fill_nan(float *x, size_t n)
{
    tu_fill_value(x, n, NAN);
}

size_t tu_count_nonfinite(const float *x, size_t n)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            count++;
    return count;
}

double tu_rel_l2(const float *out, const double *ref, size_t n)
{
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)out[i] - ref[i];
        err += e * e;
        norm += ref[i] * ref[i];
    }
    return norm > 0.0 ? sqrt(err / norm) : sqrt(err);
}

void tu_assert_close(const char *what, const float *out, const double *ref, size_t n, double tol)
{
    size_t bad = tu_count_nonfinite(out, n);
    if (bad) {
        size_t first = 0;
        while (isfinite(out[first]))
            first++;
        fail_msg("%s: %zu of %zu elements are NaN/Inf (first at %zu)", what, bad, n, first);
    }
    double err = tu_rel_l2(out, ref, n);
    if (!(err <= tol)) {
        size_t worst = 0;
        double worst_diff = 0.0;
        for (size_t i = 0; i < n; i++) {
            double diff = fabs((double)out[i] - ref[i]);
            if (diff > worst_diff) {
                worst_diff = diff;
                worst = i;
            }
        }
        fail_msg("%s: relative L2 error %.3e > %.1e over %zu elements; worst at %zu: got %.9g, want %.9g",
                 what, err, tol, n, worst, (double)out[worst], ref[worst]);
    }
}

void tu_assert_status(iha_context *ctx, iha_status status, iha_status expected)
{
    if (status != expected)
        fail_msg("status %s (%d), expected %s; message: \"%s\"", iha_status_name(status), (int)status,
                 iha_status_name(expected), ctx ? iha_context_message(ctx) : "(no context)");
}

void tu_assert_profile_refused(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                               const char *why)
{
    iha_profile_info info;
    tu_assert_status(ctx, iha_context_profile(ctx, &info), IHA_ERROR_PROFILE);
    if (!strstr(info.message, why)) fail_msg("the profile's message does not mention \"%s\": \"%s\"", why, info.message);
    iha_tune_options to;
    iha_tune_options_init(&to);
    to.kernels = IHA_TUNE_ROWS;
    to.budget_s = 60;
    const time_t start = time(NULL);
    tu_assert_status(ctx, iha_tune(ctx, shape, options, 1, &to, NULL, 0, NULL), IHA_ERROR_IO);
    assert_true(time(NULL) - start < 30); /* refused before the budget, not after */
    const char *m = iha_context_message(ctx);
    if (!strstr(m, why)) fail_msg("the tune's message does not mention \"%s\": \"%s\"", why, m);
}

int tu_context_open(iha_context **out, const iha_context_options *options)
{
    char message[1024] = "";
    iha_status status = iha_context_create(out, options, message, sizeof message);
    if (status == IHA_OK)
        return 0;
    *out = NULL;
    const char *allow = getenv("IHA_ALLOW_NO_DEVICE");
    if (status == IHA_ERROR_NO_DEVICE && allow && strcmp(allow, "1") == 0) {
        /* CTest's SKIP_REGULAR_EXPRESSION looks for this line. */
        print_message("iha-test: no OpenCL device (%s); IHA_ALLOW_NO_DEVICE=1, skipping\n", message);
        return 1;
    }
    print_error("iha_context_create: %s: %s%s\n", iha_status_name(status), message,
                status == IHA_ERROR_NO_DEVICE ? " (set IHA_ALLOW_NO_DEVICE=1 to skip instead)" : "");
    return -1;
}

iha_status tu_context_create_at(iha_context **ctx, tu_places at, char *message, size_t size)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.cache_dir = at.cache_dir;
    options.kernel_dir = at.kernel_dir;
    options.profile = at.profile;
    return iha_context_create(ctx, &options, message, size);
}

iha_context *tu_context_create_or_fail(const iha_context_options *options)
{
    iha_context *ctx = NULL;
    char message[1024] = "";
    const iha_status st = iha_context_create(&ctx, options, message, sizeof message);
    if (st != IHA_OK)
        fail_msg("iha_context_create: %s: %s", iha_status_name(st), message);
    assert_non_null(ctx);
    return ctx;
}

int tu_contains_nocase(const char *haystack, const char *needle)
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

tu_saved_env tu_env_save(const char *name)
{
    const char *value = getenv(name);
    tu_saved_env e = {name, value ? strdup(value) : NULL};
    return e;
}

void tu_env_restore(tu_saved_env *e)
{
    if (e->value)
        setenv(e->name, e->value, 1);
    else
        unsetenv(e->name);
    free(e->value);
    e->value = NULL;
}

cl_mem tu_buffer_new(iha_context *ctx, size_t n)
{
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, (n ? n : 1) * sizeof(float),
                                NULL, &err);
    if (err != CL_SUCCESS || !mem)
        fail_msg("clCreateBuffer(%zu floats) failed: %d", n, (int)err);
    return mem;
}

/* A blocking transfer of n floats at element `offset`, one way or the other. */
static void buffer_transfer(iha_context *ctx, cl_mem mem, size_t offset, float *host, size_t n, int write)
{
    if (n == 0)
        return;
    cl_command_queue q = iha_context_cl_queue(ctx);
    const size_t at = offset * sizeof(float), bytes = n * sizeof(float);
    cl_int err = write ? clEnqueueWriteBuffer(q, mem, CL_TRUE, at, bytes, host, 0, NULL, NULL)
                       : clEnqueueReadBuffer(q, mem, CL_TRUE, at, bytes, host, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        fail_msg("%s failed: %d", write ? "clEnqueueWriteBuffer" : "clEnqueueReadBuffer", (int)err);
}

void tu_buffer_write(iha_context *ctx, cl_mem mem, size_t offset, const float *src, size_t n)
{
    buffer_transfer(ctx, mem, offset, (float *)src, n, 1);
}

void tu_buffer_read(iha_context *ctx, cl_mem mem, size_t offset, float *dst, size_t n)
{
    buffer_transfer(ctx, mem, offset, dst, n, 0);
}

/* offset + n + guard floats of sentinel, then data (NULL: NaN) at offset. */
static float *tu_guarded_host(const float *data, size_t n, size_t offset, size_t guard, float sentinel)
{
    const size_t total = offset + n + guard;
    float *host = tu_malloc(total * sizeof *host);
    tu_fill_value(host, total, sentinel);
    if (data)
        memcpy(host + offset, data, n * sizeof *host);
    else
        tu_fill_nan(host + offset, n);
    return host;
}

cl_mem tu_buffer_guarded(iha_context *ctx, const float *data, size_t n, size_t offset, size_t guard,
                         float sentinel)
{
    size_t total = offset + n + guard;
    float *host = tu_guarded_host(data, n, offset, guard, sentinel);
    cl_mem mem = tu_buffer_new(ctx, total);
    tu_buffer_write(ctx, mem, 0, host, total);
    free(host);
    return mem;
}

/* Fails unless x[0..n) all equal `value` bit for bit; `where` names the region. */
static void tu_assert_all_bits(const char *where, const float *x, size_t n, float value)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &value, sizeof value) != 0)
            fail_msg("%s: element %zu of %zu was overwritten (%.9g, expected %.9g)", where, i, n,
                     (double)x[i], (double)value);
}

void tu_assert_guard(iha_context *ctx, cl_mem mem, size_t n, size_t offset, size_t guard, float sentinel)
{
    size_t total = offset + n + guard;
    float *host = tu_malloc(total * sizeof *host);
    tu_buffer_read(ctx, mem, 0, host, total);
    tu_assert_all_bits("guard before the output", host, offset, sentinel);
    tu_assert_all_bits("guard after the output", host + offset + n, guard, sentinel);
    free(host);
}

void tu_assert_buffer_all(iha_context *ctx, cl_mem mem, size_t offset, size_t n, float value)
{
    float *host = tu_malloc(n * sizeof *host);
    tu_buffer_read(ctx, mem, offset, host, n);
    tu_assert_all_bits("buffer", host, n, value);
    free(host);
}

void tu_buffer_release(cl_mem mem)
{
    if (mem)
        clReleaseMemObject(mem);
}

void tu_temp_dir(char *path, size_t size)
{
    const char *root = IHA_TEST_BINARY_DIR "/tmp";
    if (mkdir(root, 0755) != 0 && errno != EEXIST)
        fail_msg("mkdir %s: %s", root, strerror(errno));
    int len = snprintf(path, size, "%s/iha-XXXXXX", root);
    if (len < 0 || (size_t)len >= size)
        fail_msg("temporary path too long");
    if (!mkdtemp(path))
        fail_msg("mkdtemp %s: %s", path, strerror(errno));
}

void tu_temp_path(char *dir, size_t dir_size, char *path, size_t size, const char *name)
{
    tu_temp_dir(dir, dir_size);
    if ((size_t)snprintf(path, size, "%s/%s", dir, name) >= size)
        fail_msg("path %s/%s too long", dir, name);
}

/* Calls fn(path, its lstat) for every entry of dir but "." and ".."; returns the sum of fn's
 * results. */
static size_t each_entry(const char *dir, size_t (*fn)(const char *path, const struct stat *st, void *arg), void *arg)
{
    DIR *handle = opendir(dir);
    if (!handle)
        return 0;
    size_t sum = 0;
    struct dirent *entry;
    while ((entry = readdir(handle)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
            continue;
        char path[4096];
        struct stat st;
        int len = snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
        if (len < 0 || (size_t)len >= sizeof path || lstat(path, &st) != 0)
            continue;
        sum += fn(path, &st, arg);
    }
    closedir(handle);
    return sum;
}

typedef struct file_visit {
    void (*fn)(const char *path, void *arg);
    void *arg;
} file_visit;

static size_t visit_file(const char *path, const struct stat *st, void *arg)
{
    const file_visit *v = arg;
    if (S_ISDIR(st->st_mode))
        return tu_for_each_file(path, v->fn, v->arg);
    if (!S_ISREG(st->st_mode))
        return 0;
    if (v->fn)
        v->fn(path, v->arg);
    return 1;
}

size_t tu_for_each_file(const char *dir, void (*fn)(const char *path, void *arg), void *arg)
{
    file_visit v = {fn, arg};
    return each_entry(dir, visit_file, &v);
}

static size_t remove_entry(const char *path, const struct stat *st, void *arg)
{
    (void)arg;
    if (S_ISDIR(st->st_mode))
        tu_remove_tree(path);
    else
        unlink(path);
    return 0;
}

void tu_remove_tree(const char *dir)
{
    each_entry(dir, remove_entry, NULL);
    rmdir(dir);
}

iha_context *tu_ctx;

int tu_group_setup(void **state)
{
    (void)state;
    return tu_context_open(&tu_ctx, NULL) < 0 ? -1 : 0;
}

int tu_main(int argc, char **argv, const struct CMUnitTest *tests, size_t count, CMFixtureFunction setup,
            CMFixtureFunction teardown)
{
    tu_init_environment();
    if (argc == 2)
        cmocka_set_test_filter(argv[1]);
    return _cmocka_run_group_tests("tests", tests, count, setup, teardown);
}

int tu_main_table(int argc, char **argv, const tu_case_table *table, const struct CMUnitTest *others,
                  size_t other_count, CMFixtureFunction setup, CMFixtureFunction teardown)
{
    struct CMUnitTest *tests = tu_malloc((table->count + other_count) * sizeof *tests);
    for (size_t i = 0; i < table->count; ++i) {
        const void *row = (const char *)table->rows + i * table->row_size;
        tests[i] = (struct CMUnitTest){*(const char *const *)row, table->run, NULL, NULL, (void *)row};
    }
    memcpy(tests + table->count, others, other_count * sizeof *others);
    const int failed = tu_main(argc, argv, tests, table->count + other_count, setup, teardown);
    free(tests);
    return failed;
}

int tu_group_teardown(void **state)
{
    (void)state;
    iha_context_free(tu_ctx);
    tu_ctx = NULL;
    return 0;
}

void tu_copy_file(const char *from, const char *to, const char *append)
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

void tu_copy_into(const char *path, void *arg)
{
    const tu_copy_job *job = arg;
    char to[4200];
    snprintf(to, sizeof to, "%s%s", job->to_dir, strrchr(path, '/'));
    tu_copy_file(path, to, job->append);
}

/* Bytes per element of a tensor's storage. */
static size_t tu_storage_bytes(int storage) { return storage == IHA_STORAGE_F32 ? sizeof(float) : sizeof(uint16_t); }

/* The host converters of a 16-bit storage (half or bfloat16). */
static void tu_to_16bit(int storage, const float *src, uint16_t *dst, size_t n)
{
    if (storage == IHA_STORAGE_BF16)
        iha_bf16_from_float(src, dst, n);
    else
        iha_half_from_float(src, dst, n);
}

static void tu_from_16bit(int storage, const uint16_t *src, float *dst, size_t n)
{
    if (storage == IHA_STORAGE_BF16)
        iha_bf16_to_float(src, dst, n);
    else
        iha_half_to_float(src, dst, n);
}

cl_mem tu_tensor_guarded(iha_context *ctx, int storage, const float *data, size_t n, size_t offset, size_t guard,
                         float sentinel)
{
    if (storage == IHA_STORAGE_F32)
        return tu_buffer_guarded(ctx, data, n, offset, guard, sentinel);
    assert_true(storage == IHA_STORAGE_F16 || storage == IHA_STORAGE_BF16);
    const size_t total = offset + n + guard;
    float *host = tu_guarded_host(data, n, offset, guard, sentinel);
    uint16_t *h = tu_malloc(total * sizeof *h);
    tu_to_16bit(storage, host, h, total);
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                total * sizeof *h, h, &err);
    free(h);
    free(host);
    if (err != CL_SUCCESS)
        fail_msg("clCreateBuffer: %d", err);
    return mem;
}

void tu_tensor_read_checked(iha_context *ctx, int storage, cl_mem mem, size_t n, size_t offset, size_t guard,
                            float sentinel, float *out, const char *what)
{
    const size_t total = offset + n + guard, bytes = tu_storage_bytes(storage);
    unsigned char *raw = tu_malloc(total * bytes);
    cl_int err =
        clEnqueueReadBuffer(iha_context_cl_queue(ctx), mem, CL_TRUE, 0, total * bytes, raw, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        fail_msg("%s: clEnqueueReadBuffer: %d", what, err);
    unsigned char expected[sizeof(float)];
    if (storage != IHA_STORAGE_F32) {
        uint16_t h;
        tu_to_16bit(storage, &sentinel, &h, 1);
        memcpy(expected, &h, sizeof h);
    } else {
        memcpy(expected, &sentinel, sizeof sentinel);
    }
    for (size_t i = 0; i < total; i++)
        if ((i < offset || i >= offset + n) && memcmp(raw + i * bytes, expected, bytes) != 0)
            fail_msg("%s: the library wrote outside the tensor (element %zu of the buffer)", what, i);
    if (storage != IHA_STORAGE_F32) {
        uint16_t *h = tu_malloc(n * sizeof *h);
        memcpy(h, raw + offset * bytes, n * sizeof *h);
        tu_from_16bit(storage, h, out, n);
        free(h);
    } else {
        memcpy(out, raw + offset * bytes, n * sizeof *out);
    }
    free(raw);
}
