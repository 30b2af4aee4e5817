/* What a caller that runs many partial steps (src/multi/) needs to know of them in advance. */
#ifndef IHA_LAYER_PARTIAL_H
#define IHA_LAYER_PARTIAL_H
#include "iha.h"

/* Grows the workspace that iha_attention_partial takes on ctx for key blocks of up to k_tokens
 * tokens of shape's batch, heads, head_dim and pseudo (the packed keys of the tiles on devices
 * that are not GPUs), so that no such step fails for it: its size first, then that size plus
 * `others` (the caller's other buffers of the call, in floats) checked against the device's
 * memory, then the growth. *floats gets its size (0 where the step takes none). The shape's
 * sizes must have passed iha__plan_make. */
iha_status iha__partial_reserve(iha_context *ctx, const iha_shape *shape, size_t k_tokens, size_t others,
                                size_t *floats);
/* The same for iha_attention_partial_backward with shape the query block's (its tokens) and key
 * blocks of up to k_tokens tokens: Dt, and where the tile pass runs the packed Q and dO of the
 * query block and its partial dq sums (whose count never shrinks as the key block grows). */
iha_status iha__partial_backward_reserve(iha_context *ctx, const iha_shape *shape, size_t k_tokens, size_t others,
                                         size_t *floats);
#endif
