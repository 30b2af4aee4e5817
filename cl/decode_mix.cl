/* Mixing for a decoding step: the new tokens' pseudo-queries into rows [B][H][k*P][d], and their
 * pseudo-keys and -values straight into the cache at their virtual positions, in the cache's
 * storage type: values in rows [B][H][t_max][d], keys (key_block = KB > 0) in the key-block
 * layout of attention.cl, [B][H][ceil(t_max/KB)][d][KB]. Rotary uses the same double-precision cos/sin table as mix.cl ([T][2][d/2]).
 * step[b] = (n0, count): sequence b's length before the step and its new tokens. Tokens past
 * count are skipped (their query rows are written as 0). One (token, head) per work-item. */
#include "loop_probe.clh"

/* 1: the cache is a ring of t_max rows (src/layer/kv_cache.h): position pos at row pos mod
 * t_max, and the rotary rows come by the step's token, [B][k*P][2][d/2], since positions
 * outgrow any table. */
#ifndef KV_RING
#define KV_RING 0
#endif
#if KV_RING
#define ROPE_ROW(b, j, p, pos) (((size_t)(b) * k + (j)) * P + (p))
#else
#define ROPE_ROW(b, j, p, pos) ((size_t)(pos))
#endif

/* Cache storage: CACHE_HALF 1 stores half with vstore_half (core OpenCL, no cl_khr_fp16
 * needed), CACHE_BF16 1 bfloat16 with bf16.clh's rounding; neither, float. */
#ifndef CACHE_HALF
#define CACHE_HALF 0
#endif
#ifndef CACHE_BF16
#define CACHE_BF16 0
#endif

#if CACHE_HALF
#define cache_t half
#define CACHE_STORE(x, i, p) vstore_half((x), (i), (p))
#elif CACHE_BF16
#include "bf16.clh"
#define cache_t ushort
#define CACHE_STORE(x, i, p) bf16_store((x), (i), (p))
#else
#define cache_t float
#define CACHE_STORE(x, i, p) ((p)[(i)] = (x))
#endif

/* sum_m alpha[m][h][p] * row[m][c], or row[h][c] for identity mixing. */
static inline float mixed(const __global float *row, const __global float *alpha, int identity, int h, int p, int H,
                          int P, int d, int c)
{
    if (identity) return row[(size_t)h * d + c];
    float acc = 0.0f;
    for (int m = 0; m < H; ++m) acc = fma(alpha[((size_t)m * H + h) * P + p], row[(size_t)m * d + c], acc);
    return acc;
}

/* Writes pseudo-head row (t = n*P + p) of one token into out[c * stride] for c < d, rotated by
 * the rotary table's row `rope_row` (position pos) when rope is given. */
#define MIX_ROW(STORE)                                                                               \
    do {                                                                                             \
        const int pairs = d / 2;                                                                     \
        if (use_rope) {                                                                              \
            const __global float *cs = rope + rope_row * d;                                           \
            for (int c = 0; c < pairs; ++c) {                                                        \
                const float x0 = mixed(row, alpha, identity, h, p, H, P, d, c);                     \
                const float x1 = mixed(row, alpha, identity, h, p, H, P, d, c + pairs);             \
                STORE(x0 * cs[c] - x1 * cs[pairs + c], c);                                           \
                STORE(x1 * cs[c] + x0 * cs[pairs + c], c + pairs);                                   \
            }                                                                                        \
        } else {                                                                                     \
            for (int c = 0; c < d; ++c) STORE(mixed(row, alpha, identity, h, p, H, P, d, c), c);     \
        }                                                                                            \
    } while (0)

__kernel void decode_mix_queries_f32(__global const float *src, ulong src_off, /* [B][k][H][d] */
                                     __global const float *alpha, ulong alpha_off, int identity,
                                     __global float *dst, ulong dst_off, /* [B][H][k*P][d] */
                                     __global const float *rope, int use_rope, __global const int *step, int k,
                                     int H, int d, int P IHA_PROBE_PARAMS)
{
    const int j = get_global_id(0);
    const int bh = get_global_id(1);
    if (j >= k) return;
    const int h = bh % H, b = bh / H;
    const int n0 = step[2 * b], count = step[2 * b + 1];
    const __global float *row = src + src_off + ((size_t)b * k + j) * H * d;
    alpha += alpha_off;
    for (int p = 0; p < P; ++p) {
        __global float *out = dst + dst_off + (((size_t)bh * k + j) * P + p) * d;
        if (j >= count) {
            for (int c = 0; c < d; ++c) out[c] = 0.0f;
            continue;
        }
        const size_t rope_row = ROPE_ROW(b, j, p, (n0 + j) * P + p);
#define STORE_Q(x, c) (out[(c)] = (x))
        MIX_ROW(STORE_Q);
#undef STORE_Q
    }
    IHA_PROBE_CHECK();
}

__kernel void decode_mix_cache(__global const float *src, ulong src_off, /* [B][k][H][d] */
                               __global const float *alpha, ulong alpha_off, int identity,
                               __global cache_t *cache, /* see above */
                               __global const float *rope, int use_rope, __global const int *step, int k, int H,
                               int d, int P, int t_max, int key_block IHA_PROBE_PARAMS)
{
    const int j = get_global_id(0);
    const int bh = get_global_id(1);
    if (j >= k) return;
    const int h = bh % H, b = bh / H;
    const int n0 = step[2 * b], count = step[2 * b + 1];
    if (j >= count) return;
    const __global float *row = src + src_off + ((size_t)b * k + j) * H * d;
    alpha += alpha_off;
    for (int p = 0; p < P; ++p) {
        const int pos = (n0 + j) * P + p;
        const size_t rope_row = ROPE_ROW(b, j, p, pos);
#if KV_RING
        const int at = pos % t_max;
#else
        const int at = pos;
#endif
        /* Element c of this row sits at base + c * stride. */
        size_t base = ((size_t)bh * t_max + at) * d, stride = 1;
        if (key_block) {
            const int blocks = (t_max + key_block - 1) / key_block;
            base = ((size_t)bh * blocks + at / key_block) * d * key_block + at % key_block;
            stride = (size_t)key_block;
        }
#define STORE_C(x, c) CACHE_STORE((x), base + (size_t)(c) * stride, cache)
        MIX_ROW(STORE_C);
#undef STORE_C
    }
    IHA_PROBE_CHECK();
}

/* A compact cache (cl/attention_decode_compact.cl): the new tokens' own keys and values, [B][k][H][d]
 * each, into keys and values [B][slots][H][d] at their tokens' slots (a ring: token n at slot
 * n mod slots), no mixing. With rotary (use_rope) each key row is stored rotated by its token's
 * first virtual position n*P (rope: the rotary table, or a ring's rows of the step), so a read
 * rotates by the pseudo index p alone: R(n*P + p) = R(p) R(n*P). One (token, head) per
 * work-item. */
__kernel void decode_store_compact(__global const float *k_src, __global const float *v_src,
                                   __global cache_t *keys, __global cache_t *values, __global const float *rope,
                                   int use_rope, __global const int *step, int k, int H, int d, int P,
                                   int slots IHA_PROBE_PARAMS)
{
    const int j = get_global_id(0);
    const int bh = get_global_id(1);
    if (j >= k) return;
    const int h = bh % H, b = bh / H;
    const int n0 = step[2 * b], count = step[2 * b + 1];
    if (j >= count) return;
#if KV_RING
    const int slot = (n0 + j) % slots;
#else
    const int slot = n0 + j;
#endif
    const size_t src = (((size_t)b * k + j) * H + h) * d, dst = (((size_t)b * slots + slot) * H + h) * d;
    for (int c = 0; c < d; ++c) CACHE_STORE(v_src[src + c], dst + c, values);
    if (use_rope) {
        const __global float *cs = rope + ROPE_ROW(b, j, 0, (n0 + j) * P) * d;
        const int pairs = d / 2;
        for (int c = 0; c < pairs; ++c) {
            const float x0 = k_src[src + c], x1 = k_src[src + c + pairs];
            CACHE_STORE(x0 * cs[c] - x1 * cs[pairs + c], dst + c, keys);
            CACHE_STORE(x1 * cs[c] + x0 * cs[pairs + c], dst + c + pairs, keys);
        }
    } else {
        for (int c = 0; c < d; ++c) CACHE_STORE(k_src[src + c], dst + c, keys);
    }
    IHA_PROBE_CHECK();
}
