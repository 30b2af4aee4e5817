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
    float *x, *wq, *wk, *wv, *wo;                 /* SPEC shapes */
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

/* Default options (iha_attention_options_init) with this mask, window and rotary flag. */
iha_attention_options tu_options(int mask, int64_t window, int rope);

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

#endif /* IHA_TESTS_TEST_LAYER_H */
