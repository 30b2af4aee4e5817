/* What the generic search needs from a tunable kernel: its space (data), how a layer call maps
 * to its bucket, its built-in defaults, and how to run it on a timing problem and check it on a
 * small verification problem. One iha_tunable per file space_<kernel>.c; the search, timing,
 * validation, profile and lookup code only ever sees this interface. */
#ifndef IHA_TUNE_TUNABLE_H
#define IHA_TUNE_TUNABLE_H
#include "runtime/context.h"
#include "tune/space.h"

typedef enum iha_tune_purpose {
    IHA_TUNE_PROBLEM_TIMING, /* the bucket's real size, in several copies to rotate through */
    IHA_TUNE_PROBLEM_VERIFY  /* a small problem with ragged edges and a float64 reference */
} iha_tune_purpose;

typedef struct iha_tunable {
    const iha_tune_space *space;
    /* Share of a tuning budget, relative to the other tunables. */
    double budget_weight;
    /* The bucket of a layer call; returns 0 when the call does not use this kernel. */
    int (*bucket_of)(const iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                     iha_tune_bucket *bucket);
    /* Level 4 of the lookup: the kernel module's built-in default for this device type.
     * Returns 0 when the built-in is not expressible as a configuration (CLBlast's database):
     * then nothing is overridden. */
    int (*builtin)(const iha_context *ctx, const iha_tune_bucket *bucket, iha_tune_config *config);
    /* Level 5: a configuration that is valid on every device and bucket. */
    void (*safe)(const iha_tune_bucket *bucket, iha_tune_config *config);
    /* Further starting points of the search (NULL when none), for GPU or CPU devices. */
    int (*seeds)(const iha_context *ctx, const iha_tune_bucket *bucket, iha_tune_config *out, int capacity);

    /* A problem for `purpose` from the first layer call of the bucket; *out is owned by the
     * caller and released with problem_free. `copies` input sets are made for timing. */
    iha_status (*problem_create)(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                 const iha_tune_bucket *bucket, iha_tune_purpose purpose, int copies, void **out);
    void (*problem_free)(void *problem);
    /* Bytes of one input set of a timing problem (to choose how many copies rotate). */
    size_t (*problem_bytes)(const iha_shape *shape, const iha_tune_bucket *bucket);
    /* Rewrites a configuration to the representative of all configurations that behave the same
     * on this problem (parameters the problem never uses), so that equal ones are timed once.
     * NULL: every configuration is distinct. */
    void (*canonical)(const void *problem, iha_tune_config *config);
    /* Builds (and, where the platform compiles at first launch, launches once) ahead of timing.
     * NULL config: the built-in behaviour. */
    iha_status (*prepare)(iha_context *ctx, void *problem, const iha_tune_config *config);
    /* Enqueues one run on input set `copy` (NULL config: the built-in behaviour). */
    iha_status (*enqueue)(iha_context *ctx, void *problem, const iha_tune_config *config, int copy);
    /* Poisons the outputs, runs, waits and compares with the float64 reference: *error is the
     * relative L2 error, +inf when any output is NaN or infinite. */
    iha_status (*check)(iha_context *ctx, void *problem, const iha_tune_config *config, double *error);
    /* Makes `config` the one the library uses from now on where that is process state (CLBlast's
     * parameters); NULL does nothing. NULL for kernels configured per call. */
    iha_status (*apply)(iha_context *ctx, const iha_tune_config *config);
    /* The largest relative L2 error a configuration may show on this bucket's verification
     * problem; NULL: IHA_TUNE_TOLERANCE, doc/spec.md's float32 bound. */
    double (*tolerance)(const iha_tune_bucket *bucket, const iha_tune_config *config);
} iha_tunable;

/* Every tunable, in tuning order. */
extern const iha_tunable iha__tunable_mix_collapse, iha__tunable_attention, iha__tunable_gemm, iha__tunable_decode,
    iha__tunable_backward, iha__tunable_decode_compact;
#define IHA_TUNABLE_COUNT 6
const iha_tunable *iha__tunable_at(int index);
const iha_tunable *iha__tunable_find(const char *kernel);

/* What t allows on bucket b: its tolerance, else IHA_TUNE_TOLERANCE (tune/search.h). */
double iha__tune_tolerance(const iha_tunable *t, const iha_tune_bucket *b, const iha_tune_config *c);

/* The device's limits for iha__space_valid. */
void iha__tune_limits(const iha_context *ctx, iha_tune_limits *limits);
#endif
