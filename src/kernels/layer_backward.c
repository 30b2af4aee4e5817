/* Host side of cl/layer_backward.cl: transposes, the inverse rotary and the mixing and
 * collapse matrices' gradients, for the layer backward (src/layer/layer_backward.c). */
#include "kernels/layer_backward.h"
#include "kernels/mix.h"
#include "runtime/error.h"

#include "runtime/launch.h"

/* Rows and columns per work-item of transpose_f32 (TR_TILE in the kernel). */
#define TR_TILE 8

/* Tokens per partial sum of mix_grad_partial_f32: enough work-items to fill a GPU at the
 * paper's shapes, few enough partials to sum cheaply. */
#define GRAD_CHUNK 32

iha_status iha__transpose_enqueue(iha_context *ctx, size_t rows, size_t cols, iha_buffer src, size_t ld_src, iha_buffer dst,
                                  size_t ld_dst)
{
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "layer_backward.cl", "", "transpose_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_int(&a, (cl_int)rows);
    iha__arg_int(&a, (cl_int)cols);
    iha__arg_tensor(&a, src.mem, src.offset);
    iha__arg_ulong(&a, ld_src);
    iha__arg_tensor(&a, dst.mem, dst.offset);
    iha__arg_ulong(&a, ld_dst);
    const size_t global[2] = {(cols + TR_TILE - 1) / TR_TILE, (rows + TR_TILE - 1) / TR_TILE};
    return iha__launch(ctx, &a, 2, global, NULL, "transpose_f32");
}

iha_status iha__rope_inverse_enqueue(iha_context *ctx, const iha_dims *dims, iha_buffer x, cl_mem table)
{
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "layer_backward.cl", "", "rope_inverse_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, x.mem, x.offset);
    iha__arg_ulong(&a, dims->B * dims->H * dims->T);
    iha__arg_mem(&a, table);
    iha__arg_int(&a, (cl_int)dims->T);
    iha__arg_int(&a, (cl_int)dims->d);
    iha__arg_int(&a, dims->seq_bounds != NULL ? (cl_int)dims->H : 0); /* packed: a table per batch row */
    const size_t global[2] = {dims->d / 2, dims->B * dims->H * dims->T};
    size_t local[3];
    iha__mix_collapse_local_size(ctx, dims->d / 2, local);
    return iha__launch(ctx, &a, 2, global, local, "rope_inverse_f32");
}

static size_t grad_parts(const iha_dims *dims) { return (dims->B * dims->N + GRAD_CHUNK - 1) / GRAD_CHUNK; }

size_t iha__mix_grad_partial_elements(const iha_dims *dims) { return grad_parts(dims) * dims->H * dims->H * dims->P; }

iha_status iha__mix_grad_enqueue(iha_context *ctx, const iha_dims *dims, iha_buffer tokens, iha_buffer pseudo,
                                 cl_mem partial, iha_buffer g)
{
    const size_t outputs = dims->H * dims->H * dims->P, parts = grad_parts(dims);
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "layer_backward.cl", "", "mix_grad_partial_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_tensor(&a, tokens.mem, tokens.offset);
    iha__arg_tensor(&a, pseudo.mem, pseudo.offset);
    iha__arg_mem(&a, partial);
    const size_t ints[6] = {dims->B, dims->N, dims->H, dims->d, dims->P, GRAD_CHUNK};
    for (int i = 0; i < 6; ++i) iha__arg_int(&a, (cl_int)ints[i]);
    const size_t global[2] = {outputs, parts};
    IHA_FORWARD_IF_ERROR(iha__launch(ctx, &a, 2, global, NULL, "mix_grad_partial_f32"));

    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "layer_backward.cl", "", "mix_grad_reduce_f32", &k));
    a = iha__args_begin(k);
    iha__arg_mem(&a, partial);
    iha__arg_int(&a, (cl_int)outputs);
    iha__arg_int(&a, (cl_int)parts);
    iha__arg_tensor(&a, g.mem, g.offset);
    const size_t one[1] = {outputs};
    return iha__launch(ctx, &a, 1, one, NULL, "mix_grad_reduce_f32");
}
