/* The register-tile attention kernel's two inner loops alone (iha_measure_attention_loops): each
 * work-item runs one register tile's score loop (which = 0) or P.V loop (which = 1), the same
 * inline functions as attention_fwd_f32 built with its options, `iters` times over one key block
 * or one value block that stays in L1: the fastest this design can go on the device, before
 * streaming, masks and the softmax. blocks holds, per work-item, a key block
 * (HEAD_DIM * ATT_KB), then ATT_KB value rows (ATT_KB * HEAD_DIM); out gets one sum per
 * work-item so that nothing is optimised away.
 * A file of its own so that applications never compile it: PoCL compiles every kernel of a
 * program when the program's binary is fetched for the disk cache, and inside attention.cl this
 * kernel would lengthen every empty-cache first call. */
#include "loop_probe.clh"
#include "attention.cl"

__kernel void attention_loops_f32(__global const kv_t *blocks, __global float *out, int iters, int which IHA_PROBE_PARAMS)
{
    const int g = get_global_id(0);
    const __global kv_t *kblk = blocks + (size_t)g * 2 * HEAD_DIM * ATT_KB;
    const __global kv_t *vb = kblk + HEAD_DIM * ATT_KB;
    tile_state ts;
    ts.zero = iters < 0;
    float pr[ATT_ROWS * ATT_KB];
    for (int r = 0; r < ATT_ROWS; ++r) {
        for (int c = 0; c < HEAD_DIM; ++c) ts.q[r][c] = LOAD_ONE(vb, (r * HEAD_DIM + c) % (ATT_KB * HEAD_DIM));
        for (int j = 0; j < ATT_KB; ++j) pr[r * ATT_KB + j] = 1.0f / (float)(1 + r + j);
        for (int cv = 0; cv < VCHUNKS; ++cv) ts.acc[r][cv] = (floatV)(0.0f);
    }
    floatK total = (floatK)(0.0f);
    int it = 0;
    if (which == 0) {
        for (; it < iters + IHA_PROBE_PAST; ++it) {
            IHA_PROBE_SKIP_PAST(it >= iters);
            /* it * ts.zero is 0 at run time; the compiler cannot see that, so it cannot hoist the
             * loop-invariant scores out of the timing loop. */
            floatK s[ATT_ROWS];
            tile_score_fmas(&ts, kblk + (size_t)it * ts.zero, s);
            #pragma unroll
            for (int r = 0; r < ATT_ROWS; ++r) total += s[r];
        }
    } else {
        /* Chunk by chunk, not unrolled, as attention_fwd_f32 runs P.V. */
        for (; it < iters + IHA_PROBE_PAST; ++it) {
            IHA_PROBE_SKIP_PAST(it >= iters);
            #pragma unroll 1
            for (int cv = 0; cv < VCHUNKS; ++cv) tile_pv_chunk(&ts, pr, vb, 0, ATT_KB - 1, 0, cv);
        }
    }
    IHA_PROBE_EXPECT(it >= iters + IHA_PROBE_PAST);
    float sum = hsum(total);
    for (int r = 0; r < ATT_ROWS; ++r)
        for (int cv = 0; cv < VCHUNKS; ++cv) {
            float tmp[ATT_VD];
            vstoreV(ts.acc[r][cv], 0, tmp);
            for (int i = 0; i < ATT_VD; ++i) sum += tmp[i];
        }
    out[g] = sum;
    IHA_PROBE_CHECK();
}
