/* On-disk program cache: see disk_cache.h for key, layout and concurrency. */
#include "runtime/disk_cache.h"
#include "common/hash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char magic[8] = {'I', 'H', 'A', 'P', 'R', 'G', '0', '1'};
#define HEADER_BYTES 32
#define MAX_BINARY_BYTES (512u * 1024u * 1024u)

int iha__mkdir_p(const char *dir)
{
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) return -1;
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; ++i) {
        if (path[i] != '/' && path[i] != '\0') continue;
        char saved = path[i];
        path[i] = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
        path[i] = saved;
    }
    struct stat st;
    return (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) ? 0 : -1;
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; ++i) p[i] = (unsigned char)(v >> (8 * i));
}

/* An unsigned little-endian integer of `bytes` bytes at p. */
static uint64_t get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const unsigned char *p) { return get_le(p, 8); }

static int entry_path(char *out, size_t cap, const char *dir, uint64_t key)
{
    int n = snprintf(out, cap, "%s/%016llx.clbin", dir, (unsigned long long)key);
    return n > 0 && (size_t)n < cap;
}

unsigned char *iha__disk_cache_read(const char *dir, uint64_t key, size_t *length)
{
    char path[4200];
    if (!entry_path(path, sizeof path, dir, key)) return NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    unsigned char header[HEADER_BYTES];
    unsigned char *binary = NULL;
    if (fread(header, 1, HEADER_BYTES, f) != HEADER_BYTES) goto fail;
    if (memcmp(header, magic, 8) != 0 || get_u64(header + 8) != key) goto fail;
    uint64_t len = get_u64(header + 16);
    if (len == 0 || len > MAX_BINARY_BYTES) goto fail;
    binary = malloc((size_t)len);
    if (binary == NULL) goto fail;
    if (fread(binary, 1, (size_t)len, f) != len || fgetc(f) != EOF) goto fail;
    if (iha__hash_bytes(IHA_HASH_SEED, binary, (size_t)len) != get_u64(header + 24)) goto fail;
    fclose(f);
    *length = (size_t)len;
    return binary;
fail:
    free(binary);
    fclose(f);
    return NULL;
}

int iha__disk_cache_write(const char *dir, uint64_t key, const unsigned char *binary, size_t length)
{
    char path[4200], tmp[4300];
    if (iha__mkdir_p(dir) != 0 || !entry_path(path, sizeof path, dir, key)) return -1;
    /* Unique per writer without global state: pid, plus this frame's address, which differs
     * between threads running at the same time, plus the clock. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%lx.%ld", path, (long)getpid(), (unsigned long)(uintptr_t)&now,
                     (long)now.tv_nsec);
    if (n < 0 || (size_t)n >= sizeof tmp) return -1;
    unsigned char header[HEADER_BYTES];
    memcpy(header, magic, 8);
    put_u64(header + 8, key);
    put_u64(header + 16, length);
    put_u64(header + 24, iha__hash_bytes(IHA_HASH_SEED, binary, length));
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) return -1;
    int ok = fwrite(header, 1, HEADER_BYTES, f) == HEADER_BYTES && fwrite(binary, 1, length, f) == length;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}

/* Whether a binary is safe to hand to clCreateProgramWithBinary. PoCL (3.1) asserts, and so
 * aborts the process, when a binary's program.bc record is empty (pocl_binary.c,
 * pocl_binary_get_kernels_metadata: `len > 0`). clGetProgramInfo can return such a binary while
 * another process rewrites PoCL's shared cache directory: in CI's sanitize stage test_half
 * aborted on an entry that another test process had written. So a binary that starts with
 * PoCL's magic must hold a non-empty "/program.bc" record near its start, or it is neither
 * stored nor loaded (the program is built from source instead). Other drivers' binaries are
 * not judged. */
int iha__binary_loadable(const unsigned char *b, size_t n)
{
    static const char pocl_magic[8] = {'p', 'o', 'c', 'l', 'b', 'i', 'n', '\0'};
    static const char record[] = "/program.bc";
    const size_t rl = sizeof record - 1, head = n < 512 ? n : 512;
    if (n < sizeof pocl_magic || memcmp(b, pocl_magic, sizeof pocl_magic) != 0) return 1;
    for (size_t i = 4; i + rl + 4 <= head; ++i) {
        if (memcmp(b + i, record, rl) != 0) continue;
        const uint64_t content = get_le(b + i + rl, 4);
        if (get_le(b + i - 4, 4) == rl) return content > 0 && content <= n - (i + rl + 4);
    }
    return 0;
}
