/* iha_attention_partial and iha_attention_partial_backward (doc/spec.md, "Partial attention"): one
 * query block against one key block of a longer sequence, for sequence-parallel attention. Every
 * argument is checked before anything is enqueued; the kernels are cl/attention_partial.cl's. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "common/checked.h"
#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/mix.h"
#include "layer/call.h"
#include "layer/partial.h"
#include "layer/plan.h"
#include "layer/workspace.h"
#include "runtime/error.h"
#include "runtime/launch.h"
#include "runtime/loop_limit.h"
#include "runtime/program.h"

/* The block geometry in virtual rows, and the mask arguments at global positions. */
typedef struct partial_geometry {
    size_t Tk;         /* key rows of the block */
    size_t key_elems;  /* B*H*Tk*d */
    cl_int q0, k0, Tg; /* first query row, first key row, a length covering both blocks */
    cl_int window;     /* tokens, 0 when the window hides nothing inside Tg */
} partial_geometry;

static iha_status plan_partial(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                               const iha_partial_block *block, const char *call, double *mark, iha_plan *p,
                               partial_geometry *g)
{
    IHA_FORWARD_IF_ERROR(iha__call_plan(ctx, shape, options, 0, call, mark, p));
    IHA_RETURN_ERROR_IF(block == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "%s: block is NULL", call);
    IHA_RETURN_ERROR_IF(p->act_storage != IHA_STORAGE_F32, ctx, IHA_ERROR_UNSUPPORTED,
                        "%s takes float32 tensors only (options->storage must be IHA_STORAGE_F32)", call);
    IHA_RETURN_ERROR_IF(p->seq_lens != NULL, ctx, IHA_ERROR_UNSUPPORTED,
                        "%s does not take packed sequences (options->seq_lens must be NULL)", call);
    IHA_RETURN_ERROR_IF(block->k_tokens == 0, ctx, IHA_ERROR_INVALID_ARGUMENT, "%s: block->k_tokens must be at least 1",
                        call);
    const size_t P = p->dims.P, limit = INT_MAX / 4;
    size_t q_end, k_end, q0, k0, Tk, bh;
    const int ok = iha__add(block->q_offset, p->dims.N, &q_end) && iha__add(block->k_offset, block->k_tokens, &k_end) &&
                   iha__mul(q_end, P, &q_end) && iha__mul(k_end, P, &k_end) && iha__mul(block->q_offset, P, &q0) &&
                   iha__mul(block->k_offset, P, &k0) && iha__mul(block->k_tokens, P, &Tk) &&
                   iha__mul(p->dims.B, p->dims.H, &bh) && iha__mul(bh, Tk, &g->key_elems) &&
                   iha__mul(g->key_elems, p->dims.d, &g->key_elems);
    IHA_RETURN_ERROR_IF(!ok, ctx, IHA_ERROR_SIZE_OVERFLOW, "%s: the block's offsets or key tokens overflow size_t",
                        call);
    IHA_RETURN_ERROR_IF(q_end > limit || k_end > limit, ctx, IHA_ERROR_UNSUPPORTED,
                        "%s: the blocks end at virtual rows %zu (queries) and %zu (keys); the limit is %zu", call,
                        q_end, k_end, limit);
    const size_t Tg = q_end > k_end ? q_end : k_end;
    g->Tk = Tk;
    g->q0 = (cl_int)q0;
    g->k0 = (cl_int)k0;
    g->Tg = (cl_int)Tg;
    /* A window of the whole covered span or more hides nothing; 0 keeps window*P in int range. */
    g->window = (uint64_t)options->window >= Tg / P ? 0 : (cl_int)options->window;
    return IHA_OK;
}

static void arg_buf(iha_args *a, iha_buffer b) { iha__arg_tensor(a, b.mem, b.offset); }

static void arg_geometry(iha_args *a, const iha_plan *p, const partial_geometry *g, int flag)
{
    iha__arg_int(a, (cl_int)p->dims.T);
    iha__arg_int(a, (cl_int)g->Tk);
    iha__arg_int(a, g->q0);
    iha__arg_int(a, g->k0);
    iha__arg_int(a, g->Tg);
    iha__arg_int(a, (cl_int)p->dims.P);
    iha__arg_int(a, p->mask);
    iha__arg_int(a, g->window);
    iha__arg_float(a, p->scale);
    iha__arg_int(a, flag);
}

/* Checks n tensors for size, and each output (from index first_out on) apart from every tensor
 * before it; inputs may share memory. */
static iha_status check_all(iha_context *ctx, int n, int first_out, const iha_buffer *b, const size_t *elems,
                            const char *const *names)
{
    const size_t f = sizeof(float);
    for (int i = 0; i < n; ++i) IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, b[i], elems[i], f, names[i]));
    for (int j = first_out; j < n; ++j)
        for (int i = 0; i < j; ++i)
            IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, b[j], elems[j], f, b[i], elems[i], f, names[j], names[i]));
    return IHA_OK;
}

/* Floats of the tiles' packed key block: its rows rounded up to the configuration's key block. */
static size_t packed_key_elems(const iha_attention_config *cfg, size_t row_elems, size_t Tk)
{
    size_t packed_elems = SIZE_MAX;
    iha__mul(row_elems, iha__round_up(Tk, (size_t)cfg->key_block), &packed_elems);
    return packed_elems;
}

/* Floats of the packed key block a forward step takes on ctx (0 on GPUs); SIZE_MAX on overflow. */
static size_t forward_floats(const iha_context *ctx, size_t row_elems, size_t head_dim, size_t Tk)
{
    if (ctx->info.is_gpu) return 0;
    iha_attention_config cfg;
    iha__attention_config_default(ctx, head_dim, &cfg);
    return packed_key_elems(&cfg, row_elems, Tk);
}

/* What a backward step of query block dims over Tk key rows takes from workspace: Dt (the
 * lse's size), and with `tiled` two packed copies (*packed floats each) and *sums floats of
 * partial dq sums. Returns the total, SIZE_MAX on overflow. */
static size_t backward_floats(const iha_context *ctx, const iha_dims *dims, int tiled, size_t Tk, size_t *packed,
                              size_t *sums)
{
    *packed = *sums = 0;
    size_t delta, extra = 0, total;
    if (!iha__mul(dims->B * dims->H, dims->T, &delta)) return SIZE_MAX;
    if (tiled) {
        *packed = iha__packed_keys_elements(dims, 16);
        if (*packed == 0 || !iha__attention_partial_backward_sums_elements(ctx, dims, Tk, sums) ||
            !iha__mul(*packed, 2, &extra) || !iha__add(extra, *sums, &extra))
            return SIZE_MAX;
    }
    return iha__add(extra, delta, &total) ? total : SIZE_MAX;
}

/* The caller's `others` floats and a step's `floats`, checked together against ctx's memory. */
static iha_status check_with(iha_context *ctx, size_t others, size_t floats)
{
    size_t total;
    if (!iha__add(others, floats, &total)) total = SIZE_MAX;
    return iha__workspace_check_total(ctx, total, sizeof(float));
}

iha_status iha__partial_reserve(iha_context *ctx, const iha_shape *shape, size_t k_tokens, size_t others,
                                size_t *floats)
{
    const size_t row_elems = shape->batch * shape->heads * shape->head_dim;
    *floats = forward_floats(ctx, row_elems, shape->head_dim, k_tokens * shape->pseudo);
    IHA_FORWARD_IF_ERROR(check_with(ctx, others, *floats));
    cl_mem packed;
    return *floats == 0 ? IHA_OK : iha__workspace_get(ctx, IHA_WS_KT, *floats * sizeof(float), &packed);
}

iha_status iha__partial_backward_reserve(iha_context *ctx, const iha_shape *shape, size_t k_tokens, size_t others,
                                         size_t *floats)
{
    const iha_dims dims = {
        shape->batch, shape->tokens, shape->heads, shape->head_dim, shape->pseudo, shape->tokens * shape->pseudo, NULL};
    const int tiled = iha__attention_backward_tiled(ctx, dims.d);
    size_t packed, sums;
    *floats = backward_floats(ctx, &dims, tiled, k_tokens * shape->pseudo, &packed, &sums);
    IHA_FORWARD_IF_ERROR(check_with(ctx, others, *floats));
    cl_mem delta, packs[2], part;
    return iha__attention_backward_workspace(ctx, tiled, dims.B * dims.H * dims.T, packed, sums, &delta, packs, &part);
}

/* Devices that are not GPUs: cl/attention.cl's register tiles over the key block, packed into
 * workspace as iha_attention packs its keys. */
static iha_status partial_forward_tiles(iha_context *ctx, const iha_plan *p, const partial_geometry *g,
                                        const iha_partial_block *block, const iha_buffer b[5], double *mark)
{
    iha_attention_config cfg;
    iha__attention_config_default(ctx, p->dims.d, &cfg);
    iha_dims kd = p->dims;
    kd.T = g->Tk;
    kd.N = block->k_tokens;
    const size_t packed_elems = forward_floats(ctx, g->key_elems / g->Tk, p->dims.d, g->Tk);
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, packed_elems, sizeof(float)));
    cl_mem packed;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_KT, packed_elems * sizeof(float), &packed));
    IHA_FORWARD_IF_ERROR(iha__pack_keys_enqueue(ctx, &kd, b[1], (iha_buffer){packed, 0}, cfg.key_block));
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__attention_kernel_get(ctx, &cfg, p->dims.d, "attention_partial_tiles.cl",
                                                   "attention_partial_tiles_f32", &k));
    iha_args a = iha__args_begin(k);
    arg_buf(&a, b[0]);
    iha__arg_tensor(&a, packed, 0);
    for (int i = 2; i < 5; ++i) arg_buf(&a, b[i]);
    iha__arg_int(&a, (cl_int)p->dims.T);
    iha__arg_int(&a, (cl_int)g->Tk);
    iha__arg_int(&a, g->q0);
    iha__arg_int(&a, g->k0);
    iha__arg_int(&a, g->Tg);
    iha__arg_int(&a, (cl_int)p->dims.P);
    iha__arg_int(&a, p->mask);
    iha__arg_int(&a, g->window);
    iha__arg_float(&a, (cl_float)(p->scale * 1.4426950408889634)); /* the tiles work in base 2 */
    iha__arg_int(&a, block->first != 0);
    const size_t rows_per_item = (size_t)cfg.rows * (size_t)cfg.tiles;
    const size_t global[2] = {(p->dims.T + rows_per_item - 1) / rows_per_item, p->dims.B * p->dims.H};
    const size_t local[2] = {cfg.group, 1};
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 2, global, local, "attention_partial_tiles_f32"));
    return iha__stage_done(ctx, &ctx->stage_times.attention, mark);
}

static iha_status partial_forward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                  const iha_partial_block *block, const iha_buffer b[5])
{
    static const char *const names[5] = {"qt", "kt", "vt", "o", "lse"};
    double mark;
    iha_plan p;
    partial_geometry g;
    IHA_FORWARD_IF_ERROR(plan_partial(ctx, shape, options, block, "iha_attention_partial", &mark, &p, &g));
    const size_t elems[5] = {p.virtual_elems, g.key_elems, g.key_elems, p.virtual_elems, p.lse_elems};
    IHA_FORWARD_IF_ERROR(check_all(ctx, 5, 3, b, elems, names));
    if (!ctx->info.is_gpu) return partial_forward_tiles(ctx, &p, &g, block, b, &mark);
    char opts[32];
    snprintf(opts, sizeof opts, "-DHEAD_DIM=%zu", p.dims.d);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_partial.cl", opts, "attention_partial_f32", &k));
    iha_args a = iha__args_begin(k);
    for (int i = 0; i < 5; ++i) arg_buf(&a, b[i]);
    arg_geometry(&a, &p, &g, block->first != 0);
    const size_t rows[2] = {p.dims.T, p.dims.B * p.dims.H};
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 2, rows, NULL, "attention_partial_f32"));
    return iha__stage_done(ctx, &ctx->stage_times.attention, &mark);
}

iha_status iha_attention_partial(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                 const iha_partial_block *block, iha_buffer qt, iha_buffer kt, iha_buffer vt,
                                 iha_buffer o, iha_buffer lse)
{
    const iha_buffer b[5] = {qt, kt, vt, o, lse};
    return iha__call_end(ctx, partial_forward(ctx, shape, options, block, b));
}

static iha_status partial_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                   const iha_partial_block *block, const iha_buffer b[9])
{
    static const char *const names[9] = {"qt", "kt", "vt", "o", "lse", "dout", "dqt", "dkt", "dvt"};
    double mark;
    iha_plan p;
    partial_geometry g;
    IHA_FORWARD_IF_ERROR(plan_partial(ctx, shape, options, block, "iha_attention_partial_backward", &mark, &p, &g));
    const size_t q = p.virtual_elems, kv = g.key_elems;
    const size_t elems[9] = {q, kv, kv, q, p.lse_elems, q, q, kv, kv};
    IHA_FORWARD_IF_ERROR(check_all(ctx, 9, 6, b, elems, names));
    /* Workspace: Dt, one float per query row; for the tile pass packed copies of the query
     * block's Q and dO and its partial dq sums. */
    const int tiled = iha__attention_backward_tiled(ctx, p.dims.d);
    size_t packed, sums;
    const size_t total = backward_floats(ctx, &p.dims, tiled, g.Tk, &packed, &sums);
    IHA_FORWARD_IF_ERROR(iha__workspace_check_total(ctx, total, sizeof(float)));
    cl_mem delta, packs[2], part;
    IHA_FORWARD_IF_ERROR(
        iha__attention_backward_workspace(ctx, tiled, p.lse_elems, packed, sums, &delta, packs, &part));
    char opts[32];
    snprintf(opts, sizeof opts, "-DHEAD_DIM=%zu", p.dims.d);
    const size_t BH = p.dims.B * p.dims.H, qrows[2] = {p.dims.T, BH}, krows[2] = {g.Tk, BH};
    cl_kernel k;

    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_partial.cl", opts, "attention_partial_rowdot_f32", &k));
    iha_args a = iha__args_begin(k);
    arg_buf(&a, b[3]);
    arg_buf(&a, b[5]);
    iha__arg_mem(&a, delta);
    iha__arg_int(&a, (cl_int)p.dims.T);
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 2, qrows, NULL, "attention_partial_rowdot_f32"));
    if (tiled) {
        const iha_backward_refs r = {b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], delta, {packs[0], packs[1]},
                                     part};
        const iha_block_rows at = {g.Tk, g.q0, g.k0, g.Tg};
        IHA_FORWARD_IF_ERROR(iha__attention_partial_backward_enqueue(ctx, &p.dims, &at, &r, p.mask, g.window, p.scale,
                                                                     block->first != 0, options->accumulate != 0));
        return iha__stage_done(ctx, &ctx->stage_times.attention, &mark);
    }

    /* qt, kt, vt, dout, lse: the inputs both gradient kernels read, in their order. */
    const int in[5] = {0, 1, 2, 5, 4};
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_partial.cl", opts, "attention_partial_dq_f32", &k));
    a = iha__args_begin(k);
    for (int i = 0; i < 5; ++i) arg_buf(&a, b[in[i]]);
    iha__arg_mem(&a, delta);
    arg_buf(&a, b[6]);
    arg_geometry(&a, &p, &g, block->first != 0);
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 2, qrows, NULL, "attention_partial_dq_f32"));

    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_partial.cl", opts, "attention_partial_dkv_f32", &k));
    a = iha__args_begin(k);
    for (int i = 0; i < 5; ++i) arg_buf(&a, b[in[i]]);
    iha__arg_mem(&a, delta);
    arg_buf(&a, b[7]);
    arg_buf(&a, b[8]);
    arg_geometry(&a, &p, &g, options->accumulate != 0);
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 2, krows, NULL, "attention_partial_dkv_f32"));
    return iha__stage_done(ctx, &ctx->stage_times.attention, &mark);
}

iha_status iha_attention_partial_backward(iha_context *ctx, const iha_shape *shape,
                                          const iha_attention_options *options, const iha_partial_block *block,
                                          iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o, iha_buffer lse,
                                          iha_buffer dout, iha_buffer dqt, iha_buffer dkt, iha_buffer dvt)
{
    const iha_buffer b[9] = {qt, kt, vt, o, lse, dout, dqt, dkt, dvt};
    return iha__call_end(ctx, partial_backward(ctx, shape, options, block, b));
}
