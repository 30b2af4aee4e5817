/*
 * test_storage.h - the checks that tests/test_half.c and tests/test_bf16.c run for their 16-bit
 * storage: each call with activations and/or weights in `storage` (IHA_STORAGE_F16 or
 * IHA_STORAGE_BF16) against the float64 reference on the float inputs, within `tol` (doc/spec.md's
 * contract for that storage), every output guarded (tu_tensor_guarded) and read back checked.
 * Include after <cmocka.h>, test_util.h and test_layer.h.
 */
#ifndef IHA_TESTS_TEST_STORAGE_H
#define IHA_TESTS_TEST_STORAGE_H

#include "iha.h"
#include "test_layer.h"

/* A layer case: the shape, the options, and which tensors are in the storage under test. */
typedef struct tu_storage_case {
    size_t B, N, D, H, d, P;
    int mask;
    int64_t window;
    int rope;
    int act, weight; /* 1: activations, weights in the storage under test (0: float) */
    int offsets;     /* tensors at odd element offsets */
    int identity;    /* P = 1 with NULL mixing and collapse */
} tu_storage_case;

/* A named forward case, one CMocka case of a tu_case_table. */
typedef struct tu_storage_forward_case {
    const char *name;
    tu_storage_case c;
} tu_storage_forward_case;

/* "half", "bfloat16" or "float", for messages. */
const char *tu_storage_name(int storage);
/* A guarded tensor in `storage` on tu_ctx at element `offset` (TU_GUARD elements of TU_SENTINEL
 * around it); NULL data: NaN-filled, an output. */
iha_buffer tu_storage_upload(int storage, const float *data, size_t n, size_t offset);
/* Reads the n elements of a tu_storage_upload tensor as floats, checking its guards. */
void tu_storage_read(int storage, iha_buffer b, size_t n, float *out, const char *what);
/* The layer's eight weights in `storage`, weight i at element offset `first + i`; the NULL
 * mixing and collapse of the identity shortcut stay NULL. */
iha_layer_weights tu_storage_upload_weights(const tu_layer *l, int storage, size_t first);

/* iha_forward (tensors at offsets, z in the activations' storage) and iha_forward_host on the
 * case's random layer (seed + d + 13 P) against the float64 forward. */
void tu_storage_check_forward(const tu_storage_case *c, int storage, double tol, uint64_t seed);
/* iha_attention_core (q, k, v, y and the mixing in `storage`), then iha_attention (qt, kt, vt and
 * o in `storage`, the log-sum-exp float) on a layer of shape s (D = 1) from layer_seed, with
 * inputs from rng_seed. */
void tu_storage_check_core_and_attention(int storage, double tol, const iha_shape *s, uint64_t layer_seed,
                                         uint64_t rng_seed);
/* iha_attention_backward with qt, kt, vt, o, dout and the gradients in `storage` (lse float), o
 * and lse from an iha_attention call in the same storage: shapes[0] causal, shapes[1]
 * token-causal with a window of 3, shapes[2] unmasked, inputs from seed, seed + 1, seed + 2. */
void tu_storage_check_attention_backward(int storage, double tol, const iha_shape shapes[3], uint64_t seed);
/* iha_backward on four cases (16-bit activations and/or weights, the identity shortcut, the GEMV
 * and converted-weight projections) with dx, x and dz in the activations' storage and the
 * gradients in the weights' (layer from layer_seed + d + 7 P, dz from dz_seed + d) against the
 * float64 reference; then iha_forward_save's z against the forward and iha_backward_saved, bit
 * for bit iha_backward. */
void tu_storage_check_layer_backward(int storage, double tol, uint64_t layer_seed, uint64_t dz_seed);
/* A prompt of `prefill` tokens per sequence in one iha_decode_step, then a token at a time, with
 * x, z and the weights in `storage` and a cache in cache_storage (layer from seed; rotary where
 * d is even): every step's rows against the float64 forward over the prefix. */
void tu_storage_check_decode(const iha_shape *shape, int storage, int cache_storage, int mask, int64_t window,
                             size_t prefill, uint64_t seed, double tol);

#endif
