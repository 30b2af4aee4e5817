/* The keys' head mixing on CPUs (the contract of cl/mix.cl, key-block output only): one key
 * block per work-item: the block's mixed rows are gathered in a private array, then each 8x8
 * piece is transposed in registers (store_transposed8) so that each of the block's columns
 * (MIX_KB consecutive floats of the key-block layout) is written with vector stores;
 * mix_heads_rows_f32 would scatter every element MIX_KB floats apart, one store each. */
#include "loop_probe.clh"

#include "mix_common.clh"

/* Keys per block of the key-block layout: 4, 8 or 16 (attention.cl's ATT_KB). */
#ifndef MIX_KB
#define MIX_KB 16
#endif
#define vloadKB CAT(vload, MIX_KB)
#define vstoreKB CAT(vstore, MIX_KB)

#if (MIX_VEC == 8 || MIX_VEC == 16) && (MIX_KB == 8 || MIX_KB == 16)
/* Columns [c0, c0 + 8) below `cols` of 8 rows r[0..7] (8 columns each) written as 8-row pieces
 * of the key-block columns: column i goes to out[(c0 + i) * MIX_KB + first, + 8). An 8x8
 * transpose in registers (unpack, shuffle, 128-bit permute, which is what the swizzles below
 * compile to on AVX2) instead of 64 extracts and scalar stores through private memory, which
 * would take most of this kernel's time. */
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
                                  __global const float *rope, int use_rope, int N, int H, int d, int P IHA_PROBE_PARAMS)
{
    const int blk = get_global_id(0);
    const int bh = get_global_id(1);
    const int T = N * P, blocks = (T + MIX_KB - 1) / MIX_KB;
    if (blk >= blocks) return;
    const int h = bh % H, b = bh / H;
    __global float *out = dst + dst_off + ((size_t)bh * blocks + blk) * d * MIX_KB;
    /* Columns per pass: with rotary the pair (c, c + d/2) is mixed together (d is even). */
    const int cols = use_rope ? d / 2 : d;
    /* Where each row of the block reads its source token and alphas, worked out once per block
     * rather than once per column chunk (two divisions by P each). */
    size_t src_row[MIX_KB];
    int alpha_col[MIX_KB];
    /* Floats from a row of sequence b to the end of its rows: src_row[j]'s is seq_end - src_row[j]. */
    const size_t seq_end = src_off + ((size_t)b + 1) * N * H * d;
    int n = blk * MIX_KB / P, p = blk * MIX_KB % P;
    for (int j = 0; j < MIX_KB; ++j) {
        src_row[j] = src_off + ((size_t)b * N + n) * H * d;
        alpha_col[j] = h * P + p;
        if (++p == P) {
            p = 0;
            ++n;
        }
    }
    for (int c0 = 0; c0 < cols; c0 += MIX_VEC) {
#if MIX_TRANSPOSE_IN_REGISTERS
        floatM r0[MIX_KB], r1[MIX_KB]; /* the block's rows: columns [c0, c0 + MIX_VEC), and c + cols */
#else
        float lo[MIX_VEC][MIX_KB], hi[MIX_VEC][MIX_KB]; /* [column][row of the block] */
#endif
        /* Not unrolled: unrolled, the loop's MIX_KB copies of the mixing (with its tail path
         * and the rotary) take PoCL many seconds to compile, twice per program, most of an
         * empty-cache first call; kept in a loop it compiles quickly and runs as fast (the
         * divisions by P it would repeat are hoisted above). */
        #pragma unroll 1
        for (int j = 0; j < MIX_KB; ++j) {
            const int t = blk * MIX_KB + j;
            floatM x0 = (floatM)(0.0f), x1 = (floatM)(0.0f); /* padding rows past T stay zero */
            if (t < T) {
                const __global float *row = src + src_row[j];
                const __global float *a = alpha + alpha_off + alpha_col[j];
                const size_t avail = seq_end - src_row[j];
                x0 = mix_cols(row, a, identity, h, H, P, d, c0, cols, whole_cols(H, d, cols, avail));
                if (use_rope) {
                    x1 = mix_cols(row + cols, a, identity, h, H, P, d, c0, cols, whole_cols(H, d, cols, avail - cols));
                    const __global float *cs = rope + (rope_batch_row(use_rope, b, T) + t) * d;
                    const size_t cs_avail = (size_t)(T - t) * d; /* the table has T rows */
                    const floatM cv = load_cols(cs, c0, cols, whole_cols(1, d, cols, cs_avail));
                    const floatM sv = load_cols(cs + cols, c0, cols, whole_cols(1, d, cols, cs_avail - cols));
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
    IHA_PROBE_CHECK();
}
