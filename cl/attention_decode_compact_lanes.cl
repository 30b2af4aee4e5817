/* Decoding from a compact KV cache, for CPUs (doc/spec.md, "The compact cache"): a work-item's
 * query rows lie across the lanes of its vectors, so nearly every FMA is a vector FMA with one
 * broadcast element, in register tiles. Without rotary a score needs no pseudo-key:
 * q·Kt[n·P + p] = sum over m of alpha_K[m][h][p] · q·K[n][m]. A step of one token goes further:
 * its P pseudo-queries of head h mix its H rows Q[m'] by alpha_Q, so q·K[n][m] = sum over m' of
 * alpha_Q[m'][h][i] · Q[m']·K[n][m], and a cached token costs H·H dots, not H·P·H. With rotary
 * (DEC_ROPE) the cache holds keys rotated by their token's position n·P, so the pseudo-key is
 * R(p) · sum over m of alpha_K[m][h][p] · K'[n][m]: the token's P pseudo-keys of each head are
 * mixed across lanes (head, p) and dotted with the query rows rotated back by p once per step,
 * and no rotation is left per token. alpha_V is folded into the probabilities; the online
 * softmax rescales once per block of tokens. Writes the partial softmax states of
 * cl/decode_combine.clh. */
#include "loop_probe.clh"
#include "masks.clh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef DEC_P
#error "DEC_P must be defined"
#endif
/* The heads H: every score reads all H rows of a token. */
#ifndef DEC_H
#error "DEC_H must be defined"
#endif
/* A work-item's rows: DEC_ROWS consecutive query rows of each of DEC_HEADS target heads. */
#ifndef DEC_ROWS
#define DEC_ROWS 4
#endif
#ifndef DEC_HEADS
#define DEC_HEADS 1
#endif
/* Tokens per block: the softmax's rescaling and the accumulators' loads and stores happen once
 * per block. */
#ifndef DEC_TB
#define DEC_TB 4
#endif
/* Register tiles: DEC_GB lane vectors by DEC_MB of a token's rows (the dots) or by DEC_JB
 * columns (the values), few enough accumulators for 16 vector registers. */
#ifndef DEC_GB
#define DEC_GB 2
#endif
#ifndef DEC_MB
#define DEC_MB 4
#endif
#ifndef DEC_JB
#define DEC_JB 6
#endif
/* 1 (a tile of one step token's P rows, DEC_ROWS = DEC_P): the dots are those of the token's H
 * raw query rows, mixed by alpha_Q afterwards, P times fewer than those of its pseudo-queries. */
#ifndef DEC_RAW_Q
#define DEC_RAW_Q 0
#endif
/* 1: rotary; the keys are cached rotated by their tokens' positions n·P (cl/decode_mix.cl). */
#ifndef DEC_ROPE
#define DEC_ROPE 0
#endif
/* 1: prefetch each next block's K and V (where the host knows the intrinsic compiles). */
#ifndef DEC_PREFETCH
#define DEC_PREFETCH 0
#endif
#if DEC_ROPE && DEC_RAW_Q
#error "DEC_RAW_Q serves steps without rotary"
#endif
/* 1: the first pass of a folded step (cl/attention_decode_fold.cl): the scores only, their
 * exponentials stored for the second pass, and each row's softmax state; no values are read. */
#ifndef DEC_FOLD
#define DEC_FOLD 0
#endif
#include "kv_compact.clh"

/* Lanes per vector: 8 (AVX2's floats) or 16 (AVX-512's). */
#ifndef DEC_LANES
#define DEC_LANES 8
#endif
#if DEC_LANES != 8 && DEC_LANES != 16
#error "DEC_LANES must be 8 or 16"
#endif
#define LANES DEC_LANES
#define LCAT_(a, b) a##b
#define LCAT(a, b) LCAT_(a, b)
#define floatL LCAT(float, LANES)
#define intL LCAT(int, LANES)
#define as_intL LCAT(as_int, LANES)
#define vloadL LCAT(vload, LANES)
#define vstoreL LCAT(vstore, LANES)
#define TILE (DEC_ROWS * DEC_HEADS)
#define QG ((TILE + LANES - 1) / LANES)
#define TOKEN_ELEMS (DEC_H * HEAD_DIM)
/* With rotary: lane vectors of the pseudo-keys, lane hh·P + p holding head h0 + hh's p-th. */
#define KG ((DEC_HEADS * DEC_P + LANES - 1) / LANES)
#define HALF_DIM (HEAD_DIM / 2)
/* The dot rows: the step token's H raw query rows (DEC_RAW_Q) or the lanes' query rows. */
#if DEC_RAW_Q
#define QN ((DEC_H + LANES - 1) / LANES)
#else
#define QN QG
#endif
/* 1: the raw rows fill at most half the lanes, so a lane pair (2r, 2r + 1) holds row r's columns
 * 2i and 2i + 1, and each FMA reads two of a key row's columns: half the FMAs, each dot the sum
 * of its pair. */
#if DEC_RAW_Q && 2 * DEC_H <= LANES && HEAD_DIM % 2 == 0
#define DEC_PAIR 1
#else
#define DEC_PAIR 0
#endif
#if DEC_PAIR
#define QS_RAW(j, r) qs[(j) / 2 * LANES + 2 * (r) + (j) % 2]
#if LANES == 16
#define ulongP ulong8
#else
#define ulongP ulong4
#endif
#define as_floatL LCAT(as_float, LANES)
#else
#define QS_RAW(j, r) qs[(j) * QN * LANES + (r)]
#endif
/* Rows of a token per register tile of the dots: as many accumulators when there are fewer lane
 * vectors than DEC_GB. */
#define DOT_MB (DEC_GB * DEC_MB / (QN < DEC_GB ? QN : DEC_GB))

/* Each block's K and V are widened into private floats first, read in order with vector loads:
 * the dots read a token's rows with a stride, which would meet each line of a cold cache
 * separately, and the inner loops then read floats whatever the storage. */
#if KV_HALF
#define kv_t half
#define LOAD_KV(i, p) LCAT(vload_half, LANES)((i), (p))
#define LOAD_ONE(i, p) vload_half((i), (p))
#elif KV_BF16
#include "bf16.clh"
#define kv_t ushort
#define LOAD_KV(i, p) LCAT(bf16_vload, LANES)((i), (p))
#define LOAD_ONE(i, p) bf16_load((i), (p))
#else
#define kv_t float
#define LOAD_KV(i, p) vloadL((i), (p))
#define LOAD_ONE(i, p) ((p)[(i)])
#endif

#include "decode_combine.clh"

/* Where the scores read keys: a first pass of float keys without rotary reads them in the cache
 * (their next tokens prefetched), other steps in the block's private float copy. */
#if DEC_FOLD && !KV_HALF && !KV_BF16 && !DEC_ROPE
#define KDIRECT 1
#define KSPACE __global
#else
#define KDIRECT 0
#define KSPACE
#endif

/* A token's H rows, in any storage, into private floats. */
static inline void widen_token(const __global kv_t *src, float *dst)
{
    for (int i = 0; i < TOKEN_ELEMS / LANES; ++i) vstoreL(LOAD_KV(i, src), i, dst);
    for (int i = TOKEN_ELEMS / LANES * LANES; i < TOKEN_ELEMS; ++i) dst[i] = LOAD_ONE(i, src);
}

/* The helpers take tile widths and flags that are constants at each call: inlined, their guards
 * fold away and the tiles stay in registers. */
#define TILE_FN static inline __attribute__((always_inline))

#include "decode_compact_scores.clh"

#if DEC_ROPE
#include "decode_compact_rope.clh"
#define SCORES(k, out) rope_scores((k), qv, akk, scale_log2, (out))
#define OVERFLOWED(k, g, p) rope_overflowed((k), qv, akk_s, (g), (p))
#else
#define SCORES(k, out) token_scores((k), qs, aq, ak, scale_log2, (out))
#define OVERFLOWED(k, g, p) overflowed((k), qs, aq, ak, (g), (p))
#endif

#include "decode_compact_values.clh"

/* Work-item (row tile, split, (b, head group)): rows r0 .. r0+DEC_ROWS-1 of heads h0 ..
 * h0+DEC_HEADS-1 of sequence b against the tokens of split s; arguments as
 * attention_decode_compact_f32's (cl/attention_decode_compact.cl), without identity mixing,
 * which that kernel takes; angles: with rotary, the rotary rows of positions 0 .. P-1. */
__kernel void attention_decode_compact_lanes_f32(__global const float *q, ulong q_off, __global const kv_t *kc,
                                                 __global const kv_t *vc, __global const float *alpha_k, ulong ak_off,
                                                 __global const float *alpha_v, ulong av_off,
                                                 __global const float *q_raw, ulong qr_off,
                                                 __global const float *alpha_q, ulong aq_off, int k_step,
                                                 __global const float *angles,
                                                 __global float *part, ulong fold_off, int fold_blocks,
                                                 __global const int *step, int rows, int slots, int splits,
                                                 int split_tokens, int mask, int window,
                                                 float scale_log2 IHA_PROBE_PARAMS)
{
    const int r0 = get_global_id(0) * DEC_ROWS;
    const int s = get_global_id(1);
    const int groups = (DEC_H + DEC_HEADS - 1) / DEC_HEADS;
    const int b = get_global_id(2) / groups, h0 = get_global_id(2) % groups * DEC_HEADS;
    if (r0 >= rows || s >= splits) return;
    const int P = DEC_P;
    const int n0 = step[2 * b], count = step[2 * b + 1], end = n0 + count;
    const int T = end * P, active = count * P;
    alpha_k += ak_off;
    alpha_v += av_off;
    alpha_q += aq_off;

    /* Per lane: its query row (0 where inactive), its visible virtual keys [lo, hi] (empty where
     * inactive) and its head's mixing weights; the tokens the tile reads, [first, last]. */
#if !DEC_ROPE
    float qs[HEAD_DIM * QN * LANES];
#endif
    int lo_s[QG * LANES], hi_s[QG * LANES], valid_s[QG * LANES];
    /* Each lane's alpha_V and, without rotary, alpha_K (with rotary the keys are mixed across the
     * key lanes, by akk). */
#if !DEC_ROPE
    float ak_s[QG * DEC_H * DEC_P * LANES];
#endif
    float av_s[QG * DEC_H * DEC_P * LANES];
#if DEC_RAW_Q
    /* The step token's raw query rows across the lanes, and each lane's row of alpha_Q. */
    float aq_s[QG * DEC_H * LANES];
    const int jt = r0 / P;
    for (int i = 0; i < HEAD_DIM * QN * LANES; ++i) qs[i] = 0.0f;
    for (int r = 0; r < DEC_H; ++r)
        for (int j = 0; j < HEAD_DIM; ++j)
            QS_RAW(j, r) = jt < count ? q_raw[qr_off + (((size_t)b * k_step + jt) * DEC_H + r) * HEAD_DIM + j] : 0.0f;
#endif
    int first = end, last = -1;
    for (int l = 0; l < QG * LANES; ++l) {
        const int h = h0 + l / DEC_ROWS, r = r0 + l % DEC_ROWS, g = l / LANES, lane = l % LANES;
        const int on = l < TILE && h < DEC_H && r < active;
        valid_s[l] = on ? -1 : 0;
        lo_s[l] = T;
        hi_s[l] = -1;
        if (on) {
            const int2 v = visible_range(n0 * P + r, T, P, mask, window);
            lo_s[l] = v.x;
            hi_s[l] = v.y;
            first = min(first, v.x / P);
            last = max(last, v.y / P);
        }
#if !DEC_RAW_Q && !DEC_ROPE
        for (int j = 0; j < HEAD_DIM; ++j)
            qs[(j * QG + g) * LANES + lane] =
                on ? q[q_off + ((size_t)(b * DEC_H + h) * rows + r) * HEAD_DIM + j] : 0.0f;
#elif DEC_RAW_Q
        for (int m = 0; m < DEC_H; ++m)
            aq_s[(g * DEC_H + m) * LANES + lane] =
                l < TILE && h < DEC_H ? alpha_q[((size_t)m * DEC_H + h) * P + r % P] : 0.0f;
#endif
        for (int m = 0; m < DEC_H; ++m)
#pragma unroll
            for (int p = 0; p < P; ++p) {
                const int i = ((g * DEC_H + m) * P + p) * LANES + lane;
                const int known = l < TILE && h < DEC_H;
#if !DEC_ROPE
                ak_s[i] = known ? alpha_k[((size_t)m * DEC_H + h) * P + p] : 0.0f;
#endif
                av_s[i] = known ? alpha_v[((size_t)m * DEC_H + h) * P + p] : 0.0f;
            }
    }
    const int held = KV_RING ? max(0, end - slots) : 0;
    first = max(first, held + s * split_tokens);
    last = min(last, min(end - 1, held + (s + 1) * split_tokens - 1));

#if DEC_ROPE
    /* Per key lane (hh, p): its alpha_K column and, for each row of the tile, its head's query
     * row rotated back by p, R(-p) q (rotate-half with the angles of position p). */
    float qv[DEC_ROWS * HEAD_DIM * KG * LANES], akk_s[KG * DEC_H * LANES];
    for (int lk = 0; lk < KG * LANES; ++lk) {
        const int hh = lk / P, pk = lk % P, h = h0 + hh, gk = lk / LANES, lane = lk % LANES;
        const int known = hh < DEC_HEADS && h < DEC_H;
        for (int m = 0; m < DEC_H; ++m)
            akk_s[(gk * DEC_H + m) * LANES + lane] = known ? alpha_k[((size_t)m * DEC_H + h) * P + pk] : 0.0f;
        const __global float *cs = angles + (size_t)pk * HEAD_DIM, *sn = cs + HALF_DIM;
        for (int r = 0; r < DEC_ROWS; ++r) {
            const int on = known && r0 + r < active;
            const __global float *qr = q + q_off + ((size_t)(b * DEC_H + h) * rows + r0 + r) * HEAD_DIM;
            for (int j = 0; j < HEAD_DIM; ++j) {
                const int i = j % HALF_DIM;
                const float x = !on ? 0.0f
                                : j < HALF_DIM ? qr[i] * cs[i] + qr[i + HALF_DIM] * sn[i]
                                               : qr[j] * cs[i] - qr[i] * sn[i];
                qv[((r * HEAD_DIM + j) * KG + gk) * LANES + lane] = x;
            }
        }
    }
    floatL akk[KG * DEC_H];
    for (int i = 0; i < KG * DEC_H; ++i) akk[i] = vloadL(i, akk_s);
    (void)q_raw;
    (void)qr_off;
    (void)k_step;
#else
    (void)angles;
#endif
#if !DEC_ROPE
    floatL ak[QG * DEC_H * DEC_P];
    for (int i = 0; i < QG * DEC_H * DEC_P; ++i) ak[i] = vloadL(i, ak_s);
#endif
    floatL av[QG * DEC_H * DEC_P];
    for (int i = 0; i < QG * DEC_H * DEC_P; ++i) av[i] = vloadL(i, av_s);
#if DEC_RAW_Q
    floatL aq[QG * DEC_H];
    for (int i = 0; i < QG * DEC_H; ++i) aq[i] = vloadL(i, aq_s);
    (void)q;
    (void)q_off;
#elif !DEC_ROPE
    const floatL *aq = ak; /* unread */
    (void)q_raw;
    (void)qr_off;
    (void)k_step;
#endif
    intL lo[QG], hi[QG], valid[QG];
    floatL mx[QG], sum[QG];
    for (int g = 0; g < QG; ++g) {
        lo[g] = vloadL(g, lo_s);
        hi[g] = vloadL(g, hi_s);
        valid[g] = vloadL(g, valid_s);
        mx[g] = (floatL)(-INFINITY);
        sum[g] = (floatL)(0.0f);
    }
#if DEC_FOLD
    /* What sequence b stores for the second pass, [token][P + 1][h·rows + r]: each score's
     * exponential by key position p', then the maxima they are taken against; tokens by their
     * place past the first one a ring holds (cl/attention_decode_fold.cl). */
    __global float *fold = part + fold_off + (size_t)b * fold_blocks * FOLD_TOKENS * (DEC_P + 1) * DEC_H * rows;
    const int fold_base = KV_RING ? max(0, end - slots) : 0;
#else
    float accs[HEAD_DIM * QG * LANES];
    for (int i = 0; i < HEAD_DIM * QG; ++i) vstoreL((floatL)(0.0f), i, accs);
    (void)fold_off;
    (void)fold_blocks;
#endif

    const int blocks = last >= first ? (last - first + DEC_TB) / DEC_TB : 0;
    int blk = 0;
    for (; blk < blocks + IHA_PROBE_PAST; ++blk) {
        IHA_PROBE_SKIP_PAST(blk >= blocks);
        const int nb = first + blk * DEC_TB, cnt = min(DEC_TB, last + 1 - nb);
#if KDIRECT
#define KROW(t) (kc + ((size_t)b * slots + (KV_RING ? (nb + (t)) % slots : nb + (t))) * TOKEN_ELEMS)
#else
        float kf[DEC_TB * TOKEN_ELEMS];
#define KROW(t) (kf + (t) * TOKEN_ELEMS)
#endif
#if !DEC_FOLD
        float vf[DEC_TB * TOKEN_ELEMS];
#endif
        /* The keys' copy (unless read in place) and the values'. */
        const int copied = KDIRECT && DEC_FOLD ? 0 : cnt;
        for (int t = 0; t < copied; ++t) {
            const int slot = KV_RING ? (nb + t) % slots : nb + t;
            const size_t at = ((size_t)b * slots + slot) * TOKEN_ELEMS;
#if !KDIRECT
            widen_token(kc + at, kf + t * TOKEN_ELEMS);
#endif
#if !DEC_FOLD
            widen_token(vc + at, vf + t * TOKEN_ELEMS);
#endif
        }
#if DEC_PREFETCH && DEC_FOLD
        /* A first pass reads keys only, with little to compute per token: the keys FOLD_AHEAD
         * tokens on are requested into the second-level cache, as the hardware's prefetch does
         * not cross pages. */
        for (int t = 0; t < cnt && nb + FOLD_AHEAD + t <= last; ++t) {
            const int slot = KV_RING ? (nb + FOLD_AHEAD + t) % slots : nb + FOLD_AHEAD + t;
            const __global char *kt = (const __global char *)(kc + ((size_t)b * slots + slot) * TOKEN_ELEMS);
            for (int i = 0; i < (int)(TOKEN_ELEMS * sizeof(kv_t)); i += 64) __builtin_prefetch(kt + i, 0, 2);
        }
#elif DEC_PREFETCH
        /* The next block's K and V are requested while this one is computed: a CPU work-item
         * reads its split in order and would otherwise wait for each block from memory. */
        for (int t = 0; t < DEC_TB && nb + DEC_TB + t <= last; ++t) {
            const int slot = KV_RING ? (nb + DEC_TB + t) % slots : nb + DEC_TB + t;
            const size_t at = ((size_t)b * slots + slot) * TOKEN_ELEMS;
            const __global char *kt = (const __global char *)(kc + at), *vt = (const __global char *)(vc + at);
            for (int i = 0; i < (int)(TOKEN_ELEMS * sizeof(kv_t)); i += 64) {
                __builtin_prefetch(kt + i, 0, 3);
                __builtin_prefetch(vt + i, 0, 3);
            }
        }
#endif
        /* The block's masked scores; a visible -inf among them (rare) sends the block through
         * overflowed. */
        floatL sc[DEC_TB][DEC_P][QG];
        intL suspects = (intL)(0);
        for (int t = 0; t < cnt; ++t) {
            SCORES(KROW(t), sc[t]);
#pragma unroll
            for (int p = 0; p < P; ++p) {
                const intL u = (intL)((nb + t) * P + p);
#pragma unroll
                for (int g = 0; g < QG; ++g) {
                    const intL vis = (u >= lo[g]) & (u <= hi[g]);
                    suspects |= vis & (sc[t][p][g] == (floatL)(-INFINITY));
                    sc[t][p][g] = select((floatL)(-INFINITY), sc[t][p][g], vis);
                }
            }
        }
        if (any(suspects))
            for (int t = 0; t < cnt; ++t) {
                floatL raw[DEC_P][QG];
                SCORES(KROW(t), raw);
                for (int p = 0; p < P; ++p) {
                    const intL u = (intL)((nb + t) * P + p);
                    for (int g = 0; g < QG; ++g) {
                        const intL vis = (u >= lo[g]) & (u <= hi[g]);
                        const intL suspect = vis & (raw[p][g] == (floatL)(-INFINITY));
                        if (any(suspect))
                            sc[t][p][g] = select(sc[t][p][g], (floatL)(NAN),
                                                 suspect & OVERFLOWED(KROW(t), g, p));
                    }
                }
            }
        floatL top[QG];
#pragma unroll
        for (int g = 0; g < QG; ++g) {
            top[g] = (floatL)(-INFINITY);
            for (int t = 0; t < cnt; ++t)
#pragma unroll
                for (int p = 0; p < P; ++p) top[g] = fmax(top[g], sc[t][p][g]);
        }
        /* A new maximum rescales what a lane holds; -inf scores (masked ones too) add nothing. */
        for (int g = 0; g < QG; ++g) {
            const intL up = top[g] > mx[g];
            if (!any(up)) continue;
            const floatL f = select((floatL)(1.0f), exp2(mx[g] - top[g]), up);
            sum[g] *= f;
#if !DEC_FOLD
            for (int j = 0; j < HEAD_DIM; ++j) vstoreL(vloadL(j * QG + g, accs) * f, j * QG + g, accs);
#endif
            mx[g] = select(mx[g], top[g], up);
        }
#if DEC_FOLD
        /* The sums, and for the second pass each token's exponentials and the maxima they are
         * taken against (the second pass masks them again). */
        for (int t = 0; t < cnt; ++t) {
            __global float *at = fold + (size_t)(nb + t - fold_base) * (DEC_P + 1) * DEC_H * rows;
#pragma unroll
            for (int p = 0; p <= P; ++p) {
                floatL e[QG];
#pragma unroll
                for (int g = 0; g < QG; ++g) {
                    const floatL x = p < P ? sc[t][p][g] : mx[g];
                    e[g] = p < P ? select(exp2(x - mx[g]), (floatL)(0.0f), x == (floatL)(-INFINITY)) : x;
                    if (p < P) sum[g] += e[g];
                }
                /* A tile of whole heads' rows is one run of the row index h·rows + r. */
                const int whole = DEC_ROWS == DEC_P ? TILE % LANES == 0 : 0;
                if (whole && h0 + DEC_HEADS <= DEC_H) {
#pragma unroll
                    for (int g = 0; g < QG; ++g) {
                        __global float *to = at + p * DEC_H * rows + h0 * rows + g * LANES;
#if DEC_PREFETCH && defined(__clang__)
                        /* Rows the second pass reads from memory: stored past the caches,
                         * without first reading the lines they overwrite. */
                        if (((size_t)to & (sizeof(floatL) - 1)) == 0) {
                            __builtin_nontemporal_store(e[g], (__global floatL *)to);
                            continue;
                        }
#endif
                        vstoreL(e[g], 0, to);
                    }
                } else {
                    float row_s[QG * LANES];
#pragma unroll
                    for (int g = 0; g < QG; ++g) vstoreL(e[g], g, row_s);
                    for (int l = 0; l < TILE; ++l) {
                        const int h = h0 + l / DEC_ROWS, r = r0 + l % DEC_ROWS;
                        if (h < DEC_H && r < rows) at[p * DEC_H * rows + h * rows + r] = row_s[l];
                    }
                }
            }
        }
#else
        /* The probabilities, folded with alpha_V into one weight per (token, row m, lane). */
        floatL w[DEC_TB * DEC_H * QG];
        intL seen[DEC_TB * QG];
        intL unseen = (intL)(0);
        for (int t = 0; t < cnt; ++t)
#pragma unroll
            for (int g = 0; g < QG; ++g) {
                floatL pr[DEC_P];
                intL any_seen = (intL)(0);
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    const floatL x = sc[t][p][g];
                    pr[p] = select(exp2(x - mx[g]), (floatL)(0.0f), x == (floatL)(-INFINITY));
                    sum[g] += pr[p];
                    any_seen |= pr[p] != (floatL)(0.0f);
                }
                seen[t * QG + g] = any_seen;
                unseen |= valid[g] & ~any_seen;
#pragma unroll
                for (int m = 0; m < DEC_H; ++m) {
                    floatL x = (floatL)(0.0f);
#pragma unroll
                    for (int p = 0; p < P; ++p) x = fma(pr[p], av[(g * DEC_H + m) * DEC_P + p], x);
                    w[(t * DEC_H + m) * QG + g] = x;
                }
            }
        add_values(vf, cnt, w, seen, accs, any(unseen) && !values_finite(vf, cnt));
#endif
    }
    IHA_PROBE_EXPECT(blk >= blocks + IHA_PROBE_PAST);

    /* Inactive rows (past the step's rows of a shorter sequence) hold nothing, whatever the
     * values their zero weights met. */
    float mx_s[QG * LANES], sum_s[QG * LANES];
    for (int g = 0; g < QG; ++g) {
        vstoreL(mx[g], g, mx_s);
        vstoreL(sum[g], g, sum_s);
    }
    for (int l = 0; l < TILE; ++l) {
        const int h = h0 + l / DEC_ROWS, r = r0 + l % DEC_ROWS, g = l / LANES, lane = l % LANES;
        if (h >= DEC_H || r >= rows) continue;
        __global float *out = part + (((size_t)(b * DEC_H + h) * rows + r) * splits + s) * PART_STRIDE;
        const int on = valid_s[l] != 0;
#if DEC_FOLD
        (void)on;
        (void)g;
        (void)lane;
#else
        for (int c = 0; c < HEAD_DIM; ++c) out[c] = on ? accs[(c * QG + g) * LANES + lane] : 0.0f;
#endif
        out[HEAD_DIM] = mx_s[l];
        out[HEAD_DIM + 1] = sum_s[l];
    }
    IHA_PROBE_CHECK();
}
