/* The families iha_check runs through the tuner's own verification (tunable.h: problem_create
 * with IHA_TUNE_PROBLEM_VERIFY, then check against float64), so that `iha check` and `iha tune`
 * judge a configuration the same way. A family's configurations are the ones the lookup gives
 * a few representative buckets, and every configuration of the profile's entries for it; each
 * runs on the cases (masks, windows, cache types) its kernels take. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check/check.h"
#include "kernels/attention.h"
#include "runtime/error.h"
#include "tune/choose.h"
#include "tune/state.h"

/* Head widths and pseudo-heads of the representative buckets: an odd width (no rotary, ragged
 * vectors, a GPU's local-memory attention) and a wide one (whole vectors, a GPU's register
 * tiles). Few, because building the programs is most of the check's time (check_backward.c
 * uses the same two, so that its calls load these programs). */
static const size_t dims[][2] = {{13, 3}, {128, 2}};
#define DIMS (sizeof dims / sizeof dims[0])
/* The representative layer: long enough that a window of WINDOW tokens is a window. */
#define TOKENS 256
#define HEADS 2
#define WINDOW 64

static const char *const mask_names[3] = {"causal", "token_causal", "none"};

typedef struct item {
    iha_tune_config config;
    size_t d, P;
    int half; /* decode: a half cache; attention: 16-bit storage */
    int source;
} item;

typedef struct item_list {
    item *v;
    size_t n, capacity;
    int out_of_memory;
} item_list;

/* Adds a configuration for (d, P, half) unless it is there (the first source found stays). */
static void add_item(const iha_tunable *t, item_list *l, const iha_tune_config *c, size_t d, size_t P, int half,
                     int source)
{
    iha_tune_config mine = *c;
    iha__space_tie(t->space, &mine);
    for (size_t i = 0; i < l->n; ++i) {
        iha_tune_config theirs = l->v[i].config;
        iha__space_tie(t->space, &theirs);
        if (l->v[i].d == d && l->v[i].P == P && l->v[i].half == half && iha__config_equal(t->space, &mine, &theirs))
            return;
    }
    if (l->n == l->capacity) {
        const size_t capacity = l->capacity ? 2 * l->capacity : 16;
        item *grown = realloc(l->v, capacity * sizeof *grown);
        if (grown == NULL) {
            l->out_of_memory = 1;
            return;
        }
        l->v = grown, l->capacity = capacity;
    }
    l->v[l->n++] = (item){*c, d, P, half, source};
}

/* The lookup's configuration for a bucket, as a layer call would get it. */
static void add_lookup(const iha_context *ctx, const iha_tunable *t, item_list *l, const iha_tune_bucket *b,
                       size_t d, size_t P, int half)
{
    iha_tune_config c;
    int source;
    const iha_profile_entry *e;
    iha__tune_lookup(ctx, t, b, &c, &source, &e);
    add_item(t, l, &c, d, P, half, source);
}

/* The configurations of the profile's entries for t, each with its bucket's d and P. */
static void add_profile(const iha_context *ctx, const iha_tunable *t, item_list *l)
{
    const iha_profile *p = &ctx->tune->profile;
    const int kd = iha__space_key_index(t->space, "d"), kp = iha__space_key_index(t->space, "P");
    const int kb = iha__space_key_index(t->space, "elem_bytes");
    for (size_t i = 0; i < p->count; ++i) {
        const iha_profile_entry *e = &p->entries[i];
        if (e->tunable != t || kd < 0 || kp < 0 || e->bucket.count <= kd || e->bucket.count <= kp) continue;
        const int half = kb >= 0 && e->bucket.count > kb && e->bucket.values[kb] == 2;
        add_item(t, l, &e->config, (size_t)e->bucket.values[kd], (size_t)e->bucket.values[kp], half,
                 e->is_default ? IHA_CONFIG_PROFILE_DEVICE : IHA_CONFIG_PROFILE_EXACT);
    }
}

typedef struct check_case {
    iha_shape shape;
    iha_attention_options options;
    iha_tune_bucket bucket;
    char label[48];
} check_case;

static iha_shape layer_shape(size_t d, size_t P)
{
    return (iha_shape){1, TOKENS, HEADS * d, HEADS, d, P};
}

static iha_attention_options masked(int mask, int windowed)
{
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.mask = mask;
    o.window = windowed ? WINDOW : 0;
    return o;
}

/* Runs the row's configuration on each case the configuration is valid for (the lookup never
 * gives it to the others) and emits the row when any case ran. */
static iha_status run_row(iha_check_run *run, const iha_tunable *t, iha_check_row *row, const iha_tune_config *c,
                          const check_case *cases, int n)
{
    iha_context *ctx = run->ctx;
    iha_tune_limits limits;
    iha__tune_limits(ctx, &limits);
    iha_tune_config config = *c;
    iha__space_tie(t->space, &config);
    int ran = 0;
    for (int i = 0; i < n; ++i) {
        if (!iha__space_valid(t->space, &config, &cases[i].bucket, &limits, NULL)) continue;
        void *problem = NULL;
        double error = 0.0;
        iha_status st = t->problem_create(ctx, &cases[i].shape, &cases[i].options, &cases[i].bucket,
                                          IHA_TUNE_PROBLEM_VERIFY, 1, &problem);
        if (st == IHA_OK) st = t->check(ctx, problem, &config, &error);
        st = iha__check_probe(ctx, st);
        t->problem_free(problem);
        if (st == IHA_ERROR_HOST_MEMORY) return st;
        ++ran;
        if (!iha__check_row_case(ctx, row, st, error, cases[i].label)) break;
    }
    if (ran) iha__check_emit(run, row);
    return IHA_OK;
}

/* The row's limit is the tunable's tolerance for the configuration on its first case's bucket
 * (a row's cases share the storage). */
static void begin_row(const iha_tunable *t, const item *it, const char *family, const char *shape,
                      const iha_tune_bucket *bucket, iha_check_row *row)
{
    char config[IHA_TUNE_CONFIG_TEXT];
    if (iha__space_format(t->space, &it->config, config, sizeof config) != 0) snprintf(config, sizeof config, "?");
    iha__check_row_init(row, family, config, it->source, shape,
                        bucket != NULL ? iha__tune_tolerance(t, bucket, &it->config) : IHA_TUNE_TOLERANCE);
}

/* The most cases a family runs a configuration on (decoding: 2 step sizes, 3 masks, 2 windows). */
#define MAX_CASES 12

/* A family's cases for one item (at most MAX_CASES; returns how many) and its row's shape text. */
typedef int (*cases_of_item)(const iha_context *ctx, const iha_tunable *t, const item *it, check_case *cases,
                             char *shape, size_t shape_size);

/* Adds the profile's configurations to the lookup's in items, then runs each on the cases that
 * cases_of gives it, a row each; frees items. */
static iha_status check_items(iha_check_run *run, const iha_tunable *t, const char *family, item_list *items,
                              cases_of_item cases_of)
{
    add_profile(run->ctx, t, items);
    iha_status st = items->out_of_memory ? iha__fail(run->ctx, IHA_ERROR_HOST_MEMORY, "out of host memory") : IHA_OK;
    for (size_t i = 0; i < items->n && st == IHA_OK; ++i) {
        const item *it = &items->v[i];
        check_case cases[MAX_CASES];
        char shape[160];
        const int n = cases_of(run->ctx, t, it, cases, shape, sizeof shape);
        iha_check_row row;
        begin_row(t, it, family, shape, n > 0 ? &cases[0].bucket : NULL, &row);
        st = run_row(run, t, &row, &it->config, cases, n);
    }
    free(items->v);
    return st;
}

/* ---- attention ---- */

static int attention_cases(const iha_context *ctx, const iha_tunable *t, const item *it, check_case *cases,
                           char *shape, size_t shape_size)
{
    int n = 0;
    for (int mask = 0; mask < 3; ++mask)
        for (int w = 0; w < 2; ++w, ++n) {
            cases[n].shape = layer_shape(it->d, it->P);
            cases[n].options = masked(mask, w);
            cases[n].options.storage = it->half ? IHA_STORAGE_F16 : IHA_STORAGE_F32;
            t->bucket_of(ctx, &cases[n].shape, &cases[n].options, &cases[n].bucket);
            snprintf(cases[n].label, sizeof cases[n].label, "%s %s", mask_names[mask], w ? "windowed" : "global");
        }
    snprintf(shape, shape_size, "d=%zu P=%zu%s, the tuner's ragged problem; 3 masks, global and windowed", it->d,
             it->P, it->half ? ", 16-bit storage" : "");
    return n;
}

/* The lookup's configuration for a 16-bit bucket, where it is the tensor cores': other
 * configurations run the same float kernels as the float bucket's rows. */
static void add_mma_lookup(const iha_context *ctx, const iha_tunable *t, item_list *l, const iha_tune_bucket *b,
                           size_t d, size_t P)
{
    iha_tune_config c;
    int source;
    const iha_profile_entry *e;
    iha__tune_lookup(ctx, t, b, &c, &source, &e);
    const long variant = c.v[iha__space_param_index(t->space, "variant")];
    if (variant == IHA_ATTENTION_MMA_F16 || variant == IHA_ATTENTION_MMA_BF16) add_item(t, l, &c, d, P, 1, source);
}

/* 16-bit storage has buckets of its own where the tensor cores may serve it (the
 * profile's entries for them are added in any case). */
iha_status iha__check_attention(iha_check_run *run)
{
    const iha_tunable *t = &iha__tunable_attention;
    item_list items = {NULL, 0, 0, 0};
    for (int half = 0; half < (run->ctx->mma != IHA_MMA_NONE ? 2 : 1); ++half)
        for (size_t i = 0; i < DIMS; ++i)
            for (int mask = 0; mask < 3; ++mask)
                for (int w = 0; w < 2; ++w) {
                    const iha_shape s = layer_shape(dims[i][0], dims[i][1]);
                    iha_attention_options o = masked(mask, w);
                    o.storage = half ? IHA_STORAGE_F16 : IHA_STORAGE_F32;
                    iha_tune_bucket b;
                    t->bucket_of(run->ctx, &s, &o, &b);
                    if (half)
                        add_mma_lookup(run->ctx, t, &items, &b, s.head_dim, s.pseudo);
                    else
                        add_lookup(run->ctx, t, &items, &b, s.head_dim, s.pseudo, 0);
                }
    return check_items(run, t, "attention", &items, attention_cases);
}

/* ---- mixing and collapse ---- */

static int rows_cases(const iha_context *ctx, const iha_tunable *t, const item *it, check_case *cases, char *shape,
                      size_t shape_size)
{
    cases[0] = (check_case){layer_shape(it->d, it->P), masked(IHA_MASK_CAUSAL, 0), {0, {0}}, ""};
    t->bucket_of(ctx, &cases[0].shape, &cases[0].options, &cases[0].bucket);
    snprintf(cases[0].label, sizeof cases[0].label, "mixing%s, keys, collapse", it->d % 2 == 0 ? " with rotary" : "");
    snprintf(shape, shape_size, "d=%zu P=%zu, the tuner's ragged problem", it->d, it->P);
    return 1;
}

iha_status iha__check_rows(iha_check_run *run)
{
    const iha_tunable *t = &iha__tunable_mix_collapse;
    item_list items = {NULL, 0, 0, 0};
    const iha_attention_options o = masked(IHA_MASK_CAUSAL, 0);
    for (size_t i = 0; i < DIMS; ++i) {
        const iha_shape s = layer_shape(dims[i][0], dims[i][1]);
        iha_tune_bucket b;
        t->bucket_of(run->ctx, &s, &o, &b);
        add_lookup(run->ctx, t, &items, &b, s.head_dim, s.pseudo, 0);
    }
    return check_items(run, t, "rows", &items, rows_cases);
}

/* ---- decoding ---- */

/* New tokens per sequence: generation and a chunk. */
static const size_t step_tokens[2] = {1, 4};

static void decode_bucket(size_t d, size_t P, int half, size_t k, int mask, int windowed, iha_tune_bucket *b)
{
    iha_decode_dims dd;
    memset(&dd, 0, sizeof dd);
    dd.B = 1, dd.k = k, dd.H = HEADS, dd.d = d, dd.P = P, dd.half = half;
    dd.t_max = dd.t_cur = (TOKENS + k) * P;
    iha__tune_decode_bucket(&dd, mask, windowed ? WINDOW : 0, b);
}

static int decode_cases(const iha_context *ctx, const iha_tunable *t, const item *it, check_case *cases,
                        char *shape, size_t shape_size)
{
    (void)ctx, (void)t; /* the decode buckets come from the cache's dimensions, not a layer call's */
    int n = 0;
    for (int k = 0; k < 2; ++k)
        for (int mask = 0; mask < 3; ++mask)
            for (int w = 0; w < 2; ++w, ++n) {
                cases[n].shape = layer_shape(it->d, it->P);
                cases[n].options = masked(mask, w);
                decode_bucket(it->d, it->P, it->half, step_tokens[k], mask, w, &cases[n].bucket);
                snprintf(cases[n].label, sizeof cases[n].label, "k=%zu %s %s", step_tokens[k], mask_names[mask],
                         w ? "windowed" : "global");
            }
    snprintf(shape, shape_size,
             "d=%zu P=%zu %s cache, the tuner's ragged problem; k=1 and 4, 3 masks, global and windowed", it->d, it->P,
             it->half ? "half" : "float");
    return n;
}

iha_status iha__check_decode(iha_check_run *run)
{
    const iha_tunable *t = &iha__tunable_decode;
    item_list items = {NULL, 0, 0, 0};
    for (size_t i = 0; i < DIMS; ++i)
        for (int half = 0; half < 2; ++half)
            for (int k = 0; k < 2; ++k)
                for (int mask = 0; mask < 3; ++mask)
                    for (int w = 0; w < 2; ++w) {
                        iha_tune_bucket b;
                        decode_bucket(dims[i][0], dims[i][1], half, step_tokens[k], mask, w, &b);
                        add_lookup(run->ctx, t, &items, &b, dims[i][0], dims[i][1], half);
                    }
    return check_items(run, t, "decode", &items, decode_cases);
}

/* ---- decoding on a compact cache ---- */

/* Rotary where the head width allows it: the odd width checks the steps without (a CPU's raw
 * query rows), the even one those with (keys cached rotated, the rest of the rotation on read). */
static void decode_compact_bucket(size_t d, size_t P, int half, size_t k, int mask, int windowed, iha_tune_bucket *b)
{
    iha_decode_compact dc;
    memset(&dc, 0, sizeof dc);
    dc.dd.B = 1, dc.dd.k = k, dc.dd.H = HEADS, dc.dd.d = d, dc.dd.P = P, dc.dd.half = half;
    dc.dd.t_max = dc.dd.t_cur = (TOKENS + k) * P;
    dc.slots = TOKENS + k;
    iha__tune_decode_compact_bucket(&dc, mask, windowed ? WINDOW : 0, d % 2 == 0, b);
}

static int decode_compact_cases(const iha_context *ctx, const iha_tunable *t, const item *it, check_case *cases,
                                char *shape, size_t shape_size)
{
    (void)ctx, (void)t; /* the buckets come from the cache's dimensions, not a layer call's */
    int n = 0;
    for (int k = 0; k < 2; ++k)
        for (int mask = 0; mask < 3; ++mask)
            for (int w = 0; w < 2; ++w, ++n) {
                cases[n].shape = layer_shape(it->d, it->P);
                cases[n].options = masked(mask, w);
                cases[n].options.rope = it->d % 2 == 0;
                decode_compact_bucket(it->d, it->P, it->half, step_tokens[k], mask, w, &cases[n].bucket);
                snprintf(cases[n].label, sizeof cases[n].label, "k=%zu %s %s", step_tokens[k], mask_names[mask],
                         w ? "windowed" : "global");
            }
    snprintf(shape, shape_size,
             "d=%zu P=%zu %s compact cache%s, the tuner's ragged problem; k=1 and 4, 3 masks, global and windowed",
             it->d, it->P, it->half ? "half" : "float", it->d % 2 == 0 ? " with rotary" : "");
    return n;
}

iha_status iha__check_decode_compact(iha_check_run *run)
{
    const iha_tunable *t = &iha__tunable_decode_compact;
    item_list items = {NULL, 0, 0, 0};
    for (size_t i = 0; i < DIMS; ++i)
        for (int half = 0; half < 2; ++half)
            for (int k = 0; k < 2; ++k)
                for (int mask = 0; mask < 3; ++mask)
                    for (int w = 0; w < 2; ++w) {
                        iha_tune_bucket b;
                        decode_compact_bucket(dims[i][0], dims[i][1], half, step_tokens[k], mask, w, &b);
                        add_lookup(run->ctx, t, &items, &b, dims[i][0], dims[i][1], half);
                    }
    return check_items(run, t, "decode_compact", &items, decode_compact_cases);
}

/* ---- GEMM ---- */

/* The GEMM check of one backend with the context's parameters (ctx->gemm as set): the tuner's
 * ragged product against float64 and the layer's products by a checksum. */
static iha_status gemm_row(iha_check_run *run, const char *config, int source)
{
    const iha_tunable *t = &iha__tunable_gemm;
    iha_context *ctx = run->ctx;
    const iha_shape s = {2, 37, 40, 3, 13, 2};
    const iha_attention_options o = masked(IHA_MASK_CAUSAL, 0);
    iha_tune_bucket b;
    t->bucket_of(ctx, &s, &o, &b);
    iha_check_row row;
    iha__check_row_init(&row, "gemm", config, source, "67x45x33 against float64; 74x39x40 and 74x40x39 by checksum",
                        IHA_TUNE_TOLERANCE);
    void *problem = NULL;
    double error = 0.0;
    iha_status st = t->problem_create(ctx, &s, &o, &b, IHA_TUNE_PROBLEM_VERIFY, 1, &problem);
    if (st == IHA_OK) st = t->check(ctx, problem, NULL, &error);
    st = iha__check_probe(ctx, st);
    t->problem_free(problem);
    if (st == IHA_ERROR_HOST_MEMORY) return st;
    iha__check_row_case(ctx, &row, st, error, ctx->gemm->config.own ? "the library's kernel" : "CLBlast");
    iha__check_emit(run, &row);
    return IHA_OK;
}

/* The library's kernel with the context's tile (or its default), and CLBlast where it is the
 * context's backend. iha_check puts ctx->gemm back afterwards. */
iha_status iha__check_gemm(iha_check_run *run)
{
    iha_context *ctx = run->ctx;
    const iha_gemm_config context_gemm = ctx->gemm->config;
    const iha_kernel_choice *choice = &ctx->tune->gemm;
    iha_gemm_config own;
    iha__tune_gemm_own_tile(ctx, &own);
    ctx->gemm->config = own;
    char config[160];
    snprintf(config, sizeof config, "backend=1 GEMM_MR=%d GEMM_VW=%d GEMM_KU=%d GEMM_GROUP=%zu", own.rows, own.vec,
             own.unroll, own.group);
    IHA_FORWARD_IF_ERROR(gemm_row(run, config, context_gemm.own ? choice->source : IHA_CONFIG_BUILTIN_TYPE));
    ctx->gemm->config = context_gemm;
    if (!context_gemm.own) IHA_FORWARD_IF_ERROR(gemm_row(run, choice->config, choice->source));
    return IHA_OK;
}
