/* Head mixing into pseudo-heads, interleaved token-major, with optional rotary.
 *   dst[b][h][t][c] = sum_m alpha[m][h][p] * src[b][n][m][c],  t = n*P + p
 * then, when asked, the rotate-half rotation of the pair (c, c + d/2) at position t, from a
 * cos/sin table [T][2][d/2] (cos row, then sin row) that the host computed in double precision:
 * a float angle t*theta loses ~1e-3 at t = 32768, far outside the contract.
 * Output layout: key_block == 0 gives rows [B*H][T][d]; key_block = KB > 0 gives the key-block
 * layout of attention.cl, [B*H][ceil(T/KB)][d][KB], with the padding rows written as zeros.
 * Two variants of one contract, chosen per device:
 *   mix_heads_f32       one column pair per work-item: neighbouring work-items read
 *                       neighbouring addresses, which is what GPUs coalesce;
 *   mix_heads_rows_f32  one (token, head) per work-item, MIX_VEC columns at a time in explicit
 *                       vectors, which is what vectorises on CPUs (PoCL);
 * and for the keys on CPUs, mix_keys_blocks_f32: one key block per work-item, so that each of
 * the block's columns (MIX_KB consecutive floats of the key-block layout) is written with
 * vector stores after a transpose in registers (store_transposed8); the row variant would
 * scatter every element MIX_KB floats apart (measured 4x slower). */

/* Columns per vector in mix_heads_rows_f32 and mix_keys_blocks_f32: 4, 8 or 16. */
#ifndef MIX_VEC
#define MIX_VEC 8
#endif
/* Keys per block of the key-block layout in mix_keys_blocks_f32: 4, 8 or 16 (attention.cl's ATT_KB). */
#ifndef MIX_KB
#define MIX_KB 16
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatM CAT(float, MIX_VEC)
#define vloadM CAT(vload, MIX_VEC)
#define vstoreM CAT(vstore, MIX_VEC)
#define vloadKB CAT(vload, MIX_KB)
#define vstoreKB CAT(vstore, MIX_KB)

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
            const __global float *cs = rope + (size_t)t * d;
            const float y0 = x0 * cs[i] - x1 * cs[pairs + i];
            const float y1 = x1 * cs[i] + x0 * cs[pairs + i];
            x0 = y0;
            x1 = y1;
        }
    }
    dst[dst_off + out_index(bh, t, c0, T, d, key_block)] = x0;
    if (has1) dst[dst_off + out_index(bh, t, c1, T, d, key_block)] = x1;
}

/* Columns [c, c + MIX_VEC) of a row, zeros from `limit` on. */
static inline floatM load_cols(const __global float *row, int c, int limit)
{
    if (c + MIX_VEC <= limit) return vloadM(0, row + c);
    float tmp[MIX_VEC];
    for (int i = 0; i < MIX_VEC; ++i) tmp[i] = c + i < limit ? row[c + i] : 0.0f;
    return vloadM(0, tmp);
}

/* The mixed columns [c, c + MIX_VEC) below `limit`, of rows m*d apart (one per source head). */
static inline floatM mix_cols(const __global float *row, const __global float *a, int identity, int h, int H, int P,
                              int d, int c, int limit)
{
    if (identity) return load_cols(row + (size_t)h * d, c, limit);
    floatM acc = (floatM)(0.0f);
    for (int m = 0; m < H; ++m) acc = fma((floatM)(a[(size_t)m * H * P]), load_cols(row + (size_t)m * d, c, limit), acc);
    return acc;
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
                                 __global const float *rope, int use_rope, int N, int H, int d, int P, int key_block)
{
    const int n = get_global_id(0);
    const int bh = get_global_id(1);
    if (n >= N) return;
    const int h = bh % H, b = bh / H;
    const int T = N * P;
    const __global float *row = src + src_off + ((size_t)b * N + n) * H * d;
    __global float *out = dst + dst_off;
    for (int p = 0; p < P; ++p) {
        const int t = n * P + p;
        const __global float *a = alpha + alpha_off + (size_t)h * P + p;
        if (use_rope) {
            const int hd = d / 2;
            const __global float *cs = rope + (size_t)t * d;
            for (int c = 0; c < hd; c += MIX_VEC) {
                const floatM x0 = mix_cols(row, a, identity, h, H, P, d, c, hd);
                const floatM x1 = mix_cols(row + hd, a, identity, h, H, P, d, c, hd);
                const floatM cv = load_cols(cs, c, hd), sv = load_cols(cs + hd, c, hd);
                store_cols(out, bh, t, c, x0 * cv - x1 * sv, hd, T, d, key_block);
                store_cols(out + hd * (key_block ? key_block : 1), bh, t, c, x1 * cv + x0 * sv, hd, T, d, key_block);
            }
        } else {
            for (int c = 0; c < d; c += MIX_VEC)
                store_cols(out, bh, t, c, mix_cols(row, a, identity, h, H, P, d, c, d), d, T, d, key_block);
        }
    }
    /* The last token's work-item zero-fills the key-block padding rows past T. */
    if (key_block && n == N - 1) {
        const int padded = (T + key_block - 1) / key_block * key_block;
        for (int t = T; t < padded; ++t)
            for (int c = 0; c < d; ++c) out[out_index(bh, t, c, T, d, key_block)] = 0.0f;
    }
}

#if (MIX_VEC == 8 || MIX_VEC == 16) && (MIX_KB == 8 || MIX_KB == 16)
/* Columns [c0, c0 + 8) below `cols` of 8 rows r[0..7] (8 columns each) written as 8-row pieces
 * of the key-block columns: column i goes to out[(c0 + i) * MIX_KB + first, + 8). An 8x8
 * transpose in registers (unpack, shuffle, 128-bit permute, which is what the swizzles below
 * compile to on AVX2) instead of 64 extracts and scalar stores through private memory, which
 * took most of this kernel's time. */
static inline void store_transposed8(__global float *out, const float8 *r, int c0, int cols, int first)
{
    float8 t[8], u[8];
    #pragma unroll
    for (int k = 0; k < 8; k += 2) {
        t[k] = (float8)(r[k].s0, r[k + 1].s0, r[k].s1, r[k + 1].s1, r[k].s4, r[k + 1].s4, r[k].s5, r[k + 1].s5);
        t[k + 1] = (float8)(r[k].s2, r[k + 1].s2, r[k].s3, r[k + 1].s3, r[k].s6, r[k + 1].s6, r[k].s7, r[k + 1].s7);
    }
    #pragma unroll
    for (int k = 0; k < 8; k += 4) {
        u[k] = (float8)(t[k].s01, t[k + 2].s01, t[k].s45, t[k + 2].s45);
        u[k + 1] = (float8)(t[k].s23, t[k + 2].s23, t[k].s67, t[k + 2].s67);
        u[k + 2] = (float8)(t[k + 1].s01, t[k + 3].s01, t[k + 1].s45, t[k + 3].s45);
        u[k + 3] = (float8)(t[k + 1].s23, t[k + 3].s23, t[k + 1].s67, t[k + 3].s67);
    }
    /* u[0..3] hold rows 0-3 of columns (0, 4), (1, 5), (2, 6), (3, 7); u[4..7] rows 4-7. */
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (c0 + i < cols) vstore8((float8)(u[i].lo, u[i + 4].lo), 0, out + (size_t)(c0 + i) * MIX_KB + first);
        if (c0 + i + 4 < cols) vstore8((float8)(u[i].hi, u[i + 4].hi), 0, out + (size_t)(c0 + i + 4) * MIX_KB + first);
    }
}
#if MIX_VEC == 16
/* 16 columns of 8 rows: two 8x8 pieces. */
static inline void store_transposed16(__global float *out, const float16 *r, int c0, int cols, int first)
{
    float8 lo[8], hi[8];
    #pragma unroll
    for (int k = 0; k < 8; ++k) {
        lo[k] = r[k].lo;
        hi[k] = r[k].hi;
    }
    store_transposed8(out, lo, c0, cols, first);
    store_transposed8(out, hi, c0 + 8, cols, first);
}
#define store_transposed store_transposed16
#else
#define store_transposed store_transposed8
#endif
#define MIX_TRANSPOSE_IN_REGISTERS 1
#else
#define MIX_TRANSPOSE_IN_REGISTERS 0
#endif

__kernel void mix_keys_blocks_f32(__global const float *src, ulong src_off, __global const float *alpha,
                                  ulong alpha_off, int identity, __global float *dst, ulong dst_off,
                                  __global const float *rope, int use_rope, int N, int H, int d, int P)
{
    const int blk = get_global_id(0);
    const int bh = get_global_id(1);
    const int T = N * P, blocks = (T + MIX_KB - 1) / MIX_KB;
    if (blk >= blocks) return;
    const int h = bh % H, b = bh / H;
    __global float *out = dst + dst_off + ((size_t)bh * blocks + blk) * d * MIX_KB;
    /* Columns per pass: with rotary the pair (c, c + d/2) is mixed together (d is even). */
    const int cols = use_rope ? d / 2 : d;
    for (int c0 = 0; c0 < cols; c0 += MIX_VEC) {
#if MIX_TRANSPOSE_IN_REGISTERS
        floatM r0[MIX_KB], r1[MIX_KB]; /* the block's rows: columns [c0, c0 + MIX_VEC), and c + cols */
#else
        float lo[MIX_VEC][MIX_KB], hi[MIX_VEC][MIX_KB]; /* [column][row of the block] */
#endif
        #pragma unroll
        for (int j = 0; j < MIX_KB; ++j) {
            const int t = blk * MIX_KB + j;
            floatM x0 = (floatM)(0.0f), x1 = (floatM)(0.0f); /* padding rows past T stay zero */
            if (t < T) {
                const int n = t / P, p = t % P;
                const __global float *row = src + src_off + ((size_t)b * N + n) * H * d;
                const __global float *a = alpha + alpha_off + (size_t)h * P + p;
                x0 = mix_cols(row, a, identity, h, H, P, d, c0, cols);
                if (use_rope) {
                    x1 = mix_cols(row + cols, a, identity, h, H, P, d, c0, cols);
                    const __global float *cs = rope + (size_t)t * d;
                    const floatM cv = load_cols(cs, c0, cols), sv = load_cols(cs + cols, c0, cols);
                    const floatM y0 = x0 * cv - x1 * sv;
                    x1 = x1 * cv + x0 * sv;
                    x0 = y0;
                }
            }
#if MIX_TRANSPOSE_IN_REGISTERS
            r0[j] = x0;
            r1[j] = x1;
#else
            float t0[MIX_VEC], t1[MIX_VEC];
            vstoreM(x0, 0, t0);
            vstoreM(x1, 0, t1);
            #pragma unroll
            for (int i = 0; i < MIX_VEC; ++i) {
                lo[i][j] = t0[i];
                hi[i][j] = t1[i];
            }
#endif
        }
#if MIX_TRANSPOSE_IN_REGISTERS
        #pragma unroll
        for (int g = 0; g < MIX_KB; g += 8) {
            store_transposed(out, r0 + g, c0, cols, g);
            if (use_rope) store_transposed(out + (size_t)cols * MIX_KB, r1 + g, c0, cols, g);
        }
#else
        for (int i = 0; i < MIX_VEC && c0 + i < cols; ++i) {
            vstoreKB(vloadKB(0, lo[i]), 0, out + (size_t)(c0 + i) * MIX_KB);
            if (use_rope) vstoreKB(vloadKB(0, hi[i]), 0, out + (size_t)(cols + c0 + i) * MIX_KB);
        }
#endif
    }
}
