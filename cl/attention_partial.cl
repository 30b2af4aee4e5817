/* Partial attention (doc/spec.md, "Partial attention"): one block of queries against one block of
 * keys of a longer virtual sequence, the masks evaluated at global virtual positions, merged into
 * a running (O, LSE) state by the online-softmax rule; and its backward from the final state.
 *   queries  rows q0 .. q0+Tq-1 of the whole sequence, keys and values rows k0 .. k0+Tk-1;
 *   Tg       a length that covers both blocks (masks clip to it, the blocks never reach past it).
 * One work-item per row, as cl/attention_backward.cl's row kernels: every output row has one
 * writer, no local memory, no work-group size of its own, so the kernels run as they are on GPUs
 * and CPUs alike. GPUs run them; devices that are not GPUs run the forward as
 * cl/attention_partial_tiles.cl's register tiles and the backward as
 * cl/attention_partial_backward_tiles.cl's, unless the driver limits loops (as for
 * iha_attention_backward).
 * The forward's block result is formed in float and merged in the same work-item, so a row that
 * sees no key of the block keeps its state untouched. */
#include "loop_probe.clh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined by the host"
#endif

#include "masks.clh"

/* Head-dimension chunks of 4; the last one zero-padded when 4 does not divide HEAD_DIM. */
#define CHUNKS ((HEAD_DIM + 3) / 4)

static inline void load_row(const __global float *row, float4 *out)
{
    for (int c = 0; c < CHUNKS; ++c) {
        if (4 * c + 4 <= HEAD_DIM) {
            out[c] = vload4(c, row);
        } else {
            float4 v = (float4)(0.0f);
            v.x = row[4 * c];
            if (4 * c + 1 < HEAD_DIM) v.y = row[4 * c + 1];
            if (4 * c + 2 < HEAD_DIM) v.z = row[4 * c + 2];
            out[c] = v;
        }
    }
}

/* row = factor * x, or with add row += factor * x. */
static inline void store_row(__global float *row, const float4 *x, float factor, int add)
{
    for (int c = 0; c < CHUNKS; ++c) {
        float4 v = x[c] * factor;
        if (4 * c + 4 <= HEAD_DIM) {
            if (add) v += vload4(c, row);
            vstore4(v, c, row);
        } else {
            row[4 * c] = v.x + (add ? row[4 * c] : 0.0f);
            if (4 * c + 1 < HEAD_DIM) row[4 * c + 1] = v.y + (add ? row[4 * c + 1] : 0.0f);
            if (4 * c + 2 < HEAD_DIM) row[4 * c + 2] = v.z + (add ? row[4 * c + 2] : 0.0f);
        }
    }
}

/* The dot product of a and row, each element times `shrink` first (1, or SCORE_SHRINK to
 * tell an overflow from an infinite input, see masks.clh). */
static inline float dot_row(const float4 *a, const __global float *row, float shrink)
{
    float4 s = (float4)(0.0f);
    for (int c = 0; c < CHUNKS; ++c) {
        if (4 * c + 4 <= HEAD_DIM) {
            s = fma(a[c] * shrink, vload4(c, row) * shrink, s);
        } else {
            s.x = fma(a[c].x * shrink, row[4 * c] * shrink, s.x);
            if (4 * c + 1 < HEAD_DIM) s.y = fma(a[c].y * shrink, row[4 * c + 1] * shrink, s.y);
            if (4 * c + 2 < HEAD_DIM) s.z = fma(a[c].z * shrink, row[4 * c + 2] * shrink, s.z);
        }
    }
    return (s.x + s.y) + (s.z + s.w);
}

static inline void axpy_row(float4 *acc, float w, const __global float *row)
{
    for (int c = 0; c < CHUNKS; ++c) {
        if (4 * c + 4 <= HEAD_DIM) {
            acc[c] = fma((float4)(w), vload4(c, row), acc[c]);
        } else {
            acc[c].x = fma(w, row[4 * c], acc[c].x);
            if (4 * c + 1 < HEAD_DIM) acc[c].y = fma(w, row[4 * c + 1], acc[c].y);
            if (4 * c + 2 < HEAD_DIM) acc[c].z = fma(w, row[4 * c + 2], acc[c].z);
        }
    }
}

/* The block's keys that global row g sees, as local indices [lo, hi] of the key block (empty
 * when lo > hi). */
static inline int2 block_keys(int g, int Tg, int P, int mask, int window, int k0, int Tk)
{
    const int2 r = visible_range(g, Tg, P, mask, window);
    return (int2)(max(r.x, k0) - k0, min(r.y, k0 + Tk - 1) - k0);
}

/* The forward: one query row per work-item attends over its visible keys of the block, then
 * merges (o_b, lse_b) into the state (o_s, lse_s): M = max, w = exp(lse - M),
 * o = (w_s o_s + w_b o_b) / (w_s + w_b), lse = M + log(w_s + w_b). With `first`, or a state
 * LSE of -inf (empty), the block's result replaces the state. */
__kernel void attention_partial_f32(__global const float *q, ulong q_off,   /* [B*H][Tq][HEAD_DIM] */
                                    __global const float *k, ulong k_off,   /* [B*H][Tk][HEAD_DIM] */
                                    __global const float *v, ulong v_off,   /* [B*H][Tk][HEAD_DIM] */
                                    __global float *o, ulong o_off,         /* [B*H][Tq][HEAD_DIM] */
                                    __global float *lse, ulong lse_off,     /* [B*H][Tq] natural log */
                                    int Tq, int Tk, int q0, int k0, int Tg, int P, int mask, int window,
                                    float scale, int first IHA_PROBE_PARAMS)
{
    const int t = get_global_id(0), bh = get_global_id(1);
    if (t >= Tq) return;
    const size_t lrow = (size_t)bh * Tq + t, row = lrow * HEAD_DIM, kbase = (size_t)bh * Tk * HEAD_DIM;
    __global float *orow = o + o_off + row;
    float4 acc[CHUNKS];
    for (int c = 0; c < CHUNKS; ++c) acc[c] = (float4)(0.0f);
    const int2 r = block_keys(q0 + t, Tg, P, mask, window, k0, Tk);
    if (r.x > r.y) {
        if (first) {
            store_row(orow, acc, 0.0f, 0);
            lse[lse_off + lrow] = -INFINITY;
        }
        IHA_PROBE_CHECK();
        return;
    }
    float4 qs[CHUNKS];
    load_row(q + q_off + row, qs);
    for (int c = 0; c < CHUNKS; ++c) qs[c] *= scale;
    /* The running maximum takes a NaN or infinite score through exp(s - m) as NaN, so such a
     * row is NaN, as the whole-sequence kernel makes it. */
    float m = -INFINITY, l = 0.0f;
    int u = r.x;
    for (; u <= r.y + IHA_PROBE_PAST; ++u) {
        IHA_PROBE_SKIP_PAST(u > r.y);
        const size_t krow = kbase + (size_t)u * HEAD_DIM;
        float s = dot_row(qs, k + k_off + krow, 1.0f);
        if (s == -INFINITY && isfinite(dot_row(qs, k + k_off + krow, SCORE_SHRINK))) s = NAN; /* see SCORE_SHRINK */
        const float mn = s > m ? s : m;
        const float c = exp(m - mn), e = exp(s - mn);
        l = l * c + e;
        for (int i = 0; i < CHUNKS; ++i) acc[i] *= c;
        axpy_row(acc, e, v + v_off + krow);
        m = mn;
    }
    IHA_PROBE_EXPECT(u >= r.y + 1 + IHA_PROBE_PAST);
    const float lb = m + log(l);
    const float ls = first ? -INFINITY : lse[lse_off + lrow];
    if (ls == -INFINITY) {
        store_row(orow, acc, 1.0f / l, 0);
        lse[lse_off + lrow] = lb;
    } else {
        const float mm = ls > lb ? ls : lb;
        const float ws = exp(ls - mm), wb = exp(lb - mm), den = ws + wb;
        float4 os[CHUNKS];
        load_row(orow, os);
        for (int c = 0; c < CHUNKS; ++c) acc[c] = (os[c] * ws + acc[c] * (wb / l)) / den;
        store_row(orow, acc, 1.0f, 0);
        lse[lse_off + lrow] = mm + log(den);
    }
    IHA_PROBE_CHECK();
}

/* Dt[bh][t] = dO[t] . O[t] over the query block, from the final state. */
__kernel void attention_partial_rowdot_f32(__global const float *o, ulong o_off,    /* [B*H][Tq][HEAD_DIM] */
                                           __global const float *dout, ulong d_off, /* [B*H][Tq][HEAD_DIM] */
                                           __global float *delta,                   /* [B*H][Tq] */
                                           int Tq IHA_PROBE_PARAMS)
{
    const int t = get_global_id(0), bh = get_global_id(1);
    if (t >= Tq) return;
    const size_t row = ((size_t)bh * Tq + t) * HEAD_DIM;
    float4 a[CHUNKS];
    load_row(o + o_off + row, a);
    delta[(size_t)bh * Tq + t] = dot_row(a, dout + d_off + row, 1.0f);
    IHA_PROBE_CHECK();
}

/* The query block's dq from one key block: one query row per work-item over its visible keys of
 * the block, with the probabilities exp(s - LSE) of the final LSE; written with `first`, else
 * added. A row with LSE -inf (no key anywhere) gets no gradient. */
__kernel void attention_partial_dq_f32(__global const float *q, ulong q_off,     /* [B*H][Tq][HEAD_DIM] */
                                       __global const float *k, ulong k_off,     /* [B*H][Tk][HEAD_DIM] */
                                       __global const float *v, ulong v_off,     /* [B*H][Tk][HEAD_DIM] */
                                       __global const float *dout, ulong d_off,  /* [B*H][Tq][HEAD_DIM] */
                                       __global const float *lse, ulong lse_off, /* [B*H][Tq] */
                                       __global const float *delta,              /* [B*H][Tq] */
                                       __global float *dq, ulong dq_off,         /* [B*H][Tq][HEAD_DIM] */
                                       int Tq, int Tk, int q0, int k0, int Tg, int P, int mask, int window,
                                       float scale, int first IHA_PROBE_PARAMS)
{
    const int t = get_global_id(0), bh = get_global_id(1);
    if (t >= Tq) return;
    const size_t lrow = (size_t)bh * Tq + t, row = lrow * HEAD_DIM, kbase = (size_t)bh * Tk * HEAD_DIM;
    float4 qs[CHUNKS], g[CHUNKS], acc[CHUNKS];
    for (int c = 0; c < CHUNKS; ++c) acc[c] = (float4)(0.0f);
    const float l = lse[lse_off + lrow];
    const int2 r = block_keys(q0 + t, Tg, P, mask, window, k0, Tk);
    if (l != -INFINITY && r.x <= r.y) {
        load_row(q + q_off + row, qs);
        for (int c = 0; c < CHUNKS; ++c) qs[c] *= scale;
        load_row(dout + d_off + row, g);
        const float dt = delta[lrow];
        int u = r.x;
        for (; u <= r.y + IHA_PROBE_PAST; ++u) {
            IHA_PROBE_SKIP_PAST(u > r.y);
            const size_t krow = kbase + (size_t)u * HEAD_DIM;
            const float p = exp(dot_row(qs, k + k_off + krow, 1.0f) - l);
            const float ds = p * (dot_row(g, v + v_off + krow, 1.0f) - dt);
            axpy_row(acc, ds, k + k_off + krow);
        }
        IHA_PROBE_EXPECT(u >= r.y + 1 + IHA_PROBE_PAST);
    }
    store_row(dq + dq_off + row, acc, scale, !first);
    IHA_PROBE_CHECK();
}

/* The key block's dk and dv from the query block: one key row per work-item over the block's
 * queries that see it; written, or with `add` added. */
__kernel void attention_partial_dkv_f32(__global const float *q, ulong q_off,     /* [B*H][Tq][HEAD_DIM] */
                                        __global const float *k, ulong k_off,     /* [B*H][Tk][HEAD_DIM] */
                                        __global const float *v, ulong v_off,     /* [B*H][Tk][HEAD_DIM] */
                                        __global const float *dout, ulong d_off,  /* [B*H][Tq][HEAD_DIM] */
                                        __global const float *lse, ulong lse_off, /* [B*H][Tq] */
                                        __global const float *delta,              /* [B*H][Tq] */
                                        __global float *dk, ulong dk_off,         /* [B*H][Tk][HEAD_DIM] */
                                        __global float *dv, ulong dv_off,         /* [B*H][Tk][HEAD_DIM] */
                                        int Tq, int Tk, int q0, int k0, int Tg, int P, int mask, int window,
                                        float scale, int add IHA_PROBE_PARAMS)
{
    const int u = get_global_id(0), bh = get_global_id(1);
    if (u >= Tk) return;
    const size_t row = ((size_t)bh * Tk + u) * HEAD_DIM, qbase = (size_t)bh * Tq * HEAD_DIM;
    float4 ks[CHUNKS], vs[CHUNKS], dk_acc[CHUNKS], dv_acc[CHUNKS];
    load_row(k + k_off + row, ks);
    for (int c = 0; c < CHUNKS; ++c) ks[c] *= scale;
    load_row(v + v_off + row, vs);
    for (int c = 0; c < CHUNKS; ++c) dk_acc[c] = dv_acc[c] = (float4)(0.0f);
    const int2 s = seeing_queries(k0 + u, Tg, P, mask, window);
    const int lo = max(s.x, q0) - q0, hi = min(s.y, q0 + Tq - 1) - q0;
    int t = lo;
    for (; t <= hi + IHA_PROBE_PAST; ++t) {
        IHA_PROBE_SKIP_PAST(t > hi);
        const size_t lrow = (size_t)bh * Tq + t;
        const float l = lse[lse_off + lrow];
        if (l == -INFINITY) continue; /* a query that saw no key has no gradient */
        const __global float *g = dout + d_off + qbase + (size_t)t * HEAD_DIM;
        const __global float *qr = q + q_off + qbase + (size_t)t * HEAD_DIM;
        const float p = exp(dot_row(ks, qr, 1.0f) - l);
        const float ds = p * (dot_row(vs, g, 1.0f) - delta[lrow]);
        axpy_row(dv_acc, p, g);
        axpy_row(dk_acc, ds, qr);
    }
    IHA_PROBE_EXPECT(t >= hi + 1 + IHA_PROBE_PAST);
    store_row(dk + dk_off + row, dk_acc, scale, add);
    store_row(dv + dv_off + row, dv_acc, 1.0f, add);
    IHA_PROBE_CHECK();
}
