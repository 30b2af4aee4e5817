/* Decoding: the new tokens' mixing into the cache (cl/decode_mix.cl) and split-key attention
 * (cl/attention_decode.cl). */
#ifndef IHA_KERNELS_DECODE_H
#define IHA_KERNELS_DECODE_H
#include "kernels/attention.h"

/* The decode kernels' configuration (src/tune/space_decode.c tunes it). Variant 0
 * (cl/attention_decode.cl): the register tile and vector width of attention.cl's kernels, one
 * work-item per (tile, split), the work-group along the splits. Variant 1
 * (cl/attention_decode_groups.cl): a work-group of `group` work-items per (row tile, split),
 * reading `keys` keys per work-item and tile. Both: the split policy, enough (tile, split)
 * work-items (variant 1: work-groups) for about per_cu per compute unit, but splits of at least
 * min_split_keys keys so that the merge stays cheap. */
typedef struct iha_decode_config {
    int rows;           /* query rows per work-item (variant 0, ATT_ROWS) or per work-group (1) */
    int vec;            /* ATT_VD: 4, 8 or 16 (variant 0) */
    size_t group;       /* work-items per work-group; variant 0: along the splits, 0: the driver chooses */
    int min_split_keys; /* virtual keys per split at least */
    int per_cu;         /* work-items (variant 0) or work-groups (1) wanted per compute unit */
    int variant;        /* 0: register tiles, 1: a work-group per split */
    int keys;           /* variant 1: keys per work-item and tile */
} iha_decode_config;

/* Local memory of variant 1 in bytes: the query rows, a tile's probabilities and the reduction. */
size_t iha__decode_group_local_bytes(int rows, size_t group, int keys, size_t head_dim);

void iha__decode_config_default(const iha_context *ctx, size_t head_dim, iha_decode_config *cfg);

/* A decoding step's geometry: B sequences of k new tokens; the cache holds values in rows
 * [B][H][t_max][d] and keys in the key-block layout with cfg.key_block keys per block. */
typedef struct iha_decode_dims {
    size_t B, k, H, d, P, t_max;
    size_t t_cur; /* the longest sequence's virtual length after the step (sizes the splits) */
    int half;     /* the cache stores half */
    /* 1: the cache is a ring of t_max rows (a multiple of the key block), virtual position u at
     * row u mod t_max; t_cur then spans at most t_max + key_block keys (the blocks a sequence's
     * splits cover from its oldest held row), and rotary reads rows by the step's token
     * ([B][k*P], iha__rope_rows) instead of by position. */
    int ring;
    iha_attention_config cfg; /* only key_block is used: the cache's layout */
    iha_decode_config tune;   /* rows 0 (not chosen): iha__decode_config_default */
    int bf16;                 /* the cache stores bfloat16 (half is then 0) */
} iha_decode_dims;

/* Pseudo-queries of the new tokens -> rows [B][H][k*P][d]. step: int[2B] of (n0, count). */
iha_status iha__decode_mix_queries_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_buffer src,
                                           iha_buffer alpha, iha_buffer dst, cl_mem rope, cl_mem step);
/* Pseudo-keys (key_block > 0) or -values (key_block 0) of the new tokens -> the cache at their
 * virtual positions. */
iha_status iha__decode_mix_cache_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_buffer src, iha_buffer alpha,
                                         cl_mem cache, cl_mem rope, cl_mem step, int key_block);
/* Split-key attention of q rows [B][H][k*P][d] against the caches -> o rows of the same shape;
 * `partial` must hold iha__decode_partial_elements floats. */
size_t iha__decode_splits(const iha_context *ctx, const iha_decode_dims *dd);
size_t iha__decode_partial_elements(const iha_context *ctx, const iha_decode_dims *dd);
/* The merge of the splits' partial states (cl/decode_combine.cl, one program per head width)
 * into o, for either decoding kernel. */
iha_status iha__decode_combine_enqueue(iha_context *ctx, const iha_decode_dims *dd, cl_mem partial, iha_buffer o,
                                       cl_mem step, size_t splits);
iha_status iha__decode_attention_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_buffer q, cl_mem keys,
                                         cl_mem values, cl_mem partial, iha_buffer o, cl_mem step, int mask,
                                         size_t window, float scale);
#endif
