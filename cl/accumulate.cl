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

/* DEFINE_ACCUMULATE(name, dst_t, VLOAD, VSTORE, LOAD1, STORE1) makes the kernel for one storage:
 * its element type, its ACCUMULATE_VEC-wide load and store and its single load and store, with
 * the arguments of vload_half / vstore_half ((offset, pointer) and (value, offset, pointer)). */
#define DEFINE_ACCUMULATE(name, dst_t, VLOAD, VSTORE, LOAD1, STORE1)                                                   \
    __kernel void name(__global const float *src, ulong src_off, __global dst_t *dst, ulong dst_off,                   \
                       ulong n IHA_PROBE_PARAMS)                                                                       \
    {                                                                                                                  \
        const ulong i = (ulong)get_global_id(0) * ACCUMULATE_VEC, src_i = src_off + i, dst_i = dst_off + i;            \
        if (i + ACCUMULATE_VEC <= n) {                                                                                 \
            const floatA sum = VLOAD(0, dst + dst_i) + CAT(vload, ACCUMULATE_VEC)(0, src + src_i);                     \
            VSTORE(sum, 0, dst + dst_i);                                                                               \
        } else {                                                                                                       \
            for (ulong j = i; j < n; ++j) STORE1(LOAD1(dst_off + j, dst) + src[src_off + j], dst_off + j, dst);        \
        }                                                                                                              \
        IHA_PROBE_CHECK();                                                                                             \
    }

/* float's single load and store in the shape of vload_half / vstore_half. */
#define F32_LOAD(off, p) ((p)[off])
#define F32_STORE(v, off, p) ((p)[off] = (v))

DEFINE_ACCUMULATE(accumulate_f32, float, CAT(vload, ACCUMULATE_VEC), CAT(vstore, ACCUMULATE_VEC), F32_LOAD, F32_STORE)
DEFINE_ACCUMULATE(accumulate_f16, half, CAT(vload_half, ACCUMULATE_VEC), CAT(vstore_half, ACCUMULATE_VEC), vload_half,
                  vstore_half)
DEFINE_ACCUMULATE(accumulate_bf16, ushort, CAT(bf16_vload, ACCUMULATE_VEC), CAT(bf16_vstore, ACCUMULATE_VEC),
                  bf16_load, bf16_store)
