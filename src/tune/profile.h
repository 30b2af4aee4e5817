/* The tuning profile: one JSON file per device, read and written with cJSON.
 *
 * Where: <cache dir>/profile-<16 hex digits>.json, the digits an FNV-1a hash of the device's
 * vendor id, vendor and name (so a new driver finds, and reports, the old file); or the path
 * given in iha_context_options.profile / IHA_PROFILE. "off" disables profiles.
 * Key: the device identity (vendor id, vendor, name, driver version, OpenCL version, compute
 * units, local memory size and type), the library version and a hash of the kernel sources.
 * A file whose key differs is reported (IHA_PROFILE_IGNORED with the first differing field)
 * and not used; so is a file that does not parse, is truncated, or holds an entry for an
 * unknown kernel, an incomplete bucket or a configuration outside the kernel's space.
 * Layout (README "Tuning" documents it for users):
 *   {"format": "iha-tuning-profile", "format_version": 1,
 *    "key": {"vendor_id": ..., "vendor": ..., "name": ..., "driver_version": ...,
 *            "opencl_version": ..., "compute_units": ..., "local_mem_bytes": ...,
 *            "local_mem_type": "local"|"global", "library_version": ..., "kernel_sources": hex},
 *    "entries": [{"kernel": "attention", "role": "bucket"|"device_default",
 *                 "bucket": {"d": 64, ...}, "config": {"ATT_ROWS": 4, ...},
 *                 "seconds": ..., "default_seconds": ..., "error": ...}, ...]}
 * Concurrency: a writer re-reads the file, merges its entries over the file's (its own win for
 * the same kernel, role and bucket), writes <path>.tmp.<pid>.<addr>.<ns> and renames it over
 * the path, so readers and other writers always see a whole file. */
#ifndef IHA_TUNE_PROFILE_H
#define IHA_TUNE_PROFILE_H
#include "tune/tunable.h"

typedef struct iha_profile_entry {
    const iha_tunable *tunable;
    int is_default; /* the kernel's device-wide default (lookup level 3) rather than a bucket */
    iha_tune_bucket bucket;
    iha_tune_config config;
    double seconds, default_seconds, error;
} iha_profile_entry;

typedef struct iha_profile {
    int state;       /* iha_profile_state */
    char path[1024]; /* "" when profiles are off or there is no cache directory */
    char message[512];
    iha_profile_entry *entries;
    size_t count, capacity;
} iha_profile;

/* Chooses the path (option: NULL, "off" or a file) and loads it into *p. Problems with the
 * file set p->state and p->message, never a failure; returns an error only when out of memory. */
iha_status iha__profile_open(iha_context *ctx, const char *option, iha_profile *p);

/* Adds or replaces the entry of the same kernel, role and bucket. Returns 0 when out of memory. */
int iha__profile_put(iha_profile *p, const iha_profile_entry *e);

/* Merges p over the file on disk and writes the result atomically. */
iha_status iha__profile_save(iha_context *ctx, iha_profile *p);

/* Removes the file (a missing file is fine) and empties p. */
iha_status iha__profile_clear(iha_context *ctx, iha_profile *p);

void iha__profile_free(iha_profile *p);
#endif
