/* Host side of cl/attention_local.cl, the local-memory (GPU) variant of the attention kernel. */
#include "kernels/kernels.h"

#include <stdio.h>

#include "runtime/launch.h"

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
                                        iha_ref qt, iha_ref kt_packed, iha_ref vt, iha_ref o, iha_ref lse, int mask,
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
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_local.cl", options, "attention_fwd_local_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__attention_args(&a, dims, qt, kt_packed, vt, o, lse, mask, window, scale);
    const size_t global[2] = {(dims->T + (size_t)rows - 1) / (size_t)rows * (size_t)rows, dims->B * dims->H};
    const size_t local[2] = {(size_t)rows, 1};
    return iha__launch(ctx, &a, 2, global, local, "attention_fwd_local_f32");
}
