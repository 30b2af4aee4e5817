/*
 * cold_start.c - what a new process pays before its first layer: context creation and the
 * first iha_forward, once with empty program caches and once with the caches that the first
 * process filled.
 *
 * PoCL reads POCL_CACHE_DIR when the OpenCL platform loads, before any call of ours could
 * change it, so each measurement runs in a child process: the parent re-executes itself
 * (/proc/self/exe) as "iha bench <the same options> --cold-start-child IHA_DIR" through
 * posix_spawn, with POCL_CACHE_DIR=POCL_DIR (and NVIDIA's CUDA_CACHE_PATH=POCL_DIR) in the
 * child's environment. IHA_DIR (passed to
 * iha_context_options.cache_dir) and POCL_DIR are fresh subdirectories of a mkdtemp directory
 * under $TMPDIR (else /tmp), removed afterwards. The child prints one line,
 * "cold-start context_seconds S forward_seconds S", on its stdout, which is a pipe to the parent.
 */
#define _XOPEN_SOURCE 700 /* nftw */

#include <errno.h>
#include <ftw.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/random_layer.h"
#include "common/timer.h"

extern char **environ;

#define CHILD_LINE "cold-start context_seconds %lf forward_seconds %lf second_forward_seconds %lf"

/* ---- The child ---- */

int bench_cold_start_child(const bench_config *c, const char *cache_dir)
{
    iha_context_options o;
    iha_context_options_init(&o);
    o.device = c->device;
    o.cache_dir = cache_dir;
    char message[1024];
    iha_context *ctx = NULL;
    double start = timer_seconds();
    iha_status st = iha_context_create(&ctx, &o, message, sizeof message);
    double context_seconds = timer_seconds() - start;
    if (st != IHA_OK) {
        fprintf(stderr, "iha bench: cold start: %s: %s\n", iha_status_name(st), message);
        return -1;
    }
    random_layer layer;
    if (random_layer_create(ctx, &c->layer, 1, &layer, message, sizeof message)) {
        fprintf(stderr, "iha bench: cold start: %s\n", message);
        iha_context_free(ctx);
        return -1;
    }
    start = timer_seconds();
    st = iha_forward(ctx, &c->layer, &c->options, &layer.weights, (iha_buffer){layer.x_mem, 0},
                     (iha_buffer){layer.z_mem, 0});
    if (st == IHA_OK)
        st = iha_context_finish(ctx);
    double forward_seconds = timer_seconds() - start;
    start = timer_seconds();
    if (st == IHA_OK)
        st = iha_forward(ctx, &c->layer, &c->options, &layer.weights, (iha_buffer){layer.x_mem, 0},
                         (iha_buffer){layer.z_mem, 0});
    if (st == IHA_OK)
        st = iha_context_finish(ctx);
    double second_seconds = timer_seconds() - start;
    int failed = st != IHA_OK ? bench_fail(ctx, st, "cold start forward") : 0;
    if (!failed)
        printf(CHILD_LINE "\n", context_seconds, forward_seconds, second_seconds);
    random_layer_free(&layer);
    iha_context_free(ctx);
    return failed;
}

/* ---- The parent ---- */

/* The drivers' own caches of compiled kernels, which the child gets empty in `dir` (PoCL's, and
 * NVIDIA's compute cache, which also replaces a CUDA_CACHE_DISABLE of the parent's: the warm run
 * measures a driver that keeps what it compiled, as an application's does). */
static const char *const kDriverCacheVars[] = {"POCL_CACHE_DIR=", "CUDA_CACHE_PATH=", "CUDA_CACHE_DISABLE="};
#define DRIVER_CACHE_VARS (sizeof kDriverCacheVars / sizeof kDriverCacheVars[0])
#define DRIVER_CACHE_SET 2 /* the first two point to dir; the last is dropped */

static int is_driver_cache_var(const char *entry)
{
    for (size_t i = 0; i < DRIVER_CACHE_VARS; i++)
        if (strncmp(entry, kDriverCacheVars[i], strlen(kDriverCacheVars[i])) == 0)
            return 1;
    return 0;
}

/* environ without the driver cache variables, plus each of the first DRIVER_CACHE_SET set to
 * dir. Free with free_environment. */
static char **child_environment(const char *dir)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = malloc((n + DRIVER_CACHE_SET + 1) * sizeof *env);
    char *entries[DRIVER_CACHE_SET] = {NULL};
    int ok = env != NULL;
    for (size_t i = 0; i < DRIVER_CACHE_SET && ok; i++) {
        size_t size = strlen(kDriverCacheVars[i]) + strlen(dir) + 1;
        entries[i] = malloc(size);
        ok = entries[i] != NULL;
        if (ok)
            snprintf(entries[i], size, "%s%s", kDriverCacheVars[i], dir);
    }
    if (!ok) {
        for (size_t i = 0; i < DRIVER_CACHE_SET; i++)
            free(entries[i]);
        free(env);
        return NULL;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!is_driver_cache_var(environ[i]))
            env[m++] = environ[i];
    for (size_t i = 0; i < DRIVER_CACHE_SET; i++)
        env[m++] = entries[i];
    env[m] = NULL;
    return env;
}

static void free_environment(char **env)
{
    if (!env)
        return;
    size_t n = 0;
    while (env[n])
        n++;
    for (size_t i = n - DRIVER_CACHE_SET; i < n; i++)
        free(env[i]);
    free(env);
}

/* Reads the child's whole stdout into buf (NUL-terminated, truncated to size - 1). */
static void read_all(int fd, char *buf, size_t size)
{
    size_t used = 0;
    for (;;) {
        char chunk[512];
        ssize_t got = read(fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        size_t keep = (size_t)got < size - 1 - used ? (size_t)got : size - 1 - used;
        memcpy(buf + used, chunk, keep);
        used += keep;
    }
    buf[used] = '\0';
}

/* One child: returns 0 with *run filled, or -1 with a note. */
static int spawn_child(char **child_argv, char **env, bench_cold_run *run, char *note, size_t note_size)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(note, note_size, "pipe failed: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, fds[1]);
    pid_t pid;
    double start = timer_seconds();
    int err = posix_spawn(&pid, child_argv[0], &actions, NULL, child_argv, env);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (err != 0) {
        close(fds[0]);
        snprintf(note, note_size, "posix_spawn %.160s failed: %.60s", child_argv[0], strerror(err));
        return -1;
    }
    char out[1024];
    read_all(fds[0], out, sizeof out);
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    run->process_seconds = timer_seconds() - start;
    const char *line = strstr(out, "cold-start ");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !line ||
        sscanf(line, CHILD_LINE, &run->context_seconds, &run->forward_seconds, &run->second_forward_seconds) != 3) {
        snprintf(note, note_size, "the child process failed (see its messages above)");
        return -1;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* Both children, given the temporary directories. */
static void run_children(int argc, char **argv, const char *iha_dir, const char *pocl_dir, bench_cold_start *out)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(out->note, sizeof out->note, "cannot find this executable (/proc/self/exe): %s", strerror(errno));
        return;
    }
    self[n] = '\0';
    /* self, the original arguments (argv[0] is "bench"), the child flag and its value. */
    char **child_argv = malloc(((size_t)argc + 4) * sizeof *child_argv);
    char **env = child_environment(pocl_dir);
    if (child_argv && env) {
        int m = 0;
        child_argv[m++] = self;
        for (int i = 0; i < argc; i++)
            child_argv[m++] = argv[i];
        child_argv[m++] = "--cold-start-child";
        child_argv[m++] = (char *)iha_dir;
        child_argv[m] = NULL;
        fflush(stdout);
        fflush(stderr);
        if (spawn_child(child_argv, env, &out->empty, out->note, sizeof out->note) == 0 &&
            spawn_child(child_argv, env, &out->warm, out->note, sizeof out->note) == 0)
            out->state = BENCH_RAN;
    } else {
        snprintf(out->note, sizeof out->note, "out of host memory");
    }
    free(child_argv);
    free_environment(env);
}

void bench_cold_start_run(int argc, char **argv, bench_cold_start *out)
{
    out->state = BENCH_NOT_RUN;
    const char *tmp = getenv("TMPDIR");
    char base[1024], iha_dir[1100], pocl_dir[1100];
    snprintf(base, sizeof base, "%s/iha-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(base)) {
        snprintf(out->note, sizeof out->note, "mkdtemp %.160s failed: %.60s", base, strerror(errno));
        return;
    }
    snprintf(iha_dir, sizeof iha_dir, "%s/iha", base);
    snprintf(pocl_dir, sizeof pocl_dir, "%s/pocl", base);
    if (mkdir(iha_dir, 0700) != 0 || mkdir(pocl_dir, 0700) != 0)
        snprintf(out->note, sizeof out->note, "mkdir under %.160s failed: %.60s", base, strerror(errno));
    else
        run_children(argc, argv, iha_dir, pocl_dir, out);
    nftw(base, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
