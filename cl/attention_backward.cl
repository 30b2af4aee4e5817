/* The backward pass of attention over the interleaved virtual sequence (doc/spec.md, "The backward
 * pass", FlashAttention-2 style): the probabilities are recomputed from each row's LSE, so no
 * T x T matrix exists and extra memory is O(B*H*T).
 *   Pr[t][u] = exp(scale * q_t . k_u - LSE[t]) on visible pairs, Dt[t] = dO[t] . O[t],
 *   dS[t][u] = Pr[t][u] (dO[t] . v_u - Dt[t]),
 *   dq_t = scale * sum_u dS[t][u] k_u,  dk_u = scale * sum_t dS[t][u] q_t,  dv_u = sum_t Pr[t][u] dO[t].
 * Three kernels: the row dots Dt, then dq with one work-item per query row (walking its visible
 * keys), then dk and dv with one work-item per key row (walking the queries that see it), so
 * every output row has one writer and no atomics are needed. Each work-item keeps its rows in
 * private float4 arrays of HEAD_DIM (a compile-time constant) and walks the other side's rows
 * in order, which streams them through the cache. This is the straightforward form of the
 * algorithm, right on every device and head width: GPUs run it, and CPUs for widths that 16
 * does not divide; other CPUs run cl/attention_backward_tiles.cl, whose register tiles reuse
 * each loaded row across many pairs. */
#include "loop_probe.clh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined by the host"
#endif

/* MASK_*, visible_keys(t, ...) -> visible keys, seeing_queries_in(u, ...) -> queries that see u,
 * both within packed sequences. */
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

static inline void store_row(__global float *row, const float4 *x, float factor)
{
    for (int c = 0; c < CHUNKS; ++c) {
        const float4 v = x[c] * factor;
        if (4 * c + 4 <= HEAD_DIM) {
            vstore4(v, c, row);
        } else {
            row[4 * c] = v.x;
            if (4 * c + 1 < HEAD_DIM) row[4 * c + 1] = v.y;
            if (4 * c + 2 < HEAD_DIM) row[4 * c + 2] = v.z;
        }
    }
}

/* a . row, with a in registers: four partial sums, reduced once. */
static inline float dot_row(const float4 *a, const __global float *row)
{
    float4 s = (float4)(0.0f);
    for (int c = 0; c < CHUNKS; ++c) {
        if (4 * c + 4 <= HEAD_DIM) {
            s = fma(a[c], vload4(c, row), s);
        } else {
            s.x = fma(a[c].x, row[4 * c], s.x);
            if (4 * c + 1 < HEAD_DIM) s.y = fma(a[c].y, row[4 * c + 1], s.y);
            if (4 * c + 2 < HEAD_DIM) s.z = fma(a[c].z, row[4 * c + 2], s.z);
        }
    }
    return (s.x + s.y) + (s.z + s.w);
}

/* acc += w * row. */
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

/* Dt[bh][t] = dO[t] . O[t]. One work-item per row. */
__kernel void attention_bwd_rowdot_f32(__global const float *o, ulong o_off,   /* [B*H][T][HEAD_DIM] */
                                       __global const float *dout, ulong d_off, /* [B*H][T][HEAD_DIM] */
                                       __global float *delta,                   /* [B*H][T] */
                                       int T IHA_PROBE_PARAMS)
{
    const int t = get_global_id(0), bh = get_global_id(1);
    if (t >= T) return;
    const size_t row = ((size_t)bh * T + t) * HEAD_DIM;
    float4 a[CHUNKS];
    load_row(o + o_off + row, a);
    delta[(size_t)bh * T + t] = dot_row(a, dout + d_off + row);
    IHA_PROBE_CHECK();
}

/* dq_t for one query row per work-item, over its visible keys. */
__kernel void attention_bwd_dq_f32(__global const float *q, ulong q_off,       /* [B*H][T][HEAD_DIM] */
                                   __global const float *k, ulong k_off,       /* [B*H][T][HEAD_DIM] */
                                   __global const float *v, ulong v_off,       /* [B*H][T][HEAD_DIM] */
                                   __global const float *dout, ulong d_off,    /* [B*H][T][HEAD_DIM] */
                                   __global const float *lse, ulong lse_off,   /* [B*H][T] natural log */
                                   __global const float *delta,                /* [B*H][T] */
                                   __global float *dq, ulong dq_off,           /* [B*H][T][HEAD_DIM] */
                                   int T, int P, int mask, int window, float scale IHA_SEQ_PARAMS IHA_PROBE_PARAMS)
{
    const int t = get_global_id(0), bh = get_global_id(1);
    if (t >= T) return;
    const size_t base = (size_t)bh * T * HEAD_DIM, row = base + (size_t)t * HEAD_DIM;
    float4 qs[CHUNKS], g[CHUNKS], acc[CHUNKS];
    load_row(q + q_off + row, qs);
    for (int c = 0; c < CHUNKS; ++c) qs[c] *= scale;
    load_row(dout + d_off + row, g);
    for (int c = 0; c < CHUNKS; ++c) acc[c] = (float4)(0.0f);
    const float l = lse[lse_off + (size_t)bh * T + t], dt = delta[(size_t)bh * T + t];
    /* A row that saw no key has LSE = -inf and no gradient. */
    if (l != -INFINITY) {
        const int2 r = visible_keys(t, T, P, mask, window, seq_row(seq_bounds, seq_heads, bh, T, P));
        int u = r.x;
        for (; u <= r.y + IHA_PROBE_PAST; ++u) {
            IHA_PROBE_SKIP_PAST(u > r.y);
            const float p = exp(dot_row(qs, k + k_off + base + (size_t)u * HEAD_DIM) - l);
            const float ds = p * (dot_row(g, v + v_off + base + (size_t)u * HEAD_DIM) - dt);
            axpy_row(acc, ds, k + k_off + base + (size_t)u * HEAD_DIM);
        }
        IHA_PROBE_EXPECT(u >= r.y + 1 + IHA_PROBE_PAST);
    }
    store_row(dq + dq_off + row, acc, scale);
    IHA_PROBE_CHECK();
}

/* dk_u and dv_u for one key row per work-item, over the queries that see it. */
__kernel void attention_bwd_dkv_f32(__global const float *q, ulong q_off,     /* [B*H][T][HEAD_DIM] */
                                    __global const float *k, ulong k_off,     /* [B*H][T][HEAD_DIM] */
                                    __global const float *v, ulong v_off,     /* [B*H][T][HEAD_DIM] */
                                    __global const float *dout, ulong d_off,  /* [B*H][T][HEAD_DIM] */
                                    __global const float *lse, ulong lse_off, /* [B*H][T] natural log */
                                    __global const float *delta,              /* [B*H][T] */
                                    __global float *dk, ulong dk_off,         /* [B*H][T][HEAD_DIM] */
                                    __global float *dv, ulong dv_off,         /* [B*H][T][HEAD_DIM] */
                                    int T, int P, int mask, int window, float scale IHA_SEQ_PARAMS IHA_PROBE_PARAMS)
{
    const int u = get_global_id(0), bh = get_global_id(1);
    if (u >= T) return;
    const size_t base = (size_t)bh * T * HEAD_DIM, row = base + (size_t)u * HEAD_DIM;
    float4 ks[CHUNKS], vs[CHUNKS], dk_acc[CHUNKS], dv_acc[CHUNKS];
    load_row(k + k_off + row, ks);
    for (int c = 0; c < CHUNKS; ++c) ks[c] *= scale;
    load_row(v + v_off + row, vs);
    for (int c = 0; c < CHUNKS; ++c) dk_acc[c] = dv_acc[c] = (float4)(0.0f);
    const int2 r = seeing_queries_in(u, T, P, mask, window, seq_row(seq_bounds, seq_heads, bh, T, P));
    int t = r.x;
    for (; t <= r.y + IHA_PROBE_PAST; ++t) {
        IHA_PROBE_SKIP_PAST(t > r.y);
        const float l = lse[lse_off + (size_t)bh * T + t];
        if (l == -INFINITY) continue; /* a query that saw no key has no gradient */
        const __global float *g = dout + d_off + base + (size_t)t * HEAD_DIM;
        const __global float *qt = q + q_off + base + (size_t)t * HEAD_DIM;
        const float p = exp(dot_row(ks, qt) - l);
        const float ds = p * (dot_row(vs, g) - delta[(size_t)bh * T + t]);
        axpy_row(dv_acc, p, g);
        axpy_row(dk_acc, ds, qt);
    }
    IHA_PROBE_EXPECT(t >= r.y + 1 + IHA_PROBE_PAST);
    store_row(dk + dk_off + row, dk_acc, scale);
    store_row(dv + dv_off + row, dv_acc, 1.0f);
    IHA_PROBE_CHECK();
}
