/* The tuning profile file: key, JSON reading and validation, merge and atomic write. See
 * profile.h for the format and the concurrency rules. */
#include "tune/profile.h"
#include "common/file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/hash.h"
#include "runtime/disk_cache.h"
#include "runtime/kernel_sources.h"

#define FORMAT_NAME "iha-tuning-profile"
#define FORMAT_VERSION 1
#define MAX_FILE_BYTES (16u << 20)

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
    k->vendor = ctx->info.device_vendor;
    k->name = ctx->info.device_name;
    k->driver_version = ctx->info.driver_version;
    k->opencl_version = ctx->info.device_version;
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

/* Parses and validates one entry; on failure writes why. */
static int parse_entry(const iha_context *ctx, const cJSON *e, iha_profile_entry *out, char *why, size_t cap)
{
    memset(out, 0, sizeof *out);
    const cJSON *kernel = cJSON_GetObjectItemCaseSensitive(e, "kernel");
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
    const cJSON *bucket = cJSON_GetObjectItemCaseSensitive(e, "bucket");
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(e, "config");
    if (!cJSON_IsString(kernel) || !cJSON_IsString(role) || !cJSON_IsObject(bucket) || !cJSON_IsObject(config))
        return snprintf(why, cap, "an entry lacks kernel, role, bucket or config"), 0;
    out->tunable = iha__tunable_find(kernel->valuestring);
    if (out->tunable == NULL) return snprintf(why, cap, "an entry names an unknown kernel \"%s\"", kernel->valuestring), 0;
    const iha_tune_space *s = out->tunable->space;
    if (strcmp(role->valuestring, "bucket") != 0 && strcmp(role->valuestring, "device_default") != 0)
        return snprintf(why, cap, "an entry of %s has an unknown role \"%s\"", s->kernel, role->valuestring), 0;
    out->is_default = strcmp(role->valuestring, "device_default") == 0;
    out->bucket.count = s->key_count;
    for (int i = 0; i < s->key_count; ++i)
        if (!read_long(bucket, s->keys[i].name, &out->bucket.values[i]) || out->bucket.values[i] < 0)
            return snprintf(why, cap, "a %s bucket lacks a valid \"%s\"", s->kernel, s->keys[i].name), 0;
    for (int i = 0; i < s->param_count; ++i)
        if (!read_long(config, s->params[i].name, &out->config.v[i]))
            return snprintf(why, cap, "a %s configuration lacks a valid \"%s\"", s->kernel, s->params[i].name), 0;
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

int iha__profile_put(iha_profile *p, const iha_profile_entry *e)
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

/* ---- Reading ---- */

/* Reads p->path into p's entries; sets state and message. Returns 0 only when out of memory. */
static int load(const iha_context *ctx, iha_profile *p)
{
    p->count = 0;
    size_t length = 0;
    errno = 0;
    char *text = iha__read_file(p->path, MAX_FILE_BYTES, &length);
    if (text == NULL) {
        const int missing = errno == ENOENT;
        p->state = missing ? IHA_PROFILE_NONE : IHA_PROFILE_IGNORED;
        if (!missing) snprintf(p->message, sizeof p->message, "cannot read %.300s (or it exceeds 16 MiB)", p->path);
        return 1;
    }
    cJSON *root = cJSON_ParseWithLength(text, length);
    free(text);
    char why[400] = "";
    profile_key key;
    make_key(ctx, &key);
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *entries = cJSON_GetObjectItemCaseSensitive(root, "entries");
    long version = 0;
    int ok = 1;
    if (root == NULL) {
        snprintf(why, sizeof why, "it is not valid JSON (truncated or corrupt)");
        ok = 0;
    } else if (!cJSON_IsString(format) || strcmp(format->valuestring, FORMAT_NAME) != 0 ||
               !read_long(root, "format_version", &version) || version != FORMAT_VERSION || !cJSON_IsArray(entries)) {
        snprintf(why, sizeof why, "it is not an %s of format_version %d with an entries array", FORMAT_NAME,
                 FORMAT_VERSION);
        ok = 0;
    } else {
        ok = key_matches(cJSON_GetObjectItemCaseSensitive(root, "key"), &key, why, sizeof why);
    }
    for (const cJSON *e = ok ? entries->child : NULL; e != NULL && ok; e = e->next) {
        iha_profile_entry entry;
        ok = parse_entry(ctx, e, &entry, why, sizeof why);
        if (ok && !iha__profile_put(p, &entry)) {
            cJSON_Delete(root);
            return 0;
        }
    }
    cJSON_Delete(root);
    if (!ok) {
        p->count = 0;
        p->state = IHA_PROFILE_IGNORED;
        snprintf(p->message, sizeof p->message, "tuning profile %.200s ignored: %.280s", p->path, why);
        return 1;
    }
    p->state = IHA_PROFILE_LOADED;
    return 1;
}

iha_status iha__profile_open(iha_context *ctx, const char *option, iha_profile *p)
{
    memset(p, 0, sizeof *p);
    if (option != NULL && strcmp(option, "off") == 0) {
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
        h = iha__hash_string(iha__hash_string(h, ctx->info.device_vendor), ctx->info.device_name);
        n = snprintf(p->path, sizeof p->path, "%s/profile-%016llx.json", ctx->cache_dir, (unsigned long long)h);
    } else {
        p->state = IHA_PROFILE_OFF; /* no cache directory, no path given */
        return IHA_OK;
    }
    if (n < 0 || (size_t)n >= sizeof p->path) {
        p->path[0] = '\0';
        p->state = IHA_PROFILE_IGNORED;
        snprintf(p->message, sizeof p->message, "the tuning profile path is too long");
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

static char *render(const iha_context *ctx, const iha_profile *p)
{
    profile_key key;
    make_key(ctx, &key);
    cJSON *root = cJSON_CreateObject(), *entries = cJSON_CreateArray(), *k = key_to_json(&key);
    int ok = root && entries && k && cJSON_AddStringToObject(root, "format", FORMAT_NAME) &&
             cJSON_AddNumberToObject(root, "format_version", FORMAT_VERSION);
    if (ok) {
        cJSON_AddItemToObject(root, "key", k);
        cJSON_AddItemToObject(root, "entries", entries);
        k = entries = NULL;
    }
    for (size_t i = 0; ok && i < p->count; ++i) {
        cJSON *e = entry_to_json(&p->entries[i]);
        ok = e != NULL;
        if (ok) cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(root, "entries"), e);
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    cJSON_Delete(entries);
    cJSON_Delete(k);
    return text;
}

static int write_atomically(const char *path, const char *text)
{
    char dir[1024], tmp[1200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash != NULL && slash != dir) {
        *slash = '\0';
        if (iha__mkdir_p(dir) != 0) return -1;
    }
    /* Unique per writer without global state: pid, this frame's address and the clock. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%lx.%ld", path, (long)getpid(), (unsigned long)(uintptr_t)&now,
                     (long)now.tv_nsec);
    if (n < 0 || (size_t)n >= sizeof tmp) return -1;
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) return -1;
    const size_t len = strlen(text);
    int ok = fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}

iha_status iha__profile_save(iha_context *ctx, iha_profile *p)
{
    IHA_RETURN_ERROR_IF(p->path[0] == '\0', ctx, IHA_ERROR_IO,
                        "no tuning profile path: the cache directory is off and no profile path was given");
    /* Another process may have written since this one loaded: keep its entries under ours. */
    iha_profile disk;
    memset(&disk, 0, sizeof disk);
    memcpy(disk.path, p->path, sizeof disk.path);
    IHA_RETURN_ERROR_IF(!load(ctx, &disk), ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    int ok = 1;
    if (disk.state == IHA_PROFILE_LOADED) {
        for (size_t i = 0; i < p->count && ok; ++i) ok = iha__profile_put(&disk, &p->entries[i]);
        if (ok) {
            free(p->entries);
            p->entries = disk.entries;
            p->count = disk.count;
            p->capacity = disk.capacity;
            disk.entries = NULL;
        }
    }
    iha__profile_free(&disk);
    char *text = ok ? render(ctx, p) : NULL;
    IHA_RETURN_ERROR_IF(text == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the tuning profile");
    const int written = write_atomically(p->path, text);
    free(text);
    IHA_RETURN_ERROR_IF(written != 0, ctx, IHA_ERROR_IO, "cannot write the tuning profile %s", p->path);
    p->state = IHA_PROFILE_LOADED;
    p->message[0] = '\0';
    return IHA_OK;
}

iha_status iha__profile_clear(iha_context *ctx, iha_profile *p)
{
    p->count = 0;
    if (p->state != IHA_PROFILE_OFF) {
        p->state = IHA_PROFILE_NONE;
        p->message[0] = '\0';
    }
    if (p->path[0] == '\0') return IHA_OK;
    IHA_RETURN_ERROR_IF(remove(p->path) != 0 && errno != ENOENT, ctx, IHA_ERROR_IO, "cannot remove %s", p->path);
    return IHA_OK;
}

void iha__profile_free(iha_profile *p)
{
    free(p->entries);
    p->entries = NULL;
    p->count = p->capacity = 0;
}
