/* Gradient accumulation (iha_attention_options.accumulate): a backward call's float result added
 * into the caller's output in that output's storage, dst = dst + src, in one pass. The sum is
 * formed in float and rounded once into the storage (vstore_half and bf16_store round to nearest
 * even), so a 16-bit output gains one rounding per call, as an overwritten one does.
 *
 * Each work-item handles ACCUMULATE_VEC consecutive elements with vector loads and stores (as
 * cl/convert.cl does); the last work-item takes the tail element by element. */
#include "bf16.clh"
#include "loop_probe.clh"

#ifndef ACCUMULATE_VEC
#define ACCUMULATE_VEC 8
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatA CAT(float, ACCUMULATE_VEC)

__kernel void accumulate_f32(__global const float *src, ulong src_off, __global float *dst, ulong dst_off,
                             ulong n IHA_PROBE_PARAMS)
{
    const ulong i = (ulong)get_global_id(0) * ACCUMULATE_VEC, src_i = src_off + i, dst_i = dst_off + i;
    if (i + ACCUMULATE_VEC <= n) {
        const floatA sum = CAT(vload, ACCUMULATE_VEC)(0, dst + dst_i) + CAT(vload, ACCUMULATE_VEC)(0, src + src_i);
        CAT(vstore, ACCUMULATE_VEC)(sum, 0, dst + dst_i);
    } else {
        for (ulong j = i; j < n; ++j) dst[dst_off + j] += src[src_off + j];
    }
    IHA_PROBE_CHECK();
}

__kernel void accumulate_f16(__global const float *src, ulong src_off, __global half *dst, ulong dst_off,
                             ulong n IHA_PROBE_PARAMS)
{
    const ulong i = (ulong)get_global_id(0) * ACCUMULATE_VEC, src_i = src_off + i, dst_i = dst_off + i;
    if (i + ACCUMULATE_VEC <= n) {
        const floatA sum = CAT(vload_half, ACCUMULATE_VEC)(0, dst + dst_i) + CAT(vload, ACCUMULATE_VEC)(0, src + src_i);
        CAT(vstore_half, ACCUMULATE_VEC)(sum, 0, dst + dst_i);
    } else {
        for (ulong j = i; j < n; ++j) vstore_half(vload_half(dst_off + j, dst) + src[src_off + j], dst_off + j, dst);
    }
    IHA_PROBE_CHECK();
}

__kernel void accumulate_bf16(__global const float *src, ulong src_off, __global ushort *dst, ulong dst_off,
                              ulong n IHA_PROBE_PARAMS)
{
    const ulong i = (ulong)get_global_id(0) * ACCUMULATE_VEC, src_i = src_off + i, dst_i = dst_off + i;
    if (i + ACCUMULATE_VEC <= n) {
        const floatA sum = CAT(bf16_vload, ACCUMULATE_VEC)(0, dst + dst_i) + CAT(vload, ACCUMULATE_VEC)(0, src + src_i);
        CAT(bf16_vstore, ACCUMULATE_VEC)(sum, 0, dst + dst_i);
    } else {
        for (ulong j = i; j < n; ++j) bf16_store(bf16_load(dst_off + j, dst) + src[src_off + j], dst_off + j, dst);
    }
    IHA_PROBE_CHECK();
}
