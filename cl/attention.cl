/* Flash-style attention forward over the interleaved virtual sequence, one (b, h) per
 * global row, written like a CPU GEMM micro-kernel:
 *  - each work-item owns ATT_TILES register tiles of ATT_ROWS query rows and walks key blocks of
 *    ATT_KB keys, packed [B*H][ceil(T/KB)][HEAD_DIM][KB] so that one vector load brings component c of
 *    KB keys and the score tile grows by HEAD_DIM broadcast-FMAs (no horizontal sums);
 *  - the softmax is online (a reference maximum and a sum per row, see tile_scores), in base 2
 *    with the scale and log2(e) folded into the queries, so no T x T matrix exists and extra
 *    memory is O(T*d);
 *  - per key block, every tile's scores and softmax come first, then P.V chunk by chunk over
 *    the head dimension with the tiles innermost, so each chunk of value rows is read from L2
 *    once per work-item, not once per tile;
 *  - every mask is an interval [lo(t), hi(t)] of visible keys per row, so key blocks outside
 *    the tile's union of intervals are never visited and fully visible blocks skip the mask;
 *  - P.V accumulates into ATT_VD-wide vectors over the head dimension.
 * HEAD_DIM is a compile-time constant so loops over it have known trip counts, and the small
 * loops over rows, keys and chunks are unrolled so the tiles live in registers, not on the stack
 * (where a tile spills to the stack, every FMA waits on a load).
 * Written for CPUs (PoCL vectorises explicit floatN inside a work-item); it is correct on
 * GPUs, where a variant staging tiles in local memory would be faster. */
#include "loop_probe.clh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined by the host"
#endif
/* Query rows of one register tile. */
#ifndef ATT_ROWS
#define ATT_ROWS 4
#endif
/* Register tiles per work-item. The tiles take turns on each key block while it is in L1, so
 * keys and values stream from memory once per ATT_ROWS * ATT_TILES query rows. */
#ifndef ATT_TILES
#define ATT_TILES 4
#endif
/* Keys per block: the width of the score vectors, 4, 8 or 16. The host packs keys to match. */
#ifndef ATT_KB
#define ATT_KB 16
#endif
/* Vector width over the head dimension in P.V: 4, 8 or 16. */
#ifndef ATT_VD
#define ATT_VD 16
#endif

/* 1: each chunk pass of P.V also asks the cache for the same chunk of the next key block's
 * value rows (__builtin_prefetch, a hint that never faults), so the next block's P.V finds
 * them in L1 instead of waiting on L2/L3 for each chunk's first touch; spread over the chunk
 * passes, the hints do not queue up behind each other as one burst per block would (both
 * help at d = 128; doc/performance.md). Only clang-based compilers
 * know the builtin; elsewhere it is a no-op. */
#ifndef ATT_PREFETCH
#define ATT_PREFETCH 0
#endif

/* 1: exponentials of the score vectors through exp2_bounded below (a degree-6 polynomial,
 * relative error 1e-7); 0: the built-in exp2, which handles every input and costs more. */
#ifndef ATT_FAST_EXP
#define ATT_FAST_EXP 1
#endif

/* 1: the partial-attention kernel of cl/attention_partial_tiles.cl instead of attention_fwd_f32. */
#ifndef ATT_PARTIAL
#define ATT_PARTIAL 0
#endif

/* 1: keys and values are stored as half (the decoding cache's IHA_STORAGE_F16), read with
 * vload_half, which is core OpenCL and needs no cl_khr_fp16. Arithmetic stays float. */
#ifndef KV_HALF
#define KV_HALF 0
#endif
/* 1: keys and values are stored as bfloat16 (IHA_STORAGE_BF16), read with bf16.clh's shifts. */
#ifndef KV_BF16
#define KV_BF16 0
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatK CAT(float, ATT_KB)
#define intK CAT(int, ATT_KB)
#define floatV CAT(float, ATT_VD)
#define vloadK CAT(vload, ATT_KB)
#define vstoreK CAT(vstore, ATT_KB)
#define vloadV CAT(vload, ATT_VD)
#define vstoreV CAT(vstore, ATT_VD)
#define convert_intK CAT(convert_int, ATT_KB)
#define as_intK CAT(as_int, ATT_KB)
#define as_floatK CAT(as_float, ATT_KB)
#define VCHUNKS ((HEAD_DIM + ATT_VD - 1) / ATT_VD)
#if KV_HALF
#define kv_t half
#define LOAD_KEYS(p) CAT(vload_half, ATT_KB)(0, (p))
#define LOAD_V(p) CAT(vload_half, ATT_VD)(0, (p))
#define LOAD_ONE(p, i) vload_half((i), (p))
#define LOAD8(p) vload_half8(0, (p))
#define LOAD4(p) vload_half4(0, (p))
#elif KV_BF16
#include "bf16.clh"
#define kv_t ushort
#define LOAD_KEYS(p) CAT(bf16_vload, ATT_KB)(0, (p))
#define LOAD_V(p) CAT(bf16_vload, ATT_VD)(0, (p))
#define LOAD_ONE(p, i) bf16_load((i), (p))
#define LOAD8(p) bf16_vload8(0, (p))
#define LOAD4(p) bf16_vload4(0, (p))
#else
#define kv_t float
#define LOAD_KEYS(p) vloadK(0, (p))
#define LOAD_V(p) vloadV(0, (p))
#define LOAD_ONE(p, i) ((p)[(i)])
#define LOAD8(p) vload8(0, (p))
#define LOAD4(p) vload4(0, (p))
#endif

#if ATT_KB == 4
#define KEY_IOTA ((int4)(0, 1, 2, 3))
#elif ATT_KB == 8
#define KEY_IOTA ((int8)(0, 1, 2, 3, 4, 5, 6, 7))
#elif ATT_KB == 16
#define KEY_IOTA ((int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))
#else
#error "ATT_KB must be 4, 8 or 16"
#endif

/* Horizontal max and sum of a score vector by halving: log2(KB) vector operations instead of
 * KB scalar ones. The ternary form maps to one vmaxps; fmax would add NaN handling, which the
 * maximum does not need: it only moves the reference point, and a NaN score reaches the row's
 * sum and output through its exponential (exp2_bounded keeps NaN) whatever the maximum is. */
static inline float hmax(floatK v)
{
#if ATT_KB == 16
    const float8 v8 = v.lo > v.hi ? v.lo : v.hi;
    const float4 v4 = v8.lo > v8.hi ? v8.lo : v8.hi;
#elif ATT_KB == 8
    const float4 v4 = v.lo > v.hi ? v.lo : v.hi;
#else
    const float4 v4 = v;
#endif
    const float2 v2 = v4.lo > v4.hi ? v4.lo : v4.hi;
    return v2.x > v2.y ? v2.x : v2.y;
}

/* The smallest lane, as hmax. */
static inline float hmin(floatK v)
{
#if ATT_KB == 16
    const float8 v8 = v.lo < v.hi ? v.lo : v.hi;
    const float4 v4 = v8.lo < v8.hi ? v8.lo : v8.hi;
#elif ATT_KB == 8
    const float4 v4 = v.lo < v.hi ? v.lo : v.hi;
#else
    const float4 v4 = v;
#endif
    const float2 v2 = v4.lo < v4.hi ? v4.lo : v4.hi;
    return v2.x < v2.y ? v2.x : v2.y;
}

static inline float hsum(floatK v)
{
#if ATT_KB == 16
    const float8 v8 = v.lo + v.hi;
    const float4 v4 = v8.lo + v8.hi;
#elif ATT_KB == 8
    const float4 v4 = v.lo + v.hi;
#else
    const float4 v4 = v;
#endif
    const float2 v2 = v4.lo + v4.hi;
    return v2.x + v2.y;
}

/* Scores exceed the exponentials' reference point by at most this (base 2), so probabilities
 * stay below 2^MAX_SLACK before normalisation. */
#define MAX_SLACK 8.0f

/* exp2_bounded(floatK x): 2^x for x <= MAX_SLACK (scores minus their reference point), -inf
 * included; see the header. */
#include "exp2_bounded.clh"
IHA_DEFINE_EXP2_BOUNDED(exp2_bounded, floatK, intK)

#if ATT_FAST_EXP
#define EXP2_SCORES exp2_bounded
#else
#define EXP2_SCORES exp2
#endif

/* MASK_*, visible_keys(t, T, P, mask, window, seq) -> [lo, hi] and the packed sequences' arguments. */
#include "masks.clh"

/* Elements in the last chunk of a row when ATT_VD does not divide HEAD_DIM (0 when it does). */
#define VTAIL (HEAD_DIM % ATT_VD)

/* The last chunk of a value row whose width ATT_VD does not divide: its VTAIL elements, zeros
 * beyond. Whole vector loads for the tails of head widths that are multiples of 4. */
static inline floatV load_tail(const __global kv_t *row)
{
    const __global kv_t *t = row + (HEAD_DIM - VTAIL);
#if ATT_VD == 16 && VTAIL == 8
    return (floatV)(LOAD8(t), (float8)(0.0f));
#elif ATT_VD == 16 && VTAIL == 4
    return (floatV)(LOAD4(t), (float4)(0.0f), (float8)(0.0f));
#elif ATT_VD == 16 && VTAIL == 12
    return (floatV)(LOAD8(t), LOAD4(t + 8), (float4)(0.0f));
#elif ATT_VD == 8 && VTAIL == 4
    return (floatV)(LOAD4(t), (float4)(0.0f));
#else
    float tmp[ATT_VD];
    #pragma unroll
    for (int i = 0; i < ATT_VD; ++i) tmp[i] = i < VTAIL ? LOAD_ONE(t, i) : 0.0f;
    return vloadV(0, tmp);
#endif
}

static inline void store_chunk(__global float *row, int cv, floatV x)
{
    const int c = cv * ATT_VD;
    if (c + ATT_VD <= HEAD_DIM) {
        vstoreV(x, 0, row + c);
        return;
    }
    float tmp[ATT_VD];
    vstoreV(x, 0, tmp);
    for (int i = 0; c + i < HEAD_DIM; ++i) row[c + i] = tmp[i];
}

/* The natural log-sum-exp of a row from its reference point m (base 2) and sum l: NaN, not
 * -inf, when no exponential was positive (l = 0, every visible score -inf) or one was NaN, so
 * that the backward pass carries the row's NaN as it does in float64. */
static inline float row_lse(float m, float l) { return l > 0.0f ? (m + log2(l)) * M_LN2_F : NAN; }

/* Running state of one register tile: scaled queries, visible ranges, softmax state, output. */
typedef struct tile_state {
    float q[ATT_ROWS][HEAD_DIM]; /* queries times scale * log2(e) */
    int lo[ATT_ROWS], hi[ATT_ROWS];
    int lo_min, lo_max, hi_min, hi_max;
    float m[ATT_ROWS];  /* reference point of the exponentials (base 2), see tile_scores */
    floatK l[ATT_ROWS]; /* sum of exponentials per key lane: reduced across lanes once, at the end */
    floatV acc[ATT_ROWS][VCHUNKS];  /* unnormalised output */
    int zero;                       /* 0, computed from a kernel argument: see tile_pv */
} tile_state;

/* A tile with no rows yet: its union bounds start empty over keys 0 .. T - 1. */
static inline void tile_begin(tile_state *ts, int T)
{
    ts->lo_min = T;
    ts->lo_max = 0;
    ts->hi_min = T;
    ts->hi_max = 0;
    ts->zero = T < 0;
}

/* Row r of the tile: visible keys `range` (local key indices; empty when range.x > range.y) and
 * the query row at `row`, scaled. */
static inline __attribute__((always_inline)) void tile_row(tile_state *ts, int r, int2 range,
                                                          const __global float *row, float scale_log2)
{
    ts->lo[r] = range.x;
    ts->hi[r] = range.y;
    ts->lo_min = min(ts->lo_min, range.x);
    ts->lo_max = max(ts->lo_max, range.x);
    ts->hi_min = min(ts->hi_min, range.y);
    ts->hi_max = max(ts->hi_max, range.y);
    for (int c = 0; c < HEAD_DIM; ++c) ts->q[r][c] = row[c] * scale_log2;
    ts->m[r] = -INFINITY;
    ts->l[r] = (floatK)(0.0f);
    #pragma unroll
    for (int cv = 0; cv < VCHUNKS; ++cv) ts->acc[r][cv] = (floatV)(0.0f);
}

/* Query row r of the tile is rows[min(r, valid - 1)] at virtual position pos0 + min(r, valid - 1):
 * rows past `valid` (a tail) repeat the last valid one and are not stored. */
static inline void tile_init(tile_state *ts, const __global float *rows, int pos0, int valid, int T, int P, int mask,
                             int window, float scale_log2, const __global int2 *seq)
{
    tile_begin(ts, T);
    #pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) {
        const int i = min(r, valid - 1);
        tile_row(ts, r, visible_keys(pos0 + i, T, P, mask, window, seq), rows + (size_t)i * HEAD_DIM, scale_log2);
    }
}

/* a[r] += P V[:, chunk cv] over the ATT_KB value rows from j0; tail (a constant at each call):
 * cv is the last chunk of a head width that ATT_VD does not divide. The choice is made once per
 * chunk, outside the key loop: a per-key branch between the whole and the tail load would make
 * the compiler route every value chunk through the stack, for every head width. */
static inline __attribute__((always_inline)) void pv_keys(floatV *a, const float *pc, const __global kv_t *vb,
                                                         int j0, int cv, int tail)
{
    /* Unclamped, row j is at a constant offset from the block's first row, which folds into the
     * load's address; int row numbers instead kept 16 row registers live (and spilled). */
    const __global kv_t *v0 = vb + (size_t)j0 * HEAD_DIM;
    #pragma unroll
    for (int j = 0; j < ATT_KB; ++j) {
        const __global kv_t *row = v0 + j * HEAD_DIM;
        const floatV vv = tail ? load_tail(row) : LOAD_V(row + cv * ATT_VD);
        #pragma unroll
        for (int r = 0; r < ATT_ROWS; ++r) a[r] = fma((floatV)(pc[r * ATT_KB + j]), vv, a[r]);
    }
}

/* pv_keys for a block that some row does not see whole: rows are clamped to `last` (padding keys
 * past T) and each product is selected by row r's interval [lo[r], hi[r]]: a masked key's
 * probability is 0, but 0 times an infinite or NaN value is NaN, and doc/spec.md's masked keys
 * contribute nothing. Only a tile's partial blocks (the diagonal, a window's edges, the last
 * block) come here, so its key loop stays rolled: unrolled, its selects made it the larger part of
 * the kernel's machine code and of PoCL's compile time at the first launch. */
static inline __attribute__((always_inline)) void pv_keys_masked(floatV *a, const float *pc,
                                                                const __global kv_t *vb, int j0, int last,
                                                                int cv, int tail, const int *lo, const int *hi)
{
    #pragma unroll 1
    for (int j = 0; j < ATT_KB; ++j) {
        const __global kv_t *row = vb + (size_t)min(j0 + j, last) * HEAD_DIM;
        const floatV vv = tail ? load_tail(row) : LOAD_V(row + cv * ATT_VD);
        #pragma unroll
        for (int r = 0; r < ATT_ROWS; ++r) {
            const floatV f = fma((floatV)(pc[r * ATT_KB + j]), vv, a[r]);
            a[r] = j0 + j < lo[r] || j0 + j > hi[r] ? a[r] : f;
        }
    }
}

/* acc[.][cv] += P V[:, chunk cv] for the ATT_KB value rows from j0 (see pv_keys): only ATT_ROWS
 * accumulators are live, which fits AVX2's 16 registers where the whole tile would spill. The
 * probabilities are read from pr at an offset of cv * ts->zero (ts->zero is 0 at run time,
 * unknown to the compiler): otherwise the compiler keeps the ATT_ROWS * ATT_KB broadcasts of
 * the first chunk for the others and spills them, and with more than 4 rows the accumulators
 * with them. A broadcast from memory costs one load. */
static inline __attribute__((always_inline)) void tile_pv_chunk(tile_state *ts, const float *pr,
                                                               const __global kv_t *vb, int j0, int last,
                                                               int masked, int cv)
{
    const float *pc = pr + cv * ts->zero;
    floatV a[ATT_ROWS];
    #pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) a[r] = ts->acc[r][cv];
    if (masked) {
#if VTAIL
        if (cv == VCHUNKS - 1)
            pv_keys_masked(a, pc, vb, j0, last, cv, 1, ts->lo, ts->hi);
        else
#endif
            pv_keys_masked(a, pc, vb, j0, last, cv, 0, ts->lo, ts->hi);
    } else {
#if VTAIL
        if (cv == VCHUNKS - 1)
            pv_keys(a, pc, vb, j0, cv, 1);
        else
#endif
            pv_keys(a, pc, vb, j0, cv, 0);
    }
    #pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) ts->acc[r][cv] = a[r];
}

/* s[r] = the scaled queries of row r against the key block: HEAD_DIM broadcast-FMAs per row. */
static inline __attribute__((always_inline)) void tile_score_fmas(const tile_state *ts, const __global kv_t *kblk,
                                                                 floatK *s)
{
    #pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) s[r] = (floatK)(0.0f);
    #pragma unroll 4
    for (int c = 0; c < HEAD_DIM; ++c) {
        const floatK kv = LOAD_KEYS(kblk + (size_t)c * ATT_KB);
        #pragma unroll
        for (int r = 0; r < ATT_ROWS; ++r) s[r] = fma((floatK)(ts->q[r][c]), kv, s[r]);
    }
}

/* The scores of s that overflowed to -inf made NaN (SCORE_SHRINK in masks.clh). Rare: it runs
 * in a branch the FMA loop never takes on finite, moderate inputs. */
static inline __attribute__((always_inline)) void overflow_to_nan(const tile_state *ts, const __global kv_t *kblk, floatK *s)
{
    for (int r = 0; r < ATT_ROWS; ++r) {
        floatK t = (floatK)(0.0f);
        for (int c = 0; c < HEAD_DIM; ++c)
            t = fma((floatK)(ts->q[r][c] * SCORE_SHRINK), LOAD_KEYS(kblk + (size_t)c * ATT_KB) * SCORE_SHRINK, t);
        s[r] = select(s[r], (floatK)(NAN), (s[r] == (floatK)(-INFINITY)) & isfinite(t));
    }
}

/* The scores of one register tile against the key block starting at key j0, and their online
 * softmax: probabilities into pr (row r at r * ATT_KB). Earlier output is rescaled here, when a
 * row's reference point moves: the tile's P.V of earlier blocks has run by then. Returns whether
 * every row sees the whole block (else its P.V must mask, see pv_keys). */
static inline int tile_scores(tile_state *ts, const __global kv_t *kblk, int j0, float *pr)
{
    floatK s[ATT_ROWS];
    tile_score_fmas(ts, kblk, s);
    /* The smallest score, NaN lanes (a NaN input, or a padding key past a cache's end) read as
     * +inf so that none hides a -inf from the ternary minimum. */
    floatK lowest = (floatK)(INFINITY);
    #pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) {
        const floatK v = select(s[r], (floatK)(INFINITY), isnan(s[r]));
        lowest = lowest < v ? lowest : v;
    }
    if (hmin(lowest) == -INFINITY) overflow_to_nan(ts, kblk, s);

    const int whole = j0 >= ts->lo_max && j0 + ATT_KB - 1 <= ts->hi_min;
    #pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) {
        if (!whole) {
            const intK u = (intK)(j0) + KEY_IOTA;
            s[r] = select((floatK)(-INFINITY), s[r], (u >= (intK)(ts->lo[r])) & (u <= (intK)(ts->hi[r])));
        }
        /* The reference point m moves only when a score exceeds it by more than MAX_SLACK, so
         * most blocks skip the rescaling, and the exponentials need not wait for the block's
         * horizontal maximum (which only decides the branch). A row that has seen no visible
         * key keeps m = -inf: any finite score moves it, and base 0 makes a masked row's
         * exponentials exactly 0 instead of NaN. */
        /* Rare once a row has seen a few blocks, so the rescaling is not a multiply at the head
         * of every P.V chunk's FMA chain. */
        const float mx = hmax(s[r]); /* any() of a vector compare costs PoCL a branch per lane */
        if (mx > ts->m[r] + MAX_SLACK) {
            const float corr = exp2(ts->m[r] - mx);
            ts->l[r] *= corr;
            #pragma unroll
            for (int cv = 0; cv < VCHUNKS; ++cv) ts->acc[r][cv] *= corr;
            ts->m[r] = mx;
        }
        const float base = ts->m[r] == -INFINITY ? 0.0f : ts->m[r];
        const floatK p = EXP2_SCORES(s[r] - (floatK)(base));
        vstoreK(p, r, pr);
        ts->l[r] += p;
    }
    return whole;
}

#if ATT_PARTIAL
/* Partial attention (cl/attention_partial_tiles.cl builds this file with ATT_PARTIAL 1): the
 * query block is rows q0 .. q0 + Tq - 1 and the key block rows k0 .. k0 + Tk - 1 of a sequence
 * of Tg rows, the masks evaluated there. Row r of the tile is query row `first` + min(r, valid - 1)
 * of the block; its visible keys are given as indices of the key block, and a row that sees none
 * of them gets the empty range (Tk, -1). */
static inline void tile_init_partial(tile_state *ts, const __global float *rows, int first, int valid, int q0, int k0,
                                     int Tk, int Tg, int P, int mask, int window, float scale_log2)
{
    tile_begin(ts, Tk);
    #pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) {
        const int i = min(r, valid - 1);
        const int2 g = visible_range(q0 + first + i, Tg, P, mask, window);
        int2 range = (int2)(max(g.x, k0) - k0, min(g.y, k0 + Tk - 1) - k0);
        if (range.x > range.y) range = (int2)(Tk, -1);
        tile_row(ts, r, range, rows + (size_t)i * HEAD_DIM, scale_log2);
    }
}

static inline floatV load_out_chunk(const __global float *row, int cv)
{
    const int c = cv * ATT_VD;
    if (c + ATT_VD <= HEAD_DIM) return vloadV(0, row + c);
    float tmp[ATT_VD];
    for (int i = 0; i < ATT_VD; ++i) tmp[i] = c + i < HEAD_DIM ? row[c + i] : 0.0f;
    return vloadV(0, tmp);
}

/* Row r's block result (acc / l, log-sum-exp from m and l) merged into the running state at
 * orow and *lse_row by the online-softmax rule, as attention_partial_f32 merges it: a row that
 * sees no key of the block keeps its state (with `first`, o = 0 and lse = -inf); a state with
 * lse = -inf, or `first`, takes the block's result. */
static inline void partial_merge(__global float *orow, __global float *lse_row, const floatV *acc, float m, float l,
                                 int empty, int first)
{
    if (empty) {
        if (first) {
            for (int cv = 0; cv < VCHUNKS; ++cv) store_chunk(orow, cv, (floatV)(0.0f));
            *lse_row = -INFINITY;
        }
        return;
    }
    const float lb = row_lse(m, l), ls = first ? -INFINITY : *lse_row;
    if (ls == -INFINITY) {
        const float inv = 1.0f / l;
        for (int cv = 0; cv < VCHUNKS; ++cv) store_chunk(orow, cv, acc[cv] * inv);
        *lse_row = lb;
        return;
    }
    const float mm = ls > lb ? ls : lb;
    const float ws = exp(ls - mm), wb = exp(lb - mm), den = ws + wb, fb = wb / l;
    for (int cv = 0; cv < VCHUNKS; ++cv) store_chunk(orow, cv, (load_out_chunk(orow, cv) * ws + acc[cv] * fb) / den);
    *lse_row = mm + log(den);
}
#endif

#if ATT_PARTIAL
/* rows: q, o [B*H][Tq][HEAD_DIM], lse [B*H][Tq]; kp the key block packed as above, v [B*H][Tk][HEAD_DIM] */
__kernel void attention_partial_tiles_f32(__global const float *q, ulong q_off, __global const kv_t *kp, ulong k_off,
                                          __global const kv_t *v, ulong v_off, __global float *o, ulong o_off,
                                          __global float *lse, ulong lse_off, int Tq, int Tk, int q0, int k0, int Tg,
                                          int P, int mask, int window, float scale_log2, int first IHA_PROBE_PARAMS)
#else
__kernel void attention_fwd_f32(__global const float *q, ulong q_off,   /* [B*H][T][HEAD_DIM] */
                                __global const kv_t *kp, ulong k_off,   /* key blocks, see above */
                                __global const kv_t *v, ulong v_off,    /* [B*H][T][HEAD_DIM] */
                                __global float *o, ulong o_off,         /* [B*H][T][HEAD_DIM] */
                                __global float *lse, ulong lse_off,     /* [B*H][T] natural log */
                                int want_lse, int T, int P, int mask, int window,
                                float scale_log2 /* score scale * log2(e) */ IHA_SEQ_PARAMS IHA_PROBE_PARAMS)
#endif
{
#if !ATT_PARTIAL
    const int Tq = T, Tk = T; /* query rows and key rows: one sequence */
#endif
    const int t0 = get_global_id(0) * (ATT_ROWS * ATT_TILES);
    const int bh = get_global_id(1);
    if (t0 >= Tq) return;
    const int blocks = (Tk + ATT_KB - 1) / ATT_KB;
    const __global float *qb = q + q_off + (size_t)bh * Tq * HEAD_DIM;
    const __global kv_t *kb = kp + k_off + (size_t)bh * blocks * HEAD_DIM * ATT_KB;
    const __global kv_t *vb = v + v_off + (size_t)bh * Tk * HEAD_DIM;
#if !ATT_PARTIAL
    const __global int2 *seq = seq_row(seq_bounds, seq_heads, bh, T, P);
#endif

    tile_state tiles[ATT_TILES];
    int lo_min = Tk, hi_max = 0;
    for (int i = 0; i < ATT_TILES; ++i) {
        const int row0 = min(t0 + i * ATT_ROWS, Tq - 1);
#if ATT_PARTIAL
        tile_init_partial(&tiles[i], qb + (size_t)row0 * HEAD_DIM, row0, Tq - row0, q0, k0, Tk, Tg, P, mask, window,
                          scale_log2);
#else
        tile_init(&tiles[i], qb + (size_t)row0 * HEAD_DIM, row0, T - row0, T, P, mask, window, scale_log2, seq);
#endif
        lo_min = min(lo_min, tiles[i].lo_min);
        hi_max = max(hi_max, tiles[i].hi_max);
    }

    /* Per key block: every tile's scores and softmax, then P.V chunk by chunk over the head
     * dimension with the tiles innermost, so one chunk of the block's value rows (ATT_KB cache
     * lines at ATT_VD = 16) serves every tile while it is in L1. Tile by tile instead, each tile
     * would stream the whole value block, which at d = 128 (8 KiB of values, 16 KiB of tile
     * state, 8 KiB of keys) does not fit L1 and would come back from L2 for every tile. Tile
     * i+1's score FMAs are independent of tile i's softmax chain, so the two still overlap. */
    float pr[ATT_TILES][ATT_ROWS * ATT_KB];
    int blk = lo_min / ATT_KB;
    const int blk_end = hi_max / ATT_KB + 1;
    for (; blk < blk_end + IHA_PROBE_PAST; ++blk) {
        IHA_PROBE_SKIP_PAST(blk >= blk_end);
        const int j0 = blk * ATT_KB;
        const __global kv_t *kblk = kb + (size_t)blk * HEAD_DIM * ATT_KB;
#if ATT_PREFETCH && defined(__clang__)
        const int prefetch = j0 + 2 * ATT_KB <= Tk && blk < hi_max / ATT_KB;
        const __global kv_t *next = vb + (size_t)(j0 + ATT_KB) * HEAD_DIM;
#endif
        int seen = 0, partial = 0;
        for (int i = 0; i < ATT_TILES; ++i) {
            /* Blocks outside this tile's visible keys are skipped, not computed and masked. */
            if (j0 + ATT_KB - 1 < tiles[i].lo_min || j0 > tiles[i].hi_max) continue;
            if (!tile_scores(&tiles[i], kblk, j0, pr[i])) partial |= 1 << i;
            seen |= 1 << i;
        }
        /* A block that runs past Tk is partial for every tile: its padding keys are masked, and
         * their rows clamped to the last key keep the reads in bounds. */
        const int last = min(j0 + ATT_KB, Tk) - 1;
        #pragma unroll 1
        for (int cv = 0; cv < VCHUNKS; ++cv) {
#if ATT_PREFETCH && defined(__clang__)
            if (prefetch) {
                #pragma unroll
                for (int j = 0; j < ATT_KB; ++j) __builtin_prefetch(next + j * HEAD_DIM + cv * ATT_VD, 0, 3);
            }
#endif
            for (int i = 0; i < ATT_TILES; ++i)
                if (seen & (1 << i)) {
                    if (partial & (1 << i))
                        tile_pv_chunk(&tiles[i], pr[i], vb, j0, last, 1, cv);
                    else
                        tile_pv_chunk(&tiles[i], pr[i], vb, j0, last, 0, cv);
                }
        }
    }
    IHA_PROBE_EXPECT(blk >= blk_end + IHA_PROBE_PAST);

    for (int i = 0; i < ATT_TILES; ++i) {
        const tile_state *ts = &tiles[i];
        for (int r = 0; r < ATT_ROWS; ++r) {
            const int t = t0 + i * ATT_ROWS + r;
            if (t >= Tq) {
                IHA_PROBE_CHECK();
                return;
            }
            const float l = hsum(ts->l[r]);
            __global float *orow = o + o_off + ((size_t)bh * Tq + t) * HEAD_DIM;
#if ATT_PARTIAL
            partial_merge(orow, lse + lse_off + (size_t)bh * Tq + t, ts->acc[r], ts->m[r], l, ts->lo[r] > ts->hi[r],
                          first);
#else
            /* Every row sees a key, so l = 0 means that no score was finite, and a NaN l that
             * one was NaN: 1/l then makes the row NaN, as doc/spec.md's float64 softmax is
             * (doc/numerics.md). */
            const float inv = 1.0f / l;
            #pragma unroll
            for (int cv = 0; cv < VCHUNKS; ++cv) store_chunk(orow, cv, ts->acc[r][cv] * inv);
            if (want_lse) lse[lse_off + (size_t)bh * T + t] = row_lse(ts->m[r], l);
#endif
        }
    }
    IHA_PROBE_CHECK();
}
