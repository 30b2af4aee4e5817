/* Fold-back of pseudo-heads: Y[b][n][h][c] = sum_m sum_p R[h][m][p] * O[b][m][n*P+p][c].
 * Memory-bound. Two variants of one contract, chosen per device:
 *   collapse_heads_f32       one output element per work-item (coalesced on GPUs);
 *   collapse_heads_rows_f32  one token (all H output heads) per work-item, COLLAPSE_VEC columns
 *                            at a time in explicit vectors (vectorises on CPUs). The token's
 *                            H*P pseudo-head rows (H*P*d floats) are read from memory once and
 *                            from cache for every further head: a work-item per (token, head)
 *                            read them H times from memory, its heads being far apart in time. */
#include "loop_probe.clh"

/* Columns per vector in collapse_heads_rows_f32: 4, 8 or 16. */
#ifndef COLLAPSE_VEC
#define COLLAPSE_VEC 8
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatC CAT(float, COLLAPSE_VEC)
#define vloadC CAT(vload, COLLAPSE_VEC)
#define vstoreC CAT(vstore, COLLAPSE_VEC)

__kernel void collapse_heads_f32(__global const float *o, ulong o_off, /* [B][H][T][d] */
                                 __global const float *r, ulong r_off, /* [H][H][P] */
                                 int identity,                         /* P == 1, R = I */
                                 __global float *y, ulong y_off,       /* [B][N][H][d] */
                                 int N, int H, int d, int P IHA_PROBE_PARAMS)
{
    const int c = get_global_id(0);
    const int n = get_global_id(1);
    const int bh = get_global_id(2);
    if (c >= d || n >= N) return;
    const int h = bh % H, b = bh / H;
    const size_t T = (size_t)N * P;
    float acc = 0.0f;
    if (identity) {
        acc = o[o_off + ((size_t)bh * T + n) * d + c];
    } else {
        const __global float *rh = r + r_off + (size_t)h * H * P;
        for (int m = 0; m < H; ++m) {
            const __global float *om = o + o_off + (((size_t)b * H + m) * T + (size_t)n * P) * d + c;
            for (int p = 0; p < P; ++p) acc = fma(rh[m * P + p], om[(size_t)p * d], acc);
        }
    }
    y[y_off + (((size_t)b * N + n) * H + h) * d + c] = acc;
    IHA_PROBE_CHECK();
}

/* Columns [c, c + COLLAPSE_VEC) of a row, zeros from d on where a whole load is not allowed
 * (columns [0, whole) may be loaded whole, see collapse_heads_rows_f32). */
static inline floatC load_cols(const __global float *row, int c, int d, int whole)
{
    if (c + COLLAPSE_VEC <= whole) return vloadC(0, row + c);
    float tmp[COLLAPSE_VEC];
    for (int i = 0; i < COLLAPSE_VEC; ++i) tmp[i] = c + i < d ? row[c + i] : 0.0f;
    return vloadC(0, tmp);
}

/* Token n of sequence b, all H output heads, loading columns [0, whole) of each row whole. */
static inline void collapse_token(const __global float *o, ulong o_off, const __global float *r, ulong r_off,
                                  int identity, __global float *y, ulong y_off, int N, int H, int d, int P, int n, int b,
                                  int whole)
{
    const size_t T = (size_t)N * P;
    for (int h = 0; h < H; ++h) {
        __global float *out = y + y_off + (((size_t)b * N + n) * H + h) * d;
        for (int c = 0; c < d; c += COLLAPSE_VEC) {
            floatC acc = (floatC)(0.0f);
            if (identity) {
                acc = load_cols(o + o_off + (((size_t)b * H + h) * T + n) * d, c, d, whole);
            } else {
                for (int m = 0; m < H; ++m) {
                    const __global float *om = o + o_off + (((size_t)b * H + m) * T + (size_t)n * P) * d;
                    const __global float *rm = r + r_off + ((size_t)h * H + m) * P;
                    for (int p = 0; p < P; ++p) acc = fma((floatC)(rm[p]), load_cols(om + (size_t)p * d, c, d, whole), acc);
                }
            }
            if (c + COLLAPSE_VEC <= d) {
                vstoreC(acc, 0, out + c);
            } else {
                float tmp[COLLAPSE_VEC];
                vstoreC(acc, 0, tmp);
                for (int i = 0; c + i < d; ++i) out[c + i] = tmp[i];
            }
        }
    }
}

__kernel void collapse_heads_rows_f32(__global const float *o, ulong o_off, __global const float *r, ulong r_off,
                                      int identity, __global float *y, ulong y_off, int N, int H, int d, int P IHA_PROBE_PARAMS)
{
    const int n = get_global_id(0);
    const int b = get_global_id(1);
    if (n >= N) return;
    /* The last chunk of a width that COLLAPSE_VEC does not divide is one whole vector load that
     * runs into the next pseudo-token's row of the same head (the extra lanes are never stored)
     * rather than one load per element through the stack. Allowed while the chunk of the
     * token's last row (p = P - 1) ends inside its head's T rows, which end at or before the
     * tensor does: every token but the last one or few of each sequence, which take the element
     * path (P = 1 and identity: the same bound on row n). Two calls rather than one with a
     * run-time `whole`: where whole == d the compiler sees the store's test (c + COLLAPSE_VEC <= d)
     * in the loads and the loop stays the plain one; a `whole` of its own in every load (one loop,
     * or whole chunks and the tail in loops of their own) slows d = 64 and d = 80 down. */
    const int up = (d + COLLAPSE_VEC - 1) / COLLAPSE_VEC * COLLAPSE_VEC;
    if (up == d || (size_t)up > ((size_t)N * P - (size_t)n * P - (size_t)(P - 1)) * d)
        collapse_token(o, o_off, r, r_off, identity, y, y_off, N, H, d, P, n, b, d);
    else
        collapse_token(o, o_off, r, r_off, identity, y, y_off, N, H, d, P, n, b, up);
    IHA_PROBE_CHECK();
}
