/*
 * test_attention_variants.c - every variant of the attention kernel, in several tile
 * configurations, on small ragged shapes, whatever the device's built-in: register tiles
 * (cl/attention.cl), local memory with a row per work-item (cl/attention_local.cl) and local
 * memory with register sub-tiles (cl/attention_local_tiles.cl). The built-in of a device runs
 * one of them; the tuner may choose any, and a GPU's built-in differs from a CPU's, so each is
 * checked here on every device (and under Oclgrind's race detection by .ci/oclgrind.sh).
 *
 * A configuration is forced the way an application's tuning profile would: as the profile's
 * device-wide default for the attention kernel, in a context whose profile is off (nothing is
 * written). The last call's choice must report it, so a configuration the library refused for
 * the bucket cannot pass unnoticed; one that does not fit the device (local memory, work-group
 * size) is skipped with a message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_configs.h"
#include "reference.h"
#include "test_layer.h"
#include "test_util.h"
#include "tune/tunable.h"

enum { CAUSAL = IHA_MASK_CAUSAL, TOKEN = IHA_MASK_TOKEN_CAUSAL, NONE = IHA_MASK_NONE };

typedef struct shape_case {
    size_t B, N, H, d, P;
    int mask;
    long long window;
    size_t lens[4]; /* packed sequences' lengths (0 ends them); {0}: one sequence per batch row */
} shape_case;

/* T = N*P against the key blocks (4, 8, 16), the local tiles (16-64 keys, 16-128 rows) and the
 * 4 x 4 sub-tiles; d against the vector widths and the sub-tiles' column sets (d = 1, odd, a
 * padded d > 128, a width between 64 and 128 that 16 does not divide). Few distinct d values:
 * each is a program to build per configuration. */
static const shape_case kShapes[] = {
    /* B   N  H    d  P  mask    window lengths */
    {1,  7, 2,   9, 3, CAUSAL, 2, {0}},
    {2,  5, 2,   1, 1, TOKEN,  0, {0}}, /* d = 1, P = 1 */
    {1, 23, 1,  64, 3, CAUSAL, 0, {0}}, /* T = 69: two row tiles of 64, three key tiles of 32 */
    {1,  6, 1, 130, 1, NONE,   2, {0}}, /* d > 128, a window */
    {1, 11, 1, 100, 4, TOKEN,  0, {0}}, /* 64 < d <= 128, d % 16 = 4: a 32-row work-item, a tail of 12 */
};

/* The sub-tile shapes' shorter set: every remainder of d mod 4 (the float4s of the tiles) and
 * several of d mod 8 (the column sets of 8 work-items across), row and key tiles with tails,
 * every mask, a window, P = 1 and packed sequences that start and end inside tiles. */
static const shape_case kSubTileShapes[] = {
    /* B   N  H    d  P  mask    window lengths */
    {1, 23, 1,  64, 3, CAUSAL, 0, {0}},          /* T = 69: two row tiles of 64, key tiles of 32 and 64 */
    {2,  9, 2,  13, 3, TOKEN,  2, {4, 5, 1, 8}}, /* packed, d % 8 = 5 */
    {1,  7, 2,   6, 5, NONE,   2, {0}},          /* d % 8 = 6, T = 35 */
    {2,  5, 2,   3, 1, TOKEN,  0, {0}},          /* d % 4 = 3, P = 1 */
};

/* The configurations whose code paths differ: each variant, the key blocks 4, 8 and 16, one
 * work-item per row and many, local tiles smaller and larger than T. The rest of the full tier
 * (cases named full_*) repeat those paths in other tile sizes: each is a program per d. */
static const ac_variant kVariants[] = {
    /* name                                                rows tiles KB vec group variant keys prefetch RY RX */
    {"register tiles 4x1, 128 work-items (GPUs, d > 64)", {4, 1, 16, 4, 128, 0, 32, 0, 4, 4}},
    {"register tiles 4x8, 32 rows per work-item", {4, 8, 16, 16, 1, 0, 32, 0, 4, 4}},
    {"local, 16 rows, 16 keys, KB 8", {1, 1, 8, 4, 16, 1, 16, 0, 4, 4}},
    {"local tiles, 16 rows, 16 keys, KB 4", {1, 1, 4, 4, 16, 2, 16, 0, 4, 4}},
    {"local tiles, 128 rows, 64 keys, KB 16", {1, 1, 16, 4, 128, 2, 64, 0, 4, 4}},
    {"full_local, 64 rows, 32 keys, KB 16", {1, 1, 16, 4, 64, 1, 32, 0, 4, 4}},
    {"full_local tiles, 64 rows, 32 keys, KB 16", {1, 1, 16, 4, 64, 2, 32, 0, 4, 4}},
};

/* The local tiles' wider register sub-tiles (TILE_RY x TILE_RX of 8 x 8, 8 x 4, 4 x 8) on the
 * shorter shape set: each shape is a program per configuration, which llvmpipe compiles for
 * tens of seconds. */
static const ac_variant kSubTiles[] = {
    {"sub-tiles 8x8, 64 rows, 64 keys, KB 16", {1, 1, 16, 4, 64, 2, 64, 0, 8, 8}},
    {"sub-tiles 8x4, 64 rows, 32 keys, KB 8", {1, 1, 8, 4, 64, 2, 32, 0, 8, 4}},
    {"sub-tiles 4x8, 16 rows, 32 keys, KB 4", {1, 1, 4, 4, 16, 2, 32, 0, 4, 8}},
    {"full_sub-tiles 8x8, 128 rows, 64 keys, KB 16", {1, 1, 16, 4, 128, 2, 64, 0, 8, 8}},
};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* A test case: a configuration and the shapes it runs. */
typedef struct variant_case {
    const ac_variant *v;
    const shape_case *shapes;
    size_t count;
} variant_case;

/* The shape and options of one case. */
static void problem_of(const shape_case *c, iha_shape *s, iha_attention_options *o)
{
    *s = (iha_shape){c->B, c->N, 0, c->H, c->d, c->P};
    iha_attention_options_init(o);
    o->mask = c->mask;
    o->window = c->window;
    size_t n = 0;
    while (n < COUNT(c->lens) && c->lens[n]) ++n;
    o->seq_lens = n ? c->lens : NULL;
    o->seq_count = n;
}

/* iha_attention with LSE on one shape, in the configuration the profile forces. */
static void run_shape(iha_context *ctx, const shape_case *c, const char *expected_config, uint64_t seed)
{
    iha_shape s;
    iha_attention_options o;
    problem_of(c, &s, &o);
    ac_check_attention(ctx, &s, &o, expected_config, seed);
}

static void variant_test(void **state)
{
    const variant_case *vc = *state;
    const ac_variant *v = vc->v;
    TU_REQUIRE_DEVICE(tu_ctx);
    char expected[512];
    iha_context *ctx = ac_context_forcing(&v->cfg, expected, sizeof expected);
    const iha_tunable *t = &iha__tunable_attention;
    const iha_tune_config config = ac_tune_config(&v->cfg);

    iha_tune_limits limits;
    iha__tune_limits(ctx, &limits);
    size_t ran = 0;
    for (size_t i = 0; i < vc->count; i++) {
        const shape_case *c = &vc->shapes[i];
        if (!ac_fits(ctx, &v->cfg, c->d)) {
            print_message("d=%zu: %s does not fit this device: skipped\n", c->d, v->name);
            continue;
        }
        /* A configuration the space refuses for this bucket (4x8 tiles past d = 128) never runs:
         * the lookup passes over it, so there is nothing to force. */
        iha_shape shape;
        iha_attention_options o;
        problem_of(c, &shape, &o);
        iha_tune_bucket bucket;
        const char *why = NULL;
        assert_true(t->bucket_of(ctx, &shape, &o, &bucket));
        if (!iha__space_valid(t->space, &config, &bucket, &limits, &why)) {
            print_message("d=%zu: %s is outside the tuning space (%s): skipped\n", c->d, v->name, why);
            continue;
        }
        run_shape(ctx, c, expected, 9100 + (uint64_t)i);
        ++ran;
    }
    print_message("%s: %zu of %zu shapes\n", v->name, ran, vc->count);
    iha_context_free(ctx);
}

int main(int argc, char **argv)
{
    static variant_case cases[COUNT(kVariants) + COUNT(kSubTiles)];
    struct CMUnitTest tests[COUNT(cases)];
    size_t n = 0;
    for (size_t i = 0; i < COUNT(kVariants); i++) cases[n++] = (variant_case){&kVariants[i], kShapes, COUNT(kShapes)};
    for (size_t i = 0; i < COUNT(kSubTiles); i++)
        cases[n++] = (variant_case){&kSubTiles[i], kSubTileShapes, COUNT(kSubTileShapes)};
    for (size_t i = 0; i < n; i++) {
        struct CMUnitTest t = {cases[i].v->name, variant_test, NULL, NULL, &cases[i]};
        tests[i] = t;
    }
    return tu_main(argc, argv, tests, n, tu_group_setup, tu_group_teardown);
}
