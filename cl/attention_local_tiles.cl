/* Flash attention for GPUs with register sub-tiles: a work-group owns TILE_ROWS consecutive
 * query rows of one (b, h) and streams the keys and values they can see through local memory in
 * tiles of TILE_KEYS keys. Its work-items form a grid of NY x NX: work-item (ty, tx) computes the
 * scores of rows 4ty..4ty+3 against keys 4tx..4tx+3 of the tile, and owns the output columns
 * tx, tx + NX, ... of the same rows.
 *
 * Why: attention_local.cl gives each work-item one whole row, so every FMA needs a load from
 * local memory (the key or value element), and local memory, not arithmetic, bounds it, far
 * below a GPU's FMA peak. Here a score sub-tile takes 16 FMAs per two
 * float4 loads (4 rows of the query tile, 4 keys), and the output sub-tile 4 FMAs per value
 * element loaded (the 4 probabilities come in one float4). The price is the query tile in local
 * memory and row maxima and sums reduced across the NX work-items that share a row.
 *
 * Inputs and outputs are those of attention_fwd_f32 and attention_fwd_local_f32: queries and
 * values as rows [B*H][T][HEAD_DIM], keys in the key-block layout [B*H][ceil(T/ATT_KB)][HEAD_DIM]
 * [ATT_KB]. Masks and windows are the per-row visible interval [lo, hi] of doc/spec.md; key tiles outside
 * the work-group's union of intervals are skipped. */
#include "loop_probe.clh"
#include "attention_args.clh"

#ifndef TILE_ROWS
#define TILE_ROWS 64 /* query rows per work-group, a multiple of 4 */
#endif
#ifndef TILE_KEYS
#define TILE_KEYS 32 /* keys per local tile, a multiple of 4 and of ATT_KB */
#endif
#if TILE_ROWS % 4 != 0 || TILE_KEYS % 4 != 0 || TILE_KEYS % ATT_KB != 0
#error "TILE_ROWS and TILE_KEYS must be multiples of 4, TILE_KEYS of ATT_KB"
#endif

#define NX (TILE_KEYS / 4)                          /* work-items across keys and columns */
#define NY (TILE_ROWS / 4)                          /* work-items across rows */
#define THREADS (NX * NY)
#define DP ((HEAD_DIM + NX - 1) / NX * NX)         /* head width padded to whole column sets */
#define CW (DP / NX)                                /* output columns per work-item */

#include "masks.clh"

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void attention_fwd_local_tiles_f32(ATTENTION_LOCAL_ARGS IHA_PROBE_PARAMS)
{
    __local float qs[DP * TILE_ROWS];        /* [column][row], scaled: a float4 is 4 rows */
    __local float ks[DP * TILE_KEYS];        /* [column][key]: a float4 is 4 keys */
    __local float vs[TILE_KEYS * DP];        /* [key][column] */
    __local float ps[TILE_KEYS * TILE_ROWS]; /* probabilities [key][row]: a float4 is 4 rows */
    __local float red_max[TILE_ROWS * NX];   /* per row, one partial per work-item across */
    __local float red_sum[TILE_ROWS * NX];
    const int lid = get_local_id(0);
    const int tx = lid % NX, ty = lid / NX;
    const int t0 = get_group_id(0) * TILE_ROWS;
    const int bh = get_global_id(1);
    const int blocks = (T + ATT_KB - 1) / ATT_KB;
    const __global float *qb = q + q_off + (size_t)bh * T * HEAD_DIM;
    const __global float *kb = kp + k_off + (size_t)bh * blocks * HEAD_DIM * ATT_KB;
    const __global float *vb = v + v_off + (size_t)bh * T * HEAD_DIM;
    const __global int2 *seq = seq_row(seq_bounds, seq_heads, bh, T, P);

    /* The query tile, zeros past T and in the padding columns. The tile loads below write only
     * columns under HEAD_DIM, so the padding of ks and vs is zeroed here once: padded columns
     * then add 0 * 0 to every score and are never stored. */
    for (int i = lid; i < TILE_ROWS * DP; i += THREADS) {
        const int r = i / DP, c = i % DP;
        qs[c * TILE_ROWS + r] = t0 + r < T && c < HEAD_DIM ? qb[(size_t)(t0 + r) * HEAD_DIM + c] * scale_log2 : 0.0f;
    }
#if DP > HEAD_DIM
    for (int i = lid; i < (DP - HEAD_DIM) * TILE_KEYS; i += THREADS) {
        ks[HEAD_DIM * TILE_KEYS + i] = 0.0f;
        vs[(i / (DP - HEAD_DIM)) * DP + HEAD_DIM + i % (DP - HEAD_DIM)] = 0.0f;
    }
#endif

    int2 range[4];
    float m[4], l[4], acc[4][CW];
    for (int r = 0; r < 4; ++r) {
        range[r] = visible_keys(min(t0 + 4 * ty + r, T - 1), T, P, mask, window, seq);
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int i = 0; i < CW; ++i) acc[r][i] = 0.0f;
    }
    /* The same for every work-item of the group, so the barriers below are reached uniformly. */
    const int lo_min = visible_keys(t0, T, P, mask, window, seq).x;
    const int hi_max = visible_keys(min(t0 + TILE_ROWS - 1, T - 1), T, P, mask, window, seq).y;

    int j0 = lo_min / TILE_KEYS * TILE_KEYS;
    for (; j0 <= hi_max + IHA_PROBE_PAST * TILE_KEYS; j0 += TILE_KEYS) {
        IHA_PROBE_SKIP_PAST(j0 > hi_max); /* uniform across the group, like the barriers */
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile's ks, vs and ps are no longer read */
        /* TILE_KEYS / ATT_KB whole blocks, contiguous in the packed buffer ([block][c][kk]);
         * blocks past the last one and value rows past T are not there: zeros. */
        const __global float *ksrc = kb + (size_t)(j0 / ATT_KB) * HEAD_DIM * ATT_KB;
        const __global float *vsrc = vb + (size_t)j0 * HEAD_DIM;
        const int kavail = min(TILE_KEYS, blocks * ATT_KB - j0) * HEAD_DIM;
        const int vavail = min(TILE_KEYS, T - j0) * HEAD_DIM;
        for (int i = lid; i < TILE_KEYS * HEAD_DIM; i += THREADS) {
            const int rem = i % (HEAD_DIM * ATT_KB);
            ks[(rem / ATT_KB) * TILE_KEYS + i / (HEAD_DIM * ATT_KB) * ATT_KB + rem % ATT_KB] =
                i < kavail ? ksrc[i] : 0.0f;
            vs[(i / HEAD_DIM) * DP + i % HEAD_DIM] = i < vavail ? vsrc[i] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        float4 s[4] = {(float4)(0.0f), (float4)(0.0f), (float4)(0.0f), (float4)(0.0f)};
        for (int c = 0; c < DP; ++c) {
            const float4 a = vload4(0, qs + c * TILE_ROWS + 4 * ty);
            const float4 b = vload4(0, ks + c * TILE_KEYS + 4 * tx);
            s[0] = fma((float4)(a.x), b, s[0]);
            s[1] = fma((float4)(a.y), b, s[1]);
            s[2] = fma((float4)(a.z), b, s[2]);
            s[3] = fma((float4)(a.w), b, s[3]);
        }
        /* A select, not arithmetic: keys outside a row's interval (padding included) never
         * contribute, whatever their bits. */
        const int4 key = (int4)(j0 + 4 * tx) + (int4)(0, 1, 2, 3);
        /* Compares, not min/fmin, whose result OpenCL leaves undefined for infinities. */
        const int4 inf = (s[0] == (float4)(-INFINITY)) | (s[1] == (float4)(-INFINITY)) |
                         (s[2] == (float4)(-INFINITY)) | (s[3] == (float4)(-INFINITY));
        for (int r = 0; (inf.x | inf.y | inf.z | inf.w) != 0 && r < 4; ++r) { /* rare: see SCORE_SHRINK */
            float4 t = (float4)(0.0f);
            for (int c = 0; c < DP; ++c)
                t = fma((float4)(qs[c * TILE_ROWS + 4 * ty + r] * SCORE_SHRINK),
                        vload4(0, ks + c * TILE_KEYS + 4 * tx) * SCORE_SHRINK, t);
            s[r] = select(s[r], (float4)(NAN), (s[r] == (float4)(-INFINITY)) & isfinite(t));
        }
        for (int r = 0; r < 4; ++r) {
            s[r] = select((float4)(-INFINITY), s[r], key >= (int4)(range[r].x) && key <= (int4)(range[r].y));
            red_max[(4 * ty + r) * NX + tx] = fmax(fmax(s[r].x, s[r].y), fmax(s[r].z, s[r].w));
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        float corr[4];
        for (int r = 0; r < 4; ++r) {
            float mx = -INFINITY;
            for (int x = 0; x < NX; ++x) mx = fmax(mx, red_max[(4 * ty + r) * NX + x]);
            const float m_new = fmax(m[r], mx);
            /* A row that has seen no visible key keeps m = -inf; base 0 makes every exponential
             * exactly 0 instead of NaN. */
            const float base = m_new == -INFINITY ? 0.0f : m_new;
            corr[r] = exp2(m[r] - base);
            m[r] = m_new;
            const float4 p = exp2(s[r] - (float4)(base));
            ps[(4 * tx + 0) * TILE_ROWS + 4 * ty + r] = p.x;
            ps[(4 * tx + 1) * TILE_ROWS + 4 * ty + r] = p.y;
            ps[(4 * tx + 2) * TILE_ROWS + 4 * ty + r] = p.z;
            ps[(4 * tx + 3) * TILE_ROWS + 4 * ty + r] = p.w;
            red_sum[(4 * ty + r) * NX + tx] = (p.x + p.y) + (p.z + p.w);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int r = 0; r < 4; ++r) {
            float sum = 0.0f;
            for (int x = 0; x < NX; ++x) sum += red_sum[(4 * ty + r) * NX + x];
            l[r] = l[r] * corr[r] + sum;
            for (int i = 0; i < CW; ++i) acc[r][i] *= corr[r];
        }
        /* A masked key's probability is 0, but 0 times an infinite or NaN value is NaN and
         * doc/spec.md's masked keys contribute nothing: where some key of the tile is masked for one of
         * this work-item's rows, each product is selected by the row's interval. */
        int whole = 1;
        for (int r = 0; r < 4; ++r) whole &= j0 >= range[r].x && j0 + TILE_KEYS - 1 <= range[r].y;
        if (whole) {
            for (int j = 0; j < TILE_KEYS; ++j) {
                const float4 p = vload4(0, ps + j * TILE_ROWS + 4 * ty);
                for (int i = 0; i < CW; ++i) {
                    const float val = vs[j * DP + tx + NX * i];
                    acc[0][i] = fma(p.x, val, acc[0][i]);
                    acc[1][i] = fma(p.y, val, acc[1][i]);
                    acc[2][i] = fma(p.z, val, acc[2][i]);
                    acc[3][i] = fma(p.w, val, acc[3][i]);
                }
            }
        } else {
            for (int j = 0; j < TILE_KEYS; ++j) {
                const float4 p = vload4(0, ps + j * TILE_ROWS + 4 * ty);
                const int key = j0 + j;
                int vis[4];
                for (int r = 0; r < 4; ++r) vis[r] = key >= range[r].x && key <= range[r].y;
                for (int i = 0; i < CW; ++i) {
                    const float val = vs[j * DP + tx + NX * i];
                    acc[0][i] = vis[0] ? fma(p.x, val, acc[0][i]) : acc[0][i];
                    acc[1][i] = vis[1] ? fma(p.y, val, acc[1][i]) : acc[1][i];
                    acc[2][i] = vis[2] ? fma(p.z, val, acc[2][i]) : acc[2][i];
                    acc[3][i] = vis[3] ? fma(p.w, val, acc[3][i]) : acc[3][i];
                }
            }
        }
    }
    IHA_PROBE_EXPECT(j0 > hi_max + IHA_PROBE_PAST * TILE_KEYS);

    for (int r = 0; r < 4; ++r) {
        const int t = t0 + 4 * ty + r;
        if (t >= T) break;
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
