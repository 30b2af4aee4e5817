/* The unfused baseline's masked softmax (src/measure/unfused.c): one work-group per row of one
 * (b, h)'s T x T score matrix S, in place. Visible entries become softmax probabilities, masked
 * ones 0, so that a plain GEMM of S with Vt gives the attention output.
 *
 * Under every mask and window of doc/spec.md the keys a query sees form one contiguous range
 * [lo, hi) of virtual positions, so the row needs no per-element mask test. */
#include "loop_probe.clh"

/* Work-items per row, a power of two: they stride over the row and reduce in local memory. */
#ifndef SOFTMAX_WG
#define SOFTMAX_WG 64
#endif

#define MASK_CAUSAL 0
#define MASK_TOKEN_CAUSAL 1
#define MASK_NONE 2

/* The visible keys [lo, hi) of query t; window in tokens, 0 = global. */
static void visible_range(int t, int T, int P, int mask, int window, int *lo, int *hi)
{
    const int n = t / P, N = T / P;
    if (mask == MASK_CAUSAL) {
        *hi = t + 1;
        *lo = window > 0 ? max(0, t + 1 - window * P) : 0;
    } else if (mask == MASK_TOKEN_CAUSAL) {
        *hi = (n + 1) * P;
        *lo = window > 0 ? max(0, n + 1 - window) * P : 0;
    } else {
        *hi = window > 0 ? min(N, n + window) * P : T;
        *lo = window > 0 ? max(0, n + 1 - window) * P : 0;
    }
}

/* Reduces red[0..SOFTMAX_WG-1] into red[0] with op; every work-item reads the result. */
#define REDUCE(red, lid, op)                                                   \
    do {                                                                       \
        for (int s_ = SOFTMAX_WG / 2; s_ > 0; s_ >>= 1) {                      \
            barrier(CLK_LOCAL_MEM_FENCE);                                      \
            if ((lid) < s_) (red)[lid] = op((red)[lid], (red)[(lid) + s_]);    \
        }                                                                      \
        barrier(CLK_LOCAL_MEM_FENCE);                                          \
    } while (0)

#define OP_MAX(a, b) fmax((a), (b))
#define OP_ADD(a, b) ((a) + (b))

__kernel __attribute__((reqd_work_group_size(SOFTMAX_WG, 1, 1))) void
measure_softmax_rows_f32(__global float *s, ulong s_off, int T, int P, int mask, int window IHA_PROBE_PARAMS)
{
    __local float red[SOFTMAX_WG];
    const int lid = get_local_id(0), t = get_group_id(1);
    __global float *row = s + s_off + (size_t)t * T;
    int lo, hi;
    visible_range(t, T, P, mask, window, &lo, &hi);

    float m = -INFINITY;
    for (int u = lo + lid; u < hi; u += SOFTMAX_WG) m = fmax(m, row[u]);
    red[lid] = m;
    REDUCE(red, lid, OP_MAX);
    m = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);

    float sum = 0.0f;
    for (int u = lo + lid; u < hi; u += SOFTMAX_WG) {
        const float e = exp(row[u] - m);
        row[u] = e;
        sum += e;
    }
    red[lid] = sum;
    REDUCE(red, lid, OP_ADD);
    /* A row with no visible key cannot occur under doc/spec.md's masks; it would get zeros. */
    const float inv = red[0] > 0.0f ? 1.0f / red[0] : 0.0f;

    /* Each visible entry is scaled by the work-item that wrote it above, and the masked ones
     * (which nobody wrote) are cleared: no entry is touched by two work-items, which the local
     * fences of the reductions could not order for global memory (Oclgrind flagged it). */
    for (int u = lo + lid; u < hi; u += SOFTMAX_WG) row[u] *= inv;
    for (int u = lid; u < T; u += SOFTMAX_WG)
        if (u < lo || u >= hi) row[u] = 0.0f;
    IHA_PROBE_CHECK();
}
