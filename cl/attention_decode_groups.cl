/* Decoding for GPUs: a work-group per (b, h, query-row tile, key split) reads the split's keys
 * and values together, so that consecutive work-items load consecutive addresses of the cache
 * and a step of one sequence still gives every compute unit several work-groups. The layouts and
 * the step vector are cl/attention_decode.cl's: keys in blocks [B*H][ceil(t_max/KB)][HEAD_DIM][KB],
 * values in rows [B*H][t_max][HEAD_DIM], step[b] = (n0, count), query rows [B*H][rows][HEAD_DIM]
 * with rows = k*P at virtual positions n0*P + row, rows past count*P inactive.
 *
 * Per tile of DEC_TILE = DEC_GROUP * DEC_KEYS keys, work-item i scores keys i, i + DEC_GROUP, ...
 * against the DEC_ROWS query rows held in local memory (for component c, a run of KB work-items
 * reads KB consecutive elements of one block); the tile's maximum per row comes from a local
 * reduction and moves the shared reference point of the online softmax; the probabilities go to
 * local memory, and P.V runs with work-items over the head's columns (value rows are contiguous,
 * so a key's row is one coalesced load), in DEC_GROUP / HEAD_DIM key groups when the group is
 * wider than the head. Each work-item keeps its own share of the exponentials' sums and of the
 * output; they are reduced once, at the end, into the split's partial softmax state, which
 * attention_decode_groups_merge_f32 combines. */
#include "loop_probe.clh"
#include "masks.clh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined by the host"
#endif
/* Keys per block of the cache's key layout: 4, 8 or 16. */
#ifndef ATT_KB
#define ATT_KB 16
#endif
/* Query rows per work-group, work-items per work-group (a power of 2, at least 32) and keys per
 * work-item and tile. */
#ifndef DEC_ROWS
#define DEC_ROWS 1
#endif
#ifndef DEC_GROUP
#define DEC_GROUP 128
#endif
#ifndef DEC_KEYS
#define DEC_KEYS 2
#endif
#ifndef KV_HALF
#define KV_HALF 0
#endif
#ifndef KV_BF16
#define KV_BF16 0
#endif
/* 1: the cache is a ring of t_max rows, t_max a multiple of ATT_KB (src/layer/kv_cache.h):
 * virtual position u sits at row u mod t_max, and a sequence's splits cover the blocks from its
 * oldest held row, max(0, T - t_max), on. */
#ifndef KV_RING
#define KV_RING 0
#endif

#if KV_HALF
#define kv_t half
#define LOAD_ONE(p, i) vload_half((i), (p))
#elif KV_BF16
#include "bf16.clh"
#define kv_t ushort
#define LOAD_ONE(p, i) bf16_load((i), (p))
#else
#define kv_t float
#define LOAD_ONE(p, i) ((p)[(i)])
#endif

#define DEC_TILE (DEC_GROUP * DEC_KEYS)
/* Columns side by side (COL_LANES), columns per work-item, and key groups in P.V. */
#define COL_LANES (DEC_GROUP < HEAD_DIM ? DEC_GROUP : HEAD_DIM)
#define COLS_PER_ITEM ((HEAD_DIM + COL_LANES - 1) / COL_LANES)
#define KEY_GROUPS (DEC_GROUP / COL_LANES)
/* Rounded up: the key groups need not divide the tile (d = 13 on 128 work-items makes 9), and
 * the last group takes the remainder. */
#define KEYS_PER_GROUP ((DEC_TILE + KEY_GROUPS - 1) / KEY_GROUPS)

/* Scores exceed the exponentials' reference point by at most this (base 2), as in attention.cl. */
#define MAX_SLACK 8.0f
/* Per (b, h), query row and split: HEAD_DIM unnormalised outputs, the reference point (base 2)
 * and the sum of the exponentials. */
#define PART_STRIDE (HEAD_DIM + 2)
/* A probability slot of a key the row does not see (probabilities are never negative; a NaN
 * stays a NaN and reaches the output as it does in float64). */
#define NOT_SEEN (-1.0f)

/* The ternary form ignores a NaN, as attention.cl's hmax: the maximum only moves the reference. */
static inline float max_of(float a, float b) { return a > b ? a : b; }

/* Tree reduction of red[r][0 .. DEC_GROUP) for every row into red[r][0]; all work-items call it. */
static inline void reduce_rows(__local float (*red)[DEC_GROUP], int lid, int is_max)
{
    for (int stride = DEC_GROUP / 2; stride > 0; stride >>= 1) {
        if (lid < stride)
            for (int r = 0; r < DEC_ROWS; ++r)
                red[r][lid] = is_max ? max_of(red[r][lid], red[r][lid + stride]) : red[r][lid] + red[r][lid + stride];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

__kernel __attribute__((reqd_work_group_size(DEC_GROUP, 1, 1))) void attention_decode_groups_f32(
    __global const float *q, ulong q_off, __global const kv_t *kc, __global const kv_t *vc, __global float *part,
    __global const int *step, int rows, int H, int P, int t_max, int splits, int split_blocks, int mask, int window,
    float scale_log2 IHA_PROBE_PARAMS)
{
    __local float q_loc[DEC_ROWS][HEAD_DIM];
    __local float p_loc[DEC_ROWS][DEC_TILE];
    __local float red[DEC_ROWS][DEC_GROUP];

    const int lid = get_local_id(0);
    const int r0 = get_group_id(0) * DEC_ROWS;
    const int s = get_global_id(1);
    const int bh = get_global_id(2);
    const int b = bh / H;
    const int n0 = step[2 * b], count = step[2 * b + 1];
    const int T = (n0 + count) * P; /* the sequence's virtual length after this step */
    const int active = count * P;
    if (r0 >= active) return; /* the merge writes inactive rows as 0 and reads none of their states */
    const int valid = min(DEC_ROWS, active - r0);
#if KV_RING
    const int base = max(0, T - t_max) / ATT_KB;
#else
    const int base = 0;
#endif

    /* Rows past `valid` repeat the last valid one (a tile's tail) and are not stored. */
    int lo[DEC_ROWS], hi[DEC_ROWS];
    int lo_min = T, hi_max = -1;
    for (int r = 0; r < DEC_ROWS; ++r) {
        const int i = min(r, valid - 1);
        const int2 range = visible_range(n0 * P + r0 + i, T, P, mask, window);
        lo[r] = range.x;
        hi[r] = range.y;
        lo_min = min(lo_min, range.x);
        hi_max = max(hi_max, range.y);
    }
    const __global float *qrows = q + q_off + ((size_t)bh * rows + r0) * HEAD_DIM;
    for (int e = lid; e < DEC_ROWS * HEAD_DIM; e += DEC_GROUP) {
        const int r = e / HEAD_DIM, c = e % HEAD_DIM;
        q_loc[r][c] = qrows[(size_t)min(r, valid - 1) * HEAD_DIM + c] * scale_log2;
    }

    /* Virtual keys this group reads: the split's, within the rows' visible union. */
    const int first = max((base + s * split_blocks) * ATT_KB, lo_min);
    const int last = min((base + (s + 1) * split_blocks) * ATT_KB - 1, hi_max);
    const int start = first / ATT_KB * ATT_KB; /* tiles start on a block, for aligned loads */
    const int tiles = first <= last ? (last - start) / DEC_TILE + 1 : 0;

    const int t_blocks = (t_max + ATT_KB - 1) / ATT_KB;
    const __global kv_t *kb = kc + (size_t)bh * t_blocks * HEAD_DIM * ATT_KB;
    const __global kv_t *vb = vc + (size_t)bh * t_max * HEAD_DIM;
    const int lane = lid % COL_LANES, kgroup = lid / COL_LANES;

    float m[DEC_ROWS], l[DEC_ROWS], acc[DEC_ROWS][COLS_PER_ITEM];
    for (int r = 0; r < DEC_ROWS; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int i = 0; i < COLS_PER_ITEM; ++i) acc[r][i] = 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* q_loc */

    int t = 0;
    for (; t < tiles + IHA_PROBE_PAST; ++t) {
        IHA_PROBE_SKIP_PAST(t >= tiles);
        const int j0 = start + t * DEC_TILE;
#if KV_RING
        /* The keys read from max(j0, first) to last lie in at most two laps of the ring: they are
         * the held rows, fewer than t_max + ATT_KB from a block-aligned split start, or the
         * visible ones, fewer than t_max. */
        const int lap = max(j0, first) / t_max * t_max, wrap = lap + t_max;
#define ROW_OF(u) ((u) - lap - ((u) >= wrap ? t_max : 0))
#else
#define ROW_OF(u) (u)
#endif
        float sc[DEC_ROWS][DEC_KEYS];
        float tile_max[DEC_ROWS];
        for (int r = 0; r < DEC_ROWS; ++r) tile_max[r] = -INFINITY;
        #pragma unroll
        for (int kk = 0; kk < DEC_KEYS; ++kk) {
            const int u = j0 + kk * DEC_GROUP + lid;
            for (int r = 0; r < DEC_ROWS; ++r) sc[r][kk] = 0.0f;
            if (u >= first && u <= last) {
                const int row = ROW_OF(u);
                const __global kv_t *key = kb + (size_t)(row / ATT_KB) * HEAD_DIM * ATT_KB + row % ATT_KB;
                #pragma unroll 8
                for (int c = 0; c < HEAD_DIM; ++c) {
                    const float kv = LOAD_ONE(key, (size_t)c * ATT_KB);
                    for (int r = 0; r < DEC_ROWS; ++r) sc[r][kk] = fma(q_loc[r][c], kv, sc[r][kk]);
                }
                for (int r = 0; r < DEC_ROWS; ++r) {
                    if (sc[r][kk] != -INFINITY) continue; /* overflow or an infinite input: see SCORE_SHRINK */
                    float t = 0.0f;
                    for (int c = 0; c < HEAD_DIM; ++c)
                        t = fma(q_loc[r][c] * SCORE_SHRINK, LOAD_ONE(key, (size_t)c * ATT_KB) * SCORE_SHRINK, t);
                    if (isfinite(t)) sc[r][kk] = NAN;
                }
            }
            for (int r = 0; r < DEC_ROWS; ++r) {
                const int seen = u >= first && u <= last && u >= lo[r] && u <= hi[r];
                sc[r][kk] = seen ? sc[r][kk] : -INFINITY;
                tile_max[r] = max_of(tile_max[r], sc[r][kk]);
            }
        }
        for (int r = 0; r < DEC_ROWS; ++r) red[r][lid] = tile_max[r];
        barrier(CLK_LOCAL_MEM_FENCE);
        reduce_rows(red, lid, 1);
        for (int r = 0; r < DEC_ROWS; ++r) {
            /* Every work-item reads the same maximum, so all move the reference point together;
             * it moves only when a score passes it by more than MAX_SLACK. A row that has seen
             * no key keeps -inf, and base 0 makes its exponentials exactly 0. */
            const float mx = red[r][0];
            if (mx > m[r] + MAX_SLACK) {
                const float corr = exp2(m[r] - mx);
                l[r] *= corr;
                for (int i = 0; i < COLS_PER_ITEM; ++i) acc[r][i] *= corr;
                m[r] = mx;
            }
            const float ref = m[r] == -INFINITY ? 0.0f : m[r];
            #pragma unroll
            for (int kk = 0; kk < DEC_KEYS; ++kk) {
                const int u = j0 + kk * DEC_GROUP + lid;
                const int seen = u >= first && u <= last && u >= lo[r] && u <= hi[r];
                const float p = exp2(sc[r][kk] - ref);
                l[r] += seen ? p : 0.0f;
                p_loc[r][kk * DEC_GROUP + lid] = seen ? p : NOT_SEEN;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        if (kgroup < KEY_GROUPS) {
            const int jb = kgroup * KEYS_PER_GROUP, je = min(jb + KEYS_PER_GROUP, DEC_TILE);
            for (int j = jb; j < je; ++j) {
                const int u = j0 + j;
                if (u < first || u > last) continue; /* the same key for the group's lanes */
                const __global kv_t *vrow = vb + (size_t)ROW_OF(u) * HEAD_DIM;
                #pragma unroll
                for (int i = 0; i < COLS_PER_ITEM; ++i) {
                    const int c = lane + i * COL_LANES;
                    if (COLS_PER_ITEM * COL_LANES > HEAD_DIM && c >= HEAD_DIM) break;
                    const float v = LOAD_ONE(vrow, c);
                    for (int r = 0; r < DEC_ROWS; ++r) {
                        const float p = p_loc[r][j];
                        acc[r][i] = p < 0.0f ? acc[r][i] : fma(p, v, acc[r][i]);
                    }
                }
            }
        }
#undef ROW_OF
        barrier(CLK_LOCAL_MEM_FENCE); /* p_loc and red are rewritten by the next tile */
    }
    IHA_PROBE_EXPECT(t >= tiles + IHA_PROBE_PAST);

    /* The split's state: sums over all work-items, outputs over the key groups. */
    for (int r = 0; r < DEC_ROWS; ++r) red[r][lid] = l[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    reduce_rows(red, lid, 0);
    __local float (*acc_loc)[DEC_ROWS][HEAD_DIM] = (__local float (*)[DEC_ROWS][HEAD_DIM])(&p_loc[0][0]);
    if (KEY_GROUPS > 1 && kgroup < KEY_GROUPS)
        for (int r = 0; r < DEC_ROWS; ++r) acc_loc[kgroup][r][lane] = acc[r][0];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (kgroup == 0) {
        for (int r = 0; r < valid; ++r) {
            __global float *out = part + (((size_t)bh * rows + r0 + r) * splits + s) * PART_STRIDE;
            for (int i = 0; i < COLS_PER_ITEM; ++i) {
                const int c = lane + i * COL_LANES;
                if (c >= HEAD_DIM) break;
                float a = acc[r][i];
                for (int g = 1; g < KEY_GROUPS; ++g) a += acc_loc[g][r][c];
                out[c] = a;
            }
            if (lid == 0) {
                out[HEAD_DIM] = m[r];
                out[HEAD_DIM + 1] = red[r][0];
            }
        }
    }
    IHA_PROBE_CHECK();
}

/* Merges the splits of each query row into o [B*H][rows][HEAD_DIM], one work-item per column;
 * inactive rows get 0. */
__kernel void attention_decode_groups_merge_f32(__global const float *part, __global float *o, ulong o_off,
                                                __global const int *step, int rows, int H, int P,
                                                int splits IHA_PROBE_PARAMS)
{
    const int c = get_global_id(0);
    const int r = get_global_id(1);
    const int bh = get_global_id(2);
    if (c >= HEAD_DIM || r >= rows) return;
    const int active = step[2 * (bh / H) + 1] * P;
    __global float *out = o + o_off + ((size_t)bh * rows + r) * HEAD_DIM + c;
    if (r >= active) {
        *out = 0.0f;
        return;
    }
    const __global float *pr = part + ((size_t)bh * rows + r) * splits * PART_STRIDE;
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmax(mx, pr[(size_t)s * PART_STRIDE + HEAD_DIM]);
    float total = 0.0f, acc = 0.0f;
    for (int s = 0; s < splits; ++s) {
        const float ms = pr[(size_t)s * PART_STRIDE + HEAD_DIM];
        const float w = ms == -INFINITY ? 0.0f : exp2(ms - mx);
        total += w * pr[(size_t)s * PART_STRIDE + HEAD_DIM + 1];
        acc = fma(w, pr[(size_t)s * PART_STRIDE + c], acc);
    }
    /* total = 0 (no positive exponential) or NaN makes the row NaN, as in attention_fwd_f32. */
    *out = acc * (1.0f / total);
    IHA_PROBE_CHECK();
}
