/* Host side of the decoding kernels: cl/decode_mix.cl, and the decode kernels of
 * cl/attention.cl (which share its register tile, so decoding runs the same micro-kernel). */
#include <stdio.h>

#include "kernels/kernels.h"
#include "runtime/launch.h"

/* The key-split policy of the decode kernels in cl/attention.cl. */
#define DECODE_MAX_SPLITS 64 /* DEC_MAX_SPLITS in the kernel */
#define DECODE_MIN_SPLIT_KEYS 256


iha_status iha__decode_mix_queries_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_ref src, iha_ref alpha,
                                           iha_ref dst, cl_mem rope, cl_mem step)
{
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "decode_mix.cl", "-DCACHE_HALF=0", "decode_mix_queries_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, src.mem, src.offset);
    iha__arg_mixing(&a, alpha.mem, alpha.offset, src.mem);
    iha__arg_tensor(&a, dst.mem, dst.offset);
    iha__arg_mem(&a, rope ? rope : src.mem);
    iha__arg_int(&a, rope != NULL);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)dd->k);
    iha__arg_int(&a, (cl_int)dd->H);
    iha__arg_int(&a, (cl_int)dd->d);
    iha__arg_int(&a, (cl_int)dd->P);
    const size_t global[2] = {dd->k, dd->B * dd->H};
    return iha__launch(ctx, &a, 2, global, NULL, "decode_mix_queries_f32");
}

iha_status iha__decode_mix_cache_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_ref src, iha_ref alpha,
                                         cl_mem cache, cl_mem rope, cl_mem step, int key_block)
{
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "decode_mix.cl", dd->half ? "-DCACHE_HALF=1" : "-DCACHE_HALF=0",
                                         "decode_mix_cache", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, src.mem, src.offset);
    iha__arg_mixing(&a, alpha.mem, alpha.offset, src.mem);
    iha__arg_mem(&a, cache);
    iha__arg_mem(&a, rope ? rope : src.mem);
    iha__arg_int(&a, rope != NULL);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)dd->k);
    iha__arg_int(&a, (cl_int)dd->H);
    iha__arg_int(&a, (cl_int)dd->d);
    iha__arg_int(&a, (cl_int)dd->P);
    iha__arg_int(&a, (cl_int)dd->t_max);
    iha__arg_int(&a, key_block);
    const size_t global[2] = {dd->k, dd->B * dd->H};
    return iha__launch(ctx, &a, 2, global, NULL, "decode_mix_cache");
}

size_t iha__decode_splits(const iha_context *ctx, const iha_decode_dims *dd)
{
    /* Enough work-items to fill the device when few queries meet a long cache, but splits of
     * at least DECODE_MIN_SPLIT_KEYS keys so that the merge stays cheap. */
    const size_t tile = (size_t)dd->cfg.rows;
    const size_t rows = dd->k * dd->P, groups = (rows + tile - 1) / tile * dd->B * dd->H;
    const size_t want = ctx->info.is_gpu ? 1024 : 8 * (size_t)(ctx->info.compute_units ? ctx->info.compute_units : 1);
    size_t splits = (want + groups - 1) / groups;
    const size_t by_length = (dd->t_cur + DECODE_MIN_SPLIT_KEYS - 1) / DECODE_MIN_SPLIT_KEYS;
    if (splits > by_length) splits = by_length;
    if (splits > DECODE_MAX_SPLITS) splits = DECODE_MAX_SPLITS;
    return splits ? splits : 1;
}

size_t iha__decode_partial_elements(const iha_context *ctx, const iha_decode_dims *dd)
{
    return dd->B * dd->H * dd->k * dd->P * iha__decode_splits(ctx, dd) * (dd->d + 2);
}

iha_status iha__decode_attention_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_ref q, cl_mem keys,
                                         cl_mem values, cl_mem partial, iha_ref o, cl_mem step, int mask,
                                         size_t window, float scale)
{
    const iha_attention_config *cfg = &dd->cfg;
    char options[160];
    snprintf(options, sizeof options, "-DHEAD_DIM=%zu -DATT_ROWS=%d -DATT_TILES=1 -DATT_KB=%d -DATT_VD=%d -DKV_HALF=%d",
             dd->d, cfg->rows, cfg->key_block, cfg->vec, dd->half);
    const size_t splits = iha__decode_splits(ctx, dd);
    const size_t kb = (size_t)cfg->key_block, blocks = (dd->t_cur + kb - 1) / kb;
    const size_t split_blocks = (blocks + splits - 1) / splits;
    const size_t rows = dd->k * dd->P, tile = (size_t)cfg->rows;

    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention.cl", options, "attention_decode_partial_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, q.mem, q.offset);
    iha__arg_mem(&a, keys);
    iha__arg_mem(&a, values);
    iha__arg_mem(&a, partial);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)rows);
    iha__arg_int(&a, (cl_int)dd->H);
    iha__arg_int(&a, (cl_int)dd->P);
    iha__arg_int(&a, (cl_int)dd->t_max);
    iha__arg_int(&a, (cl_int)splits);
    iha__arg_int(&a, (cl_int)split_blocks);
    iha__arg_int(&a, mask);
    iha__arg_int(&a, (cl_int)window);
    iha__arg_float(&a, (cl_float)(scale * 1.4426950408889634));
    const size_t global[3] = {(rows + tile - 1) / tile, splits, dd->B * dd->H};
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 3, global, NULL, "attention_decode_partial_f32"));

    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention.cl", options, "attention_decode_combine_f32", &k));
    a = iha__args_begin(k);
    iha__arg_mem(&a, partial);
    iha__arg_tensor(&a, o.mem, o.offset);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)rows);
    iha__arg_int(&a, (cl_int)dd->H);
    iha__arg_int(&a, (cl_int)dd->P);
    iha__arg_int(&a, (cl_int)splits);
    const size_t global2[2] = {rows, dd->B * dd->H};
    return iha__launch(ctx, &a, 2, global2, NULL, "attention_decode_combine_f32");
}
