/*
 * random_layer.h - a random IHA layer of a given shape, in host memory (for the float64
 * reference) and in device buffers of one context (for timing without host copies).
 */
#ifndef IHA_TOOLS_RANDOM_LAYER_H
#define IHA_TOOLS_RANDOM_LAYER_H

#include <stdint.h>

#include "iha.h"

typedef struct random_layer {
    iha_shape shape;
    /* Host copies, owned: x [B][N][D], the weights in doc/spec.md's layouts, z [B][N][D]. */
    float *x, *wq, *wk, *wv, *wo, *alpha_q, *alpha_k, *alpha_v, *r, *z;
    /* Device copies, owned: the same tensors (z uninitialised). */
    cl_mem x_mem, z_mem;
    iha_layer_weights weights;
    iha_storage storage; /* of the device copies: float, or random_layer_use_storage's */
} random_layer;

/* Draws the layer from `seed` and uploads it on ctx's OpenCL context. Weights are scaled by
 * 1/sqrt(fan-in) so activations stay of order one and the softmax is neither flat nor one-hot.
 * Returns 0, or -1 with a message in err; *layer then holds nothing. */
int random_layer_create(iha_context *ctx, const iha_shape *shape, uint64_t seed, random_layer *layer, char *err,
                        size_t err_size);

/* Replaces the device copies of x, z and every weight with 16-bit ones in `storage`
 * (IHA_STORAGE_F16 or IHA_STORAGE_BF16; the host copies are rounded on upload), for calls with
 * those activations and weights. Returns 0, or -1 with a message in err (the float copies are
 * then kept). */
int random_layer_use_storage(iha_context *ctx, random_layer *layer, iha_storage storage, char *err,
                             size_t err_size);

/* Fills the device output with NaN, so that an element the library skips shows up. */
int random_layer_poison_output(iha_context *ctx, random_layer *layer, char *err, size_t err_size);

/* Copies the device output into layer->z (blocking). */
int random_layer_read_output(iha_context *ctx, random_layer *layer, char *err, size_t err_size);

void random_layer_free(random_layer *layer);

/* The host copies as the library's host calls take them. */
iha_host_weights random_layer_host_weights(const random_layer *layer);

/* iha_forward from the device copy of x into the device copy of z; waits for it. */
iha_status random_layer_forward(iha_context *ctx, random_layer *layer, const iha_attention_options *options);

/* Times `reps` random_layer_forward calls on a context that times stages (after the caller's
 * warm-up): the median wall time into *wall, the median of each stage into *stages. Returns 0,
 * or -1 with a message in err (a failed call: its status and the context's message). */
int random_layer_time_forward(iha_context *ctx, random_layer *layer, const iha_attention_options *options,
                              size_t reps, double *wall, iha_stage_times *stages, char *err, size_t err_size);

/* iha_backward's outputs for layers of at most `shape`: dx [B][N][D], then the gradients in
 * iha_layer_grads order (wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r), float; and the saved
 * state of iha_forward_save (iha_saved_elements floats). */
typedef struct random_layer_grads {
    cl_mem mem[9];
    cl_mem saved;
} random_layer_grads;

/* Returns 0, or -1 with a message in err; *g then holds nothing. */
int random_layer_grads_create(iha_context *ctx, const iha_shape *shape, random_layer_grads *g, char *err,
                              size_t err_size);
void random_layer_grads_free(random_layer_grads *g);

/* iha_backward of the layer, dz its device output z (any tensor of x's shape serves for timing
 * and soaking), every gradient into g; waits for it. */
iha_status random_layer_backward(iha_context *ctx, random_layer *layer, const iha_attention_options *options,
                                 const random_layer_grads *g);
/* The training pair instead: iha_forward_save into the layer's z and g->saved, or
 * iha_backward_saved from them (dz the layer's z, as above); each waits for its call. */
iha_status random_layer_forward_save(iha_context *ctx, random_layer *layer, const iha_attention_options *options,
                                     const random_layer_grads *g);
iha_status random_layer_backward_saved(iha_context *ctx, random_layer *layer, const iha_attention_options *options,
                                       const random_layer_grads *g);

#endif
