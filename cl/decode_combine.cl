/* The merge of split-key decoding: the partial softmax states of cl/decode_combine.clh, written by
 * cl/attention_decode.cl or cl/attention_decode_compact.cl, into each query row's output. */
#include "loop_probe.clh"
#include "decode_combine.clh"

/* Merges the splits of each query row into o [B*H][rows][HEAD_DIM]; inactive rows get 0. */
__kernel void attention_decode_combine_f32(__global const float *part, __global float *o, ulong o_off,
                                           __global const int *step, int rows, int H, int P, int splits IHA_PROBE_PARAMS)
{
    const int r = get_global_id(0);
    const int bh = get_global_id(1);
    if (r >= rows) return;
    const int active = step[2 * (bh / H) + 1] * P;
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
    /* total = 0 (no positive exponential) or NaN makes the row NaN, as in attention_fwd_f32. */
    const float inv = r < active ? 1.0f / total : 0.0f;
    for (int c = 0; c < HEAD_DIM; ++c) {
        float acc = 0.0f;
        for (int s = 0; s < splits; ++s) acc = fma(w[s], pr[(size_t)s * PART_STRIDE + c], acc);
        out[c] = acc * inv;
    }
    IHA_PROBE_CHECK();
}
