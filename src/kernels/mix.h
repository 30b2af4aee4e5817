/* Head mixing (cl/mix.cl; the keys on CPUs cl/mix_keys.cl), the key-block layout it writes, and
 * the configuration the memory-bound kernels (mixing and collapse) share. */
#ifndef IHA_KERNELS_MIX_H
#define IHA_KERNELS_MIX_H
#include "kernels/tensor.h"
#include "runtime/launch.h"

/* Variant and vector width of the memory-bound kernels (mix.cl, mix_keys.cl, collapse.cl). */
typedef struct iha_mix_collapse_config {
    int per_row;  /* 1: the *_rows_f32 variant (a row per work-item, explicit vectors; CPUs);
                     0: an element per work-item (coalesced; GPUs) */
    int vec;      /* MIX_VEC / COLLAPSE_VEC: 4, 8 or 16 */
    size_t group; /* rows per work-group in the per-row variant */
} iha_mix_collapse_config;

void iha__mix_collapse_config_default(const iha_context *ctx, iha_mix_collapse_config *cfg);

/* Work-group shape for the memory-bound kernels, whose dimension 0 runs over `columns`
 * contiguous elements and dimension 1 over rows: a GPU wants 64 work-items along the columns
 * for coalescing; PoCL on a CPU pays per work-group, so it gets groups of about 512 work-items
 * (small groups leave mixing far below its memory traffic). */
void iha__mix_collapse_local_size(const iha_context *ctx, size_t columns, size_t local[3]);

/* Elements of the key-block layout for dims (B*H*ceil(T/KB)*KB*d); 0 on overflow. */
size_t iha__packed_keys_elements(const iha_dims *dims, int key_block);

/* Mixing (cl/mix.cl; the keys on CPUs cl/mix_keys.cl): src [B][N][H][d] -> dst rows
 * [B][H][T][d], or the key-block layout when key_block > 0. alpha.mem NULL means identity
 * (P == 1). rope NULL means no rotary; with dims->seq_bounds set it is a table per batch row,
 * [B][T][2][d/2] (layer/sequences.h). */
iha_status iha__mix_enqueue(iha_context *ctx, const iha_mix_collapse_config *cfg, const iha_dims *dims, iha_buffer src,
                            iha_buffer alpha, iha_buffer dst, cl_mem rope, int key_block);
/* The arguments every mixing kernel begins with, the decoding step's too: the source tensor, its
 * mixing matrix (identity when alpha.mem is NULL), the destination (with its offset, unless
 * dst_offset is 0: the KV cache's buffer alone) and the rotary table (none when rope is NULL). */
iha_args iha__mix_args_begin(cl_kernel k, iha_buffer src, iha_buffer alpha, iha_buffer dst, int dst_offset, cl_mem rope);
/* Repacking (cl/pack_keys.cl): keys as rows [B*H][T][d] -> key-block layout. */
iha_status iha__pack_keys_enqueue(iha_context *ctx, const iha_dims *dims, iha_buffer src, iha_buffer dst, int key_block);
#endif
