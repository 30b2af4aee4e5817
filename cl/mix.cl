/* Head mixing into pseudo-heads, interleaved token-major, with optional rotary.
 *   dst[b][h][t][c] = sum_m alpha[m][h][p] * src[b][n][m][c],  t = n*P + p
 * then, when asked, the rotate-half rotation of the pair (c, c + d/2) at position t, from a
 * cos/sin table the host computed in double precision (a float angle t*theta loses ~1e-3 at
 * t = 32768, far outside the contract).
 * Memory-bound: each work-item makes one column pair of one virtual row, so reads of a source
 * row are contiguous across neighbouring work-items on GPUs and in one work-item's loop on CPUs.
 * Output layout: key_block == 0 gives rows [B*H][T][d]; key_block = KB > 0 gives the key-block
 * layout of attention.cl, [B*H][ceil(T/KB)][d][KB], with the padding rows written as zeros. */

__kernel void mix_heads_f32(__global const float *src, ulong src_off,     /* [B][N][H][d] */
                            __global const float *alpha, ulong alpha_off, /* [H][H][P] */
                            int identity,                                 /* P == 1, alpha = I */
                            __global float *dst, ulong dst_off,
                            __global const float *rope, int use_rope,     /* [T][d/2] of (cos, sin) */
                            int N, int H, int d, int P, int key_block)
{
    const int i = get_global_id(0);
    const int t = get_global_id(1);
    const int bh = get_global_id(2);
    const int pairs = (d + 1) / 2; /* "half" is a type in OpenCL C */
    const int T = N * P;
    const int rows = key_block ? (T + key_block - 1) / key_block * key_block : T;
    if (i >= pairs || t >= rows) return;
    const int h = bh % H, b = bh / H;
    const int c0 = i, c1 = i + pairs;
    const int has1 = c1 < d;

    float x0 = 0.0f, x1 = 0.0f;
    if (t < T) {
        const int n = t / P, p = t % P;
        const __global float *row = src + src_off + (size_t)(b * (size_t)N + n) * H * d;
        if (identity) {
            x0 = row[h * d + c0];
            x1 = has1 ? row[h * d + c1] : 0.0f;
        } else {
            const __global float *a = alpha + alpha_off + (size_t)h * P + p;
            for (int m = 0; m < H; ++m) {
                const float w = a[(size_t)m * H * P];
                x0 = fma(w, row[m * d + c0], x0);
                if (has1) x1 = fma(w, row[m * d + c1], x1);
            }
        }
        if (use_rope) {
            const __global float *cs = rope + ((size_t)t * pairs + i) * 2;
            const float y0 = x0 * cs[0] - x1 * cs[1];
            const float y1 = x1 * cs[0] + x0 * cs[1];
            x0 = y0;
            x1 = y1;
        }
    }

    if (key_block == 0) {
        __global float *out = dst + dst_off + ((size_t)bh * T + t) * d;
        out[c0] = x0;
        if (has1) out[c1] = x1;
    } else {
        const int blocks = rows / key_block;
        __global float *out = dst + dst_off + (((size_t)bh * blocks + t / key_block) * d) * key_block + t % key_block;
        out[(size_t)c0 * key_block] = x0;
        if (has1) out[(size_t)c1 * key_block] = x1;
    }
}
