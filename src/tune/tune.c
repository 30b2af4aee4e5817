/* iha_tune: tasks from layer calls, a budget shared among them, results into the profile. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/timing.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"
#include "tune/state.h"

#define DEFAULT_BUDGET_S 40.0
#define DEFAULT_REPS 5

void iha_tune_options_init(iha_tune_options *options)
{
    if (options) memset(options, 0, sizeof *options);
}

/* ---- Progress ---- */

typedef struct progress_relay {
    const iha_tune_run *run;
    size_t index;
    double start;
    char bucket[160], best[512], candidate[512];
} progress_relay;

static void relay(void *user, const iha_tune_task *task, const iha_tune_outcome *o, int done)
{
    progress_relay *r = user;
    if (r->run->progress == NULL) return;
    const iha_tune_space *s = task->tunable->space;
    iha__bucket_format(s, &task->bucket, r->bucket, sizeof r->bucket);
    r->best[0] = '\0';
    if (o->found) iha__space_format(s, &o->best, r->best, sizeof r->best);
    r->candidate[0] = '\0';
    if (o->has_last) iha__space_format(s, &o->last, r->candidate, sizeof r->candidate);
    iha_tune_progress p = {s->kernel, r->bucket, r->index, r->run->count, o->candidates, o->rejected,
                           (double)iha__space_size(s), o->default_s, o->found ? o->best_s : 0.0, r->best,
                           iha__now_seconds() - r->start, r->run->budget_s, done, r->candidate,
                           o->has_last ? o->last_s : 0.0, o->confirming};
    r->run->progress(&p, r->run->user);
}

/* ---- Running tasks ---- */

static void fill_result(const iha_context *ctx, const iha_tune_task *task, const iha_tune_outcome *o,
                        iha_tune_result *r)
{
    const iha_tune_space *s = task->tunable->space;
    memset(r, 0, sizeof *r);
    snprintf(r->kernel, sizeof r->kernel, "%s", s->kernel);
    iha__bucket_format(s, &task->bucket, r->bucket, sizeof r->bucket);
    iha_tune_config builtin;
    if (!task->tunable->builtin(ctx, &task->bucket, &builtin) ||
        iha__space_format(s, &builtin, r->default_config, sizeof r->default_config) != 0)
        snprintf(r->default_config, sizeof r->default_config, "CLBlast database");
    if (o->found) iha__space_format(s, &o->best, r->tuned_config, sizeof r->tuned_config);
    r->default_s = o->default_s;
    r->tuned_s = o->found ? o->best_s : 0.0;
    r->error = o->found ? o->best_error : 0.0;
    r->candidates = o->candidates;
    r->rejected = o->rejected;
    r->space = (double)iha__space_size(s);
    r->worst_s = o->worst_s;
    r->median_s = o->median_s;
    r->seconds = o->seconds;
}

/* Stores the winners; a kernel's device default becomes the winner of its slowest bucket in
 * this run (the one that matters most), replacing an older one. */
static int store(iha_tune_state *s, const iha_tune_run *run, const iha_tune_outcome *o)
{
    for (size_t i = 0; i < run->count; ++i) {
        if (!o[i].found) continue;
        const iha_tune_task *task = &run->tasks[i];
        iha_profile_entry e = {task->tunable, 0, task->bucket, o[i].best, o[i].best_s, o[i].default_s, o[i].best_error, 1};
        if (!iha__profile_put(&s->profile, &e)) return 0;
        size_t slowest = i;
        for (size_t j = 0; j < run->count; ++j)
            if (o[j].found && run->tasks[j].tunable == task->tunable && o[j].default_s > o[slowest].default_s) slowest = j;
        e.is_default = 1;
        if (slowest == i && !iha__profile_put(&s->profile, &e)) return 0;
    }
    return 1;
}

/* Swaps in a profiling queue on the same device for the tasks, so that marker events carry
 * timestamps whatever queue the application gave. */
static iha_status run_tasks(iha_context *ctx, const iha_tune_run *run, iha_tune_outcome *outcomes)
{
    double total_weight = 0.0;
    for (size_t i = 0; i < run->count; ++i) total_weight += run->tasks[i].tunable->budget_weight;
    progress_relay r = {run, 0, iha__now_seconds(), "", "", ""};
    iha_status st = IHA_OK;
    for (size_t i = 0; i < run->count && st == IHA_OK; ++i) {
        const iha_tune_task *task = &run->tasks[i];
        /* Each task gets its weight's share of what is left, so time a task saves goes on; once
         * the budget is spent the remaining tasks are not started (not even their built-in is
         * timed: on PoCL that alone is a compile). */
        const double left = run->budget_s - (iha__now_seconds() - r.start);
        if (left <= 0.0 && !run->exhaustive) break;
        const double share = left * task->tunable->budget_weight / (total_weight > 0.0 ? total_weight : 1.0);
        total_weight -= task->tunable->budget_weight;
        const iha_search_settings settings = {share > 0.0 ? share : 0.0, r.start + run->budget_s, run->exhaustive,
                                              run->reps, relay, &r};
        r.index = i;
        st = iha__search(ctx, task, &settings, &outcomes[i]);
    }
    return st;
}

iha_status iha__tune_tasks(iha_context *ctx, const iha_tune_run *run)
{
    /* A profile that cannot be written is found out before the budget is spent, not after. */
    if (!run->dry_run && ctx->tune->profile.state != IHA_PROFILE_OFF)
        IHA_FORWARD_IF_ERROR(iha__profile_check_writable(ctx, &ctx->tune->profile));
    iha_tune_outcome *outcomes = calloc(run->count ? run->count : 1, sizeof *outcomes);
    IHA_RETURN_ERROR_IF(outcomes == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    IHA_CL_CHECK(ctx, clFinish(ctx->queue), "clFinish");
    cl_int err = CL_SUCCESS;
    cl_command_queue timed = clCreateCommandQueue(ctx->cl_ctx, ctx->device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS) {
        free(outcomes);
        return iha__fail_cl(ctx, err, "clCreateCommandQueue (profiling, for tuning)");
    }
    cl_command_queue saved = ctx->queue;
    const iha_gemm_config saved_gemm = ctx->gemm->config; /* candidates set the context's GEMM backend */
    ctx->queue = timed;
    /* The candidates' programs stay out of the disk cache (program.h); the chosen ones are
     * compiled and cached by the first process that uses them. */
    ctx->programs.candidates = 1;
    iha_status st = run_tasks(ctx, run, outcomes);
    ctx->programs.candidates = 0;
    clFinish(timed);
    ctx->queue = saved;
    ctx->gemm->config = saved_gemm;
    clReleaseCommandQueue(timed);

    for (size_t i = 0; i < run->count && st == IHA_OK && run->results; ++i) {
        fill_result(ctx, &run->tasks[i], &outcomes[i], &run->results[i]);
        run->results[i].stored = outcomes[i].found && !run->dry_run;
    }
    const int stored_ok = st != IHA_OK || run->dry_run || store(ctx->tune, run, outcomes);
    /* The search leaves process-wide parameters (CLBlast's) at its last candidate, which may have
     * failed its check: set the profile's, or with a dry run the best verified ones. */
    for (size_t i = 0; i < run->count && st == IHA_OK; ++i) {
        const iha_tunable *t = run->tasks[i].tunable;
        if (t->apply == NULL) continue;
        if (!run->dry_run) {
            st = iha__tune_apply_gemm(ctx);
        } else if (outcomes[i].found) {
            st = t->apply(ctx, &outcomes[i].best);
            /* A dry run stores nothing, so the context goes back to its own configuration (and
             * iha_context_last_choices reports that one); CLBlast keeps the best verified
             * parameters when the context's backend is not CLBlast. */
            if (st == IHA_OK) st = iha__tune_apply_gemm(ctx);
        }
    }
    free(outcomes);
    IHA_FORWARD_IF_ERROR(st);
    IHA_RETURN_ERROR_IF(!stored_ok, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the tuning profile");
    /* With profiles off the results serve this context only. */
    if (!run->dry_run && ctx->tune->profile.state != IHA_PROFILE_OFF)
        IHA_FORWARD_IF_ERROR(iha__profile_save(ctx, &ctx->tune->profile));
    return IHA_OK;
}

/* ---- iha_tune ---- */

static iha_status check_call(iha_context *ctx, const iha_shape *s, const iha_attention_options *o)
{
    IHA_RETURN_ERROR_IF(s->batch == 0 || s->tokens == 0 || s->heads == 0 || s->head_dim == 0 || s->pseudo == 0 ||
                            s->model_dim == 0,
                        ctx, IHA_ERROR_INVALID_ARGUMENT, "every dimension of a shape to tune must be at least 1");
    IHA_RETURN_ERROR_IF(s->head_dim > 256, ctx, IHA_ERROR_INVALID_ARGUMENT, "head_dim %zu exceeds 256", s->head_dim);
    IHA_RETURN_ERROR_IF(s->tokens > (1u << 22) || s->pseudo > 256 || s->heads > 1024 || s->batch > 4096 ||
                            s->model_dim > (1u << 16),
                        ctx, IHA_ERROR_UNSUPPORTED, "a shape to tune is beyond the sizes tuning supports");
    IHA_RETURN_ERROR_IF(o->mask != IHA_MASK_CAUSAL && o->mask != IHA_MASK_TOKEN_CAUSAL && o->mask != IHA_MASK_NONE,
                        ctx, IHA_ERROR_INVALID_ARGUMENT, "unknown mask %d", o->mask);
    IHA_RETURN_ERROR_IF(o->window < 0, ctx, IHA_ERROR_INVALID_ARGUMENT, "window must not be negative");
    return IHA_OK;
}

#define MAX_TASKS 64

/* The distinct (kernel, bucket) tasks of the shapes into tasks[MAX_TASKS]; returns their number,
 * or MAX_TASKS + 1 when there are more. */
static size_t collect_tasks(iha_context *ctx, const iha_shape *shapes, const iha_attention_options *options,
                            size_t count, unsigned kernels, iha_tune_task *tasks)
{
    size_t n = 0;
    for (int k = 0; k < IHA_TUNABLE_COUNT; ++k) {
        const iha_tunable *t = iha__tunable_at(k);
        const unsigned bit = t == &iha__tunable_gemm        ? IHA_TUNE_GEMM
                             : t == &iha__tunable_attention ? IHA_TUNE_ATTENTION
                             : t == &iha__tunable_decode    ? IHA_TUNE_DECODE
                             : t == &iha__tunable_backward  ? IHA_TUNE_BACKWARD
                             : t == &iha__tunable_decode_compact ? IHA_TUNE_DECODE_COMPACT
                                                            : IHA_TUNE_ROWS;
        if (kernels != 0 && !(kernels & bit)) continue;
        for (size_t i = 0; i < count; ++i) {
            /* A decoding shape stands for a float and a half cache. */
            iha_tune_bucket buckets[2];
            const int m = t == &iha__tunable_decode ? iha__tune_decode_buckets(&shapes[i], &options[i], buckets, 2)
                          : t == &iha__tunable_decode_compact
                              ? iha__tune_decode_compact_buckets(&shapes[i], &options[i], buckets, 2)
                              : t->bucket_of(ctx, &shapes[i], &options[i], &buckets[0]);
            for (int v = 0; v < m; ++v) {
                const iha_tune_task task = {t, buckets[v], shapes[i], options[i]};
                int dup = 0;
                for (size_t j = 0; j < n; ++j)
                    dup |= tasks[j].tunable == t && iha__bucket_distance(t->space, &tasks[j].bucket, &task.bucket) == 0.0;
                if (dup) continue;
                if (n == MAX_TASKS) return MAX_TASKS + 1;
                tasks[n++] = task;
            }
        }
    }
    return n;
}

iha_status iha_tune(iha_context *ctx, const iha_shape *shapes, const iha_attention_options *options, size_t count,
                    const iha_tune_options *tune_options, iha_tune_result *results, size_t capacity,
                    size_t *result_count)
{
    if (ctx == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    iha__message_clear(&ctx->message);
    ctx->cl_error = 0;
    IHA_RETURN_ERROR_IF(shapes == NULL || options == NULL || count == 0, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "iha_tune needs at least one shape with its options");
    IHA_RETURN_ERROR_IF(results == NULL && capacity > 0, ctx, IHA_ERROR_INVALID_ARGUMENT, "results is NULL");
    iha_tune_options defaults;
    iha_tune_options_init(&defaults);
    const iha_tune_options *to = tune_options ? tune_options : &defaults;
    IHA_RETURN_ERROR_IF(!(to->budget_s >= 0.0) || to->reps < 0 || to->reps > 64, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "budget_s must be >= 0 and reps from 0 to 64");
    for (size_t i = 0; i < count; ++i) IHA_FORWARD_IF_ERROR(check_call(ctx, &shapes[i], &options[i]));
    /* Every configuration of the GEMM's space would take years: only its budgeted search runs. */
    IHA_RETURN_ERROR_IF(to->exhaustive && (to->kernels == 0 || (to->kernels & IHA_TUNE_GEMM)), ctx,
                        IHA_ERROR_INVALID_ARGUMENT,
                        "an exhaustive tune must leave out the GEMM (kernels without IHA_TUNE_GEMM; 0 means all)");

    iha_tune_task tasks[MAX_TASKS];
    iha_tune_result all[MAX_TASKS];
    const size_t n = collect_tasks(ctx, shapes, options, count, to->kernels, tasks);
    IHA_RETURN_ERROR_IF(n > MAX_TASKS, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "the shapes make more than %d (kernel, bucket) tasks: tune them in several calls", MAX_TASKS);
    if (result_count) *result_count = n;
    const iha_tune_run run = {tasks, n, to->budget_s > 0.0 ? to->budget_s : DEFAULT_BUDGET_S, to->exhaustive,
                              to->reps ? to->reps : DEFAULT_REPS, to->dry_run, to->progress, to->user, all};
    iha_status st = iha__tune_tasks(ctx, &run);
    for (size_t i = 0; st == IHA_OK && i < n && i < capacity; ++i) results[i] = all[i];
    return iha__call_end(ctx, st);
}
