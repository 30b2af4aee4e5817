/* On-disk program cache: see disk_cache.h for key, layout and concurrency.
 *
 * An entry the driver cannot load must never cost more than one process. Two defences:
 *  1. Every binary is checked before it is stored and again before it is loaded
 *     (iha__binary_loadable, pocl_binary.c): PoCL aborts on, or poisons its own cache with,
 *     binaries whose records are empty, which it hands out while another process rewrites its
 *     cache. An entry that fails the check, or that the driver refuses, is retired (removed)
 *     and the program built from source and written again.
 *  2. For what no check foresees, a process marks each load: <key>.clbin.loading.<pid>.<token>
 *     exists while the driver reads the binary. A marker that outlives its process means the
 *     driver aborted (or the process was killed) during that load; the next context's tidy-up
 *     retires the entry, so at most the one process that met it fails. A directory where no
 *     marker can be made (read-only) loads without one.
 *  3. A binary well-formed in its records but not in its content (damaged, or forged with its
 *     checksum fixed up) must not poison the driver's own cache for the build from source that
 *     replaces it: PoCL binaries are loaded under a build hash of their own bytes
 *     (iha__binary_own_build_hash).
 * Temporary files of writers that died are removed by the same tidy-up once their pid is gone
 * from this machine or they are older than IHA_STALE_SECONDS (temp_file.h). On a directory
 * shared between machines a pid may belong to another machine: then a live writer's file can be
 * removed, and that writer's rename fails, which only leaves that one entry unwritten. */
#include "runtime/disk_cache.h"
#include "common/file.h"
#include "common/hash.h"
#include "common/temp_file.h"
#include "runtime/pocl_binary.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char magic[8] = {'I', 'H', 'A', 'P', 'R', 'G', '0', '1'};
#define HEADER_BYTES 32
#define MAX_BINARY_BYTES (512u * 1024u * 1024u)
#define ENTRY_SUFFIX ".clbin"
#define LOADING_TAG ".loading."

int iha__mkdir_p(const char *dir)
{
    size_t n = strlen(dir);
    if (n == 0) return ENOENT;
    char *path = malloc(n + 1);
    if (path == NULL) return ENOMEM;
    memcpy(path, dir, n + 1);
    int code = 0;
    for (size_t i = 1; i <= n && code == 0; ++i) {
        if (path[i] != '/' && path[i] != '\0') continue;
        char saved = path[i];
        path[i] = '\0';
        if (mkdir(path, saved == '\0' ? 0700 : 0755) != 0 && errno != EEXIST) code = errno;
        path[i] = saved;
    }
    free(path);
    struct stat st;
    if (code == 0 && stat(dir, &st) != 0) code = errno;
    else if (code == 0 && !S_ISDIR(st.st_mode)) code = ENOTDIR;
    return code;
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; ++i) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* <dir>/<key>.clbin followed by `tail`, malloc'ed (free it); NULL when out of memory. */
static char *entry_path(const char *dir, uint64_t key, const char *tail)
{
    size_t n = strlen(dir) + strlen(tail) + 32;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%016llx" ENTRY_SUFFIX "%s", dir, (unsigned long long)key, tail);
    return p;
}

unsigned char *iha__disk_cache_read(const char *dir, uint64_t key, size_t *length)
{
    char *path = entry_path(dir, key, "");
    if (path == NULL) return NULL;
    char *text = NULL;
    size_t n = 0;
    const int code = iha__file_read(path, HEADER_BYTES + MAX_BINARY_BYTES, IHA_FILE_NO_FOLLOW, &text, &n);
    free(path);
    if (code != 0) return NULL;
    unsigned char *b = (unsigned char *)text;
    const uint64_t len = n >= HEADER_BYTES ? get_u64(b + 16) : 0;
    if (n < HEADER_BYTES || memcmp(b, magic, 8) != 0 || get_u64(b + 8) != key || len == 0 ||
        len != n - HEADER_BYTES || iha__hash_bytes(IHA_HASH_SEED, b + HEADER_BYTES, (size_t)len) != get_u64(b + 24)) {
        free(text);
        return NULL;
    }
    memmove(b, b + HEADER_BYTES, (size_t)len);
    *length = (size_t)len;
    return b;
}

int iha__disk_cache_write(const char *dir, uint64_t key, const unsigned char *binary, size_t length)
{
    if (iha__mkdir_p(dir) != 0) return -1;
    char *path = entry_path(dir, key, "");
    if (path == NULL) return -1;
    unsigned char header[HEADER_BYTES];
    memcpy(header, magic, 8);
    put_u64(header + 8, key);
    put_u64(header + 16, length);
    put_u64(header + 24, iha__hash_bytes(IHA_HASH_SEED, binary, length));
    const iha_file_part parts[2] = {{header, HEADER_BYTES}, {binary, length}};
    const int code = iha__file_replace(path, parts, 2, 0);
    free(path);
    return code == 0 ? 0 : -1;
}

void iha__disk_cache_retire(const char *dir, uint64_t key)
{
    char *path = entry_path(dir, key, "");
    if (path) unlink(path);
    free(path);
}

void iha__disk_cache_load_begin(const char *dir, uint64_t key, char *marker, size_t capacity)
{
    marker[0] = '\0';
    /* The frame's address tells threads of one process apart, as temporary names do. */
    int token = 0;
    int n = snprintf(marker, capacity, "%s/%016llx" ENTRY_SUFFIX LOADING_TAG "%ld.%lx", dir, (unsigned long long)key,
                     (long)getpid(), (unsigned long)(uintptr_t)&token);
    if (n < 0 || (size_t)n >= capacity) {
        marker[0] = '\0';
        return;
    }
    int fd = open(marker, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 || close(fd) != 0) marker[0] = '\0';
}

void iha__disk_cache_load_end(const char *marker)
{
    if (marker[0] != '\0') unlink(marker);
}

#define KEY_DIGITS 16
#define HEX_DIGITS "0123456789abcdef"

/* Whether name starts with an entry's name, <16 lowercase hex digits>.clbin; then its key. */
static int entry_name(const char *name, uint64_t *key)
{
    if (strspn(name, HEX_DIGITS) != KEY_DIGITS || strncmp(name + KEY_DIGITS, ENTRY_SUFFIX, strlen(ENTRY_SUFFIX)) != 0)
        return 0;
    char hex[KEY_DIGITS + 1];
    memcpy(hex, name, KEY_DIGITS);
    hex[KEY_DIGITS] = '\0';
    *key = (uint64_t)strtoull(hex, NULL, 16);
    return 1;
}

/* Whether name is, in full, a load marker: <entry>.loading.<pid>.<hex digits>; then its key
 * and pid. */
static int marker_name(const char *name, uint64_t *key, long *pid)
{
    if (!entry_name(name, key)) return 0;
    const char *p = name + KEY_DIGITS + strlen(ENTRY_SUFFIX);
    if (strncmp(p, LOADING_TAG, strlen(LOADING_TAG)) != 0) return 0;
    p += strlen(LOADING_TAG);
    const size_t digits = strspn(p, "0123456789");
    if (digits == 0 || digits > 9 || p[digits] != '.') return 0;
    const size_t token = strspn(p + digits + 1, HEX_DIGITS);
    if (token == 0 || p[digits + 1 + token] != '\0') return 0;
    *pid = strtol(p, NULL, 10);
    return 1;
}

/* The tidy-up's filter of temporary files: only those of an entry, <entry>.tmp.<...>. */
static int entry_temp(const char *target, size_t length, const void *arg)
{
    (void)arg;
    uint64_t key = 0;
    return length == KEY_DIGITS + strlen(ENTRY_SUFFIX) && entry_name(target, &key);
}

void iha__disk_cache_tidy(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint64_t key = 0;
        long pid = 0;
        if (!marker_name(e->d_name, &key, &pid) || !iha__file_left_over(dir, e->d_name, pid)) continue;
        iha__disk_cache_retire(dir, key);
        char *path = entry_path(dir, key, e->d_name + KEY_DIGITS + strlen(ENTRY_SUFFIX));
        if (path) unlink(path);
        free(path);
    }
    closedir(d);
    iha__remove_left_over_temps(dir, entry_temp, NULL);
}
