/* 16-bit storage (half or bfloat16) at the edges of a layer call (iha_attention_options.storage
 * and weight_storage). The stages between run in float workspace: a 16-bit input is converted
 * once on entry, a float result once into its 16-bit output on exit (16-bit weights:
 * layer/project.h).
 * With float storage every helper is a pass-through. */
#ifndef IHA_LAYER_STORAGE_H
#define IHA_LAYER_STORAGE_H
#include "layer/plan.h"

/* The float view of input `in` of `elems` activation elements: `in` itself when activations
 * are float, else workspace `slot` holding its conversion (enqueued here). */
iha_status iha__input_float(iha_context *ctx, const iha_plan *p, iha_buffer in, size_t elems, iha_workspace_slot slot,
                            iha_buffer *out);

/* Where a stage should write the float result meant for `out`: `out` itself when activations
 * are float, else workspace `slot`. iha__output_finish then converts it into `out`. */
iha_status iha__output_float(iha_context *ctx, const iha_plan *p, iha_buffer out, size_t elems,
                             iha_workspace_slot slot, iha_buffer *result);
iha_status iha__output_finish(iha_context *ctx, const iha_plan *p, iha_buffer result, iha_buffer out, size_t elems);

/* The mixing and collapse weights as float: *w itself, or copies in IHA_WS_MIXING (a NULL
 * member stays NULL). The projection weights of *out are those of *w, unchanged. */
iha_status iha__mixing_float(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, iha_layer_weights *out);

/* The storage of a plan's activations, and of its weights and their gradients. */
static inline iha_storage iha__act_storage(const iha_plan *p) { return (iha_storage)p->act_storage; }
static inline iha_storage iha__weight_storage(const iha_plan *p) { return (iha_storage)p->weight_storage; }

/* The backward calls' outputs, overwritten or, with options->accumulate, added into. A step
 * writes its float result into the output itself when the output is float and overwritten;
 * otherwise into a float stand-in, which iha__grad_store then converts or adds into the output
 * (one pass; the products that can add themselves, with beta = 1, need no stand-in). Every
 * storage goes through these two, so a new storage is one case in each. */
static inline int iha__grad_stand_in(iha_storage storage, int accumulate)
{
    return storage != IHA_STORAGE_F32 || accumulate;
}
iha_status iha__grad_store(iha_context *ctx, iha_storage storage, int accumulate, iha_buffer result, iha_buffer out,
                           size_t elems);
#endif
