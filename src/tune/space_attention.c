/* The tuning space of cl/attention.cl (iha_attention_config) and its problems: timing on the
 * bucket's sequence length with enough (b, h) rows to fill the device, verification on a
 * ragged 2-head problem against a float64 attention of doc/spec.md step 4. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/mix.h"
#include "runtime/error.h"
#include "tune/buffers.h"
#include "tune/search.h"
#include "tune/state.h"

enum { P_ROWS, P_TILES, P_KB, P_VD, P_GROUP, P_VARIANT, P_LOC_KEYS, P_PREFETCH, P_TILE_RY, P_TILE_RX };
enum { K_MASK, K_WINDOWED, K_BYTES, K_D, K_P, K_T, K_SPAN, K_COUNT };

static const iha_tune_param params[] = {
    {"ATT_ROWS", 4, {1, 2, 4, 8}, NULL},
    {"ATT_TILES", 4, {1, 2, 4, 8}, NULL},
    {"ATT_KB", 3, {4, 8, 16}, NULL},
    {"ATT_VD", 3, {4, 8, 16}, NULL},
    {"group", 5, {1, 16, 32, 64, 128}, NULL},
    /* 0: register tiles (attention.cl), 1: local memory, a row per work-item (attention_local.cl),
     * 2: local memory with register sub-tiles (attention_local_tiles.cl), 3 and 4: NVIDIA's
     * tensor cores on half and bfloat16 inputs (attention_mma_nv.cl) */
    {"variant", 5, {0, 1, 2, 3, 4}, NULL},
    {"LOC_KEYS", 3, {16, 32, 64}, NULL},
    {"ATT_PREFETCH", 2, {0, 1}, NULL}, /* register tiles: prefetch the next key block's values */
    {"TILE_RY", 2, {4, 8}, NULL}, /* local tiles: query rows of a work-item's score sub-tile */
    {"TILE_RX", 2, {4, 8}, NULL}, /* local tiles: keys of a work-item's score sub-tile */
};

/* Profiles of format_version 1 have no sub-tile shape: every entry of theirs ran 4 x 4. */
static const iha_tune_param_added added[] = {{"TILE_RY", 2, 4}, {"TILE_RX", 2, 4}};

/* Kind keys must match; the rest are compared on a log2 scale. span is the number of keys a
 * query can see: T for global attention, W*P with a window. */
static const iha_tune_key keys[] = {
    {"mask", 1}, {"windowed", 1}, {"elem_bytes", 1}, {"d", 0}, {"P", 0}, {"T", 0}, {"span", 0},
};

/* Private state per work-item: queries and accumulators of ROWS*TILES rows of d floats each,
 * at most 32 KiB of each (32 rows at d = 128). On PoCL that state lives on the stack and
 * 4 x 8 tiles at d = 128 compile to the same 256-bit code as 4 x 4; a configuration this
 * constraint refuses runs the safe fallback instead. Devices
 * that keep private memory in registers are steered by measurement, like any other candidate. */
static int tile_fits(const long *v) { return v[0] * v[1] <= 32 && v[0] * v[1] * v[2] <= 4096; }
/* A vector wider than the head wastes its lanes. */
static int vector_fits_head(const long *v) { return v[0] <= (iha__pow2_ceil(v[1]) > 4 ? iha__pow2_ceil(v[1]) : 4); }

/* The local tile holds whole key blocks. */
static int local_tile_whole_blocks(const long *v) { return v[0] == IHA_ATTENTION_REGISTER_TILES || v[1] % v[2] == 0; }
/* The local tiles: `group` query rows (TILE_RY per work-item) and LOC_KEYS keys (TILE_RX per
 * work-item) make group/TILE_RY x LOC_KEYS/TILE_RX work-items, at most the device's. */
static iha_attention_tiles tiles_of(const long *v)
{
    return (iha_attention_tiles){(int)v[1], (int)v[2], (int)v[3], (int)v[4]};
}
static int tiles_group_fits(const long *v)
{
    if (v[0] != IHA_ATTENTION_LOCAL_TILES) return 1;
    const iha_attention_tiles t = tiles_of(v);
    return t.rows % t.tile_ry == 0 && t.keys % t.tile_rx == 0 && (long)iha__attention_tiles_threads(&t) <= v[5];
}
/* The register budget: a work-item's sub-tile scores, output columns and row state. What
 * spills past it goes to memory that is slower than local memory, so the tiles would lose what
 * they gain. */
static int tiles_registers_fit(const long *v)
{
    if (v[0] != IHA_ATTENTION_LOCAL_TILES) return 1;
    const iha_attention_tiles t = tiles_of(v);
    return iha__attention_tiles_live_floats((size_t)v[5], &t) <= IHA_ATTENTION_TILES_REGISTER_FLOATS;
}

/* The tensor cores: only where the context offers them (NVIDIA, compute capability 8.0), and
 * only for 16-bit storage, whose contract allows inputs rounded to 16 bits (doc/spec.md); a
 * float-storage call never gets them. */
static int is_mma(long variant) { return variant == IHA_ATTENTION_MMA_F16 || variant == IHA_ATTENTION_MMA_BF16; }
static int mma_offered(const long *v) { return !is_mma(v[0]) || (v[1] != 0 && v[2] == 2); }
/* 16 query rows per warp, two work-items per row, key tiles of whole k steps. */
static int mma_shape(const long *v)
{
    return !is_mma(v[0]) || (v[1] >= 16 && v[2] % 16 == 0 && 2 * v[1] <= v[3]);
}
/* Query fragments, accumulators and scores in registers: past the budget they spill. */
static int mma_registers_fit(const long *v)
{
    return !is_mma(v[0]) || iha__attention_mma_live_words((size_t)v[2], (int)v[1]) <= IHA_ATTENTION_MMA_REGISTER_WORDS;
}

static const iha_tune_constraint constraints[] = {
    {tile_fits, {"ATT_ROWS", "ATT_TILES", "d", NULL}, "ATT_ROWS*ATT_TILES rows of d floats exceed private memory"},
    {vector_fits_head, {"ATT_VD", "d", NULL, NULL}, "ATT_VD is wider than the head"},
    {local_tile_whole_blocks, {"variant", "LOC_KEYS", "ATT_KB", NULL}, "LOC_KEYS is not a multiple of ATT_KB"},
    {tiles_group_fits, {"variant", "group", "LOC_KEYS", "TILE_RY", "TILE_RX", "max_group"},
     "the local tiles' group is not a multiple of TILE_RY, or their group/TILE_RY x LOC_KEYS/TILE_RX work-items "
     "exceed the device's work-group"},
    {tiles_registers_fit, {"variant", "group", "LOC_KEYS", "TILE_RY", "TILE_RX", "d"},
     "the local tiles' sub-tile, output columns and row state exceed the register budget"},
    {mma_offered, {"variant", "mma", "elem_bytes", NULL},
     "the tensor cores are not offered on this device, or the storage is not 16-bit"},
    {mma_shape, {"variant", "group", "LOC_KEYS", "max_group"},
     "the tensor cores' group is not 16 rows per warp within the device's work-group, or LOC_KEYS is not whole k steps"},
    {mma_registers_fit, {"variant", "LOC_KEYS", "d", NULL},
     "the tensor cores' fragments and accumulators exceed the register budget"},
};

/* The local rows stage LOC_KEYS keys and values of d floats each; the local tiles also the query
 * tile, the probabilities and their reductions (iha__attention_tiles_bytes). */
static long local_bytes(const long *v)
{
    if (v[0] == IHA_ATTENTION_LOCAL_ROWS) return 2 * v[1] * v[2] * (long)sizeof(float);
    if (v[0] == IHA_ATTENTION_LOCAL_TILES) {
        const iha_attention_tiles t = {(int)v[3], (int)v[1], (int)v[4], (int)v[5]};
        return (long)iha__attention_tiles_bytes((size_t)v[2], &t);
    }
    if (is_mma(v[0])) return (long)iha__attention_mma_bytes((size_t)v[2], (int)v[1], 0, (int)v[3]);
    return 0;
}

static const iha_tune_space space = {
    "attention", params, 10, keys, K_COUNT, constraints, 8, local_bytes,
    {"variant", "LOC_KEYS", "d", "group", "TILE_RY", "TILE_RX"},
    {"group", NULL, NULL}, added, 2,
};

void iha__tune_attention_config(const iha_tune_config *c, iha_attention_config *cfg)
{
    cfg->rows = (int)c->v[P_ROWS];
    cfg->tiles = (int)c->v[P_TILES];
    cfg->key_block = (int)c->v[P_KB];
    cfg->vec = (int)c->v[P_VD];
    cfg->group = (size_t)c->v[P_GROUP];
    cfg->variant = (iha_attention_variant)c->v[P_VARIANT];
    cfg->local_keys = (int)c->v[P_LOC_KEYS];
    cfg->prefetch = (int)c->v[P_PREFETCH];
    cfg->tile_ry = (int)c->v[P_TILE_RY];
    cfg->tile_rx = (int)c->v[P_TILE_RX];
}

static void from_kernel_config(const iha_attention_config *cfg, iha_tune_config *c)
{
    memset(c, 0, sizeof *c);
    c->v[P_ROWS] = cfg->rows;
    c->v[P_TILES] = cfg->tiles;
    c->v[P_KB] = cfg->key_block;
    c->v[P_VD] = cfg->vec;
    c->v[P_GROUP] = (long)cfg->group;
    c->v[P_VARIANT] = cfg->variant;
    c->v[P_LOC_KEYS] = cfg->local_keys;
    c->v[P_PREFETCH] = cfg->prefetch;
    c->v[P_TILE_RY] = cfg->tile_ry;
    c->v[P_TILE_RX] = cfg->tile_rx;
}

/* Parameters a variant does not read take one value, so that equal kernels are timed once. */
static void canonical(const void *problem, iha_tune_config *c)
{
    (void)problem;
    if (c->v[P_VARIANT] != IHA_ATTENTION_LOCAL_TILES) {
        c->v[P_TILE_RY] = 4;
        c->v[P_TILE_RX] = 4;
    }
    if (c->v[P_VARIANT] == IHA_ATTENTION_REGISTER_TILES) {
        c->v[P_LOC_KEYS] = 32;
    } else {
        c->v[P_ROWS] = 1;
        c->v[P_TILES] = 1;
        c->v[P_VD] = 4;
        c->v[P_PREFETCH] = 0;
    }
}

/* The window the kernels see: a window covering the sequence is global (plan.c's rule). */
static size_t effective_window(const iha_shape *s, const iha_attention_options *o)
{
    return o->window <= 0 || (uint64_t)o->window >= s->tokens ? 0 : (size_t)o->window;
}

static int bucket_of(const iha_context *ctx, const iha_shape *s, const iha_attention_options *o, iha_tune_bucket *b)
{
    (void)ctx;
    const size_t T = s->tokens * s->pseudo, w = effective_window(s, o);
    const size_t span = w ? (w * s->pseudo < T ? w * s->pseudo : T) : T;
    b->count = K_COUNT;
    b->values[K_MASK] = o->mask;
    b->values[K_WINDOWED] = w != 0;
    b->values[K_BYTES] = o->storage == IHA_STORAGE_F16 || o->storage == IHA_STORAGE_BF16 ? 2 : 4;
    b->values[K_D] = (long)s->head_dim;
    b->values[K_P] = (long)s->pseudo;
    b->values[K_T] = iha__pow2_ceil((long)T);
    b->values[K_SPAN] = iha__pow2_ceil((long)span);
    return 1;
}

static int builtin(const iha_context *ctx, const iha_tune_bucket *b, iha_tune_config *c)
{
    iha_attention_config cfg;
    iha__attention_config_default(ctx, (size_t)b->values[K_D], &cfg);
    from_kernel_config(&cfg, c);
    return 1;
}

/* Where the tensor cores may serve the bucket, a start among them: one parameter from a float
 * configuration they are not always reachable (group 1 or LOC_KEYS that is not whole k steps),
 * and the search would not meet them. 4 and 8 warps with 64-key tiles, 4 warps with 32; the
 * space's constraints pass over those that do not fit. */
static int seeds(const iha_context *ctx, const iha_tune_bucket *b, iha_tune_config *out, int capacity)
{
    static const int shapes[][2] = {{64, 64}, {128, 64}, {64, 32}};
    if (ctx->mma == IHA_MMA_NONE || b->values[K_BYTES] != 2) return 0;
    int n = 0;
    for (; n < capacity && n < 3; ++n) {
        const iha_attention_config cfg = {.rows = 1, .tiles = 1, .key_block = 16, .vec = 4, .group = (size_t)shapes[n][0],
                                          .variant = IHA_ATTENTION_MMA_F16, .local_keys = shapes[n][1], .prefetch = 0,
                                          .tile_ry = 4, .tile_rx = 4};
        from_kernel_config(&cfg, &out[n]);
    }
    return n;
}

static void safe(const iha_tune_bucket *b, iha_tune_config *c)
{
    (void)b;
    const iha_attention_config cfg = {.rows = 1, .tiles = 1, .key_block = 4, .vec = 4, .group = 1,
                                      .variant = IHA_ATTENTION_REGISTER_TILES, .local_keys = 32, .prefetch = 0,
                                      .tile_ry = 4, .tile_rx = 4};
    from_kernel_config(&cfg, c);
}

/* ---- Problems ---- */

#define MAX_COPIES 8

typedef struct problem {
    iha_dims dims;
    int mask;
    size_t window;
    float scale;
    int copies;
    cl_mem qt[MAX_COPIES], kt[MAX_COPIES], vt[MAX_COPIES], o[MAX_COPIES];
    cl_mem packed[MAX_COPIES][3]; /* per key block 4, 8, 16, packed on first use */
    float *hq, *hk, *hv;          /* verification inputs on the host */
} problem;

static int kb_slot(long kb) { return kb == 4 ? 0 : kb == 8 ? 1 : 2; }

static void problem_free(void *p)
{
    problem *pr = p;
    if (pr == NULL) return;
    for (int i = 0; i < MAX_COPIES; ++i) {
        cl_mem m[4] = {pr->qt[i], pr->kt[i], pr->vt[i], pr->o[i]};
        iha__tune_release(m, 4);
        iha__tune_release(pr->packed[i], 3);
    }
    free(pr->hq);
    free(pr->hk);
    free(pr->hv);
    free(pr);
}

static size_t problem_bytes(const iha_shape *s, const iha_tune_bucket *b)
{
    (void)b;
    return 5 * s->tokens * s->pseudo * s->head_dim * sizeof(float) * 2;
}

/* Timing: the bucket's T, d, P and mask with B*H cut to one (b, h) per compute unit (at least 2),
 * so that a candidate costs a fraction of a layer. Verification: 2 heads of 13
 * tokens, so that every tile and key block has a ragged end, and a window of 3 tokens. */
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
    pr->copies = iha__tune_copy_count(verify, copies, MAX_COPIES);
    const size_t n = pr->dims.H * pr->dims.T * d;
    iha_status st = IHA_OK;
    for (int i = 0; i < pr->copies && st == IHA_OK; ++i) {
        float *q = iha__tune_random(n, 11 + 3 * (uint64_t)i), *k = iha__tune_random(n, 12 + 3 * (uint64_t)i),
              *v = iha__tune_random(n, 13 + 3 * (uint64_t)i);
        if (q == NULL || k == NULL || v == NULL) st = iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
        if (st == IHA_OK) st = iha__tune_buffer(ctx, n, q, &pr->qt[i]);
        if (st == IHA_OK) st = iha__tune_buffer(ctx, n, k, &pr->kt[i]);
        if (st == IHA_OK) st = iha__tune_buffer(ctx, n, v, &pr->vt[i]);
        if (st == IHA_OK) st = iha__tune_buffer(ctx, n, NULL, &pr->o[i]);
        if (st == IHA_OK && verify) {
            pr->hq = q, pr->hk = k, pr->hv = v;
        } else {
            free(q), free(k), free(v);
        }
    }
    if (st != IHA_OK) {
        problem_free(pr);
        return st;
    }
    *out = pr;
    return IHA_OK;
}

static iha_status packed_keys(iha_context *ctx, problem *pr, int copy, long kb, cl_mem *out)
{
    cl_mem *slot = &pr->packed[copy][kb_slot(kb)];
    if (*slot == NULL) {
        const size_t n = iha__packed_keys_elements(&pr->dims, (int)kb);
        IHA_FORWARD_IF_ERROR(iha__tune_buffer(ctx, n, NULL, slot));
        IHA_FORWARD_IF_ERROR(iha__pack_keys_enqueue(ctx, &pr->dims, (iha_buffer){pr->kt[copy], 0}, (iha_buffer){*slot, 0}, (int)kb));
    }
    *out = *slot;
    return IHA_OK;
}

/* A configuration, or the kernel module's default for NULL. */
static void config_of(const iha_context *ctx, const problem *pr, const iha_tune_config *c, iha_attention_config *cfg)
{
    if (c == NULL)
        iha__attention_config_default(ctx, pr->dims.d, cfg);
    else
        iha__tune_attention_config(c, cfg);
}

static iha_status enqueue(iha_context *ctx, void *p, const iha_tune_config *c, int copy)
{
    problem *pr = p;
    iha_attention_config cfg;
    config_of(ctx, pr, c, &cfg);
    cl_mem packed;
    IHA_FORWARD_IF_ERROR(packed_keys(ctx, pr, copy, cfg.key_block, &packed));
    return iha__attention_enqueue(ctx, &cfg, &pr->dims, (iha_buffer){pr->qt[copy], 0}, (iha_buffer){packed, 0},
                                  (iha_buffer){pr->vt[copy], 0}, (iha_buffer){pr->o[copy], 0}, (iha_buffer){NULL, 0}, pr->mask,
                                  pr->window, pr->scale);
}

static iha_status prepare(iha_context *ctx, void *p, const iha_tune_config *c)
{
    problem *pr = p;
    iha_attention_config cfg;
    config_of(ctx, pr, c, &cfg);
    for (int i = 0; i < pr->copies; ++i) {
        cl_mem packed;
        IHA_FORWARD_IF_ERROR(packed_keys(ctx, pr, i, cfg.key_block, &packed));
    }
    /* One launch builds the program and, on PoCL, the machine code for this work-group size. */
    IHA_FORWARD_IF_ERROR(enqueue(ctx, pr, c, 0));
    /* A tensor-core program the driver refused ran the built-in instead: not this candidate. */
    IHA_RETURN_ERROR_IF(is_mma(cfg.variant) && ctx->mma == IHA_MMA_NONE, ctx, IHA_ERROR_UNSUPPORTED,
                        "the driver does not build the tensor-core attention");
    return IHA_OK;
}

static void reference(const void *p, double *ref)
{
    const problem *pr = p;
    const long T = (long)pr->dims.T, d = (long)pr->dims.d, P = (long)pr->dims.P, W = (long)pr->window;
    double *s = malloc((size_t)T * sizeof *s);
    if (s == NULL) return;
    for (size_t h = 0; h < pr->dims.H; ++h) {
        const float *q = pr->hq + h * (size_t)(T * d), *k = pr->hk + h * (size_t)(T * d), *v = pr->hv + h * (size_t)(T * d);
        for (long t = 0; t < T; ++t)
            iha__tune_reference_row(q + t * d, k, v, t, T, d, P, pr->mask, W, (double)pr->scale, s,
                                    ref + (h * (size_t)T + (size_t)t) * (size_t)d);
    }
    free(s);
}

/* The tensor cores round their inputs to 16 bits, so a 16-bit bucket allows them half of
 * doc/spec.md's half-storage bound, leaving the other half to the storage's own rounding around
 * them (the bucket does not tell half from bfloat16 storage, so the stricter contract holds);
 * every float kernel is held to the float32 bound. */
#define MMA_TOLERANCE 1e-3
static double tolerance(const iha_tune_bucket *b, const iha_tune_config *c)
{
    return b->values[K_BYTES] == 2 && is_mma(c->v[P_VARIANT]) ? MMA_TOLERANCE : IHA_TUNE_TOLERANCE;
}

static iha_status check(iha_context *ctx, void *p, const iha_tune_config *c, double *error)
{
    problem *pr = p;
    return iha__tune_check_output(ctx, pr, c, enqueue, pr->o[0], pr->dims.H * pr->dims.T * pr->dims.d, reference, error);
}

const iha_tunable iha__tunable_attention = {
    &space, 3.0, bucket_of, builtin, safe, seeds, problem_create, problem_free, problem_bytes, canonical,
    prepare, enqueue, check, NULL, tolerance,
};
