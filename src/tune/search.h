/* The generic search: within a time budget, from the built-in default and the tunable's seeds,
 * coordinate descent over the space's parameters (or, for benchmarks, every configuration).
 * Every candidate is built ahead of timing, verified on the small problem (a wrong one is
 * rejected, never timed, never returned), then timed with OpenCL marker events: the median of
 * several runs after a warm-up, rotating through input copies. Names no kernel. */
#ifndef IHA_TUNE_SEARCH_H
#define IHA_TUNE_SEARCH_H
#include "tune/tunable.h"

/* doc/spec.md's float32 contract: the largest relative L2 error a candidate may have. */
#define IHA_TUNE_TOLERANCE 1e-5

typedef struct iha_tune_task {
    const iha_tunable *tunable;
    iha_tune_bucket bucket;
    iha_shape shape;              /* the first layer call of the bucket */
    iha_attention_options options;
} iha_tune_task;

typedef struct iha_tune_outcome {
    double default_s;         /* the built-in behaviour, 0 when not measured */
    int found;                /* a verified, timed candidate exists */
    iha_tune_config best;
    double best_s, best_error;
    size_t candidates, rejected, timed;
    double worst_s, median_s; /* over the timed candidates */
    double seconds;           /* wall time of the search */
    int has_last, confirming; /* the candidate just evaluated, and whether in the final re-timing */
    iha_tune_config last;
    double last_s;            /* -1 when rejected */
} iha_tune_outcome;

/* Called after the default and after every candidate; done = 1 on the last call. */
typedef void (*iha_search_progress)(void *user, const iha_tune_task *task, const iha_tune_outcome *so_far, int done);

typedef struct iha_search_settings {
    double budget_s;  /* wall-clock budget of this task (ignored when exhaustive) */
    double deadline;  /* the whole call's end on the monotonic clock: a task's first candidate
                         may run past the task's budget, not past this */
    int exhaustive;
    int reps;         /* timed runs per candidate */
    iha_search_progress progress;
    void *user;
} iha_search_settings;

/* Runs the search for one task on the context's current queue, which must have profiling
 * enabled for event timing (wall-clock timing around clFinish is the fallback). */
iha_status iha__search(iha_context *ctx, const iha_tune_task *task, const iha_search_settings *settings,
                       iha_tune_outcome *out);
#endif
