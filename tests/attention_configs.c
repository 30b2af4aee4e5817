/*
 * attention_configs.c - attention configurations forced through an in-memory profile.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "attention_configs.h"
#include "reference.h"
#include "test_layer.h"
#include "test_util.h"
#include "runtime/context.h"
#include "tune/profile.h"
#include "tune/state.h"
#include "tune/tunable.h"

iha_tune_config ac_tune_config(const iha_attention_config *cfg)
{
    const iha_tune_space *s = iha__tunable_attention.space;
    iha_tune_config c;
    memset(&c, 0, sizeof c);
    const struct {
        const char *name;
        long value;
    } v[] = {{"ATT_ROWS", cfg->rows},     {"ATT_TILES", cfg->tiles},   {"ATT_KB", cfg->key_block},
             {"ATT_VD", cfg->vec},        {"group", (long)cfg->group}, {"variant", cfg->variant},
             {"LOC_KEYS", cfg->local_keys}, {"ATT_PREFETCH", cfg->prefetch}, {"TILE_RY", cfg->tile_ry},
             {"TILE_RX", cfg->tile_rx}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        const int k = iha__space_param_index(s, v[i].name);
        assert_true(k >= 0);
        c.v[k] = v[i].value;
    }
    return c;
}

int ac_fits(iha_context *ctx, const iha_attention_config *cfg, size_t d)
{
    if (cfg->variant == 1) return iha__attention_local_fits(ctx, d, (int)cfg->group, cfg->local_keys, cfg->key_block);
    if (cfg->variant == 2) {
        const iha_attention_tiles t = {(int)cfg->group, cfg->local_keys, cfg->tile_ry, cfg->tile_rx};
        return iha__attention_tiles_fits(ctx, d, &t, cfg->key_block);
    }
    return cfg->group <= ctx->info.max_work_group_size;
}

iha_context *ac_context_forcing(const iha_attention_config *cfg, char *expected, size_t size)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.profile = "off"; /* the forced entry stays in this context's memory */
    iha_context *ctx = NULL;
    char message[1024] = "";
    if (iha_context_create(&ctx, &options, message, sizeof message) != IHA_OK)
        fail_msg("iha_context_create: %s", message);

    iha_profile_entry e;
    memset(&e, 0, sizeof e);
    e.tunable = &iha__tunable_attention;
    e.is_default = 1;
    e.config = ac_tune_config(cfg);
    assert_true(iha__profile_put(&ctx->tune->profile, &e));
    assert_int_equal(iha__space_format(e.tunable->space, &e.config, expected, size), 0);
    return ctx;
}

void ac_assert_last_ran(iha_context *ctx, const char *expected)
{
    iha_kernel_choice choices[4];
    size_t count = 0;
    assert_int_equal(iha_context_last_choices(ctx, choices, 4, &count), IHA_OK);
    int found = 0;
    for (size_t i = 0; i < count && i < 4; i++) {
        if (strcmp(choices[i].kernel, "attention") != 0) continue;
        found = 1;
        if (choices[i].source != IHA_CONFIG_PROFILE_DEVICE || strcmp(choices[i].config, expected) != 0)
            fail_msg("the call ran \"%s\" (source %d), not the forced \"%s\"", choices[i].config, choices[i].source,
                     expected);
    }
    assert_true(found);
}

void ac_check_attention(iha_context *ctx, const iha_shape *s, const iha_attention_options *o, const char *expected,
                        uint64_t seed)
{
    tu_rng rng = tu_rng_seeded(seed);
    const size_t n = tu_count_virtual(s), nl = s->batch * s->heads * s->tokens * s->pseudo;
    float *qt = tu_random_array(&rng, n, 1.5f), *kt = tu_random_array(&rng, n, 1.5f);
    float *vt = tu_random_array(&rng, n, 1.0f);
    const ref_problem p = tu_problem(s, o);
    double *oref = tu_malloc(n * sizeof *oref), *lref = tu_malloc(nl * sizeof *lref);
    assert_int_equal(ref_attention(&p, qt, kt, vt, oref, lref), 0);
    iha_buffer qb = {tu_buffer_guarded(ctx, qt, n, 2, TU_GUARD, TU_SENTINEL), 2};
    iha_buffer kb = {tu_buffer_guarded(ctx, kt, n, 7, TU_GUARD, TU_SENTINEL), 7};
    iha_buffer vb = {tu_buffer_guarded(ctx, vt, n, 1, TU_GUARD, TU_SENTINEL), 1};
    iha_buffer ob = {tu_buffer_guarded(ctx, NULL, n, 4, TU_GUARD, TU_SENTINEL), 4};
    iha_buffer lb = {tu_buffer_guarded(ctx, NULL, nl, 3, TU_GUARD, TU_SENTINEL), 3};
    tu_assert_status(ctx, iha_attention(ctx, s, o, qb, kb, vb, ob, lb), IHA_OK);
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    if (expected) ac_assert_last_ran(ctx, expected);
    tu_assert_buffer_close(ctx, "o", ob, n, oref, TU_TOL_F32);
    tu_assert_buffer_close(ctx, "lse", lb, nl, lref, TU_TOL_F32);
    cl_mem m[5] = {qb.mem, kb.mem, vb.mem, ob.mem, lb.mem};
    for (int i = 0; i < 5; i++) tu_buffer_release(m[i]);
    free(oref), free(lref), free(qt), free(kt), free(vt);
}
