/* Decoding from a compact KV cache (doc/spec.md, "The compact cache"): the cache holds each
 * token's own keys and values, [B][slots][H][HEAD_DIM] each (keys rotated by their token's
 * position n*P when rotary is on), and a work-item forms the P pseudo-keys of every token it
 * reads on the fly (mixing with alpha_K, then the rotation by the pseudo index p that completes
 * rotary at virtual position n*P + p) and folds alpha_V into the probabilities. It reads the H·d elements of a token
 * once for DEC_HEADS target heads, P times fewer bytes than the pseudo-token cache, and writes
 * the partial softmax states of cl/decode_combine.clh, which merges the splits. */
#include "loop_probe.clh"
#include "masks.clh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
/* The pseudo-heads per head; the per-token scratch holds DEC_P rows. */
#ifndef DEC_P
#error "DEC_P must be defined"
#endif
/* Query rows per work-item: one tile of consecutive virtual rows of one sequence. */
#ifndef DEC_ROWS
#define DEC_ROWS 4
#endif
/* The heads H: the mixing loops over them, unrolled. */
#ifndef DEC_H
#error "DEC_H must be defined"
#endif
/* Target heads per work-item: the mixing reads a token's H rows once for all of them. */
#ifndef DEC_HEADS
#define DEC_HEADS 1
#endif
/* Vector width over the head dimension: 4, 8 or 16. */
#ifndef DEC_VD
#define DEC_VD 16
#endif
#include "kv_compact.clh"

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatV CAT(float, DEC_VD)
#define vloadV CAT(vload, DEC_VD)
#define vstoreV CAT(vstore, DEC_VD)
#define VCH ((HEAD_DIM + DEC_VD - 1) / DEC_VD)
#define HEAD_PAD (VCH * DEC_VD)
#define HALF_DIM (HEAD_DIM / 2)

#if KV_HALF
#define kv_t half
#define LOADV(i, p) CAT(vload_half, DEC_VD)((i), (p))
#define LOAD_ONE(i, p) vload_half((i), (p))
#elif KV_BF16
#include "bf16.clh"
#define kv_t ushort
#define LOADV(i, p) CAT(bf16_vload, DEC_VD)((i), (p))
#define LOAD_ONE(i, p) bf16_load((i), (p))
#else
#define kv_t float
#define LOADV(i, p) vloadV((i), (p))
#define LOAD_ONE(i, p) ((p)[(i)])
#endif

#include "decode_combine.clh"

/* One row of HEAD_DIM cached elements as VCH vectors, 0 past HEAD_DIM. */
static inline void load_row(const __global kv_t *p, floatV *x)
{
    for (int cv = 0; cv < VCH; ++cv) {
        if ((cv + 1) * DEC_VD <= HEAD_DIM) {
            x[cv] = LOADV(cv, p);
        } else {
            float t[DEC_VD];
            for (int i = 0; i < DEC_VD; ++i) t[i] = cv * DEC_VD + i < HEAD_DIM ? LOAD_ONE(cv * DEC_VD + i, p) : 0.0f;
            x[cv] = vloadV(0, t);
        }
    }
}

/* One query row of HEAD_DIM floats, 0 past HEAD_DIM. */
static inline void load_query(const __global float *p, floatV *x)
{
    for (int cv = 0; cv < VCH; ++cv) {
        float t[DEC_VD];
        for (int i = 0; i < DEC_VD; ++i) t[i] = cv * DEC_VD + i < HEAD_DIM ? p[cv * DEC_VD + i] : 0.0f;
        x[cv] = vloadV(0, t);
    }
}

/* The P pseudo-rows of target head h from one token's H cached rows (doc/spec.md step 2):
 * out[p] = sum over m of alpha[m][h][p] * row m; identity (P = 1, no mixing): row h. */
static inline void mix_token(const __global kv_t *tok, const __global float *alpha, int identity, int h,
                             floatV out[DEC_P][VCH])
{
    for (int p = 0; p < DEC_P; ++p)
        for (int cv = 0; cv < VCH; ++cv) out[p][cv] = (floatV)(0.0f);
    if (identity) {
        load_row(tok + (size_t)h * HEAD_DIM, out[0]);
        return;
    }
    for (int m = 0; m < DEC_H; ++m) {
        floatV row[VCH];
        load_row(tok + (size_t)m * HEAD_DIM, row);
        const __global float *a = alpha + ((size_t)m * DEC_H + h) * DEC_P;
        for (int p = 0; p < DEC_P; ++p) {
            const floatV w = (floatV)(a[p]);
            for (int cv = 0; cv < VCH; ++cv) out[p][cv] = fma(w, row[cv], out[p][cv]);
        }
    }
}

/* The values' part of one token for target head h: acc[r] += sum over p of pr[r][p] * Vt[p],
 * with alpha_V folded into the probabilities (doc/spec.md, "The compact cache"): sum over m of
 * w[r][m] * V[m], w[r][m] = sum over p of pr[r][p] * alpha[m][h][p]. A row that sees none of the
 * token's keys adds nothing, not 0 times its values. */
static inline void add_values(const __global kv_t *tok, const __global float *alpha, int identity, int h,
                              float pr[DEC_ROWS][DEC_P], floatV acc[DEC_ROWS][VCH])
{
    int sees[DEC_ROWS];
    for (int r = 0; r < DEC_ROWS; ++r) {
        sees[r] = 0;
        for (int p = 0; p < DEC_P; ++p) sees[r] |= pr[r][p] != 0.0f;
    }
    for (int r = 0; r < DEC_ROWS; ++r) {
        if (!sees[r]) continue;
        /* The row's accumulators stay in registers over the token's H rows. */
        floatV sum[VCH];
        for (int cv = 0; cv < VCH; ++cv) sum[cv] = acc[r][cv];
        for (int m = 0; m < DEC_H; ++m) {
            if (identity && m != h) continue;
            const __global float *a = alpha + ((size_t)m * DEC_H + h) * DEC_P;
            float w = 0.0f;
            for (int p = 0; p < DEC_P; ++p) w = fma(pr[r][p], identity ? 1.0f : a[p], w);
            floatV row[VCH];
            load_row(tok + (size_t)m * HEAD_DIM, row);
            const floatV wv = (floatV)(w);
            for (int cv = 0; cv < VCH; ++cv) sum[cv] = fma(wv, row[cv], sum[cv]);
        }
        for (int cv = 0; cv < VCH; ++cv) acc[r][cv] = sum[cv];
    }
}

/* Rotates x by the angles whose cosines and sines are cs and sn (rotate-half, doc/spec.md step 3). */
static inline void rotate(floatV *x, const float *cs, const float *sn)
{
#if HALF_DIM % DEC_VD == 0
    /* Whole vectors pair with whole vectors: element i with element i + d/2. */
    for (int cv = 0; cv < HALF_DIM / DEC_VD; ++cv) {
        const floatV c = vloadV(cv, cs), s = vloadV(cv, sn), a = x[cv], b = x[cv + HALF_DIM / DEC_VD];
        x[cv] = a * c - b * s;
        x[cv + HALF_DIM / DEC_VD] = b * c + a * s;
    }
#else
    float t[HEAD_PAD];
    for (int cv = 0; cv < VCH; ++cv) vstoreV(x[cv], cv, t);
    for (int i = 0; i < HALF_DIM; ++i) {
        const float a = t[i], b = t[i + HALF_DIM];
        t[i] = a * cs[i] - b * sn[i];
        t[i + HALF_DIM] = b * cs[i] + a * sn[i];
    }
    for (int cv = 0; cv < VCH; ++cv) x[cv] = vloadV(cv, t);
#endif
}

/* The angles of positions 0 .. P-1 from their rotary rows `angles`, [P][2][HEAD_DIM/2] (cos,
 * then sin). */
static inline void pseudo_angles(const __global float *angles, float cs[DEC_P][HALF_DIM + 1],
                                 float sn[DEC_P][HALF_DIM + 1])
{
    for (int p = 0; p < DEC_P; ++p)
        for (int i = 0; i < HALF_DIM; ++i) {
            cs[p][i] = angles[(size_t)p * HEAD_DIM + i];
            sn[p][i] = angles[(size_t)p * HEAD_DIM + HALF_DIM + i];
        }
}

static inline float lane_sum(floatV acc)
{
#if DEC_VD == 16
    const float8 a8 = acc.lo + acc.hi;
    const float4 a4 = a8.lo + a8.hi;
#elif DEC_VD == 8
    const float4 a4 = acc.lo + acc.hi;
#else
    const float4 a4 = acc;
#endif
    const float2 a2 = a4.lo + a4.hi;
    return a2.x + a2.y;
}

/* The score of a query row against a pseudo-key, in base 2: scale * log2(e) * dot(q, k). A
 * -inf from finite operands (float32 overflow of the partial sums or of the scaling) is NaN, not
 * a masked key: see SCORE_SHRINK in masks.clh. */
static inline float compact_score(const floatV *q, const floatV *k, float scale_log2)
{
    floatV acc = (floatV)(0.0f);
    for (int cv = 0; cv < VCH; ++cv) acc = fma(q[cv], k[cv], acc);
    const float score = lane_sum(acc) * scale_log2;
    if (score != -INFINITY) return score;
    floatV t = (floatV)(0.0f);
    for (int cv = 0; cv < VCH; ++cv) t = fma(q[cv] * SCORE_SHRINK, k[cv] * SCORE_SHRINK, t);
    return isfinite(lane_sum(t)) ? NAN : score;
}

/* Work-item (row tile, split, (b, head group)): rows r0 .. r0+DEC_ROWS-1 of heads h0 .. h0+DEC_HEADS-1
 * of sequence b against the tokens of split s. q rows [B*H][rows][HEAD_DIM], virtual position
 * n0*P + row, rows past count*P inactive. Splits cut the tokens from the oldest the cache holds
 * into ranges of split_tokens. use_rope: the cached keys are rotated by their tokens' positions
 * n*P (cl/decode_mix.cl, decode_store_compact) and angles holds the rotary rows of positions
 * 0 .. P-1, [P][2][d/2]. */
__kernel void attention_decode_compact_f32(__global const float *q, ulong q_off, __global const kv_t *kc,
                                           __global const kv_t *vc, __global const float *alpha_k, ulong ak_off,
                                           __global const float *alpha_v, ulong av_off, int identity,
                                           __global const float *angles, int use_rope, __global float *part,
                                           __global const int *step, int rows, int slots, int splits,
                                           int split_tokens, int mask, int window, float scale_log2 IHA_PROBE_PARAMS)
{
    const int r0 = get_global_id(0) * DEC_ROWS;
    const int s = get_global_id(1);
    const int groups = (DEC_H + DEC_HEADS - 1) / DEC_HEADS;
    const int b = get_global_id(2) / groups, h0 = get_global_id(2) % groups * DEC_HEADS;
    if (r0 >= rows || s >= splits) return;
    const int P = DEC_P;
    const int n0 = step[2 * b], count = step[2 * b + 1], end = n0 + count;
    const int T = end * P, active = count * P;
    alpha_k += ak_off;
    alpha_v += av_off;

    /* Each row's visible virtual keys [lo, hi]; the tokens the tile reads, [first, last]. */
    int lo[DEC_ROWS], hi[DEC_ROWS];
    int first = end, last = -1;
    for (int r = 0; r < DEC_ROWS; ++r) {
        lo[r] = T;
        hi[r] = -1;
        if (r0 + r < active) {
            const int2 v = visible_range(n0 * P + r0 + r, T, P, mask, window);
            lo[r] = v.x;
            hi[r] = v.y;
            first = min(first, v.x / P);
            last = max(last, v.y / P);
        }
    }
    const int held = KV_RING ? max(0, end - slots) : 0;
    first = max(first, held + s * split_tokens);
    last = min(last, min(end - 1, held + (s + 1) * split_tokens - 1));

    floatV qv[DEC_HEADS][DEC_ROWS][VCH], acc[DEC_HEADS][DEC_ROWS][VCH];
    float mx[DEC_HEADS][DEC_ROWS], sum[DEC_HEADS][DEC_ROWS];
    for (int hh = 0; hh < DEC_HEADS; ++hh)
        for (int r = 0; r < DEC_ROWS; ++r) {
            mx[hh][r] = -INFINITY;
            sum[hh][r] = 0.0f;
            for (int cv = 0; cv < VCH; ++cv) qv[hh][r][cv] = acc[hh][r][cv] = (floatV)(0.0f);
            if (h0 + hh < DEC_H && r0 + r < active)
                load_query(q + q_off + ((size_t)(b * DEC_H + h0 + hh) * rows + r0 + r) * HEAD_DIM, qv[hh][r]);
        }

    float cs[DEC_P][HALF_DIM + 1], sn[DEC_P][HALF_DIM + 1];
    if (use_rope) pseudo_angles(angles, cs, sn);

    int n = first;
    for (; n <= last + IHA_PROBE_PAST; ++n) {
        IHA_PROBE_SKIP_PAST(n > last);
        const int slot = KV_RING ? n % slots : n;
        const __global kv_t *kt = kc + ((size_t)b * slots + slot) * DEC_H * HEAD_DIM;
        const __global kv_t *vt = vc + ((size_t)b * slots + slot) * DEC_H * HEAD_DIM;
        for (int hh = 0; hh < DEC_HEADS && h0 + hh < DEC_H; ++hh) {
            floatV mixed[DEC_P][VCH];
            mix_token(kt, alpha_k, identity, h0 + hh, mixed);
            if (use_rope)
                for (int p = 0; p < DEC_P; ++p) rotate(mixed[p], cs[p], sn[p]);
            float pr[DEC_ROWS][DEC_P];
            for (int r = 0; r < DEC_ROWS; ++r) {
                float top = -INFINITY;
                for (int p = 0; p < DEC_P; ++p) {
                    const int u = n * P + p;
                    pr[r][p] = u >= lo[r] && u <= hi[r] ? compact_score(qv[hh][r], mixed[p], scale_log2) : -INFINITY;
                    top = fmax(top, pr[r][p]);
                }
                /* A new maximum rescales what the row holds; -inf scores (masked ones too) add nothing. */
                if (top > mx[hh][r]) {
                    const float f = exp2(mx[hh][r] - top);
                    sum[hh][r] *= f;
                    for (int cv = 0; cv < VCH; ++cv) acc[hh][r][cv] *= f;
                    mx[hh][r] = top;
                }
                for (int p = 0; p < DEC_P; ++p) {
                    pr[r][p] = pr[r][p] == -INFINITY ? 0.0f : exp2(pr[r][p] - mx[hh][r]);
                    sum[hh][r] += pr[r][p];
                }
            }
            add_values(vt, alpha_v, identity, h0 + hh, pr, acc[hh]);
        }
    }
    IHA_PROBE_EXPECT(n >= last + 1 + IHA_PROBE_PAST);

    for (int hh = 0; hh < DEC_HEADS && h0 + hh < DEC_H; ++hh)
        for (int r = 0; r < DEC_ROWS && r0 + r < rows; ++r) {
            __global float *out = part + (((size_t)(b * DEC_H + h0 + hh) * rows + r0 + r) * splits + s) * PART_STRIDE;
            float t[HEAD_PAD];
            for (int cv = 0; cv < VCH; ++cv) vstoreV(acc[hh][r][cv], cv, t);
            for (int c = 0; c < HEAD_DIM; ++c) out[c] = t[c];
            out[HEAD_DIM] = mx[hh][r];
            out[HEAD_DIM + 1] = sum[hh][r];
        }
    IHA_PROBE_CHECK();
}
