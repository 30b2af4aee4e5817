/* 16-bit storage at the edges of a layer call (iha_attention_options.storage and
 * weight_storage): IEEE half and bfloat16. Half uses only vload_half/vstore_half: they are core
 * OpenCL and need no cl_khr_fp16 (PoCL and NVIDIA's driver do not advertise it); bfloat16 uses
 * bf16.clh's shifts. Arithmetic stays float.
 *
 * Each work-item of the conversions handles CONVERT_VEC consecutive elements with one vector
 * load and store, which PoCL vectorises inside the work-item on a CPU and which stays coalesced
 * across work-items on a GPU; the last work-item takes the tail element by element. */
#include "loop_probe.clh"
#include "bf16.clh"

#ifndef CONVERT_VEC
#define CONVERT_VEC 8
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatC CAT(float, CONVERT_VEC)

__kernel void convert_half_to_float(__global const half *src, ulong src_off, __global float *dst, ulong dst_off,
                                    ulong n IHA_PROBE_PARAMS)
{
    const ulong i = (ulong)get_global_id(0) * CONVERT_VEC, src_i = src_off + i, dst_i = dst_off + i;
    if (i + CONVERT_VEC <= n)
        CAT(vstore, CONVERT_VEC)(CAT(vload_half, CONVERT_VEC)(0, src + src_i), 0, dst + dst_i);
    else
        for (ulong j = i; j < n; ++j) dst[dst_off + j] = vload_half(src_off + j, src);
    IHA_PROBE_CHECK();
}

__kernel void convert_float_to_half(__global const float *src, ulong src_off, __global half *dst, ulong dst_off,
                                    ulong n IHA_PROBE_PARAMS)
{
    const ulong i = (ulong)get_global_id(0) * CONVERT_VEC, src_i = src_off + i, dst_i = dst_off + i;
    if (i + CONVERT_VEC <= n)
        CAT(vstore_half, CONVERT_VEC)(CAT(vload, CONVERT_VEC)(0, src + src_i), 0, dst + dst_i);
    else
        for (ulong j = i; j < n; ++j) vstore_half(src[src_off + j], dst_off + j, dst);
    IHA_PROBE_CHECK();
}

/* The same for bfloat16, whose tensors are ushort bit patterns (bf16.clh). */
__kernel void convert_bf16_to_float(__global const ushort *src, ulong src_off, __global float *dst, ulong dst_off,
                                    ulong n IHA_PROBE_PARAMS)
{
    const ulong i = (ulong)get_global_id(0) * CONVERT_VEC, src_i = src_off + i, dst_i = dst_off + i;
    if (i + CONVERT_VEC <= n)
        CAT(vstore, CONVERT_VEC)(CAT(bf16_vload, CONVERT_VEC)(0, src + src_i), 0, dst + dst_i);
    else
        for (ulong j = i; j < n; ++j) dst[dst_off + j] = bf16_load(src_off + j, src);
    IHA_PROBE_CHECK();
}

__kernel void convert_float_to_bf16(__global const float *src, ulong src_off, __global ushort *dst, ulong dst_off,
                                    ulong n IHA_PROBE_PARAMS)
{
    const ulong i = (ulong)get_global_id(0) * CONVERT_VEC, src_i = src_off + i, dst_i = dst_off + i;
    if (i + CONVERT_VEC <= n)
        CAT(bf16_vstore, CONVERT_VEC)(CAT(vload, CONVERT_VEC)(0, src + src_i), 0, dst + dst_i);
    else
        for (ulong j = i; j < n; ++j) bf16_store(src[src_off + j], dst_off + j, dst);
    IHA_PROBE_CHECK();
}

/* y[r][c] = sum_k x[r][k] * w[k][c] for a few rows (a decoding step's projections) with 16-bit
 * weights w [K][C] read directly: the product is memory-bound on w, so reading 16 bits moves half
 * the bytes of float weights and no float copy of w is made. Each work-item owns GEMV_ROWS rows
 * and 8 consecutive columns (one float8 accumulator per row, rows past m clamp to the last and
 * are not stored); consecutive work-items read consecutive 16-byte pieces of each weight row.
 * DEFINE_GEMV(name, w_t, LOAD8, LOAD1) makes the kernel for one storage: its element type and
 * its 8-wide and single loads (offset, pointer), as vload_half8 and vload_half. */
#define GEMV_ROWS 4

#define DEFINE_GEMV(name, w_t, LOAD8, LOAD1)                                                           \
    __kernel void name(__global const float *x, ulong x_off, int m, int K, /* x [m][K] */              \
                       __global const w_t *w, ulong w_off, int C,          /* w [K][C] */              \
                       __global float *y, ulong y_off IHA_PROBE_PARAMS)    /* y [m][C] */              \
    {                                                                                                  \
        const int c0 = get_global_id(0) * 8;                                                           \
        const int r0 = get_global_id(1) * GEMV_ROWS;                                                   \
        if (c0 >= C || r0 >= m) return;                                                                \
        x += x_off;                                                                                    \
        w += w_off;                                                                                    \
        y += y_off;                                                                                    \
        const __global float *xr[GEMV_ROWS];                                                           \
        for (int r = 0; r < GEMV_ROWS; ++r) xr[r] = x + (size_t)min(r0 + r, m - 1) * K;                \
        float8 acc[GEMV_ROWS];                                                                         \
        for (int r = 0; r < GEMV_ROWS; ++r) acc[r] = (float8)(0.0f);                                   \
        const int whole = c0 + 8 <= C;                                                                 \
        int k = 0;                                                                                     \
        for (; k < K + IHA_PROBE_PAST; ++k) {                                                          \
            IHA_PROBE_SKIP_PAST(k >= K);                                                               \
            const __global w_t *wk = w + (size_t)k * C + c0;                                           \
            float8 wv;                                                                                 \
            if (whole) {                                                                               \
                wv = LOAD8(0, wk);                                                                     \
            } else {                                                                                   \
                float tmp[8];                                                                          \
                for (int j = 0; j < 8; ++j) tmp[j] = c0 + j < C ? LOAD1(j, wk) : 0.0f;                 \
                wv = vload8(0, tmp);                                                                   \
            }                                                                                          \
            for (int r = 0; r < GEMV_ROWS; ++r) acc[r] = fma((float8)(xr[r][k]), wv, acc[r]);          \
        }                                                                                              \
        IHA_PROBE_EXPECT(k >= K + IHA_PROBE_PAST);                                                     \
        for (int r = 0; r < GEMV_ROWS && r0 + r < m; ++r) {                                            \
            __global float *yr = y + (size_t)(r0 + r) * C + c0;                                        \
            if (whole) {                                                                               \
                vstore8(acc[r], 0, yr);                                                                \
            } else {                                                                                   \
                float tmp[8];                                                                          \
                vstore8(acc[r], 0, tmp);                                                               \
                for (int j = 0; c0 + j < C; ++j) yr[j] = tmp[j];                                       \
            }                                                                                          \
        }                                                                                              \
        IHA_PROBE_CHECK();                                                                             \
    }

DEFINE_GEMV(gemv_half_weights, half, vload_half8, vload_half)
DEFINE_GEMV(gemv_bf16_weights, ushort, bf16_vload8, bf16_load)
