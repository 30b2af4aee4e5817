/* The tuning space of the compact cache's decode kernels (cl/attention_decode_compact.cl and,
 * lanes 1, cl/attention_decode_compact_lanes.cl; iha_decode_compact_config: query rows and target
 * heads per work-item, vector width, token-split policy, lanes) and its problems: timing on the
 * bucket's step (k new tokens per sequence) against a full compact cache of the layer's B, H and
 * N (folded, as steps run, where a one-token step can be), verification on two ragged sequences
 * of three heads (one long enough for several splits at every min_split_tokens, one short enough
 * to leave splits empty) against a float64 attention over the pseudo-keys and -values
 * doc/spec.md's "The compact cache" forms from the heads' rows (collapsed by R where folded). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/decode_compact.h"
#include "runtime/error.h"
#include "tune/buffers.h"
#include "tune/state.h"

enum { P_ROWS, P_HEADS, P_VD, P_MIN_TOKENS, P_PER_CU, P_LANES };
enum { K_MASK, K_ROPE, K_BYTES, K_D, K_P, K_H, K_K, K_CACHED, K_COUNT };

static const iha_tune_param params[] = {
    {"rows", 5, {1, 2, 4, 8, 16}, NULL},
    {"heads", 7, {1, 2, 4, 8, 16, 32, 64}, NULL},
    {"DEC_VD", 3, {4, 8, 16}, NULL},
    {"min_split_tokens", 6, {16, 32, 64, 128, 256, 512}, NULL},
    {"per_cu", 7, {1, 2, 4, 8, 16, 32, 64}, NULL},
    {"lanes", 2, {0, 1}, NULL}, /* 1: the rows across vector lanes where the step allows */
};

/* Kind keys must match; the rest are compared on a log2 scale. rope: the cache holds rotated
 * keys and the step rotates by the pseudo index; H: every score and value reads a token's H rows;
 * k the step's new tokens per sequence; cached the tokens a query of the longest sequence reads
 * before the step (capped by the window). */
static const iha_tune_key keys[] = {
    {"mask", 1}, {"rope", 1}, {"elem_bytes", 1}, {"d", 0}, {"P", 0}, {"H", 0}, {"k", 0}, {"cached", 0},
};

/* A vector wider than the head wastes its lanes. */
static int vector_fits_head(const long *v) { return v[0] <= (iha__pow2_ceil(v[1]) > 4 ? iha__pow2_ceil(v[1]) : 4); }
/* More rows or heads than the step has compute copies. */
static int rows_fit_step(const long *v) { return v[0] <= iha__pow2_ceil(v[1] * v[2]); }
static int heads_fit(const long *v) { return v[0] <= iha__pow2_ceil(v[1]); }
/* A work-item's query rows and accumulators of one head stay within its private budget. */
static int rows_fit_private(const long *v) { return v[0] * v[1] <= IHA_DECODE_COMPACT_PRIVATE_FLOATS; }

static const iha_tune_constraint constraints[] = {
    {vector_fits_head, {"DEC_VD", "d", NULL, NULL}, "DEC_VD is wider than the head"},
    {rows_fit_step, {"rows", "k", "P", NULL}, "rows exceed the step's query rows"},
    {heads_fit, {"heads", "H", NULL, NULL}, "heads exceed the layer's"},
    {rows_fit_private, {"rows", "d", NULL, NULL}, "rows of d floats exceed private memory"},
};

static const iha_tune_space space = {
    "decode_compact", params, 6, keys, K_COUNT, constraints, 4, NULL, {NULL}, {NULL, NULL, NULL}, NULL, 0,
};

void iha__tune_decode_compact_config(const iha_tune_config *c, iha_decode_compact_config *cfg)
{
    cfg->rows = (int)c->v[P_ROWS];
    cfg->heads = (int)c->v[P_HEADS];
    cfg->vec = (int)c->v[P_VD];
    cfg->min_split_tokens = (int)c->v[P_MIN_TOKENS];
    cfg->per_cu = (int)c->v[P_PER_CU];
    cfg->lanes = (int)c->v[P_LANES];
}

void iha__tune_decode_compact_bucket(const iha_decode_compact *dc, int mask, size_t window, int rope,
                                     iha_tune_bucket *b)
{
    const iha_decode_dims *dd = &dc->dd;
    const size_t tokens = dd->t_cur / dd->P;
    size_t cached = tokens > dd->k ? tokens - dd->k : 0;
    if (dd->ring && cached > dc->slots) cached = dc->slots;
    if (window && window < cached) cached = window;
    b->count = K_COUNT;
    b->values[K_MASK] = mask;
    b->values[K_ROPE] = rope != 0;
    b->values[K_BYTES] = dd->half || dd->bf16 ? 2 : 4; /* bfloat16 caches share half's tuning */
    b->values[K_D] = (long)dd->d;
    b->values[K_P] = (long)dd->P;
    b->values[K_H] = (long)dd->H;
    b->values[K_K] = iha__pow2_ceil((long)dd->k);
    b->values[K_CACHED] = iha__pow2_ceil(cached ? (long)cached : 1);
}

/* What a layer shape stands for in decoding: one new token per sequence against a compact cache
 * that holds the shape's N tokens, with the window as the step sees it. */
static void step_of(const iha_shape *s, const iha_attention_options *o, int half, iha_decode_compact *dc,
                    size_t *window)
{
    memset(dc, 0, sizeof *dc);
    iha_decode_dims *dd = &dc->dd;
    dd->B = s->batch, dd->k = 1, dd->H = s->heads, dd->d = s->head_dim, dd->P = s->pseudo;
    dd->t_max = dd->t_cur = (s->tokens + 1) * s->pseudo;
    dd->half = half;
    dc->slots = s->tokens + 1;
    *window = o->window <= 0 || (uint64_t)o->window >= s->tokens + 1 ? 0 : (size_t)o->window;
}

int iha__tune_decode_compact_buckets(const iha_shape *s, const iha_attention_options *o, iha_tune_bucket *out,
                                     int capacity)
{
    int n = 0;
    for (int half = 0; half < 2 && n < capacity; ++half) {
        iha_decode_compact dc;
        size_t window;
        step_of(s, o, half, &dc, &window);
        iha__tune_decode_compact_bucket(&dc, o->mask, window, o->rope, &out[n++]);
    }
    return n;
}

static int bucket_of(const iha_context *ctx, const iha_shape *s, const iha_attention_options *o, iha_tune_bucket *b)
{
    (void)ctx;
    return iha__tune_decode_compact_buckets(s, o, b, 1);
}

/* The kernel module's default, with rows and heads no more than the step has (the kernel cuts
 * them the same way) and vectors no wider than the head. */
static int builtin(const iha_context *ctx, const iha_tune_bucket *b, iha_tune_config *c)
{
    iha_decode_compact_config cfg;
    iha__decode_compact_config_default(ctx, &cfg);
    const long rows = iha__pow2_ceil(b->values[K_K] * b->values[K_P]), heads = iha__pow2_ceil(b->values[K_H]);
    memset(c, 0, sizeof *c);
    c->v[P_ROWS] = cfg.rows < rows ? cfg.rows : rows;
    c->v[P_HEADS] = cfg.heads < heads ? cfg.heads : heads;
    const long widest = iha__pow2_ceil(b->values[K_D]) > 4 ? iha__pow2_ceil(b->values[K_D]) : 4;
    c->v[P_VD] = cfg.vec < widest ? cfg.vec : widest;
    c->v[P_MIN_TOKENS] = cfg.min_split_tokens;
    c->v[P_PER_CU] = cfg.per_cu;
    c->v[P_LANES] = cfg.lanes;
    while (c->v[P_ROWS] > 1 && c->v[P_ROWS] * b->values[K_D] > IHA_DECODE_COMPACT_PRIVATE_FLOATS) c->v[P_ROWS] /= 2;
    return 1;
}

static void safe(const iha_tune_bucket *b, iha_tune_config *c)
{
    (void)b;
    memset(c, 0, sizeof *c);
    c->v[P_ROWS] = 1;
    c->v[P_HEADS] = 1;
    c->v[P_VD] = 4;
    c->v[P_MIN_TOKENS] = 64;
    c->v[P_PER_CU] = 8;
    c->v[P_LANES] = 0;
}

/* ---- Problems ---- */

#define MAX_COPIES 4
#define VERIFY_HEADS 3

typedef struct problem {
    iha_decode_compact dc; /* dc.cfg is set per run */
    int mask, rope;
    size_t window;
    float scale;
    int copies;
    cl_int step[4]; /* (n0, count) per sequence; verification has 2 sequences, timing shares one pair */
    int fold;       /* the configuration being checked folds the collapse in (o then holds Y) */
    cl_mem q, q_raw, alphas, angles, o, partial, steps;
    cl_mem keys[MAX_COPIES], values[MAX_COPIES];
    /* verification: pseudo-queries [B][H][k*P][d], the cache's K and V as stored (rounded to
     * half where the cache is half), alpha_Q, alpha_K, alpha_V and R [H][H][P], the angle rows
     * [P][d] */
    float *hq, *hk, *hv, *ha, *hangles;
} problem;

static void problem_free(void *p)
{
    problem *pr = p;
    if (pr == NULL) return;
    cl_mem m[7] = {pr->q, pr->q_raw, pr->alphas, pr->angles, pr->o, pr->partial, pr->steps};
    iha__tune_release(m, 7);
    iha__tune_release(pr->keys, MAX_COPIES);
    iha__tune_release(pr->values, MAX_COPIES);
    free(pr->hq), free(pr->hk), free(pr->hv), free(pr->ha), free(pr->hangles);
    free(pr);
}

static size_t problem_bytes(const iha_shape *s, const iha_tune_bucket *b)
{
    return 2 * s->batch * s->heads * (s->tokens + (size_t)b->values[K_K]) * s->head_dim * (size_t)b->values[K_BYTES];
}

static iha_status make_cache(iha_context *ctx, problem *pr, int copy, int verify)
{
    const iha_decode_dims *dd = &pr->dc.dd;
    const size_t n = dd->B * pr->dc.slots * dd->H * dd->d;
    float *k = iha__tune_random(n, 51 + 2 * (uint64_t)copy), *v = iha__tune_random(n, 52 + 2 * (uint64_t)copy);
    iha_status st = k && v ? IHA_OK : iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    if (st == IHA_OK) st = iha__tune_buffer_stored(ctx, k, n, dd->half, &pr->keys[copy]);
    if (st == IHA_OK) st = iha__tune_buffer_stored(ctx, v, n, dd->half, &pr->values[copy]);
    if (st == IHA_OK && verify) {
        pr->hk = k, pr->hv = v;
    } else {
        free(k), free(v);
    }
    return st;
}

/* The rotary rows of positions 0 .. P-1, [P][2][d/2], as iha__rope_write makes them (base 10000). */
static float *angle_rows(size_t P, size_t d)
{
    float *a = calloc(P * d + 1, sizeof *a);
    if (a == NULL) return NULL;
    for (size_t p = 0; p < P; ++p)
        for (size_t i = 0; i < d / 2; ++i) {
            const double x = (double)p * pow(10000.0, -2.0 * (double)i / (double)d);
            a[p * d + i] = (float)cos(x);
            a[p * d + d / 2 + i] = (float)sin(x);
        }
    return a;
}

/* The pseudo-queries [B][H][k*P][d]: each step token's raw rows [B][k][H][d] mixed by alpha_Q
 * (the kernels read either; with rotary they stand for rotated rows). */
static float *mix_queries(const float *raw, const float *aq, size_t B, size_t k, size_t H, size_t d, size_t P)
{
    float *q = malloc((B * H * k * P * d + 1) * sizeof *q);
    if (q == NULL) return NULL;
    for (size_t b = 0; b < B; ++b)
        for (size_t h = 0; h < H; ++h)
            for (size_t r = 0; r < k * P; ++r)
                for (size_t c = 0; c < d; ++c) {
                    double x = 0.0;
                    for (size_t m = 0; m < H; ++m)
                        x += (double)aq[(m * H + h) * P + r % P] * raw[((b * k + r / P) * H + m) * d + c];
                    q[((b * H + h) * k * P + r) * d + c] = (float)x;
                }
    return q;
}

/* Timing: the bucket's k new tokens per sequence against a full compact cache of the shape's B,
 * H and N tokens. Verification: 2 sequences of 3 heads, one with about 2400 virtual keys cached
 * (600 tokens at P = 4: splits at every min_split_tokens; at least 40 tokens, so that a large P
 * keeps the float64 reference quick), one with 5, and with a chunk, 2 tokens of 3 in the
 * second. */
static iha_status problem_create(iha_context *ctx, const iha_shape *s, const iha_attention_options *o,
                                 const iha_tune_bucket *b, iha_tune_purpose purpose, int copies, void **out)
{
    problem *pr = calloc(1, sizeof *pr);
    IHA_RETURN_ERROR_IF(pr == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    const int verify = purpose == IHA_TUNE_PROBLEM_VERIFY;
    const size_t P = s->pseudo, d = s->head_dim, k = verify ? (b->values[K_K] > 1 ? 3 : 1) : (size_t)b->values[K_K];
    const size_t long_tokens = (2400 + P - 1) / P > 40 ? (2400 + P - 1) / P : 40;
    const size_t n0 = verify ? long_tokens : s->tokens, n1 = verify ? 5 : n0;
    iha_decode_dims *dd = &pr->dc.dd;
    dd->B = verify ? 2 : s->batch, dd->k = k, dd->H = verify ? VERIFY_HEADS : s->heads, dd->d = d, dd->P = P;
    dd->t_max = dd->t_cur = (n0 + k) * P;
    dd->half = b->values[K_BYTES] == 2;
    pr->dc.slots = n0 + k;
    pr->mask = (int)b->values[K_MASK];
    pr->rope = b->values[K_ROPE] != 0 && d % 2 == 0;
    const size_t window = o->window > 0 && (uint64_t)o->window < s->tokens + 1 ? (size_t)o->window : 0;
    pr->window = window ? (verify ? n0 / 3 : window) : 0;
    pr->scale = (float)(1.0 / sqrt((double)d));
    pr->copies = iha__tune_copy_count(verify, copies, MAX_COPIES);
    pr->step[0] = (cl_int)n0, pr->step[1] = (cl_int)k;
    pr->step[2] = (cl_int)n1, pr->step[3] = (cl_int)(verify && k > 1 ? k - 1 : k);

    const size_t B = dd->B, H = dd->H, nq = B * H * k * P * d, na = H * H * P;
    float *raw = iha__tune_random(B * k * H * d, 50), *alphas = iha__tune_random(4 * na, 49);
    float *q = raw && alphas ? mix_queries(raw, alphas, B, k, H, d, P) : NULL;
    float *angles = angle_rows(P, d);
    iha_status st = q && angles ? IHA_OK : iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    if (st == IHA_OK) st = iha__tune_buffer(ctx, nq, q, &pr->q);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, B * k * H * d, raw, &pr->q_raw);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, 4 * na, alphas, &pr->alphas);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, P * d, angles, &pr->angles);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, nq, NULL, &pr->o);
    /* The most any configuration's partial results take: the softmax states at the most splits
     * and, for a folded step, its stored rows and the splits' shares of Y. */
    const size_t folded = k == 1 ? B * ((pr->dc.slots + 15) / 16 * 16 * (P + 1) * H * P + 32 +
                                        IHA_DECODE_COMPACT_MAX_SPLITS * H * d)
                                 : 0;
    if (st == IHA_OK)
        st = iha__tune_buffer(ctx, nq * IHA_DECODE_COMPACT_MAX_SPLITS / d * (d + 2) + folded, NULL, &pr->partial);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, 2 * B, NULL, &pr->steps);
    for (size_t i = 0; i < B && st == IHA_OK; ++i) {
        const cl_int *pair = &pr->step[i == 0 || !verify ? 0 : 2];
        IHA_CL_CHECK(ctx,
                     clEnqueueWriteBuffer(ctx->queue, pr->steps, CL_TRUE, 2 * i * sizeof(cl_int), 2 * sizeof(cl_int),
                                          pair, 0, NULL, NULL),
                     "clEnqueueWriteBuffer (compact decode tuning steps)");
    }
    for (int i = 0; i < pr->copies && st == IHA_OK; ++i) st = make_cache(ctx, pr, i, verify);
    free(raw);
    if (verify) {
        pr->hq = q, pr->ha = alphas, pr->hangles = angles;
    } else {
        free(q), free(alphas), free(angles);
    }
    if (st != IHA_OK) {
        problem_free(pr);
        return st;
    }
    *out = pr;
    return IHA_OK;
}

/* The problem's step with configuration c (NULL: the built-in); a step of one token folds where
 * it can, as iha_decode_step runs it. */
static iha_decode_compact configured_step(iha_context *ctx, const problem *pr, const iha_tune_config *c)
{
    iha_decode_compact dc = pr->dc;
    iha_tune_config builtin_config;
    if (c == NULL) {
        iha_tune_bucket b;
        iha__tune_decode_compact_bucket(&dc, pr->mask, pr->window, pr->rope, &b);
        builtin(ctx, &b, &builtin_config);
        c = &builtin_config;
    }
    iha__tune_decode_compact_config(c, &dc.cfg);
    dc.fold = iha__decode_compact_can_fold(ctx, &dc, pr->rope, 1);
    return dc;
}

static iha_status enqueue(iha_context *ctx, void *p, const iha_tune_config *c, int copy)
{
    problem *pr = p;
    iha_decode_compact dc = configured_step(ctx, pr, c);
    const size_t na = dc.dd.H * dc.dd.H * dc.dd.P;
    if (dc.fold)
        return iha__decode_compact_fold_enqueue(
            ctx, &dc, (iha_buffer){pr->q, 0}, (iha_buffer){pr->q_raw, 0}, pr->keys[copy], pr->values[copy],
            (iha_buffer){pr->alphas, 0}, (iha_buffer){pr->alphas, na}, (iha_buffer){pr->alphas, 2 * na},
            (iha_buffer){pr->alphas, 3 * na}, pr->rope ? pr->angles : NULL, pr->partial, (iha_buffer){pr->o, 0},
            pr->steps, pr->mask, pr->window, pr->scale);
    return iha__decode_compact_attention_enqueue(
        ctx, &dc, (iha_buffer){pr->q, 0}, (iha_buffer){pr->q_raw, 0}, pr->keys[copy], pr->values[copy],
        (iha_buffer){pr->alphas, 0}, (iha_buffer){pr->alphas, na}, (iha_buffer){pr->alphas, 2 * na},
        pr->rope ? pr->angles : NULL, pr->partial, (iha_buffer){pr->o, 0}, pr->steps, pr->mask, pr->window, pr->scale);
}

/* One launch builds the program and, on PoCL, the machine code for this work-group size. */
static iha_status prepare(iha_context *ctx, void *p, const iha_tune_config *c) { return enqueue(ctx, p, c, 0); }

/* Pseudo-key (rotated by the pseudo index p with rotary) and pseudo-value of target head h at
 * token n, pseudo index p, in float64 (doc/spec.md, "The compact cache"). */
static void pseudo_rows(const problem *pr, size_t b, size_t n, size_t h, size_t p, double *kt, double *vt)
{
    const iha_decode_dims *dd = &pr->dc.dd;
    const size_t H = dd->H, P = dd->P, d = dd->d, na = H * H * P;
    const float *k = pr->hk + (b * pr->dc.slots + n) * H * d, *v = pr->hv + (b * pr->dc.slots + n) * H * d;
    for (size_t c = 0; c < d; ++c) {
        double x = 0.0, y = 0.0;
        for (size_t m = 0; m < H; ++m) {
            x += (double)pr->ha[na + (m * H + h) * P + p] * k[m * d + c];
            y += (double)pr->ha[2 * na + (m * H + h) * P + p] * v[m * d + c];
        }
        kt[c] = x, vt[c] = y;
    }
    if (!pr->rope) return;
    const float *cs = pr->hangles + p * d, *sn = cs + d / 2;
    for (size_t i = 0; i < d / 2; ++i) {
        const double a = kt[i], c = kt[i + d / 2];
        kt[i] = a * cs[i] - c * sn[i];
        kt[i + d / 2] = c * cs[i] + a * sn[i];
    }
}

/* Float64 attention of each active query row over its sequence's pseudo-keys; inactive rows are
 * 0. With pr->fold, those rows (one token per sequence) collapsed by R: Y [B][H][d]. */
static void attention_reference(const problem *pr, double *ref);

static void reference(const void *p, double *ref)
{
    const problem *pr = p;
    if (!pr->fold) {
        attention_reference(pr, ref);
        return;
    }
    const iha_decode_dims *dd = &pr->dc.dd;
    const size_t H = dd->H, P = dd->P, d = dd->d, na = H * H * P;
    double *o = malloc(dd->B * H * P * d * sizeof *o);
    if (o == NULL) {
        for (size_t i = 0; i < dd->B * H * d; ++i) ref[i] = NAN;
        return;
    }
    attention_reference(pr, o);
    for (size_t b = 0; b < dd->B; ++b)
        for (size_t ho = 0; ho < H; ++ho)
            for (size_t c = 0; c < d; ++c) {
                double y = 0.0;
                for (size_t h = 0; h < H; ++h)
                    for (size_t p = 0; p < P; ++p)
                        y += (double)pr->ha[3 * na + (ho * H + h) * P + p] * o[((b * H + h) * P + p) * d + c];
                ref[(b * H + ho) * d + c] = y;
            }
    free(o);
}

static void attention_reference(const problem *pr, double *ref)
{
    const iha_decode_dims *dd = &pr->dc.dd;
    const long P = (long)dd->P, d = (long)dd->d, rows = (long)(dd->k * dd->P), W = (long)pr->window;
    const size_t T_most = pr->dc.slots * dd->P;
    double *s = malloc(T_most * sizeof *s), *kt = malloc(T_most * (size_t)d * sizeof *kt),
           *vt = malloc(T_most * (size_t)d * sizeof *vt);
    for (size_t bh = 0; s && kt && vt && bh < dd->B * dd->H; ++bh) {
        const size_t b = bh / dd->H, h = bh % dd->H;
        const cl_int *step = &pr->step[b == 0 ? 0 : 2];
        const long n0 = step[0], T = (n0 + step[1]) * P;
        for (long u = 0; u < T; ++u) pseudo_rows(pr, b, (size_t)(u / P), h, (size_t)(u % P), kt + u * d, vt + u * d);
        for (long r = 0; r < rows; ++r) {
            double *out = ref + (bh * (size_t)rows + (size_t)r) * (size_t)d;
            for (long c = 0; c < d; ++c) out[c] = 0.0;
            if (r >= step[1] * P) continue;
            const float *q = pr->hq + (bh * (size_t)rows + (size_t)r) * (size_t)d;
            const long t = n0 * P + r;
            double mx = -INFINITY, sum = 0.0;
            for (long u = 0; u < T; ++u) {
                if (!iha__tune_visible(t, u, P, pr->mask, W)) continue;
                double dot = 0.0;
                for (long c = 0; c < d; ++c) dot += (double)q[c] * kt[u * d + c];
                s[u] = dot * pr->scale;
                mx = s[u] > mx ? s[u] : mx;
            }
            for (long u = 0; u < T; ++u) {
                if (!iha__tune_visible(t, u, P, pr->mask, W)) continue;
                const double e = exp(s[u] - mx);
                sum += e;
                for (long c = 0; c < d; ++c) out[c] += e * vt[u * d + c];
            }
            for (long c = 0; c < d; ++c) out[c] /= sum;
        }
    }
    free(s), free(kt), free(vt);
}

static iha_status check(iha_context *ctx, void *p, const iha_tune_config *c, double *error)
{
    problem *pr = p;
    const iha_decode_dims *dd = &pr->dc.dd;
    pr->fold = configured_step(ctx, pr, c).fold;
    const size_t n = pr->fold ? dd->B * dd->H * dd->d : dd->B * dd->H * dd->k * dd->P * dd->d;
    return iha__tune_check_output(ctx, pr, c, enqueue, pr->o, n, reference, error);
}

/* Weight 0.5: a layer shape makes two tasks (float and half cache), together one share. */
const iha_tunable iha__tunable_decode_compact = {
    &space,       0.5,           bucket_of, builtin, safe,    NULL,  problem_create,
    problem_free, problem_bytes, NULL,      prepare, enqueue, check, NULL, NULL,
};
