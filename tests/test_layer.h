/*
 * test_layer.h - a random IHA layer for the tests: host tensors, their copies in device buffers
 * (with leading offsets and trailing guard regions), the float64 reference of the layer, and
 * one call that runs iha_forward or iha_forward_host on a NaN-poisoned output and checks every
 * element of it. Include after <cmocka.h> and test_util.h.
 */
#ifndef IHA_TESTS_TEST_LAYER_H
#define IHA_TESTS_TEST_LAYER_H

#include "iha.h"
#include "reference.h"

/* Floats of sentinel after (and, with offsets, before) every device tensor. */
#define TU_GUARD 64
#define TU_SENTINEL (-12345.5f)

typedef struct tu_layer {
    iha_shape shape;
    float *x, *wq, *wk, *wv, *wo;                 /* doc/spec.md's shapes */
    float *alpha_q, *alpha_k, *alpha_v, *r;       /* NULL: the identity shortcut (P = 1) */
} tu_layer;

/* Element counts of a shape's tensors. */
size_t tu_count_x(const iha_shape *s);     /* B*N*D, also Z */
size_t tu_count_w(const iha_shape *s);     /* D*H*d, each of W_Q, W_K, W_V and W_O */
size_t tu_count_mix(const iha_shape *s);   /* H*H*P, each of alpha_Q/K/V and R */
size_t tu_count_heads(const iha_shape *s); /* B*N*H*d: Q, K, V, Y */
size_t tu_count_virtual(const iha_shape *s); /* B*H*N*P*d: Qt, Kt, Vt, O */

/* Random tensors, never zero, scaled so that the attention scores spread over about +-2 and
 * the softmax is neither flat nor one-hot. */
void tu_layer_init(tu_layer *l, const iha_shape *shape, uint64_t seed);
/* P = 1 only: replaces the mixing and collapse with the identity, as explicit arrays
 * (as_null = 0) or as the NULL shortcut (as_null = 1). */
void tu_layer_identity(tu_layer *l, int as_null);
void tu_layer_free(tu_layer *l);
/* tu_layer_init, then the layer's z from the float64 reference (tu_layer_reference; free it). */
double *tu_layer_with_reference(tu_layer *l, const iha_shape *shape, uint64_t seed,
                                const iha_attention_options *options);

/* Default options (iha_attention_options_init) with this mask, window and rotary flag. */
iha_attention_options tu_options(int mask, int64_t window, int rope);

/* The reference's problem for this shape and these options, without tensors. */
ref_problem tu_problem(const iha_shape *shape, const iha_attention_options *options);
ref_problem tu_layer_problem(const tu_layer *l, const iha_attention_options *options);
/* Z of the layer from the float64 reference (malloc'ed B*N*D doubles; free it). */
double *tu_layer_reference(const tu_layer *l, const iha_attention_options *options);

/* The layer in device buffers. Each tensor has its own buffer: `offset` sentinel floats (0 or
 * a per-tensor odd count when offsets is nonzero), the tensor, TU_GUARD sentinel floats.
 * z holds NaN. */
typedef struct tu_device_layer {
    iha_layer_weights weights;
    iha_buffer x, z;
} tu_device_layer;
void tu_device_layer_upload(iha_context *ctx, const tu_layer *l, int offsets, tu_device_layer *out);
void tu_device_layer_release(tu_device_layer *d);
/* Releases the eight weight buffers (NULL ones are allowed). */
void tu_layer_weights_release(iha_layer_weights *w);

typedef enum tu_api {
    TU_API_DEVICE,         /* iha_forward, tensors at offset 0 */
    TU_API_DEVICE_OFFSETS, /* iha_forward, every tensor at a nonzero element offset */
    TU_API_HOST            /* iha_forward_host */
} tu_api;
const char *tu_api_name(tu_api api);

/* Runs the layer through `api` with z poisoned (NaN), expects IHA_OK, checks that the guards
 * around z are untouched, that z has no NaN/Inf and that its relative L2 error against zref
 * (B*N*D doubles) is at most tol. */
void tu_layer_check_forward(iha_context *ctx, const tu_layer *l, const iha_attention_options *options,
                            tu_api api, const double *zref, double tol);
/* Decodes the first `tokens` tokens of the layer's one sequence (batch 1) a token at a time
 * through a new float cache on ctx, checking each step's z against its row of zref (the forward
 * over the whole sequence) within the float32 tolerance. */
void tu_check_decode_tokens(iha_context *ctx, const tu_layer *l, const tu_device_layer *dev,
                            const iha_attention_options *options, const double *zref, size_t tokens);
/* Reads the n floats of b on ctx; fails the test unless the guards around them (TU_GUARD floats
 * of TU_SENTINEL) are untouched and they are within tol of ref (tu_assert_close, named `what`). */
void tu_assert_buffer_close(iha_context *ctx, const char *what, iha_buffer b, size_t n, const double *ref,
                            double tol);
/* Where tu_check_attention_core puts each tensor: element offsets of q, k, v, y and of the four
 * mixing arrays, and the guard after each input (0: its buffer ends where the tensor does). */
typedef struct tu_core_layout {
    size_t q, k, v, y, mix[4];
    size_t input_guard;
} tu_core_layout;
/* Draws Q and K (amplitude qk_amplitude), V (amplitude 1) and, unless identity, the mixing and
 * collapse (all four NULL otherwise: the identity shortcut) from `seed`, runs iha_attention_core
 * on device copies laid out as `at`, and checks y against ref_attention_core within the float32
 * tolerance. */
void tu_check_random_core(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                          uint64_t seed, float qk_amplitude, int identity, const tu_core_layout *at);
/* The layer's host tensors as the library's host calls take them. */
iha_host_weights tu_layer_host_weights(const tu_layer *l);
/* One small layer with every stage in use (rotary, window, P > 1), run through `api` and
 * checked on ctx. */
void tu_check_small_forward(iha_context *ctx, tu_api api);
/* tu_layer_check_forward of a random layer of `shape` drawn from `seed`, against its float64
 * reference, within the float32 tolerance. */
void tu_check_random_layer(iha_context *ctx, const iha_shape *shape, uint64_t seed,
                           const iha_attention_options *options, tu_api api);

#endif /* IHA_TESTS_TEST_LAYER_H */
