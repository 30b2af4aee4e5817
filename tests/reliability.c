/*
 * reliability.c - object counts, program cache census and self-spawned child processes for the
 * fault and concurrency tests. The census reads entries through the disk cache's own reader
 * (a private header of src/runtime), so "valid" means exactly what the library would load.
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
#include <sys/wait.h>
#include <time.h>

#include "reliability.h"
#include "runtime/disk_cache.h"
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
