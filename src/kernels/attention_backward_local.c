/* Host side of cl/attention_backward_local.cl, the GPU backward with local-memory tiles: the
 * configuration per device, what fits, and the launches of its two passes. */
#include "kernels/attention_backward.h"
#include "kernels/attention.h"
#include "runtime/error.h"

#include <stdio.h>

#include "runtime/launch.h"

/* Accumulator columns per work-item at most: a dK/dV work-item keeps 8 of them per column set
 * (4 keys of dK and of dV), a dQ work-item 4, beside 32 floats of score and dP sub-tiles. 16
 * keeps a dK/dV work-item within 160 or so registers, which GPUs hold without spilling. */
#define MAX_COLUMNS 16

static size_t pad_to(size_t x, size_t n) { return (x + n - 1) / n * n; }

size_t iha__backward_kv_local_bytes(size_t head_dim, int keys, int queries)
{
    const size_t nq = queries >= 4 ? (size_t)queries / 4 : 1, dp = pad_to(head_dim, nq);
    const size_t ks = (size_t)(keys > 0 ? keys : 0) + 4, qs = (size_t)(queries > 0 ? queries : 0) + 4;
    return (2 * dp * ks + 2 * dp * qs + 2 * (qs - 4) * ks) * sizeof(float);
}

size_t iha__backward_q_local_bytes(size_t head_dim, int rows, int keys)
{
    const size_t nk = keys >= 4 ? (size_t)keys / 4 : 1, dp = pad_to(head_dim, nk);
    const size_t qs = (size_t)(rows > 0 ? rows : 0) + 4, ks = (size_t)(keys > 0 ? keys : 0) + 4;
    return (2 * dp * qs + 2 * dp * ks + (ks - 4) * qs) * sizeof(float);
}

int iha__backward_tile_shape_fits(size_t head_dim, int along, int across, size_t max_group)
{
    if (along < 4 || along % 4 || across < 4 || across % 4) return 0;
    const size_t threads = (size_t)(along / 4) * (size_t)(across / 4);
    const size_t columns = pad_to(head_dim, (size_t)across / 4) / ((size_t)across / 4);
    return threads <= max_group && columns <= MAX_COLUMNS;
}

static int tile_fits(const iha_context *ctx, size_t head_dim, int along, int across, size_t bytes)
{
    return iha__backward_tile_shape_fits(head_dim, along, across, ctx->info.max_work_group_size) &&
           bytes <= ctx->info.local_mem_bytes;
}

int iha__backward_kv_fits(const iha_context *ctx, size_t head_dim, int keys, int queries)
{
    return tile_fits(ctx, head_dim, keys, queries, iha__backward_kv_local_bytes(head_dim, keys, queries));
}

int iha__backward_q_fits(const iha_context *ctx, size_t head_dim, int rows, int keys)
{
    return tile_fits(ctx, head_dim, rows, keys, iha__backward_q_local_bytes(head_dim, rows, keys));
}

/* The built-in tiles in order of preference (as attention.c's attention_defaults): the first
 * that fits the device's local memory, work-group size and MAX_COLUMNS applies to each pass on
 * its own, and a pass none fits takes its row kernel. Larger groups share each loaded tile among
 * more work-items (a 64 x 32 dK/dV tile reads each query tile once per 64 keys); 32 streamed
 * rows split the columns of d = 128 into 8 x 16. Widths past what fits run the row kernels. */
static const int kv_tiles[][2] = {{64, 32}, {32, 32}, {32, 64}, {16, 32}, {16, 64}, {64, 16}, {32, 16}};
static const int q_tiles[][2] = {{64, 32}, {32, 32}, {32, 64}, {16, 32}, {16, 64}, {64, 16}, {32, 16}};
#define TILE_CHOICES (sizeof kv_tiles / sizeof kv_tiles[0])

void iha__attention_backward_config_default(const iha_context *ctx, size_t head_dim, iha_backward_config *cfg)
{
    *cfg = (iha_backward_config){0, 0, 0, 0, iha__backward_tiles_default(head_dim)};
    /* CPUs run the register-tile kernels or the row kernels (iha__attention_backward_tiled). A
     * driver that ends loops early keeps the row kernels, which walk fewer iterations per
     * work-item than a tile walks per query tile. */
    if (!ctx->info.is_gpu || ctx->loop_flag != NULL) return;
    for (size_t i = 0; i < TILE_CHOICES && cfg->kv_keys == 0; ++i)
        if (iha__backward_kv_fits(ctx, head_dim, kv_tiles[i][0], kv_tiles[i][1]))
            cfg->kv_keys = kv_tiles[i][0], cfg->kv_queries = kv_tiles[i][1];
    for (size_t i = 0; i < TILE_CHOICES && cfg->q_rows == 0; ++i)
        if (iha__backward_q_fits(ctx, head_dim, q_tiles[i][0], q_tiles[i][1]))
            cfg->q_rows = q_tiles[i][0], cfg->q_keys = q_tiles[i][1];
}

iha_status iha__attention_backward_local_kernel(iha_context *ctx, const iha_backward_config *cfg, size_t head_dim,
                                                const char *name, cl_kernel *out)
{
    char options[160];
    snprintf(options, sizeof options, "-DHEAD_DIM=%zu -DBWL_KEYS=%d -DBWL_QUERIES=%d -DBWL_ROWS=%d -DBWL_TILE_KEYS=%d",
             head_dim, cfg->kv_keys > 0 ? cfg->kv_keys : 32, cfg->kv_queries > 0 ? cfg->kv_queries : 32,
             cfg->q_rows > 0 ? cfg->q_rows : 32, cfg->q_keys > 0 ? cfg->q_keys : 32);
    return iha__kernel_get(ctx, "attention_backward_local.cl", options, name, out);
}

/* Both passes read the same inputs first and launch a work-group of `threads` work-items per
 * `rows` rows (query rows for dq, key rows for dk and dv) of one (b, h). */
static void input_args(iha_args *a, const iha_backward_refs *r)
{
    const iha_buffer inputs[5] = {r->qt, r->kt, r->vt, r->dout, r->lse};
    for (int i = 0; i < 5; ++i) iha__arg_tensor(a, inputs[i].mem, inputs[i].offset);
    iha__arg_mem(a, r->delta);
}

static iha_status launch_tiles(iha_context *ctx, iha_args *a, const iha_dims *dims, int rows, size_t threads,
                               const char *name)
{
    const size_t global[2] = {(dims->T + (size_t)rows - 1) / (size_t)rows * threads, dims->B * dims->H};
    const size_t local[2] = {threads, 1};
    return iha__launch(ctx, a, 2, global, local, name);
}

iha_status iha__attention_backward_dq_local_enqueue(iha_context *ctx, const iha_backward_config *cfg,
                                                    const iha_dims *dims, const iha_backward_refs *r, int mask,
                                                    size_t window, float scale)
{
    IHA_RETURN_ERROR_IF(!iha__backward_q_fits(ctx, dims->d, cfg->q_rows, cfg->q_keys), ctx, IHA_ERROR_UNSUPPORTED,
                        "the backward's dq tile of %d rows and %d keys (d=%zu: %zu bytes) does not fit this device "
                        "(%zu work-items, %llu bytes of local memory, %d columns per work-item)",
                        cfg->q_rows, cfg->q_keys, dims->d, iha__backward_q_local_bytes(dims->d, cfg->q_rows, cfg->q_keys),
                        ctx->info.max_work_group_size, (unsigned long long)ctx->info.local_mem_bytes, MAX_COLUMNS);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__attention_backward_local_kernel(ctx, cfg, dims->d, "attention_bwd_dq_local_f32", &k));
    iha_args a = iha__args_begin(k);
    input_args(&a, r);
    iha__arg_tensor(&a, r->dqt.mem, r->dqt.offset);
    iha__backward_mask_args(&a, dims, mask, window, scale, r->delta);
    return launch_tiles(ctx, &a, dims, cfg->q_rows, (size_t)(cfg->q_rows / 4) * (size_t)(cfg->q_keys / 4),
                        "attention_bwd_dq_local_f32");
}

iha_status iha__attention_backward_dkv_local_enqueue(iha_context *ctx, const iha_backward_config *cfg,
                                                     const iha_dims *dims, const iha_backward_refs *r, int mask,
                                                     size_t window, float scale)
{
    IHA_RETURN_ERROR_IF(!iha__backward_kv_fits(ctx, dims->d, cfg->kv_keys, cfg->kv_queries), ctx, IHA_ERROR_UNSUPPORTED,
                        "the backward's dk/dv tile of %d keys and %d queries (d=%zu: %zu bytes) does not fit this "
                        "device (%zu work-items, %llu bytes of local memory, %d columns per work-item)",
                        cfg->kv_keys, cfg->kv_queries, dims->d,
                        iha__backward_kv_local_bytes(dims->d, cfg->kv_keys, cfg->kv_queries),
                        ctx->info.max_work_group_size, (unsigned long long)ctx->info.local_mem_bytes, MAX_COLUMNS);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__attention_backward_local_kernel(ctx, cfg, dims->d, "attention_bwd_dkv_local_f32", &k));
    iha_args a = iha__args_begin(k);
    input_args(&a, r);
    iha__arg_tensor(&a, r->dkt.mem, r->dkt.offset);
    iha__arg_tensor(&a, r->dvt.mem, r->dvt.offset);
    iha__backward_mask_args(&a, dims, mask, window, scale, r->delta);
    return launch_tiles(ctx, &a, dims, cfg->kv_keys, (size_t)(cfg->kv_keys / 4) * (size_t)(cfg->kv_queries / 4),
                        "attention_bwd_dkv_local_f32");
}
