/*
 * iha_mpi.h - libiha_mpi: sequence-parallel (ring) IHA attention over the ranks
 * of an MPI communicator (doc/mpi.md). An optional component, built when CMake
 * finds MPI
 * (-DIHA_MPI=AUTO, the default; ON requires it, OFF skips it); link iha_mpi,
 * which links libiha and MPI. libiha itself never includes mpi.h.
 *
 * The sequence of shape->tokens = N tokens is split over the ranks of the
 * communicator in runs of whole tokens, each with all P pseudo-tokens of its
 * tokens, so the token structure of the masks stays aligned. Which runs a rank
 * holds is the call's layout (iha_mpi_layout, iha_mpi_runs below); every rank
 * passes the same layout, shape (the whole sequence's N), options and
 * communicator, and its own runs' tensors: [B][H][count*P][d] in virtual rows
 * of its own tokens (attention calls) or [B][count][D] (layer calls).
 *
 * Each call is collective over the communicator: every rank must make it.
 * Arguments are checked on every rank and the result agreed on (an
 * MPI_Allreduce) before anything is written, so a refusal on one rank is a
 * refusal on all (the others return IHA_ERROR_INVALID_ARGUMENT and a message
 * naming the rank that refused). A call's message is iha_mpi_message()'s; a
 * failure of a libiha call inside it leaves libiha's own message in
 * iha_context_message(ctx) as well. The context's queue is finished before a
 * call returns.
 */
#ifndef IHA_MPI_H
#define IHA_MPI_H

/* From C++, only MPI's C interface: Open MPI's and MPICH's mpi.h otherwise bring their
 * deprecated C++ bindings, whose library (libmpi_cxx) neither the pkg-config module nor
 * CMake's MPI::MPI_C links. An application that uses those bindings includes mpi.h first. */
#if defined(__cplusplus) && !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX 1
#endif
#if defined(__cplusplus) && !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "iha.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef IHA_MPI_API
#if defined(__GNUC__) || defined(__clang__)
#define IHA_MPI_API __attribute__((visibility("default")))
#else
#define IHA_MPI_API
#endif
#endif

/* The tokens rank `rank` of `ranks` holds of a sequence of `tokens`: the first
 * tokens % ranks ranks hold tokens / ranks + 1, the others tokens / ranks, in
 * rank order. *first and *count get 0 when ranks is 0 or rank is out of range.
 */
IHA_MPI_API void iha_mpi_split(size_t tokens, int ranks, int rank, size_t *first, size_t *count);

/* Which tokens each rank holds.
 *   IHA_MPI_CONTIGUOUS  rank r holds one run, iha_mpi_split's: the fewest bytes per hop and,
 *                       with a window shorter than a run, work equal on every rank; under a
 *                       causal mask without a window rank r attends r + 1 of the R key blocks,
 *                       so the last rank does about twice the average work and sets the time.
 *   IHA_MPI_ZIGZAG      the sequence is split (as iha_mpi_split) into 2R chunks and rank r
 *                       holds chunk r and chunk 2R - 1 - r, back to back (run 0 then run 1):
 *                       under a causal mask every rank then attends the same number of key
 *                       chunk pairs, so no rank waits for another; needs at least 2R tokens.
 * A rank's tensors hold its runs' tokens in run order. */
typedef enum iha_mpi_layout { IHA_MPI_CONTIGUOUS = 0, IHA_MPI_ZIGZAG = 1 } iha_mpi_layout;

/* A run of tokens: first .. first + count - 1 of the whole sequence. */
typedef struct iha_mpi_run {
    size_t first;
    size_t count;
} iha_mpi_run;

/* The runs rank `rank` of `ranks` holds under `layout`, into runs[0] and runs[1] (a
 * contiguous layout's second run has count 0); returns the number of runs (1 or 2), or 0 for
 * a rank or layout out of range (both runs then 0, 0). */
IHA_MPI_API int iha_mpi_runs(size_t tokens, int ranks, int rank, iha_mpi_layout layout, iha_mpi_run runs[2]);

/* The message of this thread's last libiha_mpi call that did not return IHA_OK
 * ("" if none): what the call refused or what failed, and on which rank. The string lives
 * until the thread's next call. */
IHA_MPI_API const char *iha_mpi_message(void);

/* iha_attention over a sequence split across the ranks of comm:
 *   qt, kt, vt, o  [batch][heads][count*pseudo][head_dim]  this rank's tokens under `layout`
 *                  (iha_mpi_runs: run 0's rows then run 1's in each [batch][heads] slab)
 *   lse            [batch][heads][count*pseudo]  written when lse.mem is not NULL
 * with shape->tokens the WHOLE sequence's N (at least the number of ranks R; at least 2R
 * under IHA_MPI_ZIGZAG, else IHA_ERROR_INVALID_ARGUMENT on every rank) and the same mask,
 * window and scale as iha_attention; o and lse equal iha_attention's rows for this rank's
 * tokens within float rounding. The ring: each rank starts with its own key and value block
 * (both its runs) and, R - 1 times, sends the block it holds to rank + 1 and receives the
 * next from rank - 1 with MPI_Isend/MPI_Irecv while the held block is attended with
 * iha_attention_partial, once per (query run, key run) pair, merging into (o, lse). Blocks
 * travel as host copies, each run a contiguous tensor: each is read from the device once on
 * its owner, sent as MPI_FLOAT and, as soon as it has arrived, written to a device staging
 * buffer through a second command queue of the context's device, so that the upload runs
 * while the held block is still being attended (where the device overlaps transfers with
 * kernels; where a second queue cannot be made, through the context's queue). Under
 * IHA_MASK_CAUSAL and IHA_MASK_TOKEN_CAUSAL a key run wholly after a query run is not
 * attended, and a block with no visible pair is passed on untouched.
 *   - Float32 only, as iha_attention_partial: options->storage other than
 * IHA_STORAGE_F32, options->seq_lens set or options->rope nonzero is
 * IHA_ERROR_UNSUPPORTED (rotate at global positions before calling); a block of
 * more than INT_MAX floats is IHA_ERROR_UNSUPPORTED (one MPI message).
 *   - Host memory: 4 blocks of the largest rank's B*H*tokens*P*d floats (tokens: ceil(N/R)
 * contiguous, at most 2*ceil(N/2R) zig-zag); device memory: 4 such blocks, two staging
 * pairs (one pair on 2 contiguous ranks, none with one contiguous rank), and B*H*count*P
 * floats for lse when lse.mem is NULL. Zig-zag also holds this rank's qt, o and lse as run-major copies on the device (2*B*H*count*P*d + B*H*count*P
 * floats), since a run of a [batch][heads] tensor is one row range per slab.
 *   - o and lse must lie apart from qt, kt, vt and each other (IHA_ERROR_INVALID_ARGUMENT). */
IHA_MPI_API iha_status iha_mpi_attention(iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                                         const iha_attention_options *options, iha_buffer qt, iha_buffer kt,
                                         iha_buffer vt, iha_buffer o, iha_buffer lse);

/* The backward of iha_mpi_attention, as iha_attention_backward over the whole sequence:
 *   inputs   qt, kt, vt, o, dout  [batch][heads][count*pseudo][head_dim]  this rank's tokens
 *            lse                  [batch][heads][count*pseudo] (required: iha_mpi_attention's)
 *   outputs  dqt, dkt, dvt        [batch][heads][count*pseudo][head_dim]  overwritten, or
 *                                 added into with options->accumulate
 * all laid out as iha_mpi_attention's under the same layout. The ring carries each key and
 * value block together with its running dK and dV: at each hop the held block's K and V are
 * sent on (MPI_Isend/MPI_Irecv) while iha_attention_partial_backward, once per visible
 * (query run, key run) pair, adds this rank's queries' share into its dK and dV and the
 * block's share into dqt; then dK and dV follow. After R steps every block's dK and dV hold
 * all ranks' shares and make one more hop, back to their owner. Same shape, layout and
 * option rules as iha_mpi_attention. Host memory: 8 blocks of the largest rank's floats (K,
 * V, dK, dV held and arriving); device memory: 4 such blocks, and under zig-zag run-major
 * copies of qt, o, dout, dqt and lse (4*B*H*count*P*d + B*H*count*P floats). Every output
 * must lie apart from every input and the other outputs (IHA_ERROR_INVALID_ARGUMENT). */
IHA_MPI_API iha_status iha_mpi_attention_backward(iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout,
                                                  const iha_shape *shape, const iha_attention_options *options,
                                                  iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o,
                                                  iha_buffer lse, iha_buffer dout, iha_buffer dqt, iha_buffer dkt,
                                                  iha_buffer dvt);

/* The whole layer (iha_forward) over a sequence split across the ranks of comm:
 *   x, z  [batch][count][model_dim]   this rank's tokens under `layout` (iha_mpi_runs)
 * with shape->tokens the WHOLE sequence's N and the same options and weights on every rank
 * (each rank holds a full copy of the weights). z equals iha_forward's rows for this rank's
 * tokens within float rounding. Each rank runs iha_layer_expand on its runs (rotary at their
 * global positions), the ring of iha_mpi_attention, then iha_layer_collapse into a stand-in
 * that z gets once every rank's collapse has gone through: a refusal on any rank, at any step,
 * leaves z untouched on every rank. The layout, shape and options are compared over the ranks
 * first; ranks that pass different ones are refused alike (IHA_ERROR_INVALID_ARGUMENT naming
 * the field). Float32 activations and weights; options->seq_lens set is
 * IHA_ERROR_UNSUPPORTED. Device memory beyond iha_mpi_attention's: qt, kt, vt, o of this
 * rank's tokens (4*B*H*count*P*d floats), lse (B*H*count*P) and the stand-in (B*count*D);
 * with two runs (zig-zag) also staging for the longer run (2*B*c*D + 3*B*H*c*P*d floats, c its
 * tokens). */
IHA_MPI_API iha_status iha_mpi_forward(iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                                       const iha_attention_options *options, const iha_layer_weights *weights,
                                       iha_buffer x, iha_buffer z);

/* The backward of iha_mpi_forward, as iha_backward over the whole sequence: given this rank's
 * x and dz = dLoss/dz [batch][count][model_dim], writes this rank's dx (skipped when dx.mem is
 * NULL) and every member of *grads whose mem is not NULL with the WHOLE sequence's gradient,
 * summed over the ranks (MPI_Allreduce). Outputs are overwritten, or added into with
 * options->accumulate (each rank adds the sum into its own buffer: the gradients are the same
 * on every rank when the buffers held the same before). Every rank must ask for the same
 * gradients (compared with the other arguments). The forward is recomputed (expand, ring
 * attention), then collapse's backward, the ring backward and expand's backward run on this
 * rank's tokens into stand-ins, and the outputs are written only once every rank has come
 * through; a failure of the device after that (not a refusal) can leave them partly written.
 * Same rules as iha_mpi_forward; every output must lie apart from x, dz, the weights and the
 * other outputs. Device memory beyond iha_mpi_forward's and iha_mpi_attention_backward's:
 * dO, dQt, dKt, dVt (4*B*H*count*P*d floats) and the asked-for gradients' stand-ins; host
 * memory for those gradients and the largest of them again. */
IHA_MPI_API iha_status iha_mpi_backward(iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                                        const iha_attention_options *options, const iha_layer_weights *weights,
                                        iha_buffer x, iha_buffer dz, iha_buffer dx, const iha_layer_grads *grads);

#ifdef __cplusplus
}
#endif

#endif /* IHA_MPI_H */
