/* Flash attention on NVIDIA's tensor cores (sm_80 and later): FlashAttention-2's layout with
 * Q.K^T and P.V as mma.sync m16n8k16 steps on half or bfloat16 inputs (MMA_BF16) with float
 * accumulation, and the online softmax in float. A work-group of MMA_WARPS warps owns
 * 16*MMA_WARPS consecutive query rows of one (b, h), each warp 16 of them; the keys and values
 * the group can see stream through local memory in tiles of LOC_KEYS keys.
 *
 * Why this shape: a warp keeps its query rows as A fragments in registers for the whole row
 * tile, so Q.K^T reads only the key tile from local memory, and its scores' C fragments are
 * already the A fragments of P.V (cl/mma_nv.clh's layout: the 16 x 8 score blocks 2k and 2k+1
 * form the 16 x 16 probability block k), so no probability passes through local memory. A
 * row's maximum and sum are reduced over the four lanes that hold it.
 *
 * Local tiles of 16-bit pairs: keys as [key][column pair], values transposed as [column][key
 * pair], so a B fragment register is one 32-bit word in both products; rows padded by 4 words
 * put the 8 rows and 4 pairs that a warp's load touches in 32 different banks.
 *
 * Inputs are float, as for every attention variant (the library converts 16-bit storage before
 * the core), and are rounded to 16 bits when staged (queries once, keys and values per tile); scale
 * and log2(e) multiply the float scores. What rounding costs is doc/spec.md's numerical
 * contract for this variant: the tuner offers it only where the storage's own tolerance holds
 * (src/tune/space_attention_mma.c). Masked keys never contribute: their scores are selected to
 * -inf, and a value that is not finite as a 16-bit input (infinite, NaN or past the type's
 * range) is staged as 0 and instead makes NaN exactly the outputs of rows that see its key,
 * rather than 0 times it making NaN the outputs of rows that do not. A visible score that is
 * not finite makes its row NaN.
 *
 * Arguments are those of attention_fwd_local_tiles_f32 (attention_args.clh), queries and values
 * as rows [B*H][T][HEAD_DIM] and keys in the key-block layout [B*H][ceil(T/ATT_KB)][HEAD_DIM]
 * [ATT_KB]. Any HEAD_DIM works: the head is padded with zeros to DP, a multiple of 16. */
#include "loop_probe.clh"
#include "attention_args.clh"
#include "mma_nv.clh"

#ifndef MMA_WARPS
#define MMA_WARPS 4 /* warps per work-group, 16 query rows each: 1, 2, 4 or 8 */
#endif
#ifndef LOC_KEYS
#define LOC_KEYS 32 /* keys per local tile: 16, 32 or 64, a multiple of ATT_KB */
#endif
#if MMA_WARPS != 1 && MMA_WARPS != 2 && MMA_WARPS != 4 && MMA_WARPS != 8
#error "MMA_WARPS must be 1, 2, 4 or 8"
#endif
#if LOC_KEYS % 16 != 0 || LOC_KEYS % ATT_KB != 0
#error "LOC_KEYS must be a multiple of 16 and of ATT_KB"
#endif

#define ROWS (16 * MMA_WARPS)
#define THREADS (32 * MMA_WARPS)
#define DP ((HEAD_DIM + 15) / 16 * 16) /* the head padded to whole k steps */
#define KS (DP / 2 + 4)                 /* words per key of the key tile */
#define VS (LOC_KEYS / 2 + 4)           /* words per column of the value tile */

#include "masks.clh"

/* The 16-bit pair (row t, columns c and c+1) of the query rows qb, zeros past T and HEAD_DIM. */
static inline uint query_pair(const __global float *qb, int t, int c, int T)
{
    const __global float *row = qb + (size_t)t * HEAD_DIM;
    return t < T ? mma_pack(c < HEAD_DIM ? row[c] : 0.0f, c + 1 < HEAD_DIM ? row[c + 1] : 0.0f) : 0u;
}

/* A score of the tile: scaled when key is visible in range r, and then NaN unless finite;
 * -inf when the key is masked. */
static inline float score(float s, int key, int2 r, float scale_log2)
{
    return key >= r.x && key <= r.y ? (isfinite(s) ? s * scale_log2 : NAN) : -INFINITY;
}

/* The tile at j0 into local memory. Keys past T read as zeros (blocks past the last one are not
 * there); values outside the group's visible union [lo, hi] too, so that the 0 probability every
 * row gives them multiplies a finite 0. A value that is not finite in 16 bits is staged as 0 and
 * marks the tile (*bad = j0 + 1, a maximum so that no reset is needed between tiles). Inline:
 * PoCL loses local writes made in a called function across the caller's barriers. */
__attribute__((always_inline)) static inline void load_tile(__local uint *ks, __local uint *vs, volatile __local int *bad,
                                                            const __global float *kb, const __global float *vb,
                                                            int j0, int lo, int hi, int T, int lid)
{
    /* In the packed buffer's order, so neighbouring work-items read neighbouring words. */
    for (int i = lid; i < LOC_KEYS * DP / 2; i += THREADS) {
        const int block = i / (DP / 2 * ATT_KB), pair = i / ATT_KB % (DP / 2), kk = i % ATT_KB;
        const int x = block * ATT_KB + kk, c = 2 * pair, j = j0 + x;
        const __global float *kr = kb + (size_t)(j / ATT_KB) * HEAD_DIM * ATT_KB + kk;
        const float k0 = j < T && c < HEAD_DIM ? kr[c * ATT_KB] : 0.0f;
        const float k1 = j < T && c + 1 < HEAD_DIM ? kr[(c + 1) * ATT_KB] : 0.0f;
        ks[x * KS + pair] = mma_pack(k0, k1);
    }
    for (int i = lid; i < LOC_KEYS / 2 * DP; i += THREADS) {
        const int pair = i / DP, c = i % DP, j = j0 + 2 * pair;
        const float v0 = c < HEAD_DIM && j >= lo && j <= hi ? vb[(size_t)j * HEAD_DIM + c] : 0.0f;
        const float v1 = c < HEAD_DIM && j + 1 >= lo && j + 1 <= hi ? vb[(size_t)(j + 1) * HEAD_DIM + c] : 0.0f;
        uint h = mma_pack(v0, v1);
        if (MMA_NOT_FINITE(h) || MMA_NOT_FINITE(h >> 16)) {
            atomic_max(bad, j0 + 1);
            h &= (MMA_NOT_FINITE(h) ? 0xffff0000u : 0xffffffffu) & (MMA_NOT_FINITE(h >> 16) ? 0xffffu : 0xffffffffu);
        }
        vs[c * VS + pair] = h;
    }
}

/* NaN where a key of the tile at j0 that row range r sees has a value in column c that is not
 * finite in 16 bits (the rare tiles load_tile marks). */
static inline float poison(float acc, const __global float *vb, int j0, int2 r, int c)
{
    if (c >= HEAD_DIM) return acc;
    for (int j = max(j0, r.x); j <= min(j0 + LOC_KEYS - 1, r.y); ++j)
        if (MMA_NOT_FINITE(mma_pack(vb[(size_t)j * HEAD_DIM + c], 0.0f))) return NAN;
    return acc;
}

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void attention_fwd_mma_nv(ATTENTION_LOCAL_ARGS IHA_PROBE_PARAMS)
{
    __local uint ks[LOC_KEYS * KS];
    __local uint vs[DP * VS];
    __local int bad;
#if IHA_MMA_EMULATE
    __local float scratch[MMA_WARPS * MMA_SCRATCH];
#endif
    const int lid = get_local_id(0), warp = lid / 32, lane = lid % 32, g = lane >> 2, q4 = lane & 3;
#if IHA_MMA_EMULATE
    __local float *scr = scratch + warp * MMA_SCRATCH;
#endif
    const int t0 = get_group_id(0) * ROWS;
    const int bh = get_global_id(1);
    const int blocks = (T + ATT_KB - 1) / ATT_KB;
    const __global float *qb = q + q_off + (size_t)bh * T * HEAD_DIM;
    const __global float *kb = kp + k_off + (size_t)bh * blocks * HEAD_DIM * ATT_KB;
    const __global float *vb = v + v_off + (size_t)bh * T * HEAD_DIM;
    const __global int2 *seq = seq_row(seq_bounds, seq_heads, bh, T, P);
    const int row0 = t0 + 16 * warp + g, row1 = row0 + 8; /* the rows of this lane's fragments */

    uint4 qa[DP / 16];
    MMA_UNROLL
    for (int k = 0; k < DP / 16; ++k) {
        const int c = 16 * k + 2 * q4;
        qa[k] = (uint4)(query_pair(qb, row0, c, T), query_pair(qb, row1, c, T), query_pair(qb, row0, c + 8, T),
                        query_pair(qb, row1, c + 8, T));
    }
    const int2 r0 = visible_keys(min(row0, T - 1), T, P, mask, window, seq);
    const int2 r1 = visible_keys(min(row1, T - 1), T, P, mask, window, seq);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float4 acc[DP / 8];
    MMA_UNROLL
    for (int n = 0; n < DP / 8; ++n) acc[n] = (float4)(0.0f);
    /* The same for every work-item of the group, so the barriers below are reached uniformly. */
    const int lo_min = visible_keys(t0, T, P, mask, window, seq).x;
    const int hi_max = visible_keys(min(t0 + ROWS - 1, T - 1), T, P, mask, window, seq).y;
    if (lid == 0) bad = 0;

    int j0 = lo_min / LOC_KEYS * LOC_KEYS;
    for (; j0 <= hi_max + IHA_PROBE_PAST * LOC_KEYS; j0 += LOC_KEYS) {
        IHA_PROBE_SKIP_PAST(j0 > hi_max); /* uniform across the group, like the barriers */
        barrier(CLK_LOCAL_MEM_FENCE);     /* the previous tile is read */
        load_tile(ks, vs, &bad, kb, vb, j0, lo_min, hi_max, T, lid);
        barrier(CLK_LOCAL_MEM_FENCE);

        float4 s[LOC_KEYS / 8];
        MMA_UNROLL
        for (int n = 0; n < LOC_KEYS / 8; ++n) s[n] = (float4)(0.0f);
        MMA_UNROLL
        for (int k = 0; k < DP / 16; ++k) {
            MMA_UNROLL
            for (int n = 0; n < LOC_KEYS / 8; ++n) {
                const __local uint *kr = ks + (8 * n + g) * KS + 8 * k + q4;
                s[n] = mma_16816(s[n], qa[k], (uint2)(kr[0], kr[4]) MMA_ENV);
            }
        }

        float mx0 = -INFINITY, mx1 = -INFINITY;
        MMA_UNROLL
        for (int n = 0; n < LOC_KEYS / 8; ++n) {
            const int key = j0 + 8 * n + 2 * q4;
            s[n] = (float4)(score(s[n].x, key, r0, scale_log2), score(s[n].y, key + 1, r0, scale_log2),
                            score(s[n].z, key, r1, scale_log2), score(s[n].w, key + 1, r1, scale_log2));
            mx0 = fmax(mx0, fmax(s[n].x, s[n].y));
            mx1 = fmax(mx1, fmax(s[n].z, s[n].w));
        }
        mx0 = quad_max(mx0 MMA_ENV);
        mx1 = quad_max(mx1 MMA_ENV);
        /* A row that has seen no visible key keeps m = -inf; base 0 makes every exponential
         * exactly 0 instead of NaN. */
        const float new0 = fmax(m0, mx0), new1 = fmax(m1, mx1);
        const float base0 = new0 == -INFINITY ? 0.0f : new0, base1 = new1 == -INFINITY ? 0.0f : new1;
        const float corr0 = exp2(m0 - base0), corr1 = exp2(m1 - base1);
        m0 = new0, m1 = new1;
        l0 *= corr0, l1 *= corr1;
        MMA_UNROLL
        for (int n = 0; n < DP / 8; ++n) acc[n] *= (float4)(corr0, corr0, corr1, corr1);

        uint4 pa[LOC_KEYS / 16];
        MMA_UNROLL
        for (int n = 0; n < LOC_KEYS / 8; ++n) {
            const float4 p = exp2(s[n] - (float4)(base0, base0, base1, base1));
            l0 += p.x + p.y;
            l1 += p.z + p.w;
            if (n % 2 == 0) {
                pa[n / 2].x = mma_pack(p.x, p.y);
                pa[n / 2].y = mma_pack(p.z, p.w);
            } else {
                pa[n / 2].z = mma_pack(p.x, p.y);
                pa[n / 2].w = mma_pack(p.z, p.w);
            }
        }
        MMA_UNROLL
        for (int k = 0; k < LOC_KEYS / 16; ++k) {
            MMA_UNROLL
            for (int n = 0; n < DP / 8; ++n) {
                const __local uint *vr = vs + (8 * n + g) * VS + 8 * k + q4;
                acc[n] = mma_16816(acc[n], pa[k], (uint2)(vr[0], vr[4]) MMA_ENV);
            }
        }
        if (bad == j0 + 1) {
            MMA_UNROLL
            for (int n = 0; n < DP / 8; ++n) {
                const int c = 8 * n + 2 * q4;
                acc[n] = (float4)(poison(acc[n].x, vb, j0, r0, c), poison(acc[n].y, vb, j0, r0, c + 1),
                                  poison(acc[n].z, vb, j0, r1, c), poison(acc[n].w, vb, j0, r1, c + 1));
            }
        }
    }
    IHA_PROBE_EXPECT(j0 > hi_max + IHA_PROBE_PAST * LOC_KEYS);

    l0 = quad_sum(l0 MMA_ENV);
    l1 = quad_sum(l1 MMA_ENV);
    /* l = 0 (no score was finite) or NaN makes the row NaN, as in attention_fwd_f32. */
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    __global float *o0 = o + o_off + ((size_t)bh * T + row0) * HEAD_DIM;
    __global float *o1 = o0 + 8 * HEAD_DIM;
    MMA_UNROLL
    for (int n = 0; n < DP / 8; ++n) {
        const int c = 8 * n + 2 * q4;
        if (row0 < T && c < HEAD_DIM) o0[c] = acc[n].x * inv0;
        if (row0 < T && c + 1 < HEAD_DIM) o0[c + 1] = acc[n].y * inv0;
        if (row1 < T && c < HEAD_DIM) o1[c] = acc[n].z * inv1;
        if (row1 < T && c + 1 < HEAD_DIM) o1[c + 1] = acc[n].w * inv1;
    }
    if (want_lse && q4 == 0) {
        __global float *lrow = lse + lse_off + (size_t)bh * T;
        if (row0 < T) lrow[row0] = l0 > 0.0f ? (m0 + log2(l0)) * M_LN2_F : NAN;
        if (row1 < T) lrow[row1] = l1 > 0.0f ? (m1 + log2(l1)) * M_LN2_F : NAN;
    }
    IHA_PROBE_CHECK();
}
