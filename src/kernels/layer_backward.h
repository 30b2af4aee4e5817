/* The layer backward's steps around the attention backward (cl/layer_backward.cl). */
#ifndef IHA_KERNELS_LAYER_BACKWARD_H
#define IHA_KERNELS_LAYER_BACKWARD_H
#include "kernels/tensor.h"

/* dst [cols][rows] = transpose of src [rows][cols], with row strides ld_src and ld_dst; rows and
 * cols below INT_MAX. */
iha_status iha__transpose_enqueue(iha_context *ctx, size_t rows, size_t cols, iha_buffer src, size_t ld_src, iha_buffer dst,
                                  size_t ld_dst);
/* The gradient through the rotary embedding, in place on x [B][H][T][d] (d even): the inverse
 * rotation at each row's virtual position, with iha__rope_table's table. */
iha_status iha__rope_inverse_enqueue(iha_context *ctx, const iha_dims *dims, iha_buffer x, cl_mem table);
/* g [H][H][P] = sum over b, n, c of tokens[b][n][i][c] * pseudo[b][j][n*P+p][c], the form of the
 * gradients of R (tokens dY, pseudo O) and of alpha (tokens Q, pseudo dQt); tokens is
 * [B][N][H][d], pseudo [B][H][T][d], and partial holds iha__mix_grad_partial_elements floats. */
size_t iha__mix_grad_partial_elements(const iha_dims *dims);
iha_status iha__mix_grad_enqueue(iha_context *ctx, const iha_dims *dims, iha_buffer tokens, iha_buffer pseudo,
                                 cl_mem partial, iha_buffer g);
#endif
