/* A structural check of PoCL's program binaries (lib/CL/pocl_binary.c in PoCL).
 *
 * PoCL trusts the binaries it is given: a record with an empty file name fails an assertion
 * (deserialize_file: `len > 0`) and aborts the process, and a record with empty content is
 * unpacked as an empty file into PoCL's own cache directory, where dlopen fails on it and
 * PoCL aborts in every later process that builds the program, from source too. PoCL hands out
 * such binaries from clGetProgramInfo while another process rewrites the files it serialises
 * (its cache directory is shared), and without a way to tell. So every record is checked before
 * a binary is stored and again before it is loaded, and anything unexpected makes the binary
 * unloadable: the program is then built from source, which costs time and never a crash.
 *
 * Layout, versions 9 to 12 (PoCL 3.1 writes 9; 4.0 to 7.0 write 11), integers little-endian:
 *   "poclbin\0" | device id u64 | version u32 | kernels u32 | flags u64 | root entries u32 |
 *   build hash (41 bytes) | [version >= 10 and flags bit 1: program-scope bytes u64] |
 *   per root entry: bytes u64 | file records (exactly `bytes`) |
 *   per kernel: struct size u64 | binaries size u64 | metadata ... | file records (exactly
 *   `binaries size`, at the end of the struct)
 * and a file record is: name length u32 (> 0) | name | content length u32 (> 0) | content.
 * The kernel metadata's own layout changes between versions and is not judged, beyond a
 * non-empty kernel name (PoCL asserts on that too).
 *
 * The build hash names the directory of PoCL's cache into which PoCL unpacks a binary's files,
 * writing each file only where none exists yet; a build from source of the same program uses
 * the same directory and trusts what it finds there. A binary whose records are well-formed but
 * whose content is not (a forged or damaged cache entry with its checksum fixed up) would so
 * poison the program for every later process, from source too. Loaded under a hash of its own
 * bytes, such a binary can fail only its own loads: once the entry is retired, the rebuild from
 * source finds its directory untouched. */
#include "runtime/pocl_binary.h"
#include "common/hash.h"

#include <stdint.h>
#include <string.h>

#define BUILD_HASH_AT (8 + 8 + 4 + 4 + 8 + 4)
#define BUILD_HASH_BYTES 41 /* 40 characters, "XX/" then 37, and a NUL */
#define HEADER_BYTES (BUILD_HASH_AT + BUILD_HASH_BYTES)
#define FIRST_VERSION 9
#define LAST_VERSION 12
#define FLAG_PROGRAM_SCOPE_VARIABLES (UINT64_C(1) << 1)

static uint64_t get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Whether [at, end) is a sequence of whole file records, each with a name and content. */
static int records_valid(const unsigned char *b, size_t at, size_t end)
{
    while (at < end) {
        for (int part = 0; part < 2; ++part) {
            if (end - at < 4) return 0;
            const uint64_t len = get_le(b + at, 4);
            at += 4;
            if (len == 0 || len > end - at) return 0;
            at += (size_t)len;
        }
    }
    return at == end;
}

/* Checks the kernel struct at *at and moves past it. */
static int kernel_valid(const unsigned char *b, size_t n, size_t *at)
{
    const size_t start = *at, fixed = 8 + 8 + 4 + 4;
    if (n - start < fixed) return 0;
    const uint64_t size = get_le(b + start, 8), binaries = get_le(b + start + 8, 8);
    const uint64_t name = get_le(b + start + 20, 4);
    if (size > n - start || size < fixed || binaries > size - fixed) return 0;
    if (name == 0 || name > size - binaries - fixed) return 0;
    *at = start + (size_t)size;
    return records_valid(b, start + (size_t)(size - binaries), *at);
}

static const char pocl_magic[8] = {'p', 'o', 'c', 'l', 'b', 'i', 'n', '\0'};

static int is_pocl_binary(const unsigned char *b, size_t n)
{
    return n >= sizeof pocl_magic && memcmp(b, pocl_magic, sizeof pocl_magic) == 0;
}

int iha__binary_loadable(const unsigned char *b, size_t n)
{
    if (!is_pocl_binary(b, n)) return 1;
    if (n < HEADER_BYTES) return 0;
    const uint64_t version = get_le(b + 16, 4), kernels = get_le(b + 20, 4), flags = get_le(b + 24, 8);
    const uint64_t roots = get_le(b + 32, 4);
    if (version < FIRST_VERSION || version > LAST_VERSION || kernels == 0 || roots == 0) return 0;
    size_t at = HEADER_BYTES;
    if (version >= 10 && (flags & FLAG_PROGRAM_SCOPE_VARIABLES)) {
        if (n - at < 8) return 0;
        at += 8;
    }
    for (uint64_t r = 0; r < roots; ++r) {
        if (n - at < 8) return 0;
        const uint64_t bytes = get_le(b + at, 8);
        at += 8;
        if (bytes == 0 || bytes > n - at || !records_valid(b, at, at + (size_t)bytes)) return 0;
        at += (size_t)bytes;
    }
    for (uint64_t k = 0; k < kernels; ++k)
        if (!kernel_valid(b, n, &at)) return 0;
    return at == n;
}

void iha__binary_own_build_hash(unsigned char *b, size_t n)
{
    if (!is_pocl_binary(b, n) || n < HEADER_BYTES) return;
    /* Two chained FNV-1a passes over everything but the hash itself fill 32 of its characters. */
    uint64_t h[2];
    h[0] = iha__hash_bytes(iha__hash_bytes(IHA_HASH_SEED, b, BUILD_HASH_AT), b + HEADER_BYTES, n - HEADER_BYTES);
    h[1] = iha__hash_bytes(h[0], b + HEADER_BYTES, n - HEADER_BYTES);
    char *name = (char *)b + BUILD_HASH_AT;
    int nibble = 0;
    for (int i = 0; i < BUILD_HASH_BYTES - 1; ++i) {
        if (i == 2) {
            name[i] = '/';
        } else {
            const int bits = nibble < 32 ? (int)(h[nibble / 16] >> (4 * (nibble % 16)) & 15) : 0;
            name[i] = (char)('a' + bits);
            ++nibble;
        }
    }
    name[BUILD_HASH_BYTES - 1] = '\0';
}
