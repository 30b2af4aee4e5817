/* The tuning profile file: key, JSON reading and validation, merge and atomic write (the
 * file-system checks and the lock: profile_file.c). See profile.h for the format and the
 * concurrency rules. */
#include "tune/profile.h"
#include "tune/profile_file.h"
#include "common/file.h"
#include "runtime/error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/temp_file.h"
#include "runtime/disk_cache.h"
#include "runtime/kernel_sources.h"

/* 2: the attention kernel's TILE_RY and TILE_RX. Files of version 1 are read, their entries
 * taking each added parameter's earlier value (iha_tune_param_added); files of a newer version
 * are reported, never read or written over. */
#define FORMAT_VERSION 2
#define OLDEST_FORMAT_VERSION 1

/* ---- Key ---- */

typedef struct profile_key {
    double vendor_id, compute_units, local_mem_bytes;
    const char *vendor, *name, *driver_version, *opencl_version, *local_mem_type, *library_version;
    char kernel_sources[17];
} profile_key;

/* The sources the context builds: the embedded table, or the developer's directory. */
static uint64_t sources_hash(const iha_context *ctx)
{
    uint64_t h = IHA_HASH_SEED;
    for (const iha_kernel_source *s = iha__kernel_sources; s->name != NULL; ++s) {
        h = iha__hash_string(h, s->name);
        char path[4200], *text = NULL;
        size_t length = 0;
        if (ctx->kernel_dir && snprintf(path, sizeof path, "%s/%s", ctx->kernel_dir, s->name) < (int)sizeof path)
            text = iha__read_file(path, MAX_FILE_BYTES, &length);
        h = text ? iha__hash_bytes(h, text, length) : iha__hash_bytes(h, s->text, s->length);
        free(text);
    }
    return h;
}

static void make_key(const iha_context *ctx, profile_key *k)
{
    cl_uint vendor_id = 0;
    if (clGetDeviceInfo(ctx->device, CL_DEVICE_VENDOR_ID, sizeof vendor_id, &vendor_id, NULL) != CL_SUCCESS)
        vendor_id = 0;
    k->vendor_id = vendor_id;
    k->vendor = ctx->identity.device_vendor;
    k->name = ctx->identity.device_name;
    k->driver_version = ctx->identity.driver_version;
    k->opencl_version = ctx->identity.device_version;
    k->compute_units = ctx->info.compute_units;
    k->local_mem_bytes = (double)ctx->info.local_mem_bytes;
    k->local_mem_type = ctx->info.local_mem_is_global ? "global" : "local";
    k->library_version = IHA_VERSION_STRING;
    snprintf(k->kernel_sources, sizeof k->kernel_sources, "%016llx", (unsigned long long)sources_hash(ctx));
}

static cJSON *key_to_json(const profile_key *k)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL) return NULL;
    int ok = cJSON_AddNumberToObject(o, "vendor_id", k->vendor_id) && cJSON_AddStringToObject(o, "vendor", k->vendor) &&
             cJSON_AddStringToObject(o, "name", k->name) &&
             cJSON_AddStringToObject(o, "driver_version", k->driver_version) &&
             cJSON_AddStringToObject(o, "opencl_version", k->opencl_version) &&
             cJSON_AddNumberToObject(o, "compute_units", k->compute_units) &&
             cJSON_AddNumberToObject(o, "local_mem_bytes", k->local_mem_bytes) &&
             cJSON_AddStringToObject(o, "local_mem_type", k->local_mem_type) &&
             cJSON_AddStringToObject(o, "library_version", k->library_version) &&
             cJSON_AddStringToObject(o, "kernel_sources", k->kernel_sources);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* Compares the file's key with this context's; on a difference writes which field to why. */
static int key_matches(const cJSON *file_key, const profile_key *k, char *why, size_t cap)
{
    cJSON *mine = key_to_json(k);
    if (mine == NULL) return snprintf(why, cap, "out of host memory"), 0;
    int ok = 1;
    for (const cJSON *field = mine->child; field && ok; field = field->next) {
        const cJSON *theirs = cJSON_GetObjectItemCaseSensitive(file_key, field->string);
        if (theirs == NULL || !cJSON_Compare(field, theirs, 1)) {
            char *a = cJSON_PrintUnformatted(field), *b = theirs ? cJSON_PrintUnformatted(theirs) : NULL;
            snprintf(why, cap, "it was made for %s %s, this context has %s", field->string, b ? b : "(missing)",
                     a ? a : "?");
            free(a), free(b);
            ok = 0;
        }
    }
    cJSON_Delete(mine);
    return ok;
}

/* ---- Entries ---- */

static int read_long(const cJSON *obj, const char *name, long *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!cJSON_IsNumber(item)) return 0;
    /* Range first: converting a double outside long's range (1e300 in a hand-edited file) is
     * undefined behaviour, which the profile fuzzer found. */
    const double v = item->valuedouble;
    if (!(v >= -9007199254740992.0 && v <= 9007199254740992.0) || v != floor(v)) return 0; /* +-2^53 */
    *out = (long)v;
    return 1;
}

static double read_double(const cJSON *obj, const char *name)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNumber(item) ? item->valuedouble : 0.0;
}

/* The value of parameter `name` that an entry of a file of format_version `version` lacks
 * because the parameter is younger than the file; 0 when it is not such a parameter. */
static int added_after(const iha_tune_space *s, const char *name, long version, long *value)
{
    for (int i = 0; i < s->added_count; ++i)
        if (strcmp(s->added[i].name, name) == 0 && version < s->added[i].since) {
            *value = s->added[i].before;
            return 1;
        }
    return 0;
}

/* Parses and validates one entry of a file of format_version `version`: 1 when it is valid, -1
 * when it names a kernel or role this library does not know (kept, not used), 0 when it is
 * invalid (why says how). */
static int parse_entry(const iha_context *ctx, const cJSON *e, long version, iha_profile_entry *out, char *why,
                       size_t cap)
{
    memset(out, 0, sizeof *out);
    const cJSON *kernel = cJSON_GetObjectItemCaseSensitive(e, "kernel");
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
    const cJSON *bucket = cJSON_GetObjectItemCaseSensitive(e, "bucket");
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(e, "config");
    if (!cJSON_IsString(kernel) || !cJSON_IsString(role) || !cJSON_IsObject(bucket) || !cJSON_IsObject(config))
        return snprintf(why, cap, "an entry lacks kernel, role, bucket or config"), 0;
    out->tunable = iha__tunable_find(kernel->valuestring);
    if (out->tunable == NULL) return -1;
    const iha_tune_space *s = out->tunable->space;
    if (strcmp(role->valuestring, "bucket") != 0 && strcmp(role->valuestring, "device_default") != 0) return -1;
    out->is_default = strcmp(role->valuestring, "device_default") == 0;
    out->bucket.count = s->key_count;
    for (int i = 0; i < s->key_count; ++i)
        if (!read_long(bucket, s->keys[i].name, &out->bucket.values[i]) || out->bucket.values[i] < 0)
            return snprintf(why, cap, "a %s bucket lacks a valid \"%s\"", s->kernel, s->keys[i].name), 0;
    for (int i = 0; i < s->param_count; ++i) {
        const char *name = s->params[i].name;
        if (cJSON_GetObjectItemCaseSensitive(config, name) == NULL &&
            added_after(s, name, version, &out->config.v[i]))
            continue;
        if (!read_long(config, name, &out->config.v[i]))
            return snprintf(why, cap, "a %s configuration lacks a valid \"%s\"", s->kernel, name), 0;
    }
    iha_tune_limits limits;
    iha__tune_limits(ctx, &limits);
    const char *rule = NULL;
    if (!iha__space_valid(s, &out->config, &out->bucket, &limits, &rule))
        return snprintf(why, cap, "a %s configuration is outside its space: %s", s->kernel, rule), 0;
    out->seconds = read_double(e, "seconds");
    out->default_seconds = read_double(e, "default_seconds");
    out->error = read_double(e, "error");
    return 1;
}

static int same_slot(const iha_profile_entry *a, const iha_profile_entry *b)
{
    if (a->tunable != b->tunable || a->is_default != b->is_default) return 0;
    if (a->is_default) return 1;
    return memcmp(a->bucket.values, b->bucket.values, sizeof a->bucket.values[0] * (size_t)a->bucket.count) == 0;
}

/* Adds or replaces e as it is (pending or not). */
static int put(iha_profile *p, const iha_profile_entry *e)
{
    for (size_t i = 0; i < p->count; ++i)
        if (same_slot(&p->entries[i], e)) {
            p->entries[i] = *e;
            return 1;
        }
    if (p->count == p->capacity) {
        size_t cap = p->capacity ? 2 * p->capacity : 16;
        iha_profile_entry *grown = realloc(p->entries, cap * sizeof *grown);
        if (grown == NULL) return 0;
        p->entries = grown;
        p->capacity = cap;
    }
    p->entries[p->count++] = *e;
    return 1;
}

int iha__profile_put(iha_profile *p, const iha_profile_entry *e)
{
    iha_profile_entry pending = *e;
    pending.pending = 1;
    return put(p, &pending);
}

/* The pending entry of p in the same slot as e, or NULL. */
static const iha_profile_entry *pending_in_slot(const iha_profile *p, const iha_profile_entry *e)
{
    for (size_t i = 0; i < p->count; ++i)
        if (p->entries[i].pending && same_slot(&p->entries[i], e)) return &p->entries[i];
    return NULL;
}

/* ---- Reading ---- */

/* What a parsed file is to this context. */
typedef enum file_kind { FILE_OURS, FILE_NEWER, FILE_FOREIGN } file_kind;

/* Whether root is a profile of this format and key (FILE_OURS, *version its format_version,
 * which may be older than this library's), of a newer format_version (FILE_NEWER), or anything
 * else (why says what). */
static file_kind classify(const iha_context *ctx, const cJSON *root, long *version, char *why, size_t cap)
{
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *entries = cJSON_GetObjectItemCaseSensitive(root, "entries");
    *version = 0;
    if (root == NULL) return snprintf(why, cap, "it is not valid JSON (truncated or corrupt)"), FILE_FOREIGN;
    if (cJSON_IsString(format) && strcmp(format->valuestring, FORMAT_NAME) == 0 &&
        read_long(root, "format_version", version) && *version > FORMAT_VERSION)
        return snprintf(why, cap, "it has format_version %ld, newer than this library's %d", *version, FORMAT_VERSION),
               FILE_NEWER;
    if (!cJSON_IsString(format) || strcmp(format->valuestring, FORMAT_NAME) != 0 ||
        *version < OLDEST_FORMAT_VERSION || !cJSON_IsArray(entries))
        return snprintf(why, cap, "it is not an %s of format_version %d to %d with an entries array", FORMAT_NAME,
                        OLDEST_FORMAT_VERSION, FORMAT_VERSION),
               FILE_FOREIGN;
    profile_key key;
    make_key(ctx, &key);
    return key_matches(cJSON_GetObjectItemCaseSensitive(root, "key"), &key, why, cap) ? FILE_OURS : FILE_FOREIGN;
}

/* The usable entries of a parsed file into *loaded, skipping the slots of p's pending entries,
 * then those pending entries, and the count of unknown ones: 1, 0 when the file is not this
 * context's or holds an invalid entry (why says what), -1 when out of memory. */
static int collect(const iha_context *ctx, const cJSON *root, const iha_profile *p, iha_profile *loaded,
                   size_t *unknown, char *why, size_t cap)
{
    long version = 0;
    if (classify(ctx, root, &version, why, cap) != FILE_OURS) return 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "entries"))
    {
        iha_profile_entry entry;
        const int r = parse_entry(ctx, e, version, &entry, why, cap);
        if (r == 0) return 0;
        if (r < 0) ++*unknown;
        else if (!pending_in_slot(p, &entry) && !put(loaded, &entry)) return -1;
    }
    for (size_t i = 0; i < p->count; ++i)
        if (p->entries[i].pending && !put(loaded, &p->entries[i])) return -1;
    return 1;
}

/* Loads the entries of a file's text into p (whose pending entries stay over them); sets
 * state and message. Returns 0 only when out of memory. */
static int load_text(const iha_context *ctx, iha_profile *p, const char *text, size_t length)
{
    cJSON *root = cJSON_ParseWithLength(text, length);
    char why[400] = "";
    size_t unknown = 0;
    iha_profile loaded;
    memset(&loaded, 0, sizeof loaded);
    const int r = collect(ctx, root, p, &loaded, &unknown, why, sizeof why);
    cJSON_Delete(root);
    if (r <= 0) {
        iha__profile_free(&loaded);
        if (r < 0) return 0;
        size_t kept = 0; /* the pending entries stay in use */
        for (size_t i = 0; i < p->count; ++i)
            if (p->entries[i].pending) p->entries[kept++] = p->entries[i];
        p->count = kept;
        p->state = IHA_PROFILE_IGNORED;
        snprintf(p->message, sizeof p->message, "tuning profile %.200s ignored: %.280s", p->path, why);
        return 1;
    }
    iha__profile_free(p);
    p->entries = loaded.entries;
    p->count = loaded.count;
    p->capacity = loaded.capacity;
    p->state = IHA_PROFILE_LOADED;
    p->message[0] = '\0';
    if (unknown)
        snprintf(p->message, sizeof p->message,
                 "%zu entr%s for a kernel or role this library does not know kept in the file, not used", unknown,
                 unknown == 1 ? "y" : "ies");
    return 1;
}

/* Reads p->path into p's entries; sets state and message. Returns 0 only when out of memory. */
static int load(const iha_context *ctx, iha_profile *p)
{
    size_t length = 0;
    char *text = NULL;
    const int code = iha__file_read(p->path, MAX_FILE_BYTES, 0, &text, &length);
    if (code != 0) {
        p->state = code == ENOENT ? IHA_PROFILE_NONE : IHA_PROFILE_IGNORED;
        p->message[0] = '\0';
        if (code != ENOENT)
            snprintf(p->message, sizeof p->message, "cannot read the tuning profile %.300s: %s", p->path,
                     code == EFBIG ? "larger than 16 MiB" : iha__file_error(code));
        return 1;
    }
    const int ok = load_text(ctx, p, text, length);
    free(text);
    return ok;
}

iha_status iha__profile_open(iha_context *ctx, const char *option, iha_profile *p)
{
    memset(p, 0, sizeof *p);
    if (option != NULL && strcasecmp(option, "off") == 0) {
        p->state = IHA_PROFILE_OFF;
        return IHA_OK;
    }
    int n;
    if (option != NULL && option[0] != '\0') {
        n = snprintf(p->path, sizeof p->path, "%s", option);
    } else if (ctx->cache_dir != NULL) {
        cl_uint vendor_id = 0;
        if (clGetDeviceInfo(ctx->device, CL_DEVICE_VENDOR_ID, sizeof vendor_id, &vendor_id, NULL) != CL_SUCCESS)
            vendor_id = 0;
        uint64_t h = iha__hash_bytes(IHA_HASH_SEED, &vendor_id, sizeof vendor_id);
        h = iha__hash_string(iha__hash_string(h, ctx->identity.device_vendor), ctx->identity.device_name);
        n = snprintf(p->path, sizeof p->path, "%s/profile-%016llx.json", ctx->cache_dir, (unsigned long long)h);
    } else if (ctx->cache_dir_refused[0] != '\0') {
        p->state = IHA_PROFILE_IGNORED;
        snprintf(p->message, sizeof p->message, "no tuning profile: %s", ctx->cache_dir_refused);
        return IHA_OK;
    } else {
        p->state = IHA_PROFILE_OFF; /* no cache directory, no path given */
        return IHA_OK;
    }
    if (n < 0 || (size_t)n + 1 + IHA_DISK_CACHE_NAME_MAX >= sizeof p->path) {
        p->path[0] = '\0';
        p->state = IHA_PROFILE_IGNORED;
        snprintf(p->message, sizeof p->message,
                 "the tuning profile's path is %d bytes long: with its temporary files' suffix it would reach "
                 "PATH_MAX (%zu bytes)", n, sizeof p->path);
        return IHA_OK;
    }
    IHA_RETURN_ERROR_IF(!load(ctx, p), ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the tuning profile");
    return IHA_OK;
}

/* ---- Writing ---- */

static cJSON *entry_to_json(const iha_profile_entry *e)
{
    const iha_tune_space *s = e->tunable->space;
    cJSON *o = cJSON_CreateObject(), *bucket = cJSON_CreateObject(), *config = cJSON_CreateObject();
    int ok = o && bucket && config;
    for (int i = 0; ok && i < s->key_count; ++i)
        ok = cJSON_AddNumberToObject(bucket, s->keys[i].name, (double)e->bucket.values[i]) != NULL;
    for (int i = 0; ok && i < s->param_count; ++i)
        ok = cJSON_AddNumberToObject(config, s->params[i].name, (double)e->config.v[i]) != NULL;
    ok = ok && cJSON_AddStringToObject(o, "kernel", s->kernel) &&
         cJSON_AddStringToObject(o, "role", e->is_default ? "device_default" : "bucket");
    if (ok) {
        cJSON_AddItemToObject(o, "bucket", bucket);
        cJSON_AddItemToObject(o, "config", config);
        bucket = config = NULL;
        ok = cJSON_AddNumberToObject(o, "seconds", e->seconds) &&
             cJSON_AddNumberToObject(o, "default_seconds", e->default_seconds) &&
             cJSON_AddNumberToObject(o, "error", e->error);
    }
    cJSON_Delete(bucket);
    cJSON_Delete(config);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The file's text: this context's key, then `kept` (entries of the file on disk that stay, in
 * their order) and p's pending entries. Takes `kept`. */
static char *render(const iha_context *ctx, const iha_profile *p, cJSON *kept)
{
    profile_key key;
    make_key(ctx, &key);
    cJSON *root = cJSON_CreateObject(), *k = key_to_json(&key);
    int ok = root && kept && k && cJSON_AddStringToObject(root, "format", FORMAT_NAME) &&
             cJSON_AddNumberToObject(root, "format_version", FORMAT_VERSION);
    if (ok) {
        cJSON_AddItemToObject(root, "key", k);
        cJSON_AddItemToObject(root, "entries", kept);
        k = kept = NULL;
    }
    for (size_t i = 0; ok && i < p->count; ++i) {
        if (!p->entries[i].pending) continue;
        cJSON *e = entry_to_json(&p->entries[i]);
        ok = e != NULL;
        if (ok) cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(root, "entries"), e);
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    cJSON_Delete(kept);
    cJSON_Delete(k);
    return text;
}

/* The entries of the file on disk that a save keeps: all of a file of this format and key
 * except those that p's pending entries replace and those of a known kernel that are invalid
 * (no context could use them, and they would make the whole file ignored). A file that is
 * missing, corrupt or of another key keeps nothing (it is replaced); one of a newer format, or
 * one that cannot be read, is not written over: *refusal says why. */
static cJSON *entries_to_keep(const iha_context *ctx, const iha_profile *p, char *refusal, size_t cap)
{
    refusal[0] = '\0';
    char why[400] = "";
    int exists = 0;
    if (iha__profile_check_target(p->path, &exists, why, sizeof why) != 0) {
        snprintf(refusal, cap, "not overwritten: %s", why);
        return NULL;
    }
    char *text = NULL;
    size_t length = 0;
    const int code = iha__file_read(p->path, MAX_FILE_BYTES, IHA_FILE_NO_FOLLOW, &text, &length);
    if (code != 0 && code != ENOENT) {
        snprintf(refusal, cap, "cannot read it to merge into it: %s",
                 code == EFBIG ? "larger than 16 MiB" : iha__file_error(code));
        return NULL;
    }
    cJSON *kept = cJSON_CreateArray();
    cJSON *root = code == 0 ? cJSON_ParseWithLength(text, length) : NULL;
    free(text);
    long version = 0;
    const file_kind kind = code == 0 ? classify(ctx, root, &version, why, sizeof why) : FILE_FOREIGN;
    if (kind == FILE_NEWER) {
        snprintf(refusal, cap, "not overwritten: %s", why);
        cJSON_Delete(root);
        cJSON_Delete(kept);
        return NULL;
    }
    const cJSON *e, *list = kind == FILE_OURS && kept ? cJSON_GetObjectItemCaseSensitive(root, "entries") : NULL;
    cJSON_ArrayForEach(e, list)
    {
        iha_profile_entry entry;
        const int r = parse_entry(ctx, e, version, &entry, why, sizeof why);
        if (r == 0 || (r > 0 && pending_in_slot(p, &entry))) continue;
        /* A known entry is written as this format_version spells it (an older file's gains the
         * parameters added since); an unknown one as it came. */
        cJSON *copy = r > 0 ? entry_to_json(&entry) : cJSON_Duplicate(e, 1);
        if (copy == NULL) {
            cJSON_Delete(kept);
            kept = NULL;
            break;
        }
        cJSON_AddItemToArray(kept, copy);
    }
    cJSON_Delete(root);
    if (kept == NULL) snprintf(refusal, cap, "out of host memory");
    return kept;
}

iha_status iha__profile_check_writable(iha_context *ctx, const iha_profile *p)
{
    IHA_RETURN_ERROR_IF(p->path[0] == '\0', ctx, IHA_ERROR_IO, "cannot store tuning results: %s",
                        p->message[0] ? p->message
                                      : "the cache directory is off and no profile path was given");
    char *dir = iha__profile_parent_dir(p->path);
    IHA_RETURN_ERROR_IF(dir == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    const int made = iha__mkdir_p(dir);
    free(dir);
    IHA_RETURN_ERROR_IF(made != 0, ctx, IHA_ERROR_IO, "cannot make the tuning profile's directory for %s: %s",
                        p->path, strerror(made));
    char why[400] = "";
    int exists = 0, fd = -1, code = iha__profile_check_target(p->path, &exists, why, sizeof why);
    IHA_RETURN_ERROR_IF(code != 0, ctx, IHA_ERROR_IO, "cannot use the tuning profile %s: not overwritten: %s",
                        p->path, why);
    code = iha__profile_open_lock(p->path, 0, &fd);
    IHA_RETURN_ERROR_IF(code != 0, ctx, IHA_ERROR_IO, "cannot write beside the tuning profile %s: %s", p->path,
                        strerror(code));
    close(fd);
    return IHA_OK;
}

/* The merge and the write, under the lock. */
static iha_status merge_and_write(iha_context *ctx, iha_profile *p)
{
    char refusal[480];
    cJSON *kept = entries_to_keep(ctx, p, refusal, sizeof refusal);
    IHA_RETURN_ERROR_IF(kept == NULL, ctx, IHA_ERROR_IO, "cannot write the tuning profile %s: %s", p->path, refusal);
    char *text = render(ctx, p, kept);
    IHA_RETURN_ERROR_IF(text == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the tuning profile");
    const size_t length = strlen(text);
    const iha_file_part parts[2] = {{text, length}, {"\n", 1}};
    const int code = iha__file_replace(p->path, parts, 2, 1);
    if (code != 0) {
        free(text);
        return iha__fail(ctx, IHA_ERROR_IO, "cannot write the tuning profile %s: %s", p->path, strerror(code));
    }
    for (size_t i = 0; i < p->count; ++i) p->entries[i].pending = 0;
    const int loaded = load_text(ctx, p, text, length);
    free(text);
    IHA_RETURN_ERROR_IF(!loaded, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the tuning profile");
    return IHA_OK;
}

iha_status iha__profile_save(iha_context *ctx, iha_profile *p)
{
    IHA_FORWARD_IF_ERROR(iha__profile_check_writable(ctx, p));
    int lock = -1;
    const int code = iha__profile_open_lock(p->path, 1, &lock);
    IHA_RETURN_ERROR_IF(code != 0, ctx, IHA_ERROR_IO, "cannot lock the tuning profile %s: %s", p->path,
                        strerror(code));
    char *dir = iha__profile_parent_dir(p->path);
    const char *base = strrchr(p->path, '/') ? strrchr(p->path, '/') + 1 : p->path;
    if (dir) iha__remove_left_over_temps(dir, iha__profile_temp_of, base);
    free(dir);
    const iha_status st = merge_and_write(ctx, p);
    close(lock); /* releases the lock */
    return st;
}

iha_status iha__profile_clear(iha_context *ctx, iha_profile *p)
{
    p->count = 0;
    if (p->state != IHA_PROFILE_OFF) {
        p->state = IHA_PROFILE_NONE;
        p->message[0] = '\0';
    }
    if (p->path[0] == '\0') return IHA_OK;
    /* Checked before the lock is made, so that a refused path gets no <path>.lock beside it,
     * and again under the lock, which decides. */
    char why[400] = "";
    int exists = 0, code = iha__profile_check_target(p->path, &exists, why, sizeof why);
    IHA_RETURN_ERROR_IF(code != 0, ctx, IHA_ERROR_IO, "cannot remove %s: %s", p->path, why);
    if (!exists) return IHA_OK;
    int lock = -1;
    code = iha__profile_open_lock(p->path, 1, &lock);
    if (code == ENOENT) return IHA_OK; /* no directory, so no profile */
    IHA_RETURN_ERROR_IF(code != 0, ctx, IHA_ERROR_IO, "cannot lock the tuning profile %s: %s", p->path,
                        strerror(code));
    code = iha__profile_check_target(p->path, &exists, why, sizeof why);
    if (code != 0) {
        close(lock);
        return iha__fail(ctx, IHA_ERROR_IO, "cannot remove %s: %s", p->path, why);
    }
    code = exists && unlink(p->path) != 0 && errno != ENOENT ? errno : 0;
    close(lock);
    IHA_RETURN_ERROR_IF(code != 0, ctx, IHA_ERROR_IO, "cannot remove the tuning profile %s: %s", p->path,
                        strerror(code));
    return IHA_OK;
}

void iha__profile_free(iha_profile *p)
{
    free(p->entries);
    p->entries = NULL;
    p->count = p->capacity = 0;
}
