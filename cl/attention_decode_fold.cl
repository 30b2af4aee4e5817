/* The second pass of a folded decoding step on a compact cache (doc/spec.md, "The compact
 * cache"). A step of one token per sequence folds the collapse by R and the mixing by alpha_V
 * into one weight per (target head h', cached head m) and cached token n:
 *     Y[h'] = sum over n, m of W_n[h'][m] · V[n][m]
 *     W_n[h'][m] = sum over h, p, p' of R[h'][h][p] · a[h·P + p][n·P + p'] · alpha_V[m][h][p']
 * with a the normalised probabilities of the step's query row (h, p), so a cached token's values
 * cost H·H·d multiply-adds instead of the H·P·H·d of attending first and collapsing after. A
 * row's normaliser must be known before rows are mixed: the first pass
 * (cl/attention_decode_compact_lanes.cl with DEC_FOLD) stores each token's exponentials against
 * its running maxima, and each split's softmax state; attention_decode_fold_values merges the
 * states, weighs the values of its split's tokens and writes its split's share of Y;
 * attention_decode_fold_sum adds the shares.
 * Tokens lie across the lanes of the probabilities and weights, so their mixing is made of
 * vector FMAs with broadcast coefficients; the values' columns lie across the lanes of the sums. */
#include "loop_probe.clh"
#include "masks.clh"
#include "kv_compact.clh"
#include "decode_combine.clh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef DEC_H
#error "DEC_H must be defined"
#endif
#ifndef DEC_P
#error "DEC_P must be defined"
#endif
/* 1: prefetch (where the host knows the intrinsic compiles): the values FOLD_AHEAD tokens on
 * into the second-level cache, as the hardware's prefetch does not cross pages, and each next
 * block's stored rows. */
#ifndef DEC_PREFETCH
#define DEC_PREFETCH 0
#endif

#define HP (DEC_H * DEC_P)
/* Floats stored per cached token: P exponentials (by key position) for each of the H·P query
 * rows, then the rows' maxima they were taken against. */
#define SCORES (DEC_P * HP)
#define STORED (SCORES + HP)
#define TOKEN_ELEMS (DEC_H * HEAD_DIM)
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

/* Columns per vector of the sums: the widest of 16, 8 and 4 that divides HEAD_DIM, else 1. */
#if HEAD_DIM % 16 == 0
#define CW 16
#elif HEAD_DIM % 8 == 0
#define CW 8
#elif HEAD_DIM % 4 == 0
#define CW 4
#else
#define CW 1
#endif
#define CVEC (HEAD_DIM / CW)
#if CW == 1
#define floatC float
#define vloadC(i, p) ((p)[(i)])
#define vstoreC(x, i, p) ((p)[(i)] = (x))
#else
#define floatC CAT(float, CW)
#define vloadC CAT(vload, CW)
#define vstoreC CAT(vstore, CW)
#endif
#if KV_HALF
#define kv_t half
#if CW == 1
#define LOAD_V(i, p) vload_half((i), (p))
#else
#define LOAD_V(i, p) CAT(vload_half, CW)((i), (p))
#endif
#elif KV_BF16
#include "bf16.clh"
#define kv_t ushort
#if CW == 1
#define LOAD_V(i, p) bf16_load((i), (p))
#else
#define LOAD_V(i, p) CAT(bf16_vload, CW)((i), (p))
#endif
#else
#define kv_t float
#define LOAD_V(i, p) vloadC((i), (p))
#endif

/* Register tiles of the sums: HB target heads by JB column vectors. */
#define HB 4
#define JB 4
#define TILE_FN static inline __attribute__((always_inline))

/* Transposes the 16 x 16 floats of x (x[r].s[c] <-> x[c].s[r]) by exchanging one bit of the row
 * and column indices per stage: shuffles of lane halves, quarters, pairs and single lanes. */
TILE_FN void transpose16(float16 x[16])
{
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const float16 a = x[r], b = x[r + 8];
        x[r] = (float16)(a.lo, b.lo);
        x[r + 8] = (float16)(a.hi, b.hi);
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) {
        if (r & 4) continue;
        const float16 a = x[r], b = x[r + 4];
        x[r] = (float16)(a.s0123, b.s0123, a.s89ab, b.s89ab);
        x[r + 4] = (float16)(a.s4567, b.s4567, a.scdef, b.scdef);
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) {
        if (r & 2) continue;
        const float16 a = x[r], b = x[r + 2];
        x[r] = (float16)(a.s01, b.s01, a.s45, b.s45, a.s89, b.s89, a.scd, b.scd);
        x[r + 2] = (float16)(a.s23, b.s23, a.s67, b.s67, a.sab, b.sab, a.sef, b.sef);
    }
#pragma unroll
    for (int r = 0; r < 16; r += 2) {
        const float16 a = x[r], b = x[r + 1];
        x[r] = (float16)(a.s0, b.s0, a.s2, b.s2, a.s4, b.s4, a.s6, b.s6, a.s8, b.s8, a.sa, b.sa, a.sc, b.sc, a.se, b.se);
        x[r + 1] = (float16)(a.s1, b.s1, a.s3, b.s3, a.s5, b.s5, a.s7, b.s7, a.s9, b.s9, a.sb, b.sb, a.sd, b.sd, a.sf, b.sf);
    }
}

/* x[j] = columns c0 + j of the 16 tokens' stored rows at sc, across lanes; next: request the
 * same columns of the next block. */
TILE_FN void load_columns(const __global float *sc, int c0, float16 x[16], int next)
{
#pragma unroll
    for (int t = 0; t < 16; ++t) {
        x[t] = vload16(0, sc + t * STORED + c0);
#if DEC_PREFETCH
        if (next) __builtin_prefetch((const __global char *)(sc + (FOLD_TOKENS + t) * STORED + c0), 0, 3);
#else
        (void)next;
#endif
    }
    transpose16(x);
}

/* sums[h][c] += sum over the block's tokens t0 .. t1 and cached heads m of
 * w[h][m][t] · V[t][m][c], for heads h0 .. h0+hw-1 and column vectors c0 .. c0+cw-1 (hw, cw
 * constants at each call). */
TILE_FN void values_tile(__global const kv_t *vc, size_t seq, int slots, int nb, int t0, int t1, const float *w,
                         float *sums, int h0, int hw, int c0, int cw, int ahead)
{
    floatC a[HB][JB];
#pragma unroll
    for (int hh = 0; hh < HB; ++hh)
#pragma unroll
        for (int jj = 0; jj < JB; ++jj)
            if (hh < hw && jj < cw) a[hh][jj] = vloadC((h0 + hh) * CVEC + c0 + jj, sums);
    for (int t = t0; t <= t1; ++t) {
        const int slot = KV_RING ? (nb + t) % slots : nb + t;
        const __global kv_t *vt = vc + (seq + slot) * TOKEN_ELEMS;
#if DEC_PREFETCH
        /* The token FOLD_AHEAD places on, while this one's values are summed. */
        if (t + FOLD_AHEAD <= ahead) {
            const int next = KV_RING ? (nb + FOLD_AHEAD + t) % slots : nb + FOLD_AHEAD + t;
            const __global char *nv = (const __global char *)(vc + (seq + next) * TOKEN_ELEMS);
            for (int i = 0; i < (int)(TOKEN_ELEMS * sizeof(kv_t)); i += 64) __builtin_prefetch(nv + i, 0, 2);
        }
#else
        (void)ahead;
#endif
#pragma unroll 2
        for (int m = 0; m < DEC_H; ++m) {
            floatC v[JB];
#pragma unroll
            for (int jj = 0; jj < JB; ++jj)
                if (jj < cw) v[jj] = LOAD_V(m * CVEC + c0 + jj, vt);
#pragma unroll
            for (int hh = 0; hh < HB; ++hh) {
                if (hh >= hw) continue;
                const floatC x = (floatC)(w[((h0 + hh) * DEC_H + m) * FOLD_TOKENS + t]);
#pragma unroll
                for (int jj = 0; jj < JB; ++jj)
                    if (jj < cw) a[hh][jj] = fma(x, v[jj], a[hh][jj]);
            }
        }
    }
#pragma unroll
    for (int hh = 0; hh < HB; ++hh)
#pragma unroll
        for (int jj = 0; jj < JB; ++jj)
            if (hh < hw && jj < cw) vstoreC(a[hh][jj], (h0 + hh) * CVEC + c0 + jj, sums);
}

/* ahead: the last token to prefetch, from nb (with the first tile only). */
TILE_FN void values_heads(__global const kv_t *vc, size_t seq, int slots, int nb, int t0, int t1, const float *w,
                          float *sums, int h0, int hw, int ahead)
{
    int c0 = 0;
    for (; c0 + JB <= CVEC; c0 += JB) {
        values_tile(vc, seq, slots, nb, t0, t1, w, sums, h0, hw, c0, JB, c0 == 0 && h0 == 0 ? ahead : 0);
    }
    if (CVEC % JB) values_tile(vc, seq, slots, nb, t0, t1, w, sums, h0, hw, c0, CVEC % JB, c0 == 0 && h0 == 0 ? ahead : 0);
}

/* Work-item (split s, sequence b): the share of split s in Y[b] [H][HEAD_DIM], written to
 * share[b][s] from share_off. part: the first pass's softmax states (cl/decode_combine.clh's layout, rows the
 * step's P) and, from fold_off, [B][fold_blocks·FOLD_TOKENS][STORED]: per token the exponentials
 * of its scores against the first pass's running maxima, by key position p' and query row
 * h·P + p, then those maxima by row (tokens by their place past the first one a ring holds); alpha_v [H][H][P] and r [H][H][P] as the layer's; the other arguments as the first
 * pass's. */
__kernel void attention_decode_fold_values(__global const float *part, ulong fold_off, int fold_blocks,
                                           __global float *share, ulong share_off, __global const kv_t *vc,
                                           __global const float *alpha_v, ulong av_off, __global const float *r_mix,
                                           ulong r_off, __global const int *step, int slots, int splits,
                                           int split_tokens, int mask, int window IHA_PROBE_PARAMS)
{
    const int s = get_global_id(0), b = get_global_id(1);
    if (s >= splits) return;
    const int P = DEC_P;
    const int n0 = step[2 * b], count = step[2 * b + 1], end = n0 + count, T = end * P;
    float sums[TOKEN_ELEMS];
    for (int i = 0; i < TOKEN_ELEMS; ++i) sums[i] = 0.0f;

    /* Per query row i = h·P + p: its visible virtual keys and the merged softmax state (the
     * reference point top and the inverse of the sum); a sum of 0 or NaN makes the row NaN, as in
     * cl/decode_combine.cl. */
    int lo[HP], hi[HP];
    float top[HP], inv[HP];
    int first = end, last = -1;
    for (int i = 0; i < HP; ++i) {
        lo[i] = T;
        hi[i] = -1;
        top[i] = 0.0f;
        inv[i] = 0.0f;
        if (count <= 0) continue;
        const int2 v = visible_range(n0 * P + i % P, T, P, mask, window);
        lo[i] = v.x;
        hi[i] = v.y;
        first = min(first, v.x / P);
        last = max(last, v.y / P);
        const __global float *st = part + (size_t)(b * HP + i) * splits * PART_STRIDE + HEAD_DIM;
        float mx = -INFINITY;
        for (int j = 0; j < splits; ++j) mx = fmax(mx, st[(size_t)j * PART_STRIDE]);
        float total = 0.0f;
        for (int j = 0; j < splits; ++j) {
            const float ms = st[(size_t)j * PART_STRIDE];
            total += (ms == -INFINITY ? 0.0f : exp2(ms - mx)) * st[(size_t)j * PART_STRIDE + 1];
        }
        top[i] = mx;
        inv[i] = 1.0f / total;
    }
    /* The virtual keys every row sees. */
    int all_lo = 0, all_hi = T - 1;
    for (int i = 0; i < HP; ++i) {
        all_lo = max(all_lo, lo[i]);
        all_hi = min(all_hi, hi[i]);
    }
    const int held = KV_RING ? max(0, end - slots) : 0;
    first = max(first, held + s * split_tokens);
    last = min(last, min(end - 1, held + (s + 1) * split_tokens - 1));

    /* R[h'][h][p] at h'·H·P + i, alpha_V[m][h][p'] at m·H·P + h·P + p'. */
    float rr[DEC_H * HP], av[DEC_H * HP];
    for (int i = 0; i < DEC_H * HP; ++i) {
        rr[i] = r_mix[r_off + i];
        av[i] = alpha_v[av_off + i];
    }
    const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const size_t seq = (size_t)b * slots;
    const int b0 = last >= first ? (first - held) / FOLD_TOKENS : 0;
    const int blocks = last >= first ? (last - held) / FOLD_TOKENS + 1 - b0 : 0;
    int k = 0;
    for (; k < blocks + IHA_PROBE_PAST; ++k) {
        IHA_PROBE_SKIP_PAST(k >= blocks);
        const int blk = b0 + k, nb = held + blk * FOLD_TOKENS;
        const __global float *sc = part + fold_off + ((size_t)b * fold_blocks + blk) * FOLD_TOKENS * STORED;
        const int16 n = (int16)(nb) + lane;
        const int16 on = (n >= (int16)(first)) & (n <= (int16)(last));
        /* Every row sees every key of the block's tokens: no masks. */
        const int inside = nb >= first && nb + FOLD_TOKENS - 1 <= last && nb * P >= all_lo &&
                           (nb + FOLD_TOKENS) * P - 1 <= all_hi;
        /* The probabilities, 0 where masked or outside the split, from the block's stored rows
         * (STORED floats per token) turned to token lanes sixteen columns at a time: first each
         * row's factor 2^(max then - top) / sum (an exponential against a maximum of -inf is 0,
         * unless the row's own maximum is -inf too: NaN, as the merge makes such a row), then
         * the exponentials times their row's factor. */
        float16 f[HP], a[HP * DEC_P];
        for (int c0 = SCORES; c0 < STORED; c0 += 16) {
            float16 x[16];
            load_columns(sc, c0, x, k + 1 < blocks);
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int i = c0 + j - SCORES;
                if (i >= HP) break;
                const int16 unseen = (x[j] == (float16)(-INFINITY)) & (int16)(top[i] != -INFINITY ? -1 : 0);
                f[i] = select(exp2(x[j] - top[i]) * inv[i], (float16)(0.0f), unseen);
            }
        }
        for (int c0 = 0; c0 < SCORES; c0 += 16) {
            float16 x[16];
            load_columns(sc, c0, x, k + 1 < blocks);
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int c = c0 + j, q = c / HP, i = c % HP;
                if (c >= SCORES) break;
                if (inside) {
                    a[i * DEC_P + q] = x[j] * f[i];
                } else {
                    const int16 u = n * P + q;
                    const int16 vis = on & (u >= (int16)(lo[i])) & (u <= (int16)(hi[i]));
                    a[i * DEC_P + q] = select((float16)(0.0f), x[j] * f[i], vis);
                }
            }
        }
        /* w[h'][m][t] = sum over h, p' of alpha_V[m][h][p'] · (sum over p of R[h'][h][p] · a). */
        float w[DEC_H * DEC_H * FOLD_TOKENS];
        for (int ho = 0; ho < DEC_H; ++ho) {
            float16 acc[DEC_H];
#pragma unroll
            for (int m = 0; m < DEC_H; ++m) acc[m] = (float16)(0.0f);
            for (int h = 0; h < DEC_H; ++h) {
                float16 bp[DEC_P];
#pragma unroll
                for (int q = 0; q < DEC_P; ++q) {
                    bp[q] = (float16)(0.0f);
#pragma unroll
                    for (int p = 0; p < DEC_P; ++p) bp[q] = fma((float16)(rr[ho * HP + h * P + p]), a[(h * P + p) * DEC_P + q], bp[q]);
                }
#pragma unroll
                for (int m = 0; m < DEC_H; ++m)
#pragma unroll
                    for (int q = 0; q < DEC_P; ++q) acc[m] = fma((float16)(av[m * HP + h * P + q]), bp[q], acc[m]);
            }
#pragma unroll
            for (int m = 0; m < DEC_H; ++m) vstore16(acc[m], ho * DEC_H + m, w);
        }
        const int t0 = max(first, nb) - nb, t1 = min(last, nb + FOLD_TOKENS - 1) - nb;
        int h0 = 0;
        const int ahead = last - nb;
        for (; h0 + HB <= DEC_H; h0 += HB) values_heads(vc, seq, slots, nb, t0, t1, w, sums, h0, HB, ahead);
        if (DEC_H % HB) values_heads(vc, seq, slots, nb, t0, t1, w, sums, h0, DEC_H % HB, ahead);
    }
    IHA_PROBE_EXPECT(k >= blocks + IHA_PROBE_PAST);
    __global float *out = share + share_off + ((size_t)b * splits + s) * TOKEN_ELEMS;
    for (int i = 0; i < TOKEN_ELEMS; ++i) out[i] = sums[i];
    IHA_PROBE_CHECK();
}

/* y[b][h][c] (the step's Y [B][1][H][HEAD_DIM]) = the sum of the splits' shares; work-item
 * (element, b). */
__kernel void attention_decode_fold_sum(__global const float *share, ulong share_off, __global float *y, ulong y_off,
                                        int splits IHA_PROBE_PARAMS)
{
    const int i = get_global_id(0), b = get_global_id(1);
    if (i >= TOKEN_ELEMS) return;
    const __global float *sh = share + share_off + (size_t)b * splits * TOKEN_ELEMS + i;
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s) acc += sh[(size_t)s * TOKEN_ELEMS];
    y[y_off + (size_t)b * TOKEN_ELEMS + i] = acc;
    IHA_PROBE_CHECK();
}
