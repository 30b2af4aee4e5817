/* Budgeted coordinate descent (or exhaustive enumeration) over a tuning space, with
 * verification before timing and event-timed medians. See search.h. */
#include "tune/search.h"
#include "common/timing.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>




/* ---- Timing ---- */

/* Seconds between two marker events' completion, or -1 when the queue gives no profiling. */
static double event_seconds(cl_event before, cl_event after)
{
    cl_ulong t0 = 0, t1 = 0;
    if (clGetEventProfilingInfo(before, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL) != CL_SUCCESS ||
        clGetEventProfilingInfo(after, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL) != CL_SUCCESS || t1 < t0)
        return -1.0;
    return 1e-9 * (double)(t1 - t0);
}

/* One timed run on input copy `copy`. */
static iha_status time_once(iha_context *ctx, const iha_tunable *t, void *problem, const iha_tune_config *c, int copy,
                            double *seconds)
{
    cl_event before = NULL, after = NULL;
    IHA_CL_CHECK(ctx, clFinish(ctx->queue), "clFinish");
    const double wall0 = iha__now_seconds();
    IHA_CL_CHECK(ctx, clEnqueueMarkerWithWaitList(ctx->queue, 0, NULL, &before), "clEnqueueMarkerWithWaitList");
    iha_status st = t->enqueue(ctx, problem, c, copy);
    cl_int err = st == IHA_OK ? clEnqueueMarkerWithWaitList(ctx->queue, 0, NULL, &after) : CL_SUCCESS;
    if (st == IHA_OK && err == CL_SUCCESS) err = clWaitForEvents(1, &after);
    const double wall = iha__now_seconds() - wall0;
    if (st == IHA_OK && err != CL_SUCCESS) st = iha__fail_cl(ctx, err, "timing markers");
    if (st == IHA_OK) {
        *seconds = event_seconds(before, after);
        if (*seconds <= 0.0) *seconds = wall;
    }
    clReleaseEvent(before);
    if (after) clReleaseEvent(after);
    return st;
}

#define MAX_REPS 64

/* The median of up to `reps` runs, rotating input copies. A candidate that cannot win stops
 * early: its first run is three times slower than the best so far, or the faster of its first
 * two runs is 10% slower (more than the noise of a shared machine). */
static iha_status time_candidate(iha_context *ctx, const iha_tunable *t, void *problem, int copies,
                                 const iha_tune_config *c, int reps, double best, double *out)
{
    double samples[MAX_REPS];
    int n = 0;
    double fastest = INFINITY;
    while (n < reps && n < MAX_REPS) {
        IHA_FORWARD_IF_ERROR(time_once(ctx, t, problem, c, n % copies, &samples[n]));
        fastest = fmin(fastest, samples[n++]);
        /* Cannot win: one run 3x slower than the best, or two runs whose faster one is 10% slower. */
        if (best > 0.0 && ((n == 1 && fastest > 3.0 * best) || (n >= 2 && fastest > 1.1 * best))) break;
    }
    *out = iha__median(samples, (size_t)n);
    return IHA_OK;
}

/* ---- Candidates ---- */

typedef struct seen_list {
    iha_tune_config *items;
    double *times;  /* seconds, or -1 when rejected */
    double *errors; /* the check's relative error */
    size_t count, capacity;
} seen_list;


static int remember(seen_list *l, const iha_tune_config *c, double time, double error)
{
    if (l->count == l->capacity) {
        size_t cap = l->capacity ? 2 * l->capacity : 64;
        iha_tune_config *items = realloc(l->items, cap * sizeof *items);
        if (items == NULL) return 0;
        l->items = items;
        double *times = realloc(l->times, cap * sizeof *times);
        if (times == NULL) return 0;
        l->times = times;
        double *errors = realloc(l->errors, cap * sizeof *errors);
        if (errors == NULL) return 0;
        l->errors = errors;
        l->capacity = cap;
    }
    l->items[l->count] = *c;
    l->errors[l->count] = error;
    l->times[l->count++] = time;
    return 1;
}

/* The index of c in the list, or -1. */
static long find_seen(const iha_tune_space *s, const seen_list *l, const iha_tune_config *c)
{
    for (size_t i = 0; i < l->count; ++i)
        if (iha__config_equal(s, &l->items[i], c)) return (long)i;
    return -1;
}

typedef struct search_state {
    iha_context *ctx;
    const iha_tune_task *task;
    const iha_search_settings *settings;
    iha_tune_limits limits;
    void *timing, *verify;
    int copies;
    double start, cost_estimate;
    seen_list seen;
    iha_tune_outcome *out;
} search_state;

/* Whether the next candidate, at the estimated cost, would end past the budget. A task that has
 * not evaluated a candidate yet may use the rest of the call's budget for one: where a compile
 * costs more than a task's share (CLBlast on PoCL), the first seed is still worth it. */
static int over_budget(const search_state *s, size_t pending)
{
    if (s->settings->exhaustive) return 0;
    const double now = iha__now_seconds();
    if (s->out->candidates + pending == 0) return now + s->cost_estimate > s->settings->deadline;
    return now - s->start + s->cost_estimate > s->settings->budget_s;
}

/* Normalises a configuration; returns 0 when it is invalid or already evaluated. */
static int admit(search_state *s, iha_tune_config *c)
{
    const iha_tunable *t = s->task->tunable;
    iha__space_tie(t->space, c);
    if (t->canonical) t->canonical(s->timing, c);
    if (!iha__space_valid(t->space, c, &s->task->bucket, &s->limits, NULL)) return 0;
    return find_seen(t->space, &s->seen, c) < 0;
}

static void report(search_state *s, int done)
{
    s->out->seconds = iha__now_seconds() - s->start;
    if (s->settings->progress) s->settings->progress(s->settings->user, s->task, s->out, done);
}

/* Builds, verifies and times the admitted candidates cands[0..n), building all of them before
 * timing any. A build or verification failure rejects the candidate, not the search. */
static iha_status evaluate(search_state *s, iha_tune_config *cands, size_t n)
{
    const iha_tunable *t = s->task->tunable;
    iha_context *ctx = s->ctx;
    int *ok = calloc(n ? n : 1, sizeof *ok);
    double *built = calloc(n ? n : 1, sizeof *built); /* seconds each build took */
    if (ok == NULL || built == NULL) {
        free(ok), free(built);
        return iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    }
    size_t prepared = 0;
    for (; prepared < n && !over_budget(s, prepared); ++prepared) {
        const double t0 = iha__now_seconds();
        ok[prepared] = t->prepare(ctx, s->timing, &cands[prepared]) == IHA_OK;
        if (ok[prepared]) ok[prepared] = clFinish(ctx->queue) == CL_SUCCESS;
        built[prepared] = iha__now_seconds() - t0;
    }
    iha_status st = IHA_OK;
    for (size_t i = 0; i < prepared && st == IHA_OK; ++i) {
        const double t0 = iha__now_seconds();
        double error = INFINITY, secs = -1.0;
        /* A candidate that fails to time (say, out of resources at the real size) is rejected
         * like one that fails its check. */
        if (ok[i] && t->check(ctx, s->verify, &cands[i], &error) == IHA_OK &&
            error <= iha__tune_tolerance(t, &s->task->bucket, &cands[i]) &&
            time_candidate(ctx, t, s->timing, s->copies, &cands[i], s->settings->reps,
                           s->out->found ? s->out->best_s : 0.0, &secs) != IHA_OK)
            secs = -1.0;
        /* A candidate whose loops the driver cut short (runtime/loop_limit.h) is rejected too:
         * at the timing size its results would be refused. */
        int cut = 0;
        if (iha__loop_probe_take(ctx, &cut) != IHA_OK || cut) secs = -1.0;
        s->out->candidates++;
        if (secs < 0.0) {
            s->out->rejected++;
            iha__message_clear(&ctx->message); /* a rejected candidate is not the call's failure */
        } else if (!s->out->found || secs < s->out->best_s) {
            s->out->found = 1;
            s->out->best = cands[i];
            s->out->best_s = secs;
            s->out->best_error = error;
        }
        s->out->has_last = 1;
        s->out->last = cands[i];
        s->out->last_s = secs;
        if (!remember(&s->seen, &cands[i], secs, error)) st = iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
        /* What the next candidate will cost: build, check and timing, smoothed. */
        s->cost_estimate = 0.5 * s->cost_estimate + 0.5 * (built[i] + iha__now_seconds() - t0);
        report(s, 0);
    }
    free(ok);
    free(built);
    return st;
}

/* The built-in default, the seeds and (when none of them is valid) the safe configuration. */
static iha_status start_points(search_state *s)
{
    const iha_tunable *t = s->task->tunable;
    iha_tune_config cands[8];
    size_t n = 0;
    if (t->builtin(s->ctx, &s->task->bucket, &cands[n]) && admit(s, &cands[n])) ++n;
    if (t->seeds) {
        iha_tune_config extra[6];
        int k = t->seeds(s->ctx, &s->task->bucket, extra, 6);
        for (int i = 0; i < k; ++i) {
            cands[n] = extra[i];
            int dup = 0;
            for (size_t j = 0; j < n; ++j) dup |= iha__config_equal(t->space, &cands[j], &extra[i]);
            if (admit(s, &cands[n]) && !dup) ++n;
        }
    }
    if (n == 0) {
        t->safe(&s->task->bucket, &cands[0]);
        if (admit(s, &cands[0])) n = 1;
    }
    return evaluate(s, cands, n);
}

/* Sweeps each free parameter in turn around the best configuration until a full round finds
 * nothing better or the budget is spent. */
static iha_status descend(search_state *s)
{
    const iha_tune_space *sp = s->task->tunable->space;
    iha_tune_config cands[IHA_TUNE_MAX_VALUES];
    int improved = s->out->found;
    while (improved && !over_budget(s, 0)) {
        improved = 0;
        for (int p = 0; p < sp->param_count && !over_budget(s, 0); ++p) {
            if (sp->params[p].same_as != NULL || sp->params[p].count < 2) continue;
            const double before = s->out->best_s;
            size_t n = 0;
            for (int k = 0; k < sp->params[p].count; ++k) {
                cands[n] = s->out->best;
                cands[n].v[p] = sp->params[p].values[k];
                int dup = 0;
                for (size_t j = 0; j < n; ++j) dup |= iha__config_equal(sp, &cands[j], &cands[n]);
                if (admit(s, &cands[n]) && !dup) ++n;
            }
            IHA_FORWARD_IF_ERROR(evaluate(s, cands, n));
            improved |= s->out->best_s < before;
        }
    }
    return IHA_OK;
}

static iha_status exhaust(search_state *s)
{
    const iha_tune_space *sp = s->task->tunable->space;
    const size_t total = iha__space_size(sp);
    for (size_t i = 0; i < total; ++i) {
        iha_tune_config c;
        iha__space_at(sp, i, &c);
        if (admit(s, &c)) IHA_FORWARD_IF_ERROR(evaluate(s, &c, 1));
    }
    return IHA_OK;
}

static void spread(search_state *s)
{
    double *times = malloc((s->seen.count ? s->seen.count : 1) * sizeof *times);
    size_t n = 0;
    for (size_t i = 0; times && i < s->seen.count; ++i)
        if (s->seen.times[i] >= 0.0) times[n++] = s->seen.times[i];
    s->out->timed = n;
    if (n > 0) {
        s->out->median_s = iha__median(times, n);
        s->out->worst_s = times[n - 1];
    }
    free(times);
}

/* The default was timed first and the winner minutes later, on a machine whose load drifts:
 * time them again in alternation for an honest before/after. When the winner is not faster
 * after all, the built-in (verified like any candidate) wins. Where the built-in is not a
 * configuration (CLBlast's database on a GPU, which no call restores once candidates have
 * overridden it) the first timing of the default decides: a slower winner is not stored, so
 * the built-in stays (a descent from a poor seed can end well behind CLBlast's database). */
static iha_status confirm(search_state *s)
{
    const iha_tunable *t = s->task->tunable;
    iha_tune_config builtin;
    if (!s->out->found) return IHA_OK;
    if (!t->builtin(s->ctx, &s->task->bucket, &builtin)) {
        if (s->out->default_s > 0.0 && s->out->best_s >= s->out->default_s) s->out->found = 0;
        return IHA_OK;
    }
    iha__space_tie(t->space, &builtin);
    if (t->canonical) t->canonical(s->timing, &builtin);
    const long b = find_seen(t->space, &s->seen, &builtin);
    if (b < 0 || s->seen.times[b] < 0.0) return IHA_OK; /* the built-in failed its check: never store it */
    double def[MAX_REPS], best[MAX_REPS];
    const int reps = s->settings->reps < MAX_REPS ? s->settings->reps : MAX_REPS;
    for (int r = 0; r < reps; ++r) {
        IHA_FORWARD_IF_ERROR(time_once(s->ctx, t, s->timing, &builtin, r % s->copies, &def[r]));
        IHA_FORWARD_IF_ERROR(time_once(s->ctx, t, s->timing, &s->out->best, r % s->copies, &best[r]));
    }
    s->out->default_s = iha__median(def, (size_t)reps);
    s->out->best_s = iha__median(best, (size_t)reps);
    if (s->out->best_s >= s->out->default_s) {
        s->out->best = builtin;
        s->out->best_s = s->out->default_s;
        s->out->best_error = s->seen.errors[b];
    }
    return IHA_OK;
}

#define CONFIRM_TOP 5

/* Exhaustive mode ends like the budgeted one: its fastest few and the built-in are timed again
 * in alternation, minutes after the first pass, so that a quiet moment does not crown a
 * configuration. Each re-timed configuration is reported. */
static iha_status confirm_top(search_state *s)
{
    const iha_tunable *t = s->task->tunable;
    iha_tune_config top[CONFIRM_TOP + 1];
    double taken[CONFIRM_TOP + 1];
    int n = 0;
    for (int k = 0; k < CONFIRM_TOP; ++k) {
        long pick = -1;
        for (size_t i = 0; i < s->seen.count; ++i) {
            int used = 0;
            for (int j = 0; j < n; ++j) used |= iha__config_equal(t->space, &top[j], &s->seen.items[i]);
            if (!used && s->seen.times[i] >= 0.0 && (pick < 0 || s->seen.times[i] < s->seen.times[pick])) pick = (long)i;
        }
        if (pick < 0) break;
        top[n++] = s->seen.items[pick];
    }
    iha_tune_config builtin;
    if (n > 0 && t->builtin(s->ctx, &s->task->bucket, &builtin)) {
        iha__space_tie(t->space, &builtin);
        if (t->canonical) t->canonical(s->timing, &builtin);
        const long b = find_seen(t->space, &s->seen, &builtin);
        int listed = 0;
        for (int j = 0; j < n; ++j) listed |= iha__config_equal(t->space, &top[j], &builtin);
        if (b >= 0 && s->seen.times[b] >= 0.0 && !listed) top[n++] = builtin;
    }
    const int reps = s->settings->reps < MAX_REPS ? s->settings->reps : MAX_REPS;
    double samples[CONFIRM_TOP + 1][MAX_REPS];
    for (int r = 0; r < reps; ++r)
        for (int j = 0; j < n; ++j) IHA_FORWARD_IF_ERROR(time_once(s->ctx, t, s->timing, &top[j], r % s->copies, &samples[j][r]));
    s->out->confirming = 1;
    for (int j = 0; j < n; ++j) {
        taken[j] = iha__median(samples[j], (size_t)reps);
        if (j == 0 || taken[j] < s->out->best_s) {
            s->out->best = top[j];
            s->out->best_s = taken[j];
            s->out->best_error = s->seen.errors[find_seen(t->space, &s->seen, &top[j])];
        }
        s->out->has_last = 1;
        s->out->last = top[j];
        s->out->last_s = taken[j];
        report(s, 0);
    }
    return IHA_OK;
}

static iha_status run_search(search_state *s)
{
    const iha_tunable *t = s->task->tunable;
    iha_context *ctx = s->ctx;
    const double t0 = iha__now_seconds();
    IHA_FORWARD_IF_ERROR(t->prepare(ctx, s->timing, NULL));
    IHA_FORWARD_IF_ERROR(time_candidate(ctx, t, s->timing, s->copies, NULL, s->settings->reps, 0.0, &s->out->default_s));
    s->cost_estimate = iha__now_seconds() - t0;
    report(s, 0);
    IHA_FORWARD_IF_ERROR(start_points(s));
    IHA_FORWARD_IF_ERROR(s->settings->exhaustive ? exhaust(s) : descend(s));
    return s->settings->exhaustive ? confirm_top(s) : confirm(s);
}

iha_status iha__search(iha_context *ctx, const iha_tune_task *task, const iha_search_settings *settings,
                       iha_tune_outcome *out)
{
    const iha_tunable *t = task->tunable;
    memset(out, 0, sizeof *out);
    search_state s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx;
    s.task = task;
    s.settings = settings;
    s.out = out;
    s.start = iha__now_seconds();
    iha__tune_limits(ctx, &s.limits);
    /* Enough input copies that one rotation does not fit in a 64 MiB cache. */
    const size_t bytes = t->problem_bytes(&task->shape, &task->bucket);
    s.copies = bytes >= (64u << 20) ? 2 : (int)((64u << 20) / (bytes ? bytes : 1)) + 1;
    s.copies = s.copies > 4 ? 4 : s.copies;
    iha_status st = t->problem_create(ctx, &task->shape, &task->options, &task->bucket, IHA_TUNE_PROBLEM_TIMING,
                                      s.copies, &s.timing);
    if (st == IHA_OK)
        st = t->problem_create(ctx, &task->shape, &task->options, &task->bucket, IHA_TUNE_PROBLEM_VERIFY, 1, &s.verify);
    if (st == IHA_OK) st = run_search(&s);
    if (st == IHA_OK) spread(&s);
    clFinish(ctx->queue);
    t->problem_free(s.timing);
    t->problem_free(s.verify);
    free(s.seen.items);
    free(s.seen.times);
    free(s.seen.errors);
    out->seconds = iha__now_seconds() - s.start;
    if (st == IHA_OK) report(&s, 1);
    return st;
}
