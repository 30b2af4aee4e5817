/* Head mixing into pseudo-heads, interleaved token-major, with optional rotary.
 *   dst[b][h][t][c] = sum_m alpha[m][h][p] * src[b][n][m][c],  t = n*P + p
 * then, when asked, the rotate-half rotation of the pair (c, c + d/2) at position t, from a
 * cos/sin table [T][2][d/2] (cos row, then sin row) that the host computed in double precision:
 * a float angle t*theta loses ~1e-3 at t = 32768, far outside the contract. use_rope 2 takes a
 * table per batch row, [B][T][2][d/2], for packed sequences, whose positions restart at each
 * sequence (see rope_batch_row in mix_common.clh).
 * Output layout: key_block == 0 gives rows [B*H][T][d]; key_block = KB > 0 gives the key-block
 * layout of attention.cl, [B*H][ceil(T/KB)][d][KB], with the padding rows written as zeros.
 * Two variants of one contract, chosen per device:
 *   mix_heads_f32       one column pair per work-item: neighbouring work-items read
 *                       neighbouring addresses, which is what GPUs coalesce;
 *   mix_heads_rows_f32  one (token, head) per work-item, MIX_VEC columns at a time in explicit
 *                       vectors, which is what vectorises on CPUs (PoCL).
 * The keys on CPUs take a third kernel, mix_keys_blocks_f32 in cl/mix_keys.cl: a program of
 * its own, because PoCL compiles every kernel of a program when the library asks for its binary
 * (for the disk cache), and that kernel is by far the slowest of the three to compile. */
#include "loop_probe.clh"

#include "mix_common.clh"

/* Address of element (t, c) of virtual row t in either output layout. */
static inline size_t out_index(int bh, int t, int c, int T, int d, int key_block)
{
    if (key_block == 0) return ((size_t)bh * T + t) * d + c;
    const int blocks = (T + key_block - 1) / key_block;
    return (((size_t)bh * blocks + t / key_block) * d + c) * key_block + t % key_block;
}

__kernel void mix_heads_f32(__global const float *src, ulong src_off,     /* [B][N][H][d] */
                            __global const float *alpha, ulong alpha_off, /* [H][H][P] */
                            int identity,                                 /* P == 1, alpha = I */
                            __global float *dst, ulong dst_off,
                            __global const float *rope, int use_rope,     /* [T][2][d/2] */
                            int N, int H, int d, int P, int key_block IHA_PROBE_PARAMS)
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
            const __global float *cs = rope + (rope_batch_row(use_rope, b, T) + t) * d;
            const float y0 = x0 * cs[i] - x1 * cs[pairs + i];
            const float y1 = x1 * cs[i] + x0 * cs[pairs + i];
            x0 = y0;
            x1 = y1;
        }
    }
    dst[dst_off + out_index(bh, t, c0, T, d, key_block)] = x0;
    if (has1) dst[dst_off + out_index(bh, t, c1, T, d, key_block)] = x1;
    IHA_PROBE_CHECK();
}

static inline void store_cols(__global float *dst, int bh, int t, int c, floatM x, int limit, int T, int d,
                              int key_block)
{
    float tmp[MIX_VEC];
    if (key_block == 0 && c + MIX_VEC <= limit) {
        vstoreM(x, 0, dst + out_index(bh, t, c, T, d, 0));
        return;
    }
    vstoreM(x, 0, tmp);
    for (int i = 0; i < MIX_VEC && c + i < limit; ++i) dst[out_index(bh, t, c + i, T, d, key_block)] = tmp[i];
}

__kernel void mix_heads_rows_f32(__global const float *src, ulong src_off, __global const float *alpha,
                                 ulong alpha_off, int identity, __global float *dst, ulong dst_off,
                                 __global const float *rope, int use_rope, int N, int H, int d, int P, int key_block IHA_PROBE_PARAMS)
{
    const int n = get_global_id(0);
    const int bh = get_global_id(1);
    if (n >= N) return;
    const int h = bh % H, b = bh / H;
    const int T = N * P;
    const __global float *row = src + src_off + ((size_t)b * N + n) * H * d;
    const size_t avail = (size_t)(N - n) * H * d; /* floats from row to the end of sequence b's rows */
    __global float *out = dst + dst_off;
    for (int p = 0; p < P; ++p) {
        const int t = n * P + p;
        const __global float *a = alpha + alpha_off + (size_t)h * P + p;
        if (use_rope) {
            const int hd = d / 2;
            const __global float *cs = rope + (rope_batch_row(use_rope, b, T) + t) * d;
            const size_t cs_avail = (size_t)(T - t) * d; /* the table has T rows */
            const int whole = whole_cols(H, d, hd, avail), whole1 = whole_cols(H, d, hd, avail - hd);
            const int cs_whole = whole_cols(1, d, hd, cs_avail), sn_whole = whole_cols(1, d, hd, cs_avail - hd);
            for (int c = 0; c < hd; c += MIX_VEC) {
                const floatM x0 = mix_cols(row, a, identity, h, H, P, d, c, hd, whole);
                const floatM x1 = mix_cols(row + hd, a, identity, h, H, P, d, c, hd, whole1);
                const floatM cv = load_cols(cs, c, hd, cs_whole), sv = load_cols(cs + hd, c, hd, sn_whole);
                store_cols(out, bh, t, c, x0 * cv - x1 * sv, hd, T, d, key_block);
                store_cols(out + hd * (key_block ? key_block : 1), bh, t, c, x1 * cv + x0 * sv, hd, T, d, key_block);
            }
        } else {
            /* The chunks that MIX_VEC fills, then the tail, in loops of their own, and the tail's
             * whole-load limit worked out only here: with the test in one loop over all chunks
             * (and the limit live across it) the compiler keeps a stride of the loop over heads on
             * the stack, which slows d = 64 down. */
            int c = 0;
            for (; c + MIX_VEC <= d; c += MIX_VEC)
                store_cols(out, bh, t, c, mix_whole(row, a, identity, h, H, P, d, c), d, T, d, key_block);
            if (c < d) {
                const floatM x = mix_cols(row, a, identity, h, H, P, d, c, d, whole_cols(H, d, d, avail));
                store_cols(out, bh, t, c, x, d, T, d, key_block);
            }
        }
    }
    /* The last token's work-item zero-fills the key-block padding rows past T. */
    if (key_block && n == N - 1) {
        const int padded = (T + key_block - 1) / key_block * key_block;
        for (int t = T; t < padded; ++t)
            for (int c = 0; c < d; ++c) out[out_index(bh, t, c, T, d, key_block)] = 0.0f;
    }
    IHA_PROBE_CHECK();
}
