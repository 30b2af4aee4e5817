/*
 * test_tune_steps.h - what the decode tuning tests (test_tune_decode.c, test_tune_decode_compact.c)
 * share: a layer decoded through a fresh KV cache, the prompt as one chunk and then the last
 * token alone, with the choices of one kernel; a decode tuning of the layer's shape; and the
 * check that a profile so tuned serves the steps. Include after <cmocka.h>, test_util.h,
 * test_layer.h and test_profiles.h.
 */
#ifndef IHA_TESTS_TEST_TUNE_STEPS_H
#define IHA_TESTS_TEST_TUNE_STEPS_H

#include "iha.h"
#include "iha_tune.h"

/* How a test decodes: the layer's shape and attention options (causal; rotary or not), the
 * cache layout, the kernel whose choices it reads ("decode" or "decode_compact") and the tuning
 * task that tunes it (IHA_TUNE_DECODE or IHA_TUNE_DECODE_COMPACT). */
typedef struct ts_decoding {
    const iha_shape *shape;
    iha_attention_options options;
    int compact;
    const char *kernel;
    unsigned tune_kernels;
} ts_decoding;

typedef struct ts_decoded {
    iha_kernel_choice prefill, step; /* the kernel's choices of the prompt chunk and of the last token */
} ts_decoded;

/* Decodes l's tokens into a fresh cache of `storage`: the first N-1 as one chunk, then the last
 * one alone, whose output must equal zref's last row within doc/spec.md's contract (the
 * half-storage one for 16-bit caches). */
ts_decoded ts_decode_layer(iha_context *ctx, const ts_decoding *how, const tu_layer *l, const double *zref,
                           iha_storage storage);
/* iha_tune of the task for the shape (3 repetitions, `budget` seconds) into ctx's profile. */
void ts_tune(iha_context *ctx, const ts_decoding *how, double budget, iha_tune_result *results, size_t capacity,
             size_t *count);
/* A new context on the profile at path, and one with profiles off, decode a layer (seeded by
 * `seed`) with a float and a half cache: with the profile the last token's step uses the exact
 * entry r[0] (float) or r[1] (half) stored and the prompt chunk the nearest; with profiles off
 * both use the built-in, r's default configuration. */
void ts_check_profile_serves_steps(const ts_decoding *how, const char *path, const iha_tune_result r[2], int seed);

#endif
