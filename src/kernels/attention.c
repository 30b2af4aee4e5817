/* Host side of the attention kernels: the configuration per device, the arguments every
 * variant shares, and cl/attention.cl's launch (the local variants' is attention_local.c, the
 * tensor cores' attention_mma.c). */
#include "kernels/attention.h"
#include "runtime/error.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "common/checked.h"
#include "runtime/launch.h"

/* The kinds of device the built-in configurations tell apart. */
enum { ON_CPU, ON_LOOP_LIMITED_CPU, ON_GPU };

/* The built-in configurations, one row per kind of device, vector width and head width (as
 * zstd's clevels.h): the first row of the device's kind whose min_vector is at most the device's
 * native float vector width and whose max_d is at least d applies. vec 0 is the widest of 16, 8
 * and 4 within d; local_keys 0 asks for the largest key tile of 64, 32 or 16 keys (2*keys*d
 * floats) that fits the device, and where none fits, register tiles of that row's shape with 32
 * keys.
 *  - CPUs with 16-float vectors (AVX-512: 32 vector registers): 8 x 16 register tiles. A tile
 *    row's scores are one vector, so 4 rows make 4 independent FMA chains per key block, which
 *    leave a CPU with two 512-bit FMA pipes (Intel Xeon) half idle and a double-pumped one (AMD
 *    Zen 4) waiting on latency; 8 rows fill both, and their 8 accumulators and 8 score vectors
 *    still fit the registers. Past d = 128, 4 rows: 8 rows of 4 tiles exceed the private-memory
 *    bound of the tuning space (space_attention.c) and 2 rows leave the pipes idle again.
 *  - Other CPUs (AVX2: 16 registers of 8 floats): 4 x 16 register tiles (two 256-bit vectors
 *    per row; 6 rows, 8-key blocks and other tile counts are no faster), one work-item per group
 *    so PoCL does not try to vectorise across work-items; 2 rows past d = 128, where 4 rows'
 *    state outgrows the registers.
 *  - A driver that ends loops after a budget of iterations per work-item (runtime/loop_limit.h):
 *    one row per work-item spends the fewest iterations per key block, so the longest sequences
 *    fit.
 *  - GPUs: the local tiles with register sub-tiles (cl/attention_local_tiles.cl), the first of
 *    their rows that fits the device's local memory and work-group and keeps a work-item's live
 *    state within IHA_ATTENTION_TILES_REGISTER_FLOATS (the tuning space's register budget), from
 *    the most FMAs per local-memory word down: 8 x 8 sub-tiles in 128 x 64 and 64 x 64 tiles,
 *    8 x 4 in 64 x 32, 4 x 4 in 64 x 32 and 32 x 32. Every row gives a group of at least 64
 *    work-items (two warps of 32), below which a GPU's FMA pipes wait on latency.
 *  - GPUs up to d = 64 where no sub-tile row fits: the local-memory rows, 64 per group.
 *  - GPUs past that: register tiles of 4 rows, 128 work-items per group. The local-memory
 *    kernel keeps a query row and an output row of d floats per work-item, which past d = 64 do
 *    not fit a GPU's registers; the tuner prefers these tiles there. */
typedef struct attention_default {
    int device;        /* ON_CPU, ON_LOOP_LIMITED_CPU or ON_GPU */
    unsigned min_vector; /* the narrowest native float vector width the row is for */
    size_t max_d;      /* the widest head the row is for */
    int rows;          /* ATT_ROWS */
    int tiles;         /* ATT_TILES */
    int key_block;     /* ATT_KB */
    int vec;           /* ATT_VD; 0: from d */
    size_t group;      /* work-items per work-group */
    iha_attention_variant variant;
    int local_keys;    /* LOC_KEYS; 0: the largest that fits */
    int tile_ry;       /* TILE_RY of the local tiles */
    int tile_rx;       /* TILE_RX of the local tiles */
} attention_default;

static const attention_default attention_defaults[] = {
    /* device            vector  max_d      rows tiles  KB vec group variant                        keys  RY  RX */
    {ON_CPU,              16,    128,          8,    4, 16,  0,    1, IHA_ATTENTION_REGISTER_TILES,   32,  4,  4},
    {ON_CPU,              16,    SIZE_MAX,     4,    4, 16,  0,    1, IHA_ATTENTION_REGISTER_TILES,   32,  4,  4},
    {ON_CPU,               1,    128,          4,    4, 16,  0,    1, IHA_ATTENTION_REGISTER_TILES,   32,  4,  4},
    {ON_CPU,               1,    SIZE_MAX,     2,    4, 16,  0,    1, IHA_ATTENTION_REGISTER_TILES,   32,  4,  4},
    {ON_LOOP_LIMITED_CPU,  1,    SIZE_MAX,     1,    1, 16,  0,    1, IHA_ATTENTION_REGISTER_TILES,   32,  4,  4},
    {ON_GPU,               1,    SIZE_MAX,     1,    1, 16,  4,  128, IHA_ATTENTION_LOCAL_TILES,      64,  8,  8},
    {ON_GPU,               1,    SIZE_MAX,     1,    1, 16,  4,   64, IHA_ATTENTION_LOCAL_TILES,      64,  8,  8},
    {ON_GPU,               1,    SIZE_MAX,     1,    1, 16,  4,   64, IHA_ATTENTION_LOCAL_TILES,      32,  8,  4},
    {ON_GPU,               1,    SIZE_MAX,     1,    1, 16,  4,   64, IHA_ATTENTION_LOCAL_TILES,      32,  4,  4},
    {ON_GPU,               1,    SIZE_MAX,     1,    1, 16,  4,   32, IHA_ATTENTION_LOCAL_TILES,      32,  4,  4},
    {ON_GPU,               1,    64,           1,    1, 16,  0,   64, IHA_ATTENTION_LOCAL_ROWS,        0,  4,  4},
    {ON_GPU,               1,    SIZE_MAX,     4,    1, 16,  4,  128, IHA_ATTENTION_REGISTER_TILES,   32,  4,  4},
};

/* Whether the built-in row applies to this device and head width: the local variants' rows only
 * where they fit (the local rows' search for a key tile follows in the caller). */
static int row_fits(const iha_context *ctx, const attention_default *row, size_t head_dim)
{
    if (row->variant != IHA_ATTENTION_LOCAL_TILES) return 1;
    const iha_attention_tiles t = {(int)row->group, row->local_keys, row->tile_ry, row->tile_rx};
    return iha__attention_tiles_fits(ctx, head_dim, &t, row->key_block) &&
           iha__attention_tiles_live_floats(head_dim, &t) <= IHA_ATTENTION_TILES_REGISTER_FLOATS;
}

void iha__attention_config_default(const iha_context *ctx, size_t head_dim, iha_attention_config *cfg)
{
    const int device = ctx->info.is_gpu ? ON_GPU : ctx->loop_flag != NULL ? ON_LOOP_LIMITED_CPU : ON_CPU;
    const attention_default *row = &attention_defaults[0];
    /* every kind ends with min_vector 1 and max_d SIZE_MAX */
    while (row->device != device || row->min_vector > ctx->vector_floats || row->max_d < head_dim ||
           !row_fits(ctx, row, head_dim))
        ++row;
    cfg->rows = row->rows;
    cfg->tiles = row->tiles;
    cfg->key_block = row->key_block;
    cfg->vec = row->vec ? row->vec : head_dim >= 16 ? 16 : (head_dim >= 8 ? 8 : 4);
    cfg->group = row->group;
    cfg->variant = row->variant == IHA_ATTENTION_LOCAL_TILES ? row->variant : IHA_ATTENTION_REGISTER_TILES;
    cfg->local_keys = row->local_keys ? row->local_keys : 32;
    cfg->tile_ry = row->tile_ry;
    cfg->tile_rx = row->tile_rx;
    if (row->variant == IHA_ATTENTION_LOCAL_ROWS)
        for (int keys = 64; keys >= 16 && cfg->variant == IHA_ATTENTION_REGISTER_TILES; keys /= 2) {
            if (!iha__attention_local_fits(ctx, head_dim, (int)cfg->group, keys, cfg->key_block)) continue;
            cfg->variant = IHA_ATTENTION_LOCAL_ROWS;
            cfg->local_keys = keys;
        }
    /* A cache hint for CPUs, whose P.V otherwise waits on each value chunk's first row, built
     * in only where it is known to compile and to help (ctx->cpu_prefetch); elsewhere the tuner
     * may choose it, after verifying it. */
    cfg->prefetch = ctx->cpu_prefetch;
}

void iha__attention_args(iha_args *a, const iha_dims *dims, iha_buffer qt, iha_buffer kt_packed, iha_buffer vt, iha_buffer o,
                         iha_buffer lse, int mask, size_t window, float scale)
{
    const int want_lse = lse.mem != NULL;
    iha__arg_tensor(a, qt.mem, qt.offset);
    iha__arg_tensor(a, kt_packed.mem, kt_packed.offset);
    iha__arg_tensor(a, vt.mem, vt.offset);
    iha__arg_tensor(a, o.mem, o.offset);
    iha__arg_tensor(a, want_lse ? lse.mem : o.mem, want_lse ? lse.offset : 0);
    iha__arg_int(a, want_lse);
    iha__arg_int(a, (cl_int)dims->T);
    iha__arg_int(a, (cl_int)dims->P);
    iha__arg_int(a, mask);
    iha__arg_int(a, (cl_int)window);
    iha__arg_float(a, (cl_float)(scale * 1.4426950408889634)); /* the kernels work in base 2 */
    iha__attention_seq_args(a, dims, qt.mem);
}

void iha__attention_seq_args(iha_args *a, const iha_dims *dims, cl_mem unread)
{
    /* Without packed sequences the kernels never read the bounds: any buffer will do. */
    iha__arg_mem(a, dims->seq_bounds != NULL ? dims->seq_bounds : unread);
    iha__arg_int(a, dims->seq_bounds != NULL ? (cl_int)dims->H : 0);
}

iha_status iha__attention_kernel_get(iha_context *ctx, const iha_attention_config *cfg, size_t head_dim,
                                     const char *file, const char *name, cl_kernel *out)
{
    char options[192];
    snprintf(options, sizeof options,
             "-DHEAD_DIM=%zu -DATT_ROWS=%d -DATT_TILES=%d -DATT_KB=%d -DATT_VD=%d -DATT_PREFETCH=%d", head_dim,
             cfg->rows, cfg->tiles, cfg->key_block, cfg->vec, cfg->prefetch);
    return iha__kernel_get(ctx, file, options, name, out);
}

iha_status iha__attention_enqueue(iha_context *ctx, const iha_attention_config *cfg, const iha_dims *dims,
                                  iha_buffer qt, iha_buffer kt_packed, iha_buffer vt, iha_buffer o, iha_buffer lse, int mask,
                                  size_t window, float scale)
{
    if (cfg->variant == IHA_ATTENTION_LOCAL_TILES) {
        const iha_attention_tiles t = {(int)cfg->group, cfg->local_keys, cfg->tile_ry, cfg->tile_rx};
        return iha__attention_tiles_enqueue(ctx, &t, cfg->key_block, dims, qt, kt_packed, vt, o, lse, mask, window,
                                            scale);
    }
    if (cfg->variant == IHA_ATTENTION_MMA_F16 || cfg->variant == IHA_ATTENTION_MMA_BF16) {
        const iha_status st = iha__attention_mma_enqueue(ctx, (int)cfg->group, cfg->local_keys, cfg->key_block,
                                                         cfg->variant == IHA_ATTENTION_MMA_BF16, dims, qt, kt_packed,
                                                         vt, o, lse, mask, window, scale);
        if (st != IHA_ERROR_BUILD || ctx->mma != IHA_MMA_NONE) return st;
        /* The driver refused the tensor-core program, and the context no longer offers it
         * (runtime/context.h): the built-in runs instead, without an error to the caller. */
        iha__message_clear(&ctx->message);
        iha_attention_config fallback;
        iha__attention_config_default(ctx, dims->d, &fallback);
        fallback.key_block = cfg->key_block; /* the keys are packed for it; every default tile holds such blocks */
        return iha__attention_enqueue(ctx, &fallback, dims, qt, kt_packed, vt, o, lse, mask, window, scale);
    }
    if (cfg->variant == IHA_ATTENTION_LOCAL_ROWS)
        return iha__attention_local_enqueue(ctx, (int)cfg->group, cfg->local_keys, cfg->key_block, dims, qt,
                                            kt_packed, vt, o, lse, mask, window, scale);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__attention_kernel_get(ctx, cfg, dims->d, "attention.cl", "attention_fwd_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__attention_args(&a, dims, qt, kt_packed, vt, o, lse, mask, window, scale);
    const size_t rows_per_item = (size_t)cfg->rows * (size_t)cfg->tiles;
    const size_t global[2] = {(dims->T + rows_per_item - 1) / rows_per_item, dims->B * dims->H};
    const size_t local[2] = {cfg->group, 1};
    return iha__launch(ctx, &a, 2, global, local, "attention_fwd_f32");
}
