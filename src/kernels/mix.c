/* Host side of cl/mix.cl and cl/mix_keys.cl (head mixing, interleaving, rotary) and cl/pack_keys.cl. */
#include <stdio.h>

#include "kernels/mix.h"
#include "common/checked.h"
#include "runtime/error.h"
#include "runtime/launch.h"

/* The built-in configurations of mixing and collapse, one row per kind of device (as zstd's
 * clevels.h). CPUs run a row per work-item with explicit vectors, GPUs an element per
 * work-item, coalesced. 16-wide rows (two AVX2 vectors per operation): collapse runs faster
 * than with 8-wide rows, and mixing no slower. One row per work-group on CPUs: as fast as 16,
 * and PoCL compiles a work-group of one work-item with no loop over work-items, which shortens
 * a new process's first call. */
static const iha_mix_collapse_config mix_collapse_defaults[2] = {
    /* per_row  MIX_VEC/COLLAPSE_VEC  rows per group */
    {1, 16, 1},  /* CPUs */
    {0, 16, 16}, /* GPUs */
};

void iha__mix_collapse_config_default(const iha_context *ctx, iha_mix_collapse_config *cfg)
{
    *cfg = mix_collapse_defaults[ctx->info.is_gpu ? 1 : 0];
}

void iha__mix_collapse_local_size(const iha_context *ctx, size_t columns, size_t local[3])
{
    size_t g = 64;
    while (g > 1 && g / 2 >= columns) g /= 2;
    local[0] = g;
    local[1] = ctx->info.is_gpu ? 1 : 512 / g;
    local[2] = 1;
}

size_t iha__packed_keys_elements(const iha_dims *dims, int key_block)
{
    size_t kb = (size_t)key_block, rows = iha__round_up(dims->T, kb), n;
    size_t f[4] = {dims->B, dims->H, rows, dims->d};
    return iha__mul_n(&n, 4, f) ? n : 0;
}

static iha_args args_begin(cl_kernel k, iha_buffer src, iha_buffer alpha, iha_buffer dst, int dst_offset, cl_mem rope,
                           int rope_per_batch)
{
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, src.mem, src.offset);
    iha__arg_mixing(&a, alpha.mem, alpha.offset, src.mem);
    if (dst_offset)
        iha__arg_tensor(&a, dst.mem, dst.offset);
    else
        iha__arg_mem(&a, dst.mem);
    iha__arg_mem(&a, rope ? rope : src.mem);
    iha__arg_int(&a, rope == NULL ? 0 : rope_per_batch ? 2 : 1);
    return a;
}

iha_args iha__mix_args_begin(cl_kernel k, iha_buffer src, iha_buffer alpha, iha_buffer dst, int dst_offset, cl_mem rope)
{
    return args_begin(k, src, alpha, dst, dst_offset, rope, 0);
}

/* The arguments every layer mixing kernel takes, in their order. */
static iha_args mix_args(cl_kernel k, const iha_dims *dims, iha_buffer src, iha_buffer alpha, iha_buffer dst, cl_mem rope)
{
    /* Packed sequences restart their positions, so each batch row has a table of its own. */
    iha_args a = args_begin(k, src, alpha, dst, 1, rope, dims->seq_bounds != NULL);
    iha__arg_int(&a, (cl_int)dims->N);
    iha__arg_int(&a, (cl_int)dims->H);
    iha__arg_int(&a, (cl_int)dims->d);
    iha__arg_int(&a, (cl_int)dims->P);
    return a;
}

/* The keys on the per-row (CPU) path: one work-item per key block (cl/mix_keys.cl). */
static iha_status mix_keys_blocks(iha_context *ctx, const iha_mix_collapse_config *cfg, const iha_dims *dims, iha_buffer src,
                                  iha_buffer alpha, iha_buffer dst, cl_mem rope, int key_block)
{
    char options[64];
    snprintf(options, sizeof options, "-DMIX_VEC=%d -DMIX_KB=%d", cfg->vec, key_block);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "mix_keys.cl", options, "mix_keys_blocks_f32", &k));
    iha_args a = mix_args(k, dims, src, alpha, dst, rope);
    const size_t blocks = (dims->T + (size_t)key_block - 1) / (size_t)key_block;
    const size_t global[2] = {blocks, dims->B * dims->H};
    const size_t local[2] = {cfg->group, 1};
    return iha__launch(ctx, &a, 2, global, local, "mix_keys_blocks_f32");
}

iha_status iha__mix_enqueue(iha_context *ctx, const iha_mix_collapse_config *cfg, const iha_dims *dims, iha_buffer src,
                            iha_buffer alpha, iha_buffer dst, cl_mem rope, int key_block)
{
    char options[64];
    snprintf(options, sizeof options, "-DMIX_VEC=%d", cfg->vec);
    if (cfg->per_row && key_block > 0) return mix_keys_blocks(ctx, cfg, dims, src, alpha, dst, rope, key_block);
    const char *name = cfg->per_row ? "mix_heads_rows_f32" : "mix_heads_f32";
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "mix.cl", options, name, &k));
    iha_args a = mix_args(k, dims, src, alpha, dst, rope);
    iha__arg_int(&a, key_block);
    if (cfg->per_row) {
        const size_t global[2] = {dims->N, dims->B * dims->H};
        const size_t local[2] = {cfg->group, 1};
        return iha__launch(ctx, &a, 2, global, local, name);
    }
    const size_t pairs = (dims->d + 1) / 2;
    const size_t rows = key_block ? iha__round_up(dims->T, (size_t)key_block) : dims->T;
    const size_t global[3] = {pairs, rows, dims->B * dims->H};
    size_t local[3];
    iha__mix_collapse_local_size(ctx, pairs, local);
    return iha__launch(ctx, &a, 3, global, local, name);
}

iha_status iha__pack_keys_enqueue(iha_context *ctx, const iha_dims *dims, iha_buffer src, iha_buffer dst, int key_block)
{
    cl_kernel k;
    if (!ctx->info.is_gpu) {
        /* CPUs: a key block per work-item (see cl/pack_keys.cl). */
        char options[32];
        snprintf(options, sizeof options, "-DPACK_KB=%d", key_block);
        IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "pack_keys.cl", options, "pack_keys_blocks_f32", &k));
        iha_args a = iha__args_begin(k);
        iha__arg_tensor(&a, src.mem, src.offset);
        iha__arg_tensor(&a, dst.mem, dst.offset);
        iha__arg_int(&a, (cl_int)dims->T);
        iha__arg_int(&a, (cl_int)dims->d);
        const size_t global[2] = {iha__round_up(dims->T, (size_t)key_block) / (size_t)key_block, dims->B * dims->H};
        const size_t local[2] = {1, 1};
        return iha__launch(ctx, &a, 2, global, local, "pack_keys_blocks_f32");
    }
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "pack_keys.cl", "", "pack_keys_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, src.mem, src.offset);
    iha__arg_tensor(&a, dst.mem, dst.offset);
    iha__arg_int(&a, (cl_int)dims->T);
    iha__arg_int(&a, (cl_int)dims->d);
    iha__arg_int(&a, key_block);
    const size_t global[3] = {dims->d, iha__round_up(dims->T, (size_t)key_block), dims->B * dims->H};
    size_t local[3];
    iha__mix_collapse_local_size(ctx, dims->d, local);
    return iha__launch(ctx, &a, 3, global, local, "pack_keys_f32");
}
