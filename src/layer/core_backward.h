/* The backward pass of the layer's core, mixing to collapse (doc/spec.md, "The backward pass",
 * steps 2 to 5): from dY back through the collapse, the attention, the rotation and the mixing
 * to dQ, dK, dV and the gradients of alpha and R. iha_backward runs it between its projections'
 * backward steps; iha_attention_core_backward (core_backward.c) runs it alone. */
#ifndef IHA_LAYER_CORE_BACKWARD_H
#define IHA_LAYER_CORE_BACKWARD_H
#include "layer/plan.h"
#include "layer/workspace.h"

/* The backward calls' own tensors, each in workspace slot IHA_WS_GRAD + role. The forward's
 * slots hold what they hold in iha_forward (Q, K, V, Y, and the packed keys in IHA_WS_KT); the
 * attention backward's packed Q and dO and its partial dq sums share the forward's pseudo-tensor
 * slots (layer/workspace.h), so the pseudo tensors the backward reads live here. */
enum {
    /* token tensors [B][N][H][d] */
    IHA_GRAD_DY, IHA_GRAD_DQ, IHA_GRAD_DK, IHA_GRAD_DV,
    /* pseudo tensors [B][H][T][d], keys as rows */
    IHA_GRAD_QT, IHA_GRAD_KT, IHA_GRAD_VT, IHA_GRAD_O, IHA_GRAD_DO, IHA_GRAD_DQT, IHA_GRAD_DKT, IHA_GRAD_DVT,
    IHA_GRAD_LSE,        /* [B][H][T] */
    IHA_GRAD_XT,         /* the layer's x transposed [D][B*N] */
    IHA_GRAD_TRANSPOSED, /* the layer's one weight or Y transposed at a time */
    IHA_GRAD_PARTIAL,    /* the mixing gradients' partial sums */
    IHA_GRAD_EDGE_IN,    /* half storage: the layer's x, dz, then its 8 weights, as float */
    IHA_GRAD_EDGE_OUT,   /* float stand-ins of outputs that are half or added into (layer/storage.h) */
    IHA_GRAD_ROLES
};
_Static_assert(IHA_GRAD_ROLES <= IHA_WS_GRAD_SLOTS, "the backward needs more workspace slots");

/* The buffers of a backward call that the core's steps read and write. */
typedef struct iha_grad_buffers {
    cl_mem t[IHA_GRAD_ROLES];         /* the roles' slots; NULL: not allocated */
    iha_buffer q, k, v;               /* the forward's token tensors, float [B][N][H][d] */
    iha_buffer o, lse;                /* the IHA_GRAD_O and IHA_GRAD_LSE slots, or the caller's saved state */
    cl_mem packed_keys;               /* the forward's keys in key blocks; NULL with saved state */
    cl_mem delta, packed[2], partial; /* the attention backward's: Dt, and on CPUs Q, dO packed and
                                         the partial dq sums */
} iha_grad_buffers;

/* The core's float gradients; an output with mem NULL is not computed. */
typedef struct iha_core_grads {
    iha_buffer dq, dk, dv;                   /* [B][N][H][d] */
    iha_buffer alpha_q, alpha_k, alpha_v, r; /* [H][H][P] */
} iha_core_grads;

/* The core's workspace in floats: sets sizes[] for the roles it uses (the pseudo tensors, O and
 * LSE unless `saved`, the mixing gradients' partial sums) and leaves the others as they are;
 * returns those roles' total plus its other buffers (the packed keys unless saved, Dt, and the
 * attention backward's tile buffers where it runs them), 0 on overflow. */
size_t iha__core_grad_elements(const iha_context *ctx, const iha_plan *p, int saved, size_t sizes[IHA_GRAD_ROLES]);

/* Allocates every role of sizes[] that is not 0 into g->t (the others NULL) and the core's other
 * buffers; O and LSE are saved's (layer/saved.h) when saved.mem is not NULL. g->q, k and v are
 * the caller's to set. */
iha_status iha__core_grad_buffers(iha_context *ctx, const iha_plan *p, iha_buffer saved,
                                  const size_t sizes[IHA_GRAD_ROLES], iha_grad_buffers *g);

/* The forward's mixing (with rotary when rope is not NULL) of g->q, g->k, g->v into the pseudo
 * tensors and, unless saved, its attention into g->o and g->lse. w's mixing weights are float
 * (or NULL, the identity shortcut). */
iha_status iha__core_forward_again(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w,
                                   const iha_grad_buffers *g, cl_mem rope, int saved, double *mark);

/* From float dy [B][N][H][d], after iha__core_forward_again: dO and dR, the attention backward,
 * the inverse rotary, then dQ, dK, dV and the alphas' gradients, each written (overwritten) where
 * *out says. */
iha_status iha__core_backward_stages(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w,
                                     const iha_grad_buffers *g, iha_buffer dy, const iha_core_grads *out, cl_mem rope,
                                     double *mark);

/* The collapse's backward on float tensors: dout = dO, the mixing of dy with r (NULL: identity),
 * and dr = the gradient of R from dy and O, each when its mem is not NULL (overwritten);
 * partial holds iha__mix_grad_partial_elements floats. */
iha_status iha__collapse_backward_enqueue(iha_context *ctx, const iha_plan *p, iha_buffer r, iha_buffer dy,
                                          iha_buffer o, cl_mem partial, iha_buffer dout, iha_buffer dr);
/* The mixing's backward on float tensors, from dpseudo = dQt, dKt, dVt (rotated back already):
 * dtok[i] = dQ, dK, dV (the collapse of dpseudo[i] with w's alpha) and dalphas[i] (from
 * tokens[i] = Q, K, V, and dpseudo[i]), each when its mem is not NULL (overwritten). */
iha_status iha__mixing_backward_enqueue(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w,
                                        const iha_buffer tokens[3], const iha_buffer dpseudo[3], cl_mem partial,
                                        const iha_buffer dtok[3], const iha_buffer dalphas[3]);
#endif
