/* What the layer calls of libiha_mpi share (src/mpi/layer.c, layer_backward.c): this rank's
 * runs of tokens, the checks every rank agrees on, the rank's virtual tensors on the device, and
 * the per-token stages run over runs that do not lie contiguously in a rank's tensor. */
#ifndef IHA_MPI_LAYER_H
#define IHA_MPI_LAYER_H

#include "mpi/ring.h"

/* The rows of a tensor of a rank's tokens: per slab, rows_per_token rows of row_floats floats
 * for each token ([B][count][D]: B slabs, 1 row of D; [B][H][count*P][d]: B*H slabs, P rows of
 * d). */
typedef struct mpi_rows {
    size_t slabs, rows_per_token, row_floats;
} mpi_rows;

typedef struct mpi_layer {
    mpi_ring ring; /* comm, R and rank (ring.start is not used) */
    iha_mpi_run runs[2];
    int nruns;
    size_t count;                       /* this rank's tokens, over its runs */
    size_t run_start[2];                /* where each run starts in the rank's tensors, in tokens */
    iha_shape local;                    /* the shape with tokens = count */
    size_t x_elems, v_elems, lse_elems; /* B*count*D, B*H*count*P*d, B*H*count*P */
    mpi_rows token_rows, virtual_rows;
    iha_attention_options ring_options; /* the caller's with rope 0: the stages rotate */
    cl_mem qt, kt, vt, o, lse;          /* this rank's virtual tensors */
    cl_mem stage[5];                    /* two runs: staging of one run's tensors, two of tokens, then three virtual */
} mpi_layer;

/* Checks what both layer calls check on this rank (comm, ctx, shape, options, weights, the
 * layout, x) and allocates the rank's qt, kt, vt, o, lse and, with two runs, the staging.
 * Returns the local status with the message set on failure; L->ring is usable for mpi_agree
 * whenever L->ring.R > 0 (otherwise there is no communicator to agree over). */
iha_status mpi_layer_open(mpi_layer *L, iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                          const iha_attention_options *options, const iha_layer_weights *weights, iha_buffer x,
                          const char *call);
void mpi_layer_close(mpi_layer *L);

/* Copies run i's rows between a rank tensor and a run tensor (to_run: rank -> run). */
iha_status mpi_layer_copy_run(iha_context *ctx, const mpi_layer *L, const mpi_rows *rows, int i, iha_buffer rank,
                              iha_buffer run, int to_run);

/* iha_layer_expand of x into L->qt, kt, vt, run by run at the runs' global positions. */
iha_status mpi_layer_expand(mpi_layer *L, iha_context *ctx, const iha_attention_options *options,
                            const iha_layer_weights *weights, iha_buffer x, const char *call);

/* The libiha call `what` failed on this rank: its status, with a message naming the rank and
 * keeping libiha's. */
iha_status mpi_layer_failed(const mpi_layer *L, iha_context *ctx, iha_status st, const char *call, const char *what);

/* Nonzero when [a, a + na) and [b, b + nb) of the same cl_mem overlap (floats). */
int mpi_overlap(iha_buffer a, size_t na, iha_buffer b, size_t nb);

#endif
