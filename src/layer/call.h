/* What every public layer call does on entry and between stages. */
#ifndef IHA_LAYER_CALL_H
#define IHA_LAYER_CALL_H
#include "kernels/tensor.h"

/* Clears the context's message and stage times; with time_stages, finishes the queue and
 * starts the clock in *mark. IHA_ERROR_INVALID_ARGUMENT for a NULL ctx. */
iha_status iha__call_begin(iha_context *ctx, double *mark);
/* With time_stages, finishes the queue and adds the time since *mark to *slot. */
iha_status iha__stage_done(iha_context *ctx, double *slot, double *mark);
#endif
