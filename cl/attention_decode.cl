/* Decoding: few query rows against a long cache, with attention.cl's register tiles and online
 * softmax. A file of its own so that layer calls never compile these kernels: PoCL compiles
 * every kernel of a program when the library fetches the program's binary for the disk cache,
 * and inside attention.cl they would lengthen every layer's empty-cache first call. */
#include "loop_probe.clh"
#include "attention.cl"

/* 1: the cache is a ring of t_max rows, t_max a multiple of ATT_KB (src/layer/kv_cache.h):
 * virtual position u sits at row u mod t_max, and a sequence's splits cover the blocks from its
 * oldest held row, max(0, T - t_max), on. */
#ifndef KV_RING
#define KV_RING 0
#endif

/* acc += P V over the whole head dimension for one tile (decoding's single tile). */
static inline __attribute__((always_inline)) void tile_pv(tile_state *ts, const float *pr, const __global kv_t *vb,
                                                         int j0, int last, int masked)
{
    #pragma unroll
    for (int cv = 0; cv < VCHUNKS; ++cv) tile_pv_chunk(ts, pr, vb, j0, last, masked, cv);
}

/* One register tile against the key block starting at key j0 (decoding's single tile). A block
 * some row does not wholly see takes pv_keys_masked: its masked keys, and the padding past
 * T (whose rows are clamped to the last key, keeping the reads in bounds), add nothing. */
static inline void tile_step(tile_state *ts, const __global kv_t *kblk, const __global kv_t *vb, int j0, int T)
{
    float pr[ATT_ROWS * ATT_KB];
    if (tile_scores(ts, kblk, j0, pr))
        tile_pv(ts, pr, vb, j0, j0 + ATT_KB - 1, 0);
    else
        tile_pv(ts, pr, vb, j0, min(j0 + ATT_KB, T) - 1, 1);
}

#if KV_RING
/* Moves the tile's visible intervals by -delta: with positions from delta on at ring row u - delta,
 * tile_step's key j0 is a row of the ring. */
static inline void tile_shift(tile_state *ts, int delta)
{
    #pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) {
        ts->lo[r] -= delta;
        ts->hi[r] -= delta;
    }
    ts->lo_min -= delta;
    ts->lo_max -= delta;
    ts->hi_min -= delta;
    ts->hi_max -= delta;
}
#endif

/* The cache holds keys in attention.cl's key-block layout, [B*H][ceil(t_max/KB)][HEAD_DIM][KB], and
 * values in rows [B*H][t_max][HEAD_DIM]. So that a long cache fills the device, the key blocks of
 * each (b, h) are split into ranges of split_blocks blocks, one work-item each, and every
 * work-item keeps a partial softmax (max, sum, unnormalised output) of one ATT_ROWS tile; a
 * second kernel merges the splits. step[b] = (n0, count): sequence b held n0 tokens and appends
 * count; its query rows are [B*H][rows][HEAD_DIM] with rows = k*P, virtual position n0*P + row,
 * and rows past count*P are inactive (written as 0). */

#include "decode_combine.clh"

__kernel void attention_decode_partial_f32(__global const float *q, ulong q_off, __global const kv_t *kc,
                                           __global const kv_t *vc, __global float *part,
                                           __global const int *step, int rows, int H, int P, int t_max,
                                           int splits, int split_blocks, int mask, int window, float scale_log2 IHA_PROBE_PARAMS)
{
    const int r0 = get_global_id(0) * ATT_ROWS;
    const int s = get_global_id(1);
    const int bh = get_global_id(2);
    if (r0 >= rows || s >= splits) return;
    const int b = bh / H;
    const int n0 = step[2 * b], count = step[2 * b + 1];
    const int T = (n0 + count) * P; /* the sequence's virtual length after this step */
    const int active = count * P;

#if KV_RING
    const int base = max(0, T - t_max) / ATT_KB;
#else
    const int base = 0;
#endif

    tile_state ts;
    int first = T, last = -1; /* key blocks to visit */
    if (r0 < active) {
        /* A decoding step's sequences are the cache's rows (a packed step is a ragged one). */
        tile_init(&ts, q + q_off + ((size_t)bh * rows + r0) * HEAD_DIM, n0 * P + r0, active - r0, T, P, mask, window,
                  scale_log2, 0);
        first = max(base + s * split_blocks, ts.lo_min / ATT_KB);
        last = min(base + (s + 1) * split_blocks - 1, ts.hi_max / ATT_KB);
    } else {
        for (int r = 0; r < ATT_ROWS; ++r) {
            ts.m[r] = -INFINITY;
            ts.l[r] = (floatK)(0.0f);
            for (int cv = 0; cv < VCHUNKS; ++cv) ts.acc[r][cv] = (floatV)(0.0f);
        }
    }
    const int t_blocks = (t_max + ATT_KB - 1) / ATT_KB;
    const __global kv_t *kb = kc + (size_t)bh * t_blocks * HEAD_DIM * ATT_KB;
    const __global kv_t *vb = vc + (size_t)bh * t_max * HEAD_DIM;
    int blk = first, shift = 0;
#if KV_RING
    /* The blocks from `first` lie in at most two laps of the ring. */
    if (first <= last) {
        shift = first / t_blocks * t_max;
        tile_shift(&ts, shift);
    }
#endif
    for (; blk <= last + IHA_PROBE_PAST; ++blk) {
        IHA_PROBE_SKIP_PAST(blk > last);
#if KV_RING
        if (blk * ATT_KB - shift == t_max) {
            tile_shift(&ts, t_max);
            shift += t_max;
        }
#endif
        const int j0 = blk * ATT_KB - shift;
        tile_step(&ts, kb + (size_t)(j0 / ATT_KB) * HEAD_DIM * ATT_KB, vb, j0, T - shift);
    }
    IHA_PROBE_EXPECT(blk >= last + 1 + IHA_PROBE_PAST);

    for (int r = 0; r < ATT_ROWS && r0 + r < rows; ++r) {
        __global float *out = part + (((size_t)bh * rows + r0 + r) * splits + s) * PART_STRIDE;
        float tmp[ATT_VD];
        for (int cv = 0; cv < VCHUNKS; ++cv) {
            vstoreV(ts.acc[r][cv], 0, tmp);
            for (int i = 0; i < ATT_VD && cv * ATT_VD + i < HEAD_DIM; ++i) out[cv * ATT_VD + i] = tmp[i];
        }
        out[HEAD_DIM] = ts.m[r];
        out[HEAD_DIM + 1] = hsum(ts.l[r]);
    }
    IHA_PROBE_CHECK();
}
