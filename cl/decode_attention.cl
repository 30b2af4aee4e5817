/* Attention for a decoding step: few query rows against a long cache. The keys of each (b, h)
 * are split into DEC_SPLIT-key ranges handled by separate work-items, each keeping a partial
 * softmax (max, sum, unnormalised output); a second kernel merges the partials. A work-item owns
 * up to DEC_ROWS query rows, so each cached key is read once for all of them (a generated
 * token's P pseudo-queries share a head's keys). Keys are in rows [T_max][HEAD_DIM] in the cache's
 * storage type; arithmetic is float. The masks are the intervals of attention.cl, evaluated
 * with the sequence's current length. Written for CPUs and correct everywhere. */

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined by the host"
#endif
/* Query rows per work-item. */
#ifndef DEC_ROWS
#define DEC_ROWS 4
#endif
/* Vector width over the head dimension: 4, 8 or 16. */
#ifndef DEC_VD
#define DEC_VD 16
#endif
/* 1: the cache holds half (vload_half). */
#ifndef CACHE_HALF
#define CACHE_HALF 0
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatV CAT(float, DEC_VD)
#define VCHUNKS ((HEAD_DIM + DEC_VD - 1) / DEC_VD)
#if CACHE_HALF
#define cache_t half
#define LOAD_FULL(p, c) CAT(vload_half, DEC_VD)(0, (p) + (c))
#define LOAD_ONE(p, i) vload_half((i), (p))
#else
#define cache_t float
#define LOAD_FULL(p, c) CAT(vload, DEC_VD)(0, (p) + (c))
#define LOAD_ONE(p, i) ((p)[(i)])
#endif

static inline floatV load_cache_chunk(const __global cache_t *row, int cv)
{
    const int c = cv * DEC_VD;
    if (c + DEC_VD <= HEAD_DIM) return LOAD_FULL(row, c);
    float tmp[DEC_VD];
    for (int i = 0; i < DEC_VD; ++i) tmp[i] = c + i < HEAD_DIM ? LOAD_ONE(row, c + i) : 0.0f;
    return CAT(vload, DEC_VD)(0, tmp);
}

static inline float hsum_v(floatV v)
{
    float tmp[DEC_VD];
    CAT(vstore, DEC_VD)(v, 0, tmp);
    float s = 0.0f;
    for (int i = 0; i < DEC_VD; ++i) s += tmp[i];
    return s;
}

#define MASK_CAUSAL 0
#define MASK_TOKEN_CAUSAL 1

/* Visible keys [lo, hi] of virtual query t in a sequence of T virtual tokens (attention.cl). */
static inline int2 visible_range(int t, int T, int P, int mask, int window)
{
    const int n = t / P;
    int lo, hi;
    if (mask == MASK_CAUSAL) {
        hi = t;
        lo = window > 0 ? max(0, t - window * P + 1) : 0;
    } else if (mask == MASK_TOKEN_CAUSAL) {
        hi = min(T - 1, (n + 1) * P - 1);
        lo = window > 0 ? max(0, n - window + 1) * P : 0;
    } else {
        hi = window > 0 ? min(T - 1, (n + window) * P - 1) : T - 1;
        lo = window > 0 ? max(0, n - window + 1) * P : 0;
    }
    return (int2)(lo, hi);
}

/* At most this many splits per row (the combine kernel keeps one weight per split). */
#define DEC_MAX_SPLITS 64

/* Partial results, per (bh, query row, split): HEAD_DIM unnormalised outputs, then max (base 2)
 * and sum. */
#define PART_STRIDE (HEAD_DIM + 2)

__kernel void decode_attention_partial_f32(__global const float *q, ulong q_off, /* [B*H][rows][HEAD_DIM] */
                                           __global const cache_t *kc, __global const cache_t *vc,
                                           __global float *part,         /* [B*H][rows][splits][PART_STRIDE] */
                                           __global const int *step,     /* per sequence: n0, count */
                                           int rows, int H, int P, int t_max, int splits, int split_keys, int mask,
                                           int window, float scale_log2) /* score scale * log2(e) */
{
    const int r0 = get_global_id(0) * DEC_ROWS;
    const int s = get_global_id(1);
    const int bh = get_global_id(2);
    if (r0 >= rows || s >= splits) return;
    const int b = bh / H;
    const int n0 = step[2 * b], count = step[2 * b + 1];
    const int T = (n0 + count) * P; /* the sequence's virtual length after this step */
    const int active = count * P;
    const int split_lo = s * split_keys, split_hi = min(T, (s + 1) * split_keys) - 1;

    floatV qv[DEC_ROWS][VCHUNKS], acc[DEC_ROWS][VCHUNKS];
    float m[DEC_ROWS], l[DEC_ROWS];
    int lo[DEC_ROWS], hi[DEC_ROWS];
    int k_lo = split_hi + 1, k_hi = split_lo - 1;
    for (int r = 0; r < DEC_ROWS; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        lo[r] = 1;
        hi[r] = 0; /* empty unless the row is active */
        const int row = min(r0 + r, rows - 1);
        const __global float *qrow = q + q_off + ((size_t)bh * rows + row) * HEAD_DIM;
        for (int cv = 0; cv < VCHUNKS; ++cv) {
            acc[r][cv] = (floatV)(0.0f);
            const int c = cv * DEC_VD;
            float tmp[DEC_VD];
            for (int i = 0; i < DEC_VD; ++i) tmp[i] = c + i < HEAD_DIM ? qrow[c + i] * scale_log2 : 0.0f;
            qv[r][cv] = CAT(vload, DEC_VD)(0, tmp);
        }
        if (r0 + r < active) {
            const int2 range = visible_range(n0 * P + r0 + r, T, P, mask, window);
            lo[r] = max(range.x, split_lo);
            hi[r] = min(range.y, split_hi);
            if (lo[r] <= hi[r]) {
                k_lo = min(k_lo, lo[r]);
                k_hi = max(k_hi, hi[r]);
            }
        }
    }

    const __global cache_t *kb = kc + (size_t)bh * t_max * HEAD_DIM;
    const __global cache_t *vb = vc + (size_t)bh * t_max * HEAD_DIM;
    for (int u = k_lo; u <= k_hi; ++u) {
        floatV kv[VCHUNKS];
        for (int cv = 0; cv < VCHUNKS; ++cv) kv[cv] = load_cache_chunk(kb + (size_t)u * HEAD_DIM, cv);
        float sc[DEC_ROWS];
        for (int r = 0; r < DEC_ROWS; ++r) {
            floatV dot = qv[r][0] * kv[0];
            for (int cv = 1; cv < VCHUNKS; ++cv) dot = fma(qv[r][cv], kv[cv], dot);
            sc[r] = hsum_v(dot);
        }
        for (int cv = 0; cv < VCHUNKS; ++cv) {
            const floatV vv = load_cache_chunk(vb + (size_t)u * HEAD_DIM, cv);
            for (int r = 0; r < DEC_ROWS; ++r) {
                if (u < lo[r] || u > hi[r]) continue;
                if (cv == 0 && sc[r] > m[r]) {
                    /* A new maximum rescales what was summed so far; exp2(-inf) = 0 at the start. */
                    const float corr = exp2(m[r] - sc[r]);
                    m[r] = sc[r];
                    l[r] *= corr;
                    for (int c2 = 0; c2 < VCHUNKS; ++c2) acc[r][c2] *= corr;
                }
                const float p = exp2(sc[r] - m[r]);
                if (cv == 0) l[r] += p;
                acc[r][cv] = fma((floatV)(p), vv, acc[r][cv]);
            }
        }
    }

    for (int r = 0; r < DEC_ROWS && r0 + r < rows; ++r) {
        __global float *out = part + (((size_t)bh * rows + r0 + r) * splits + s) * PART_STRIDE;
        for (int cv = 0; cv < VCHUNKS; ++cv) {
            float tmp[DEC_VD];
            CAT(vstore, DEC_VD)(acc[r][cv], 0, tmp);
            for (int i = 0; i < DEC_VD && cv * DEC_VD + i < HEAD_DIM; ++i) out[cv * DEC_VD + i] = tmp[i];
        }
        out[HEAD_DIM] = m[r];
        out[HEAD_DIM + 1] = l[r];
    }
}

/* Merges the splits of each query row into its output; inactive rows (past the sequence's new
 * tokens) are written as 0. */
__kernel void decode_attention_combine_f32(__global const float *part, __global float *o, ulong o_off,
                                           __global const int *step, int rows, int H, int P, int splits)
{
    const int r = get_global_id(0);
    const int bh = get_global_id(1);
    if (r >= rows) return;
    const int b = bh / H;
    const int active = step[2 * b + 1] * P;
    const __global float *pr = part + ((size_t)bh * rows + r) * splits * PART_STRIDE;
    __global float *out = o + o_off + ((size_t)bh * rows + r) * HEAD_DIM;
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmax(mx, pr[(size_t)s * PART_STRIDE + HEAD_DIM]);
    float w[DEC_MAX_SPLITS];
    float total = 0.0f;
    for (int s = 0; s < splits; ++s) {
        const float ms = pr[(size_t)s * PART_STRIDE + HEAD_DIM];
        w[s] = ms == -INFINITY ? 0.0f : exp2(ms - mx);
        total += w[s] * pr[(size_t)s * PART_STRIDE + HEAD_DIM + 1];
    }
    const float inv = (r < active && total > 0.0f) ? 1.0f / total : 0.0f;
    for (int c = 0; c < HEAD_DIM; ++c) {
        float acc = 0.0f;
        for (int s = 0; s < splits; ++s) acc = fma(w[s], pr[(size_t)s * PART_STRIDE + c], acc);
        out[c] = acc * inv;
    }
}
