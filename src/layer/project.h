/* The projection stage of a layer call: a product with one weight matrix in the call's weight
 * storage. Half weights are read by the half-weight GEMV for few rows, else converted to a float
 * copy for the SGEMM. */
#ifndef IHA_LAYER_PROJECT_H
#define IHA_LAYER_PROJECT_H
#include "layer/plan.h"

/* The float workspace (IHA_WS_WEIGHT, in elements) iha__project needs for `rows` rows: one
 * converted weight matrix with half weights past the GEMV's rows, else 0. Calls that allocate
 * everything before their first enqueue get it first. */
size_t iha__project_workspace_elements(const iha_plan *p, size_t rows);

/* out [rows][n] = x [rows][k] * w [k][n] with float x and out, and w in the weight storage. */
iha_status iha__project(iha_context *ctx, const iha_plan *p, size_t rows, size_t n, size_t k, iha_buffer x, iha_buffer w,
                        iha_buffer out);
#endif
