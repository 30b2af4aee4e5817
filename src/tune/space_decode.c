/* The tuning space of the decode kernels (cl/attention_decode.cl and, variant 1,
 * cl/attention_decode_groups.cl; iha_decode_config: tile, vector width, work-group, keys per
 * work-item and key-split policy) and its problems: timing on the bucket's step (k new
 * tokens per sequence) against a full cache of the layer's B, H and N, verification on two ragged
 * sequences (one long enough for several splits at every min_split_keys, one short enough to
 * leave splits empty) against a float64 attention of doc/spec.md "Decoding with a cache". The key
 * block is not tuned here: the cache's layout fixes it (the attention kernel's ATT_KB for the
 * cache's shape), so the problems use the block a cache of their shape would get. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/decode.h"
#include "runtime/error.h"
#include "tune/buffers.h"
#include "tune/state.h"

enum { P_ROWS, P_VD, P_GROUP, P_MIN_KEYS, P_PER_CU, P_VARIANT, P_KEYS };
enum { K_MASK, K_WINDOWED, K_BYTES, K_D, K_P, K_K, K_CACHED, K_BH, K_COUNT };

static const iha_tune_param params[] = {
    {"ATT_ROWS", 4, {1, 2, 4, 8}, NULL},
    {"ATT_VD", 3, {4, 8, 16}, NULL},
    {"group", 10, {0, 1, 2, 4, 8, 16, 32, 64, 128, 256}, NULL}, /* variant 0: 0, the driver chooses */
    {"min_split_keys", 6, {64, 128, 256, 512, 1024, 2048}, NULL},
    {"per_cu", 8, {1, 2, 4, 8, 16, 32, 64, 128}, NULL},
    {"variant", 2, {0, 1}, NULL}, /* 0: register tiles, 1: a work-group per split */
    {"keys", 4, {1, 2, 4, 8}, NULL},
};

/* Kind keys must match; the rest are compared on a log2 scale. k is the step's new tokens per
 * sequence (1: generation; more: a prompt chunk), cached the keys a query of the longest
 * sequence sees in the cache before the step (capped by the window), BH the (b, h) pairs. */
static const iha_tune_key keys[] = {
    {"mask", 1}, {"windowed", 1}, {"elem_bytes", 1}, {"d", 0}, {"P", 0}, {"k", 0}, {"cached", 0}, {"BH", 0},
};

/* Private state per work-item (variant 0): ATT_ROWS query rows and accumulators of d floats. */
static int tile_fits(const long *v) { return v[2] == 1 || v[0] * v[1] <= 2048; }
/* A vector wider than the head wastes its lanes. */
static int vector_fits_head(const long *v) { return v[0] <= (iha__pow2_ceil(v[1]) > 4 ? iha__pow2_ceil(v[1]) : 4); }
/* Each variant's unused parameters keep one value (variant 0: keys 1; variant 1: ATT_VD 4), so
 * the search does not time one configuration twice. */
static int unused_fixed(const long *v) { return v[0] == 1 ? v[2] == 4 : v[1] == 1; }
/* Variant 1: a work-group of at least 32 work-items (a power of 2: the reductions halve it), and
 * scores of rows * keys per work-item in registers. */
static int group_variant_shape(const long *v) { return v[0] == 0 || (v[1] >= 32 && v[2] * v[3] <= 32); }

/* Variant 1's local memory (iha__decode_group_local_bytes); variant 0 uses none. */
static long local_bytes(const long *v)
{
    return v[0] == 1 ? (long)iha__decode_group_local_bytes((int)v[1], (size_t)v[2], (int)v[3], (size_t)v[4]) : 0;
}
/* A tile taller than the step's query rows (k*P per sequence) computes copies of its last row. */
static int tile_fits_rows(const long *v) { return v[0] <= iha__pow2_ceil(v[1] * v[2]); }

static const iha_tune_constraint constraints[] = {
    {tile_fits, {"ATT_ROWS", "d", "variant", NULL}, "ATT_ROWS rows of d floats exceed private memory"},
    {unused_fixed, {"variant", "keys", "ATT_VD", NULL}, "a parameter the variant does not use is not its first value"},
    {group_variant_shape,
     {"variant", "group", "ATT_ROWS", "keys"},
     "variant 1 needs 32 work-items or more and ATT_ROWS * keys of 32 at most"},
    {vector_fits_head, {"ATT_VD", "d", NULL, NULL}, "ATT_VD is wider than the head"},
    {tile_fits_rows, {"ATT_ROWS", "k", "P", NULL}, "ATT_ROWS exceeds the step's query rows"},
    {iha__at_most_x, {"group", "max_group", NULL, NULL}, "the work-group exceeds the device's maximum"},
};

static const iha_tune_space space = {
    "decode",
    params,
    7,
    keys,
    K_COUNT,
    constraints,
    6,
    local_bytes,
    {"variant", "ATT_ROWS", "group", "keys", "d", NULL},
    {NULL, NULL, NULL},
    NULL,
    0,
};

void iha__tune_decode_config(const iha_tune_config *c, iha_decode_config *cfg)
{
    cfg->rows = (int)c->v[P_ROWS];
    cfg->vec = (int)c->v[P_VD];
    cfg->group = (size_t)c->v[P_GROUP];
    cfg->min_split_keys = (int)c->v[P_MIN_KEYS];
    cfg->per_cu = (int)c->v[P_PER_CU];
    cfg->variant = (int)c->v[P_VARIANT];
    cfg->keys = (int)c->v[P_KEYS];
}

void iha__tune_decode_bucket(const iha_decode_dims *dd, int mask, size_t window, iha_tune_bucket *b)
{
    const size_t rows = dd->k * dd->P;
    size_t cached = dd->t_cur > rows ? dd->t_cur - rows : 0;
    if (window && window * dd->P < cached) cached = window * dd->P;
    b->count = K_COUNT;
    b->values[K_MASK] = mask;
    b->values[K_WINDOWED] = window != 0;
    b->values[K_BYTES] = dd->half || dd->bf16 ? 2 : 4; /* bfloat16 caches share half's tuning */
    b->values[K_D] = (long)dd->d;
    b->values[K_P] = (long)dd->P;
    b->values[K_K] = iha__pow2_ceil((long)dd->k);
    b->values[K_CACHED] = iha__pow2_ceil(cached ? (long)cached : 1);
    b->values[K_BH] = iha__pow2_ceil((long)(dd->B * dd->H));
}

/* What a layer shape stands for in decoding: one new token per sequence against a cache that
 * holds the shape's N tokens (a cache of N + 1), with the window as the step sees it. */
static void step_of(const iha_shape *s, const iha_attention_options *o, int half, iha_decode_dims *dd, size_t *window)
{
    memset(dd, 0, sizeof *dd);
    dd->B = s->batch, dd->k = 1, dd->H = s->heads, dd->d = s->head_dim, dd->P = s->pseudo;
    dd->t_max = dd->t_cur = (s->tokens + 1) * s->pseudo;
    dd->half = half;
    *window = o->window <= 0 || (uint64_t)o->window >= s->tokens + 1 ? 0 : (size_t)o->window;
}

int iha__tune_decode_buckets(const iha_shape *s, const iha_attention_options *o, iha_tune_bucket *out, int capacity)
{
    int n = 0;
    for (int half = 0; half < 2 && n < capacity; ++half) {
        iha_decode_dims dd;
        size_t window;
        step_of(s, o, half, &dd, &window);
        iha__tune_decode_bucket(&dd, o->mask, window, &out[n++]);
    }
    return n;
}

static int bucket_of(const iha_context *ctx, const iha_shape *s, const iha_attention_options *o, iha_tune_bucket *b)
{
    (void)ctx;
    return iha__tune_decode_buckets(s, o, b, 1);
}

/* The kernel module's default, with the tile no taller than the step's query rows. */
static int builtin(const iha_context *ctx, const iha_tune_bucket *b, iha_tune_config *c)
{
    iha_decode_config cfg;
    iha__decode_config_default(ctx, (size_t)b->values[K_D], &cfg);
    const long rows = iha__pow2_ceil(b->values[K_K] * b->values[K_P]);
    memset(c, 0, sizeof *c);
    c->v[P_ROWS] = cfg.rows < rows ? cfg.rows : rows;
    c->v[P_VD] = cfg.vec;
    c->v[P_GROUP] = (long)cfg.group;
    c->v[P_MIN_KEYS] = cfg.min_split_keys;
    c->v[P_PER_CU] = cfg.per_cu;
    c->v[P_VARIANT] = cfg.variant;
    c->v[P_KEYS] = cfg.keys;
    return 1;
}

static void safe(const iha_tune_bucket *b, iha_tune_config *c)
{
    (void)b;
    memset(c, 0, sizeof *c);
    c->v[P_ROWS] = 1;
    c->v[P_VD] = 4;
    c->v[P_GROUP] = 0;
    c->v[P_MIN_KEYS] = 256;
    c->v[P_PER_CU] = 8;
    c->v[P_VARIANT] = 0;
    c->v[P_KEYS] = 1;
}

/* ---- Problems ---- */

#define MAX_COPIES 4
#define MAX_SPLITS 256 /* variant 1's most: the partial buffer is sized for the most splits */

typedef struct problem {
    iha_decode_dims dd; /* dd.tune is set per run */
    int mask;
    size_t window;
    float scale;
    int copies;
    cl_int step[4]; /* (n0, count) per sequence; verification has 2 sequences, timing shares one pair */
    cl_mem q, o, partial, steps;
    cl_mem keys[MAX_COPIES], values[MAX_COPIES];
    float *hq, *hk, *hv; /* verification: queries, and keys and values as rows [B*H][t_max][d] as stored */
} problem;

static void problem_free(void *p)
{
    problem *pr = p;
    if (pr == NULL) return;
    cl_mem m[4] = {pr->q, pr->o, pr->partial, pr->steps};
    iha__tune_release(m, 4);
    iha__tune_release(pr->keys, MAX_COPIES);
    iha__tune_release(pr->values, MAX_COPIES);
    free(pr->hq), free(pr->hk), free(pr->hv);
    free(pr);
}

static size_t problem_bytes(const iha_shape *s, const iha_tune_bucket *b)
{
    return 2 * s->batch * s->heads * (s->tokens + (size_t)b->values[K_K]) * s->pseudo * s->head_dim *
           (size_t)b->values[K_BYTES];
}

/* The key block of a cache of this shape: attention's configuration for it, as
 * iha_kv_cache_create chooses it. */
static int cache_key_block(const iha_context *ctx, const iha_shape *cache_shape)
{
    iha_attention_options defaults;
    iha_attention_options_init(&defaults);
    iha_tune_bucket ab;
    iha_tune_config c;
    int source;
    const iha_profile_entry *e;
    iha__tunable_attention.bucket_of(ctx, cache_shape, &defaults, &ab);
    iha__tune_lookup(ctx, &iha__tunable_attention, &ab, &c, &source, &e);
    iha_attention_config cfg;
    iha__tune_attention_config(&c, &cfg);
    return cfg.key_block;
}

/* Keys as rows [BH][t_max][d] -> the key-block layout [BH][ceil(t_max/KB)][d][KB], zero padded. */
static float *pack(const float *rows, size_t bh, size_t t_max, size_t d, size_t kb)
{
    const size_t blocks = (t_max + kb - 1) / kb;
    float *out = calloc(bh * blocks * kb * d + 1, sizeof *out);
    if (out == NULL) return NULL;
    for (size_t h = 0; h < bh; ++h)
        for (size_t t = 0; t < t_max; ++t)
            for (size_t c = 0; c < d; ++c)
                out[((h * blocks + t / kb) * d + c) * kb + t % kb] = rows[(h * t_max + t) * d + c];
    return out;
}

static iha_status make_cache(iha_context *ctx, problem *pr, int copy, int verify)
{
    const iha_decode_dims *dd = &pr->dd;
    const size_t bh = dd->B * dd->H, n = bh * dd->t_max * dd->d, kb = (size_t)dd->cfg.key_block;
    float *k = iha__tune_random(n, 41 + 2 * (uint64_t)copy), *v = iha__tune_random(n, 42 + 2 * (uint64_t)copy);
    iha_status st = k && v ? IHA_OK : iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    /* Rounded to half in place first, so that the packed keys and the reference agree. */
    if (st == IHA_OK) st = iha__tune_buffer_stored(ctx, v, n, dd->half, &pr->values[copy]);
    if (st == IHA_OK && dd->half)
        iha__tune_round_half(k, n);
    float *packed = st == IHA_OK ? pack(k, bh, dd->t_max, dd->d, kb) : NULL;
    if (st == IHA_OK && packed == NULL) st = iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    if (st == IHA_OK)
        st = iha__tune_buffer_stored(ctx, packed, bh * ((dd->t_max + kb - 1) / kb) * kb * dd->d, dd->half, &pr->keys[copy]);
    free(packed);
    if (st == IHA_OK && verify) {
        pr->hk = k, pr->hv = v;
    } else {
        free(k), free(v);
    }
    return st;
}

/* Timing: the bucket's k new tokens per sequence against a full cache of the shape's B, H and
 * N tokens. Verification: 2 sequences of 2 heads, one with about 4700 keys cached (splits at
 * every min_split_keys), one with 5 tokens, and with a chunk, 2 tokens of 3 in the second. */
static iha_status problem_create(iha_context *ctx, const iha_shape *s, const iha_attention_options *o,
                                 const iha_tune_bucket *b, iha_tune_purpose purpose, int copies, void **out)
{
    problem *pr = calloc(1, sizeof *pr);
    IHA_RETURN_ERROR_IF(pr == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    const int verify = purpose == IHA_TUNE_PROBLEM_VERIFY;
    const size_t P = s->pseudo, d = s->head_dim, k = verify ? (b->values[K_K] > 1 ? 3 : 1) : (size_t)b->values[K_K];
    const size_t n0 = verify ? (4700 + P - 1) / P : s->tokens, n1 = verify ? 5 : n0;
    iha_decode_dims *dd = &pr->dd;
    dd->B = verify ? 2 : s->batch, dd->k = k, dd->H = verify ? 2 : s->heads, dd->d = d, dd->P = P;
    dd->t_cur = (n0 + k) * P;
    dd->t_max = verify ? dd->t_cur + 2 * P : dd->t_cur;
    dd->half = b->values[K_BYTES] == 2;
    const iha_shape cache_shape = {s->batch, dd->t_max / P, 1, s->heads, d, P};
    dd->cfg.key_block = cache_key_block(ctx, &cache_shape);
    pr->mask = o->mask;
    pr->window = b->values[K_WINDOWED] ? (verify ? n0 / 3 : (size_t)o->window) : 0;
    pr->scale = (float)(1.0 / sqrt((double)d));
    pr->copies = iha__tune_copy_count(verify, copies, MAX_COPIES);
    pr->step[0] = (cl_int)n0, pr->step[1] = (cl_int)k;
    pr->step[2] = (cl_int)n1, pr->step[3] = (cl_int)(verify && k > 1 ? k - 1 : k);

    const size_t bh = dd->B * dd->H, nq = bh * k * P * d;
    float *q = iha__tune_random(nq, 40);
    iha_status st = q ? IHA_OK : iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    if (st == IHA_OK) st = iha__tune_buffer(ctx, nq, q, &pr->q);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, nq, NULL, &pr->o);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, bh * k * P * MAX_SPLITS * (d + 2), NULL, &pr->partial);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, 2 * dd->B, NULL, &pr->steps);
    for (size_t i = 0; i < dd->B && st == IHA_OK; ++i) {
        const cl_int *pair = &pr->step[i == 0 || !verify ? 0 : 2];
        IHA_CL_CHECK(ctx,
                     clEnqueueWriteBuffer(ctx->queue, pr->steps, CL_TRUE, 2 * i * sizeof(cl_int), 2 * sizeof(cl_int),
                                          pair, 0, NULL, NULL),
                     "clEnqueueWriteBuffer (decode tuning steps)");
    }
    for (int i = 0; i < pr->copies && st == IHA_OK; ++i) st = make_cache(ctx, pr, i, verify);
    if (verify)
        pr->hq = q;
    else
        free(q);
    if (st != IHA_OK) {
        problem_free(pr);
        return st;
    }
    *out = pr;
    return IHA_OK;
}

static iha_status enqueue(iha_context *ctx, void *p, const iha_tune_config *c, int copy)
{
    problem *pr = p;
    iha_decode_dims dd = pr->dd;
    iha_tune_config builtin_config;
    if (c == NULL) {
        iha_tune_bucket b;
        iha__tune_decode_bucket(&dd, pr->mask, pr->window, &b);
        builtin(ctx, &b, &builtin_config);
        c = &builtin_config;
    }
    iha__tune_decode_config(c, &dd.tune);
    return iha__decode_attention_enqueue(ctx, &dd, (iha_buffer){pr->q, 0}, pr->keys[copy], pr->values[copy],
                                         pr->partial, (iha_buffer){pr->o, 0}, pr->steps, pr->mask, pr->window,
                                         pr->scale);
}

/* One launch builds the program and, on PoCL, the machine code for this work-group size. */
static iha_status prepare(iha_context *ctx, void *p, const iha_tune_config *c) { return enqueue(ctx, p, c, 0); }

/* Float64 attention of each active query row over its sequence's keys; inactive rows are 0. */
static void reference(const void *p, double *ref)
{
    const problem *pr = p;
    const iha_decode_dims *dd = &pr->dd;
    const long P = (long)dd->P, d = (long)dd->d, rows = (long)(dd->k * dd->P), W = (long)pr->window;
    double *s = malloc(dd->t_max * sizeof *s);
    if (s == NULL) return;
    for (size_t bh = 0; bh < dd->B * dd->H; ++bh) {
        const cl_int *step = &pr->step[bh / dd->H == 0 ? 0 : 2];
        const long n0 = step[0], T = (n0 + step[1]) * P;
        const float *k = pr->hk + bh * dd->t_max * (size_t)d, *v = pr->hv + bh * dd->t_max * (size_t)d;
        for (long r = 0; r < rows; ++r) {
            double *out = ref + (bh * (size_t)rows + (size_t)r) * (size_t)d;
            for (long c = 0; c < d; ++c) out[c] = 0.0;
            if (r >= step[1] * P) continue;
            const float *q = pr->hq + (bh * (size_t)rows + (size_t)r) * (size_t)d;
            iha__tune_reference_row(q, k, v, n0 * P + r, T, d, P, pr->mask, W, (double)pr->scale, s, out);
        }
    }
    free(s);
}

static iha_status check(iha_context *ctx, void *p, const iha_tune_config *c, double *error)
{
    problem *pr = p;
    return iha__tune_check_output(ctx, pr, c, enqueue, pr->o, pr->dd.B * pr->dd.H * pr->dd.k * pr->dd.P * pr->dd.d,
                                  reference, error);
}

/* Weight 0.5: a layer shape makes two decode tasks (float and half cache), together one share. */
const iha_tunable iha__tunable_decode = {
    &space,       0.5,           bucket_of, builtin, safe,    NULL,  problem_create,
    problem_free, problem_bytes, NULL,      prepare, enqueue, check, NULL, NULL,
};
