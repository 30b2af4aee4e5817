/* Repacks keys from rows [B*H][T][d] into the key-block layout of attention.cl,
 * [B*H][ceil(T/KB)][d][KB], zero-filling the padding rows. Used when the caller hands
 * iha_attention ready-made keys; the layer path has mix.cl write this layout directly.
 * Two forms: one element per work-item (GPUs: neighbouring work-items read neighbouring
 * columns), and one key block per work-item (CPUs: each column of the block is one vector
 * store instead of KB scattered ones). */
#include "loop_probe.clh"

/* Keys per block in pack_keys_blocks_f32: 4, 8 or 16. */
#ifndef PACK_KB
#define PACK_KB 16
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define vstoreKB CAT(vstore, PACK_KB)
#define vloadKB CAT(vload, PACK_KB)

__kernel void pack_keys_f32(__global const float *src, ulong src_off, __global float *dst, ulong dst_off, int T,
                            int d, int key_block IHA_PROBE_PARAMS)
{
    const int c = get_global_id(0);
    const int t = get_global_id(1);
    const int bh = get_global_id(2);
    const int blocks = (T + key_block - 1) / key_block;
    if (c >= d || t >= blocks * key_block) return;
    const float x = t < T ? src[src_off + ((size_t)bh * T + t) * d + c] : 0.0f;
    dst[dst_off + (((size_t)bh * blocks + t / key_block) * d + c) * key_block + t % key_block] = x;
    IHA_PROBE_CHECK();
}

__kernel void pack_keys_blocks_f32(__global const float *src, ulong src_off, __global float *dst, ulong dst_off,
                                   int T, int d IHA_PROBE_PARAMS)
{
    const int blk = get_global_id(0);
    const int bh = get_global_id(1);
    const int blocks = (T + PACK_KB - 1) / PACK_KB;
    if (blk >= blocks) return;
    const int t0 = blk * PACK_KB;
    const __global float *rows[PACK_KB]; /* rows past T point at row T - 1 and are not read */
    #pragma unroll
    for (int j = 0; j < PACK_KB; ++j) rows[j] = src + src_off + ((size_t)bh * T + min(t0 + j, T - 1)) * d;
    __global float *out = dst + dst_off + ((size_t)bh * blocks + blk) * d * PACK_KB;
    for (int c = 0; c < d; ++c) {
        float col[PACK_KB];
        #pragma unroll
        for (int j = 0; j < PACK_KB; ++j) col[j] = t0 + j < T ? rows[j][c] : 0.0f;
        vstoreKB(vloadKB(0, col), 0, out + (size_t)c * PACK_KB);
    }
    IHA_PROBE_CHECK();
}
