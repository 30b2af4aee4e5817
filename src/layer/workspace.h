/* The layer's workspace slots. A slot's buffer is kept between calls, so slots that no call
 * needs at once share a buffer: each role has its own name, and the aliases say which roles
 * share. */
#ifndef IHA_LAYER_WORKSPACE_H
#define IHA_LAYER_WORKSPACE_H
#include "runtime/workspace.h"

enum {
    IHA_WS_Q = IHA_WS_LAYER_BASE, /* projected Q  [B][N][H][d] */
    IHA_WS_K,
    IHA_WS_V,
    IHA_WS_QT,      /* pseudo-queries [B][H][T][d] */
    IHA_WS_KT,      /* pseudo-keys, packed in key blocks (see cl/attention.cl) */
    IHA_WS_VT,      /* pseudo-values [B][H][T][d] */
    IHA_WS_O,       /* attention output [B][H][T][d] */
    IHA_WS_Y,       /* collapsed [B][N][H][d] */
    IHA_WS_PARTIAL, /* decoding: partial softmax results per key split */
    IHA_WS_STEP,    /* decoding: per-sequence (n0, count) of the step */
    IHA_WS_ROPE_ROWS, /* decoding on a ring: the rotary rows of the step's tokens [B][k*P][d] */
    IHA_WS_CHUNK_X, /* decoding on a ring: one chunk of a long step's x [B][chunk][D] */
    IHA_WS_CHUNK_Z, /* and of its z */
    IHA_WS_X,       /* half storage: x (or the first half input) converted to float */
    IHA_WS_OUT,     /* half storage: the float result before its conversion to half */
    IHA_WS_WEIGHT,  /* half weights: one projection matrix converted to float [D][H*d] */
    IHA_WS_MIXING,  /* half weights: alpha_q, alpha_k, alpha_v and r converted to float */
    IHA_WS_DELTA,   /* attention backward: Dt = dO . O per virtual row [B][H][T] */
    IHA_WS_SEQ_BOUNDS, /* packed sequences: each token's sequence bounds, cl_int2 [B][N] */
    IHA_WS_SEQ_ROPE,   /* packed sequences with rotary: a rotary table per batch row [B][T][2][d/2] */
    /* The backward's own tensors, IHA_WS_GRAD_SLOTS slots from IHA_WS_GRAD (roles in
     * src/layer/layer_backward.c and src/layer/backward.c). */
    IHA_WS_GRAD,
    IHA_WS_LAYER_END = IHA_WS_GRAD + 18
};
#define IHA_WS_GRAD_SLOTS (IHA_WS_LAYER_END - IHA_WS_GRAD)
_Static_assert((int)IHA_WS_LAYER_END <= (int)IHA_WS_MEASURE_BASE, "the layer's workspace slots overlap the next module's");

/* The attention backward's tile kernel needs Q and dO packed in 16-column blocks and its partial
 * dq sums; a backward call runs no forward, so they share the pseudo tensors' buffers. */
#define IHA_WS_PACKED_Q IHA_WS_QT
#define IHA_WS_PACKED_DO IHA_WS_O
#define IHA_WS_DQ_PARTIAL IHA_WS_VT
/* The attention backward's buffers: Dt (delta_elems floats) into *delta and, with tiled, the tile
 * kernel's packed Q and dO (packed floats each) and partial dq sums (sums floats) into packs and
 * *part, NULL there without. The caller has counted them against the device's memory. */
iha_status iha__attention_backward_workspace(iha_context *ctx, int tiled, size_t delta_elems, size_t packed,
                                             size_t sums, cl_mem *delta, cl_mem packs[2], cl_mem *part);
/* A decoding step with packed new tokens gathers x into, and scatters z from, [B][k][D] copies;
 * a decoding step uses no sequence bounds or packed rotary table. */
#define IHA_WS_PACKED_X IHA_WS_SEQ_BOUNDS
#define IHA_WS_PACKED_Z IHA_WS_SEQ_ROPE
#endif
