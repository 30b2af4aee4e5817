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

/* The three input projections of x [B*N][D]: q, k, v [B*N][H*d] = x W_Q, x W_K, x W_V. */
iha_status iha__project_qkv(iha_context *ctx, const iha_plan *p, iha_buffer x, const iha_layer_weights *w, iha_buffer q,
                            iha_buffer k, iha_buffer v);
/* The output projection of y [B*N][H*d]: z [B*N][D] = y W_O. */
iha_status iha__project_output(iha_context *ctx, const iha_plan *p, iha_buffer y, iha_buffer wo, iha_buffer z);

/* The backward's float products: c [m][n] = a [m][k] * b [k][n] with row strides lda, ldb, ldc,
 * or with `add` c += a * b (beta = 1). */
iha_status iha__product(iha_context *ctx, int add, size_t m, size_t n, size_t k, iha_buffer a, size_t lda, iha_buffer b,
                        size_t ldb, iha_buffer c, size_t ldc);
/* c [m][n] (= or +=) a [m][k] * transpose of b_t, where b_t is [n][k]: b_t is transposed into
 * `scratch` (n*k floats) first (the in-order queue runs the product before a next transpose
 * overwrites it). m, n and k below INT_MAX. */
iha_status iha__product_bt(iha_context *ctx, cl_mem scratch, size_t m, size_t n, size_t k, iha_buffer a, iha_buffer b_t,
                           iha_buffer c, int add);

/* The output projection's backward (layer/project_backward.c): dy = dz W_O^T and, when dwo.mem
 * is not NULL, dwo (= or with add +=) y^T dz; float tensors, scratch of max(B*N*H*d, D*H*d)
 * floats. */
iha_status iha__project_output_backward(iha_context *ctx, const iha_plan *p, cl_mem scratch, iha_buffer dz,
                                        iha_buffer wo, iha_buffer y, iha_buffer dy, iha_buffer dwo, int add);
/* The input projections' backward: for each dw[i] whose mem is not NULL, dw[i] (= or with bit i
 * of add_dw +=) x^T dtok[i] (dtok: dQ, dK, dV), and when dx.mem is not NULL, dx (= or with
 * add_dx +=) dQ W_Q^T + dK W_K^T + dV W_V^T; float tensors, scratch[0] of B*N*D floats (x
 * transposed) and scratch[1] of D*H*d (a weight transposed). */
iha_status iha__project_qkv_backward(iha_context *ctx, const iha_plan *p, const cl_mem scratch[2], iha_buffer x,
                                     const iha_layer_weights *w, const iha_buffer dtok[3], const iha_buffer dw[3],
                                     unsigned add_dw, iha_buffer dx, int add_dx);
#endif
