/* The attention kernels over the interleaved virtual sequence: register tiles (cl/attention.cl)
 * and the local-memory variants for GPUs (cl/attention_local.cl, cl/attention_local_tiles.cl). */
#ifndef IHA_KERNELS_ATTENTION_H
#define IHA_KERNELS_ATTENTION_H
#include "kernels/tensor.h"

struct iha_args; /* runtime/launch.h */

/* The attention kernel's three forms; the numbers are those of the tuning parameter "variant"
 * that profiles store. */
typedef enum iha_attention_variant {
    /* cl/attention.cl's register tiles (CPUs): rows, tiles and vec shape a work-item's tile */
    IHA_ATTENTION_REGISTER_TILES = 0,
    /* cl/attention_local.cl's local-memory tiles (GPUs): `group` work-items, one query row each,
     * stream tiles of local_keys keys through local memory */
    IHA_ATTENTION_LOCAL_ROWS = 1,
    /* cl/attention_local_tiles.cl (GPUs): `group` query rows and tiles of local_keys keys in local
     * memory, each work-item a tile_ry x tile_rx register sub-tile of the scores
     * (group/tile_ry * local_keys/tile_rx work-items) */
    IHA_ATTENTION_LOCAL_TILES = 2,
    /* cl/attention_mma_nv.cl (NVIDIA tensor cores, or their emulation): `group` query rows per
     * work-group, 16 per warp, and tiles of local_keys keys; Q.K^T and P.V on half inputs (3) or
     * bfloat16 inputs (4) with float accumulation, so only for 16-bit storage (doc/spec.md) */
    IHA_ATTENTION_MMA_F16 = 3,
    IHA_ATTENTION_MMA_BF16 = 4
} iha_attention_variant;

/* Configuration of the attention kernel, chosen per device and bucket. key_block is the packed
 * key layout's block for every variant. */
typedef struct iha_attention_config {
    int rows;       /* ATT_ROWS: query rows per register tile */
    int tiles;      /* ATT_TILES: register tiles per work-item, sharing each key block */
    int key_block;  /* ATT_KB: keys per block, 4, 8 or 16 */
    int vec;        /* ATT_VD: vector width over d in P.V, 4, 8 or 16 */
    size_t group;   /* register tiles: work-items per work-group; local variants: query rows per
                     * work-group (LOC_ROWS), which is also the work-items of the local rows */
    iha_attention_variant variant;
    int local_keys; /* local variants: keys per local tile (LOC_KEYS), a multiple of key_block */
    int prefetch;   /* ATT_PREFETCH of the register tiles: 1 prefetches the next key block's values */
    int tile_ry;    /* local tiles: TILE_RY, query rows of a work-item's score sub-tile, 4 or 8 */
    int tile_rx;    /* local tiles: TILE_RX, keys of a work-item's score sub-tile, 4 or 8 */
} iha_attention_config;

void iha__attention_config_default(const iha_context *ctx, size_t head_dim, iha_attention_config *cfg);

/* Kernel `name` of cl/<file> built with the options of the register-tile configuration cfg
 * (register tiles) and head_dim: attention_fwd_f32 of attention.cl, or attention_loops_f32 of
 * measure_attention_loops.cl (iha_measure_attention_loops), which includes attention.cl and must
 * compile its loops exactly as attention_fwd_f32 does. */
iha_status iha__attention_kernel_get(iha_context *ctx, const iha_attention_config *cfg, size_t head_dim,
                                     const char *file, const char *name, cl_kernel *out);
/* Attention (cl/attention.cl) over rows qt, vt, o and packed keys; lse.mem may be NULL.
 * window is in tokens (0: global) and already clamped below N. */
iha_status iha__attention_enqueue(iha_context *ctx, const iha_attention_config *cfg, const iha_dims *dims,
                                  iha_buffer qt, iha_buffer kt_packed, iha_buffer vt, iha_buffer o, iha_buffer lse, int mask,
                                  size_t window, float scale);

/* The local-memory variant (cl/attention_local.cl, for GPUs): `rows` work-items per group, one
 * query row each, and tiles of `keys` keys (a multiple of key_block) staged in local memory.
 * Same inputs and outputs as iha__attention_enqueue. IHA_ERROR_UNSUPPORTED when the group or
 * its 2*keys*d floats of local memory do not fit the device (iha__attention_local_fits). */
size_t iha__attention_local_bytes(size_t head_dim, int keys);
int iha__attention_local_fits(const iha_context *ctx, size_t head_dim, int rows, int keys, int key_block);
iha_status iha__attention_local_enqueue(iha_context *ctx, int rows, int keys, int key_block, const iha_dims *dims,
                                        iha_buffer qt, iha_buffer kt_packed, iha_buffer vt, iha_buffer o, iha_buffer lse, int mask,
                                        size_t window, float scale);
/* The local tiles with register sub-tiles (cl/attention_local_tiles.cl, for GPUs): `rows` query
 * rows per group and tiles of `keys` keys, each work-item a tile_ry x tile_rx sub-tile of the
 * scores (4 or 8 each; rows a multiple of tile_ry, keys of tile_rx and of key_block), so
 * rows/tile_ry * keys/tile_rx work-items. Same inputs and outputs as iha__attention_enqueue;
 * IHA_ERROR_UNSUPPORTED when the shape is not one of those or the group or its local memory does
 * not fit the device. iha__attention_tiles_live_floats is a work-item's live private state (score
 * sub-tile, output columns, row state), which the tuning space and the built-in keep within
 * IHA_ATTENTION_TILES_REGISTER_FLOATS. */
typedef struct iha_attention_tiles {
    int rows, keys, tile_ry, tile_rx; /* LOC_ROWS (the configuration's group), LOC_KEYS, TILE_RY, TILE_RX */
} iha_attention_tiles;
#define IHA_ATTENTION_TILES_REGISTER_FLOATS 160
size_t iha__attention_tiles_bytes(size_t head_dim, const iha_attention_tiles *t);
size_t iha__attention_tiles_threads(const iha_attention_tiles *t);
long iha__attention_tiles_live_floats(size_t head_dim, const iha_attention_tiles *t);
int iha__attention_tiles_fits(const iha_context *ctx, size_t head_dim, const iha_attention_tiles *t, int key_block);
iha_status iha__attention_tiles_enqueue(iha_context *ctx, const iha_attention_tiles *t, int key_block,
                                        const iha_dims *dims, iha_buffer qt, iha_buffer kt_packed, iha_buffer vt,
                                        iha_buffer o, iha_buffer lse, int mask, size_t window, float scale);
/* The tensor-core variant (cl/attention_mma_nv.cl): `rows` query rows per work-group (16, 32, 64
 * or 128: a warp of 32 work-items per 16 rows), tiles of `keys` keys (16, 32 or 64, a multiple of
 * key_block), bf16 inputs or half. iha__attention_mma_live_words is a work-item's fragments and
 * accumulators in 32-bit registers, which the tuning space bounds by
 * IHA_ATTENTION_MMA_REGISTER_WORDS. IHA_ERROR_UNSUPPORTED where the context offers no mma path
 * or the shape does not fit; a hardware build that fails makes the context offer none. */
#define IHA_ATTENTION_MMA_REGISTER_WORDS 128
size_t iha__attention_mma_bytes(size_t head_dim, int keys, int emulated, int rows);
long iha__attention_mma_live_words(size_t head_dim, int keys);
int iha__attention_mma_fits(const iha_context *ctx, size_t head_dim, int rows, int keys, int key_block);
iha_status iha__attention_mma_enqueue(iha_context *ctx, int rows, int keys, int key_block, int bf16,
                                      const iha_dims *dims, iha_buffer qt, iha_buffer kt_packed, iha_buffer vt,
                                      iha_buffer o, iha_buffer lse, int mask, size_t window, float scale);
/* The packed sequences' arguments of cl/masks.clh (IHA_SEQ_PARAMS): dims->seq_bounds and H, or
 * `unread` (any buffer) and 0 when each batch row is one sequence. */
void iha__attention_seq_args(struct iha_args *a, const iha_dims *dims, cl_mem unread);
/* The arguments every attention variant takes, in their order. */
void iha__attention_args(struct iha_args *a, const iha_dims *dims, iha_buffer qt, iha_buffer kt_packed, iha_buffer vt,
                         iha_buffer o, iha_buffer lse, int mask, size_t window, float scale);
#endif
