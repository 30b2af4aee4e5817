/* SGEMM written like a CPU GEMM micro-kernel: C[m][n] = alpha * A[m][k] * B[k][n] + beta * C,
 * row-major, with element offsets and leading dimensions; with beta = 0, C is not read, so NaN in
 * C does not survive (the layer's products overwrite; the backward's dX accumulates with 1).
 *  - each work-item owns a GEMM_MR x GEMM_VW tile of C held in GEMM_MR floatN accumulators, and
 *    walks k reading one row of B as a vector and broadcasting one element of A per row into an
 *    FMA (no horizontal sums, no local memory);
 *  - dimension 0 runs over row tiles and dimension 1 over column tiles, so the work-items of a
 *    work-group, which PoCL runs one after another on one core, share the same k x GEMM_VW panel
 *    of B while it is in cache, and A streams;
 *  - k is unrolled by GEMM_KU with a remainder loop; rows past m read row m-1 and are not
 *    stored, and only a tile reaching past n takes a guarded path, so nothing out of bounds is
 *    read or written;
 *  - with GEMM_PACKED, B comes packed by gemm_pack_b_f32 as [ceil(n / GEMM_VW)][k][GEMM_VW]
 *    (zeros past n): a panel is then contiguous. Unpacked, a panel's rows lie ldb floats apart, and where
 *    ldb is a power of two they all fall into the same few cache sets and evict each other.
 * Written for CPUs (PoCL vectorises explicit floatN inside a work-item; AVX2's 16 registers
 * hold the 6 x 16 tile's 12 halves, one row of B and a broadcast). It is correct on GPUs, where
 * CLBlast's local-memory kernels are faster. */
#include "loop_probe.clh"

/* Rows of C per work-item, 1 to 8. */
#ifndef GEMM_MR
#define GEMM_MR 6
#endif
/* Columns of C per work-item: the vector width, 4, 8 or 16. */
#ifndef GEMM_VW
#define GEMM_VW 16
#endif
/* Unrolling of the k loop. */
#ifndef GEMM_KU
#define GEMM_KU 4
#endif

/* 1: B is packed (see above); the host packs it for products with enough rows to repay it. */
#ifndef GEMM_PACKED
#define GEMM_PACKED 0
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatV CAT(float, GEMM_VW)
#define vloadV CAT(vload, GEMM_VW)
#define vstoreV CAT(vstore, GEMM_VW)

/* Row l of the B panel: a whole vector, or, past column n, its first `cols` elements and zeros. */
static inline floatV panel_row(__global const float *bp, int cols)
{
    if (cols >= GEMM_VW) return vloadV(0, bp);
    float part[GEMM_VW];
#pragma unroll
    for (int j = 0; j < GEMM_VW; ++j) part[j] = j < cols ? bp[j] : 0.0f;
    return vloadV(0, part);
}

/* The tile's rank-1 updates for k in [l0, l1). Returns 0 only when the driver cut the loop
 * short (cl/loop_probe.clh; always 1 elsewhere). */
static inline int tile_update(floatV acc[GEMM_MR], __global const float *const ap[GEMM_MR],
                              __global const float *bp, ulong ldb, int cols, int l0, int l1)
{
    int l = l0;
    for (; l < l1 + IHA_PROBE_PAST; ++l) {
        IHA_PROBE_SKIP_PAST(l >= l1);
        const floatV bv = panel_row(bp + (ulong)l * ldb, cols);
#pragma unroll
        for (int r = 0; r < GEMM_MR; ++r) acc[r] = fma((floatV)(ap[r][l]), bv, acc[r]);
    }
    return l >= l1 + IHA_PROBE_PAST;
}

__kernel void sgemm_f32(int m, int n, int k, float alpha, float beta, __global const float *a, ulong a_off, ulong lda,
                        __global const float *b, ulong b_off, ulong ldb, __global float *c, ulong c_off, ulong ldc IHA_PROBE_PARAMS)
{
    const int row0 = (int)get_global_id(0) * GEMM_MR, col0 = (int)get_global_id(1) * GEMM_VW;
    if (row0 >= m || col0 >= n) return; /* work-items that round the grid up to whole groups */
    const int cols = n - col0; /* >= GEMM_VW on every tile but the last column of tiles */

    __global const float *ap[GEMM_MR];
    floatV acc[GEMM_MR];
#pragma unroll
    for (int r = 0; r < GEMM_MR; ++r) {
        ap[r] = a + a_off + (ulong)min(row0 + r, m - 1) * lda;
        acc[r] = (floatV)(0.0f);
    }
#if GEMM_PACKED
    __global const float *bp = b + b_off + (ulong)get_global_id(1) * (ulong)k * GEMM_VW;
    ldb = GEMM_VW;
    const int full = 1; /* packed panels are whole vectors, zeros past n */
#else
    __global const float *bp = b + b_off + col0;
    const int full = cols >= GEMM_VW;
#endif

    const int k_main = k - k % GEMM_KU;
    if (full) {
        int l = 0;
        for (; l < k_main + IHA_PROBE_PAST * GEMM_KU; l += GEMM_KU) {
            IHA_PROBE_SKIP_PAST(l >= k_main);
#pragma unroll
            for (int u = 0; u < GEMM_KU; ++u) {
                const floatV bv = vloadV(0, bp + (ulong)(l + u) * ldb);
#pragma unroll
                for (int r = 0; r < GEMM_MR; ++r) acc[r] = fma((floatV)(ap[r][l + u]), bv, acc[r]);
            }
        }
        IHA_PROBE_EXPECT(l >= k_main + IHA_PROBE_PAST * GEMM_KU);
        const int tail_whole = tile_update(acc, ap, bp, ldb, cols, k_main, k);
        IHA_PROBE_EXPECT(tail_whole);
    } else {
        const int whole = tile_update(acc, ap, bp, ldb, cols, 0, k);
        IHA_PROBE_EXPECT(whole);
    }

#pragma unroll
    for (int r = 0; r < GEMM_MR; ++r) {
        if (row0 + r >= m) break;
        __global float *cp = c + c_off + (ulong)(row0 + r) * ldc + col0;
        floatV out = alpha * acc[r];
        if (cols >= GEMM_VW) {
            if (beta != 0.0f) out = fma((floatV)(beta), vloadV(0, cp), out);
            vstoreV(out, 0, cp);
        } else {
            float part[GEMM_VW];
            vstoreV(out, 0, part);
            for (int j = 0; j < cols; ++j) cp[j] = beta != 0.0f ? fma(beta, cp[j], part[j]) : part[j];
        }
    }
    IHA_PROBE_CHECK();
}

/* B [k][n] (leading dimension ldb) -> packed [ceil(n / GEMM_VW)][k][GEMM_VW], zeros past column n:
 * one row of one panel per work-item, (panel, l) = (get_global_id(1), get_global_id(0)). */
__kernel void gemm_pack_b_f32(int k, int n, __global const float *b, ulong b_off, ulong ldb, __global float *packed IHA_PROBE_PARAMS)
{
    const int l = (int)get_global_id(0), panel = (int)get_global_id(1), col0 = panel * GEMM_VW;
    if (l >= k || col0 >= n) return;
    const floatV row = panel_row(b + b_off + (ulong)l * ldb + col0, n - col0);
    vstoreV(row, 0, packed + ((ulong)panel * (ulong)k + (ulong)l) * GEMM_VW);
    IHA_PROBE_CHECK();
}
