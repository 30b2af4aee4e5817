/* Host side of decoding from a compact KV cache: cl/decode_mix.cl's decode_store_compact, and
 * cl/attention_decode_compact.cl or cl/attention_decode_compact_lanes.cl with the merge of
 * cl/decode_combine.clh. */
#include <stdint.h>
#include <stdio.h>

#include "kernels/decode_compact.h"
#include "runtime/error.h"
#include "runtime/launch.h"

/* cl/attention_decode_compact_lanes.cl: tokens per block at most, and the private floats a
 * work-item may keep (its stack), beyond which the per-head kernel runs. */
#define LANES_MAX_BLOCK 4
#define LANES_PRIVATE_FLOATS 32768

/* The built-in configurations, one row per kind of device (as zstd's clevels.h). CPUs: a
 * work-item takes up to 16 query rows (a generated token's P; a prefill chunk's 16, over which
 * the reading of each token is shared) of as many heads as its private budget allows, so a
 * generated token's K and V are read from memory once per split, and those rows lie across
 * vector lanes where the step allows (lanes); 8 work-items per core, splits of at least 64
 * tokens. GPUs: one head and one row per work-item, many work-items sharing a token's rows in
 * cache. */
/* clang-format off */
static const iha_decode_compact_config compact_defaults[2] = {
    /* rows heads vec min_split_tokens per_cu lanes */
    {16,   64,   16, 64,              8,     1}, /* CPUs */
    {1,    1,    16, 64,              64,    0}, /* GPUs */
};
/* clang-format on */

void iha__decode_compact_config_default(const iha_context *ctx, iha_decode_compact_config *cfg)
{
    *cfg = compact_defaults[ctx->info.is_gpu ? 1 : 0];
}

/* The configuration of a step: rows cut to the step's rows, heads to H and the private budget. */
static void config_of(const iha_context *ctx, const iha_decode_compact *dc, iha_decode_compact_config *cfg)
{
    if (dc->cfg.rows > 0)
        *cfg = dc->cfg;
    else
        iha__decode_compact_config_default(ctx, cfg);
    const size_t rows = dc->dd.k * dc->dd.P, vec = (size_t)cfg->vec;
    if ((size_t)cfg->rows > rows) cfg->rows = (int)rows;
    if (cfg->rows < 1) cfg->rows = 1;
    const size_t pad = (dc->dd.d + vec - 1) / vec * vec;
    size_t heads = IHA_DECODE_COMPACT_PRIVATE_FLOATS / ((size_t)cfg->rows * pad);
    if (heads < 1) heads = 1;
    if (heads > (size_t)cfg->heads) heads = (size_t)cfg->heads;
    if (heads > dc->dd.H) heads = dc->dd.H;
    cfg->heads = (int)heads;
}

/* Tokens a sequence's splits cover: the longest sequence's, at most what a ring holds. */
static size_t tokens_of(const iha_decode_compact *dc)
{
    const size_t tokens = (dc->dd.t_cur + dc->dd.P - 1) / dc->dd.P;
    return dc->dd.ring && tokens > dc->slots ? dc->slots : tokens;
}

/* *splits and the tokens per split, so that every split has work. */
static void splits_of(const iha_context *ctx, const iha_decode_compact *dc, const iha_decode_compact_config *cfg,
                      size_t *splits, size_t *per_split)
{
    const size_t tokens = tokens_of(dc), tile = (size_t)cfg->rows, rows = dc->dd.k * dc->dd.P;
    const size_t head_groups = (dc->dd.H + (size_t)cfg->heads - 1) / (size_t)cfg->heads;
    const size_t groups = (rows + tile - 1) / tile * dc->dd.B * head_groups;
    const size_t cus = ctx->info.compute_units ? ctx->info.compute_units : 1, want = (size_t)cfg->per_cu * cus;
    if (tokens == 0) { /* nothing cached and nothing appended: one empty split */
        *splits = *per_split = 1;
        return;
    }
    size_t n = (want + groups - 1) / groups;
    const size_t by_length = (tokens + (size_t)cfg->min_split_tokens - 1) / (size_t)cfg->min_split_tokens;
    if (n > by_length) n = by_length;
    if (n > IHA_DECODE_COMPACT_MAX_SPLITS) n = IHA_DECODE_COMPACT_MAX_SPLITS;
    if (n < 1) n = 1;
    /* A CPU runtime deals work-items to its cores: a total that is not a multiple of the cores
     * leaves one idle while the last ones run. */
    while (!ctx->info.is_gpu && (groups * n) % cus != 0 && n < IHA_DECODE_COMPACT_MAX_SPLITS && n < tokens) ++n;
    *per_split = (tokens + n - 1) / n;
    *splits = (tokens + *per_split - 1) / *per_split;
}

size_t iha__decode_compact_splits(const iha_context *ctx, const iha_decode_compact *dc)
{
    iha_decode_compact_config cfg;
    size_t splits, per_split;
    config_of(ctx, dc, &cfg);
    splits_of(ctx, dc, &cfg, &splits, &per_split);
    return splits;
}

/* A folded step's blocks of FOLD_TOKENS stored scores per sequence (cl/decode_combine.clh). */
#define FOLD_TOKENS 16
static size_t fold_blocks(const iha_decode_compact *dc)
{
    return (tokens_of(dc) + FOLD_TOKENS - 1) / FOLD_TOKENS;
}

/* The partial results: the softmax states (with a folded step's first pass, no outputs), then
 * for a folded step the scores and the splits' shares of Y. */
static size_t states_elements(const iha_context *ctx, const iha_decode_compact *dc)
{
    const iha_decode_dims *dd = &dc->dd;
    return dd->B * dd->H * dd->k * dd->P * iha__decode_compact_splits(ctx, dc) * (dd->d + 2);
}

/* Where a folded step's stored rows start: past the states, on a 64-byte boundary (the first
 * pass writes them with whole-vector stores). */
static size_t stored_offset(const iha_context *ctx, const iha_decode_compact *dc)
{
    return (states_elements(ctx, dc) + 15) / 16 * 16;
}

static size_t scores_elements(const iha_decode_compact *dc)
{
    const iha_decode_dims *dd = &dc->dd;
    /* Per token P exponentials and a maximum per query row; 16 more: the second pass reads
     * each token's sixteen at a time. */
    return dd->B * fold_blocks(dc) * FOLD_TOKENS * (dd->P + 1) * dd->H * dd->P + 16;
}

size_t iha__decode_compact_partial_elements(const iha_context *ctx, const iha_decode_compact *dc)
{
    const iha_decode_dims *dd = &dc->dd;
    if (!dc->fold) return states_elements(ctx, dc);
    return stored_offset(ctx, dc) + scores_elements(dc) + dd->B * iha__decode_compact_splits(ctx, dc) * dd->H * dd->d;
}

iha_status iha__decode_store_compact_enqueue(iha_context *ctx, const iha_decode_compact *dc, cl_mem k, cl_mem v,
                                             cl_mem keys, cl_mem values, cl_mem rope, cl_mem step)
{
    const iha_decode_dims *dd = &dc->dd;
    char options[64];
    snprintf(options, sizeof options, "-DCACHE_HALF=%d -DCACHE_BF16=%d -DKV_RING=%d", dd->half, dd->bf16, dd->ring);
    cl_kernel kernel;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "decode_mix.cl", options, "decode_store_compact", &kernel));
    iha_args a = iha__args_begin(kernel);
    iha__arg_mem(&a, k);
    iha__arg_mem(&a, v);
    iha__arg_mem(&a, keys);
    iha__arg_mem(&a, values);
    iha__arg_mem(&a, rope ? rope : k);
    iha__arg_int(&a, rope != NULL);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)dd->k);
    iha__arg_int(&a, (cl_int)dd->H);
    iha__arg_int(&a, (cl_int)dd->d);
    iha__arg_int(&a, (cl_int)dd->P);
    iha__arg_int(&a, (cl_int)dc->slots);
    const size_t global[2] = {dd->k, dd->B * dd->H};
    return iha__launch(ctx, &a, 2, global, NULL, "decode_store_compact");
}

/* A CPU runtime packs several work-items into one group when left to choose, whose private
 * tiles then live in memory and run on one core: one work-item per group there. */
static iha_status launch_attention(iha_context *ctx, iha_args *a, const size_t global[3], const char *name)
{
    static const size_t single[3] = {1, 1, 1};
    return iha__launch(ctx, a, 3, global, ctx->info.is_gpu ? NULL : single, name);
}

/* cl/attention_decode_compact.cl: identity mixing, GPUs, and shapes whose lanes tiles exceed
 * the private budget. */
static iha_status per_head_enqueue(iha_context *ctx, const iha_decode_compact *dc, const char *options,
                                   const size_t global[3], size_t splits, size_t per_split, iha_buffer q, cl_mem keys,
                                   cl_mem values, iha_buffer alpha_k, iha_buffer alpha_v, cl_mem angles,
                                   cl_mem partial, cl_mem step, int mask, size_t window, float scale)
{
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(
        iha__kernel_get(ctx, "attention_decode_compact.cl", options, "attention_decode_compact_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, q.mem, q.offset);
    iha__arg_mem(&a, keys);
    iha__arg_mem(&a, values);
    iha__arg_tensor(&a, alpha_k.mem ? alpha_k.mem : q.mem, alpha_k.mem ? alpha_k.offset : 0);
    iha__arg_tensor(&a, alpha_v.mem ? alpha_v.mem : q.mem, alpha_v.mem ? alpha_v.offset : 0);
    iha__arg_int(&a, alpha_k.mem == NULL);
    iha__arg_mem(&a, angles ? angles : q.mem);
    iha__arg_int(&a, angles != NULL);
    iha__arg_mem(&a, partial);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)(dc->dd.k * dc->dd.P));
    iha__arg_int(&a, (cl_int)dc->slots);
    iha__arg_int(&a, (cl_int)splits);
    iha__arg_int(&a, (cl_int)per_split);
    iha__arg_int(&a, mask);
    iha__arg_int(&a, (cl_int)window);
    iha__arg_float(&a, (cl_float)(scale * 1.4426950408889634));
    return launch_attention(ctx, &a, global, "attention_decode_compact_f32");
}

/* Lanes per vector of cl/attention_decode_compact_lanes.cl: 16 where the configuration's vector
 * width and the device's native one are 16 floats (AVX-512, where an 8-lane vector fills half a
 * register), else 8. */
static size_t lanes_width(const iha_context *ctx, const iha_decode_compact_config *cfg)
{
    return cfg->vec >= 16 && ctx->vector_floats >= 16 ? 16 : 8;
}

/* Tokens per block of cl/attention_decode_compact_lanes.cl (DEC_TB) for a step, 0 where its
 * private arrays (the kernel's query rows, accs, alphas, block of K and V, weights and scores;
 * with rotary the rotated query rows, the pseudo-keys and the scores' two layouts) exceed
 * LANES_PRIVATE_FLOATS. */
static size_t lanes_block(const iha_context *ctx, const iha_decode_compact *dc, const iha_decode_compact_config *cfg,
                          int rope)
{
    const size_t H = dc->dd.H, P = dc->dd.P, d = dc->dd.d, L = lanes_width(ctx, cfg), rows = (size_t)cfg->rows;
    const size_t groups = (rows * (size_t)cfg->heads + L - 1) / L, raw = (H + L - 1) / L;
    const size_t keys = ((size_t)cfg->heads * P + L - 1) / L;
    /* The scores' inputs: with rotary the rotated query rows, the pseudo-keys, the scores' two
     * layouts and alpha_K by key lane; without, the query rows and alpha_K by row lane. */
    const size_t scores = rope ? (rows + 1) * d * keys * L + rows * keys * L + P * groups * L + 2 * keys * H * L
                               : d * (raw > groups ? raw : groups) * L + 2 * groups * H * P * L;
    const size_t fixed = scores + d * groups * L + 2 * groups * H * P * L + 2 * groups * H * L + 6 * groups * L;
    for (size_t tb = LANES_MAX_BLOCK; tb >= 1; tb /= 2)
        if (fixed + tb * (2 * H * d + groups * H * L + groups * P * L) <= LANES_PRIVATE_FLOATS) return tb;
    return 0;
}

/* cl/attention_decode_compact_lanes.cl: the mixing matrices present. */
static iha_status lanes_enqueue(iha_context *ctx, const iha_decode_compact *dc, const iha_decode_compact_config *cfg,
                                const size_t global[3], size_t splits, size_t per_split, iha_buffer q, iha_buffer q_raw,
                                cl_mem keys, cl_mem values, iha_buffer alpha_q, iha_buffer alpha_k, iha_buffer alpha_v,
                                cl_mem angles, cl_mem partial, cl_mem step, int mask, size_t window, float scale,
                                size_t block, int fold)
{
    const iha_decode_dims *dd = &dc->dd;
    /* Without rotary a tile of one token's P rows reads the token's H raw query rows instead. */
    const int raw_q = (size_t)cfg->rows == dd->P && angles == NULL;
    char options[256];
    snprintf(options, sizeof options,
             "-DHEAD_DIM=%zu -DDEC_H=%zu -DDEC_P=%zu -DDEC_ROWS=%d -DDEC_HEADS=%d -DDEC_RAW_Q=%d -DDEC_ROPE=%d "
             "-DDEC_TB=%zu -DDEC_LANES=%zu -DDEC_PREFETCH=%d -DDEC_FOLD=%d -DKV_HALF=%d -DKV_BF16=%d -DKV_RING=%d",
             dd->d, dd->H, dd->P, cfg->rows, cfg->heads, raw_q, angles != NULL, block, lanes_width(ctx, cfg),
             ctx->cpu_prefetch, fold, dd->half, dd->bf16, dd->ring);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(
        iha__kernel_get(ctx, "attention_decode_compact_lanes.cl", options, "attention_decode_compact_lanes_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, q.mem, q.offset);
    iha__arg_mem(&a, keys);
    iha__arg_mem(&a, values);
    iha__arg_tensor(&a, alpha_k.mem, alpha_k.offset);
    iha__arg_tensor(&a, alpha_v.mem, alpha_v.offset);
    iha__arg_tensor(&a, q_raw.mem, q_raw.offset);
    iha__arg_tensor(&a, alpha_q.mem, alpha_q.offset);
    iha__arg_int(&a, (cl_int)dd->k);
    iha__arg_mem(&a, angles ? angles : q.mem);
    iha__arg_mem(&a, partial);
    iha__arg_ulong(&a, fold ? stored_offset(ctx, dc) : 0);
    iha__arg_int(&a, fold ? (cl_int)fold_blocks(dc) : 0);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)(dd->k * dd->P));
    iha__arg_int(&a, (cl_int)dc->slots);
    iha__arg_int(&a, (cl_int)splits);
    iha__arg_int(&a, (cl_int)per_split);
    iha__arg_int(&a, mask);
    iha__arg_int(&a, (cl_int)window);
    iha__arg_float(&a, (cl_float)(scale * 1.4426950408889634));
    return launch_attention(ctx, &a, global, "attention_decode_compact_lanes_f32");
}

/* A step's configuration, splits and attention work-items (row tiles, splits, (b, head group)). */
static void geometry_of(const iha_context *ctx, const iha_decode_compact *dc, iha_decode_compact_config *cfg,
                        size_t *splits, size_t *per_split, size_t global[3])
{
    const iha_decode_dims *dd = &dc->dd;
    config_of(ctx, dc, cfg);
    splits_of(ctx, dc, cfg, splits, per_split);
    const size_t rows = dd->k * dd->P, tile = (size_t)cfg->rows;
    const size_t head_groups = (dd->H + (size_t)cfg->heads - 1) / (size_t)cfg->heads;
    global[0] = (rows + tile - 1) / tile;
    global[1] = *splits;
    global[2] = dd->B * head_groups;
}

iha_status iha__decode_compact_attention_enqueue(iha_context *ctx, const iha_decode_compact *dc, iha_buffer q,
                                                 iha_buffer q_raw, cl_mem keys, cl_mem values, iha_buffer alpha_q,
                                                 iha_buffer alpha_k, iha_buffer alpha_v, cl_mem angles,
                                                 cl_mem partial, iha_buffer o, cl_mem step, int mask, size_t window,
                                                 float scale)
{
    const iha_decode_dims *dd = &dc->dd;
    iha_decode_compact_config cfg;
    size_t splits, per_split, global[3];
    geometry_of(ctx, dc, &cfg, &splits, &per_split, global);
    char options[192];
    snprintf(options, sizeof options,
             "-DHEAD_DIM=%zu -DDEC_H=%zu -DDEC_P=%zu -DDEC_ROWS=%d -DDEC_HEADS=%d -DDEC_VD=%d -DKV_HALF=%d "
             "-DKV_BF16=%d -DKV_RING=%d",
             dd->d, dd->H, dd->P, cfg.rows, cfg.heads, cfg.vec, dd->half, dd->bf16, dd->ring);
    const size_t block =
        cfg.lanes && alpha_q.mem && alpha_k.mem && alpha_v.mem ? lanes_block(ctx, dc, &cfg, angles != NULL) : 0;
    if (block)
        IHA_FORWARD_IF_ERROR(lanes_enqueue(ctx, dc, &cfg, global, splits, per_split, q, q_raw, keys, values, alpha_q,
                                           alpha_k, alpha_v, angles, partial, step, mask, window, scale, block, 0));
    else
        IHA_FORWARD_IF_ERROR(per_head_enqueue(ctx, dc, options, global, splits, per_split, q, keys, values, alpha_k,
                                              alpha_v, angles, partial, step, mask, window, scale));

    return iha__decode_combine_enqueue(ctx, dd, partial, o, step, splits);
}

int iha__decode_compact_can_fold(const iha_context *ctx, const iha_decode_compact *dc, int rope, int mixing)
{
    iha_decode_compact_config cfg;
    config_of(ctx, dc, &cfg);
    return mixing && cfg.lanes && dc->dd.k == 1 && lanes_block(ctx, dc, &cfg, rope) != 0;
}

iha_status iha__decode_compact_fold_enqueue(iha_context *ctx, const iha_decode_compact *dc, iha_buffer q,
                                            iha_buffer q_raw, cl_mem keys, cl_mem values, iha_buffer alpha_q,
                                            iha_buffer alpha_k, iha_buffer alpha_v, iha_buffer r, cl_mem angles,
                                            cl_mem partial, iha_buffer y, cl_mem step, int mask, size_t window,
                                            float scale)
{
    const iha_decode_dims *dd = &dc->dd;
    iha_decode_compact_config cfg;
    size_t splits, per_split, global[3];
    geometry_of(ctx, dc, &cfg, &splits, &per_split, global);
    const size_t block = lanes_block(ctx, dc, &cfg, angles != NULL);
    IHA_RETURN_ERROR_IF(!dc->fold || block == 0 || r.mem == NULL, ctx, IHA_ERROR_UNSUPPORTED,
                        "a folded decoding step planned where its first pass does not fit");
    IHA_FORWARD_IF_ERROR(lanes_enqueue(ctx, dc, &cfg, global, splits, per_split, q, q_raw, keys, values, alpha_q,
                                       alpha_k, alpha_v, angles, partial, step, mask, window, scale, block, 1));

    char options[160];
    snprintf(options, sizeof options,
             "-DHEAD_DIM=%zu -DDEC_H=%zu -DDEC_P=%zu -DDEC_PREFETCH=%d -DKV_HALF=%d -DKV_BF16=%d -DKV_RING=%d", dd->d,
             dd->H, dd->P, ctx->cpu_prefetch, dd->half, dd->bf16, dd->ring);
    const size_t stored = stored_offset(ctx, dc), shares = stored + scores_elements(dc);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_decode_fold.cl", options, "attention_decode_fold_values", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_mem(&a, partial);
    iha__arg_ulong(&a, stored);
    iha__arg_int(&a, (cl_int)fold_blocks(dc));
    iha__arg_mem(&a, partial);
    iha__arg_ulong(&a, shares);
    iha__arg_mem(&a, values);
    iha__arg_tensor(&a, alpha_v.mem, alpha_v.offset);
    iha__arg_tensor(&a, r.mem, r.offset);
    iha__arg_mem(&a, step);
    iha__arg_int(&a, (cl_int)dc->slots);
    iha__arg_int(&a, (cl_int)splits);
    iha__arg_int(&a, (cl_int)per_split);
    iha__arg_int(&a, mask);
    iha__arg_int(&a, (cl_int)window);
    const size_t values_global[3] = {splits, dd->B, 1};
    IHA_FORWARD_IF_ERROR(launch_attention(ctx, &a, values_global, "attention_decode_fold_values"));

    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_decode_fold.cl", options, "attention_decode_fold_sum", &k));
    a = iha__args_begin(k);
    iha__arg_mem(&a, partial);
    iha__arg_ulong(&a, shares);
    iha__arg_tensor(&a, y.mem, y.offset);
    iha__arg_int(&a, (cl_int)splits);
    const size_t sum_global[2] = {dd->H * dd->d, dd->B};
    return iha__launch(ctx, &a, 2, sum_global, NULL, "attention_decode_fold_sum");
}
