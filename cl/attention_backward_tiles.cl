/* The backward pass of attention written like the forward kernel (cl/attention.cl), for CPUs:
 * register tiles of BW_ROWS key rows against blocks of 16 queries packed [d][16] (Q and dO), so
 * each tile of scores grows by HEAD_DIM broadcast-FMAs into float16 vectors, and one pass over
 * the visible pairs computes all three gradients (FlashAttention-2's loop order, with the
 * query side's sums kept per work-item instead of in atomics):
 *   S^T = k.Q, Pr^T = 2^(S^T - lse[lanes]), dP^T = v.dO, dS^T = Pr^T (dP^T - Dt[lanes]),
 *   dv += Pr^T dO and dk += dS^T Q (dO and Q as rows, in registers per key row),
 *   dq[lanes] += dS^T^T K (into the work-item's partial sums, read and written per block).
 * A work-item owns every SEGMENTS-th group of BW_ROWS * BW_TILES keys of one (b, h) and one
 * partial dq of the whole sequence, so no two work-items write the same float;
 * attention_bwd_dq_sum_f32 then adds the SEGMENTS partials into dq. Each pair costs 10*d
 * FLOPs, where a dq pass of its own would recompute S and dP (14*d).
 * Scores are in base 2 with scale * log2(e) folded into the key rows, and lse (natural log) is
 * turned into base 2 once per lane, so no exponential needs a running maximum: every exponent
 * is at most ~0. Blocks outside a tile's queries (masks.clh's seeing_queries) are skipped.
 * Any HEAD_DIM: rows are kept and summed in chunks of 16 floats (ROWPAD, zero-padded), and the
 * last chunk of a width that 16 does not divide is loaded and stored as its TAIL elements
 * (whole 4- and 8-float vectors where TAIL allows), decided once per chunk pass, outside the
 * query loop, as the forward's P.V does.
 * With ATT_PARTIAL 1 (cl/attention_partial_backward_tiles.cl) the same pass runs over one query
 * block (rows q0 .. q0 + Tq - 1) and one key block (rows k0 .. k0 + Tk - 1) of a sequence of Tg
 * rows, the masks evaluated at those global positions (iha_attention_partial_backward), and adds
 * into dk, dv and dq on request; a whole sequence is the case q0 = k0 = 0, Tq = Tk = Tg = T. */
#include "loop_probe.clh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined by the host"
#endif
#ifndef ATT_PARTIAL
#define ATT_PARTIAL 0
#endif
/* Rows of one register tile. */
#ifndef BW_ROWS
#define BW_ROWS 4
#endif
/* Register tiles per work-item. They take turns on each block while it is in cache, so the
 * packed blocks and the rows stream from memory once per BW_ROWS * BW_TILES rows, not once per
 * tile: with one tile per work-item, wide heads would wait on that stream. */
#ifndef BW_TILES
#define BW_TILES 4
#endif

#define KB 16
#define CHUNKS ((HEAD_DIM + 15) / 16)
/* Elements of the last chunk when 16 does not divide HEAD_DIM (0 when it does). */
#define TAIL (HEAD_DIM % 16)
/* A row in private memory and in the partial sums: whole chunks of 16, zeros past HEAD_DIM. */
#define ROWPAD (CHUNKS * 16)
#define LOG2E 1.4426950408889634f

#include "exp2_bounded.clh"
IHA_DEFINE_EXP2_BOUNDED(exp2_bounded16, float16, int16)

/* MASK_*, visible_keys(t, ...) -> visible keys, seeing_queries_in(u, ...) -> queries that see u,
 * both within packed sequences. */
#include "masks.clh"

#define LANE_IOTA ((int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))

/* s[r] = a[r] . the 16 packed columns of blk: HEAD_DIM broadcast-FMAs per row. */
static inline __attribute__((always_inline)) void tile_dots(float (*a)[ROWPAD], const __global float *blk,
                                                           float16 *s)
{
    #pragma unroll
    for (int r = 0; r < BW_ROWS; ++r) s[r] = (float16)(0.0f);
    #pragma unroll 4
    for (int c = 0; c < HEAD_DIM; ++c) {
        const float16 col = vload16(0, blk + (size_t)c * KB);
        #pragma unroll
        for (int r = 0; r < BW_ROWS; ++r) s[r] = fma((float16)(a[r][c]), col, s[r]);
    }
}

/* The last chunk of a row whose width 16 does not divide: its TAIL elements, zeros beyond. */
static inline float16 load_tail(const __global float *row)
{
    const __global float *t = row + (HEAD_DIM - TAIL);
#if TAIL == 8
    return (float16)(vload8(0, t), (float8)(0.0f));
#elif TAIL == 4
    return (float16)(vload4(0, t), (float4)(0.0f), (float8)(0.0f));
#elif TAIL == 12
    return (float16)(vload8(0, t), vload4(0, t + 8), (float4)(0.0f));
#else
    float tmp[16];
    #pragma unroll
    for (int i = 0; i < 16; ++i) tmp[i] = i < TAIL ? t[i] : 0.0f;
    return vload16(0, tmp);
#endif
}

/* Interval bookkeeping of one tile: each row's [lo, hi] and their extremes. */
typedef struct bw_span {
    int lo[BW_ROWS], hi[BW_ROWS];
    int lo_min, lo_max, hi_min, hi_max;
} bw_span;

/* a[r] += sum_j w[r][j] * chunk cv of rows[j] over the 16 rows from j0 (clamped to `last`);
 * tail (a constant at each call): cv is the last, partial chunk. masked (a constant at each
 * call): the block is not wholly visible to the tile, so each product is selected by row r's
 * interval in sp: a masked pair's weight is 0, but 0 times an infinite or NaN row is NaN, and
 * doc/spec.md's masked pairs contribute nothing. */
static inline __attribute__((always_inline)) void chunk_keys(float16 *a, const float *wc, const __global float *rows,
                                                            int j0, int last, int cv, int tail, int masked,
                                                            const bw_span *sp)
{
    #pragma unroll
    for (int j = 0; j < KB; ++j) {
        const __global float *row = rows + (size_t)min(j0 + j, last) * HEAD_DIM;
        const float16 x = tail ? load_tail(row) : vload16(cv, row);
        #pragma unroll
        for (int r = 0; r < BW_ROWS; ++r) {
            const float16 f = fma((float16)(wc[r * KB + j]), x, a[r]);
            a[r] = masked && (j0 + j < sp->lo[r] || j0 + j > sp->hi[r]) ? a[r] : f;
        }
    }
}

/* acc[r][.] += sum_j w[r][j] * rows[j], for the 16 rows from row j0 (clamped to `last`; their
 * weights are 0 there), chunk by chunk over the head dimension so only BW_ROWS accumulators
 * are live. w is read at an offset of `zero` (0 at run time, unknown to the compiler), as the
 * forward's tile_pv_chunk does, so the 64 broadcasts are not kept live across chunks. */
static inline __attribute__((always_inline)) void tile_accumulate(float16 (*acc)[CHUNKS], const float *w,
                                                                 const __global float *rows, int j0, int last,
                                                                 int zero, int masked, const bw_span *sp)
{
    #pragma unroll 1
    for (int cv = 0; cv < CHUNKS; ++cv) {
        const float *wc = w + cv * zero;
        float16 a[BW_ROWS];
        #pragma unroll
        for (int r = 0; r < BW_ROWS; ++r) a[r] = acc[r][cv];
#if TAIL
        if (cv == CHUNKS - 1)
            chunk_keys(a, wc, rows, j0, last, cv, 1, masked, sp);
        else
#endif
            chunk_keys(a, wc, rows, j0, last, cv, 0, masked, sp);
        #pragma unroll
        for (int r = 0; r < BW_ROWS; ++r) acc[r][cv] = a[r];
    }
}

static inline void span_add(bw_span *sp, int r, int2 range)
{
    sp->lo[r] = range.x, sp->hi[r] = range.y;
    if (r == 0) {
        sp->lo_min = sp->lo_max = range.x;
        sp->hi_min = sp->hi_max = range.y;
    }
    sp->lo_min = min(sp->lo_min, range.x), sp->lo_max = max(sp->lo_max, range.x);
    sp->hi_min = min(sp->hi_min, range.y), sp->hi_max = max(sp->hi_max, range.y);
}

/* Whether every row of the tile sees the whole block from j0. */
static inline int span_whole(const bw_span *sp, int j0) { return j0 >= sp->lo_max && j0 + KB - 1 <= sp->hi_min; }

/* p with the lanes j0 + j outside row r's interval set to 0 (a select: whatever their bits). */
static inline float16 masked(const bw_span *sp, int r, int j0, float16 p)
{
    if (span_whole(sp, j0)) return p;
    const int16 u = (int16)(j0) + LANE_IOTA;
    return select((float16)(0.0f), p, (u >= (int16)(sp->lo[r])) & (u <= (int16)(sp->hi[r])));
}

static inline int span_touches(const bw_span *sp, int j0) { return j0 + KB - 1 >= sp->lo_min && j0 <= sp->hi_max; }

/* Rows t0 .. of out (those before T) = factor * acc, or with add += factor * acc. */
static inline void store_rows(__global float *out, int t0, int T, float16 (*acc)[CHUNKS], float factor, int add)
{
    for (int r = 0; r < BW_ROWS && t0 + r < T; ++r) {
        __global float *row = out + (size_t)(t0 + r) * HEAD_DIM;
        for (int cv = 0; cv < HEAD_DIM / 16; ++cv) {
            float16 x = acc[r][cv] * factor;
            if (add) x += vload16(cv, row);
            vstore16(x, cv, row);
        }
#if TAIL
        float tmp[16];
        vstore16(acc[r][CHUNKS - 1] * factor, 0, tmp);
        for (int i = 0; i < TAIL; ++i) row[HEAD_DIM - TAIL + i] = tmp[i] + (add ? row[HEAD_DIM - TAIL + i] : 0.0f);
#endif
    }
}

/* Where the rows lie in the sequence the masks see: query row t is position q0 + t and key row
 * u position k0 + u of Tg rows; seq: the packed sequences' bounds (masks.clh's seq_row), or 0. */
typedef struct bw_blocks {
    int q0, k0, Tg;
    const __global int2 *seq;
} bw_blocks;

/* The queries of the block (Tq rows) that see key row u, as block indices; (Tq, -1) when none. */
static inline int2 key_span(int u, int Tq, int P, int mask, int window, const bw_blocks *at)
{
    const int2 s = seeing_queries_in(at->k0 + u, at->Tg, P, mask, window, at->seq);
    const int lo = max(s.x, at->q0) - at->q0, hi = min(s.y, at->q0 + Tq - 1) - at->q0;
    return lo <= hi ? (int2)(lo, hi) : (int2)(Tq, -1);
}

/* One key tile: its key rows (times scale * log2(e)) and value rows, zero-padded to ROWPAD. */
typedef struct key_tile {
    float ks[BW_ROWS][ROWPAD], vs[BW_ROWS][ROWPAD];
    bw_span span;
    float16 acc_k[BW_ROWS][CHUNKS], acc_v[BW_ROWS][CHUNKS];
} key_tile;

/* a[i] += sum over the work-item's key rows of ds[row][j + i] * their chunk cv, for 4 queries
 * j.. j + 3: the key rows' chunks are read from the tiles (L1), the probabilities' gradients as
 * broadcasts from ds ([BW_TILES * BW_ROWS][KB], read at an offset of `zero`: see
 * tile_accumulate). 4 queries x 2 ymm accumulators, so each key chunk serves 8 FMAs. masked (a
 * constant at each call): tiles whose bit is set in `partial` select each product by the key
 * row's interval, as chunk_keys does (query j0 + j + q outside it adds nothing). */
static inline __attribute__((always_inline)) void dq_quad(float16 *a, const key_tile *tiles, const float *ds, int j,
                                                         int cv, int masked, int partial, int j0)
{
    for (int i = 0; i < BW_TILES; ++i) {
        const int sel = masked && (partial & (1 << i));
        #pragma unroll
        for (int r = 0; r < BW_ROWS; ++r) {
            const float16 kr = vload16(cv, tiles[i].ks[r]);
            const float *w = ds + (i * BW_ROWS + r) * KB + j;
            #pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float16 f = fma((float16)(w[q]), kr, a[q]);
                const int u = j0 + j + q;
                a[q] = sel && (u < tiles[i].span.lo[r] || u > tiles[i].span.hi[r]) ? a[q] : f;
            }
        }
    }
}

/* The block's 16 query rows of the partial sums (ROWPAD floats each, rows past T included:
 * their gradients are 0) += dS^T^T K over the work-item's key rows, chunk by chunk. partial:
 * the tiles that do not wholly see the block (see dq_quad); 0 takes the unmasked path. */
static inline void dq_accumulate(__global float *part, const key_tile *tiles, const float *ds, int zero, int partial,
                                 int j0)
{
    #pragma unroll 1
    for (int cv = 0; cv < CHUNKS; ++cv) {
        const float *dc = ds + cv * zero;
        #pragma unroll 1
        for (int j = 0; j < KB; j += 4) {
            __global float *row = part + (size_t)j * ROWPAD;
            float16 a[4];
            #pragma unroll
            for (int q = 0; q < 4; ++q) a[q] = vload16(cv, row + q * ROWPAD);
            if (partial)
                dq_quad(a, tiles, dc, j, cv, 1, partial, j0);
            else
                dq_quad(a, tiles, dc, j, cv, 0, 0, j0);
            #pragma unroll
            for (int q = 0; q < 4; ++q) vstore16(a[q], cv, row + q * ROWPAD);
        }
    }
}

/* One group of BW_ROWS * BW_TILES keys from u0 (of Tk): dk and dv of its rows, stored (with add
 * added), and their share of dq added into `part`, over the blocks of the Tq queries that see
 * them. */
static void key_group(const __global float *qpb, const __global float *gpb, const __global float *qb,
                      const __global float *kb, const __global float *vb, const __global float *gb,
                      const __global float *lse_bh, const __global float *delta_bh, __global float *dkb,
                      __global float *dvb, __global float *part, int u0, int Tq, int Tk, int P, int mask,
                      int window, float scale, int add, const bw_blocks *at)
{
    const float scale_log2 = scale * LOG2E;
    key_tile tiles[BW_TILES];
    int lo_min = Tq, hi_max = 0;
    for (int i = 0; i < BW_TILES; ++i) {
        key_tile *tl = &tiles[i];
        for (int r = 0; r < BW_ROWS; ++r) {
            /* Rows past Tk repeat the last one and are not stored. Their span is empty, so their
             * probabilities and gradients are selected to 0 (and a repeated key adds nothing to
             * dq): zeroing their key rows instead would make 2^(0 - lse) of a very negative lse
             * overflow, and select is what keeps any such value out. */
            const int u = min(u0 + i * BW_ROWS + r, Tk - 1);
            span_add(&tl->span, r, u0 + i * BW_ROWS + r < Tk ? key_span(u, Tq, P, mask, window, at) : (int2)(Tq, -1));
            for (int c = 0; c < ROWPAD; ++c) {
                tl->ks[r][c] = c < HEAD_DIM ? kb[(size_t)u * HEAD_DIM + c] * scale_log2 : 0.0f;
                tl->vs[r][c] = c < HEAD_DIM ? vb[(size_t)u * HEAD_DIM + c] : 0.0f;
            }
            for (int cv = 0; cv < CHUNKS; ++cv) tl->acc_k[r][cv] = tl->acc_v[r][cv] = (float16)(0.0f);
        }
        lo_min = min(lo_min, tl->span.lo_min), hi_max = max(hi_max, tl->span.hi_max);
    }

    const int zero = Tq < 0;
    float pr[BW_ROWS * KB], ds[BW_TILES * BW_ROWS * KB];
    for (int blk = lo_min / KB; blk <= hi_max / KB; ++blk) {
        const int j0 = blk * KB;
        const __global float *qpk = qpb + (size_t)blk * HEAD_DIM * KB;
        const __global float *gpk = gpb + (size_t)blk * HEAD_DIM * KB;
        /* The block's queries' lse (base 2) and Dt; lanes past Tq repeat the last query, whose
         * probability the mask makes 0. */
        float16 l2, dt;
        if (j0 + KB <= Tq) {
            l2 = vload16(0, lse_bh + j0) * LOG2E;
            dt = vload16(0, delta_bh + j0);
        } else {
            float tl2[KB], tdt[KB];
            for (int j = 0; j < KB; ++j) {
                tl2[j] = lse_bh[min(j0 + j, Tq - 1)] * LOG2E;
                tdt[j] = delta_bh[min(j0 + j, Tq - 1)];
            }
            l2 = vload16(0, tl2);
            dt = vload16(0, tdt);
        }
        /* Queries that saw no key (lse = -inf) get probability 0: lse = +inf. */
        l2 = select(l2, (float16)(INFINITY), l2 == (float16)(-INFINITY));
        int partial = 0;
        for (int i = 0; i < BW_TILES; ++i) {
            key_tile *tl = &tiles[i];
            float *dsi = ds + i * BW_ROWS * KB;
            if (!span_touches(&tl->span, j0)) {
                /* Skipped, not computed; its dq share is selected away (its key rows may hold
                 * any value, and 0 times NaN is NaN). */
                #pragma unroll
                for (int r = 0; r < BW_ROWS; ++r) vstore16((float16)(0.0f), r, dsi);
                partial |= 1 << i;
                continue;
            }
            float16 sc[BW_ROWS], dp[BW_ROWS];
            tile_dots(tl->ks, qpk, sc);
            tile_dots(tl->vs, gpk, dp);
            /* dS is selected as well as Pr: a masked pair's dP - Dt may be infinite or NaN. */
            #pragma unroll
            for (int r = 0; r < BW_ROWS; ++r) {
                const float16 p = masked(&tl->span, r, j0, exp2_bounded16(sc[r] - l2));
                vstore16(p, r, pr);
                vstore16(masked(&tl->span, r, j0, p * (dp[r] - dt)), r, dsi);
            }
            if (span_whole(&tl->span, j0)) {
                tile_accumulate(tl->acc_v, pr, gb, j0, Tq - 1, zero, 0, &tl->span);
                tile_accumulate(tl->acc_k, dsi, qb, j0, Tq - 1, zero, 0, &tl->span);
            } else {
                partial |= 1 << i;
                tile_accumulate(tl->acc_v, pr, gb, j0, Tq - 1, zero, 1, &tl->span);
                tile_accumulate(tl->acc_k, dsi, qb, j0, Tq - 1, zero, 1, &tl->span);
            }
        }
        dq_accumulate(part + (size_t)j0 * ROWPAD, tiles, ds, zero, partial, j0);
    }
    for (int i = 0; i < BW_TILES; ++i) {
        store_rows(dkb, u0 + i * BW_ROWS, Tk, tiles[i].acc_k, scale, add);
        store_rows(dvb, u0 + i * BW_ROWS, Tk, tiles[i].acc_v, 1.0f, add);
    }
}

/* dk, dv and SEGMENTS partial dq sums: work-item (s, bh) takes the key groups s, s + segments,
 * ... of sequence bh, and its partial [blocks * 16][ROWPAD] at part + (s * B*H + bh) * that. */
#if ATT_PARTIAL
/* Q, dO, lse and Dt of the query block ([B*H][Tq] rows), K, V, dk and dv of the key block
 * ([B*H][Tk] rows); add: dk and dv are added into. */
__kernel void attention_partial_bwd_tiles_f32(__global const float *qp, ulong qp_off, /* Q packed [B*H][Tq/16][d][16] */
                                              __global const float *gp, ulong gp_off, /* dO packed likewise */
                                              __global const float *q, ulong q_off,
                                              __global const float *k, ulong k_off,
                                              __global const float *v, ulong v_off,
                                              __global const float *dout, ulong d_off,
                                              __global const float *lse, ulong lse_off, __global const float *delta,
                                              __global float *dk, ulong dk_off, __global float *dv, ulong dv_off,
                                              __global float *part, int segments, int Tq, int Tk, int q0, int k0,
                                              int Tg, int P, int mask, int window, float scale,
                                              int add IHA_PROBE_PARAMS)
#else
__kernel void attention_bwd_tiles_f32(__global const float *qp, ulong qp_off,   /* Q packed [B*H][T/16][d][16] */
                                      __global const float *gp, ulong gp_off,   /* dO packed likewise */
                                      __global const float *q, ulong q_off,     /* [B*H][T][HEAD_DIM] */
                                      __global const float *k, ulong k_off,     /* [B*H][T][HEAD_DIM] */
                                      __global const float *v, ulong v_off,     /* [B*H][T][HEAD_DIM] */
                                      __global const float *dout, ulong d_off,  /* [B*H][T][HEAD_DIM] */
                                      __global const float *lse, ulong lse_off, /* [B*H][T] natural log */
                                      __global const float *delta,              /* [B*H][T] */
                                      __global float *dk, ulong dk_off,         /* [B*H][T][HEAD_DIM] */
                                      __global float *dv, ulong dv_off,         /* [B*H][T][HEAD_DIM] */
                                      __global float *part,                     /* see above */
                                      int segments, int T, int P, int mask, int window, float scale IHA_SEQ_PARAMS IHA_PROBE_PARAMS)
#endif
{
    const int s = get_global_id(0), bh = get_global_id(1), bhs = get_global_size(1);
    if (s >= segments) return;
#if ATT_PARTIAL
    const bw_blocks at = {q0, k0, Tg, 0};
#else
    const int Tq = T, Tk = T, add = 0; /* query rows and key rows: one sequence */
    const bw_blocks at = {0, 0, T, seq_row(seq_bounds, seq_heads, bh, T, P)};
#endif
    const int blocks = (Tq + KB - 1) / KB, per_group = BW_ROWS * BW_TILES;
    const size_t q_base = (size_t)bh * Tq * HEAD_DIM, k_base = (size_t)bh * Tk * HEAD_DIM;
    const size_t packed_base = (size_t)bh * blocks * HEAD_DIM * KB;
    const size_t part_rows = (size_t)blocks * KB * ROWPAD;
    __global float *pb = part + ((size_t)s * bhs + bh) * part_rows;
    for (size_t i = 0; i < part_rows; i += 16) vstore16((float16)(0.0f), 0, pb + i);
    /* The key-group loop is the last loop: its extra iteration catches a cut anywhere above. */
    const int stride = segments * per_group;
    int u0 = s * per_group;
    for (; u0 < Tk + IHA_PROBE_PAST * stride; u0 += stride) {
        IHA_PROBE_SKIP_PAST(u0 >= Tk);
        key_group(qp + qp_off + packed_base, gp + gp_off + packed_base, q + q_off + q_base, k + k_off + k_base,
                  v + v_off + k_base, dout + d_off + q_base, lse + lse_off + (size_t)bh * Tq, delta + (size_t)bh * Tq,
                  dk + dk_off + k_base, dv + dv_off + k_base, pb, u0, Tq, Tk, P, mask, window, scale, add, &at);
    }
    IHA_PROBE_EXPECT(u0 >= Tk + IHA_PROBE_PAST * stride);
    IHA_PROBE_CHECK();
}

/* dq = ln 2 * the sum of the segments' partials (their key rows carried scale * log2(e)), or
 * with add dq += that: one work-item per row t of sequence bh. */
__kernel void attention_bwd_dq_sum_f32(__global const float *part, int segments, __global float *dq, ulong dq_off,
                                       int T, int add IHA_PROBE_PARAMS)
{
    const int t = get_global_id(0), bh = get_global_id(1), bhs = get_global_size(1);
    if (t >= T) return;
    const size_t part_rows = (size_t)((T + KB - 1) / KB) * KB * ROWPAD;
    float16 acc[CHUNKS];
    for (int cv = 0; cv < CHUNKS; ++cv) acc[cv] = (float16)(0.0f);
    for (int s = 0; s < segments; ++s) {
        const __global float *row = part + ((size_t)s * bhs + bh) * part_rows + (size_t)t * ROWPAD;
        for (int cv = 0; cv < CHUNKS; ++cv) acc[cv] += vload16(cv, row);
    }
    store_rows(dq + dq_off + (size_t)bh * T * HEAD_DIM, t, t + 1, (float16(*)[CHUNKS])acc, M_LN2_F, add);
    IHA_PROBE_CHECK();
}
