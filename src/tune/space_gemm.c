/* The tuning space of the layer's SGEMM (row-major, no transposes): which backend runs it, and
 * each backend's parameters.
 *  - backend=1: the library's kernel (cl/gemm.cl): its tile GEMM_MR x GEMM_VW, k unrolling
 *    GEMM_KU and row tiles per work-group GEMM_GROUP;
 *  - backend=0: CLBlast, with a subset of the Xgemm (indirect) and XgemmDirect parameters of
 *    CLBlast 1.5.3 under the constraints of CLBlast's own tuners (src/tuning/kernels/xgemm.hpp,
 *    xgemm_direct.hpp), and the switch point XGEMM_MIN_INDIRECT_SIZE of its GemmRoutine (direct
 *    below size^3 = m*n*k), applied with CLBlastOverrideParameters.
 * A candidate is a whole parameter set; the parameters of the backend it does not use are the
 * seed's, so the search compares the two backends' best on the same problem. It is timed on
 * the layer's four GEMMs and checked on a ragged 67x45x33 product against float64 and on the
 * layer's shapes with a Freivalds checksum (C x against A (B x) in float64, BLIS-style). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gemm/gemm.h"
#include "gemm/gemm_params.h"
#include "gemm/sgemm.h"
#include "runtime/error.h"
#include "tune/buffers.h"
#include "tune/tunable.h"

/* Parameter order: Xgemm's 16 (CLBlast's names, all required by an override), XgemmDirect's
 * 10, GemmRoutine's one, the backend, then the library kernel's four. Tied parameters follow CLBlast's "variation 1" restrictions
 * (MDIMA = MDIMC, NDIMB = NDIMC, SA = SB), which keep the space explorable. */
#define XGEMM_FIRST 0
#define XGEMM_COUNT 16
#define DIRECT_FIRST 16
#define DIRECT_COUNT 10
#define SWITCH_INDEX 26
#define BACKEND_INDEX 27
#define OWN_FIRST 28
#define OWN_COUNT 4
static const iha_tune_param params[] = {
    {"GEMMK", 1, {0}, NULL},                          /* 0: the 2D-register kernel is for other GPUs */
    {"KREG", 1, {1}, NULL},
    {"KWG", 2, {16, 32}, NULL},
    {"KWI", 1, {2}, NULL},
    {"MDIMA", 0, {0}, "MDIMC"},
    {"MDIMC", 6, {1, 2, 4, 8, 16, 32}, NULL},
    {"MWG", 4, {16, 32, 64, 128}, NULL},
    {"NDIMB", 0, {0}, "NDIMC"},
    {"NDIMC", 6, {1, 2, 4, 8, 16, 32}, NULL},
    {"NWG", 4, {16, 32, 64, 128}, NULL},
    {"SA", 2, {0, 1}, NULL},
    {"SB", 0, {0}, "SA"},
    {"STRM", 1, {0}, NULL},
    {"STRN", 1, {0}, NULL},
    {"VWM", 4, {1, 2, 4, 8}, NULL},
    {"VWN", 4, {1, 2, 4, 8}, NULL},
    {"KWID", 1, {2}, NULL},
    {"MDIMAD", 0, {0}, "MDIMCD"},
    {"MDIMCD", 4, {4, 8, 16, 32}, NULL},
    {"NDIMBD", 0, {0}, "NDIMCD"},
    {"NDIMCD", 4, {4, 8, 16, 32}, NULL},
    {"PADA", 1, {1}, NULL},
    {"PADB", 1, {1}, NULL},
    {"VWMD", 4, {1, 2, 4, 8}, NULL},
    {"VWND", 4, {1, 2, 4, 8}, NULL},
    {"WGD", 4, {8, 16, 32, 64}, NULL},
    {"XGEMM_MIN_INDIRECT_SIZE", 8, {64, 128, 256, 384, 512, 768, 1024, 2048}, NULL},
    {"backend", 2, {0, 1}, NULL},                     /* 0: CLBlast, 1: cl/gemm.cl */
    {"GEMM_MR", 6, {1, 2, 3, 4, 6, 8}, NULL},
    {"GEMM_VW", 3, {4, 8, 16}, NULL},
    {"GEMM_KU", 4, {1, 2, 4, 8}, NULL},
    {"GEMM_GROUP", 5, {1, 4, 16, 64, 256}, NULL},
};
#define PARAM_COUNT 32

enum { K_BYTES, K_M, K_N, K_K, K_COUNT };
static const iha_tune_key keys[] = {{"elem_bytes", 1}, {"m", 0}, {"n", 0}, {"k", 0}};

static int group_fits(const long *v) { return v[0] * v[1] <= v[2]; }

static const iha_tune_constraint constraints[] = {
    /* Xgemm: unrolling, integer work per item, and the re-shaped tiles of A and B. */
    {iha__multiple_of_x, {"KWG", "KWI", NULL, NULL}, "KWG must be a multiple of KWI"},
    {iha__multiple_of_x_mul_y, {"MWG", "MDIMC", "VWM", NULL}, "MWG must be a multiple of MDIMC*VWM"},
    {iha__multiple_of_x_mul_y, {"NWG", "NDIMC", "VWN", NULL}, "NWG must be a multiple of NDIMC*VWN"},
    {iha__multiple_of_x_mul_y, {"MWG", "MDIMA", "VWM", NULL}, "MWG must be a multiple of MDIMA*VWM"},
    {iha__multiple_of_x_mul_y, {"NWG", "NDIMB", "VWN", NULL}, "NWG must be a multiple of NDIMB*VWN"},
    {iha__multiple_of_x_mul_y_div_z, {"KWG", "MDIMC", "NDIMC", "MDIMA"}, "KWG must be a multiple of KDIMA"},
    {iha__multiple_of_x_mul_y_div_z, {"KWG", "MDIMC", "NDIMC", "NDIMB"}, "KWG must be a multiple of KDIMB"},
    {group_fits, {"MDIMC", "NDIMC", "max_group", NULL}, "MDIMC*NDIMC exceeds the device's work-group size"},
    /* XgemmDirect: the same rules on its single tile size WGD. */
    {iha__multiple_of_x, {"WGD", "KWID", NULL, NULL}, "WGD must be a multiple of KWID"},
    {iha__multiple_of_x_mul_y, {"WGD", "MDIMCD", "VWMD", NULL}, "WGD must be a multiple of MDIMCD*VWMD"},
    {iha__multiple_of_x_mul_y, {"WGD", "NDIMCD", "VWND", NULL}, "WGD must be a multiple of NDIMCD*VWND"},
    {iha__multiple_of_x_mul_y, {"WGD", "MDIMAD", "VWMD", NULL}, "WGD must be a multiple of MDIMAD*VWMD"},
    {iha__multiple_of_x_mul_y, {"WGD", "NDIMBD", "VWND", NULL}, "WGD must be a multiple of NDIMBD*VWND"},
    {iha__multiple_of_x_mul_y_div_z, {"WGD", "MDIMCD", "NDIMCD", "MDIMAD"}, "WGD must be a multiple of KDIMAD"},
    {iha__multiple_of_x_mul_y_div_z, {"WGD", "MDIMCD", "NDIMCD", "NDIMBD"}, "WGD must be a multiple of KDIMBD"},
    {group_fits, {"MDIMCD", "NDIMCD", "max_group", NULL}, "MDIMCD*NDIMCD exceeds the device's work-group size"},
    /* The library's kernel. */
    {iha__at_most_x, {"GEMM_GROUP", "max_group", NULL, NULL}, "GEMM_GROUP exceeds the device's work-group size"},
};

/* Local memory of the larger of the two kernels: Xgemm caches KWG x MWG of A when SA and
 * KWG x NWG of B when SB; XgemmDirect caches WGD x (WGD + PAD) of each. */
static long local_bytes(const long *v)
{
    const long sa = v[0], kwg = v[1], mwg = v[2], nwg = v[3], wgd = v[4], pad = v[5];
    const long xgemm = 4 * sa * kwg * (mwg + nwg), direct = 4 * 2 * wgd * (wgd + pad);
    return xgemm > direct ? xgemm : direct;
}

static const iha_tune_space space = {
    "gemm", params, PARAM_COUNT, keys, K_COUNT, constraints, 17,
    local_bytes, {"SA", "KWG", "MWG", "NWG", "WGD", "PADA"}, {NULL, NULL, NULL}, NULL, 0,
};

/* ---- Configurations ---- */

static void set_values(iha_tune_config *c, int first, int count, const long *values)
{
    for (int i = 0; i < count; ++i) c->v[first + i] = values[i];
}

/* Starting points per device type: the indirect kernel with its tiles and the direct one. On a
 * CPU (PoCL, AVX2) one work-item per group with 8-wide vectors on 16x16 tiles runs the demo's
 * projections several times faster than CLBlast's database; the direct tiles are modest
 * because every candidate's program compiles all of CLBlast's GEMM kernels. */
/*                                          GEMMK KREG KWG KWI MDIMA MDIMC MWG NDIMB NDIMC NWG SA SB STRM STRN VWM VWN */
static const long cpu_xgemm[XGEMM_COUNT] = {0,    1,   32, 2,  1,    1,    16, 1,    1,    16, 0, 0, 0,   0,   8,  8};
static const long gpu_xgemm[XGEMM_COUNT] = {0,    1,   16, 2,  16,   16,   64, 16,   16,   64, 1, 1, 0,   0,   2,  2};
/*                                            KWID MDIMAD MDIMCD NDIMBD NDIMCD PADA PADB VWMD VWND WGD */
static const long cpu_direct[DIRECT_COUNT] = {2,   8,     8,     8,     8,     1,   1,   1,   1,   32};
static const long gpu_direct[DIRECT_COUNT] = {2,   8,     8,     8,     8,     1,   1,   1,   1,   32};

static void set_own(iha_tune_config *c, const iha_gemm_config *g)
{
    c->v[OWN_FIRST] = g->rows;
    c->v[OWN_FIRST + 1] = g->vec;
    c->v[OWN_FIRST + 2] = g->unroll;
    c->v[OWN_FIRST + 3] = (long)g->group;
}

/* CLBlast's parameters with the switch the tuner chose for the demo layer (its 1024x512x512
 * products on the indirect kernel), and the library kernel's default tile; backend CLBlast. */
static void seed_base(const iha_context *ctx, iha_tune_config *c)
{
    memset(c, 0, sizeof *c);
    set_values(c, XGEMM_FIRST, XGEMM_COUNT, ctx->info.is_gpu ? gpu_xgemm : cpu_xgemm);
    set_values(c, DIRECT_FIRST, DIRECT_COUNT, ctx->info.is_gpu ? gpu_direct : cpu_direct);
    c->v[SWITCH_INDEX] = 512;
    iha_gemm_config g;
    iha__gemm_kernel_default(ctx, &g);
    set_own(c, &g);
}

/* The library's kernel, and CLBlast with the layer's GEMMs on its indirect path (smallest
 * switch) and, on a GPU, on its direct one. Each CLBlast seed costs PoCL many seconds of
 * compiling on a CPU, where CLBlast's direct kernel does not win and its indirect one runs well
 * behind the library's kernel, so a CPU gets the indirect one only. */
static int seeds(const iha_context *ctx, const iha_tune_bucket *b, iha_tune_config *out, int capacity)
{
    (void)b;
    if (capacity < (ctx->info.is_gpu ? 3 : 2)) return 0;
    seed_base(ctx, &out[0]);
    out[0].v[BACKEND_INDEX] = 1;
    seed_base(ctx, &out[1]);
    out[1].v[SWITCH_INDEX] = 64;
    if (ctx->loop_flag != NULL) return 1; /* CLBlast is refused there (src/gemm/sgemm.c) */
    if (!ctx->info.is_gpu) return 2;
    out[2] = out[1];
    out[2].v[SWITCH_INDEX] = 2048;
    return 3;
}

/* On a CPU the library's kernel: it loads from the IHA program cache where CLBlast builds its
 * large GEMM program from source in every process, and CLBlast's database has no entry for
 * PoCL (its defaults run the demo's GEMMs several times slower than tuned parameters). On a
 * GPU, CLBlast's own database, which covers the common ones:
 * nothing to override. */
static int builtin(const iha_context *ctx, const iha_tune_bucket *b, iha_tune_config *c)
{
    (void)b;
    if (ctx->info.is_gpu && ctx->loop_flag == NULL) return 0;
    seed_base(ctx, c);
    c->v[BACKEND_INDEX] = 1;
    return 1;
}

static void safe(const iha_tune_bucket *b, iha_tune_config *c)
{
    (void)b;
    static const long x[XGEMM_COUNT] = {0, 1, 16, 2, 8, 8, 32, 8, 8, 32, 0, 0, 0, 0, 1, 1};
    static const long d[DIRECT_COUNT] = {2, 8, 8, 8, 8, 1, 1, 1, 1, 16};
    static const iha_gemm_config own = {0, 4, 4, 1, 1};
    memset(c, 0, sizeof *c);
    set_values(c, XGEMM_FIRST, XGEMM_COUNT, x);
    set_values(c, DIRECT_FIRST, DIRECT_COUNT, d);
    c->v[SWITCH_INDEX] = 512;
    set_own(c, &own);
}

void iha__tune_gemm_own_config(const iha_tune_config *c, iha_gemm_config *g)
{
    g->own = c->v[BACKEND_INDEX] == 1;
    g->rows = (int)c->v[OWN_FIRST];
    g->vec = (int)c->v[OWN_FIRST + 1];
    g->unroll = (int)c->v[OWN_FIRST + 2];
    g->group = (size_t)c->v[OWN_FIRST + 3];
}

iha_status iha__tune_gemm_clblast_apply(iha_context *ctx, const iha_tune_config *c)
{
    const char *names[XGEMM_COUNT];
    size_t values[XGEMM_COUNT];
    for (int i = 0; i < XGEMM_COUNT; ++i) names[i] = params[XGEMM_FIRST + i].name, values[i] = (size_t)c->v[XGEMM_FIRST + i];
    IHA_FORWARD_IF_ERROR(iha__gemm_override(ctx, "Xgemm", XGEMM_COUNT, names, values));
    for (int i = 0; i < DIRECT_COUNT; ++i)
        names[i] = params[DIRECT_FIRST + i].name, values[i] = (size_t)c->v[DIRECT_FIRST + i];
    IHA_FORWARD_IF_ERROR(iha__gemm_override(ctx, "XgemmDirect", DIRECT_COUNT, names, values));
    names[0] = params[SWITCH_INDEX].name;
    values[0] = (size_t)c->v[SWITCH_INDEX];
    return iha__gemm_override(ctx, "GemmRoutine", 1, names, values);
}

/* Makes c's backend the context's; CLBlast's parameters are overridden only when CLBlast is the
 * backend, so a context on the library's kernel never calls into CLBlast. NULL cannot return
 * CLBlast to its database: CLBlastClearCache (1.5.3) drops compiled programs but keeps
 * overridden parameters, and CLBlast has no call that reads its defaults. So "built-in" means
 * the backend the context has and the parameters CLBlast has when tuning starts. */
static iha_status apply(iha_context *ctx, const iha_tune_config *c)
{
    if (c == NULL) return IHA_OK;
    iha_gemm_config g;
    iha__tune_gemm_own_config(c, &g);
    if (!g.own) IHA_FORWARD_IF_ERROR(iha__tune_gemm_clblast_apply(ctx, c));
    ctx->gemm->config = g;
    return IHA_OK;
}

/* ---- Problems ---- */

#define MAX_COPIES 8
#define SHAPES 2 /* the projections X W (three of them) and the output Y W_O */

typedef struct gemm_shape {
    size_t m, n, k, repeats;
} gemm_shape;

typedef struct problem {
    gemm_shape shape[SHAPES];
    int copies;
    cl_mem a[SHAPES][MAX_COPIES], b[SHAPES], c[SHAPES];
    float *ha[SHAPES], *hb[SHAPES]; /* verification inputs */
    gemm_shape small;
    cl_mem sa, sb, sc;
    float *hsa, *hsb;
    iha_tune_config seed;           /* parameters of the path a problem does not use */
} problem;

static void layer_shapes(const iha_shape *s, gemm_shape out[SHAPES])
{
    const size_t rows = s->batch * s->tokens, hd = s->heads * s->head_dim;
    out[0] = (gemm_shape){rows, hd, s->model_dim, 3};
    out[1] = (gemm_shape){rows, s->model_dim, hd, 1};
}

static int bucket_of(const iha_context *ctx, const iha_shape *s, const iha_attention_options *o, iha_tune_bucket *b)
{
    (void)ctx, (void)o;
    gemm_shape g[SHAPES];
    layer_shapes(s, g);
    b->count = K_COUNT;
    b->values[K_BYTES] = 4;
    b->values[K_M] = (long)g[0].m;
    b->values[K_N] = (long)g[0].n;
    b->values[K_K] = (long)g[0].k;
    return 1;
}

static int uses_direct(const gemm_shape *g, long min_indirect)
{
    const double mnk = (double)g->m * (double)g->n * (double)g->k, s = (double)min_indirect;
    return mnk < s * s * s;
}

/* Every switch value that sends the layer's GEMMs down the same paths behaves the same here;
 * the representative keeps the boundary closest to the layer's sizes, and the parameters of a
 * path that none of them takes are the seed's. */
static void canonical(const void *p, iha_tune_config *c)
{
    const problem *pr = p;
    if (c->v[BACKEND_INDEX] == 1) {
        memcpy(c->v, pr->seed.v, OWN_FIRST * sizeof c->v[0]);
        c->v[BACKEND_INDEX] = 1;
        return;
    }
    memcpy(&c->v[OWN_FIRST], &pr->seed.v[OWN_FIRST], OWN_COUNT * sizeof c->v[0]);
    const iha_tune_param *sw = &params[SWITCH_INDEX];
    int pattern = 0, any_direct = 0, any_indirect = 0;
    for (int i = 0; i < SHAPES; ++i) pattern |= uses_direct(&pr->shape[i], c->v[SWITCH_INDEX]) << i;
    long chosen = c->v[SWITCH_INDEX];
    for (int k = 0; k < sw->count; ++k) {
        int other = 0;
        for (int i = 0; i < SHAPES; ++i) other |= uses_direct(&pr->shape[i], sw->values[k]) << i;
        if (other != pattern) continue;
        if (pattern == 0 ? sw->values[k] > chosen : sw->values[k] < chosen) chosen = sw->values[k];
    }
    c->v[SWITCH_INDEX] = chosen;
    for (int i = 0; i < SHAPES; ++i) {
        any_direct |= (pattern >> i) & 1;
        any_indirect |= !((pattern >> i) & 1);
    }
    if (!any_direct) memcpy(&c->v[DIRECT_FIRST], &pr->seed.v[DIRECT_FIRST], DIRECT_COUNT * sizeof c->v[0]);
    if (!any_indirect) memcpy(&c->v[XGEMM_FIRST], &pr->seed.v[XGEMM_FIRST], XGEMM_COUNT * sizeof c->v[0]);
}

static void problem_free(void *p)
{
    problem *pr = p;
    if (pr == NULL) return;
    for (int i = 0; i < SHAPES; ++i) {
        iha__tune_release(pr->a[i], MAX_COPIES);
        cl_mem m[2] = {pr->b[i], pr->c[i]};
        iha__tune_release(m, 2);
        free(pr->ha[i]), free(pr->hb[i]);
    }
    cl_mem m[3] = {pr->sa, pr->sb, pr->sc};
    iha__tune_release(m, 3);
    free(pr->hsa), free(pr->hsb);
    free(pr);
}

static size_t problem_bytes(const iha_shape *s, const iha_tune_bucket *b)
{
    (void)b;
    gemm_shape g[SHAPES];
    layer_shapes(s, g);
    return (g[0].m * g[0].k + g[1].m * g[1].k) * sizeof(float);
}

/* Inputs of one shape: `copies` A matrices, one B, one C; host copies kept for checks. */
static iha_status make_shape(iha_context *ctx, problem *pr, int i, int keep_host)
{
    const gemm_shape *g = &pr->shape[i];
    iha_status st = IHA_OK;
    float *b = iha__tune_random(g->k * g->n, 41 + (uint64_t)i);
    if (b == NULL) return iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    st = iha__tune_buffer(ctx, g->k * g->n, b, &pr->b[i]);
    if (keep_host) pr->hb[i] = b; else free(b);
    if (st == IHA_OK) st = iha__tune_buffer(ctx, g->m * g->n, NULL, &pr->c[i]);
    for (int c = 0; c < pr->copies && st == IHA_OK; ++c) {
        float *a = iha__tune_random(g->m * g->k, 51 + 7 * (uint64_t)i + (uint64_t)c);
        if (a == NULL) return iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
        st = iha__tune_buffer(ctx, g->m * g->k, a, &pr->a[i][c]);
        if (keep_host && c == 0) pr->ha[i] = a; else free(a);
    }
    return st;
}

static iha_status make_small(iha_context *ctx, problem *pr)
{
    pr->small = (gemm_shape){67, 45, 33, 1};
    pr->hsa = iha__tune_random(67 * 33, 61);
    pr->hsb = iha__tune_random(33 * 45, 62);
    IHA_RETURN_ERROR_IF(pr->hsa == NULL || pr->hsb == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    IHA_FORWARD_IF_ERROR(iha__tune_buffer(ctx, 67 * 33, pr->hsa, &pr->sa));
    IHA_FORWARD_IF_ERROR(iha__tune_buffer(ctx, 33 * 45, pr->hsb, &pr->sb));
    return iha__tune_buffer(ctx, 67 * 45, NULL, &pr->sc);
}

static iha_status problem_create(iha_context *ctx, const iha_shape *s, const iha_attention_options *o,
                                 const iha_tune_bucket *b, iha_tune_purpose purpose, int copies, void **out)
{
    (void)o, (void)b;
    problem *pr = calloc(1, sizeof *pr);
    IHA_RETURN_ERROR_IF(pr == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    const int verify = purpose == IHA_TUNE_PROBLEM_VERIFY;
    layer_shapes(s, pr->shape);
    seed_base(ctx, &pr->seed);
    pr->copies = iha__tune_copy_count(verify, copies, MAX_COPIES);
    iha_status st = IHA_OK;
    for (int i = 0; i < SHAPES && st == IHA_OK; ++i) st = make_shape(ctx, pr, i, verify);
    if (st == IHA_OK && verify) st = make_small(ctx, pr);
    if (st != IHA_OK) {
        problem_free(pr);
        return st;
    }
    *out = pr;
    return IHA_OK;
}

static iha_status sgemm(iha_context *ctx, const gemm_shape *g, cl_mem a, cl_mem b, cl_mem c)
{
    return iha__sgemm(ctx, g->m, g->n, g->k, a, 0, g->k, b, 0, g->n, c, 0, g->n);
}

/* The layer's GEMMs: three projections and the output projection. */
static iha_status enqueue(iha_context *ctx, void *p, const iha_tune_config *c, int copy)
{
    problem *pr = p;
    if (c != NULL) IHA_FORWARD_IF_ERROR(apply(ctx, c));
    for (int i = 0; i < SHAPES; ++i)
        for (size_t r = 0; r < pr->shape[i].repeats; ++r)
            IHA_FORWARD_IF_ERROR(sgemm(ctx, &pr->shape[i], pr->a[i][copy], pr->b[i], pr->c[i]));
    return IHA_OK;
}

/* One run on every input copy: the first timed runs would otherwise fault in the pages of the
 * copies not yet touched (it made the built-in's "before" twice its "after" in one run). */
static iha_status prepare(iha_context *ctx, void *p, const iha_tune_config *c)
{
    const problem *pr = p;
    for (int copy = 0; copy < pr->copies; ++copy) IHA_FORWARD_IF_ERROR(enqueue(ctx, p, c, copy));
    return IHA_OK;
}

/* Float64 C = A B of the small product. */
static double small_error(const problem *pr, const float *out)
{
    const gemm_shape *g = &pr->small;
    double *ref = malloc(g->m * g->n * sizeof *ref);
    if (ref == NULL) return INFINITY;
    for (size_t i = 0; i < g->m; ++i)
        for (size_t j = 0; j < g->n; ++j) {
            double acc = 0.0;
            for (size_t l = 0; l < g->k; ++l) acc += (double)pr->hsa[i * g->k + l] * pr->hsb[l * g->n + j];
            ref[i * g->n + j] = acc;
        }
    const double e = iha__tune_rel_error(out, ref, g->m * g->n);
    free(ref);
    return e;
}

/* Freivalds: compare C x with A (B x) for a random x, all in float64. */
static double checksum_error(const problem *pr, int i, const float *out)
{
    const gemm_shape *g = &pr->shape[i];
    float *x = iha__tune_random(g->n, 71);
    double *bx = malloc(g->k * sizeof *bx), *ref = malloc(g->m * sizeof *ref);
    float *cx = malloc(g->m * sizeof *cx);
    double e = INFINITY;
    if (x && bx && ref && cx) {
        for (size_t l = 0; l < g->k; ++l) {
            double acc = 0.0;
            for (size_t j = 0; j < g->n; ++j) acc += (double)pr->hb[i][l * g->n + j] * x[j];
            bx[l] = acc;
        }
        int finite = 1;
        for (size_t r = 0; r < g->m; ++r) {
            double acc = 0.0, got = 0.0;
            for (size_t l = 0; l < g->k; ++l) acc += (double)pr->ha[i][r * g->k + l] * bx[l];
            for (size_t j = 0; j < g->n; ++j) {
                finite &= isfinite(out[r * g->n + j]) != 0;
                got += (double)out[r * g->n + j] * x[j];
            }
            ref[r] = acc;
            cx[r] = (float)got;
        }
        e = finite ? iha__tune_rel_error(cx, ref, g->m) : INFINITY;
    }
    free(x), free(bx), free(ref), free(cx);
    return e;
}

static iha_status check(iha_context *ctx, void *p, const iha_tune_config *c, double *error)
{
    problem *pr = p;
    if (c != NULL) IHA_FORWARD_IF_ERROR(apply(ctx, c));
    size_t most = pr->small.m * pr->small.n;
    for (int i = 0; i < SHAPES; ++i) most = pr->shape[i].m * pr->shape[i].n > most ? pr->shape[i].m * pr->shape[i].n : most;
    float *out = malloc(most * sizeof *out);
    IHA_RETURN_ERROR_IF(out == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    iha_status st = iha__tune_poison(ctx, pr->sc, pr->small.m * pr->small.n);
    if (st == IHA_OK) st = sgemm(ctx, &pr->small, pr->sa, pr->sb, pr->sc);
    if (st == IHA_OK) st = iha__tune_read(ctx, pr->sc, pr->small.m * pr->small.n, out);
    double worst = st == IHA_OK ? small_error(pr, out) : INFINITY;
    for (int i = 0; i < SHAPES && st == IHA_OK; ++i) {
        const gemm_shape *g = &pr->shape[i];
        st = iha__tune_poison(ctx, pr->c[i], g->m * g->n);
        if (st == IHA_OK) st = sgemm(ctx, g, pr->a[i][0], pr->b[i], pr->c[i]);
        if (st == IHA_OK) st = iha__tune_read(ctx, pr->c[i], g->m * g->n, out);
        if (st == IHA_OK) worst = fmax(worst, checksum_error(pr, i, out));
    }
    free(out);
    *error = isnan(worst) ? INFINITY : worst;
    return st;
}

const iha_tunable iha__tunable_gemm = {
    &space, 6.0, bucket_of, builtin, safe, seeds, problem_create, problem_free, problem_bytes, canonical,
    prepare, enqueue, check, apply, NULL,
};
