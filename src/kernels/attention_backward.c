/* Host side of cl/attention_backward.cl: the row dots, then dq per query row, then dk and dv
 * per key row, all on the context's in-order queue. */
#include "kernels/kernels.h"

#include <stdio.h>

#include "runtime/launch.h"

iha_status iha__attention_backward_enqueue(iha_context *ctx, const iha_dims *dims, iha_ref qt, iha_ref kt, iha_ref vt,
                                           iha_ref o, iha_ref lse, iha_ref dout, cl_mem delta, iha_ref dqt,
                                           iha_ref dkt, iha_ref dvt, int mask, size_t window, float scale)
{
    char options[32];
    snprintf(options, sizeof options, "-DHEAD_DIM=%zu", dims->d);
    const size_t global[2] = {dims->T, dims->B * dims->H};
    cl_kernel k;

    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_backward.cl", options, "attention_bwd_rowdot_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, o.mem, o.offset);
    iha__arg_tensor(&a, dout.mem, dout.offset);
    iha__arg_mem(&a, delta);
    iha__arg_int(&a, (cl_int)dims->T);
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 2, global, NULL, "attention_bwd_rowdot_f32"));

    /* The inputs every gradient kernel reads, in the kernels' order. */
    const iha_ref inputs[5] = {qt, kt, vt, dout, lse};
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_backward.cl", options, "attention_bwd_dq_f32", &k));
    a = iha__args_begin(k);
    for (int i = 0; i < 5; ++i) iha__arg_tensor(&a, inputs[i].mem, inputs[i].offset);
    iha__arg_mem(&a, delta);
    iha__arg_tensor(&a, dqt.mem, dqt.offset);
    iha__arg_int(&a, (cl_int)dims->T);
    iha__arg_int(&a, (cl_int)dims->P);
    iha__arg_int(&a, mask);
    iha__arg_int(&a, (cl_int)window);
    iha__arg_float(&a, scale);
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 2, global, NULL, "attention_bwd_dq_f32"));

    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "attention_backward.cl", options, "attention_bwd_dkv_f32", &k));
    a = iha__args_begin(k);
    for (int i = 0; i < 5; ++i) iha__arg_tensor(&a, inputs[i].mem, inputs[i].offset);
    iha__arg_mem(&a, delta);
    iha__arg_tensor(&a, dkt.mem, dkt.offset);
    iha__arg_tensor(&a, dvt.mem, dvt.offset);
    iha__arg_int(&a, (cl_int)dims->T);
    iha__arg_int(&a, (cl_int)dims->P);
    iha__arg_int(&a, mask);
    iha__arg_int(&a, (cl_int)window);
    iha__arg_float(&a, scale);
    return iha__launch(ctx, &a, 2, global, NULL, "attention_bwd_dkv_f32");
}
