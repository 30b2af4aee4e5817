/*
 * fuzz_profile.c - libFuzzer target for the tuning profile reader (src/tune/profile.c).
 *
 * Each input is a profile file. A profile is used only when its "key" matches the device, and
 * a fuzzer would never guess the key of this machine, so every "@KEY@" in the input is
 * replaced by the real key object (taken once from a profile the library writes itself); the
 * committed seeds use it, and the fuzzer can still mutate everything around it. The reader
 * must load the file or ignore it with a message, never crash, and every loaded entry must
 * name a kernel and hold a configuration inside that kernel's space.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "runtime/context.h"
#include "tune/profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static iha_context *g_ctx;
static char g_path[256];
static char *g_key; /* the device's key object, as JSON text */

static void die(const char *what)
{
    fprintf(stderr, "fuzz_profile: %s\n", what);
    abort();
}

static void remove_scratch(void) { unlink(g_path); }

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *text = calloc(1, 1 << 20);
    if (text && fread(text, 1, (1 << 20) - 1, f) == 0) {
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

static void setup(void)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.cache_dir = "off";
    options.profile = "off";
    char message[512] = "";
    if (iha_context_create(&g_ctx, &options, message, sizeof message) != IHA_OK) {
        fprintf(stderr, "fuzz_profile: no context: %s\n", message);
        abort();
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(g_path, sizeof g_path, "%s/iha-fuzz-profile-%ld.json", tmp && tmp[0] ? tmp : "/tmp", (long)getpid());
    atexit(remove_scratch);
    /* An empty profile written by the library carries this device's key. */
    unlink(g_path);
    iha_profile p;
    if (iha__profile_open(g_ctx, g_path, &p) != IHA_OK || iha__profile_save(g_ctx, &p) != IHA_OK)
        die("cannot write a profile to take the key from");
    iha__profile_free(&p);
    char *text = read_text(g_path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(root, "key");
    g_key = key ? cJSON_PrintUnformatted(key) : NULL;
    if (!g_key)
        die("the library's own profile has no key");
    cJSON_Delete(root);
    free(text);
}

/* Writes data to the scratch file with every "@KEY@" replaced by the key. */
static void write_profile(const uint8_t *data, size_t size)
{
    FILE *f = fopen(g_path, "wb");
    if (!f)
        die("cannot write the scratch profile");
    const size_t key_len = strlen(g_key);
    for (size_t i = 0; i < size;) {
        if (size - i >= 5 && memcmp(data + i, "@KEY@", 5) == 0) {
            fwrite(g_key, 1, key_len, f);
            i += 5;
        } else {
            fputc(data[i++], f);
        }
    }
    if (fclose(f) != 0)
        die("cannot write the scratch profile");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_ctx)
        setup();
    write_profile(data, size);
    iha_profile p;
    if (iha__profile_open(g_ctx, g_path, &p) != IHA_OK)
        die("iha__profile_open failed (only out of memory may)");
    if (p.state == IHA_PROFILE_IGNORED) {
        if (!p.message[0] || p.count != 0)
            die("an ignored profile without a message, or with entries");
    } else if (p.state == IHA_PROFILE_LOADED) {
        iha_tune_limits limits;
        iha__tune_limits(g_ctx, &limits);
        for (size_t i = 0; i < p.count; i++) {
            const iha_profile_entry *e = &p.entries[i];
            if (!e->tunable || !iha__space_valid(e->tunable->space, &e->config, &e->bucket, &limits, NULL))
                die("a loaded entry is outside its kernel's space");
        }
    } else {
        die("an existing profile neither loaded nor ignored");
    }
    iha__profile_free(&p);
    return 0;
}
