/* The attention backward for GPUs with local-memory tiles and 4 x 4 register sub-tiles, the
 * FlashAttention-2 split in two passes with one writer per output row and no atomics (the
 * computation is that of cl/attention_backward.cl, after its attention_bwd_rowdot_f32 has
 * written Dt):
 *  - attention_bwd_dkv_local_f32: a work-group owns BWL_KEYS key rows of one (b, h), keeps their
 *    keys and values in local memory, and streams the queries, dO, LSE and Dt of the query tiles
 *    that can see them in tiles of BWL_QUERIES rows. Work-item (ky, qx) of the NK x NQ grid
 *    computes scores and dP of keys 4ky..4ky+3 against queries 4qx..4qx+3 (16 FMAs per two float4
 *    loads each), and owns columns qx, qx + NQ, ... of those keys' dK and dV.
 *  - attention_bwd_dq_local_f32: a work-group owns BWL_ROWS query rows and streams the keys and
 *    values they see in tiles of BWL_TILE_KEYS; work-item (qy, kx) computes 4 queries x 4 keys
 *    and owns columns kx, kx + NK, ... of its queries' dQ.
 * Recomputing the scores and dP in both passes costs twice the pair FMAs of one fused pass, but
 * a fused pass needs atomics (or partial sums) for dQ; the row kernels pay the same.
 *
 * Why tiles: each value loaded from local memory feeds 4 FMAs (8 for the score sub-tiles), where
 * the row kernels' feeds one, so on GPUs arithmetic rather than local or global loads bounds it.
 *
 * Arrays whose float4 loads run along 4 rows or keys are [column][row] with a row stride of
 * the tile plus 4: 16-byte aligned, and the column reads of the accumulation (consecutive work-
 * items, consecutive columns) fall into distinct banks. Columns from HEAD_DIM to the padded
 * width are zeros, never stored. Masks: the visible interval of doc/spec.md (cl/masks.clh);
 * invisible pairs are selected away, never multiplied by 0, so non-finite values of keys or
 * queries outside a pair's interval contribute nothing. */
#include "loop_probe.clh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined by the host"
#endif

#include "masks.clh"

/* Per-pass parameters; the host defines those of the pass it builds. */
#ifndef BWL_KEYS
#define BWL_KEYS 32 /* dK/dV: key rows per work-group, a multiple of 4 */
#endif
#ifndef BWL_QUERIES
#define BWL_QUERIES 32 /* dK/dV: query rows per tile, a multiple of 4 */
#endif
#ifndef BWL_ROWS
#define BWL_ROWS 32 /* dQ: query rows per work-group, a multiple of 4 */
#endif
#ifndef BWL_TILE_KEYS
#define BWL_TILE_KEYS 32 /* dQ: keys per tile, a multiple of 4 */
#endif
#if BWL_KEYS % 4 || BWL_QUERIES % 4 || BWL_ROWS % 4 || BWL_TILE_KEYS % 4
#error "the backward tiles must be multiples of 4"
#endif

#define PAD_TO(x, n) (((x) + (n) - 1) / (n) * (n))

/* A query row's LSE, -inf past T: such rows, like rows that saw no key, have no pair. */
static inline float lse_at(const __global float *l, int t, int T) { return t < T ? l[t] : -INFINITY; }

/* ---- dK and dV ---- */
#define KV_NK (BWL_KEYS / 4)    /* work-items across keys */
#define KV_NQ (BWL_QUERIES / 4) /* work-items across queries and output columns */
#define KV_THREADS (KV_NK * KV_NQ)
#define KV_DP PAD_TO(HEAD_DIM, KV_NQ)
#define KV_CW (KV_DP / KV_NQ)
#define KV_KS (BWL_KEYS + 4)    /* row stride of the [column][key] arrays */
#define KV_QS (BWL_QUERIES + 4) /* of the [column][query] arrays */

__kernel __attribute__((reqd_work_group_size(KV_THREADS, 1, 1)))
void attention_bwd_dkv_local_f32(__global const float *q, ulong q_off,     /* [B*H][T][HEAD_DIM] */
                                 __global const float *k, ulong k_off,     /* [B*H][T][HEAD_DIM] */
                                 __global const float *v, ulong v_off,     /* [B*H][T][HEAD_DIM] */
                                 __global const float *dout, ulong d_off,  /* [B*H][T][HEAD_DIM] */
                                 __global const float *lse, ulong lse_off, /* [B*H][T] natural log */
                                 __global const float *delta,              /* [B*H][T] */
                                 __global float *dk, ulong dk_off,         /* [B*H][T][HEAD_DIM] */
                                 __global float *dv, ulong dv_off,         /* [B*H][T][HEAD_DIM] */
                                 int T, int P, int mask, int window, float scale IHA_SEQ_PARAMS IHA_PROBE_PARAMS)
{
    __local float ks[KV_DP * KV_KS];             /* keys [column][key] */
    __local float vs[KV_DP * KV_KS];             /* values [column][key] */
    __local float qs[KV_DP * KV_QS];             /* queries times scale [column][query] */
    __local float gs[KV_DP * KV_QS];             /* dO [column][query] */
    __local float ps[BWL_QUERIES * KV_KS];       /* probabilities [query][key] */
    __local float dss[BWL_QUERIES * KV_KS];      /* dS [query][key] */
    const int lid = get_local_id(0);
    const int qx = lid % KV_NQ, ky = lid / KV_NQ;
    const int u0 = get_group_id(0) * BWL_KEYS;
    const int bh = get_global_id(1);
    const size_t base = (size_t)bh * T * HEAD_DIM;
    const __global float *qb = q + q_off + base, *gb = dout + d_off + base;
    const __global float *lb = lse + lse_off + (size_t)bh * T, *db = delta + (size_t)bh * T;
    const __global int2 *seq = seq_row(seq_bounds, seq_heads, bh, T, P);

    /* This group's keys and values, zeros past T and in the padding columns. */
    for (int i = lid; i < BWL_KEYS * KV_DP; i += KV_THREADS) {
        const int r = i / KV_DP, c = i % KV_DP;
        const int in = u0 + r < T && c < HEAD_DIM;
        const size_t at = base + (size_t)(u0 + r) * HEAD_DIM + c;
        ks[c * KV_KS + r] = in ? k[k_off + at] : 0.0f;
        vs[c * KV_KS + r] = in ? v[v_off + at] : 0.0f;
    }

    /* The queries that see each of this work-item's keys (empty past T). */
    int2 sees[4];
    float dk_acc[4][KV_CW], dv_acc[4][KV_CW];
    for (int r = 0; r < 4; ++r) {
        const int u = u0 + 4 * ky + r;
        sees[r] = u < T ? seeing_queries_in(u, T, P, mask, window, seq) : (int2)(T, -1);
        for (int i = 0; i < KV_CW; ++i) dk_acc[r][i] = dv_acc[r][i] = 0.0f;
    }
    /* Both ends are non-decreasing in the key, so the group's first and last keys bound the
     * queries of every tile it walks; the same for every work-item, like the barriers. */
    const int lo_min = seeing_queries_in(u0, T, P, mask, window, seq).x;
    const int hi_max = seeing_queries_in(min(u0 + BWL_KEYS - 1, T - 1), T, P, mask, window, seq).y;

    int t0 = lo_min / BWL_QUERIES * BWL_QUERIES;
    for (; t0 <= hi_max + IHA_PROBE_PAST * BWL_QUERIES; t0 += BWL_QUERIES) {
        IHA_PROBE_SKIP_PAST(t0 > hi_max); /* uniform across the group, like the barriers */
        barrier(CLK_LOCAL_MEM_FENCE);     /* the previous tile is no longer read */
        /* Query rows past T or with LSE = -inf (no visible key) load as zeros: their
         * probabilities are selected to 0, and 0 times their values must not be NaN. */
        for (int i = lid; i < BWL_QUERIES * KV_DP; i += KV_THREADS) {
            const int r = i / KV_DP, c = i % KV_DP, t = t0 + r;
            const int in = c < HEAD_DIM && lse_at(lb, t, T) != -INFINITY;
            const size_t at = (size_t)t * HEAD_DIM + c;
            qs[c * KV_QS + r] = in ? qb[at] * scale : 0.0f;
            gs[c * KV_QS + r] = in ? gb[at] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* s[r], dp[r]: key 4ky + r against queries 4qx..4qx+3. */
        float4 s[4], dp[4];
        for (int r = 0; r < 4; ++r) s[r] = dp[r] = (float4)(0.0f);
        for (int c = 0; c < HEAD_DIM; ++c) {
            const float4 kk = vload4(0, ks + c * KV_KS + 4 * ky), vv = vload4(0, vs + c * KV_KS + 4 * ky);
            const float4 qq = vload4(0, qs + c * KV_QS + 4 * qx), gg = vload4(0, gs + c * KV_QS + 4 * qx);
            s[0] = fma((float4)(kk.x), qq, s[0]);
            s[1] = fma((float4)(kk.y), qq, s[1]);
            s[2] = fma((float4)(kk.z), qq, s[2]);
            s[3] = fma((float4)(kk.w), qq, s[3]);
            dp[0] = fma((float4)(vv.x), gg, dp[0]);
            dp[1] = fma((float4)(vv.y), gg, dp[1]);
            dp[2] = fma((float4)(vv.z), gg, dp[2]);
            dp[3] = fma((float4)(vv.w), gg, dp[3]);
        }
        const int tq = t0 + 4 * qx;
        const int4 query = (int4)(tq) + (int4)(0, 1, 2, 3);
        const float4 l = (float4)(lse_at(lb, tq, T), lse_at(lb, tq + 1, T), lse_at(lb, tq + 2, T), lse_at(lb, tq + 3, T));
        const float4 dt = (float4)(tq < T ? db[tq] : 0.0f, tq + 1 < T ? db[tq + 1] : 0.0f,
                                   tq + 2 < T ? db[tq + 2] : 0.0f, tq + 3 < T ? db[tq + 3] : 0.0f);
        float4 p[4], ds[4];
        for (int r = 0; r < 4; ++r) {
            const int4 vis = query >= (int4)(sees[r].x) && query <= (int4)(sees[r].y) && l != (float4)(-INFINITY);
            p[r] = select((float4)(0.0f), exp(s[r] - l), vis);
            ds[r] = select((float4)(0.0f), p[r] * (dp[r] - dt), vis);
        }
        vstore4((float4)(p[0].x, p[1].x, p[2].x, p[3].x), 0, ps + (4 * qx + 0) * KV_KS + 4 * ky);
        vstore4((float4)(p[0].y, p[1].y, p[2].y, p[3].y), 0, ps + (4 * qx + 1) * KV_KS + 4 * ky);
        vstore4((float4)(p[0].z, p[1].z, p[2].z, p[3].z), 0, ps + (4 * qx + 2) * KV_KS + 4 * ky);
        vstore4((float4)(p[0].w, p[1].w, p[2].w, p[3].w), 0, ps + (4 * qx + 3) * KV_KS + 4 * ky);
        vstore4((float4)(ds[0].x, ds[1].x, ds[2].x, ds[3].x), 0, dss + (4 * qx + 0) * KV_KS + 4 * ky);
        vstore4((float4)(ds[0].y, ds[1].y, ds[2].y, ds[3].y), 0, dss + (4 * qx + 1) * KV_KS + 4 * ky);
        vstore4((float4)(ds[0].z, ds[1].z, ds[2].z, ds[3].z), 0, dss + (4 * qx + 2) * KV_KS + 4 * ky);
        vstore4((float4)(ds[0].w, ds[1].w, ds[2].w, ds[3].w), 0, dss + (4 * qx + 3) * KV_KS + 4 * ky);
        barrier(CLK_LOCAL_MEM_FENCE);

        /* dV += P^T dO, dK += dS^T (scale Q). Where every query of the tile sees all four keys
         * the products need no select; elsewhere each is selected by its key's interval. */
        int whole = 1;
        for (int r = 0; r < 4; ++r) whole &= t0 >= sees[r].x && t0 + BWL_QUERIES - 1 <= sees[r].y;
        if (whole) {
            for (int j = 0; j < BWL_QUERIES; ++j) {
                const float4 pj = vload4(0, ps + j * KV_KS + 4 * ky), dj = vload4(0, dss + j * KV_KS + 4 * ky);
                for (int i = 0; i < KV_CW; ++i) {
                    const float g = gs[(qx + KV_NQ * i) * KV_QS + j], qv = qs[(qx + KV_NQ * i) * KV_QS + j];
                    dv_acc[0][i] = fma(pj.x, g, dv_acc[0][i]);
                    dv_acc[1][i] = fma(pj.y, g, dv_acc[1][i]);
                    dv_acc[2][i] = fma(pj.z, g, dv_acc[2][i]);
                    dv_acc[3][i] = fma(pj.w, g, dv_acc[3][i]);
                    dk_acc[0][i] = fma(dj.x, qv, dk_acc[0][i]);
                    dk_acc[1][i] = fma(dj.y, qv, dk_acc[1][i]);
                    dk_acc[2][i] = fma(dj.z, qv, dk_acc[2][i]);
                    dk_acc[3][i] = fma(dj.w, qv, dk_acc[3][i]);
                }
            }
        } else {
            for (int j = 0; j < BWL_QUERIES; ++j) {
                const float4 pj = vload4(0, ps + j * KV_KS + 4 * ky), dj = vload4(0, dss + j * KV_KS + 4 * ky);
                const int t = t0 + j;
                int vis[4];
                for (int r = 0; r < 4; ++r) vis[r] = t >= sees[r].x && t <= sees[r].y;
                for (int i = 0; i < KV_CW; ++i) {
                    const float g = gs[(qx + KV_NQ * i) * KV_QS + j], qv = qs[(qx + KV_NQ * i) * KV_QS + j];
                    dv_acc[0][i] = vis[0] ? fma(pj.x, g, dv_acc[0][i]) : dv_acc[0][i];
                    dv_acc[1][i] = vis[1] ? fma(pj.y, g, dv_acc[1][i]) : dv_acc[1][i];
                    dv_acc[2][i] = vis[2] ? fma(pj.z, g, dv_acc[2][i]) : dv_acc[2][i];
                    dv_acc[3][i] = vis[3] ? fma(pj.w, g, dv_acc[3][i]) : dv_acc[3][i];
                    dk_acc[0][i] = vis[0] ? fma(dj.x, qv, dk_acc[0][i]) : dk_acc[0][i];
                    dk_acc[1][i] = vis[1] ? fma(dj.y, qv, dk_acc[1][i]) : dk_acc[1][i];
                    dk_acc[2][i] = vis[2] ? fma(dj.z, qv, dk_acc[2][i]) : dk_acc[2][i];
                    dk_acc[3][i] = vis[3] ? fma(dj.w, qv, dk_acc[3][i]) : dk_acc[3][i];
                }
            }
        }
    }
    IHA_PROBE_EXPECT(t0 > hi_max + IHA_PROBE_PAST * BWL_QUERIES);

    for (int r = 0; r < 4; ++r) {
        const int u = u0 + 4 * ky + r;
        if (u >= T) break;
        __global float *dkrow = dk + dk_off + base + (size_t)u * HEAD_DIM;
        __global float *dvrow = dv + dv_off + base + (size_t)u * HEAD_DIM;
        for (int i = 0; i < KV_CW; ++i) {
            const int c = qx + KV_NQ * i;
            if (c < HEAD_DIM) {
                dkrow[c] = dk_acc[r][i];
                dvrow[c] = dv_acc[r][i];
            }
        }
    }
    IHA_PROBE_CHECK();
}

/* ---- dQ ---- */
#define Q_NQ (BWL_ROWS / 4)      /* work-items across queries */
#define Q_NK (BWL_TILE_KEYS / 4) /* work-items across keys and output columns */
#define Q_THREADS (Q_NQ * Q_NK)
#define Q_DP PAD_TO(HEAD_DIM, Q_NK)
#define Q_CW (Q_DP / Q_NK)
#define Q_QS (BWL_ROWS + 4)      /* row stride of the [column][query] arrays */
#define Q_KS (BWL_TILE_KEYS + 4) /* of the [column][key] arrays */

__kernel __attribute__((reqd_work_group_size(Q_THREADS, 1, 1)))
void attention_bwd_dq_local_f32(__global const float *q, ulong q_off,     /* [B*H][T][HEAD_DIM] */
                                __global const float *k, ulong k_off,     /* [B*H][T][HEAD_DIM] */
                                __global const float *v, ulong v_off,     /* [B*H][T][HEAD_DIM] */
                                __global const float *dout, ulong d_off,  /* [B*H][T][HEAD_DIM] */
                                __global const float *lse, ulong lse_off, /* [B*H][T] natural log */
                                __global const float *delta,              /* [B*H][T] */
                                __global float *dq, ulong dq_off,         /* [B*H][T][HEAD_DIM] */
                                int T, int P, int mask, int window, float scale IHA_SEQ_PARAMS IHA_PROBE_PARAMS)
{
    __local float qs[Q_DP * Q_QS];            /* queries [column][query] */
    __local float gs[Q_DP * Q_QS];            /* dO [column][query] */
    __local float ks[Q_DP * Q_KS];            /* keys times scale [column][key] */
    __local float vs[Q_DP * Q_KS];            /* values [column][key] */
    __local float dss[BWL_TILE_KEYS * Q_QS];  /* dS [key][query] */
    const int lid = get_local_id(0);
    const int kx = lid % Q_NK, qy = lid / Q_NK;
    const int t0 = get_group_id(0) * BWL_ROWS;
    const int bh = get_global_id(1);
    const size_t base = (size_t)bh * T * HEAD_DIM;
    const __global float *kb = k + k_off + base, *vb = v + v_off + base;
    const __global float *lb = lse + lse_off + (size_t)bh * T, *db = delta + (size_t)bh * T;
    const __global int2 *seq = seq_row(seq_bounds, seq_heads, bh, T, P);

    for (int i = lid; i < BWL_ROWS * Q_DP; i += Q_THREADS) {
        const int r = i / Q_DP, c = i % Q_DP;
        const int in = t0 + r < T && c < HEAD_DIM;
        const size_t at = base + (size_t)(t0 + r) * HEAD_DIM + c;
        qs[c * Q_QS + r] = in ? q[q_off + at] : 0.0f;
        gs[c * Q_QS + r] = in ? dout[d_off + at] : 0.0f;
    }

    /* The keys each of this work-item's queries sees: empty past T and for a row that saw no
     * key (LSE = -inf), whose gradient is 0. */
    int2 range[4];
    float l[4], dt[4], acc[4][Q_CW];
    for (int r = 0; r < 4; ++r) {
        const int t = t0 + 4 * qy + r;
        l[r] = lse_at(lb, t, T);
        dt[r] = t < T ? db[t] : 0.0f;
        range[r] = l[r] != -INFINITY ? visible_keys(t, T, P, mask, window, seq) : (int2)(T, -1);
        for (int i = 0; i < Q_CW; ++i) acc[r][i] = 0.0f;
    }
    const int lo_min = visible_keys(t0, T, P, mask, window, seq).x;
    const int hi_max = visible_keys(min(t0 + BWL_ROWS - 1, T - 1), T, P, mask, window, seq).y;

    int j0 = lo_min / BWL_TILE_KEYS * BWL_TILE_KEYS;
    for (; j0 <= hi_max + IHA_PROBE_PAST * BWL_TILE_KEYS; j0 += BWL_TILE_KEYS) {
        IHA_PROBE_SKIP_PAST(j0 > hi_max);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = lid; i < BWL_TILE_KEYS * Q_DP; i += Q_THREADS) {
            const int r = i / Q_DP, c = i % Q_DP;
            const int in = j0 + r < T && c < HEAD_DIM;
            const size_t at = (size_t)(j0 + r) * HEAD_DIM + c;
            ks[c * Q_KS + r] = in ? kb[at] * scale : 0.0f;
            vs[c * Q_KS + r] = in ? vb[at] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* s[r], dp[r]: query 4qy + r against keys 4kx..4kx+3. */
        float4 s[4], dp[4];
        for (int r = 0; r < 4; ++r) s[r] = dp[r] = (float4)(0.0f);
        for (int c = 0; c < HEAD_DIM; ++c) {
            const float4 qq = vload4(0, qs + c * Q_QS + 4 * qy), gg = vload4(0, gs + c * Q_QS + 4 * qy);
            const float4 kk = vload4(0, ks + c * Q_KS + 4 * kx), vv = vload4(0, vs + c * Q_KS + 4 * kx);
            s[0] = fma((float4)(qq.x), kk, s[0]);
            s[1] = fma((float4)(qq.y), kk, s[1]);
            s[2] = fma((float4)(qq.z), kk, s[2]);
            s[3] = fma((float4)(qq.w), kk, s[3]);
            dp[0] = fma((float4)(gg.x), vv, dp[0]);
            dp[1] = fma((float4)(gg.y), vv, dp[1]);
            dp[2] = fma((float4)(gg.z), vv, dp[2]);
            dp[3] = fma((float4)(gg.w), vv, dp[3]);
        }
        const int4 key = (int4)(j0 + 4 * kx) + (int4)(0, 1, 2, 3);
        float4 ds[4];
        for (int r = 0; r < 4; ++r) {
            const int4 vis = key >= (int4)(range[r].x) && key <= (int4)(range[r].y);
            const float4 p = exp(s[r] - (float4)(l[r]));
            ds[r] = select((float4)(0.0f), p * (dp[r] - (float4)(dt[r])), vis);
        }
        vstore4((float4)(ds[0].x, ds[1].x, ds[2].x, ds[3].x), 0, dss + (4 * kx + 0) * Q_QS + 4 * qy);
        vstore4((float4)(ds[0].y, ds[1].y, ds[2].y, ds[3].y), 0, dss + (4 * kx + 1) * Q_QS + 4 * qy);
        vstore4((float4)(ds[0].z, ds[1].z, ds[2].z, ds[3].z), 0, dss + (4 * kx + 2) * Q_QS + 4 * qy);
        vstore4((float4)(ds[0].w, ds[1].w, ds[2].w, ds[3].w), 0, dss + (4 * kx + 3) * Q_QS + 4 * qy);
        barrier(CLK_LOCAL_MEM_FENCE);

        /* dQ += dS (scale K), selected by each row's interval where the tile is not wholly
         * inside all four. */
        int whole = 1;
        for (int r = 0; r < 4; ++r) whole &= j0 >= range[r].x && j0 + BWL_TILE_KEYS - 1 <= range[r].y;
        if (whole) {
            for (int j = 0; j < BWL_TILE_KEYS; ++j) {
                const float4 dj = vload4(0, dss + j * Q_QS + 4 * qy);
                for (int i = 0; i < Q_CW; ++i) {
                    const float kv = ks[(kx + Q_NK * i) * Q_KS + j];
                    acc[0][i] = fma(dj.x, kv, acc[0][i]);
                    acc[1][i] = fma(dj.y, kv, acc[1][i]);
                    acc[2][i] = fma(dj.z, kv, acc[2][i]);
                    acc[3][i] = fma(dj.w, kv, acc[3][i]);
                }
            }
        } else {
            for (int j = 0; j < BWL_TILE_KEYS; ++j) {
                const float4 dj = vload4(0, dss + j * Q_QS + 4 * qy);
                const int u = j0 + j;
                int vis[4];
                for (int r = 0; r < 4; ++r) vis[r] = u >= range[r].x && u <= range[r].y;
                for (int i = 0; i < Q_CW; ++i) {
                    const float kv = ks[(kx + Q_NK * i) * Q_KS + j];
                    acc[0][i] = vis[0] ? fma(dj.x, kv, acc[0][i]) : acc[0][i];
                    acc[1][i] = vis[1] ? fma(dj.y, kv, acc[1][i]) : acc[1][i];
                    acc[2][i] = vis[2] ? fma(dj.z, kv, acc[2][i]) : acc[2][i];
                    acc[3][i] = vis[3] ? fma(dj.w, kv, acc[3][i]) : acc[3][i];
                }
            }
        }
    }
    IHA_PROBE_EXPECT(j0 > hi_max + IHA_PROBE_PAST * BWL_TILE_KEYS);

    for (int r = 0; r < 4; ++r) {
        const int t = t0 + 4 * qy + r;
        if (t >= T) break;
        __global float *row = dq + dq_off + base + (size_t)t * HEAD_DIM;
        for (int i = 0; i < Q_CW; ++i)
            if (kx + Q_NK * i < HEAD_DIM) row[kx + Q_NK * i] = acc[r][i];
    }
    IHA_PROBE_CHECK();
}
