/*
 * iha_multi.h - sequence-parallel attention over several contexts of one process: several GPUs
 * of one machine, or several contexts on one device. Part of libiha (no other library to link);
 * it includes iha.h, and nothing includes it implicitly. doc/guide.md, "Several devices in one
 * process", shows it in use; libiha_mpi (include/iha_mpi.h) is the same over MPI ranks.
 *
 * The sequence of shape->tokens = N tokens is split into `count` parts of whole tokens, part i
 * on contexts[i] (iha_multi_split: contiguous, the first N % count parts one token longer), so
 * each part holds all P pseudo-tokens of its tokens and the masks' token structure stays
 * aligned. Part i's tensors are [B][H][count_i*P][d] in virtual rows of its own tokens, in
 * buffers of contexts[i]'s cl_context; shape, options and the mask's global positions are the
 * whole sequence's.
 *
 * How the calls run: each context attends its own key block first; then every key and value
 * block that another part's queries can see is read to host memory once (from its own context)
 * and written into the staging buffers of the contexts that need it, where
 * iha_attention_partial (its backward) merges it. Key blocks that no query of a part can see
 * under the mask and window (under the causal masks, every block after the part's tokens) are
 * neither sent there nor attended. The steps of every context are enqueued before the call waits
 * for any of them, so contexts on different devices run at the same time from one thread (on a
 * driver that ends kernel loops early, where every call waits for its kernels, they run one
 * after another). The calls finish every context's queue before they return.
 *
 * Rules shared by every call:
 *   - count at least 1 and at most N (every part holds a token); contexts, shape and options not
 *     NULL; no context NULL and none twice (a part per context: several parts on one device take
 *     several contexts). Else IHA_ERROR_INVALID_ARGUMENT.
 *   - Float32 only, as iha_attention_partial: options->storage other than IHA_STORAGE_F32, or
 *     options->seq_lens set, is IHA_ERROR_UNSUPPORTED; options->rope nonzero is
 *     IHA_ERROR_INVALID_ARGUMENT (rotate at global positions first: iha_layer_expand's
 *     first_token); shape->model_dim is ignored; the shape and option rules of iha_attention on
 *     the whole sequence apply (T = N*P at most INT_MAX/4).
 *   - Every argument of every part is checked, every internal buffer of every context
 *     allocated (and the kernel of an addition made part by part built), before anything is
 *     enqueued on any context: a refused call writes nothing anywhere. Each part's buffers must
 *     belong to its context, be large enough for its rows (IHA_ERROR_BUFFER_TOO_SMALL) and keep
 *     the outputs apart from every input and every other output of every part
 *     (IHA_ERROR_INVALID_ARGUMENT).
 *   - Messages: every context's message is cleared on entry. A failure that belongs to one part
 *     (its buffers, its device) is reported in that part's context, and the message names it
 *     ("contexts[2]: ..."); a failure of the common arguments (shape, options, count, a NULL or
 *     repeated context) in every context the array holds. After a device failure part way
 *     through, the outputs are unspecified.
 *   - Thread safety: the call uses every context of the array, as a call on each of them
 *     (iha.h's rules: no other thread may use any of them meanwhile).
 *   - Internal memory: per context, staging buffers for the largest part's key block and the
 *     partial steps' own workspace for it (the workspace, kept between calls; iha_context_trim
 *     releases it), counted against the device's memory; on the host, a copy of every key and
 *     value block that another part needs (at most 2*B*H*N*P*d floats), freed before the call
 *     returns. The device's memory is checked per context, and per nested call (a stage, the
 *     attention) on its own: the buffers of several contexts on one device, and those of nested
 *     calls together, are not checked against it, so R contexts on one device can exceed it
 *     together, and then a call fails part way through with IHA_ERROR_DEVICE_MEMORY or
 *     IHA_ERROR_OPENCL (outputs unspecified, as after any device failure).
 */
#ifndef IHA_MULTI_H
#define IHA_MULTI_H

#include "iha.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tokens part `part` of `parts` holds of a sequence of `tokens`: the first tokens % parts
 * parts hold tokens / parts + 1 tokens, the others tokens / parts, in part order (iha_mpi_split's
 * split). *first and *count get 0 when parts is 0 or part is out of range; either pointer may be
 * NULL. */
IHA_API void iha_multi_split(size_t tokens, size_t parts, size_t part, size_t *first, size_t *count);

/* iha_attention over a sequence split across count contexts, part i on contexts[i]:
 *   qt[i], kt[i], vt[i], o[i]  [batch][heads][count_i*pseudo][head_dim]  part i's tokens
 *   lse[i]                     [batch][heads][count_i*pseudo]  written when lse[i].mem is not
 *                              NULL (lse may be NULL: none written)
 * with count_i from iha_multi_split(shape->tokens, count, i, ...) and shape->tokens the WHOLE
 * sequence's N. o and lse equal iha_attention's rows of the part's tokens over the whole
 * sequence within float rounding. Device memory per context, with more than one part: two
 * blocks of the largest part's B*H*ceil(N/count)*P*d floats (key and value staging),
 * B*H*count_i*P floats for an lse with mem NULL, and on devices other than GPUs
 * iha_attention_partial's packed copy of the largest key block (its size, rows rounded up to the
 * tiles' key block). */
IHA_API iha_status iha_multi_attention(iha_context *const *contexts, size_t count, const iha_shape *shape,
                                       const iha_attention_options *options, const iha_buffer *qt, const iha_buffer *kt,
                                       const iha_buffer *vt, const iha_buffer *o, const iha_buffer *lse);

/* The backward of iha_multi_attention, as iha_attention_backward over the whole sequence:
 *   inputs   qt[i], kt[i], vt[i], o[i], dout[i]  [batch][heads][count_i*pseudo][head_dim]
 *            lse[i]                              [batch][heads][count_i*pseudo] (required:
 *                                                iha_multi_attention's o and lse)
 *   outputs  dqt[i], dkt[i], dvt[i]              [batch][heads][count_i*pseudo][head_dim]
 * overwritten, or added into with options->accumulate. Part i's dqt sums its queries' gradient
 * over every key block it sees; each key block's dkt and dvt sum every part's share: its own
 * part's is computed in place, the others' on the contexts that see the block, read back to
 * host, summed there deterministically in the ring's step order and added in on the block's
 * context. Device memory per context, with more than one part: four blocks of the largest
 * part's floats (key, value and their gradients' staging) and iha_attention_partial_backward's
 * workspace for the largest key block: B*H*count_i*P floats (Delta) and, on devices other than
 * GPUs, packed copies of the part's qt and dout (each its size with rows and columns rounded up
 * to 16) and partial dq sums (at most max(64, B*H) / (B*H) copies of that size);
 * host memory beyond the key and value copies: the summed foreign gradients of every block that
 * has any (at most 2*B*H*N*P*d floats) and two blocks of dK and dV per context in flight. */
IHA_API iha_status iha_multi_attention_backward(iha_context *const *contexts, size_t count, const iha_shape *shape,
                                                const iha_attention_options *options, const iha_buffer *qt,
                                                const iha_buffer *kt, const iha_buffer *vt, const iha_buffer *o,
                                                const iha_buffer *lse, const iha_buffer *dout, const iha_buffer *dqt,
                                                const iha_buffer *dkt, const iha_buffer *dvt);

/* The whole layer (iha_forward) over a sequence split across count contexts:
 *   x[i], z[i]   [batch][count_i][model_dim]  part i's tokens, on contexts[i]
 *   weights[i]   the layer's weights, a copy on each context (as iha_forward's)
 * with shape->tokens the WHOLE sequence's N. z equals iha_forward's rows of the part's tokens
 * within float rounding. Each context runs iha_layer_expand on its part (rotary at the part's
 * global positions: first_token is its first token), then iha_multi_attention joins the parts
 * (the expansion's rotary already applied), then each context runs iha_layer_collapse. The rules
 * above, with rotary allowed; shape->model_dim is the layer's D; options->storage must be
 * IHA_STORAGE_F32 (weight_storage as in iha_forward). Every part's x, z and weights are checked
 * before anything is enqueued; z must lie apart from every part's weights, x and z.
 * z[i] is written only once every part's collapse came through (each part collapses into a
 * stand-in first). Workspace per context, beyond the stages' own and iha_multi_attention's: the
 * part's qt, kt, vt and o (4*B*H*count_i*P*d floats) and z's stand-in (B*count_i*D floats). */
IHA_API iha_status iha_multi_forward(iha_context *const *contexts, size_t count, const iha_shape *shape,
                                     const iha_attention_options *options, const iha_layer_weights *weights,
                                     const iha_buffer *x, const iha_buffer *z);

/* The backward of iha_multi_forward, as iha_backward over the whole sequence:
 *   x[i], dz[i]   [batch][count_i][model_dim]  part i's tokens and dLoss/dz, on contexts[i]
 *   dx[i]         [batch][count_i][model_dim]  written unless dx[i].mem is NULL (dx may be
 *                 NULL: no dx anywhere)
 *   weights[i]    the layer's weights on contexts[i] (a copy each, as iha_multi_forward's)
 *   grads[i]      on contexts[i]: every member whose mem is not NULL gets the WHOLE sequence's
 *                 gradient, summed over the parts (grads may be NULL: no gradients)
 * Every context receives the same sum (without accumulate the same floats on each): training
 * on several devices keeps a copy of the weights on each and updates every copy with the same
 * gradient, so the call delivers it where each copy lives; a single set on contexts[0] would
 * leave the caller to copy it to the other devices before each update. A part may ask for
 * fewer members than another (or none); a member is computed once if any part asks for it.
 * Outputs are overwritten, or added into with options->accumulate (each part's dx and
 * gradients into its own buffers). With no dx and no gradient asked for, the call only checks
 * its arguments.
 * The call recomputes the forward (iha_layer_expand per part at its first token,
 * iha_multi_attention), then per part iha_layer_collapse_backward, iha_multi_attention_backward,
 * and per part iha_layer_expand_backward into stand-ins; the parts' gradients are read to host
 * memory, summed in part order and written back to each context, and only then are dx and the
 * gradients copied (or added) into the caller's buffers. dx and the gradients equal
 * iha_backward's within float rounding. The rules above and iha_multi_forward's, and
 * options->weight_storage must be IHA_STORAGE_F32 (IHA_ERROR_UNSUPPORTED); every output (dx[i],
 * grads[i]'s members) must lie apart from every part's x, dz and weights and every other
 * output. Workspace per context, beyond the stages' and iha_multi_attention_backward's own: qt,
 * kt, vt, o, dout, dqt, dkt, dvt of the part (8*B*H*count_i*P*d floats), its lse, a dx
 * stand-in (B*count_i*D) and the asked-for gradients (up to 4*D*H*d + 4*H*H*P floats); on the
 * host, two copies of the asked-for gradients. */
IHA_API iha_status iha_multi_backward(iha_context *const *contexts, size_t count, const iha_shape *shape,
                                      const iha_attention_options *options, const iha_layer_weights *weights,
                                      const iha_buffer *x, const iha_buffer *dz, const iha_buffer *dx,
                                      const iha_layer_grads *grads);

#ifdef __cplusplus
}
#endif

#endif /* IHA_MULTI_H */
