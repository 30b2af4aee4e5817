/* The context's tuning state and the lookup from specific to general (CLBlast's
 * src/database/database.cpp does the same per vendor, architecture and device name):
 * exact bucket, nearest bucket of the same kind, the profile's device default, the built-in
 * default of the device type, a safe default. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm/microkernel.h"
#include "tune/choose.h"
#include "tune/state.h"

static void describe(const iha_tunable *t, const iha_tune_bucket *b, const iha_tune_config *c, int source,
                     const iha_profile_entry *e, iha_kernel_choice *out);

/* The context's GEMM configuration: the profile's device entry, else the built-in of the device
 * type. Returns 0 when there is none (CLBlast's database). */
static int gemm_config(const iha_context *ctx, iha_tune_config *c, const iha_profile_entry **entry)
{
    const iha_tunable *t = &iha__tunable_gemm;
    const iha_profile *p = &ctx->tune->profile;
    const iha_profile_entry *e = NULL;
    for (size_t i = 0; i < p->count; ++i)
        if (p->entries[i].tunable == t && p->entries[i].is_default) e = &p->entries[i];
    if (entry != NULL) *entry = e;
    if (e != NULL) {
        *c = e->config;
        return 1;
    }
    iha_tune_bucket none = {0, {0}};
    return t->builtin(ctx, &none, c);
}

iha_status iha__tune_context_init(iha_context *ctx, const char *profile_option, int first_use, double budget_s)
{
    iha_tune_state *s = calloc(1, sizeof *s);
    IHA_RETURN_ERROR_IF(s == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    ctx->tune = s;
    s->first_use = first_use != 0;
    s->first_use_budget_s = budget_s > 0.0 ? budget_s : 10.0;
    IHA_FORWARD_IF_ERROR(iha__profile_open(ctx, profile_option, &s->profile));
    iha_tune_bucket none = {0, {0}};
    describe(&iha__tunable_gemm, &none, NULL, IHA_CONFIG_BUILTIN_TYPE, NULL, &s->gemm);
    /* The library's kernel is context state and costs nothing to choose; CLBlast's parameters
     * wait for the first layer call (see state.h). */
    iha_tune_config c;
    iha_gemm_config g;
    if (gemm_config(ctx, &c, NULL)) {
        iha__tune_gemm_own_config(&c, &g);
        if (g.own) return iha__tune_apply_gemm(ctx);
    }
    return IHA_OK;
}

void iha__tune_context_free(iha_context *ctx)
{
    if (ctx->tune == NULL) return;
    iha__profile_free(&ctx->tune->profile);
    free(ctx->tune->attempted);
    free(ctx->tune);
    ctx->tune = NULL;
}

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

static void describe(const iha_tunable *t, const iha_tune_bucket *b, const iha_tune_config *c, int source,
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

iha_status iha__tune_apply_gemm(iha_context *ctx)
{
    const iha_tunable *t = &iha__tunable_gemm;
    const iha_profile_entry *e;
    iha_tune_config c;
    iha_tune_bucket none = {0, {0}};
    ctx->tune->gemm_applied = 1;
    ctx->tune->clblast_applied = 0; /* the configuration may have changed (iha_tune, a clear) */
    if (!gemm_config(ctx, &c, &e)) {
        /* No profile entry and no built-in: CLBlast with its database. */
        ctx->gemm.own = 0;
        describe(t, &none, NULL, IHA_CONFIG_BUILTIN_TYPE, NULL, &ctx->tune->gemm);
        return IHA_OK;
    }
    if (e != NULL)
        describe(t, &e->bucket, &c, IHA_CONFIG_PROFILE_DEVICE, NULL, &ctx->tune->gemm);
    else
        describe(t, &none, &c, IHA_CONFIG_BUILTIN_TYPE, NULL, &ctx->tune->gemm);
    return t->apply(ctx, &c);
}

/* ---- Tuning on first use ---- */

/* Whether the task was tuned on first use before; records it when not. */
static int already_attempted(iha_tune_state *s, const iha_tune_task *task)
{
    for (size_t i = 0; i < s->attempted_count; ++i)
        if (s->attempted[i].tunable == task->tunable &&
            iha__bucket_distance(task->tunable->space, &s->attempted[i].bucket, &task->bucket) == 0.0)
            return 1;
    if (s->attempted_count == s->attempted_capacity) {
        size_t cap = s->attempted_capacity ? 2 * s->attempted_capacity : 8;
        iha_tune_task *grown = realloc(s->attempted, cap * sizeof *grown);
        if (grown == NULL) return 1; /* cannot remember it: do not tune rather than tune forever */
        s->attempted = grown;
        s->attempted_capacity = cap;
    }
    s->attempted[s->attempted_count++] = *task;
    return 0;
}

/* Chooses the configuration of a task's bucket, tuning it first when may_tune and the context
 * asked for it. */
static iha_status choose_task(iha_context *ctx, iha_tune_task *task, int may_tune, iha_tune_config *out,
                              iha_kernel_choice *choice)
{
    const iha_tunable *t = task->tunable;
    int source;
    const iha_profile_entry *e;
    iha__tune_lookup(ctx, t, &task->bucket, out, &source, &e);
    if (may_tune && source != IHA_CONFIG_PROFILE_EXACT && ctx->tune->first_use && !already_attempted(ctx->tune, task)) {
        const iha_tune_run run = {task, 1, ctx->tune->first_use_budget_s, 0, 5, 0, NULL, NULL, NULL};
        IHA_FORWARD_IF_ERROR(iha__tune_tasks(ctx, &run));
        iha__tune_lookup(ctx, t, &task->bucket, out, &source, &e);
    }
    describe(t, &task->bucket, out, source, e, choice);
    return IHA_OK;
}

static iha_status choose_one(iha_context *ctx, const iha_tunable *t, const iha_shape *shape,
                             const iha_attention_options *options, int may_tune, iha_tune_config *out,
                             iha_kernel_choice *choice)
{
    iha_tune_task task = {t, {0, {0}}, *shape, *options};
    t->bucket_of(ctx, shape, options, &task.bucket);
    return choose_task(ctx, &task, may_tune, out, choice);
}

void iha__tune_gemm_ready(iha_context *ctx)
{
    if (!ctx->tune->gemm_applied && iha__tune_apply_gemm(ctx) != IHA_OK) iha__message_clear(&ctx->message);
}

void iha__tune_clblast_ready(iha_context *ctx)
{
    iha__tune_gemm_ready(ctx);
    iha_tune_config c;
    if (!ctx->gemm.own || ctx->tune->clblast_applied || !gemm_config(ctx, &c, NULL)) return;
    ctx->tune->clblast_applied = 1;
    if (iha__tune_gemm_clblast_apply(ctx, &c) != IHA_OK) iha__message_clear(&ctx->message);
}

void iha__tune_gemm_own_tile(iha_context *ctx, iha_gemm_config *out)
{
    iha_tune_config c;
    if (gemm_config(ctx, &c, NULL))
        iha__tune_gemm_own_config(&c, out);
    else
        iha__gemm_kernel_default(ctx, out);
    out->own = 1;
}

iha_status iha__tune_choose(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            iha_attention_config *attention, iha_rows_config *rows, int flags)
{
    iha_tune_state *s = ctx->tune;
    iha_tune_config c;
    const int may_tune = (flags & IHA_CHOOSE_TUNE) != 0, record = (flags & IHA_CHOOSE_RECORD) != 0;
    iha_kernel_choice scratch[2];
    iha_kernel_choice *choices = record ? s->choices : scratch;
    if (record) s->choice_count = 0;
    /* CLBlast's parameters are the one thing a profile sets beyond this context. A failure to
     * set them leaves CLBlast's own in charge; it is not the call's failure. */
    iha__tune_gemm_ready(ctx);
    IHA_FORWARD_IF_ERROR(choose_one(ctx, &iha__tunable_attention, shape, options, may_tune, &c, &choices[0]));
    iha__tune_attention_config(&c, attention);
    IHA_FORWARD_IF_ERROR(choose_one(ctx, &iha__tunable_rows, shape, options, may_tune, &c, &choices[1]));
    iha__tune_rows_config(&c, rows);
    if (record) s->choice_count = 2;
    return IHA_OK;
}

iha_status iha__tune_choose_decode(iha_context *ctx, iha_decode_dims *dd, int mask, size_t window)
{
    iha_tune_state *s = ctx->tune;
    /* Tuning on first use times this step's bucket on a cache of the keys it has seen so far. */
    const size_t cached_tokens = dd->t_cur / dd->P > dd->k ? dd->t_cur / dd->P - dd->k : 0;
    iha_tune_task task = {&iha__tunable_decode, {0, {0}}, {dd->B, cached_tokens, 1, dd->H, dd->d, dd->P}, {0}};
    iha_attention_options_init(&task.options);
    task.options.mask = mask;
    task.options.window = (int64_t)window;
    iha__tune_decode_bucket(dd, mask, window, &task.bucket);
    iha_tune_config c;
    iha_kernel_choice choice;
    IHA_FORWARD_IF_ERROR(choose_task(ctx, &task, 1, &c, &choice));
    iha__tune_decode_config(&c, &dd->tune);
    if (s->choice_count < IHA_TUNE_CHOICES) s->choices[s->choice_count++] = choice;
    return IHA_OK;
}

iha_status iha_context_last_choices(const iha_context *ctx, iha_kernel_choice *out, size_t capacity, size_t *count)
{
    if (ctx == NULL || count == NULL || (out == NULL && capacity > 0)) return IHA_ERROR_INVALID_ARGUMENT;
    const iha_tune_state *s = ctx->tune;
    *count = s->choice_count + 1;
    for (size_t i = 0; i < s->choice_count && i < capacity; ++i) out[i] = s->choices[i];
    if (s->choice_count < capacity) out[s->choice_count] = s->gemm;
    return IHA_OK;
}
