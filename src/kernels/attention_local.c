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

/* Local memory of attention_local_tiles.cl: the query tile, the key and value tiles (head width
 * padded to whole sets of keys/4 columns), the probabilities and two reduction rows. */
size_t iha__attention_tiles_bytes(size_t head_dim, int rows, int keys)
{
    const size_t nx = (size_t)(keys > 0 ? keys : 4) / 4, dp = (head_dim + nx - 1) / nx * nx;
    const size_t r = (size_t)rows, k = (size_t)keys;
    return (dp * r + 2 * dp * k + k * r + 2 * r * nx) * sizeof(float);
}

int iha__attention_tiles_fits(const iha_context *ctx, size_t head_dim, int rows, int keys, int key_block)
{
    return rows >= 4 && rows % 4 == 0 && keys >= 4 && keys % 4 == 0 && keys % key_block == 0 &&
           (size_t)(rows / 4) * (size_t)(keys / 4) <= ctx->info.max_work_group_size &&
           iha__attention_tiles_bytes(head_dim, rows, keys) <= ctx->info.local_mem_bytes;
}

iha_status iha__attention_tiles_enqueue(iha_context *ctx, int rows, int keys, int key_block, const iha_dims *dims,
                                        iha_buffer qt, iha_buffer kt_packed, iha_buffer vt, iha_buffer o, iha_buffer lse, int mask,
                                        size_t window, float scale)
{
    IHA_RETURN_ERROR_IF(!iha__attention_tiles_fits(ctx, dims->d, rows, keys, key_block), ctx, IHA_ERROR_UNSUPPORTED,
                        "the attention tile of %d rows and %d keys (d=%zu: %d work-items, %zu bytes) does not fit "
                        "this device (%zu work-items, %llu bytes of local memory)",
                        rows, keys, dims->d, rows / 4 * (keys / 4), iha__attention_tiles_bytes(dims->d, rows, keys),
                        ctx->info.max_work_group_size, (unsigned long long)ctx->info.local_mem_bytes);
    char options[128];
    snprintf(options, sizeof options, "-DHEAD_DIM=%zu -DATT_KB=%d -DTILE_ROWS=%d -DTILE_KEYS=%d", dims->d, key_block,
             rows, keys);
    return launch(ctx, "attention_local_tiles.cl", "attention_fwd_local_tiles_f32", options, rows,
                  (size_t)(rows / 4) * (size_t)(keys / 4), dims, qt, kt_packed, vt, o, lse, mask, window, scale);
}
