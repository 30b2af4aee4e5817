/*
 * test_decode_groups.c - the work-group decode kernel (cl/attention_decode_groups.cl, variant 1
 * of the decode tuning space), the GPU built-in, on any device: decoding steps of ragged
 * batches, chunks and single tokens, every mask, windows, rotary, float, half and bfloat16
 * caches and the ring cache, each step's outputs against the float64 reference forward over the
 * sequence so far. The configuration is forced the way an application's profile would force it
 * (the decode kernel's device-wide default in a context whose profile is off), and every step
 * must report it, so a configuration the library refused cannot pass unnoticed. Configurations
 * cover a group wider than the head (several key groups in P.V, also a count of them that does
 * not divide the tile), narrower (several columns per work-item, a tail), one and several query
 * rows and keys per work-item.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_layer.h"
#include "test_util.h"
#include "tune/profile.h"
#include "tune/space.h"
#include "tune/state.h"
#include "tune/tunable.h"

#define TOL_F16 2e-3  /* doc/spec.md's half-storage contract */
#define TOL_BF16 1e-2 /* doc/spec.md: bfloat16 storage, float arithmetic */

/* A forced variant 1 configuration: query rows per work-group, work-items, keys per work-item,
 * min_split_keys, work-groups per compute unit. */
typedef struct group_config {
    long rows, group, keys, min_split_keys, per_cu;
} group_config;

typedef struct groups_case {
    const char *name;
    size_t B, N, D, H, d, P; /* N: tokens per sequence */
    int mask;
    int64_t window;
    int rope;
    iha_storage storage;
    size_t chunk;      /* k, tokens per step */
    size_t lengths[3]; /* tokens to feed per sequence (0 entries: N) */
    size_t ring;       /* tokens a ring keeps (0: a full cache) */
    float scale;       /* 0: doc/spec.md's default */
    group_config cfg;
} groups_case;

enum { CAUSAL = IHA_MASK_CAUSAL, TOKEN = IHA_MASK_TOKEN_CAUSAL, NONE = IHA_MASK_NONE };

static const groups_case kCases[] = {
    /* name                              B   N   D  H   d  P  mask    win rope storage            k  lengths    ring scale cfg */
    {"ragged_f32_causal_window",
     3,
     9,
     24,
     2,
     16,
     3,
     CAUSAL,
     3,
     1,
     IHA_STORAGE_F32,
     2,
     {7, 4, 1},
     0,
     0.0f,
     {4, 32, 2, 64, 4}},
    {"chunked_f16_token_odd_d", 1, 11, 32, 3, 59, 2, TOKEN, 2, 0, IHA_STORAGE_F16, 4, {0}, 0, 0.0f, {8, 32, 4, 64, 2}},
    {"ragged_bf16_bidirectional_window",
     2,
     7,
     16,
     2,
     40,
     3,
     NONE,
     2,
     0,
     IHA_STORAGE_BF16,
     2,
     {7, 3},
     0,
     0.0f,
     {2, 64, 1, 64, 8}},
    {"tokens_f32_group_over_head",
     2,
     9,
     24,
     2,
     16,
     3,
     CAUSAL,
     0,
     1,
     IHA_STORAGE_F32,
     1,
     {9, 5},
     0,
     0.0f,
     {2, 64, 1, 64, 8}},
    /* A group of 64 over d = 20 makes 3 key groups, which do not divide a tile of 128 keys. */
    {"uneven_key_groups", 1, 48, 40, 2, 20, 3, NONE, 0, 0, IHA_STORAGE_F32, 4, {0}, 0, 0.0f, {4, 64, 2, 256, 1}},
    {"long_cache_large_scale",
     1,
     300,
     16,
     1,
     64,
     4,
     CAUSAL,
     0,
     1,
     IHA_STORAGE_F32,
     150,
     {0},
     0,
     3.0f,
     {4, 32, 2, 64, 16}},
    {"ring_f32_causal", 2, 24, 16, 2, 16, 2, CAUSAL, 3, 1, IHA_STORAGE_F32, 1, {24, 17}, 4, 0.0f, {2, 32, 1, 64, 8}},
    {"ring_f16_token_chunks", 1, 30, 16, 2, 24, 3, TOKEN, 4, 0, IHA_STORAGE_F16, 2, {0}, 5, 0.0f, {4, 32, 2, 64, 8}},
    {"ring_bf16_causal", 1, 20, 16, 1, 16, 2, CAUSAL, 2, 0, IHA_STORAGE_BF16, 1, {0}, 3, 0.0f, {2, 64, 1, 64, 8}},
};
#define CASE_COUNT (sizeof kCases / sizeof kCases[0])

/* A context whose profile is off and holds cfg as the decode kernel's device-wide default;
 * expected receives it as a call's choice reports it. */
static iha_context *context_forcing(const group_config *cfg, char *expected, size_t size)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.profile = "off";
    iha_context *ctx = NULL;
    char message[1024] = "";
    if (iha_context_create(&ctx, &options, message, sizeof message) != IHA_OK)
        fail_msg("iha_context_create: %s", message);
    iha_profile_entry e;
    memset(&e, 0, sizeof e);
    e.tunable = &iha__tunable_decode;
    e.is_default = 1;
    const iha_tune_space *s = e.tunable->space;
    const char *names[7] = {"ATT_ROWS", "ATT_VD", "group", "min_split_keys", "per_cu", "variant", "keys"};
    const long values[7] = {cfg->rows, 4, cfg->group, cfg->min_split_keys, cfg->per_cu, 1, cfg->keys};
    for (int i = 0; i < 7; i++) {
        const int at = iha__space_param_index(s, names[i]);
        assert_true(at >= 0);
        e.config.v[at] = values[i];
    }
    assert_true(iha__profile_put(&ctx->tune->profile, &e));
    assert_int_equal(iha__space_format(s, &e.config, expected, size), 0);
    return ctx;
}

/* Fails unless every decode choice of the last step is the forced configuration. */
static void assert_ran(iha_context *ctx, const char *expected)
{
    iha_kernel_choice choices[8];
    size_t count = 0;
    assert_int_equal(iha_context_last_choices(ctx, choices, 8, &count), IHA_OK);
    int found = 0;
    for (size_t i = 0; i < count && i < 8; i++) {
        if (strcmp(choices[i].kernel, "decode") != 0) continue;
        found = 1;
        if (choices[i].source != IHA_CONFIG_PROFILE_DEVICE || strcmp(choices[i].config, expected) != 0)
            fail_msg("the step ran \"%s\" (source %d), not the forced \"%s\"", choices[i].config, choices[i].source,
                     expected);
    }
    assert_true(found);
}

/* Feeds each sequence its tokens in steps of `chunk`, checking every step against the
 * reference over the prefix so far; *state is the groups_case. */
static void run_case(void **state)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    const groups_case *cs = *state;
    char expected[IHA_TUNE_CONFIG_TEXT];
    iha_context *ctx = context_forcing(&cs->cfg, expected, sizeof expected);
    const iha_shape full = {cs->B, cs->N, cs->D, cs->H, cs->d, cs->P};
    tu_layer l;
    tu_layer_init(&l, &full, 2000 + cs->d * 7 + cs->P);
    tu_device_layer dev;
    tu_device_layer_upload(ctx, &l, 0, &dev);
    iha_attention_options o = tu_options(cs->mask, cs->window, cs->rope);
    o.scale = cs->scale;

    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = cs->storage;
    co.window = cs->window;
    co.cache_tokens = cs->ring;
    iha_kv_cache *cache = NULL;
    tu_assert_status(ctx, iha_kv_cache_create_with(ctx, &full, &co, &cache), IHA_OK);
    const size_t k = cs->chunk, D = cs->D, row_elems = cs->B * k * D;
    const iha_shape step_shape = {cs->B, k, D, cs->H, cs->d, cs->P};
    cl_mem xs = tu_buffer_new(ctx, row_elems), zs = tu_buffer_new(ctx, row_elems);
    float *xh = tu_malloc(row_elems * sizeof *xh), *zh = tu_malloc(row_elems * sizeof *zh);
    const double tol = cs->storage == IHA_STORAGE_F16    ? TOL_F16
                       : cs->storage == IHA_STORAGE_BF16 ? TOL_BF16
                                                         : TU_TOL_F32;

    size_t want[3], done[3] = {0};
    for (size_t b = 0; b < cs->B; ++b) want[b] = cs->lengths[b] ? cs->lengths[b] : cs->N;
    for (;;) {
        uint32_t counts[3];
        size_t active = 0;
        for (size_t b = 0; b < cs->B; ++b) {
            counts[b] = (uint32_t)(want[b] - done[b] < k ? want[b] - done[b] : k);
            active += counts[b];
        }
        if (active == 0) break;
        for (size_t b = 0; b < cs->B; ++b)
            for (size_t j = 0; j < k; ++j)
                for (size_t c = 0; c < D; ++c)
                    xh[(b * k + j) * D + c] = j < counts[b] ? l.x[(b * cs->N + done[b] + j) * D + c] : 1e3f;
        tu_buffer_write(ctx, xs, 0, xh, row_elems);
        tu_fill_nan(zh, row_elems);
        tu_buffer_write(ctx, zs, 0, zh, row_elems);
        tu_assert_status(ctx,
                         iha_decode_step(ctx, cache, &step_shape, &o, &dev.weights, counts, (iha_buffer){xs, 0},
                                         (iha_buffer){zs, 0}),
                         IHA_OK);
        assert_ran(ctx, expected);
        tu_buffer_read(ctx, zs, 0, zh, row_elems);
        for (size_t b = 0; b < cs->B; ++b) {
            for (size_t j = counts[b]; j < k; ++j)
                for (size_t c = 0; c < D; ++c)
                    if (zh[(b * k + j) * D + c] != 0.0f)
                        fail_msg("row %zu of sequence %zu past its count is not 0", j, b);
            if (counts[b] == 0) continue;
            ref_problem p = tu_layer_problem(&l, &o);
            p.B = 1;
            p.N = done[b] + counts[b];
            p.x = l.x + b * cs->N * D;
            size_t *rows = tu_malloc(counts[b] * sizeof *rows);
            for (size_t j = 0; j < counts[b]; ++j) rows[j] = done[b] + j;
            double *ref = tu_malloc(counts[b] * D * sizeof *ref);
            assert_int_equal(ref_forward(&p, rows, counts[b], ref), 0);
            char what[96];
            snprintf(what, sizeof what, "z of sequence %zu, tokens %zu..%zu", b, done[b], done[b] + counts[b] - 1);
            tu_assert_close(what, zh + b * k * D, ref, counts[b] * D, tol);
            free(ref);
            free(rows);
            done[b] += counts[b];
        }
    }
    free(xh);
    free(zh);
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    iha_kv_cache_free(cache);
    tu_device_layer_release(&dev);
    tu_layer_free(&l);
    iha_context_free(ctx);
}

/* The tuning space's rules for variant 1: a group under 32, or a local memory the device lacks,
 * is outside the space (so neither a profile nor the tuner can choose it). */
static void space_rules(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_tune_space *s = iha__tunable_decode.space;
    iha_tune_config c;
    iha_tune_bucket b;
    iha_decode_dims dd;
    memset(&dd, 0, sizeof dd);
    dd.B = 1, dd.k = 1, dd.H = 8, dd.d = 128, dd.P = 4, dd.t_max = dd.t_cur = 4096;
    iha__tune_decode_bucket(&dd, IHA_MASK_CAUSAL, 0, &b);
    const long values[7] = {4, 4, 128, 256, 4, 1, 2};
    for (int i = 0; i < 7; i++) c.v[i] = values[i];
    iha_tune_limits lim = {1024, 48 * 1024, 0};
    const char *why = NULL;
    assert_true(iha__space_valid(s, &c, &b, &lim, &why));
    c.v[iha__space_param_index(s, "group")] = 16;
    assert_false(iha__space_valid(s, &c, &b, &lim, &why));
    c.v[iha__space_param_index(s, "group")] = 256;
    c.v[iha__space_param_index(s, "keys")] = 8;
    lim.local_bytes = 16 * 1024;
    assert_false(iha__space_valid(s, &c, &b, &lim, &why));
    assert_non_null(strstr(why, "local memory"));
}

int main(int argc, char **argv)
{
    const struct CMUnitTest others[] = {
        cmocka_unit_test(space_rules),
    };
    const tu_case_table table = {kCases, sizeof kCases[0], CASE_COUNT, run_case};
    return tu_main_table(argc, argv, &table, others, sizeof others / sizeof others[0], tu_group_setup,
                         tu_group_teardown);
}
