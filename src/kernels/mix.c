/* Host side of cl/mix.cl (head mixing, interleaving, rotary) and cl/pack_keys.cl. */
#include "kernels/kernels.h"
#include "common/checked.h"
#include "runtime/launch.h"

/* Work-items per group along the column pairs: a GPU wants a warp's worth, a CPU loops. */
static size_t columns_group(const iha_context *ctx, size_t columns)
{
    size_t g = ctx->info.is_gpu ? 64 : 8;
    while (g > 1 && g / 2 >= columns) g /= 2;
    return g;
}

size_t iha__packed_keys_elements(const iha_dims *dims, int key_block)
{
    size_t kb = (size_t)key_block, rows = iha__round_up(dims->T, kb), n;
    size_t f[4] = {dims->B, dims->H, rows, dims->d};
    return iha__mul_n(&n, 4, f) ? n : 0;
}

iha_status iha__mix_enqueue(iha_context *ctx, const iha_dims *dims, iha_ref src, iha_ref alpha, iha_ref dst,
                            cl_mem rope, int key_block)
{
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "mix.cl", "", "mix_heads_f32", &k));
    const int identity = alpha.mem == NULL;
    iha_args a = iha__args_begin(k);
    iha__arg_mem(&a, src.mem);
    iha__arg_ulong(&a, src.offset);
    iha__arg_mem(&a, identity ? src.mem : alpha.mem);
    iha__arg_ulong(&a, identity ? 0 : alpha.offset);
    iha__arg_int(&a, identity);
    iha__arg_mem(&a, dst.mem);
    iha__arg_ulong(&a, dst.offset);
    iha__arg_mem(&a, rope ? rope : src.mem);
    iha__arg_int(&a, rope != NULL);
    iha__arg_int(&a, (cl_int)dims->N);
    iha__arg_int(&a, (cl_int)dims->H);
    iha__arg_int(&a, (cl_int)dims->d);
    iha__arg_int(&a, (cl_int)dims->P);
    iha__arg_int(&a, key_block);
    const size_t half = (dims->d + 1) / 2;
    const size_t rows = key_block ? iha__round_up(dims->T, (size_t)key_block) : dims->T;
    const size_t global[3] = {half, rows, dims->B * dims->H};
    const size_t local[3] = {columns_group(ctx, half), 1, 1};
    return iha__launch(ctx, &a, 3, global, local, "mix_heads_f32");
}

iha_status iha__pack_keys_enqueue(iha_context *ctx, const iha_dims *dims, iha_ref src, iha_ref dst, int key_block)
{
    cl_kernel k;
    IHA_FORWARD_IF_ERROR(iha__kernel_get(ctx, "pack_keys.cl", "", "pack_keys_f32", &k));
    iha_args a = iha__args_begin(k);
    iha__arg_mem(&a, src.mem);
    iha__arg_ulong(&a, src.offset);
    iha__arg_mem(&a, dst.mem);
    iha__arg_ulong(&a, dst.offset);
    iha__arg_int(&a, (cl_int)dims->T);
    iha__arg_int(&a, (cl_int)dims->d);
    iha__arg_int(&a, key_block);
    const size_t global[3] = {dims->d, iha__round_up(dims->T, (size_t)key_block), dims->B * dims->H};
    const size_t local[3] = {columns_group(ctx, dims->d), 1, 1};
    return iha__launch(ctx, &a, 3, global, local, "pack_keys_f32");
}
