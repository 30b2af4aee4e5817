/* The tuning space of mixing and collapse, the memory-bound kernels cl/mix.cl, cl/mix_keys.cl and
 * cl/collapse.cl, which share one iha_mix_collapse_config in a layer (profiles store it as the
 * kernel "rows", iha_tune's IHA_TUNE_ROWS): a candidate is timed on what a layer runs (mixing of
 * Q, K into the key-block layout and V, then the collapse) and checked on a small ragged problem
 * against float64 mixing (with rotary where d is even) and collapse, doc/spec.md steps 2, 3 and 5. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/collapse.h"
#include "kernels/rope.h"
#include "runtime/error.h"
#include "tune/buffers.h"
#include "tune/state.h"

enum { P_PER_ROW, P_VEC, P_GROUP };
enum { K_BYTES, K_D, K_P, K_H, K_N, K_COUNT };

static const iha_tune_param params[] = {
    {"per_row", 2, {0, 1}, NULL},
    {"vec", 3, {4, 8, 16}, NULL},
    {"group", 4, {1, 4, 16, 64}, NULL},
};

static const iha_tune_key keys[] = {{"elem_bytes", 1}, {"d", 0}, {"P", 0}, {"H", 0}, {"N", 0}};

static const iha_tune_space space = {
    "rows", params, 3, keys, K_COUNT, NULL, 0, NULL, {NULL}, {"group", NULL, NULL}, NULL, 0,
};

/* The key-block layout the timing problem mixes keys into: attention's default block. */
#define TIMING_KEY_BLOCK 16

void iha__tune_mix_collapse_config(const iha_tune_config *c, iha_mix_collapse_config *cfg)
{
    cfg->per_row = (int)c->v[P_PER_ROW];
    cfg->vec = (int)c->v[P_VEC];
    cfg->group = (size_t)c->v[P_GROUP];
}

static int bucket_of(const iha_context *ctx, const iha_shape *s, const iha_attention_options *o, iha_tune_bucket *b)
{
    (void)ctx, (void)o;
    b->count = K_COUNT;
    b->values[K_BYTES] = 4;
    b->values[K_D] = (long)s->head_dim;
    b->values[K_P] = (long)s->pseudo;
    b->values[K_H] = (long)s->heads;
    b->values[K_N] = iha__pow2_ceil((long)(s->batch * s->tokens));
    return 1;
}

static int builtin(const iha_context *ctx, const iha_tune_bucket *b, iha_tune_config *c)
{
    (void)b;
    iha_mix_collapse_config cfg;
    iha__mix_collapse_config_default(ctx, &cfg);
    memset(c, 0, sizeof *c);
    c->v[P_PER_ROW] = cfg.per_row;
    c->v[P_VEC] = cfg.vec;
    c->v[P_GROUP] = (long)cfg.group;
    return 1;
}

/* One element per work-item: no vectors, no work-group assumptions. */
static void safe(const iha_tune_bucket *b, iha_tune_config *c)
{
    (void)b;
    memset(c, 0, sizeof *c);
    c->v[P_PER_ROW] = 0;
    c->v[P_VEC] = 4;
    c->v[P_GROUP] = 16;
}

/* The element-per-work-item variants choose their own work-group: group does not matter. */
static void canonical(const void *p, iha_tune_config *c)
{
    (void)p;
    if (c->v[P_PER_ROW] == 0) c->v[P_GROUP] = 16;
}

/* ---- Problems ---- */

#define MAX_COPIES 8

typedef struct problem {
    iha_dims dims;
    int copies;
    cl_mem src[MAX_COPIES], o[MAX_COPIES];  /* [B][N][H][d] and [B][H][T][d] */
    cl_mem alpha, r;                        /* [H][H][P] */
    cl_mem qt, kt, y;                       /* outputs: rows, key blocks, [B][N][H][d] */
    cl_mem rope;                            /* owned by the context's workspace */
    float *hsrc, *ho, *halpha, *hr;         /* verification inputs */
} problem;

static void problem_free(void *p)
{
    problem *pr = p;
    if (pr == NULL) return;
    iha__tune_release(pr->src, MAX_COPIES);
    iha__tune_release(pr->o, MAX_COPIES);
    cl_mem m[5] = {pr->alpha, pr->r, pr->qt, pr->kt, pr->y};
    iha__tune_release(m, 5);
    free(pr->hsrc), free(pr->ho), free(pr->halpha), free(pr->hr);
    free(pr);
}

static size_t problem_bytes(const iha_shape *s, const iha_tune_bucket *b)
{
    (void)b;
    return (1 + s->pseudo) * s->batch * s->tokens * s->heads * s->head_dim * sizeof(float);
}

static iha_status make_buffers(iha_context *ctx, problem *pr, int verify)
{
    const iha_dims *d = &pr->dims;
    const size_t tok = d->B * d->N * d->H * d->d, virt = d->B * d->H * d->T * d->d, mix = d->H * d->H * d->P;
    const size_t packed = iha__packed_keys_elements(d, TIMING_KEY_BLOCK);
    iha_status st = IHA_OK;
    for (int i = 0; i < pr->copies && st == IHA_OK; ++i) {
        float *src = iha__tune_random(tok, 21 + 2 * (uint64_t)i), *o = iha__tune_random(virt, 22 + 2 * (uint64_t)i);
        if (src == NULL || o == NULL) st = iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
        if (st == IHA_OK) st = iha__tune_buffer(ctx, tok, src, &pr->src[i]);
        if (st == IHA_OK) st = iha__tune_buffer(ctx, virt, o, &pr->o[i]);
        if (st == IHA_OK && verify) {
            pr->hsrc = src, pr->ho = o;
        } else {
            free(src), free(o);
        }
    }
    float *alpha = iha__tune_random(mix, 31), *r = iha__tune_random(mix, 32);
    if (st == IHA_OK && (alpha == NULL || r == NULL)) st = iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    if (st == IHA_OK) st = iha__tune_buffer(ctx, mix, alpha, &pr->alpha);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, mix, r, &pr->r);
    if (st == IHA_OK && verify) {
        pr->halpha = alpha, pr->hr = r;
    } else {
        free(alpha), free(r);
    }
    if (st == IHA_OK) st = iha__tune_buffer(ctx, virt, NULL, &pr->qt);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, packed, NULL, &pr->kt);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, tok, NULL, &pr->y);
    return st;
}

/* Timing: the layer's own sizes (mixing needs every head). Verification: 7 tokens of 3 heads,
 * d and P of the bucket, so vectors and key blocks have ragged ends. */
static iha_status problem_create(iha_context *ctx, const iha_shape *s, const iha_attention_options *o,
                                 const iha_tune_bucket *b, iha_tune_purpose purpose, int copies, void **out)
{
    (void)o, (void)b;
    problem *pr = calloc(1, sizeof *pr);
    IHA_RETURN_ERROR_IF(pr == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    const int verify = purpose == IHA_TUNE_PROBLEM_VERIFY;
    const size_t B = verify ? 1 : s->batch, N = verify ? 7 : s->tokens, H = verify ? 3 : s->heads;
    pr->dims = (iha_dims){B, N, H, s->head_dim, s->pseudo, N * s->pseudo, NULL};
    pr->copies = iha__tune_copy_count(verify, copies, MAX_COPIES);
    iha_status st = make_buffers(ctx, pr, verify);
    if (st == IHA_OK && verify && s->head_dim % 2 == 0)
        st = iha__rope_table(ctx, 0, pr->dims.T, pr->dims.d, 10000.0f, &pr->rope);
    if (st != IHA_OK) {
        problem_free(pr);
        return st;
    }
    *out = pr;
    return IHA_OK;
}

static void config_of(const iha_context *ctx, const iha_tune_config *c, iha_mix_collapse_config *cfg)
{
    if (c == NULL)
        iha__mix_collapse_config_default(ctx, cfg);
    else
        iha__tune_mix_collapse_config(c, cfg);
}

/* Mixing of Q (rows, rotary in verification), K (key blocks), V (rows), then the collapse. */
static iha_status mix_and_collapse(iha_context *ctx, problem *pr, const iha_tune_config *c, int copy)
{
    iha_mix_collapse_config cfg;
    config_of(ctx, c, &cfg);
    const iha_buffer src = {pr->src[copy], 0}, alpha = {pr->alpha, 0};
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &cfg, &pr->dims, src, alpha, (iha_buffer){pr->qt, 0}, pr->rope, 0));
    IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &cfg, &pr->dims, src, alpha, (iha_buffer){pr->kt, 0}, NULL, TIMING_KEY_BLOCK));
    if (pr->rope == NULL)
        IHA_FORWARD_IF_ERROR(iha__mix_enqueue(ctx, &cfg, &pr->dims, src, alpha, (iha_buffer){pr->qt, 0}, NULL, 0));
    return iha__collapse_enqueue(ctx, &cfg, &pr->dims, (iha_buffer){pr->o[copy], 0}, (iha_buffer){pr->r, 0},
                                 (iha_buffer){pr->y, 0});
}

static iha_status enqueue(iha_context *ctx, void *p, const iha_tune_config *c, int copy)
{
    return mix_and_collapse(ctx, p, c, copy);
}

static iha_status prepare(iha_context *ctx, void *p, const iha_tune_config *c) { return mix_and_collapse(ctx, p, c, 0); }

/* Float64 mixing (+ rotary) into rows [H][T][d], the same for keys, and the collapse. */
static void reference(const problem *pr, double *qt, double *kt, double *y)
{
    const size_t N = pr->dims.N, H = pr->dims.H, d = pr->dims.d, P = pr->dims.P, T = pr->dims.T, half = d / 2;
    for (size_t h = 0; h < H; ++h)
        for (size_t t = 0; t < T; ++t) {
            const size_t n = t / P, p = t % P;
            double *row = kt + (h * T + t) * d;
            for (size_t c = 0; c < d; ++c) {
                double acc = 0.0;
                for (size_t m = 0; m < H; ++m) acc += (double)pr->halpha[(m * H + h) * P + p] * pr->hsrc[(n * H + m) * d + c];
                row[c] = acc;
            }
            double *q = qt + (h * T + t) * d;
            memcpy(q, row, d * sizeof *q);
            if (pr->rope == NULL) continue;
            for (size_t i = 0; i < half; ++i) {
                const double a = (double)t * pow(10000.0, -2.0 * (double)i / (double)d);
                q[i] = row[i] * cos(a) - row[i + half] * sin(a);
                q[i + half] = row[i + half] * cos(a) + row[i] * sin(a);
            }
        }
    for (size_t n = 0; n < N; ++n)
        for (size_t h = 0; h < H; ++h)
            for (size_t c = 0; c < d; ++c) {
                double acc = 0.0;
                for (size_t m = 0; m < H; ++m)
                    for (size_t p = 0; p < P; ++p)
                        acc += (double)pr->hr[(h * H + m) * P + p] * pr->ho[(m * T + n * P + p) * d + c];
                y[(n * H + h) * d + c] = acc;
            }
}

/* The key-block layout [H][ceil(T/16)][d][16] of rows [H][T][d] (padding rows are zero). */
static void pack(const iha_dims *dims, const double *rows, double *packed)
{
    const size_t kb = TIMING_KEY_BLOCK, blocks = (dims->T + kb - 1) / kb, d = dims->d;
    for (size_t h = 0; h < dims->H; ++h)
        for (size_t t = 0; t < blocks * kb; ++t)
            for (size_t c = 0; c < d; ++c)
                packed[((h * blocks + t / kb) * d + c) * kb + t % kb] = t < dims->T ? rows[(h * dims->T + t) * d + c] : 0.0;
}

static iha_status check(iha_context *ctx, void *p, const iha_tune_config *c, double *error)
{
    problem *pr = p;
    const size_t virt = pr->dims.H * pr->dims.T * pr->dims.d, tok = pr->dims.N * pr->dims.H * pr->dims.d;
    const size_t packed = iha__packed_keys_elements(&pr->dims, TIMING_KEY_BLOCK);
    float *out = malloc((virt + packed + tok) * sizeof *out);
    double *ref = calloc(2 * virt + packed + tok, sizeof *ref);
    iha_status st = out && ref ? IHA_OK : iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    if (st == IHA_OK) st = iha__tune_poison(ctx, pr->qt, virt);
    if (st == IHA_OK) st = iha__tune_poison(ctx, pr->kt, packed);
    if (st == IHA_OK) st = iha__tune_poison(ctx, pr->y, tok);
    if (st == IHA_OK) st = mix_and_collapse(ctx, pr, c, 0);
    if (st == IHA_OK) st = iha__tune_read(ctx, pr->qt, virt, out);
    if (st == IHA_OK) st = iha__tune_read(ctx, pr->kt, packed, out + virt);
    if (st == IHA_OK) st = iha__tune_read(ctx, pr->y, tok, out + virt + packed);
    if (st == IHA_OK) {
        double *qt = ref, *kt_rows = ref + virt, *kt = kt_rows + virt, *y = kt + packed;
        reference(pr, qt, kt_rows, y);
        pack(&pr->dims, kt_rows, kt);
        const double e[3] = {iha__tune_rel_error(out, qt, virt), iha__tune_rel_error(out + virt, kt, packed),
                             iha__tune_rel_error(out + virt + packed, y, tok)};
        *error = fmax(e[0], fmax(e[1], e[2]));
        if (isnan(*error)) *error = INFINITY;
    }
    free(out);
    free(ref);
    return st;
}

const iha_tunable iha__tunable_mix_collapse = {
    &space, 1.0, bucket_of, builtin, safe, NULL, problem_create, problem_free, problem_bytes, canonical,
    prepare, enqueue, check, NULL, NULL,
};
