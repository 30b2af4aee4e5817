/* Flash attention for GPUs with register sub-tiles: a work-group owns LOC_ROWS consecutive query
 * rows of one (b, h) and streams the keys and values they can see through local memory in tiles
 * of LOC_KEYS keys. Its work-items form a grid of NY x NX; work-item (ty, tx) computes a
 * TILE_RY x TILE_RX sub-tile of the scores and owns the output columns tx, tx + NX, ... of its
 * TILE_RY rows.
 *
 * Why: attention_local.cl gives each work-item one whole row, so every FMA needs a load from
 * local memory (the key or value element), and local memory, not arithmetic, bounds it, far
 * below a GPU's FMA peak. Here a column of the score sub-tile takes TILE_RY * TILE_RX FMAs for
 * TILE_RY + TILE_RX words loaded (as float4), and the output sub-tile TILE_RY FMAs per value word
 * (the probabilities of a key come as float4s). The price is the query tile in local memory and
 * row maxima reduced across the NX work-items that share a row.
 *
 * Interleaved float4s: a work-item's rows and keys are groups of 4 consecutive ones, NY (rows)
 * and NX (keys) float4s apart, not TILE_RY or TILE_RX consecutive ones. Work-items next to each
 * other then read float4s next to each other from the [column][row] and [column][key] tiles, so
 * a load instruction of 8-wide sub-tiles touches every bank once, where consecutive keys would
 * make two work-items meet in each bank.
 *
 * Two barriers per key tile: the scores, then (barrier) the probabilities, this tile's values
 * and the next tile's keys, then (barrier) P.V. The keys of a tile are read only before the
 * first barrier and the values only after the second, so one buffer of each suffices; the row
 * sums are taken from the probabilities P.V reads anyway.
 *
 * Inputs and outputs are those of attention_fwd_f32 and attention_fwd_local_f32: queries and
 * values as rows [B*H][T][HEAD_DIM], keys in the key-block layout [B*H][ceil(T/ATT_KB)][HEAD_DIM]
 * [ATT_KB]. Masks and windows are the per-row visible interval [lo, hi] of doc/spec.md; key tiles outside
 * the work-group's union of intervals are skipped. */
#include "loop_probe.clh"
#include "attention_args.clh"

#ifndef LOC_ROWS
#define LOC_ROWS 64 /* query rows per work-group, a multiple of TILE_RY */
#endif
#ifndef LOC_KEYS
#define LOC_KEYS 32 /* keys per local tile, a multiple of TILE_RX and of ATT_KB */
#endif
#ifndef TILE_RY
#define TILE_RY 4 /* query rows of a work-item's score sub-tile: 4 or 8 */
#endif
#ifndef TILE_RX
#define TILE_RX 4 /* keys of a work-item's score sub-tile: 4 or 8 */
#endif
#if (TILE_RY != 4 && TILE_RY != 8) || (TILE_RX != 4 && TILE_RX != 8)
#error "TILE_RY and TILE_RX must be 4 or 8"
#endif
#if LOC_ROWS % TILE_RY != 0 || LOC_KEYS % TILE_RX != 0 || LOC_KEYS % ATT_KB != 0
#error "LOC_ROWS must be a multiple of TILE_RY, LOC_KEYS of TILE_RX and of ATT_KB"
#endif

#define RQ (TILE_RY / 4)                            /* float4s of rows per work-item */
#define KQ (TILE_RX / 4)                            /* float4s of keys per work-item */
#define NX (LOC_KEYS / TILE_RX)                     /* work-items across keys and columns */
#define NY (LOC_ROWS / TILE_RY)                     /* work-items across rows */
#define THREADS (NX * NY)
#define DP ((HEAD_DIM + NX - 1) / NX * NX)         /* head width padded to whole column sets */
#define CW (DP / NX)                                /* output columns per work-item */
/* Row r (key x) of work-item ty (tx) within the tile: float4 r / 4 of its own, NY (NX) apart. */
#define ROW_OF(ty, r) (4 * ((ty) + NY * ((r) / 4)) + (r) % 4)
#define KEY_OF(tx, x) (4 * ((tx) + NX * ((x) / 4)) + (x) % 4)

#include "masks.clh"

/* The keys of the tile at j0 into ks ([column][key]): LOC_KEYS / ATT_KB whole blocks,
 * contiguous in the packed buffer ([block][c][kk]); blocks past the last one are not there:
 * zeros. Inline: PoCL loses local writes made in a called function across the caller's
 * barriers. */
__attribute__((always_inline)) static inline void load_keys(__local float *ks, const __global float *kb, int j0,
                                                            int blocks, int lid)
{
    const __global float *ksrc = kb + (size_t)(j0 / ATT_KB) * HEAD_DIM * ATT_KB;
    const int kavail = min(LOC_KEYS, blocks * ATT_KB - j0) * HEAD_DIM;
    for (int i = lid; i < LOC_KEYS * HEAD_DIM; i += THREADS) {
        const int rem = i % (HEAD_DIM * ATT_KB);
        ks[(rem / ATT_KB) * LOC_KEYS + i / (HEAD_DIM * ATT_KB) * ATT_KB + rem % ATT_KB] = i < kavail ? ksrc[i] : 0.0f;
    }
}

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void attention_fwd_local_tiles_f32(ATTENTION_LOCAL_ARGS IHA_PROBE_PARAMS)
{
    __local float qs[DP * LOC_ROWS];        /* [column][row], scaled: a float4 is 4 rows */
    __local float ks[DP * LOC_KEYS];        /* [column][key]: a float4 is 4 keys */
    __local float vs[LOC_KEYS * DP];        /* [key][column] */
    __local float ps[LOC_KEYS * LOC_ROWS];  /* probabilities [key][row]: a float4 is 4 rows */
    __local float red_max[LOC_ROWS * NX];   /* per row, one partial per work-item across */
    const int lid = get_local_id(0);
    const int tx = lid % NX, ty = lid / NX;
    const int t0 = get_group_id(0) * LOC_ROWS;
    const int bh = get_global_id(1);
    const int blocks = (T + ATT_KB - 1) / ATT_KB;
    const __global float *qb = q + q_off + (size_t)bh * T * HEAD_DIM;
    const __global float *kb = kp + k_off + (size_t)bh * blocks * HEAD_DIM * ATT_KB;
    const __global float *vb = v + v_off + (size_t)bh * T * HEAD_DIM;
    const __global int2 *seq = seq_row(seq_bounds, seq_heads, bh, T, P);

    /* The query tile, zeros past T and in the padding columns. The tile loads below write only
     * columns under HEAD_DIM, so the padding of ks and vs is zeroed here once: padded columns
     * then add 0 * 0 to every score and are never stored. */
    for (int i = lid; i < LOC_ROWS * DP; i += THREADS) {
        const int r = i / DP, c = i % DP;
        qs[c * LOC_ROWS + r] = t0 + r < T && c < HEAD_DIM ? qb[(size_t)(t0 + r) * HEAD_DIM + c] * scale_log2 : 0.0f;
    }
#if DP > HEAD_DIM
    for (int i = lid; i < (DP - HEAD_DIM) * LOC_KEYS; i += THREADS) {
        ks[HEAD_DIM * LOC_KEYS + i] = 0.0f;
        vs[(i / (DP - HEAD_DIM)) * DP + HEAD_DIM + i % (DP - HEAD_DIM)] = 0.0f;
    }
#endif

    int2 range[TILE_RY];
    float m[TILE_RY], l[TILE_RY], acc[TILE_RY][CW];
    for (int r = 0; r < TILE_RY; ++r) {
        range[r] = visible_keys(min(t0 + ROW_OF(ty, r), T - 1), T, P, mask, window, seq);
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int i = 0; i < CW; ++i) acc[r][i] = 0.0f;
    }
    /* The same for every work-item of the group, so the barriers below are reached uniformly. */
    const int lo_min = visible_keys(t0, T, P, mask, window, seq).x;
    const int hi_max = visible_keys(min(t0 + LOC_ROWS - 1, T - 1), T, P, mask, window, seq).y;

    int j0 = lo_min / LOC_KEYS * LOC_KEYS;
    if (j0 <= hi_max) load_keys(ks, kb, j0, blocks, lid);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (; j0 <= hi_max + IHA_PROBE_PAST * LOC_KEYS; j0 += LOC_KEYS) {
        IHA_PROBE_SKIP_PAST(j0 > hi_max); /* uniform across the group, like the barriers */
        float4 s[TILE_RY][KQ];
        for (int r = 0; r < TILE_RY; ++r)
            for (int x = 0; x < KQ; ++x) s[r][x] = (float4)(0.0f);
        for (int c = 0; c < DP; ++c) {
            float4 a[RQ], b[KQ];
            for (int y = 0; y < RQ; ++y) a[y] = vload4(0, qs + c * LOC_ROWS + 4 * (ty + NY * y));
            for (int x = 0; x < KQ; ++x) b[x] = vload4(0, ks + c * LOC_KEYS + 4 * (tx + NX * x));
            for (int y = 0; y < RQ; ++y)
                for (int x = 0; x < KQ; ++x) {
                    s[4 * y + 0][x] = fma((float4)(a[y].x), b[x], s[4 * y + 0][x]);
                    s[4 * y + 1][x] = fma((float4)(a[y].y), b[x], s[4 * y + 1][x]);
                    s[4 * y + 2][x] = fma((float4)(a[y].z), b[x], s[4 * y + 2][x]);
                    s[4 * y + 3][x] = fma((float4)(a[y].w), b[x], s[4 * y + 3][x]);
                }
        }
        /* Compares, not min/fmin, whose result OpenCL leaves undefined for infinities. */
        int4 inf = (int4)(0);
        for (int r = 0; r < TILE_RY; ++r)
            for (int x = 0; x < KQ; ++x) inf |= s[r][x] == (float4)(-INFINITY);
        for (int r = 0; (inf.x | inf.y | inf.z | inf.w) != 0 && r < TILE_RY; ++r) /* rare: see SCORE_SHRINK */
            for (int x = 0; x < KQ; ++x) {
                float4 t = (float4)(0.0f);
                for (int c = 0; c < DP; ++c)
                    t = fma((float4)(qs[c * LOC_ROWS + ROW_OF(ty, r)] * SCORE_SHRINK),
                            vload4(0, ks + c * LOC_KEYS + 4 * (tx + NX * x)) * SCORE_SHRINK, t);
                s[r][x] = select(s[r][x], (float4)(NAN), (s[r][x] == (float4)(-INFINITY)) & isfinite(t));
            }
        /* A select, not arithmetic: keys outside a row's interval (padding included) never
         * contribute, whatever their bits. */
        for (int r = 0; r < TILE_RY; ++r) {
            float mx = -INFINITY;
            for (int x = 0; x < KQ; ++x) {
                const int4 key = (int4)(j0 + 4 * (tx + NX * x)) + (int4)(0, 1, 2, 3);
                s[r][x] = select((float4)(-INFINITY), s[r][x], key >= (int4)(range[r].x) && key <= (int4)(range[r].y));
                mx = fmax(mx, fmax(fmax(s[r][x].x, s[r][x].y), fmax(s[r][x].z, s[r][x].w)));
            }
            red_max[ROW_OF(ty, r) * NX + tx] = mx;
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* red_max written; nobody reads ks any more */

        for (int r = 0; r < TILE_RY; ++r) {
            float mx = -INFINITY;
            for (int x = 0; x < NX; ++x) mx = fmax(mx, red_max[ROW_OF(ty, r) * NX + x]);
            const float m_new = fmax(m[r], mx);
            /* A row that has seen no visible key keeps m = -inf; base 0 makes every exponential
             * exactly 0 instead of NaN. */
            const float base = m_new == -INFINITY ? 0.0f : m_new;
            const float corr = exp2(m[r] - base);
            m[r] = m_new;
            l[r] *= corr;
            for (int i = 0; i < CW; ++i) acc[r][i] *= corr;
            for (int x = 0; x < KQ; ++x) {
                const float4 p = exp2(s[r][x] - (float4)(base));
                const int key = 4 * (tx + NX * x), row = ROW_OF(ty, r);
                ps[(key + 0) * LOC_ROWS + row] = p.x;
                ps[(key + 1) * LOC_ROWS + row] = p.y;
                ps[(key + 2) * LOC_ROWS + row] = p.z;
                ps[(key + 3) * LOC_ROWS + row] = p.w;
            }
        }
        /* This tile's values (the previous tile's were last read before the first barrier) and
         * the next tile's keys (this tile's were last read before it too); value rows past T are
         * not there: zeros. */
        const __global float *vsrc = vb + (size_t)j0 * HEAD_DIM;
        const int vavail = min(LOC_KEYS, T - j0) * HEAD_DIM;
        for (int i = lid; i < LOC_KEYS * HEAD_DIM; i += THREADS)
            vs[(i / HEAD_DIM) * DP + i % HEAD_DIM] = i < vavail ? vsrc[i] : 0.0f;
        if (j0 + LOC_KEYS <= hi_max) load_keys(ks, kb, j0 + LOC_KEYS, blocks, lid);
        barrier(CLK_LOCAL_MEM_FENCE); /* ps, vs and the next keys written */

        /* A masked key's probability is 0, but 0 times an infinite or NaN value is NaN and
         * doc/spec.md's masked keys contribute nothing: where some key of the tile is masked for one of
         * this work-item's rows, each product is selected by the row's interval. The row sums
         * add every probability: a masked key's is exactly 0. */
        int whole = 1;
        for (int r = 0; r < TILE_RY; ++r) whole &= j0 >= range[r].x && j0 + LOC_KEYS - 1 <= range[r].y;
        float sum[TILE_RY];
        for (int r = 0; r < TILE_RY; ++r) sum[r] = 0.0f;
        if (whole) {
            for (int j = 0; j < LOC_KEYS; ++j) {
                float p[TILE_RY];
                for (int y = 0; y < RQ; ++y) vstore4(vload4(0, ps + j * LOC_ROWS + 4 * (ty + NY * y)), y, p);
                for (int r = 0; r < TILE_RY; ++r) sum[r] += p[r];
                for (int i = 0; i < CW; ++i) {
                    const float val = vs[j * DP + tx + NX * i];
                    for (int r = 0; r < TILE_RY; ++r) acc[r][i] = fma(p[r], val, acc[r][i]);
                }
            }
        } else {
            for (int j = 0; j < LOC_KEYS; ++j) {
                float p[TILE_RY];
                for (int y = 0; y < RQ; ++y) vstore4(vload4(0, ps + j * LOC_ROWS + 4 * (ty + NY * y)), y, p);
                int vis[TILE_RY];
                for (int r = 0; r < TILE_RY; ++r) {
                    sum[r] += p[r];
                    vis[r] = j0 + j >= range[r].x && j0 + j <= range[r].y;
                }
                for (int i = 0; i < CW; ++i) {
                    const float val = vs[j * DP + tx + NX * i];
                    for (int r = 0; r < TILE_RY; ++r) acc[r][i] = vis[r] ? fma(p[r], val, acc[r][i]) : acc[r][i];
                }
            }
        }
        for (int r = 0; r < TILE_RY; ++r) l[r] += sum[r];
    }
    IHA_PROBE_EXPECT(j0 > hi_max + IHA_PROBE_PAST * LOC_KEYS);

    for (int r = 0; r < TILE_RY; ++r) {
        const int t = t0 + ROW_OF(ty, r);
        if (t >= T) continue;
        /* l = 0 (no score was finite) or NaN makes the row NaN, as in attention_fwd_f32. */
        const float inv = 1.0f / l[r];
        __global float *orow = o + o_off + ((size_t)bh * T + t) * HEAD_DIM;
        for (int i = 0; i < CW; ++i)
            if (tx + NX * i < HEAD_DIM) orow[tx + NX * i] = acc[r][i] * inv;
        if (want_lse && tx == 0)
            lse[lse_off + (size_t)bh * T + t] = l[r] > 0.0f ? (m[r] + log2(l[r])) * M_LN2_F : NAN;
    }
    IHA_PROBE_CHECK();
}
