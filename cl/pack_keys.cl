/* Repacks keys from rows [B*H][T][d] into the key-block layout of attention.cl,
 * [B*H][ceil(T/KB)][d][KB], zero-filling the padding rows. Used when the caller hands
 * iha_attention ready-made keys; the layer path has mix.cl write this layout directly. */

__kernel void pack_keys_f32(__global const float *src, ulong src_off, __global float *dst, ulong dst_off, int T,
                            int d, int key_block)
{
    const int c = get_global_id(0);
    const int t = get_global_id(1);
    const int bh = get_global_id(2);
    const int blocks = (T + key_block - 1) / key_block;
    if (c >= d || t >= blocks * key_block) return;
    const float x = t < T ? src[src_off + ((size_t)bh * T + t) * d + c] : 0.0f;
    dst[dst_off + (((size_t)bh * blocks + t / key_block) * d + c) * key_block + t % key_block] = x;
}
