/*
 * test_packed.c - packed variable-length batches (options->seq_lens; doc/spec.md, "Packed
 * documents") against the float64 reference run per sequence: iha_forward (device, offsets and
 * host), iha_attention_core, iha_attention, iha_attention_backward (the public call and both
 * kernel families through the internal enqueue), iha_backward and iha_backward_saved, on every
 * mask, with windows and rotary, B = 1 and 2, uneven lengths with length-1 sequences. Also: a
 * packed batch equals its sequences run one by one, every forward attention variant honours the
 * bounds, bad lengths are refused with nothing written, and the packed decoding step (prefill
 * and generation, on a plain cache and on a ring in bfloat16) matches the forward.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_configs.h"
#include "kernels/attention_backward.h"
#include "kernels/mix.h"
#include "reference.h"
#include "test_layer.h"
#include "test_util.h"
#include "tune/tunable.h"

enum { CAUSAL = IHA_MASK_CAUSAL, TOKEN = IHA_MASK_TOKEN_CAUSAL, NONE = IHA_MASK_NONE };
#define MAX_SEQS 8

typedef struct packed_case {
    size_t B, N, D, H, d, P;
    int mask;
    int64_t window;
    int rope;
    size_t lens[MAX_SEQS]; /* 0 ends the list */
} packed_case;

/* Sequences that start and end inside key blocks and tiles, span several blocks (T = 120 with
 * 16-key blocks: whole blocks of other sequences are skipped), length 1, and batch rows of one
 * sequence beside rows of several. Two head widths only: each is a program to build per kernel
 * and configuration, and the sequences' bounds do not depend on it (test_small_shapes covers
 * the widths). */
static const packed_case kCases[] = {
    /* B   N   D  H   d  P  mask    window rope  lengths */
    {1, 13, 12, 2,  8, 2, CAUSAL, 0, 1, {5, 1, 7}},
    {2,  9, 10, 2,  8, 3, TOKEN,  2, 0, {4, 5, 1, 8}},
    {2, 10,  8, 1, 16, 2, NONE,   3, 1, {10, 3, 3, 1, 3}},
    {1, 20, 16, 2, 16, 1, CAUSAL, 4, 1, {1, 1, 18}},
    {1, 40,  8, 1, 16, 3, NONE,   0, 0, {17, 23}},
    {2, 12,  8, 2,  8, 2, TOKEN,  0, 0, {1, 11, 6, 6}},
    {1, 24,  8, 1, 16, 2, CAUSAL, 0, 0, {9, 1, 1, 13}},
};
#define CASE_COUNT (sizeof kCases / sizeof kCases[0])

static size_t seq_count_of(const packed_case *c)
{
    size_t n = 0;
    while (n < MAX_SEQS && c->lens[n]) ++n;
    return n;
}

static iha_shape shape_of(const packed_case *c) { return (iha_shape){c->B, c->N, c->D, c->H, c->d, c->P}; }

static iha_attention_options options_of(const packed_case *c, int rope)
{
    iha_attention_options o = tu_options(c->mask, c->window, rope);
    o.seq_lens = c->lens;
    o.seq_count = seq_count_of(c);
    return o;
}

/* ---- The layer calls ---- */

static void forward_case(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t i = 0; i < CASE_COUNT; ++i) {
        const packed_case *c = &kCases[i];
        const iha_shape s = shape_of(c);
        const iha_attention_options o = options_of(c, c->rope);
        const tu_api api = i % 3 == 0 ? TU_API_DEVICE : i % 3 == 1 ? TU_API_DEVICE_OFFSETS : TU_API_HOST;
        tu_check_random_layer(tu_ctx, &s, 5100 + i, &o, api);
        const tu_core_layout at = {1, 2, 3, 4, {5, 6, 7, 8}, 16};
        tu_check_random_core(tu_ctx, &s, &o, 5200 + i, 1.0f, 0, &at);
    }
}

/* The nine outputs of the layer's backward: dx, then iha_layer_grads' order. */
enum { OUTPUTS = 9 };
static const char *const kOutputNames[OUTPUTS] = {"dx", "dwq", "dwk", "dwv", "dwo", "dalpha_q", "dalpha_k", "dalpha_v", "dr"};

static size_t output_count(const iha_shape *s, int i)
{
    return i == 0 ? tu_count_x(s) : i < 5 ? tu_count_w(s) : tu_count_mix(s);
}

/* iha_backward, and iha_backward_saved after iha_forward_save, against ref_backward. */
static void backward_case(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t i = 0; i < CASE_COUNT; ++i) {
        const packed_case *c = &kCases[i];
        const iha_shape s = shape_of(c);
        const iha_attention_options o = options_of(c, c->rope);
        tu_layer l;
        tu_layer_init(&l, &s, 5300 + i);
        tu_device_layer d;
        tu_device_layer_upload(tu_ctx, &l, 1, &d);
        const size_t nx = tu_count_x(&s);
        tu_rng rng = tu_rng_seeded(5400 + i);
        float *dz = tu_random_array(&rng, nx, 1.0f);
        const iha_buffer bdz = {tu_buffer_guarded(tu_ctx, dz, nx, 3, 0, 0.0f), 3};

        double *ref[OUTPUTS];
        for (int j = 0; j < OUTPUTS; j++) ref[j] = tu_malloc(output_count(&s, j) * sizeof(double));
        const ref_grads rg = {ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], ref[6], ref[7], ref[8]};
        const ref_problem p = tu_layer_problem(&l, &o);
        assert_int_equal(ref_backward(&p, dz, &rg), 0);

        size_t ns = 0;
        tu_assert_status(tu_ctx, iha_saved_elements(tu_ctx, &s, &ns), IHA_OK);
        const iha_buffer saved = {tu_buffer_new(tu_ctx, ns), 0};
        tu_assert_status(tu_ctx, iha_forward_save(tu_ctx, &s, &o, &d.weights, d.x, d.z, saved), IHA_OK);
        for (int from_saved = 0; from_saved < 2; ++from_saved) {
            iha_buffer out[OUTPUTS];
            for (int j = 0; j < OUTPUTS; j++)
                out[j] = (iha_buffer){tu_buffer_guarded(tu_ctx, NULL, output_count(&s, j), 2, TU_GUARD, TU_SENTINEL), 2};
            const iha_layer_grads g = {out[1], out[2], out[3], out[4], out[5], out[6], out[7], out[8]};
            const iha_status st = from_saved
                                      ? iha_backward_saved(tu_ctx, &s, &o, &d.weights, d.x, saved, bdz, out[0], &g)
                                      : iha_backward(tu_ctx, &s, &o, &d.weights, d.x, bdz, out[0], &g);
            tu_assert_status(tu_ctx, st, IHA_OK);
            for (int j = 0; j < OUTPUTS; j++) {
                char what[64];
                snprintf(what, sizeof what, "%s (%s, case %zu)", kOutputNames[j],
                         from_saved ? "iha_backward_saved" : "iha_backward", i);
                tu_assert_buffer_close(tu_ctx, what, out[j], output_count(&s, j), ref[j], TU_TOL_F32);
                tu_buffer_release(out[j].mem);
            }
        }
        for (int j = 0; j < OUTPUTS; j++) free(ref[j]);
        tu_buffer_release(saved.mem);
        tu_buffer_release(bdz.mem);
        free(dz);
        tu_device_layer_release(&d);
        tu_layer_free(&l);
    }
}

/* ---- The attention calls on virtual tensors ---- */

/* iha_attention with LSE on ctx against ref_attention; expected, when not NULL, is the
 * configuration the context forces. */
static void attention_on(iha_context *ctx, const packed_case *c, const char *expected, uint64_t seed)
{
    const iha_shape s = shape_of(c);
    const iha_attention_options o = options_of(c, 0);
    ac_check_attention(ctx, &s, &o, expected, seed);
}

static void attention_case(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t i = 0; i < CASE_COUNT; ++i) attention_on(tu_ctx, &kCases[i], NULL, 5500 + i);
}

/* Each token's (first, end) within its batch row, as the kernels take them. */
static cl_mem bounds_buffer(const packed_case *c)
{
    const size_t tokens = c->B * c->N;
    cl_int *host = tu_malloc(2 * tokens * sizeof *host);
    for (size_t i = 0, start = 0; i < seq_count_of(c); start += c->lens[i++])
        for (size_t n = start; n < start + c->lens[i]; ++n)
            host[2 * n] = (cl_int)(start % c->N), host[2 * n + 1] = (cl_int)(start % c->N + c->lens[i]);
    cl_int err;
    cl_mem m = clCreateBuffer(iha_context_cl_context(tu_ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                              2 * tokens * sizeof *host, host, &err);
    assert_int_equal(err, CL_SUCCESS);
    free(host);
    return m;
}

/* iha_attention_backward against ref_attention_backward, then the row kernels (GPUs) and the
 * tile kernels (CPUs) through the internal enqueue, whatever this device would choose. */
static void attention_backward_case(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t i = 0; i < CASE_COUNT; ++i) {
        const packed_case *c = &kCases[i];
        const iha_shape s = shape_of(c);
        const iha_attention_options o = options_of(c, 0);
        const size_t n = tu_count_virtual(&s), rows = n / c->d;
        tu_rng rng = tu_rng_seeded(5600 + i);
        float *in[4];
        for (int j = 0; j < 4; j++) in[j] = tu_random_array(&rng, n, 1.0f);
        const ref_problem p = tu_problem(&s, &o);
        double *od = tu_malloc(n * sizeof *od), *ld = tu_malloc(rows * sizeof *ld), *ref[3];
        assert_int_equal(ref_attention(&p, in[0], in[1], in[2], od, ld), 0);
        for (int j = 0; j < 3; j++) ref[j] = tu_malloc(n * sizeof(double));
        assert_int_equal(ref_attention_backward(&p, in[0], in[1], in[2], in[3], ref[0], ref[1], ref[2]), 0);
        float *of = tu_malloc(n * sizeof *of), *lf = tu_malloc(rows * sizeof *lf);
        for (size_t j = 0; j < n; j++) of[j] = (float)od[j];
        for (size_t j = 0; j < rows; j++) lf[j] = (float)ld[j];
        cl_mem b[6];
        for (int j = 0; j < 3; j++) b[j] = tu_buffer_guarded(tu_ctx, in[j], n, 0, 0, 0);
        b[3] = tu_buffer_guarded(tu_ctx, of, n, 0, 0, 0);
        b[4] = tu_buffer_guarded(tu_ctx, lf, rows, 0, 0, 0);
        b[5] = tu_buffer_guarded(tu_ctx, in[3], n, 0, 0, 0);
        static const char *const names[3][3] = {{"dqt (call)", "dkt (call)", "dvt (call)"},
                                                {"dqt (rows)", "dkt (rows)", "dvt (rows)"},
                                                {"dqt (tiles)", "dkt (tiles)", "dvt (tiles)"}};

        iha_buffer out[3];
        for (int j = 0; j < 3; j++) out[j] = (iha_buffer){tu_buffer_guarded(tu_ctx, NULL, n, 1, TU_GUARD, TU_SENTINEL), 1};
        tu_assert_status(tu_ctx,
                         iha_attention_backward(tu_ctx, &s, &o, (iha_buffer){b[0], 0}, (iha_buffer){b[1], 0},
                                                (iha_buffer){b[2], 0}, (iha_buffer){b[3], 0}, (iha_buffer){b[4], 0},
                                                (iha_buffer){b[5], 0}, out[0], out[1], out[2]),
                         IHA_OK);
        for (int j = 0; j < 3; j++) tu_assert_buffer_close(tu_ctx, names[0][j], out[j], n, ref[j], TU_TOL_F32);

        iha_dims dims = {c->B, c->N, c->H, c->d, c->P, c->N * c->P, bounds_buffer(c)};
        for (int tiles = 0; tiles < 2; ++tiles) {
            cl_mem packed[3] = {NULL, NULL, NULL}, delta = tu_buffer_new(tu_ctx, rows);
            size_t work[3] = {iha__packed_keys_elements(&dims, 16), iha__packed_keys_elements(&dims, 16), 0};
            assert_true(iha__attention_backward_partial_elements(tu_ctx, &dims, &work[2]));
            for (int j = 0; tiles && j < 3; j++) packed[j] = tu_buffer_new(tu_ctx, work[j]);
            iha_backward_refs r = {{b[0], 0}, {b[1], 0},       {b[2], 0},          {b[3], 0},
                                   {b[4], 0}, {b[5], 0},       out[0],             out[1],
                                   out[2],    delta,           {packed[0], packed[1]}, packed[2]};
            tu_assert_status(tu_ctx,
                             iha__attention_backward_enqueue(tu_ctx, &dims, &r, NULL, c->mask, (size_t)c->window,
                                                             1.0f / sqrtf((float)c->d)),
                             IHA_OK);
            for (int j = 0; j < 3; j++) tu_assert_buffer_close(tu_ctx, names[1 + tiles][j], out[j], n, ref[j], TU_TOL_F32);
            for (int j = 0; j < 3; j++) tu_buffer_release(packed[j]);
            tu_buffer_release(delta);
        }
        tu_buffer_release(dims.seq_bounds);
        for (int j = 0; j < 3; j++) tu_buffer_release(out[j].mem), free(ref[j]);
        for (int j = 0; j < 6; j++) tu_buffer_release(b[j]);
        for (int j = 0; j < 4; j++) free(in[j]);
        free(od), free(ld), free(of), free(lf);
    }
}

/* Every forward attention variant, forced as test_attention_variants does. */
static const ac_variant kVariants[] = {
    {"register tiles 4x1, 128 work-items", {4, 1, 16, 4, 128, 0, 32, 0, 4, 4}},
    {"register tiles 4x8", {4, 8, 16, 16, 1, 0, 32, 0, 4, 4}},
    {"local, 16 rows, 16 keys, KB 8", {1, 1, 8, 4, 16, 1, 16, 0, 4, 4}},
    {"local tiles, 16 rows, 16 keys, KB 4", {1, 1, 4, 4, 16, 2, 16, 0, 4, 4}},
    {"local tiles 8x4, 64 rows, 32 keys, KB 8", {1, 1, 8, 4, 64, 2, 32, 0, 8, 4}},
};

static void attention_variants(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_tunable *t = &iha__tunable_attention;
    iha_tune_limits limits;
    iha__tune_limits(tu_ctx, &limits);
    for (size_t v = 0; v < sizeof kVariants / sizeof kVariants[0]; ++v) {
        char expected[512];
        iha_context *ctx = ac_context_forcing(&kVariants[v].cfg, expected, sizeof expected);
        const iha_tune_config config = ac_tune_config(&kVariants[v].cfg);
        for (size_t i = 0; i < CASE_COUNT; ++i) {
            const packed_case *c = &kCases[i];
            if (!ac_fits(ctx, &kVariants[v].cfg, c->d)) continue;
            const iha_shape s = shape_of(c);
            const iha_attention_options o = options_of(c, 0);
            iha_tune_bucket bucket;
            const char *why = NULL;
            assert_true(t->bucket_of(ctx, &s, &o, &bucket));
            if (!iha__space_valid(t->space, &config, &bucket, &limits, &why)) continue;
            attention_on(ctx, c, expected, 5700 + 16 * v + i);
        }
        iha_context_free(ctx);
    }
}

/* ---- Packed against one by one ---- */

/* A batch of one row packing three sequences gives, token for token, what iha_forward gives
 * each sequence alone (within the float32 tolerance: the kernels' tiles differ). */
static void packed_equals_separate(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const size_t lens[3] = {7, 1, 12};
    const size_t N = 20, D = 12;
    for (int mask = 0; mask < 3; ++mask) {
        const iha_shape s = {1, N, D, 2, 8, 3};
        tu_layer l;
        tu_layer_init(&l, &s, 5800 + (uint64_t)mask);
        tu_device_layer d;
        tu_device_layer_upload(tu_ctx, &l, 0, &d);
        iha_attention_options o = tu_options(mask, mask == 1 ? 3 : 0, 1);
        o.seq_lens = lens;
        o.seq_count = 3;
        tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &d.weights, d.x, d.z), IHA_OK);
        float *packed = tu_malloc(N * D * sizeof *packed);
        tu_buffer_read(tu_ctx, d.z.mem, d.z.offset, packed, N * D);
        double *alone = tu_malloc(N * D * sizeof *alone);
        o.seq_lens = NULL;
        o.seq_count = 0;
        for (size_t i = 0, first = 0; i < 3; first += lens[i++]) {
            const iha_shape one = {1, lens[i], D, 2, 8, 3};
            const size_t count = lens[i] * D;
            cl_mem x = tu_buffer_new(tu_ctx, count), z = tu_buffer_new(tu_ctx, count);
            tu_buffer_write(tu_ctx, x, 0, l.x + first * D, count);
            tu_assert_status(tu_ctx, iha_forward(tu_ctx, &one, &o, &d.weights, (iha_buffer){x, 0}, (iha_buffer){z, 0}),
                             IHA_OK);
            float *zf = tu_malloc(count * sizeof *zf);
            tu_buffer_read(tu_ctx, z, 0, zf, count);
            for (size_t j = 0; j < count; ++j) alone[first * D + j] = zf[j];
            free(zf);
            tu_buffer_release(x);
            tu_buffer_release(z);
        }
        tu_assert_close("z packed against one by one", packed, alone, N * D, TU_TOL_F32);
        free(packed);
        free(alone);
        tu_device_layer_release(&d);
        tu_layer_free(&l);
    }
}

/* ---- Refusals ---- */

static void bad_lengths_refused(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {2, 5, 8, 2, 4, 2};
    tu_layer l;
    tu_layer_init(&l, &s, 5900);
    tu_device_layer d;
    tu_device_layer_upload(tu_ctx, &l, 0, &d);
    const size_t nx = tu_count_x(&s);
    static const size_t zero[3] = {0, 5, 5}, short_sum[2] = {5, 4}, crossing[3] = {3, 4, 3}, long_sum[3] = {5, 5, 1};
    static const size_t ok[2] = {5, 5}, many[11] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const struct {
        const size_t *lens;
        size_t count;
        const char *message; /* a part of the refusal's message */
    } bad[] = {{zero, 3, "is 0"},        {short_sum, 2, "sum to 9"},         {crossing, 3, "crosses"},
               {long_sum, 3, "runs past"}, {NULL, 2, "seq_lens is NULL"}, {ok, 0, "seq_count is 0"},
               {many, 11, "exceeds"}};
    cl_mem dx = tu_buffer_guarded(tu_ctx, NULL, nx, 0, 0, 0.0f);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
        o.seq_lens = bad[i].lens;
        o.seq_count = bad[i].count;
        tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &d.weights, d.x, d.z), IHA_ERROR_INVALID_ARGUMENT);
        if (strstr(iha_context_message(tu_ctx), bad[i].message) == NULL)
            fail_msg("refusal %zu: message \"%s\" lacks \"%s\"", i, iha_context_message(tu_ctx), bad[i].message);
        tu_assert_buffer_all(tu_ctx, d.z.mem, d.z.offset, nx, NAN); /* still the poison */
        tu_assert_status(tu_ctx, iha_backward(tu_ctx, &s, &o, &d.weights, d.x, d.x, (iha_buffer){dx, 0}, NULL),
                         IHA_ERROR_INVALID_ARGUMENT);
        tu_assert_buffer_all(tu_ctx, dx, 0, nx, NAN);
        const size_t n = tu_count_virtual(&s);
        cl_mem v[4];
        for (int j = 0; j < 4; ++j) v[j] = tu_buffer_new(tu_ctx, n);
        tu_assert_status(tu_ctx,
                         iha_attention(tu_ctx, &s, &o, (iha_buffer){v[0], 0}, (iha_buffer){v[1], 0},
                                       (iha_buffer){v[2], 0}, (iha_buffer){v[3], 0}, (iha_buffer){NULL, 0}),
                         IHA_ERROR_INVALID_ARGUMENT);
        for (int j = 0; j < 4; ++j) tu_buffer_release(v[j]);
    }
    tu_buffer_release(dx);
    tu_device_layer_release(&d);
    tu_layer_free(&l);
}

/* ---- The packed decoding step ---- */

/* Two sequences prefilled with packed x of 3 and 6 tokens, then a packed step of 2 and 1
 * tokens: each output row equals the forward's row of its sequence (causal, rotary). Refusals:
 * counts given, a length past the step's tokens, seq_count other than the cache's batch. */
static void decode_packed(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const size_t N = 10, D = 12;
    const iha_shape full = {2, N, D, 2, 8, 2};
    tu_layer l;
    tu_layer_init(&l, &full, 6000);
    tu_device_layer d;
    tu_device_layer_upload(tu_ctx, &l, 0, &d);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    double *zref = tu_layer_reference(&l, &o);
    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &full, IHA_STORAGE_F32, &cache), IHA_OK);
    static const size_t steps[2][2] = {{3, 6}, {2, 1}};
    size_t done[2] = {0, 0};
    for (int st = 0; st < 2; ++st) {
        const size_t k = steps[st][0] > steps[st][1] ? steps[st][0] : steps[st][1];
        const size_t total = steps[st][0] + steps[st][1];
        const iha_shape step = {2, k, D, 2, 8, 2};
        float *x = tu_malloc(total * D * sizeof *x);
        double *want = tu_malloc(total * D * sizeof *want);
        for (size_t b = 0, row = 0; b < 2; ++b)
            for (size_t j = 0; j < steps[st][b]; ++j, ++row) {
                memcpy(x + row * D, l.x + (b * N + done[b] + j) * D, D * sizeof *x);
                for (size_t e = 0; e < D; ++e) want[row * D + e] = zref[(b * N + done[b] + j) * D + e];
            }
        cl_mem xb = tu_buffer_new(tu_ctx, total * D);
        const iha_buffer zb = {tu_buffer_guarded(tu_ctx, NULL, total * D, 5, TU_GUARD, TU_SENTINEL), 5};
        tu_buffer_write(tu_ctx, xb, 0, x, total * D);
        o.seq_lens = steps[st];
        o.seq_count = 2;
        if (st == 0) {
            static const uint32_t counts[2] = {3, 6};
            static const size_t past[2] = {3, 7};
            tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &d.weights, counts, (iha_buffer){xb, 0}, zb),
                             IHA_ERROR_INVALID_ARGUMENT);
            o.seq_lens = past;
            tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &d.weights, NULL, (iha_buffer){xb, 0}, zb),
                             IHA_ERROR_INVALID_ARGUMENT);
            o.seq_lens = steps[st];
            o.seq_count = 1;
            tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &d.weights, NULL, (iha_buffer){xb, 0}, zb),
                             IHA_ERROR_INVALID_ARGUMENT);
            o.seq_count = 2;
            tu_assert_buffer_all(tu_ctx, zb.mem, zb.offset, total * D, NAN);
            assert_int_equal(iha_kv_cache_length(cache, 0), 0);
        }
        tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &d.weights, NULL, (iha_buffer){xb, 0}, zb),
                         IHA_OK);
        tu_assert_buffer_close(tu_ctx, st == 0 ? "z (packed prefill)" : "z (packed step)", zb, total * D, want,
                               TU_TOL_F32);
        for (size_t b = 0; b < 2; ++b) {
            done[b] += steps[st][b];
            assert_int_equal(iha_kv_cache_length(cache, b), done[b]);
        }
        tu_buffer_release(xb);
        tu_buffer_release(zb.mem);
        free(x);
        free(want);
    }
    iha_kv_cache_free(cache);
    free(zref);
    tu_device_layer_release(&d);
    tu_layer_free(&l);
}

/* A packed step into a ring (L = 4 tokens, window 3) with bfloat16 activations and a half
 * cache: a sequence of 0 tokens beside one of 7, which runs as sub-steps through the padded
 * copies; every output row against the windowed float64 forward, within bfloat16's contract. */
static void decode_packed_ring_bf16(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const size_t N = 10, D = 12;
    const iha_shape full = {2, N, D, 2, 8, 2};
    tu_layer l;
    tu_layer_init(&l, &full, 6100);
    tu_device_layer d;
    tu_device_layer_upload(tu_ctx, &l, 0, &d);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 3, 1);
    double *zref = tu_layer_reference(&l, &o);
    o.storage = IHA_STORAGE_BF16;
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = IHA_STORAGE_F16;
    co.window = 3;
    co.cache_tokens = 4;
    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create_with(tu_ctx, &full, &co, &cache), IHA_OK);
    static const size_t steps[3][2] = {{0, 7}, {6, 0}, {2, 3}};
    size_t done[2] = {0, 0};
    for (int st = 0; st < 3; ++st) {
        const size_t k = steps[st][0] > steps[st][1] ? steps[st][0] : steps[st][1];
        const size_t total = steps[st][0] + steps[st][1];
        const iha_shape step = {2, k, D, 2, 8, 2};
        float *x = tu_malloc(total * D * sizeof *x);
        double *want = tu_malloc(total * D * sizeof *want);
        for (size_t b = 0, row = 0; b < 2; ++b)
            for (size_t j = 0; j < steps[st][b]; ++j, ++row) {
                memcpy(x + row * D, l.x + (b * N + done[b] + j) * D, D * sizeof *x);
                for (size_t e = 0; e < D; ++e) want[row * D + e] = zref[(b * N + done[b] + j) * D + e];
            }
        const iha_buffer xb = {tu_tensor_guarded(tu_ctx, IHA_STORAGE_BF16, x, total * D, 0, 0, 0.0f), 0};
        const iha_buffer zb = {tu_tensor_guarded(tu_ctx, IHA_STORAGE_BF16, NULL, total * D, 5, TU_GUARD, TU_SENTINEL), 5};
        o.seq_lens = steps[st];
        o.seq_count = 2;
        tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &d.weights, NULL, xb, zb), IHA_OK);
        float *got = tu_malloc(total * D * sizeof *got);
        tu_tensor_read_checked(tu_ctx, IHA_STORAGE_BF16, zb.mem, total * D, 5, TU_GUARD, TU_SENTINEL, got, "z");
        tu_assert_close(st == 0 ? "z (packed prefill into a ring)" : "z (packed step on a ring)", got, want, total * D,
                        1e-2);
        for (size_t b = 0; b < 2; ++b) {
            done[b] += steps[st][b];
            assert_int_equal(iha_kv_cache_length(cache, b), done[b]);
        }
        tu_buffer_release(xb.mem);
        tu_buffer_release(zb.mem);
        free(got);
        free(x);
        free(want);
    }
    iha_kv_cache_free(cache);
    free(zref);
    tu_device_layer_release(&d);
    tu_layer_free(&l);
}

int main(int argc, char **argv)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test(forward_case),           cmocka_unit_test(backward_case),
        cmocka_unit_test(attention_case),         cmocka_unit_test(attention_backward_case),
        cmocka_unit_test(attention_variants),     cmocka_unit_test(packed_equals_separate),
        cmocka_unit_test(bad_lengths_refused),    cmocka_unit_test(decode_packed),
        cmocka_unit_test(decode_packed_ring_bf16),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
