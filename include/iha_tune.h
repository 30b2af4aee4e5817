/*
 * iha_tune.h - tuning, profiles and the self-check.
 *
 * How the library chooses each kernel's configuration for a device, how iha_tune measures
 * better ones into the device's profile, and how iha_check verifies the kernels the way the
 * tuner does. It includes iha.h; nothing includes it implicitly. A program that only computes
 * needs none of it: the built-in configurations and the profile are used without it.
 */
#ifndef IHA_TUNE_H
#define IHA_TUNE_H

#include "iha.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Tuning ----------------------------------------------------------------------------- */

/* Tile sizes and vector widths move a kernel's speed severalfold from one device to the next.
 * iha_tune (or `iha tune`) measures candidate configurations of each kernel on this device and
 * keeps the fastest in a profile: one JSON file per device, beside the program cache
 * (<cache dir>/profile-<16 hex digits>.json), keyed on the device identity (vendor id, vendor,
 * name, driver and OpenCL versions, compute units, local memory size and type), the library
 * version and a hash of the kernel sources. iha_context_create loads it. A profile whose key
 * differs, or that is corrupt, truncated or edited into something invalid, is ignored and
 * reported (iha_context_profile), never used and never fatal.
 *
 * A layer call chooses each kernel's configuration by the first of these that applies to the
 * call's bucket (the properties that matter for speed: head width d, P, mask, window or global,
 * element type, sequence length T rounded up to a power of two):
 *   1. the profile's entry for this exact bucket;
 *   2. the profile's nearest bucket of the same kind (same mask, window-ness, element type);
 *   3. the profile's device-wide default for the kernel;
 *   4. the library's built-in default for the device type (CPU or GPU);
 *   5. a safe built-in default that any device runs.
 * iha_context_last_choices says which configuration a call used and where it came from.
 *
 * The layer's matrix products (projections, and the unfused baseline's S V) have two backends:
 * the library's own SGEMM kernel (cl/gemm.cl: its tile GEMM_MR x GEMM_VW, k unrolling GEMM_KU
 * and GEMM_GROUP row tiles per work-group), and CLBlast (its Xgemm and XgemmDirect parameters
 * and the direct/indirect switch point XGEMM_MIN_INDIRECT_SIZE). The "gemm" configuration is
 * one device-wide entry that names the backend ("backend=1": the library's kernel, "backend=0":
 * CLBlast) and both backends' parameters; tuning times the two on the same problem and keeps the
 * faster. Without a GEMM entry a CPU device uses the library's kernel (it loads from the program
 * cache where CLBlast builds its GEMM program from source in every process, and CLBlast's
 * database has no entry for CPU OpenCL drivers such as PoCL), and a GPU CLBlast with its own
 * database. A context on the library's kernel never calls into CLBlast for a layer call or a
 * decoding step. CLBlast holds its parameters process-wide per device: a context whose backend
 * is CLBlast applies its profile's CLBlast parameters at its first layer call, for every context
 * and every CLBlast user on that device in the process, until the process ends or they are set
 * again. */

typedef enum iha_config_source {
    IHA_CONFIG_PROFILE_EXACT = 1,   /* 1. the profile's entry for the call's bucket */
    IHA_CONFIG_PROFILE_NEAREST = 2, /* 2. the profile's nearest bucket of the same kind */
    IHA_CONFIG_PROFILE_DEVICE = 3,  /* 3. the profile's device-wide default for the kernel */
    IHA_CONFIG_BUILTIN_TYPE = 4,    /* 4. built-in default for CPUs or GPUs (GEMM on a GPU: CLBlast's) */
    IHA_CONFIG_BUILTIN_SAFE = 5     /* 5. safe built-in default */
} iha_config_source;

/* One kernel configuration a call used. Fixed layout, no pointers. */
typedef struct iha_kernel_choice {
    char kernel[16];         /* "attention", "rows" (mixing and collapse share it), "decode", "backward", "gemm" */
    char bucket[160];        /* the call's bucket, e.g. "mask=0 windowed=0 elem_bytes=4 d=64 P=4 T=4096 span=4096" */
    char config[512];        /* e.g. "ATT_ROWS=4 ATT_TILES=4 ATT_KB=16 ATT_VD=16 group=1 variant=0 LOC_KEYS=32 ATT_PREFETCH=1";
                                "CLBlast database" for CLBlast's own parameters */
    int source;              /* an iha_config_source */
    char source_bucket[160]; /* the profile entry's bucket for sources 1 and 2, "" otherwise */
} iha_kernel_choice;

/* The configurations of the last layer call on ctx whose arguments passed their checks
 * (iha_forward, iha_attention_core, iha_attention, iha_decode_step, which adds a "decode"
 * entry, iha_backward and iha_attention_core_backward, which add a "backward" entry, and
 * iha_attention_backward, which reports "backward" and "gemm" alone; a refused call changes
 * nothing): up to `capacity` entries into out (NULL when capacity is 0), the number
 * available in *count. The GEMM entry reports the context's GEMM configuration (its backend,
 * and the parameters applied to CLBlast when that is the backend). */
IHA_API iha_status iha_context_last_choices(const iha_context *ctx, iha_kernel_choice *out, size_t capacity, size_t *count);

typedef enum iha_profile_state {
    IHA_PROFILE_NONE = 0,    /* no profile file yet */
    IHA_PROFILE_LOADED = 1,  /* loaded and in use */
    IHA_PROFILE_IGNORED = 2, /* a file exists but is not used, or its path cannot be; message says why */
    IHA_PROFILE_OFF = 3      /* profiles disabled ("off", or no cache directory and no path) */
} iha_profile_state;

typedef struct iha_profile_info {
    int state;          /* an iha_profile_state */
    char path[4096];    /* the profile's path ("" when off) */
    char message[512];  /* why it was ignored; when loaded, a note on entries kept but not used */
    size_t entries;     /* configurations in use */
} iha_profile_info;

/* Describes the context's profile. Returns IHA_OK when it is loaded, absent or off, and
 * IHA_ERROR_PROFILE when a file exists but was ignored (also setting iha_context_message). */
IHA_API iha_status iha_context_profile(iha_context *ctx, iha_profile_info *info);

/* Deletes the context's profile file (a missing file is fine) and stops using its entries:
 * calls fall back to built-in defaults. CLBlast keeps the GEMM parameters it has until the
 * process ends (it has no way back to its database). Only a regular file that is an iha
 * tuning profile (or empty) is deleted: IHA_ERROR_IO, with the file left as it is, for a
 * link, a device, a FIFO or a file of other content in its place, or when it cannot delete. */
IHA_API iha_status iha_profile_clear(iha_context *ctx);

/* Kernels for iha_tune_options.kernels. */
#define IHA_TUNE_ROWS 1u      /* mixing and collapse */
#define IHA_TUNE_ATTENTION 2u
#define IHA_TUNE_GEMM 4u      /* the SGEMM backend and its parameters for the layer's projection shapes */
/* The decode kernels of iha_decode_step (tile, vector width, work-group, key-split policy), for
 * one new token per sequence against a cache of each shape's N tokens, float and half caches.
 * A decoding step chooses them by the fallback order above, on its bucket (d, P, mask, window
 * or global, cache element type, new tokens k, cached keys seen, B*H; the last three rounded up
 * to powers of two), and iha_context_last_choices then reports a "decode" entry. */
#define IHA_TUNE_DECODE 8u
/* The attention backward of iha_attention_backward, iha_backward and iha_attention_core_backward
 * (on CPUs the register tiles per work-item, on GPUs each pass's local tiles or its row kernel),
 * on the forward's buckets; a backward call then reports a "backward" entry in
 * iha_context_last_choices. */
#define IHA_TUNE_BACKWARD 16u
/* The decode kernels of iha_decode_step on a compact cache (iha_kv_cache_options.compact:
 * query rows and target heads per work-item, vector width, token-split policy, rows across
 * vector lanes), for one new token per sequence against a cache of each shape's N tokens, float
 * and half caches, with the shape's rotary setting. A step chooses them on its bucket (mask,
 * rotary, cache element type, d, P, H, new tokens k, cached tokens read; the last two rounded up
 * to powers of two), and iha_context_last_choices then reports a "decode_compact" entry. */
#define IHA_TUNE_DECODE_COMPACT 32u

/* Passed to the progress callback after the built-in default and after each candidate. */
typedef struct iha_tune_progress {
    const char *kernel, *bucket; /* the task being tuned (valid during the call) */
    size_t task, tasks;          /* 0-based index of the task, and the number of tasks */
    size_t candidates, rejected; /* evaluated so far in this task; rejected by build or check */
    double space;                /* configurations in the space before constraints */
    double default_s, best_s;    /* seconds per run: built-in and best so far (0: none yet) */
    const char *best_config;     /* "" until a candidate passed */
    double elapsed_s, budget_s;  /* the whole call's */
    int task_done;               /* 1 on a task's last report */
    const char *candidate_config; /* the candidate just evaluated ("" for the built-in's report) */
    double candidate_s;          /* its median seconds; -1 when rejected */
    int confirming;              /* 1 while the finalists are timed again in alternation */
} iha_tune_progress;

typedef struct iha_tune_options {
    double budget_s;     /* wall-clock budget of the whole call; 0 means 40 s; negative or NaN
                            is IHA_ERROR_INVALID_ARGUMENT */
    unsigned kernels;    /* IHA_TUNE_* bits; 0 means all */
    int exhaustive;      /* nonzero: every valid configuration, ignoring the budget (for
                            benchmarks: it takes minutes to hours). kernels must then leave
                            out IHA_TUNE_GEMM (0 includes it), whose space holds hundreds of
                            millions: IHA_ERROR_INVALID_ARGUMENT otherwise */
    int reps;            /* timed runs per candidate (median); 0 means 5, at most 64 */
    int dry_run;         /* nonzero: measure and report, but do not store or apply */
    void (*progress)(const iha_tune_progress *progress, void *user); /* may be NULL */
    void *user;
} iha_tune_options;

/* Sets the defaults (all zero). */
IHA_API void iha_tune_options_init(iha_tune_options *options);

/* One tuned kernel and bucket. Times are medians of one run of the timing problem: the
 * bucket's sizes with the batch of (b, h) rows cut to what fills the device (attention), or
 * the layer's own sizes (mixing and collapse, the layer's four GEMMs). */
typedef struct iha_tune_result {
    char kernel[16];
    char bucket[160];
    char default_config[512]; /* the built-in ("CLBlast database" for gemm on a GPU) */
    char tuned_config[512];   /* "" when no candidate passed verification */
    double default_s, tuned_s;
    double error;             /* the tuned configuration's relative L2 error on the check */
    size_t candidates, rejected;
    double space;             /* configurations in the space before constraints */
    double worst_s, median_s; /* over every timed candidate: the space's spread when exhaustive */
    double seconds;           /* wall time spent on this task */
    int stored;               /* written to the profile */
} iha_tune_result;

/* Tunes the kernels that the layer calls shapes[0..count) with options[0..count) use, within
 * tune_options->budget_s (NULL options: defaults), shared among the distinct (kernel, bucket)
 * tasks. Every candidate is verified against a float64 reference on a small problem before it
 * is timed; a wrong candidate is rejected and never stored. Unless dry_run, the best verified
 * configuration of each task is merged into the profile file and used by this context from
 * the next call on: under a lock (<profile>.lock), the file is read again and only the entries
 * this call tuned replace theirs, so other writers' entries, entries this library does not
 * know and a clear made meanwhile all stay as they are; then it is written atomically.
 * CLBlast is left with the stored GEMM parameters (with dry_run: the best verified ones); its
 * "before" is the parameters it had when the call began.
 * The GEMM shapes are those of the first call: X W_Q/K/V and Y W_O.
 * Writes up to `capacity` results (one per task) and the number of tasks in *result_count
 * (results may be NULL when capacity is 0). Blocks; uses the context's queue. Returns
 * IHA_ERROR_INVALID_ARGUMENT for NULL shapes/options or count 0, an invalid option (above), a
 * shape with a zero dimension or head_dim above 256, an unknown mask or negative window, or
 * shapes that make more than 64 distinct (kernel, bucket) tasks (tune them in several calls);
 * IHA_ERROR_UNSUPPORTED for a shape beyond what tuning supports (tokens above 2^22, pseudo
 * above 256, heads above 1024, batch above 4096, model_dim above 65536); IHA_ERROR_IO when the
 * profile cannot be written, checked before tuning starts where it can be (no usable path, a
 * directory that cannot be made or written, a file in the profile's place that is not a
 * regular file holding an iha tuning profile, which is never overwritten), with the cause in
 * the message; and the failure of
 * any call that is not a candidate's own. */
IHA_API iha_status iha_tune(iha_context *ctx, const iha_shape *shapes, const iha_attention_options *options, size_t count,
                            const iha_tune_options *tune_options, iha_tune_result *results, size_t capacity,
                            size_t *result_count);

/* ---- Self-check ------------------------------------------------------------------------- */

/* A device nobody has tried may compile a kernel into something wrong without any error.
 * iha_check (or `iha check`) runs, on the context's device, every kernel family and variant its
 * layer calls would use, on small ragged problems, against float64: attention in the
 * configuration the lookup above gives two representative buckets (d of 13 and 128)
 * and in every configuration of the profile's attention entries, each under the three masks,
 * global and with a window; the mixing and collapse kernels ("rows") likewise; the decode
 * kernels (float and half caches, one new token and a chunk, every mask, global and windowed);
 * the GEMM (the library's kernel with the context's tile, and CLBlast when it is the context's
 * backend); the attention backward (iha_attention_backward after iha_attention) and the layer
 * (iha_forward and iha_backward, rotary on) on every mask, global and windowed; and half
 * storage (the attention backward and the layer with half activations and weights). The
 * checks are the tuner's (iha_tune verifies every candidate the same way) and a float64
 * reference of doc/spec.md kept in the library. Most of its time goes into building programs,
 * so it is quicker where the disk cache holds them. */

typedef enum iha_check_state {
    IHA_CHECK_OK = 0,         /* within the limit */
    IHA_CHECK_FAILED = 1,     /* beyond the limit, not finite, or a call failed (note says which) */
    IHA_CHECK_UNSUPPORTED = 2 /* the library refused it on this device (IHA_ERROR_UNSUPPORTED: say,
                                 a driver that cuts kernel loops short); not a pass */
} iha_check_state;

/* Which families iha_check_options.families selects. */
#define IHA_CHECK_ATTENTION 1u
#define IHA_CHECK_ROWS 2u
#define IHA_CHECK_DECODE 4u
#define IHA_CHECK_DECODE_COMPACT 128u /* decoding on a compact cache (iha_kv_cache_options.compact) */
#define IHA_CHECK_GEMM 8u
#define IHA_CHECK_BACKWARD 16u /* the attention backward and the layer, forward and backward */
#define IHA_CHECK_HALF 32u /* the attention backward and the layer with half storage */
#define IHA_CHECK_BF16 64u /* the same with bfloat16 storage */

/* One kernel family in one configuration, over all of its cases. Fixed layout, no pointers. */
typedef struct iha_check_row {
    char family[24];  /* "attention", "rows", "decode", "gemm", "attention_backward", "layer", "half" */
    char config[512]; /* as in iha_kernel_choice.config; for the backward families the path
                         ("tiles": the register-tile pass, "rows": the row kernels) */
    int source;       /* an iha_config_source: where a layer call gets this configuration */
    char shape[160];  /* the problem's sizes and the masks and windows it ran */
    double error;     /* the largest relative L2 error against float64 over the cases that ran
                         and their outputs; +inf when an output is not finite or a call failed */
    double limit;     /* doc/spec.md's bound: 1e-5 for float storage, 2e-3 for half, 1e-2 for bf16 */
    int state;        /* an iha_check_state */
    char note[256];   /* the worst case, or the status and message of a failed or refused call */
} iha_check_row;

typedef struct iha_check_options {
    unsigned families; /* IHA_CHECK_* bits; 0 means all */
    /* Called with each row as it completes (the row is valid during the call); may be NULL. */
    void (*row)(const iha_check_row *row, void *user);
    void *user;
} iha_check_options;

typedef struct iha_check_summary {
    size_t rows;        /* rows produced, also those beyond `capacity` */
    size_t failed;      /* rows in IHA_CHECK_FAILED */
    size_t unsupported; /* rows in IHA_CHECK_UNSUPPORTED */
    double seconds;     /* wall time of the call */
} iha_check_summary;

/* Sets the defaults (all families, no callback). */
IHA_API void iha_check_options_init(iha_check_options *options);

/* Runs the self-check described above on ctx's device (options NULL: defaults). Writes up to
 * `capacity` rows into `rows` (NULL when capacity is 0) in the order they ran, and the totals
 * into *summary. Returns IHA_OK when the check ran to its end, whatever the rows found: a kernel
 * that fails its check, does not build, or whose call fails makes its row IHA_CHECK_FAILED and
 * counts in summary->failed, and the check goes on with the next row. Returns
 * IHA_ERROR_INVALID_ARGUMENT for a NULL ctx or summary, rows NULL with capacity above 0, or a
 * families bit not defined above; IHA_ERROR_HOST_MEMORY; IHA_ERROR_OPENCL when the context's
 * queue fails outside any row. Blocks and uses the context's queue. It sets up the context's
 * GEMM backend as a first layer call would, and otherwise leaves the context as it found it:
 * its GEMM backend, iha_context_last_choices, and no tuning on first use during the check. The
 * program cache keeps what it built, as for any layer call. */
IHA_API iha_status iha_check(iha_context *ctx, const iha_check_options *options, iha_check_row *rows, size_t capacity,
                             iha_check_summary *summary);

#ifdef __cplusplus
}
#endif
#endif /* IHA_TUNE_H */
