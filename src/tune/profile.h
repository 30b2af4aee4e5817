/* The tuning profile: one JSON file per device, read and written with cJSON.
 *
 * Where: <cache dir>/profile-<16 hex digits>.json, the digits an FNV-1a hash of the device's
 * vendor id, vendor and name (so a new driver finds, and reports, the old file); or the path
 * given in iha_context_options.profile / IHA_PROFILE. "off" (any case) disables profiles.
 * Key: the device identity (vendor id, vendor, name, driver version, OpenCL version, compute
 * units, local memory size and type), the library version and a hash of the kernel sources.
 * A file whose key differs is reported (IHA_PROFILE_IGNORED with the first differing field)
 * and not used; so is a file that does not parse, is truncated, or holds an entry of a known
 * kernel with an incomplete bucket or a configuration outside the kernel's space. The key
 * uses the device's whole strings (context.h, iha_device_identity), however long.
 * Layout (doc/tuning.md documents it for users):
 *   {"format": "iha-tuning-profile", "format_version": 2,
 *    "key": {"vendor_id": ..., "vendor": ..., "name": ..., "driver_version": ...,
 *            "opencl_version": ..., "compute_units": ..., "local_mem_bytes": ...,
 *            "local_mem_type": "local"|"global", "library_version": ..., "kernel_sources": hex},
 *    "entries": [{"kernel": "attention", "role": "bucket"|"device_default",
 *                 "bucket": {"d": 64, ...}, "config": {"ATT_ROWS": 4, ...},
 *                 "seconds": ..., "default_seconds": ..., "error": ...}, ...]}
 * Entries for a kernel or role this library does not know (a newer library's) are not used,
 * reported in the message of a loaded profile, and kept in the file by every writer.
 * format_version: files of an older version are read, an entry taking each parameter added since
 * at the value it ran with (iha_tune_space.added), and a writer rewrites them in this version;
 * files of a newer one are reported, never read, never overwritten.
 * Concurrency: writers and iha_profile_clear hold an advisory lock (flock on <path>.lock, a file
 * that stays). A writer re-reads the file under it and replaces only the entries this process
 * tuned since it last wrote (iha_profile_entry.pending), keeping every other entry, so it never
 * reverts another writer's results nor brings back what a clear removed; then it writes
 * <path>.tmp.<pid>.<token>.<ns> and renames it over the path, so readers always see a whole
 * file. A file of a newer format_version is never overwritten. Files are opened non-blocking
 * and must be regular files (a FIFO there is reported, never waited on). */
#ifndef IHA_TUNE_PROFILE_H
#define IHA_TUNE_PROFILE_H
#include "iha_tune.h"
#include "tune/tunable.h"

typedef struct iha_profile_entry {
    const iha_tunable *tunable;
    int is_default; /* the kernel's device-wide default (lookup level 3) rather than a bucket */
    iha_tune_bucket bucket;
    iha_tune_config config;
    double seconds, default_seconds, error;
    int pending; /* tuned by this process and not written yet: the entries a save writes */
} iha_profile_entry;

typedef struct iha_profile {
    int state;       /* iha_profile_state */
    char path[4096]; /* "" when profiles are off, or there is no usable cache directory or path */
    char message[512];
    iha_profile_entry *entries;
    size_t count, capacity;
} iha_profile;

/* Chooses the path (option: NULL, "off" or a file) and loads it into *p. Problems with the
 * file set p->state and p->message, never a failure; returns an error only when out of memory. */
iha_status iha__profile_open(iha_context *ctx, const char *option, iha_profile *p);

/* Adds or replaces the entry of the same kernel, role and bucket, marked pending (to be written
 * by the next save). Returns 0 when out of memory. */
int iha__profile_put(iha_profile *p, const iha_profile_entry *e);

/* Whether a save can work: a path, its directory made, the lock file created. Fails with
 * IHA_ERROR_IO and the cause; iha_tune asks before it spends its budget. */
iha_status iha__profile_check_writable(iha_context *ctx, const iha_profile *p);

/* Writes p's pending entries into the file on disk (see Concurrency above) and reloads p from
 * the result. */
iha_status iha__profile_save(iha_context *ctx, iha_profile *p);

/* Removes the file under the lock (a missing file is fine) and empties p. */
iha_status iha__profile_clear(iha_context *ctx, iha_profile *p);

void iha__profile_free(iha_profile *p);
#endif
