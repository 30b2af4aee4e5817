/* Flash attention for GPUs: a work-group of LOC_ROWS work-items owns LOC_ROWS consecutive
 * query rows (one each) of one (b, h) and streams the keys and values it can see through local
 * memory in tiles of LOC_KEYS keys, loaded cooperatively (consecutive work-items read
 * consecutive addresses, so the loads coalesce) and then read by every work-item at the same
 * address (a broadcast, free of bank conflicts). Each work-item keeps its query row, its output
 * row and the online-softmax state (max, sum) in private memory.
 *
 * attention.cl's register-tile kernel is the CPU variant: on a CPU local memory is emulated in
 * global memory and a work-item is a loop iteration, so staging buys nothing there; on a GPU
 * the register tile's private arrays are too large and the work-group's shared tile is what
 * saves global traffic (each key and value is read from global memory once per LOC_ROWS
 * queries instead of once per query). The autotuner picks between the two per device.
 *
 * Inputs are those of attention_fwd_f32: queries and values as rows [B*H][T][HEAD_DIM], keys in
 * the key-block layout [B*H][ceil(T/ATT_KB)][HEAD_DIM][ATT_KB]. Masks and windows are the
 * per-row visible interval [lo, hi] of doc/spec.md; key tiles outside the work-group's union of
 * intervals are skipped, tiles outside one row's interval are skipped by that row. */
#include "loop_probe.clh"
#include "attention_args.clh"

#ifndef LOC_ROWS
#define LOC_ROWS 64 /* work-items per work-group = query rows per work-group */
#endif
#ifndef LOC_KEYS
#define LOC_KEYS 32 /* keys per local-memory tile, a multiple of ATT_KB */
#endif
#if LOC_KEYS % ATT_KB != 0
#error "LOC_KEYS must be a multiple of ATT_KB"
#endif

#ifndef LOC_CHUNK
#define LOC_CHUNK 8 /* keys whose scores are live at once, a divisor of LOC_KEYS */
#endif
#if LOC_KEYS % LOC_CHUNK != 0
#error "LOC_KEYS must be a multiple of LOC_CHUNK"
#endif
#include "masks.clh"

__kernel __attribute__((reqd_work_group_size(LOC_ROWS, 1, 1)))
void attention_fwd_local_f32(ATTENTION_LOCAL_ARGS IHA_PROBE_PARAMS)
{
    __local float ks[LOC_KEYS * HEAD_DIM]; /* the packed layout's blocks, as stored */
    __local float vs[LOC_KEYS * HEAD_DIM]; /* value rows [key][HEAD_DIM] */
    const int lid = get_local_id(0);
    const int t0 = get_group_id(0) * LOC_ROWS;
    const int t = t0 + lid;
    const int bh = get_global_id(1);
    const int active = t < T;
    const int row = min(t, T - 1);
    const int blocks = (T + ATT_KB - 1) / ATT_KB;
    const __global float *qb = q + q_off + (size_t)bh * T * HEAD_DIM;
    const __global float *kb = kp + k_off + (size_t)bh * blocks * HEAD_DIM * ATT_KB;
    const __global float *vb = v + v_off + (size_t)bh * T * HEAD_DIM;
    const __global int2 *seq = seq_row(seq_bounds, seq_heads, bh, T, P);

    float qr[HEAD_DIM], acc[HEAD_DIM];
    for (int c = 0; c < HEAD_DIM; ++c) {
        qr[c] = qb[(size_t)row * HEAD_DIM + c] * scale_log2;
        acc[c] = 0.0f;
    }
    const int2 range = visible_keys(row, T, P, mask, window, seq);
    /* The same for every work-item of the group, so the barriers below are reached uniformly. */
    const int lo_min = visible_keys(t0, T, P, mask, window, seq).x;
    const int hi_max = visible_keys(min(t0 + LOC_ROWS - 1, T - 1), T, P, mask, window, seq).y;
    float m = -INFINITY, l = 0.0f;

    int j0 = lo_min / LOC_KEYS * LOC_KEYS;
    for (; j0 <= hi_max + IHA_PROBE_PAST * LOC_KEYS; j0 += LOC_KEYS) {
        IHA_PROBE_SKIP_PAST(j0 > hi_max); /* uniform across the group, like the barriers */
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile is no longer read */
        /* A tile is LOC_KEYS / ATT_KB whole blocks: contiguous in the packed buffer. Blocks past
         * the last one and value rows past T are not there; zeros keep the reads in bounds. */
        const __global float *ksrc = kb + (size_t)(j0 / ATT_KB) * HEAD_DIM * ATT_KB;
        const __global float *vsrc = vb + (size_t)j0 * HEAD_DIM;
        const int kavail = min(LOC_KEYS, blocks * ATT_KB - j0) * HEAD_DIM;
        const int vavail = min(LOC_KEYS, T - j0) * HEAD_DIM;
        for (int i = lid; i < LOC_KEYS * HEAD_DIM; i += LOC_ROWS) {
            ks[i] = i < kavail ? ksrc[i] : 0.0f;
            vs[i] = i < vavail ? vsrc[i] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!active || j0 > range.y || j0 + LOC_KEYS - 1 < range.x) continue;

        /* Keys in chunks of LOC_CHUNK: only one chunk's scores are live, so private state is the
         * query row, acc and LOC_CHUNK scores rather than LOC_KEYS, which leaves registers for
         * more work-items in flight. A chunk with no
         * visible key changes nothing and is skipped. */
        for (int j1 = 0; j1 < LOC_KEYS; j1 += LOC_CHUNK) {
            if (j0 + j1 > range.y || j0 + j1 + LOC_CHUNK - 1 < range.x) continue;
            float s[LOC_CHUNK];
            float mx = -INFINITY;
            for (int jj = 0; jj < LOC_CHUNK; ++jj) {
                const int j = j1 + jj;
                const __local float *kcol = ks + (j / ATT_KB) * HEAD_DIM * ATT_KB + j % ATT_KB;
                float dot = 0.0f;
                for (int c = 0; c < HEAD_DIM; ++c) dot = fma(qr[c], kcol[c * ATT_KB], dot);
                if (dot == -INFINITY) { /* overflow or an infinite input: see SCORE_SHRINK */
                    float t = 0.0f;
                    for (int c = 0; c < HEAD_DIM; ++c) t = fma(qr[c] * SCORE_SHRINK, kcol[c * ATT_KB] * SCORE_SHRINK, t);
                    if (isfinite(t)) dot = NAN;
                }
                const int key = j0 + j;
                /* A select, not arithmetic: keys outside the interval (padding included) never
                 * contribute, whatever their bits. */
                s[jj] = key >= range.x && key <= range.y ? dot : -INFINITY;
                mx = fmax(mx, s[jj]);
            }
            /* fmax passes over a NaN score, whose exponential below is NaN. While every visible
             * score so far is -inf, m stays -inf and base 0 makes their exponentials exactly 0
             * instead of NaN. */
            const float m_new = fmax(m, mx);
            const float base = m_new == -INFINITY ? 0.0f : m_new;
            const float corr = exp2(m - base);
            l *= corr;
            for (int c = 0; c < HEAD_DIM; ++c) acc[c] *= corr;
            for (int jj = 0; jj < LOC_CHUNK; ++jj) {
                const int key = j0 + j1 + jj;
                /* Masked keys (padding included) are skipped: 0 times an infinite or NaN value
                 * would be NaN, and doc/spec.md's masked keys contribute nothing. */
                if (key < range.x || key > range.y) continue;
                const float p = exp2(s[jj] - base);
                l += p;
                const __local float *vrow = vs + (j1 + jj) * HEAD_DIM;
                for (int c = 0; c < HEAD_DIM; ++c) acc[c] = fma(p, vrow[c], acc[c]);
            }
            m = m_new;
        }
    }
    IHA_PROBE_EXPECT(j0 > hi_max + IHA_PROBE_PAST * LOC_KEYS);

    if (!active) {
        IHA_PROBE_CHECK();
        return;
    }
    /* l = 0 (no score was finite) or NaN makes the row NaN, and its LSE NaN, as in
     * attention_fwd_f32 (doc/numerics.md). */
    const float inv = 1.0f / l;
    __global float *orow = o + o_off + ((size_t)bh * T + t) * HEAD_DIM;
    for (int c = 0; c < HEAD_DIM; ++c) orow[c] = acc[c] * inv;
    if (want_lse) lse[lse_off + (size_t)bh * T + t] = l > 0.0f ? (m + log2(l)) * M_LN2_F : NAN;
    IHA_PROBE_CHECK();
}
