/* Host side of the local-memory (GPU) variants of the attention kernel: cl/attention_local.cl
 * (a row per work-item) and cl/attention_local_tiles.cl (register sub-tiles). */
#include "kernels/attention.h"
#include "runtime/error.h"

#include <stdio.h>

#include "runtime/launch.h"

/* Both kernels: a work-group of `threads` work-items per `rows` query rows of one (b, h). */
static iha_status launch(iha_context *ctx, const char *file, const char *name, const char *options, int rows,
                         size_t threads, const iha_dims *dims, iha_buffer qt, iha_buffer kt_packed, iha_buffer vt, iha_buffer o,
                         iha_buffer lse, int mask, size_t window, float scale)
{
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, file, options, name, &k));
    iha_args a = iha__args_begin(k);
    iha__attention_args(&a, dims, qt, kt_packed, vt, o, lse, mask, window, scale);
    const size_t global[2] = {(dims->T + (size_t)rows - 1) / (size_t)rows * threads, dims->B * dims->H};
    const size_t local[2] = {threads, 1};
    return iha__launch(ctx, &a, 2, global, local, name);
}

size_t iha__attention_local_bytes(size_t head_dim, int keys)
{
    return 2 * (size_t)keys * head_dim * sizeof(float);
}

int iha__attention_local_fits(const iha_context *ctx, size_t head_dim, int rows, int keys, int key_block)
{
    return rows >= 1 && keys >= key_block && keys % key_block == 0 && (size_t)rows <= ctx->info.max_work_group_size &&
           iha__attention_local_bytes(head_dim, keys) <= ctx->info.local_mem_bytes;
}

iha_status iha__attention_local_enqueue(iha_context *ctx, int rows, int keys, int key_block, const iha_dims *dims,
                                        iha_buffer qt, iha_buffer kt_packed, iha_buffer vt, iha_buffer o, iha_buffer lse, int mask,
                                        size_t window, float scale)
{
    IHA_RETURN_ERROR_IF(!iha__attention_local_fits(ctx, dims->d, rows, keys, key_block), ctx, IHA_ERROR_UNSUPPORTED,
                        "the local-memory attention tile (%d rows, %d keys, d=%zu: %zu bytes) does not fit this "
                        "device (%zu work-items, %llu bytes of local memory)",
                        rows, keys, dims->d, iha__attention_local_bytes(dims->d, keys),
                        ctx->info.max_work_group_size, (unsigned long long)ctx->info.local_mem_bytes);
    char options[128];
    snprintf(options, sizeof options, "-DHEAD_DIM=%zu -DATT_KB=%d -DLOC_ROWS=%d -DLOC_KEYS=%d", dims->d, key_block,
             rows, keys);
    return launch(ctx, "attention_local.cl", "attention_fwd_local_f32", options, rows, (size_t)rows, dims, qt,
                  kt_packed, vt, o, lse, mask, window, scale);
}

/* The sub-tile grid of attention_local_tiles.cl: NX work-items across keys, each owning the
 * output columns c = tx (mod NX) of the head width padded to DP. */
static size_t tiles_nx(const iha_attention_tiles *t)
{
    return t->tile_rx > 0 && t->keys >= t->tile_rx ? (size_t)(t->keys / t->tile_rx) : 1;
}
static size_t tiles_dp(size_t head_dim, const iha_attention_tiles *t)
{
    return (head_dim + tiles_nx(t) - 1) / tiles_nx(t) * tiles_nx(t);
}

/* Local memory of attention_local_tiles.cl: the query tile, the key and value tiles (head width
 * padded to DP), the probabilities and the row maxima's partials. */
size_t iha__attention_tiles_bytes(size_t head_dim, const iha_attention_tiles *t)
{
    const size_t dp = tiles_dp(head_dim, t), r = (size_t)(t->rows > 0 ? t->rows : 0), k = (size_t)(t->keys > 0 ? t->keys : 0);
    return (dp * r + 2 * dp * k + k * r + r * tiles_nx(t)) * sizeof(float);
}

size_t iha__attention_tiles_threads(const iha_attention_tiles *t)
{
    return t->tile_ry > 0 && t->tile_rx > 0 && t->rows > 0 && t->keys > 0
               ? (size_t)(t->rows / t->tile_ry) * (size_t)(t->keys / t->tile_rx)
               : 0;
}

/* What a work-item keeps live through a key tile: its scores, its output columns of each row,
 * and per row the running maximum, sum and visible interval. */
long iha__attention_tiles_live_floats(size_t head_dim, const iha_attention_tiles *t)
{
    const long cw = (long)(tiles_dp(head_dim, t) / tiles_nx(t));
    return (long)t->tile_ry * t->tile_rx + (long)t->tile_ry * cw + 4L * t->tile_ry;
}

static int sub_tile_side(int n) { return n == 4 || n == 8; }

int iha__attention_tiles_fits(const iha_context *ctx, size_t head_dim, const iha_attention_tiles *t, int key_block)
{
    return sub_tile_side(t->tile_ry) && sub_tile_side(t->tile_rx) && t->rows >= t->tile_ry &&
           t->rows % t->tile_ry == 0 && t->keys >= t->tile_rx && t->keys % t->tile_rx == 0 && key_block > 0 &&
           t->keys % key_block == 0 && iha__attention_tiles_threads(t) <= ctx->info.max_work_group_size &&
           iha__attention_tiles_bytes(head_dim, t) <= ctx->info.local_mem_bytes;
}

iha_status iha__attention_tiles_enqueue(iha_context *ctx, const iha_attention_tiles *t, int key_block,
                                        const iha_dims *dims, iha_buffer qt, iha_buffer kt_packed, iha_buffer vt,
                                        iha_buffer o, iha_buffer lse, int mask, size_t window, float scale)
{
    IHA_RETURN_ERROR_IF(!iha__attention_tiles_fits(ctx, dims->d, t, key_block), ctx, IHA_ERROR_UNSUPPORTED,
                        "the attention tile of %d rows and %d keys in %d x %d sub-tiles (key blocks of %d, d=%zu: "
                        "%zu work-items, %zu bytes) is not a valid shape or does not fit this device (%zu "
                        "work-items, %llu bytes of local memory)",
                        t->rows, t->keys, t->tile_ry, t->tile_rx, key_block, dims->d, iha__attention_tiles_threads(t),
                        iha__attention_tiles_bytes(dims->d, t), ctx->info.max_work_group_size,
                        (unsigned long long)ctx->info.local_mem_bytes);
    char options[160];
    snprintf(options, sizeof options,
             "-DHEAD_DIM=%zu -DATT_KB=%d -DLOC_ROWS=%d -DLOC_KEYS=%d -DTILE_RY=%d -DTILE_RX=%d", dims->d, key_block,
             t->rows, t->keys, t->tile_ry, t->tile_rx);
    return launch(ctx, "attention_local_tiles.cl", "attention_fwd_local_tiles_f32", options, t->rows,
                  iha__attention_tiles_threads(t), dims, qt, kt_packed, vt, o, lse, mask, window, scale);
}
