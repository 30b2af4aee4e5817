/* On-disk cache of program binaries.
 *
 * Key: a 64-bit FNV-1a hash of the final kernel source, the build options, the device name,
 * the driver version, the platform version and the library version (program.c computes it).
 * Layout: one file per program, <dir>/<16 hex digits of key>.clbin, holding
 *   "IHAPRG01" | key (u64 LE) | binary length (u64 LE) | FNV-1a of the binary (u64 LE) | binary.
 * Concurrency: writers write <name>.tmp.<pid>.<frame>.<ns> and rename(2) it over the final name,
 * so readers see a whole old entry, a whole new one or none. Entries that are truncated, of
 * another key or with a bad checksum are ignored (and rebuilt and rewritten by the caller).
 * Off: IHA_CACHE_DIR=off or iha_context_options.cache_dir = "off". */
#ifndef IHA_RUNTIME_DISK_CACHE_H
#define IHA_RUNTIME_DISK_CACHE_H
#include <stddef.h>
#include <stdint.h>

/* Creates dir and its parents (mode 0755). Returns 0 on success. */
int iha__mkdir_p(const char *dir);
/* Reads the entry for key; on success returns a malloc'd binary and its length (free it). */
unsigned char *iha__disk_cache_read(const char *dir, uint64_t key, size_t *length);
/* Whether a program binary may be stored and loaded: PoCL binaries whose program.bc record is
 * empty make PoCL abort when loaded (disk_cache.c says why they occur). Others: 1. */
int iha__binary_loadable(const unsigned char *binary, size_t length);
/* Writes the entry atomically. Returns 0 on success. */
int iha__disk_cache_write(const char *dir, uint64_t key, const unsigned char *binary, size_t length);
#endif
