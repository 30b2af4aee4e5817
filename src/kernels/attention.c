/* Host side of the attention kernels: the configuration per device, the arguments both
 * variants share, and cl/attention.cl's launch (cl/attention_local.cl's is attention_local.c). */
#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/checked.h"
#include "runtime/launch.h"

void iha__attention_config_default(const iha_context *ctx, size_t head_dim, iha_attention_config *cfg)
{
    /* CPUs: 4 x 16 register tiles (two 256-bit vectors per row on AVX2; 6 rows, 8-key blocks
     * and other tile counts measured no faster, BENCHMARKS.md), one work-item per group so PoCL
     * does not try to vectorise across work-items. GPUs: below. */
    cfg->key_block = 16;
    cfg->vec = head_dim >= 16 ? 16 : (head_dim >= 8 ? 8 : 4);
    cfg->local_keys = 32;
    cfg->variant = 0;
    /* A cache hint for CPUs, whose P.V otherwise waits on each value chunk's first row, built
     * in only where it was measured and known to compile: PoCL's CPU device. Some clang-based
     * implementations reject the intrinsic when the kernel is created (Oclgrind: "Undefined
     * external function: llvm.prefetch"), so elsewhere the tuner may choose it, after
     * verifying it. GPUs stage keys and values in local memory instead. */
    cfg->prefetch = ctx->info.is_cpu && !ctx->info.is_gpu &&
                    strstr(ctx->info.platform_name, "Portable Computing Language") != NULL;
    if (ctx->info.is_gpu && head_dim > 64) {
        /* Wider heads: register tiles of 4 rows, 128 work-items per group. The local-memory
         * kernel keeps a query row and an output row of d floats per work-item, which past
         * d = 64 no longer fit a GPU's registers: on an H200 at d = 128 (causal, T = 8192) the
         * tuner found this 1.85x faster (25.7 against 47.6 ms; BENCHMARKS.md, "GPU"). */
        cfg->rows = 4;
        cfg->tiles = 1;
        cfg->vec = 4;
        cfg->group = 128;
    } else if (ctx->info.is_gpu) {
        /* The local-memory variant, 64 rows per group, with the largest key tile of 16, 32 or
         * 64 keys (2*keys*d floats) that fits the device; register tiles of one row when none
         * does. Variant 2 (cl/attention_local_tiles.cl) is in the tuning space only: it has not
         * yet run on a GPU (BENCHMARKS.md, "GPU"). */
        cfg->rows = 1;
        cfg->tiles = 1;
        cfg->group = 64;
        for (int keys = 64; keys >= 16 && !cfg->variant; keys /= 2) {
            if (!iha__attention_local_fits(ctx, head_dim, (int)cfg->group, keys, cfg->key_block)) continue;
            cfg->variant = 1;
            cfg->local_keys = keys;
        }
    } else if (ctx->loop_flag != NULL) {
        /* A driver that ends loops after a budget of iterations per work-item (runtime/
         * loop_limit.h): one row per work-item spends the fewest iterations per key block, so
         * the longest sequences fit. */
        cfg->rows = 1;
        cfg->tiles = 1;
        cfg->group = 1;
    } else {
        cfg->rows = head_dim > 128 ? 2 : 4;
        cfg->tiles = 4;
        cfg->group = 1;
    }
}

void iha__attention_args(iha_args *a, const iha_dims *dims, iha_ref qt, iha_ref kt_packed, iha_ref vt, iha_ref o,
                         iha_ref lse, int mask, size_t window, float scale)
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
                                  iha_ref qt, iha_ref kt_packed, iha_ref vt, iha_ref o, iha_ref lse, int mask,
                                  size_t window, float scale)
{
    if (cfg->variant == 2)
        return iha__attention_tiles_enqueue(ctx, (int)cfg->group, cfg->local_keys, cfg->key_block, dims, qt,
                                            kt_packed, vt, o, lse, mask, window, scale);
    if (cfg->variant == 1)
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
