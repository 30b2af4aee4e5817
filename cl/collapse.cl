/* Fold-back of pseudo-heads: Y[b][n][h][c] = sum_m sum_p R[h][m][p] * O[b][m][n*P+p][c].
 * Memory-bound; one work-item per output element, neighbouring work-items on neighbouring c. */

__kernel void collapse_heads_f32(__global const float *o, ulong o_off, /* [B][H][T][d] */
                                 __global const float *r, ulong r_off, /* [H][H][P] */
                                 int identity,                         /* P == 1, R = I */
                                 __global float *y, ulong y_off,       /* [B][N][H][d] */
                                 int N, int H, int d, int P)
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
}
