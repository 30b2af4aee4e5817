/* The attention backward (cl/attention_backward.cl, cl/attention_backward_tiles.cl,
 * cl/attention_backward_local.cl). */
#ifndef IHA_KERNELS_ATTENTION_BACKWARD_H
#define IHA_KERNELS_ATTENTION_BACKWARD_H
#include "kernels/tensor.h"
#include "runtime/launch.h"

/* The backward pass of attention: its tensors (see iha_attention_backward) and workspace. */
typedef struct iha_backward_refs {
    iha_buffer qt, kt, vt, o, lse, dout; /* inputs; lse is the natural log */
    iha_buffer dqt, dkt, dvt;            /* outputs */
    cl_mem delta;                     /* B*H*T floats */
    cl_mem packed[2]; /* Q and dO in 16-column blocks: given, the tile kernel runs (any head
                         width); NULL, the row kernels */
    cl_mem partial;   /* with packed: the tile kernel's partial dq sums */
} iha_backward_refs;
/* Nonzero when the backward should run the register-tile kernel (cl/attention_backward_tiles.cl)
 * on this device, which needs two packed copies of iha__packed_keys_elements(dims, 16) floats
 * each and iha__attention_backward_partial_elements floats of partial sums. */
int iha__attention_backward_tiled(const iha_context *ctx, size_t head_dim);
/* The tile kernel's partial sums, in floats, into *elements, enough for every configuration;
 * returns 0 when the count overflows size_t. */
int iha__attention_backward_partial_elements(const iha_context *ctx, const iha_dims *dims, size_t *elements);
/* The same for iha_attention_partial_backward's tile pass, whose keys are key_rows rows of
 * another block than the dims->T query rows. */
int iha__attention_partial_backward_sums_elements(const iha_context *ctx, const iha_dims *dims, size_t key_rows,
                                                  size_t *elements);
/* A backward configuration. With packed buffers (the CPU tile kernel) only `tiles` counts; without,
 * each pass takes cl/attention_backward_local.cl's local tiles where its fields are set, its row
 * kernel of cl/attention_backward.cl where they are 0. */
typedef struct iha_backward_config {
    int kv_keys, kv_queries; /* dk/dv: key rows per work-group, query rows per tile (BWL_KEYS, BWL_QUERIES) */
    int q_rows, q_keys;      /* dq: query rows per work-group, keys per tile (BWL_ROWS, BWL_TILE_KEYS) */
    int tiles;               /* the tile kernel's 4-row register tiles per work-item (BW_TILES): 4, 8 or 16 */
} iha_backward_config;
/* The built-in for this device and head width: local tiles on GPUs whose driver runs loops to the
 * end, where they fit; 0 (the row kernels) elsewhere; the tile kernel's tiles for the width. */
void iha__attention_backward_config_default(const iha_context *ctx, size_t head_dim, iha_backward_config *cfg);
/* The tile kernel's built-in tiles per work-item for a head width, and the fewest any
 * configuration may take (which sizes the partial sums: fewer tiles make more work-items). */
int iha__backward_tiles_default(size_t head_dim);
#define IHA_BACKWARD_TILES_MIN 4

/* Dt = dO . O per row, then the gradients in configuration cfg (NULL: the built-in): with packed
 * buffers one pass for dkt, dvt and the partial sums of dqt, then their sum into dqt; without,
 * dqt, then dkt and dvt. Every output element is written. A local tile that does not fit the
 * device is IHA_ERROR_UNSUPPORTED. */
iha_status iha__attention_backward_enqueue(iha_context *ctx, const iha_dims *dims, const iha_backward_refs *refs,
                                           const iha_backward_config *cfg, int mask, size_t window, float scale);
/* Local memory of each pass's tile, and whether it fits the device (multiples of 4, work-group
 * size, local memory, at most 16 accumulator columns per work-item). */
size_t iha__backward_kv_local_bytes(size_t head_dim, int keys, int queries);
size_t iha__backward_q_local_bytes(size_t head_dim, int rows, int keys);
int iha__backward_kv_fits(const iha_context *ctx, size_t head_dim, int keys, int queries);
/* The same without local memory, for the tuning space's constraints: one pass's tile of `along`
 * rows or keys per work-group and `across` streamed per tile (multiples of 4), its work-items
 * within max_group and its accumulator columns within the limit. */
int iha__backward_tile_shape_fits(size_t head_dim, int along, int across, size_t max_group);
int iha__backward_q_fits(const iha_context *ctx, size_t head_dim, int rows, int keys);
/* Dt, then the gradients in configuration cfg, whatever the device's built-in (refs->packed
 * unused); a tile that does not fit is IHA_ERROR_UNSUPPORTED. For tests and tuning. */
iha_status iha__attention_backward_enqueue_config(iha_context *ctx, const iha_dims *dims, const iha_backward_refs *refs,
                                                  const iha_backward_config *cfg, int mask, size_t window, float scale);
/* The local-tile passes alone (Dt in refs->delta): dqt, or dkt and dvt. */
iha_status iha__attention_backward_dq_local_enqueue(iha_context *ctx, const iha_backward_config *cfg,
                                                    const iha_dims *dims, const iha_backward_refs *refs, int mask,
                                                    size_t window, float scale);
iha_status iha__attention_backward_dkv_local_enqueue(iha_context *ctx, const iha_backward_config *cfg,
                                                     const iha_dims *dims, const iha_backward_refs *refs, int mask,
                                                     size_t window, float scale);
/* The mask arguments every backward kernel takes after its tensors: T, P, mask, window, scale
 * and the packed sequences' bounds (unread: any buffer, for calls without them). */
void iha__backward_mask_args(iha_args *a, const iha_dims *dims, int mask, size_t window, float scale, cl_mem unread);

/* A partial step's blocks at global positions (iha_attention_partial_backward): Tk key rows from
 * row k0, the query rows (dims->T) from row q0, the masks evaluated over a sequence of Tg rows. */
typedef struct iha_block_rows {
    size_t Tk;
    cl_int q0, k0, Tg;
} iha_block_rows;
/* The tile pass of iha__attention_backward_enqueue over one query block (dims, T its rows) and
 * one key block (refs->kt, vt, dkt, dvt of at->Tk rows), refs->delta already holding Dt and
 * refs->packed and refs->partial given (two iha__packed_keys_elements(dims, 16) and
 * iha__attention_partial_backward_sums_elements floats): dqt overwritten with first, else added
 * into; dkt and dvt overwritten, or with add added into. window 0 or below Tg/P tokens. */
iha_status iha__attention_partial_backward_enqueue(iha_context *ctx, const iha_dims *dims, const iha_block_rows *at,
                                                   const iha_backward_refs *refs, int mask, cl_int window, float scale,
                                                   int first, int add);
#endif
