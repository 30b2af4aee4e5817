/* Host side of the tensor-core attention (cl/attention_mma_nv.cl): its local memory and
 * registers, whether it fits, and its launch: 32 work-items per 16 query rows. */
#include "kernels/attention.h"
#include "runtime/error.h"

#include <stdio.h>

#include "runtime/launch.h"

/* The head padded to whole k steps of 16 (the kernel's DP). */
static size_t padded_head(size_t head_dim) { return (head_dim + 15) / 16 * 16; }

/* The key tile [key][DP/2 + 4 words], the value tile [DP][keys/2 + 4 words] and the tile's flag;
 * the emulated path adds 384 floats of fragment exchange per warp (cl/mma_nv.clh). */
size_t iha__attention_mma_bytes(size_t head_dim, int keys, int emulated, int rows)
{
    const size_t dp = padded_head(head_dim), k = (size_t)(keys > 0 ? keys : 0);
    const size_t scratch = emulated && rows > 0 ? (size_t)rows / 16 * 384 * sizeof(float) : 0;
    return k * (dp / 2 + 4) * 4 + dp * (k / 2 + 4) * 4 + sizeof(int) + scratch;
}

/* A work-item's query fragments (DP/4 words), output accumulators (DP/2) and scores (keys/2). */
long iha__attention_mma_live_words(size_t head_dim, int keys)
{
    const long dp = (long)padded_head(head_dim);
    return dp / 4 + dp / 2 + keys / 2;
}

int iha__attention_mma_fits(const iha_context *ctx, size_t head_dim, int rows, int keys, int key_block)
{
    const int shape = (rows == 16 || rows == 32 || rows == 64 || rows == 128) &&
                      (keys == 16 || keys == 32 || keys == 64) && key_block > 0 && keys % key_block == 0;
    return ctx->mma != IHA_MMA_NONE && shape && 2 * (size_t)rows <= ctx->info.max_work_group_size &&
           iha__attention_mma_bytes(head_dim, keys, ctx->mma == IHA_MMA_EMULATED, rows) <= ctx->info.local_mem_bytes;
}

iha_status iha__attention_mma_enqueue(iha_context *ctx, int rows, int keys, int key_block, int bf16,
                                      const iha_dims *dims, iha_buffer qt, iha_buffer kt_packed, iha_buffer vt,
                                      iha_buffer o, iha_buffer lse, int mask, size_t window, float scale)
{
    IHA_RETURN_ERROR_IF(!iha__attention_mma_fits(ctx, dims->d, rows, keys, key_block), ctx, IHA_ERROR_UNSUPPORTED,
                        "the tensor-core attention (%d rows, %d keys, key blocks of %d, d=%zu) is not offered on this "
                        "device or does not fit it (%zu work-items, %llu bytes of local memory)",
                        rows, keys, key_block, dims->d, ctx->info.max_work_group_size,
                        (unsigned long long)ctx->info.local_mem_bytes);
    char options[160];
    snprintf(options, sizeof options, "-DHEAD_DIM=%zu -DATT_KB=%d -DMMA_WARPS=%d -DLOC_KEYS=%d -DMMA_BF16=%d%s",
             dims->d, key_block, rows / 16, keys, bf16, ctx->mma == IHA_MMA_EMULATED ? " -DIHA_MMA_EMULATE=1" : "");
    cl_kernel k;
    const iha_status st = iha__kernel_get(ctx, "attention_mma_nv.cl", options, "attention_fwd_mma_nv", &k);
    if (st == IHA_ERROR_BUILD && ctx->mma == IHA_MMA_HARDWARE) ctx->mma = IHA_MMA_NONE;
    IHA_FORWARD_IF_ERROR(st);
    iha_args a = iha__args_begin(k);
    iha__attention_args(&a, dims, qt, kt_packed, vt, o, lse, mask, window, scale);
    const size_t threads = 2 * (size_t)rows;
    const size_t global[2] = {(dims->T + (size_t)rows - 1) / (size_t)rows * threads, dims->B * dims->H};
    const size_t local[2] = {threads, 1};
    return iha__launch(ctx, &a, 2, global, local, "attention_fwd_mma_nv");
}
