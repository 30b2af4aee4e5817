/* The layer backward's small steps around the attention backward (doc/spec.md, "The backward pass"):
 * transposes for the weight gradients' products, the inverse rotary of dQt and dKt, and the
 * gradients of the mixing and collapse matrices. All memory-bound or small next to the
 * attention step; written for clarity and correctness on every device. */
#include "loop_probe.clh"

/* Side of the square tile one work-item of transpose_f32 moves. */
#define TR_TILE 8

/* dst[c][r] = src[r][c] for a rows x cols matrix, with leading dimensions (row strides) and
 * element offsets: the weight gradients are X^T dQ and Y^T dZ, and dX and dY need W^T, all as
 * products the library's non-transposing SGEMM runs. One TR_TILE x TR_TILE tile per work-item,
 * (column tile, row tile) = (get_global_id(0), get_global_id(1)); the tile's reads stay in
 * cache while each destination row is written contiguously. */
__kernel void transpose_f32(int rows, int cols, __global const float *src, ulong src_off, ulong ld_src,
                            __global float *dst, ulong dst_off, ulong ld_dst IHA_PROBE_PARAMS)
{
    const int c0 = (int)get_global_id(0) * TR_TILE, r0 = (int)get_global_id(1) * TR_TILE;
    if (c0 >= cols || r0 >= rows) return;
    const int nc = min(TR_TILE, cols - c0), nr = min(TR_TILE, rows - r0);
    for (int j = 0; j < nc; ++j) {
        __global float *out = dst + dst_off + (ulong)(c0 + j) * ld_dst + r0;
        const __global float *in = src + src_off + (ulong)r0 * ld_src + c0 + j;
        for (int i = 0; i < nr; ++i) out[i] = in[(ulong)i * ld_src];
    }
    IHA_PROBE_CHECK();
}

/* The gradient through doc/spec.md's step 3 rotation, in place on rows x [rows][d] (row index
 * bh * T + t, virtual position t): the rotation is orthogonal, so its gradient is the inverse
 * rotation, (g_i, g_{i+d/2}) -> (g_i cos + g_{i+d/2} sin, g_{i+d/2} cos - g_i sin). table is
 * the forward's [T][2][d/2] (cosines, then sines), or with heads = H > 0 (packed sequences) one
 * table per batch row, [B][T][2][d/2]. A work-item per (pair i, row). */
__kernel void rope_inverse_f32(__global float *x, ulong x_off, ulong rows, __global const float *table, int T, int d,
                               int heads IHA_PROBE_PARAMS)
{
    const int pairs = d / 2, i = (int)get_global_id(0);
    const ulong row = get_global_id(1);
    if (i >= pairs || row >= rows) return; /* the launch rounds both up to whole work-groups */
    const ulong t = (heads > 0 ? row / ((ulong)heads * T) * T : 0) + row % (ulong)T;
    const float c = table[t * d + i], s = table[t * d + pairs + i];
    __global float *g = x + x_off + row * (ulong)d;
    const float g0 = g[i], g1 = g[i + pairs];
    g[i] = g0 * c + g1 * s;
    g[i + pairs] = g1 * c - g0 * s;
    IHA_PROBE_CHECK();
}

/* The mixing and collapse matrices' gradients share one form (doc/spec.md):
 *   G[i][j][p] = sum over b, n, c of A[b][n][i][c] * V[b][j][n*P+p][c]
 * with A a token tensor [B][N][H][d] and V a virtual one [B][H][T][d]:
 *   dR      = G(dY, O)    (i = target head h, j = source head m)
 *   dalpha  = G(Q, dQt)   (i = source head m, j = target head h), and K, V alike.
 * Stage one: a work-item per (output, chunk of `chunk` tokens) writes its partial sum to
 * partial[chunk index][H*H*P]; stage two sums the chunks of each output in a fixed order, so the
 * result does not depend on scheduling. */
__kernel void mix_grad_partial_f32(__global const float *a, ulong a_off, __global const float *v, ulong v_off,
                                   __global float *partial, int B, int N, int H, int d, int P, int chunk IHA_PROBE_PARAMS)
{
    const int idx = (int)get_global_id(0), part = (int)get_global_id(1);
    const int outputs = H * H * P;
    if (idx >= outputs) return;
    const int p = idx % P, j = (idx / P) % H, i = idx / (P * H);
    const long tokens = (long)B * N, first = (long)part * chunk;
    if (first >= tokens) return;
    const long last = min(first + chunk, tokens);
    const ulong T = (ulong)N * P;
    /* Eight columns at a time in a vector (PoCL vectorises explicit vectors inside a work-item,
     * not scalar loops), the rest one by one. */
    float8 acc8 = (float8)(0.0f);
    float acc = 0.0f;
    const int whole = d - d % 8;
    long bn = first;
    for (; bn < last + IHA_PROBE_PAST; ++bn) {
        IHA_PROBE_SKIP_PAST(bn >= last);
        const ulong b = (ulong)(bn / N), n = (ulong)(bn % N);
        const __global float *ar = a + a_off + ((ulong)bn * H + i) * d;
        const __global float *vr = v + v_off + ((b * H + j) * T + n * P + p) * d;
        for (int c = 0; c < whole; c += 8) acc8 = fma(vload8(0, ar + c), vload8(0, vr + c), acc8);
        for (int c = whole; c < d; ++c) acc = fma(ar[c], vr[c], acc);
    }
    IHA_PROBE_EXPECT(bn >= last + IHA_PROBE_PAST);
    const float4 a4 = acc8.lo + acc8.hi;
    const float2 a2 = a4.lo + a4.hi;
    partial[(ulong)part * outputs + idx] = acc + a2.x + a2.y;
    IHA_PROBE_CHECK();
}

__kernel void mix_grad_reduce_f32(__global const float *partial, int outputs, int parts, __global float *g,
                                  ulong g_off IHA_PROBE_PARAMS)
{
    const int idx = (int)get_global_id(0);
    if (idx >= outputs) return;
    float acc = 0.0f;
    for (int k = 0; k < parts; ++k) acc += partial[(ulong)k * outputs + idx];
    g[g_off + idx] = acc;
    IHA_PROBE_CHECK();
}
