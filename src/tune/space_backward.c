/* The tuning space of the attention backward (iha_backward_config): on CPUs the register tiles per
 * work-item of cl/attention_backward_tiles.cl, on GPUs each pass's local tiles of
 * cl/attention_backward_local.cl or its row kernel. Timing on the bucket's sequence length with
 * enough (b, h) rows to fill the device, from one forward's O and LSE; verification on a ragged
 * 2-head problem against a float64 backward of doc/spec.md ("The backward pass", attention). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/mix.h"
#include "runtime/error.h"
#include "tune/buffers.h"
#include "tune/state.h"

enum { P_KV_KEYS, P_KV_QUERIES, P_Q_ROWS, P_Q_KEYS, P_TILES };
enum { K_MASK, K_WINDOWED, K_BYTES, K_D, K_P, K_T, K_SPAN, K_COUNT };

static const iha_tune_param params[] = {
    {"kv_keys", 4, {0, 16, 32, 64}, NULL}, /* 0: the dK/dV row kernel */
    {"kv_queries", 3, {16, 32, 64}, NULL},
    {"q_rows", 4, {0, 16, 32, 64}, NULL}, /* 0: the dQ row kernel */
    {"q_keys", 3, {16, 32, 64}, NULL},
    {"tiles", 3, {4, 8, 16}, NULL},
};

/* The forward's buckets (space_attention.c), whose bucket_of makes them: span is the keys a
 * query can see; elem_bytes is 4, the backward running in float whatever the storage. */
static const iha_tune_key keys[] = {
    {"mask", 1}, {"windowed", 1}, {"elem_bytes", 1}, {"d", 0}, {"P", 0}, {"T", 0}, {"span", 0},
};

/* A pass's local tile: its work-items and accumulator columns (attention_backward_local.c). */
static int pass_fits(const long *v)
{
    return v[0] == 0 || iha__backward_tile_shape_fits((size_t)v[2], (int)v[0], (int)v[1], (size_t)v[3]);
}

/* The tile kernel keeps four arrays of 4 * tiles rows of d floats per work-item: at most the
 * built-in's 64 rows at the widest head the layer takes (256). */
static int tiles_fit(const long *v) { return 4 * v[0] * v[1] <= 64 * 256; }

static const iha_tune_constraint constraints[] = {
    {pass_fits, {"kv_keys", "kv_queries", "d", "max_group"},
     "the dK/dV tile's work-items or accumulator columns exceed the device's work-group or registers"},
    {pass_fits, {"q_rows", "q_keys", "d", "max_group"},
     "the dQ tile's work-items or accumulator columns exceed the device's work-group or registers"},
    {tiles_fit, {"tiles", "d", NULL, NULL}, "4 * tiles rows of d floats exceed the tile kernel's private memory"},
};

/* The passes run one after the other: the larger of their tiles. */
static long local_bytes(const long *v)
{
    const long kv = v[0] ? (long)iha__backward_kv_local_bytes((size_t)v[4], (int)v[0], (int)v[1]) : 0;
    const long q = v[2] ? (long)iha__backward_q_local_bytes((size_t)v[4], (int)v[2], (int)v[3]) : 0;
    return kv > q ? kv : q;
}

static const iha_tune_space space = {
    "backward", params, 5, keys, K_COUNT, constraints, 3, local_bytes,
    {"kv_keys", "kv_queries", "q_rows", "q_keys", "d", NULL}, {NULL, NULL, NULL}, NULL, 0,
};

void iha__tune_backward_config(const iha_tune_config *c, iha_backward_config *cfg)
{
    cfg->kv_keys = (int)c->v[P_KV_KEYS];
    cfg->kv_queries = (int)c->v[P_KV_QUERIES];
    cfg->q_rows = (int)c->v[P_Q_ROWS];
    cfg->q_keys = (int)c->v[P_Q_KEYS];
    cfg->tiles = (int)c->v[P_TILES];
}

/* A row pass's tile fields take one value, so that configurations that run the same kernels
 * compare equal. */
static void from_kernel_config(const iha_backward_config *cfg, iha_tune_config *c)
{
    memset(c, 0, sizeof *c);
    c->v[P_KV_KEYS] = cfg->kv_keys;
    c->v[P_KV_QUERIES] = cfg->kv_keys ? cfg->kv_queries : 32;
    c->v[P_Q_ROWS] = cfg->q_rows;
    c->v[P_Q_KEYS] = cfg->q_rows ? cfg->q_keys : 32;
    c->v[P_TILES] = cfg->tiles;
}

/* The window the kernels see: a window covering the sequence is global (plan.c's rule). */
static size_t effective_window(const iha_shape *s, const iha_attention_options *o)
{
    return o->window <= 0 || (uint64_t)o->window >= s->tokens ? 0 : (size_t)o->window;
}

/* elem_bytes 4 whatever the storage: the backward runs in float. */
static int bucket_of(const iha_context *ctx, const iha_shape *s, const iha_attention_options *o, iha_tune_bucket *b)
{
    const int used = iha__tunable_attention.bucket_of(ctx, s, o, b);
    b->values[K_BYTES] = 4;
    return used;
}

static int builtin(const iha_context *ctx, const iha_tune_bucket *b, iha_tune_config *c)
{
    iha_backward_config cfg;
    iha__attention_backward_config_default(ctx, (size_t)b->values[K_D], &cfg);
    from_kernel_config(&cfg, c);
    return 1;
}

/* The row kernels: no local memory, one work-item per row. */
static void safe(const iha_tune_bucket *b, iha_tune_config *c)
{
    const iha_backward_config cfg = {0, 32, 0, 32, iha__backward_tiles_default((size_t)b->values[K_D])};
    from_kernel_config(&cfg, c);
}

/* ---- Problems ---- */

#define MAX_COPIES 4
enum { IN_Q, IN_K, IN_V, IN_O, IN_LSE, IN_DO, INPUTS };
enum { OUT_DQ, OUT_DK, OUT_DV, OUTPUTS };

typedef struct problem {
    iha_dims dims;
    int mask;
    size_t window;
    float scale;
    int tiled; /* the device runs the tile kernel (CPUs): only `tiles` matters */
    int copies;
    cl_mem in[MAX_COPIES][INPUTS];
    cl_mem out[OUTPUTS], delta, packed[2], partial;
    float *host[INPUTS]; /* verification inputs: q, k, v and dO (o and lse are the device's) */
} problem;

/* Parameters the device's kernels do not read take one value. */
static void canonical(const void *p, iha_tune_config *c)
{
    const problem *pr = p;
    iha_backward_config cfg;
    iha__tune_backward_config(c, &cfg);
    if (pr->tiled) {
        cfg.kv_keys = cfg.q_rows = 0;
    } else {
        cfg.tiles = iha__backward_tiles_default(pr->dims.d);
    }
    from_kernel_config(&cfg, c);
}

static void problem_free(void *p)
{
    problem *pr = p;
    if (pr == NULL) return;
    for (int i = 0; i < MAX_COPIES; ++i) iha__tune_release(pr->in[i], INPUTS);
    iha__tune_release(pr->out, OUTPUTS);
    cl_mem m[4] = {pr->delta, pr->packed[0], pr->packed[1], pr->partial};
    iha__tune_release(m, 4);
    for (int i = 0; i < INPUTS; ++i) free(pr->host[i]);
    free(pr);
}

static size_t problem_bytes(const iha_shape *s, const iha_tune_bucket *b)
{
    (void)b;
    return 6 * s->tokens * s->pseudo * s->head_dim * sizeof(float) * 2;
}

/* One copy's inputs: random Q, K, V and dO, then O and LSE from the built-in forward. */
static iha_status make_copy(iha_context *ctx, problem *pr, int i, int verify)
{
    const iha_dims *d = &pr->dims;
    const size_t n = d->H * d->T * d->d;
    static const int randoms[4] = {IN_Q, IN_K, IN_V, IN_DO};
    iha_status st = IHA_OK;
    for (int j = 0; j < 4 && st == IHA_OK; ++j) {
        float *h = iha__tune_random(n, 41 + 5 * (uint64_t)i + (uint64_t)j);
        st = h ? iha__tune_buffer(ctx, n, h, &pr->in[i][randoms[j]]) : iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
        if (st == IHA_OK && verify)
            pr->host[randoms[j]] = h;
        else
            free(h);
    }
    if (st == IHA_OK) st = iha__tune_buffer(ctx, n, NULL, &pr->in[i][IN_O]);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, d->H * d->T, NULL, &pr->in[i][IN_LSE]);
    iha_attention_config acfg;
    iha__attention_config_default(ctx, d->d, &acfg);
    cl_mem packed = NULL;
    if (st == IHA_OK) st = iha__tune_buffer(ctx, iha__packed_keys_elements(d, acfg.key_block), NULL, &packed);
    if (st == IHA_OK)
        st = iha__pack_keys_enqueue(ctx, d, (iha_buffer){pr->in[i][IN_K], 0}, (iha_buffer){packed, 0}, acfg.key_block);
    if (st == IHA_OK)
        st = iha__attention_enqueue(ctx, &acfg, d, (iha_buffer){pr->in[i][IN_Q], 0}, (iha_buffer){packed, 0},
                                    (iha_buffer){pr->in[i][IN_V], 0}, (iha_buffer){pr->in[i][IN_O], 0},
                                    (iha_buffer){pr->in[i][IN_LSE], 0}, pr->mask, pr->window, pr->scale);
    if (st == IHA_OK) {
        const cl_int err = clFinish(ctx->queue);
        if (err != CL_SUCCESS) st = iha__fail_cl(ctx, err, "clFinish");
    }
    iha__tune_release(&packed, 1);
    return st;
}

/* The outputs and the workspace iha_attention_backward would allocate for this device. */
static iha_status make_outputs(iha_context *ctx, problem *pr)
{
    const iha_dims *d = &pr->dims;
    const size_t n = d->H * d->T * d->d;
    iha_status st = IHA_OK;
    for (int j = 0; j < OUTPUTS && st == IHA_OK; ++j) st = iha__tune_buffer(ctx, n, NULL, &pr->out[j]);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, d->H * d->T, NULL, &pr->delta);
    if (st != IHA_OK || !pr->tiled) return st;
    size_t sums = 0;
    IHA_RETURN_ERROR_IF(!iha__attention_backward_partial_elements(ctx, d, &sums), ctx, IHA_ERROR_SIZE_OVERFLOW,
                        "the backward's partial sums overflow size_t");
    for (int j = 0; j < 2 && st == IHA_OK; ++j)
        st = iha__tune_buffer(ctx, iha__packed_keys_elements(d, 16), NULL, &pr->packed[j]);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, sums, NULL, &pr->partial);
    return st;
}

/* Timing: the bucket's T, d, P and mask with B*H cut to one (b, h) per compute unit (at least 2).
 * Verification: 2 heads of 13 tokens, so that tiles have ragged ends, and a window of 3 tokens. */
static iha_status problem_create(iha_context *ctx, const iha_shape *s, const iha_attention_options *o,
                                 const iha_tune_bucket *b, iha_tune_purpose purpose, int copies, void **out)
{
    (void)b;
    problem *pr = calloc(1, sizeof *pr);
    IHA_RETURN_ERROR_IF(pr == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    const int verify = purpose == IHA_TUNE_PROBLEM_VERIFY;
    size_t bh = s->batch * s->heads, fill = (size_t)ctx->info.compute_units;
    if (fill < 2) fill = 2;
    const size_t N = verify ? 13 : s->tokens, P = s->pseudo, d = s->head_dim;
    pr->dims = (iha_dims){1, N, verify ? 2 : (bh < fill ? bh : fill), d, P, N * P, NULL};
    pr->mask = o->mask;
    pr->window = effective_window(s, o) ? (verify ? 3 : effective_window(s, o)) : 0;
    pr->scale = (float)(1.0 / sqrt((double)d));
    pr->tiled = iha__attention_backward_tiled(ctx, d);
    pr->copies = iha__tune_copy_count(verify, copies, MAX_COPIES);
    iha_status st = IHA_OK;
    for (int i = 0; i < pr->copies && st == IHA_OK; ++i) st = make_copy(ctx, pr, i, verify);
    if (st == IHA_OK) st = make_outputs(ctx, pr);
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
    iha_backward_config cfg;
    if (c != NULL) iha__tune_backward_config(c, &cfg);
    cl_mem *in = pr->in[copy];
    const iha_backward_refs r = {
        {in[IN_Q], 0},         {in[IN_K], 0},         {in[IN_V], 0},         {in[IN_O], 0},
        {in[IN_LSE], 0},       {in[IN_DO], 0},        {pr->out[OUT_DQ], 0},  {pr->out[OUT_DK], 0},
        {pr->out[OUT_DV], 0},  pr->delta,             {pr->packed[0], pr->packed[1]}, pr->partial,
    };
    return iha__attention_backward_enqueue(ctx, &pr->dims, &r, c ? &cfg : NULL, pr->mask, pr->window, pr->scale);
}

/* One launch builds the programs and, on PoCL, the machine code for their work-group sizes. */
static iha_status prepare(iha_context *ctx, void *p, const iha_tune_config *c) { return enqueue(ctx, p, c, 0); }

/* Float64 gradients of one head's attention (rows [T][d]) into dq, dk, dv (zeroed here); p is
 * scratch of T doubles. A row that sees no key adds nothing. */
static void reference_head(const problem *pr, const float *q, const float *k, const float *v, const float *dout,
                           double *p, double *dq, double *dk, double *dv)
{
    const long T = (long)pr->dims.T, d = (long)pr->dims.d, P = (long)pr->dims.P, W = (long)pr->window;
    const double scale = (double)pr->scale;
    memset(dq, 0, (size_t)(T * d) * sizeof *dq);
    memset(dk, 0, (size_t)(T * d) * sizeof *dk);
    memset(dv, 0, (size_t)(T * d) * sizeof *dv);
    for (long t = 0; t < T; ++t) {
        double mx = -INFINITY, sum = 0.0;
        for (long u = 0; u < T; ++u) {
            p[u] = -INFINITY;
            if (!iha__tune_visible(t, u, P, pr->mask, W)) continue;
            double dot = 0.0;
            for (long c = 0; c < d; ++c) dot += (double)q[t * d + c] * k[u * d + c];
            p[u] = dot * scale;
            mx = p[u] > mx ? p[u] : mx;
        }
        if (mx == -INFINITY) continue;
        for (long u = 0; u < T; ++u) {
            p[u] = p[u] == -INFINITY ? 0.0 : exp(p[u] - mx);
            sum += p[u];
        }
        /* Dt = dO . O with O = sum_u p[u] v[u]. */
        double dt = 0.0;
        for (long c = 0; c < d; ++c) {
            double o = 0.0;
            for (long u = 0; u < T; ++u) o += p[u] * v[u * d + c];
            dt += (double)dout[t * d + c] * (o / sum);
        }
        for (long u = 0; u < T; ++u) {
            if (p[u] == 0.0) continue;
            const double pu = p[u] / sum;
            double dp = 0.0;
            for (long c = 0; c < d; ++c) dp += (double)dout[t * d + c] * v[u * d + c];
            const double ds = pu * (dp - dt) * scale;
            for (long c = 0; c < d; ++c) {
                dq[t * d + c] += ds * k[u * d + c];
                dk[u * d + c] += ds * q[t * d + c];
                dv[u * d + c] += pu * dout[t * d + c];
            }
        }
    }
}

static iha_status check(iha_context *ctx, void *p, const iha_tune_config *c, double *error)
{
    problem *pr = p;
    const size_t head = pr->dims.T * pr->dims.d, n = pr->dims.H * head;
    float *out = malloc(OUTPUTS * n * sizeof *out);
    double *ref = malloc((OUTPUTS * n + pr->dims.T) * sizeof *ref);
    iha_status st = out && ref ? IHA_OK : iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    for (int j = 0; j < OUTPUTS && st == IHA_OK; ++j) st = iha__tune_poison(ctx, pr->out[j], n);
    if (st == IHA_OK) st = enqueue(ctx, pr, c, 0);
    for (int j = 0; j < OUTPUTS && st == IHA_OK; ++j) st = iha__tune_read(ctx, pr->out[j], n, out + j * n);
    if (st == IHA_OK) {
        double *scratch = ref + OUTPUTS * n;
        for (size_t h = 0; h < pr->dims.H; ++h)
            reference_head(pr, pr->host[IN_Q] + h * head, pr->host[IN_K] + h * head, pr->host[IN_V] + h * head,
                           pr->host[IN_DO] + h * head, scratch, ref + h * head, ref + n + h * head,
                           ref + 2 * n + h * head);
        *error = 0.0;
        for (int j = 0; j < OUTPUTS; ++j) *error = fmax(*error, iha__tune_rel_error(out + j * n, ref + j * n, n));
        if (isnan(*error)) *error = INFINITY;
    }
    free(out);
    free(ref);
    return st;
}

const iha_tunable iha__tunable_backward = {
    &space, 2.0, bucket_of, builtin, safe, NULL, problem_create, problem_free, problem_bytes, canonical,
    prepare, enqueue, check, NULL, NULL,
};
