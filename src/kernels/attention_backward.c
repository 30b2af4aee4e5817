/* Host side of the attention backward kernels, all on the context's in-order queue: the row dots
 * Dt, then CPUs take cl/attention_backward_tiles.cl's one pass over the visible pairs (on packed
 * copies of Q and dO, with partial dq sums) and its sum of the partials; GPUs take dq and then dk
 * and dv from cl/attention_backward_local.cl's local tiles where they fit
 * (attention_backward_local.c), else cl/attention_backward.cl's, one row per work-item. The same tile pass
 * over one query block and one key block (cl/attention_partial_backward_tiles.cl) is
 * iha_attention_partial_backward's on CPUs. */
#include "kernels/attention_backward.h"
#include "kernels/attention.h"
#include "kernels/mix.h"
#include "runtime/error.h"

#include <stdio.h>

#include "common/checked.h"
#include "runtime/launch.h"

/* Rows of the tile kernel's register tiles. A work-item takes groups of 8 tiles (32 key rows)
 * at d <= 64 and 16 (64 rows) above, so that it streams the queries and dO it needs once for all
 * of a group's rows: with one tile per work-item the kernels would wait on that stream.
 * The tiles' state (four arrays of 4 rows of d floats) then lives in L2, read once per block. */
#define BW_ROWS 4

int iha__backward_tiles_default(size_t head_dim) { return head_dim <= 64 ? 8 : 16; }

static int tiles_of(const iha_backward_config *cfg, size_t head_dim)
{
    return cfg != NULL && cfg->tiles >= IHA_BACKWARD_TILES_MIN ? cfg->tiles : iha__backward_tiles_default(head_dim);
}

int iha__attention_backward_tiled(const iha_context *ctx, size_t head_dim)
{
    /* A work-item keeps up to 64 rows of d floats in each of four private arrays: CPU caches
     * hold them, a GPU's registers do not. */
    (void)head_dim; /* every width: the kernels load and store a partial last chunk */
    /* A driver that ends loops after a budget of iterations per work-item (runtime/
     * loop_limit.h) gets the row kernels too: a tile work-item walks every query block for 64
     * keys at once and spends that budget even on short sequences. */
    return !ctx->info.is_gpu && ctx->loop_flag == NULL;
}

/* Work-items per (b, h) of the tile kernel, each with a partial dq of its own: enough for four
 * per compute unit over all B*H sequences (a work-item runs a whole sequence's share, so fewer
 * leave units idle), no more than the sequence has key groups, and at most 64 work-items in
 * all unless B*H alone is more (the partials take S*B*H*T*d floats; 64 keeps them within
 * 64*T*d, which with few sequences is little). B*H = 8 on 2 compute units: S = 1, one copy of
 * dq. */
#define MAX_PARTIALS 64

static size_t segments(const iha_context *ctx, const iha_dims *dims, size_t key_rows, int tiles)
{
    const size_t bh = dims->B * dims->H, cu = ctx->info.compute_units ? ctx->info.compute_units : 1;
    const size_t per_group = (size_t)BW_ROWS * (size_t)tiles;
    const size_t groups = (key_rows + per_group - 1) / per_group;
    size_t s = (4 * cu + bh - 1) / bh;
    if (s > MAX_PARTIALS / bh) s = MAX_PARTIALS / bh;
    return s < 1 ? 1 : s > groups ? groups : s;
}

/* segments x B*H partials of ceil(T/16)*16 query rows of d rounded up to 16 floats. */
static int sums_elements(const iha_context *ctx, const iha_dims *dims, size_t key_rows, int tiles, size_t *elements)
{
    const size_t rows = (dims->T + 15) / 16 * 16, width = (dims->d + 15) / 16 * 16;
    size_t n;
    return iha__mul(segments(ctx, dims, key_rows, tiles), dims->B * dims->H, &n) && iha__mul(n, rows, &n) &&
           iha__mul(n, width, elements);
}

int iha__attention_partial_backward_sums_elements(const iha_context *ctx, const iha_dims *dims, size_t key_rows,
                                                  size_t *elements)
{
    return sums_elements(ctx, dims, key_rows, iha__backward_tiles_default(dims->d), elements);
}

int iha__attention_backward_partial_elements(const iha_context *ctx, const iha_dims *dims, size_t *elements)
{
    return sums_elements(ctx, dims, dims->T, IHA_BACKWARD_TILES_MIN, elements);
}

static void arg_ref(iha_args *a, iha_buffer r) { iha__arg_tensor(a, r.mem, r.offset); }

void iha__backward_mask_args(iha_args *a, const iha_dims *dims, int mask, size_t window, float scale, cl_mem unread)
{
    iha__arg_int(a, (cl_int)dims->T);
    iha__arg_int(a, (cl_int)dims->P);
    iha__arg_int(a, mask);
    iha__arg_int(a, (cl_int)window);
    iha__arg_float(a, scale);
    iha__attention_seq_args(a, dims, unread);
}

/* The tile kernel's first arguments, up to its segment count: Q and dO packed in 16-column blocks
 * [B*H][T/16][d][16] (zero-padded), then the kernel of `file` with `tiles` tiles per work-item,
 * its options into `options` (64 bytes). key_rows: the keys each (b, h) walks. */
static iha_status tiles_begin(iha_context *ctx, const iha_dims *dims, size_t key_rows, int tiles,
                              const iha_backward_refs *r, const char *file, const char *kernel, char *options,
                              iha_args *a, cl_int *segs)
{
    const iha_buffer sources[2] = {r->qt, r->dout};
    for (int i = 0; i < 2; ++i)
        IHA_FORWARD_IF_ERROR(iha__pack_keys_enqueue(ctx, dims, sources[i], (iha_buffer){r->packed[i], 0}, 16));
    *segs = (cl_int)segments(ctx, dims, key_rows, tiles);
    snprintf(options, 64, "-DHEAD_DIM=%zu -DBW_ROWS=%d -DBW_TILES=%d", dims->d, BW_ROWS, tiles);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, file, options, kernel, &k));
    *a = iha__args_begin(k);
    iha__arg_tensor(a, r->packed[0], 0);
    iha__arg_tensor(a, r->packed[1], 0);
    arg_ref(a, r->qt);
    arg_ref(a, r->kt);
    arg_ref(a, r->vt);
    arg_ref(a, r->dout);
    arg_ref(a, r->lse);
    iha__arg_mem(a, r->delta);
    arg_ref(a, r->dkt);
    arg_ref(a, r->dvt);
    iha__arg_mem(a, r->partial);
    iha__arg_int(a, *segs);
    return IHA_OK;
}

/* Launches the tile kernel whose arguments `a` holds, then the sum of its partials into dqt (with
 * add, added into it). */
static iha_status tiles_end(iha_context *ctx, iha_args *a, const iha_dims *dims, const iha_backward_refs *r,
                            const char *file, const char *kernel, const char *options, cl_int segs, int add)
{
    const size_t items[2] = {(size_t)segs, dims->B * dims->H}, one[2] = {1, 1};
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, a, 2, items, one, kernel));
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, file, options, "attention_bwd_dq_sum_f32", &k));
    *a = iha__args_begin(k);
    iha__arg_mem(a, r->partial);
    iha__arg_int(a, segs);
    arg_ref(a, r->dqt);
    iha__arg_int(a, (cl_int)dims->T);
    iha__arg_int(a, add);
    const size_t rows[2] = {dims->T, dims->B * dims->H};
    return iha__launch(ctx, a, 2, rows, NULL, "attention_bwd_dq_sum_f32");
}

/* dq, then dk and dv, each by its local-tile pass where cfg gives one, else its row kernel;
 * Dt already in r->delta. */
static iha_status gradients(iha_context *ctx, const iha_backward_config *cfg, const iha_dims *dims,
                            const iha_backward_refs *r, int mask, size_t window, float scale)
{
    char options[48];
    snprintf(options, sizeof options, "-DHEAD_DIM=%zu", dims->d);
    const size_t rows[2] = {dims->T, dims->B * dims->H};
    const iha_buffer inputs[5] = {r->qt, r->kt, r->vt, r->dout, r->lse};
    cl_kernel k;
    iha_args a;
    if (cfg->q_rows > 0) {
        IHA_FORWARD_IF_ERROR(iha__attention_backward_dq_local_enqueue(ctx, cfg, dims, r, mask, window, scale));
    } else {
        IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_backward.cl", options, "attention_bwd_dq_f32", &k));
        a = iha__args_begin(k);
        for (int i = 0; i < 5; ++i) arg_ref(&a, inputs[i]);
        iha__arg_mem(&a, r->delta);
        arg_ref(&a, r->dqt);
        iha__backward_mask_args(&a, dims, mask, window, scale, r->delta);
        IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 2, rows, NULL, "attention_bwd_dq_f32"));
    }
    if (cfg->kv_keys > 0) return iha__attention_backward_dkv_local_enqueue(ctx, cfg, dims, r, mask, window, scale);
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_backward.cl", options, "attention_bwd_dkv_f32", &k));
    a = iha__args_begin(k);
    for (int i = 0; i < 5; ++i) arg_ref(&a, inputs[i]);
    iha__arg_mem(&a, r->delta);
    arg_ref(&a, r->dkt);
    arg_ref(&a, r->dvt);
    iha__backward_mask_args(&a, dims, mask, window, scale, r->delta);
    return iha__launch(ctx, &a, 2, rows, NULL, "attention_bwd_dkv_f32");
}

/* Dt = dO . O per row into r->delta. */
static iha_status row_dots(iha_context *ctx, const iha_dims *dims, const iha_backward_refs *r)
{
    char options[48];
    snprintf(options, sizeof options, "-DHEAD_DIM=%zu", dims->d);
    const size_t rows[2] = {dims->T, dims->B * dims->H};
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_backward.cl", options, "attention_bwd_rowdot_f32", &k));
    iha_args a = iha__args_begin(k);
    arg_ref(&a, r->o);
    arg_ref(&a, r->dout);
    iha__arg_mem(&a, r->delta);
    iha__arg_int(&a, (cl_int)dims->T);
    return iha__launch(ctx, &a, 2, rows, NULL, "attention_bwd_rowdot_f32");
}

iha_status iha__attention_backward_enqueue_config(iha_context *ctx, const iha_dims *dims, const iha_backward_refs *r,
                                                  const iha_backward_config *cfg, int mask, size_t window, float scale)
{
    IHA_FORWARD_IF_ERROR(row_dots(ctx, dims, r));
    return gradients(ctx, cfg, dims, r, mask, window, scale);
}

iha_status iha__attention_backward_enqueue(iha_context *ctx, const iha_dims *dims, const iha_backward_refs *r,
                                           const iha_backward_config *cfg, int mask, size_t window, float scale)
{
    IHA_FORWARD_IF_ERROR(row_dots(ctx, dims, r));

    if (r->packed[0] == NULL) {
        iha_backward_config builtin;
        if (cfg == NULL) iha__attention_backward_config_default(ctx, dims->d, &builtin);
        return gradients(ctx, cfg ? cfg : &builtin, dims, r, mask, window, scale);
    }

    cl_int segs;
    char tiles[64];
    iha_args a;
    IHA_FORWARD_IF_ERROR(tiles_begin(ctx, dims, dims->T, tiles_of(cfg, dims->d), r, "attention_backward_tiles.cl",
                                     "attention_bwd_tiles_f32", tiles, &a, &segs));
    iha__backward_mask_args(&a, dims, mask, window, scale, r->delta);
    return tiles_end(ctx, &a, dims, r, "attention_backward_tiles.cl", "attention_bwd_tiles_f32", tiles, segs, 0);
}

iha_status iha__attention_partial_backward_enqueue(iha_context *ctx, const iha_dims *dims, const iha_block_rows *at,
                                                   const iha_backward_refs *r, int mask, cl_int window, float scale,
                                                   int first, int add)
{
    const char *file = "attention_partial_backward_tiles.cl", *kernel = "attention_partial_bwd_tiles_f32";
    cl_int segs;
    char tiles[64];
    iha_args a;
    IHA_FORWARD_IF_ERROR(tiles_begin(ctx, dims, at->Tk, iha__backward_tiles_default(dims->d), r, file, kernel, tiles,
                                     &a, &segs));
    iha__arg_int(&a, (cl_int)dims->T);
    iha__arg_int(&a, (cl_int)at->Tk);
    iha__arg_int(&a, at->q0);
    iha__arg_int(&a, at->k0);
    iha__arg_int(&a, at->Tg);
    iha__arg_int(&a, (cl_int)dims->P);
    iha__arg_int(&a, mask);
    iha__arg_int(&a, window);
    iha__arg_float(&a, scale);
    iha__arg_int(&a, add != 0);
    return tiles_end(ctx, &a, dims, r, file, kernel, tiles, segs, !first);
}
