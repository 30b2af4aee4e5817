/*
 * reliability.c - object counts, program cache census, self-spawned child processes and the
 * small layer of the fault and concurrency tests. The census reads entries through the disk
 * cache's own reader (a private header of src/runtime), so "valid" means exactly what the
 * library would load.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "reliability.h"
#include "runtime/disk_cache.h"
#include "test_layer.h"
#include "test_util.h"

extern char **environ;

unsigned rel_context_refs(cl_context context)
{
    cl_uint count = 0;
    cl_int err = clGetContextInfo(context, CL_CONTEXT_REFERENCE_COUNT, sizeof count, &count, NULL);
    if (err != CL_SUCCESS)
        fail_msg("clGetContextInfo(CL_CONTEXT_REFERENCE_COUNT): %d", (int)err);
    return count;
}

static void sleep_ms(long ms) { nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL); }

unsigned rel_context_refs_settled(cl_context context, unsigned want)
{
    unsigned count = rel_context_refs(context);
    for (int waited = 0; waited < 200 && count > want; waited++) {
        sleep_ms(10);
        count = rel_context_refs(context);
    }
    return count;
}

unsigned rel_context_refs_quiet(cl_context context)
{
    unsigned before = rel_context_refs(context), now = before;
    for (int waited = 0; waited < 50; waited++) {
        sleep_ms(20);
        now = rel_context_refs(context);
        if (now == before) break;
        before = now;
    }
    return now;
}

int rel_refs_count_objects(iha_context *ctx)
{
    cl_platform_id platform = NULL;
    char name[256] = "";
    if (clGetDeviceInfo(iha_context_cl_device(ctx), CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL) !=
            CL_SUCCESS ||
        clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof name, name, NULL) != CL_SUCCESS)
        return 0;
    return strstr(name, "Portable Computing Language") != NULL;
}

/* "<16 hex digits>.clbin" -> key; 0 when the name has another form. */
static int entry_key(const char *name, uint64_t *key)
{
    if (strlen(name) != 22 || strcmp(name + 16, ".clbin") != 0)
        return 0;
    uint64_t k = 0;
    for (int i = 0; i < 16; i++) {
        char c = name[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return 0;
        k = k << 4 | (uint64_t)v;
    }
    *key = k;
    return 1;
}

rel_cache_census rel_cache_scan(const char *dir)
{
    rel_cache_census census = {0, 0, 0, 0};
    DIR *handle = opendir(dir);
    if (!handle)
        return census;
    struct dirent *entry;
    while ((entry = readdir(handle)) != NULL) {
        const char *name = entry->d_name;
        uint64_t key;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        if (strstr(name, ".tmp.")) {
            census.temporary++;
        } else if (entry_key(name, &key)) {
            size_t length = 0;
            unsigned char *binary = iha__disk_cache_read(dir, key, &length);
            if (binary)
                census.valid++;
            else
                census.broken++;
            free(binary);
        } else {
            census.other++; /* e.g. the tuning profile that lives beside the programs */
        }
    }
    closedir(handle);
    return census;
}

pid_t rel_spawn_self(const char *const *args)
{
    const char *argv[16] = {"/proc/self/exe"};
    size_t n = 1;
    for (; args[n - 1] && n < 15; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    pid_t pid;
    int err = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, (char *const *)argv, environ);
    if (err != 0)
        fail_msg("posix_spawn /proc/self/exe: %s", strerror(err));
    return pid;
}

int rel_wait(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            fail_msg("waitpid: %s", strerror(errno));
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

/* ---- The small layer of the fault tests ---- */

/* A small layer with every stage in use: P > 1, rotary, a window, odd sizes. */
const iha_shape rel_small = {2, 11, 24, 2, 16, 3};

iha_attention_options rel_small_options(void)
{
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 4, 1);
    return o;
}

iha_context *rel_open_with(const char *cache_dir, const char *kernel_dir)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.cache_dir = cache_dir;
    options.kernel_dir = kernel_dir;
    return tu_context_create_or_fail(&options);
}

/* Runs the small layer on ctx through `api` and checks every element of z. */
void rel_check_small(iha_context *ctx, tu_api api)
{
    const iha_attention_options o = rel_small_options();
    tu_check_random_layer(ctx, &rel_small, 17, &o, api);
}

/* rel_check_small on a context of its own over the cache directory `cache`. */
void rel_check_small_with(const char *cache, tu_api api)
{
    iha_context *ctx = rel_open_with(cache, NULL);
    rel_check_small(ctx, api);
    iha_context_free(ctx);
}

void rel_expect_message(iha_context *ctx, const char *needle)
{
    const char *m = iha_context_message(ctx);
    if (!strstr(m, needle))
        fail_msg("the message does not mention \"%s\": \"%s\"", needle, m);
}

/* The pid of a process that has exited (and been reaped). */
long rel_dead_pid(void)
{
    const char *args[] = {"--exit-child", NULL};
    const pid_t pid = rel_spawn_self(args);
    assert_int_equal(rel_wait(pid), 0);
    return (long)pid;
}

void rel_touch_file(const char *path)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
}

long rel_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}


/* A fresh cache directory (its path in cache) that one small layer has filled with entries. */
void rel_fill_cache(char *cache, size_t capacity)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    tu_temp_dir(cache, capacity);
    rel_check_small_with(cache, TU_API_DEVICE);
}

iha_status rel_child_run_small(iha_context *ctx, int *right, int *untouched)
{
    const iha_attention_options o = rel_small_options();
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &rel_small, 17, &o);
    const size_t nz = tu_count_x(&rel_small);
    float *z = tu_malloc(nz * sizeof *z);
    tu_fill_nan(z, nz);
    const iha_host_weights w = tu_layer_host_weights(&l);
    const iha_status st = iha_forward_host(ctx, &rel_small, &o, &w, l.x, z);
    *right = tu_count_nonfinite(z, nz) == 0 && tu_rel_l2(z, zref, nz) <= TU_TOL_F32;
    *untouched = tu_count_nonfinite(z, nz) == nz;
    free(z);
    free(zref);
    tu_layer_free(&l);
    return st;
}

typedef struct entry_visit {
    rel_entry_fn fn;
    void *arg;
} entry_visit;

static void visit_entry(const char *path, void *arg)
{
    const entry_visit *v = arg;
    const char *name = strrchr(path, '/') + 1;
    unsigned long long key = 0;
    if (strlen(name) != 22 || strcmp(name + 16, ".clbin") != 0 || sscanf(name, "%16llx", &key) != 1)
        return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(name - 1 - path), path);
    size_t n = 0;
    unsigned char *b = iha__disk_cache_read(dir, key, &n);
    assert_non_null(b);
    v->fn(dir, key, b, n, v->arg);
    free(b);
}

void rel_for_each_entry(const char *cache, rel_entry_fn fn, void *arg)
{
    entry_visit v = {fn, arg};
    tu_for_each_file(cache, visit_entry, &v);
}

int rel_child_small_layer(iha_context *ctx)
{
    int right, untouched;
    const iha_status st = rel_child_run_small(ctx, &right, &untouched);
    if (st != IHA_OK)
        fprintf(stderr, "child: %s: %s\n", iha_status_name(st), iha_context_message(ctx));
    return st == IHA_OK && right ? 0 : 1;
}
