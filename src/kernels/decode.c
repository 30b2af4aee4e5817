/* Host side of the decoding kernels: cl/decode_mix.cl, and cl/attention_decode.cl, which
 * includes cl/attention.cl and shares its register tile, so decoding runs the same micro-kernel. */
#include <stdint.h>
#include <stdio.h>

#include "kernels/decode.h"
#include "kernels/mix.h"
#include "runtime/error.h"
#include "runtime/launch.h"

/* Splits a row may have: DEC_MAX_SPLITS of cl/attention_decode.cl (its merge keeps a weight per
 * split); cl/attention_decode_groups.cl's merge keeps none, so a step of one sequence may have
 * several splits per compute unit and head. */
#define DECODE_MAX_SPLITS 64
#define DECODE_GROUP_MAX_SPLITS 256

/* The built-in configurations of the decode kernels, one row per kind of device and head width
 * (as zstd's clevels.h): the first row of the device's kind whose max_d is at least d applies.
 * The attention kernel's tile (a 4-row tile of 16-wide vectors on CPUs, 2 rows past d = 128; one
 * row per work-item on GPUs), splits of at least 256 keys. CPUs: 8 work-items per core, one per
 * work-group (PoCL left to choose packs the work into a few groups with the tiles in memory);
 * GPUs: cl/attention_decode_groups.cl, 128 work-items per work-group reading 2 keys each per
 * tile (256 keys, the split's minimum), 4 query rows per work-group (cut to the step's rows)
 * and 4 work-groups per compute unit; where its local memory does not fit, register tiles of one
 * row with about 1024 work-items in all (per_cu 0 here: the power of 2 nearest 1024 / compute
 * units). vec is the widest of 16, 8 and 4 within d. */
typedef struct decode_default {
    int gpu;             /* the kind of device */
    size_t max_d;        /* the widest head the row is for */
    iha_decode_config c; /* vec from d; per_cu 0: from the compute units */
} decode_default;

/* clang-format off */
static const decode_default decode_defaults[] = {
    /* gpu max_d      rows vec group min_split_keys per_cu variant keys */
    {0,    128,      {4,   0,  1,    256,           8,     0,      1}},
    {0,    SIZE_MAX, {2,   0,  1,    256,           8,     0,      1}},
    {1,    SIZE_MAX, {4,   4,  128,  256,           4,     1,      2}},
    {1,    SIZE_MAX, {1,   0,  0,    256,           0,     0,      1}},
};
/* clang-format on */

size_t iha__decode_group_local_bytes(int rows, size_t group, int keys, size_t head_dim)
{
    return sizeof(float) * (size_t)rows * (head_dim + group * (size_t)keys + group);
}

/* Whether the device can run variant 1 in cfg at all (the kernel's own work-group limit is
 * checked at launch). */
static int group_variant_fits(const iha_context *ctx, const iha_decode_config *cfg, size_t head_dim)
{
    return cfg->group <= ctx->info.max_work_group_size &&
           iha__decode_group_local_bytes(cfg->rows, cfg->group, cfg->keys, head_dim) <= ctx->info.local_mem_bytes;
}

/* The configuration of a row of decode_defaults at head width d. */
static void row_config(const iha_context *ctx, const decode_default *row, size_t head_dim, iha_decode_config *cfg)
{
    *cfg = row->c;
    if (cfg->variant == 0) cfg->vec = head_dim >= 16 ? 16 : (head_dim >= 8 ? 8 : 4);
    if (cfg->per_cu == 0) {
        const size_t cus = ctx->info.compute_units ? ctx->info.compute_units : 1;
        int per_cu = 1;
        while (per_cu < 128 && (size_t)per_cu * 2 * cus <= 1024 * 3 / 2) per_cu *= 2; /* nearest power of 2 */
        cfg->per_cu = per_cu;
    }
}

/* The first row of the device's kind for head width d; only_tiles: the first of variant 0.
 * Every kind ends with a variant 0 row of max_d SIZE_MAX. */
static void default_of(const iha_context *ctx, size_t head_dim, int only_tiles, iha_decode_config *cfg)
{
    const int gpu = ctx->info.is_gpu != 0;
    const decode_default *row = &decode_defaults[0];
    while (row->gpu != gpu || row->max_d < head_dim ||
           (row->c.variant == 1 && (only_tiles || !group_variant_fits(ctx, &row->c, head_dim))))
        ++row;
    row_config(ctx, row, head_dim, cfg);
}

void iha__decode_config_default(const iha_context *ctx, size_t head_dim, iha_decode_config *cfg)
{
    default_of(ctx, head_dim, 0, cfg);
}

static void config_of(const iha_context *ctx, const iha_decode_dims *dd, iha_decode_config *cfg)
{
    if (dd->tune.rows > 0)
        *cfg = dd->tune;
    else
        iha__decode_config_default(ctx, dd->d, cfg);
}

/* Either kernel of cl/decode_mix.cl: the new tokens' queries into rows dst (cache NULL), or their
 * keys or values into the cache (then the cache's length t_max and key_block follow). */
static iha_status decode_mix(iha_context *ctx, const iha_decode_dims *dd, iha_buffer src, iha_buffer alpha,
                             iha_buffer dst, cl_mem cache, cl_mem rope, cl_mem step, int key_block)
{
    const char *name = cache ? "decode_mix_cache" : "decode_mix_queries_f32";
    char options[64];
    snprintf(options, sizeof options, "-DCACHE_HALF=%d -DCACHE_BF16=%d -DKV_RING=%d", cache && dd->half,
             cache && dd->bf16, dd->ring);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "decode_mix.cl", options, name, &k));
    iha_args a = iha__mix_args_begin(k, src, alpha, cache ? (iha_buffer){cache, 0} : dst, cache == NULL, rope);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)dd->k);
    iha__arg_int(&a, (cl_int)dd->H);
    iha__arg_int(&a, (cl_int)dd->d);
    iha__arg_int(&a, (cl_int)dd->P);
    if (cache) {
        iha__arg_int(&a, (cl_int)dd->t_max);
        iha__arg_int(&a, key_block);
    }
    const size_t global[2] = {dd->k, dd->B * dd->H};
    return iha__launch(ctx, &a, 2, global, NULL, name);
}

iha_status iha__decode_mix_queries_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_buffer src,
                                           iha_buffer alpha, iha_buffer dst, cl_mem rope, cl_mem step)
{
    return decode_mix(ctx, dd, src, alpha, dst, NULL, rope, step, 0);
}

iha_status iha__decode_mix_cache_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_buffer src, iha_buffer alpha,
                                         cl_mem cache, cl_mem rope, cl_mem step, int key_block)
{
    return decode_mix(ctx, dd, src, alpha, (iha_buffer){cache, 0}, cache, rope, step, key_block);
}

/* The device kind's register-tile configuration: the fallback of variant 1 where a kernel built
 * for it allows fewer work-items per work-group than it needs. */
static void fallback_config(const iha_context *ctx, size_t head_dim, iha_decode_config *cfg)
{
    default_of(ctx, head_dim, 1, cfg);
}

/* Key blocks per split, so that every split has work: equal ranges of whole blocks. */
static size_t blocks_per_split(const iha_decode_dims *dd, size_t splits)
{
    const size_t kb = (size_t)dd->cfg.key_block, blocks = (dd->t_cur + kb - 1) / kb;
    return (blocks + splits - 1) / splits;
}

static size_t splits_of(const iha_context *ctx, const iha_decode_dims *dd, const iha_decode_config *cfg)
{
    const size_t most = cfg->variant == 1 ? DECODE_GROUP_MAX_SPLITS : DECODE_MAX_SPLITS;
    const size_t tile = (size_t)cfg->rows, rows = dd->k * dd->P, groups = (rows + tile - 1) / tile * dd->B * dd->H;
    const size_t cus = ctx->info.compute_units ? ctx->info.compute_units : 1, want = (size_t)cfg->per_cu * cus;
    const size_t kb = (size_t)dd->cfg.key_block, blocks = (dd->t_cur + kb - 1) / kb;
    if (blocks == 0) return 1; /* nothing cached and nothing appended (every count 0): one empty split */
    size_t splits = (want + groups - 1) / groups;
    const size_t by_length = (dd->t_cur + (size_t)cfg->min_split_keys - 1) / (size_t)cfg->min_split_keys;
    if (splits > by_length) splits = by_length;
    if (splits > most) splits = most;
    if (splits < 1) splits = 1;
    /* A CPU runtime deals work-groups to its cores: a total that is not a multiple of the
     * cores leaves one idle while the last work-items run (3 of them on 2 cores: 75%). */
    while (!ctx->info.is_gpu && (groups * splits) % cus != 0 && splits < most && splits < blocks) ++splits;
    /* Equal ranges of whole blocks, none empty (64 splits of 100 blocks would leave 14 idle). */
    return (blocks + blocks_per_split(dd, splits) - 1) / blocks_per_split(dd, splits);
}

size_t iha__decode_splits(const iha_context *ctx, const iha_decode_dims *dd)
{
    iha_decode_config cfg;
    config_of(ctx, dd, &cfg);
    return splits_of(ctx, dd, &cfg);
}

/* Room for variant 1's splits and for its fallback's, whichever runs. */
size_t iha__decode_partial_elements(const iha_context *ctx, const iha_decode_dims *dd)
{
    iha_decode_config cfg;
    config_of(ctx, dd, &cfg);
    size_t splits = splits_of(ctx, dd, &cfg);
    if (cfg.variant == 1) {
        fallback_config(ctx, dd->d, &cfg);
        const size_t other = splits_of(ctx, dd, &cfg);
        if (other > splits) splits = other;
    }
    return dd->B * dd->H * dd->k * dd->P * splits * (dd->d + 2);
}

/* The arguments both partial kernels take, in order. */
static iha_args partial_args(cl_kernel k, const iha_decode_dims *dd, iha_buffer q, cl_mem keys, cl_mem values,
                             cl_mem partial, cl_mem step, size_t splits, int mask, size_t window, float scale)
{
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, q.mem, q.offset);
    iha__arg_mem(&a, keys);
    iha__arg_mem(&a, values);
    iha__arg_mem(&a, partial);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)(dd->k * dd->P));
    iha__arg_int(&a, (cl_int)dd->H);
    iha__arg_int(&a, (cl_int)dd->P);
    iha__arg_int(&a, (cl_int)dd->t_max);
    iha__arg_int(&a, (cl_int)splits);
    iha__arg_int(&a, (cl_int)blocks_per_split(dd, splits));
    iha__arg_int(&a, mask);
    iha__arg_int(&a, (cl_int)window);
    iha__arg_float(&a, (cl_float)(scale * 1.4426950408889634));
    return a;
}

static iha_args merge_args(cl_kernel k, const iha_decode_dims *dd, cl_mem partial, iha_buffer o, cl_mem step,
                           size_t splits)
{
    iha_args a = iha__args_begin(k);
    iha__arg_mem(&a, partial);
    iha__arg_tensor(&a, o.mem, o.offset);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)(dd->k * dd->P));
    iha__arg_int(&a, (cl_int)dd->H);
    iha__arg_int(&a, (cl_int)dd->P);
    iha__arg_int(&a, (cl_int)splits);
    return a;
}

/* Variant 1 (cl/attention_decode_groups.cl); *ran 0 when the kernel built for cfg allows fewer
 * work-items per work-group than it needs, and nothing was enqueued. */
static iha_status groups_enqueue(iha_context *ctx, const iha_decode_dims *dd, const iha_decode_config *cfg,
                                 iha_buffer q, cl_mem keys, cl_mem values, cl_mem partial, iha_buffer o, cl_mem step,
                                 int mask, size_t window, float scale, int *ran)
{
    char options[192];
    snprintf(options, sizeof options,
             "-DHEAD_DIM=%zu -DATT_KB=%d -DDEC_ROWS=%d -DDEC_GROUP=%zu -DDEC_KEYS=%d -DKV_HALF=%d -DKV_BF16=%d "
             "-DKV_RING=%d",
             dd->d, dd->cfg.key_block, cfg->rows, cfg->group, cfg->keys, dd->half, dd->bf16, dd->ring);
    cl_kernel k;
    *ran = 0;
    IHA_FORWARD_IF_ERROR(
        iha__kernel_get(ctx, "attention_decode_groups.cl", options, "attention_decode_groups_f32", &k));
    size_t most = 0;
    IHA_CL_CHECK(ctx, clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof most, &most, NULL),
                 "clGetKernelWorkGroupInfo (decode work-group)");
    if (most < cfg->group) return IHA_OK;
    *ran = 1;
    const size_t splits = splits_of(ctx, dd, cfg), rows = dd->k * dd->P, tile = (size_t)cfg->rows;
    iha_args a = partial_args(k, dd, q, keys, values, partial, step, splits, mask, window, scale);
    const size_t global[3] = {(rows + tile - 1) / tile * cfg->group, splits, dd->B * dd->H},
                 local[3] = {cfg->group, 1, 1};
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 3, global, local, "attention_decode_groups_f32"));

    IHA_FORWARD_IF_ERROR(
        iha__kernel_get(ctx, "attention_decode_groups.cl", options, "attention_decode_groups_merge_f32", &k));
    a = merge_args(k, dd, partial, o, step, splits);
    const size_t global2[3] = {dd->d, rows, dd->B * dd->H};
    return iha__launch(ctx, &a, 3, global2, NULL, "attention_decode_groups_merge_f32");
}

iha_status iha__decode_attention_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_buffer q, cl_mem keys,
                                         cl_mem values, cl_mem partial, iha_buffer o, cl_mem step, int mask,
                                         size_t window, float scale)
{
    iha_decode_config cfg;
    config_of(ctx, dd, &cfg);
    if (cfg.variant == 1) {
        int ran = 0;
        IHA_FORWARD_IF_ERROR(
            groups_enqueue(ctx, dd, &cfg, q, keys, values, partial, o, step, mask, window, scale, &ran));
        if (ran) return IHA_OK;
        fallback_config(ctx, dd->d, &cfg);
    }
    char options[176];
    snprintf(options, sizeof options,
             "-DHEAD_DIM=%zu -DATT_ROWS=%d -DATT_TILES=1 -DATT_KB=%d -DATT_VD=%d -DKV_HALF=%d -DKV_BF16=%d "
             "-DKV_RING=%d",
             dd->d, cfg.rows, dd->cfg.key_block, cfg.vec, dd->half, dd->bf16, dd->ring);
    const size_t splits = splits_of(ctx, dd, &cfg);
    const size_t rows = dd->k * dd->P, tile = (size_t)cfg.rows;

    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_decode.cl", options, "attention_decode_partial_f32", &k));
    iha_args a = partial_args(k, dd, q, keys, values, partial, step, splits, mask, window, scale);
    /* Work-items past the last split return at once (OpenCL 1.2 needs whole work-groups). */
    const size_t group = cfg.group, along = group ? (splits + group - 1) / group * group : splits;
    const size_t global[3] = {(rows + tile - 1) / tile, along, dd->B * dd->H}, local[3] = {1, group, 1};
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 3, global, group ? local : NULL, "attention_decode_partial_f32"));

    return iha__decode_combine_enqueue(ctx, dd, partial, o, step, splits);
}

iha_status iha__decode_combine_enqueue(iha_context *ctx, const iha_decode_dims *dd, cl_mem partial, iha_buffer o,
                                       cl_mem step, size_t splits)
{
    char options[32];
    snprintf(options, sizeof options, "-DHEAD_DIM=%zu", dd->d);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "decode_combine.cl", options, "attention_decode_combine_f32", &k));
    iha_args a = merge_args(k, dd, partial, o, step, splits);
    const size_t global2[2] = {dd->k * dd->P, dd->B * dd->H};
    return iha__launch(ctx, &a, 2, global2, NULL, "attention_decode_combine_f32");
}
