/* The configurations of one call's kernels (tune/choose.h), tuning them first on first use
 * where the context asked for it, and the record of the last call's choices. */
#include <stdlib.h>

#include "tune/choose.h"
#include "runtime/error.h"
#include "tune/state.h"

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
    iha__tune_describe(t, &task->bucket, out, source, e, choice);
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

iha_status iha__tune_choose(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            iha_attention_config *attention, iha_mix_collapse_config *mix_collapse, int flags)
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
    IHA_FORWARD_IF_ERROR(choose_one(ctx, &iha__tunable_mix_collapse, shape, options, may_tune, &c, &choices[1]));
    iha__tune_mix_collapse_config(&c, mix_collapse);
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

iha_status iha__tune_choose_decode_compact(iha_context *ctx, iha_decode_compact *dc, int mask, size_t window, int rope)
{
    iha_tune_state *s = ctx->tune;
    const iha_decode_dims *dd = &dc->dd;
    const size_t cached_tokens = dd->t_cur / dd->P > dd->k ? dd->t_cur / dd->P - dd->k : 0;
    iha_tune_task task = {&iha__tunable_decode_compact, {0, {0}}, {dd->B, cached_tokens, 1, dd->H, dd->d, dd->P}, {0}};
    iha_attention_options_init(&task.options);
    task.options.mask = mask;
    task.options.window = (int64_t)window;
    task.options.rope = rope;
    iha__tune_decode_compact_bucket(dc, mask, window, rope, &task.bucket);
    iha_tune_config c;
    iha_kernel_choice choice;
    IHA_FORWARD_IF_ERROR(choose_task(ctx, &task, 1, &c, &choice));
    iha__tune_decode_compact_config(&c, &dc->cfg);
    if (s->choice_count < IHA_TUNE_CHOICES) s->choices[s->choice_count++] = choice;
    return IHA_OK;
}

iha_status iha__tune_choose_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                     int flags, iha_backward_config *out)
{
    iha_tune_state *s = ctx->tune;
    iha_tune_config c;
    iha_kernel_choice choice;
    IHA_FORWARD_IF_ERROR(
        choose_one(ctx, &iha__tunable_backward, shape, options, (flags & IHA_CHOOSE_TUNE) != 0, &c, &choice));
    iha__tune_backward_config(&c, out);
    if (!(flags & IHA_CHOOSE_RECORD)) return IHA_OK;
    if (flags & IHA_CHOOSE_FIRST) s->choice_count = 0;
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
