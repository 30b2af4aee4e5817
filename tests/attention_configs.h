/*
 * attention_configs.h - forcing one configuration of the attention kernel the way an
 * application's tuning profile would: as the profile's device-wide default for the attention
 * kernel, in a context whose profile is off (nothing is written). For the tests that run every
 * variant whatever the device's built-in. Include after <cmocka.h>; reads private headers of src/.
 */
#ifndef IHA_TESTS_ATTENTION_CONFIGS_H
#define IHA_TESTS_ATTENTION_CONFIGS_H

#include <stddef.h>

#include "kernels/attention.h"
#include "tune/space.h"

/* A named configuration: a test case's name and what it forces. */
typedef struct ac_variant {
    const char *name;
    iha_attention_config cfg; /* rows, tiles, key_block, vec, group, variant, local_keys, prefetch, tile_ry, tile_rx */
} ac_variant;

/* The tuning space's form of cfg. */
iha_tune_config ac_tune_config(const iha_attention_config *cfg);
/* Whether the device can run cfg at head width d at all (local memory, work-group size). */
int ac_fits(iha_context *ctx, const iha_attention_config *cfg, size_t d);
/* A new context whose profile is off and holds cfg as the attention kernel's device-wide
 * default; expected receives cfg as a call's choice reports it. Fails the test on error; free
 * the context with iha_context_free. */
iha_context *ac_context_forcing(const iha_attention_config *cfg, char *expected, size_t size);
/* Fails the test unless the last call ran the attention kernel in the configuration `expected`,
 * taken from the profile's device-wide default: a configuration the library refused for the
 * bucket cannot pass unnoticed. */
void ac_assert_last_ran(iha_context *ctx, const char *expected);
/* iha_attention with the log-sum-exp on ctx (qt, kt, vt, o and lse guarded at odd offsets, qt
 * and kt of amplitude 1.5 and vt of 1 from `seed`) against the float64 reference within the
 * float32 tolerance; unless expected is NULL, the configuration that ran must be `expected`
 * (ac_assert_last_ran). Needs test_util.h and test_layer.h. */
void ac_check_attention(iha_context *ctx, const iha_shape *s, const iha_attention_options *o, const char *expected,
                        uint64_t seed);

#endif
