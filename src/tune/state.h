/* What a context keeps for tuning: its profile, the opt-in for tuning on first use, the
 * configurations the last call chose, and the lookup from specific to general. */
#ifndef IHA_TUNE_STATE_H
#define IHA_TUNE_STATE_H
#include "gemm/sgemm.h"
#include "kernels/attention_backward.h"
#include "kernels/decode.h"
#include "kernels/decode_compact.h"
#include "kernels/mix.h"
#include "tune/profile.h"
#include "tune/search.h"

/* attention, mixing and collapse ("rows"), and decode (decoding steps) or backward (backward
 * calls); gemm from `gemm` */
#define IHA_TUNE_CHOICES 3

typedef struct iha_tune_state {
    iha_profile profile;
    int first_use;
    double first_use_budget_s;
    iha_kernel_choice choices[IHA_TUNE_CHOICES];
    size_t choice_count;
    iha_kernel_choice gemm;   /* the parameters CLBlast runs with, as this context set them */
    int gemm_applied;         /* the profile's GEMM entry (or the built-in) was applied */
    int clblast_applied;      /* its CLBlast parameters were given to CLBlast (measurements) */
    iha_tune_task *attempted; /* buckets tuned on first use in this context (tried once) */
    size_t attempted_count, attempted_capacity;
} iha_tune_state;

/* Called by iha_context_create: loads the profile (option NULL, "off" or a path). Fails only
 * when out of memory. The profile's GEMM parameters go to CLBlast at the first layer call, so
 * that a process that only tunes measures CLBlast's own parameters first. */
iha_status iha__tune_context_init(iha_context *ctx, const char *profile_option, int first_use, double budget_s);
void iha__tune_context_free(iha_context *ctx);

/* The configuration for (tunable, bucket) by the fallback order of include/iha.h. *entry is the
 * profile entry used (NULL for built-ins). */
void iha__tune_lookup(const iha_context *ctx, const iha_tunable *t, const iha_tune_bucket *bucket,
                      iha_tune_config *out, int *source, const iha_profile_entry **entry);

/* How a configuration and where it came from are reported (iha_kernel_choice). c NULL: CLBlast's
 * database; e: the profile entry it came from, if any. */
void iha__tune_describe(const iha_tunable *t, const iha_tune_bucket *b, const iha_tune_config *c, int source,
                        const iha_profile_entry *e, iha_kernel_choice *out);

/* The context's GEMM configuration: the profile's device entry, else the built-in of the device
 * type. Returns 0 when there is none (CLBlast's database). */
int iha__tune_gemm_config(const iha_context *ctx, iha_tune_config *c, const iha_profile_entry **entry);

/* Makes the profile's GEMM entry (or the device type's built-in) the context's backend, giving
 * CLBlast its parameters when CLBlast is the backend, and records the choice. */
iha_status iha__tune_apply_gemm(iha_context *ctx);

/* The GEMM space's parts (space_gemm.c): the library kernel's tile and backend of a
 * configuration, and CLBlast's parameters of one given to CLBlast whatever its backend. */
void iha__tune_gemm_own_config(const iha_tune_config *c, iha_gemm_config *g);
iha_status iha__tune_gemm_clblast_apply(iha_context *ctx, const iha_tune_config *c);

/* Tunes tasks[0..n) within budget_s, stores verified winners in the profile unless dry_run. */
typedef struct iha_tune_run {
    const iha_tune_task *tasks;
    size_t count;
    double budget_s;
    int exhaustive, reps, dry_run;
    void (*progress)(const iha_tune_progress *progress, void *user);
    void *user;
    iha_tune_result *results; /* count entries, may be NULL */
} iha_tune_run;
iha_status iha__tune_tasks(iha_context *ctx, const iha_tune_run *run);

/* Conversions between a space's configuration and the kernel modules' structs. */
void iha__tune_attention_config(const iha_tune_config *c, iha_attention_config *cfg);
void iha__tune_mix_collapse_config(const iha_tune_config *c, iha_mix_collapse_config *cfg);
void iha__tune_decode_config(const iha_tune_config *c, iha_decode_config *cfg);
void iha__tune_backward_config(const iha_tune_config *c, iha_backward_config *cfg);
void iha__tune_decode_compact_config(const iha_tune_config *c, iha_decode_compact_config *cfg);
/* The decode bucket of a step (dd's geometry, its mask and window in tokens, 0: global). */
void iha__tune_decode_bucket(const iha_decode_dims *dd, int mask, size_t window, iha_tune_bucket *b);
/* The decode buckets a layer call stands for (bucket_of's float cache, then a half cache):
 * writes up to capacity of them and returns how many. */
int iha__tune_decode_buckets(const iha_shape *shape, const iha_attention_options *options, iha_tune_bucket *out,
                             int capacity);
/* The same for a step on a compact cache (rope: its rotary setting), and a layer call's compact
 * buckets. */
void iha__tune_decode_compact_bucket(const iha_decode_compact *dc, int mask, size_t window, int rope,
                                     iha_tune_bucket *b);
int iha__tune_decode_compact_buckets(const iha_shape *shape, const iha_attention_options *options,
                                     iha_tune_bucket *out, int capacity);
#endif
