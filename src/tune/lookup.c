/* The lookup from specific to general (CLBlast's src/database/database.cpp does the same per
 * vendor, architecture and device name): exact bucket, nearest bucket of the same kind, the
 * profile's device default, the built-in default of the device type, a safe default; and how a
 * choice is described to the caller. */
#include <stdio.h>
#include <string.h>

#include "tune/state.h"

static int usable(const iha_context *ctx, const iha_tunable *t, const iha_tune_bucket *b, const iha_tune_config *c)
{
    iha_tune_limits limits;
    iha__tune_limits(ctx, &limits);
    return iha__space_valid(t->space, c, b, &limits, NULL);
}

void iha__tune_lookup(const iha_context *ctx, const iha_tunable *t, const iha_tune_bucket *bucket,
                      iha_tune_config *out, int *source, const iha_profile_entry **entry)
{
    const iha_profile *p = &ctx->tune->profile;
    const iha_profile_entry *exact = NULL, *nearest = NULL, *device = NULL;
    double best = -1.0;
    for (size_t i = 0; i < p->count; ++i) {
        const iha_profile_entry *e = &p->entries[i];
        if (e->tunable != t || !usable(ctx, t, bucket, &e->config)) continue;
        if (e->is_default) {
            device = e;
            continue;
        }
        const double d = iha__bucket_distance(t->space, &e->bucket, bucket);
        if (d == 0.0) exact = e;
        if (d >= 0.0 && (best < 0.0 || d < best)) best = d, nearest = e;
    }
    const iha_profile_entry *chosen = exact ? exact : nearest ? nearest : device;
    *entry = chosen;
    if (chosen != NULL) {
        *out = chosen->config;
        *source = exact ? IHA_CONFIG_PROFILE_EXACT : nearest ? IHA_CONFIG_PROFILE_NEAREST : IHA_CONFIG_PROFILE_DEVICE;
        return;
    }
    if (t->builtin(ctx, bucket, out) && usable(ctx, t, bucket, out)) {
        *source = IHA_CONFIG_BUILTIN_TYPE;
        return;
    }
    t->safe(bucket, out);
    *source = IHA_CONFIG_BUILTIN_SAFE;
}

void iha__tune_describe(const iha_tunable *t, const iha_tune_bucket *b, const iha_tune_config *c, int source,
                        const iha_profile_entry *e, iha_kernel_choice *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->kernel, sizeof out->kernel, "%s", t->space->kernel);
    iha__bucket_format(t->space, b, out->bucket, sizeof out->bucket);
    if (c == NULL || iha__space_format(t->space, c, out->config, sizeof out->config) != 0)
        snprintf(out->config, sizeof out->config, "CLBlast database");
    out->source = source;
    if (e != NULL && !e->is_default) iha__bucket_format(t->space, &e->bucket, out->source_bucket, sizeof out->source_bucket);
}
