/* What the layer stage calls (include/iha.h, "Layer stages") share: iha_layer_expand and
 * iha_layer_collapse (stages.c) and their backwards (stages_backward.c). */
#ifndef IHA_LAYER_STAGES_H
#define IHA_LAYER_STAGES_H
#include "layer/plan.h"

/* The opening of a stage call: iha__call_plan (with the model dimension) on *used, the options
 * the stage reads, copied from *options: storage, weight_storage and accumulate, and with
 * `rotary` (the expand stages) rope, rope_base and the packed sequences too; the others keep
 * iha_attention_options_init's values, so the options a stage ignores cannot refuse it. With
 * rotary the rows' positions start at first_token * P (plan->rope_first): packed sequences with
 * first_token > 0, or a run that ends past the kernels' positions, are IHA_ERROR_UNSUPPORTED.
 * Then the weights the stage reads (`reads`, iha__check_weights_read into *read). */
iha_status iha__stage_plan(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options, int rotary,
                           size_t first_token, const iha_layer_weights *w, unsigned reads, double *mark, iha_plan *plan,
                           iha_attention_options *used, iha_layer_weights *read);
#endif
