/* Host side of the OpenCL kernels in cl/: argument packing, build options, launch geometry.
 * Callers (src/layer) have validated shapes; these functions only enqueue. */
#ifndef IHA_KERNELS_KERNELS_H
#define IHA_KERNELS_KERNELS_H
#include "runtime/context.h"

struct iha_args; /* runtime/launch.h */

/* Dimensions shared by the stages of one layer. */
typedef struct iha_dims {
    size_t B, N, H, d, P, T;
} iha_dims;

/* A device tensor position: buffer plus element offset. */
typedef struct iha_ref {
    cl_mem mem;
    size_t offset;
} iha_ref;

/* Configuration of the attention kernel, chosen per device and bucket. Three variants:
 *   0: cl/attention.cl's register tiles (CPUs): rows, tiles and vec shape a work-item's tile;
 *   1: cl/attention_local.cl's local-memory tiles (GPUs): `group` work-items, one query row
 *      each, stream tiles of local_keys keys through local memory;
 *   2: cl/attention_local_tiles.cl (GPUs): `group` query rows and tiles of local_keys keys in
 *      local memory, each work-item a 4 x 4 register sub-tile of the scores (group/4 *
 *      local_keys/4 work-items).
 * key_block is the packed key layout's block for all. */
typedef struct iha_attention_config {
    int rows;       /* ATT_ROWS: query rows per register tile */
    int tiles;      /* ATT_TILES: register tiles per work-item, sharing each key block */
    int key_block;  /* ATT_KB: keys per block, 4, 8 or 16 */
    int vec;        /* ATT_VD: vector width over d in P.V, 4, 8 or 16 */
    size_t group;   /* work-items per work-group (variant 1: LOC_ROWS; variant 2: TILE_ROWS, query rows) */
    int variant;    /* 0: register tiles, 1: local-memory tiles, 2: local tiles with register sub-tiles */
    int local_keys; /* variants 1 and 2: keys per local tile (LOC_KEYS, TILE_KEYS), a multiple of key_block */
    int prefetch;   /* ATT_PREFETCH of variant 0: 1 prefetches the next key block's values */
} iha_attention_config;

void iha__attention_config_default(const iha_context *ctx, size_t head_dim, iha_attention_config *cfg);

/* Variant and vector width of the memory-bound kernels (mix.cl, mix_keys.cl, collapse.cl). */
typedef struct iha_rows_config {
    int per_row;  /* 1: the *_rows_f32 variant (a row per work-item, explicit vectors; CPUs);
                     0: an element per work-item (coalesced; GPUs) */
    int vec;      /* MIX_VEC / COLLAPSE_VEC: 4, 8 or 16 */
    size_t group; /* rows per work-group in the per-row variant */
} iha_rows_config;

void iha__rows_config_default(const iha_context *ctx, iha_rows_config *cfg);

/* Work-group shape for the memory-bound kernels, whose dimension 0 runs over `columns`
 * contiguous elements and dimension 1 over rows: a GPU wants 64 work-items along the columns
 * for coalescing; PoCL on a CPU pays per work-group, so it gets groups of about 512 work-items
 * (measured: groups of 8 made mixing 10x slower than its memory traffic). */
void iha__rows_local_size(const iha_context *ctx, size_t columns, size_t local[3]);

/* Elements of the key-block layout for dims (B*H*ceil(T/KB)*KB*d); 0 on overflow. */
size_t iha__packed_keys_elements(const iha_dims *dims, int key_block);

/* Mixing (cl/mix.cl; the keys on CPUs cl/mix_keys.cl): src [B][N][H][d] -> dst rows
 * [B][H][T][d], or the key-block layout when key_block > 0. alpha.mem NULL means identity
 * (P == 1). rope NULL means no rotary. */
iha_status iha__mix_enqueue(iha_context *ctx, const iha_rows_config *cfg, const iha_dims *dims, iha_ref src,
                            iha_ref alpha, iha_ref dst, cl_mem rope, int key_block);
/* Collapse (cl/collapse.cl): o [B][H][T][d] -> y [B][N][H][d]. r.mem NULL means identity. */
iha_status iha__collapse_enqueue(iha_context *ctx, const iha_rows_config *cfg, const iha_dims *dims, iha_ref o,
                                 iha_ref r, iha_ref y);
/* Repacking (cl/pack_keys.cl): keys as rows [B*H][T][d] -> key-block layout. */
iha_status iha__pack_keys_enqueue(iha_context *ctx, const iha_dims *dims, iha_ref src, iha_ref dst, int key_block);
/* Kernel `name` of cl/<file> built with the options of the register-tile configuration cfg
 * (variant 0) and head_dim: attention_fwd_f32 of attention.cl, or attention_loops_f32 of
 * measure_attention_loops.cl (iha_measure_attention_loops), which includes attention.cl and must
 * compile its loops exactly as attention_fwd_f32 does. */
iha_status iha__attention_kernel_get(iha_context *ctx, const iha_attention_config *cfg, size_t head_dim,
                                     const char *file, const char *name, cl_kernel *out);
/* Attention (cl/attention.cl) over rows qt, vt, o and packed keys; lse.mem may be NULL.
 * window is in tokens (0: global) and already clamped below N. */
iha_status iha__attention_enqueue(iha_context *ctx, const iha_attention_config *cfg, const iha_dims *dims,
                                  iha_ref qt, iha_ref kt_packed, iha_ref vt, iha_ref o, iha_ref lse, int mask,
                                  size_t window, float scale);
/* The backward pass of attention: its tensors (see iha_attention_backward) and workspace. */
typedef struct iha_backward_refs {
    iha_ref qt, kt, vt, o, lse, dout; /* inputs; lse is the natural log */
    iha_ref dqt, dkt, dvt;            /* outputs */
    cl_mem delta;                     /* B*H*T floats */
    cl_mem packed[2]; /* Q and dO in 16-column blocks: given, the tile kernel runs (any head
                         width); NULL, the row kernels */
    cl_mem partial;   /* with packed: the tile kernel's partial dq sums */
} iha_backward_refs;
/* Nonzero when the backward should run the register-tile kernel (cl/attention_backward_tiles.cl)
 * on this device, which needs two packed copies of iha__packed_keys_elements(dims, 16) floats
 * each and iha__attention_backward_partial_elements floats of partial sums. */
int iha__attention_backward_tiled(const iha_context *ctx, size_t head_dim);
/* The tile kernel's partial sums, in floats, into *elements; returns 0 when the count overflows size_t. */
int iha__attention_backward_partial_elements(const iha_context *ctx, const iha_dims *dims, size_t *elements);
/* Dt = dO . O per row, then the gradients: with packed buffers one pass for dkt, dvt and the
 * partial sums of dqt, then their sum into dqt; without, dqt, then dkt and dvt. Every output
 * element is written. */
iha_status iha__attention_backward_enqueue(iha_context *ctx, const iha_dims *dims, const iha_backward_refs *refs,
                                           int mask, size_t window, float scale);
/* ---- The layer backward's other steps (cl/layer_backward.cl) ---- */
/* dst [cols][rows] = transpose of src [rows][cols], with row strides ld_src and ld_dst; rows and
 * cols below INT_MAX. */
iha_status iha__transpose_enqueue(iha_context *ctx, size_t rows, size_t cols, iha_ref src, size_t ld_src, iha_ref dst,
                                  size_t ld_dst);
/* The gradient through the rotary embedding, in place on x [B][H][T][d] (d even): the inverse
 * rotation at each row's virtual position, with iha__rope_table's table. */
iha_status iha__rope_inverse_enqueue(iha_context *ctx, const iha_dims *dims, iha_ref x, cl_mem table);
/* g [H][H][P] = sum over b, n, c of tokens[b][n][i][c] * pseudo[b][j][n*P+p][c], the form of the
 * gradients of R (tokens dY, pseudo O) and of alpha (tokens Q, pseudo dQt); tokens is
 * [B][N][H][d], pseudo [B][H][T][d], and partial holds iha__mix_grad_partial_elements floats. */
size_t iha__mix_grad_partial_elements(const iha_dims *dims);
iha_status iha__mix_grad_enqueue(iha_context *ctx, const iha_dims *dims, iha_ref tokens, iha_ref pseudo,
                                 cl_mem partial, iha_ref g);

/* The local-memory variant (cl/attention_local.cl, for GPUs): `rows` work-items per group, one
 * query row each, and tiles of `keys` keys (a multiple of key_block) staged in local memory.
 * Same inputs and outputs as iha__attention_enqueue. IHA_ERROR_UNSUPPORTED when the group or
 * its 2*keys*d floats of local memory do not fit the device (iha__attention_local_fits). */
size_t iha__attention_local_bytes(size_t head_dim, int keys);
int iha__attention_local_fits(const iha_context *ctx, size_t head_dim, int rows, int keys, int key_block);
iha_status iha__attention_local_enqueue(iha_context *ctx, int rows, int keys, int key_block, const iha_dims *dims,
                                        iha_ref qt, iha_ref kt_packed, iha_ref vt, iha_ref o, iha_ref lse, int mask,
                                        size_t window, float scale);
/* The local tiles with register sub-tiles (cl/attention_local_tiles.cl, for GPUs): `rows` query
 * rows per group (a multiple of 4), tiles of `keys` keys (a multiple of 4 and of key_block),
 * rows/4 * keys/4 work-items. Same inputs and outputs as iha__attention_enqueue;
 * IHA_ERROR_UNSUPPORTED when the group or its local memory does not fit the device. */
size_t iha__attention_tiles_bytes(size_t head_dim, int rows, int keys);
int iha__attention_tiles_fits(const iha_context *ctx, size_t head_dim, int rows, int keys, int key_block);
iha_status iha__attention_tiles_enqueue(iha_context *ctx, int rows, int keys, int key_block, const iha_dims *dims,
                                        iha_ref qt, iha_ref kt_packed, iha_ref vt, iha_ref o, iha_ref lse, int mask,
                                        size_t window, float scale);
/* The arguments every attention variant takes, in their order. */
void iha__attention_args(struct iha_args *a, const iha_dims *dims, iha_ref qt, iha_ref kt_packed, iha_ref vt,
                         iha_ref o, iha_ref lse, int mask, size_t window, float scale);
/* ---- Decoding (cl/decode_mix.cl and the decode kernels of cl/attention.cl) ---- */

/* The decode kernels' configuration (src/tune/space_decode.c tunes it): the register tile and
 * vector width of attention.cl's decode kernels, the work-group along the key splits, and the
 * split policy: enough (tile, split) work-items for about per_cu per compute unit, but splits
 * of at least min_split_keys keys so that the merge stays cheap. */
typedef struct iha_decode_config {
    int rows;            /* ATT_ROWS of the decode kernels: query rows per work-item */
    int vec;             /* ATT_VD: 4, 8 or 16 */
    size_t group;        /* work-items per work-group along the splits; 0: the driver chooses */
    int min_split_keys;  /* virtual keys per split at least */
    int per_cu;          /* work-items wanted per compute unit */
} iha_decode_config;

void iha__decode_config_default(const iha_context *ctx, size_t head_dim, iha_decode_config *cfg);

/* A decoding step's geometry: B sequences of k new tokens; the cache holds values in rows
 * [B][H][t_max][d] and keys in the key-block layout with cfg.key_block keys per block. */
typedef struct iha_decode_dims {
    size_t B, k, H, d, P, t_max;
    size_t t_cur;  /* the longest sequence's virtual length after the step (sizes the splits) */
    int half;      /* the cache stores half */
    iha_attention_config cfg; /* only key_block is used: the cache's layout */
    iha_decode_config tune;   /* rows 0 (not chosen): iha__decode_config_default */
} iha_decode_dims;

/* Pseudo-queries of the new tokens -> rows [B][H][k*P][d]. step: int[2B] of (n0, count). */
iha_status iha__decode_mix_queries_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_ref src, iha_ref alpha,
                                           iha_ref dst, cl_mem rope, cl_mem step);
/* Pseudo-keys (key_block > 0) or -values (key_block 0) of the new tokens -> the cache at their
 * virtual positions. */
iha_status iha__decode_mix_cache_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_ref src, iha_ref alpha,
                                         cl_mem cache, cl_mem rope, cl_mem step, int key_block);
/* Split-key attention of q rows [B][H][k*P][d] against the caches -> o rows of the same shape;
 * `partial` must hold iha__decode_partial_elements floats. */
size_t iha__decode_splits(const iha_context *ctx, const iha_decode_dims *dd);
size_t iha__decode_partial_elements(const iha_context *ctx, const iha_decode_dims *dd);
iha_status iha__decode_attention_enqueue(iha_context *ctx, const iha_decode_dims *dd, iha_ref q, cl_mem keys,
                                         cl_mem values, cl_mem partial, iha_ref o, cl_mem step, int mask,
                                         size_t window, float scale);

/* ---- Half-precision storage (cl/convert.cl) ---- */

/* n elements from half to float or back (round to nearest even). */
iha_status iha__convert_enqueue(iha_context *ctx, int to_half, iha_ref src, iha_ref dst, size_t n);
/* y [m][C] = x [m][K] * w [K][C] with float x and y and half w, read directly. */
iha_status iha__gemv_half_weights_enqueue(iha_context *ctx, size_t m, size_t C, size_t K, iha_ref x, iha_ref w,
                                          iha_ref y);

/* The rotary cos/sin table [T][2][d/2] for positions 0..T-1 and head width d (computed in double on the
 * host, cached in the context while T, d and base stay the same). */
iha_status iha__rope_table(iha_context *ctx, size_t T, size_t d, float base, cl_mem *out);
#endif
