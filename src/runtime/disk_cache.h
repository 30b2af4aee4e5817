/* On-disk cache of program binaries.
 *
 * Key: a 64-bit FNV-1a hash of the final kernel source, the build options, the device name,
 * the driver version, the platform version and the library version (program.c computes it).
 * Layout: one file per program, <dir>/<16 hex digits of key>.clbin, holding
 *   "IHAPRG01" | key (u64 LE) | binary length (u64 LE) | FNV-1a of the binary (u64 LE) | binary.
 * Concurrency: writers write <name>.tmp.<pid>.<token>.<ns> and rename(2) it over the final
 * name, so readers see a whole old entry, a whole new one or none. Entries that are truncated,
 * of another key or with a bad checksum are ignored (and rebuilt and rewritten by the caller).
 * Only regular files are read (a FIFO or a link in an entry's place is ignored, never waited on).
 * Bad binaries: disk_cache.c says how an entry that the driver cannot load is kept from
 * aborting later processes, and how dead writers' temporary files are removed.
 * Trust: the directory must belong to this user (or root) and be writable by no one else, as
 * ssh asks of its keys' directory; otherwise the cache is off (context.c). A bad binary that
 * passes every check costs at most the one process that loads it (disk_cache.c, pocl_binary.c).
 * Off: IHA_CACHE_DIR=off or iha_context_options.cache_dir = "off" (any case). */
#ifndef IHA_RUNTIME_DISK_CACHE_H
#define IHA_RUNTIME_DISK_CACHE_H
#include <stddef.h>
#include <stdint.h>

/* The longest name the cache writes in its directory: a profile's temporary file,
 * "profile-<16>.json.tmp.<pid>.<token>.<ns>". A directory whose path leaves less room below
 * PATH_MAX is refused (context.c). */
#define IHA_DISK_CACHE_NAME_MAX 96

/* Creates dir (mode 0700: only this user may write where the driver's binaries come from,
 * context.c's trust check) and its parents (mode 0755). Returns 0, or the errno that stopped it
 * (ENOTDIR when a component is a file). */
int iha__mkdir_p(const char *dir);
/* Reads the entry for key; on success returns a malloc'd binary and its length (free it). */
unsigned char *iha__disk_cache_read(const char *dir, uint64_t key, size_t *length);
/* Writes the entry atomically. Returns 0 on success, -1 on failure (nothing is left). */
int iha__disk_cache_write(const char *dir, uint64_t key, const unsigned char *binary, size_t length);
/* Removes the entry for key: the driver refused it, or a process died loading it. */
void iha__disk_cache_retire(const char *dir, uint64_t key);

/* Brackets handing an entry's binary to the driver: _begin leaves a marker file naming this
 * process (its path in marker, "" when it could not be made), _end removes it. */
void iha__disk_cache_load_begin(const char *dir, uint64_t key, char *marker, size_t capacity);
void iha__disk_cache_load_end(const char *marker);

/* Once per context, before its first load: retires the entries whose markers say that a
 * process died loading them, and removes temporary files left by writers that died. It touches
 * only names it makes, whole (<key>.clbin, <key>.clbin.tmp.<pid>.<token>.<ns>,
 * <key>.clbin.loading.<pid>.<token>): any other file in the directory is the user's. */
void iha__disk_cache_tidy(const char *dir);
#endif
