/* Host side of cl/collapse.cl (fold-back of pseudo-heads with R). */
#include <stdio.h>

#include "kernels/collapse.h"
#include "runtime/error.h"
#include "runtime/launch.h"

iha_status iha__collapse_enqueue(iha_context *ctx, const iha_mix_collapse_config *cfg, const iha_dims *dims, iha_buffer o,
                                 iha_buffer r, iha_buffer y)
{
    char options[64];
    snprintf(options, sizeof options, "-DCOLLAPSE_VEC=%d", cfg->vec);
    const char *name = cfg->per_row ? "collapse_heads_rows_f32" : "collapse_heads_f32";
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "collapse.cl", options, name, &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, o.mem, o.offset);
    iha__arg_mixing(&a, r.mem, r.offset, o.mem);
    iha__arg_tensor(&a, y.mem, y.offset);
    iha__arg_int(&a, (cl_int)dims->N);
    iha__arg_int(&a, (cl_int)dims->H);
    iha__arg_int(&a, (cl_int)dims->d);
    iha__arg_int(&a, (cl_int)dims->P);
    if (cfg->per_row) {
        const size_t global[2] = {dims->N, dims->B}; /* a work-item per token, all heads */
        const size_t local[2] = {cfg->group, 1};
        return iha__launch(ctx, &a, 2, global, local, name);
    }
    const size_t global[3] = {dims->d, dims->N, dims->B * dims->H};
    size_t local[3];
    iha__mix_collapse_local_size(ctx, dims->d, local);
    return iha__launch(ctx, &a, 3, global, local, name);
}
