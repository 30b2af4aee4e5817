/* Tuning spaces as data: a kernel's tunable parameters with their candidate values, the
 * constraints between them as small predicates over named values, and the local-memory and
 * work-group formulas that are checked against the device. Modelled on CLBlast's
 * src/tuning/kernels/xgemm.hpp. Nothing here names a kernel; the descriptions live in
 * space_<kernel>.c. */
#ifndef IHA_TUNE_SPACE_H
#define IHA_TUNE_SPACE_H
#include <stddef.h>

#include "iha.h"

#define IHA_TUNE_MAX_PARAMS 32
#define IHA_TUNE_MAX_VALUES 10
#define IHA_TUNE_MAX_KEYS 8
#define IHA_TUNE_CONFIG_TEXT 512

/* One parameter: its name as the kernel spells it (a -D define, a CLBlast parameter) and its
 * candidate values. A parameter with `same_as` set is tied to another one and always equals it
 * (CLBlast's MDIMA = MDIMC); a parameter with one value is fixed. */
typedef struct iha_tune_param {
    const char *name;
    int count;
    long values[IHA_TUNE_MAX_VALUES];
    const char *same_as;
} iha_tune_param;

/* A parameter added to a space after profiles were written: the profile format_version that
 * first stores it, and the value that an entry of an earlier version ran with, so that such an
 * entry is read as what it meant (tune/profile.c). */
typedef struct iha_tune_param_added {
    const char *name;
    int since;
    long before;
} iha_tune_param_added;

/* A bucket: the problem properties that matter for speed, as named integers (d, P, T, ...).
 * Keys marked `kind` must match for a profile entry to count as "the same kind"; the others
 * are compared on a log2 scale to find the nearest bucket. */
typedef struct iha_tune_key {
    const char *name;
    int kind;
} iha_tune_key;

typedef struct iha_tune_bucket {
    int count;
    long values[IHA_TUNE_MAX_KEYS]; /* in the order of the tunable's keys */
} iha_tune_bucket;

/* A constraint: holds(v) over the values of up to IHA_TUNE_CONSTRAINT_NAMES names, looked up first among the
 * parameters, then among the bucket's keys, then among the device properties "max_group",
 * "local_bytes" and "mma" (so a constraint may relate a tile to the head width d). */
#define IHA_TUNE_CONSTRAINT_NAMES 6
typedef struct iha_tune_constraint {
    int (*holds)(const long *v);
    const char *names[IHA_TUNE_CONSTRAINT_NAMES];
    const char *why;
} iha_tune_constraint;

typedef struct iha_tune_space {
    const char *kernel;                 /* the name in the profile: "attention", "xgemm", ... */
    const iha_tune_param *params;
    int param_count;
    const iha_tune_key *keys;
    int key_count;
    const iha_tune_constraint *constraints;
    int constraint_count;
    /* Local memory of a configuration in bytes, over the named values (NULL: none). */
    long (*local_bytes)(const long *v);
    const char *local_names[6];
    /* The work-group size is the product of these parameters (unused entries NULL). */
    const char *group_names[3];
    /* Parameters added after profiles of an earlier format_version were written (NULL: none). */
    const iha_tune_param_added *added;
    int added_count;
} iha_tune_space;

/* A configuration: one value per parameter, in the space's order. */
typedef struct iha_tune_config {
    long v[IHA_TUNE_MAX_PARAMS];
} iha_tune_config;

/* What the device allows. */
typedef struct iha_tune_limits {
    long max_group;   /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    long local_bytes; /* CL_DEVICE_LOCAL_MEM_SIZE */
    long mma;         /* 1 where the context offers the tensor-core attention (runtime/context.h) */
} iha_tune_limits;

/* Index of a parameter or key by name, or -1. */
int iha__space_param_index(const iha_tune_space *s, const char *name);
int iha__space_key_index(const iha_tune_space *s, const char *name);

/* Nonzero when every value is a candidate of its parameter, ties hold, every constraint holds
 * for this bucket, and local memory and work-group size fit the device. When it returns 0 and
 * why is not NULL, *why names the first failed rule (a static string). */
int iha__space_valid(const iha_tune_space *s, const iha_tune_config *c, const iha_tune_bucket *b,
                     const iha_tune_limits *lim, const char **why);

/* Sets every tied parameter to the value of the parameter it follows. */
void iha__space_tie(const iha_tune_space *s, iha_tune_config *c);

/* The number of free configurations (the product of the candidate counts of untied
 * parameters), before constraints. */
size_t iha__space_size(const iha_tune_space *s);

/* The i-th free configuration in mixed-radix order (0 <= i < iha__space_size), ties applied. */
void iha__space_at(const iha_tune_space *s, size_t i, iha_tune_config *c);

/* "NAME=value NAME=value ...", every parameter in order. Returns 0, or -1 when it does not fit. */
int iha__space_format(const iha_tune_space *s, const iha_tune_config *c, char *out, size_t cap);

/* Equal configurations. */
int iha__config_equal(const iha_tune_space *s, const iha_tune_config *a, const iha_tune_config *b);

/* "d=64 P=4 ..." for a bucket. */
void iha__bucket_format(const iha_tune_space *s, const iha_tune_bucket *b, char *out, size_t cap);

/* Distance between buckets: infinite (-1) when a kind key differs, otherwise the sum of
 * |log2 a - log2 b| over the other keys. */
double iha__bucket_distance(const iha_tune_space *s, const iha_tune_bucket *a, const iha_tune_bucket *b);

/* Small predicates for constraints, CLBlast's IsMultiple family; v[] as in the constraint. */
int iha__multiple_of_x(const long *v);          /* v0 % v1 == 0 */
int iha__multiple_of_x_mul_y(const long *v);    /* v0 % (v1*v2) == 0 */
int iha__multiple_of_x_mul_y_div_z(const long *v); /* v0 % (v1*v2/v3) == 0, v1*v2 % v3 == 0 */
int iha__at_most_x(const long *v);              /* v0 <= v1 */
int iha__product_at_most_z(const long *v);      /* v0*v1 <= v2 */

/* The smallest power of two >= x (x >= 1). */
long iha__pow2_ceil(long x);
#endif
