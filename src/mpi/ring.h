/* What the ring calls share (src/mpi/): the split of the sequence over the
 * ranks, the arguments checked and agreed on by every rank, and blocks staged
 * between device and host. */
#ifndef IHA_MPI_RING_H
#define IHA_MPI_RING_H

#include "iha_mpi.h"

/* The ring as one rank sees it. */
typedef struct mpi_ring {
    MPI_Comm comm;
    int R, rank, next, prev;
    size_t *start;     /* R + 1 token boundaries: rank j holds start[j] .. start[j+1]
                          - 1 */
    size_t row_elems;  /* B*H*P*d: floats of one token over the batch and heads */
    size_t lse_elems;  /* B*H*P: lse entries of one token */
    size_t max_tokens; /* the largest rank's tokens */
} mpi_ring;

/* Fills *ring for shape over comm and checks what every call checks (shape,
 * options, the split); returns the local status, with the message set on
 * failure. */
iha_status mpi_ring_open(mpi_ring *ring, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                         const iha_attention_options *options, const char *call);
void mpi_ring_close(mpi_ring *ring);

/* Tokens of block j. */
size_t mpi_ring_tokens(const mpi_ring *ring, int j);

/* Checks that b holds at least `floats` floats from its offset (NULL mem
 * refused). */
iha_status mpi_check_buffer(iha_buffer b, size_t floats, const char *call, const char *name);

/* Every rank's local status agreed on: returns the local status when it failed,
 * otherwise IHA_ERROR_INVALID_ARGUMENT when another rank failed (the message
 * names it), else IHA_OK. */
iha_status mpi_agree(const mpi_ring *ring, iha_status local, const char *call);

/* Sets the message of iha_mpi_message and returns status. */
iha_status mpi_fail(iha_status status, const char *fmt, ...);

/* Host <-> device copies of `floats` floats, blocking; IHA_ERROR_OPENCL on
 * failure. */
iha_status mpi_read(iha_context *ctx, iha_buffer src, float *dst, size_t floats);
iha_status mpi_write(iha_context *ctx, const float *src, iha_buffer dst, size_t floats);
/* Copies, in each of `slabs` consecutive slabs, `rows` rows of `row_floats` floats from row
 * src_row of src (slabs of src_rows rows) to row dst_row of dst (slabs of dst_rows rows):
 * one clEnqueueCopyBufferRect on ctx's queue, not waited for. IHA_ERROR_OPENCL on failure. */
iha_status mpi_copy_rows(iha_context *ctx, iha_buffer src, size_t src_rows, size_t src_row, iha_buffer dst,
                         size_t dst_rows, size_t dst_row, size_t rows, size_t row_floats, size_t slabs);
/* A device buffer of `floats` floats, or NULL (message set). */
cl_mem mpi_device_buffer(iha_context *ctx, size_t floats, const char *call);

#endif
