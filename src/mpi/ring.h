/* What the ring calls share (src/mpi/): the runs of the sequence each rank holds,
 * the arguments checked and agreed on by every rank, and blocks staged between
 * device and host. */
#ifndef IHA_MPI_RING_H
#define IHA_MPI_RING_H

#include "iha_mpi.h"

/* The ring as one rank sees it. */
typedef struct mpi_ring {
    MPI_Comm comm;
    int R, rank, next, prev;
    int nruns;         /* runs per rank: 1 (contiguous) or 2 (zig-zag) */
    iha_mpi_run *runs; /* 2R runs: rank j holds runs[2j] then runs[2j+1] (count 0 when unused) */
    size_t slabs;      /* B*H */
    size_t pseudo, head_dim;
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

/* Tokens of block j: both runs of rank j. */
size_t mpi_ring_tokens(const mpi_ring *ring, int j);

/* Run b (0 or 1) of rank j. */
iha_mpi_run mpi_ring_run(const mpi_ring *ring, int j, int b);

/* Floats before run b of rank j in a run-major block of width w floats per virtual row: a
 * block of rank j is laid out as run 0's [B*H][count*P][w] then run 1's, so each run is a
 * contiguous tensor that iha_attention_partial can take at an offset. */
size_t mpi_run_offset(const mpi_ring *ring, int j, int b, size_t w);

/* No key of run k is visible to any query of run q: causal masks, k wholly after q. */
int mpi_pair_hidden(const iha_attention_options *options, iha_mpi_run q, iha_mpi_run k);
/* Some pair of this rank's query runs and key block j is not hidden. */
int mpi_block_visible(const iha_attention_options *options, const mpi_ring *ring, int j);

/* Rank j's tensor of width w floats per virtual row between the rank's layout ([B*H][rows of
 * both runs][w], as the caller passes it) and the run-major one, on the host (src and dst
 * apart). */
void mpi_host_to_runs(const mpi_ring *ring, int j, const float *src, float *dst, size_t w);
void mpi_host_from_runs(const mpi_ring *ring, int j, const float *src, float *dst, size_t w);

/* This rank's tensor of width w between its layout and run-major on the device
 * (mpi_copy_rows per run, not waited for). */
iha_status mpi_device_to_runs(iha_context *ctx, const mpi_ring *ring, iha_buffer src, iha_buffer dst, size_t w);
iha_status mpi_device_from_runs(iha_context *ctx, const mpi_ring *ring, iha_buffer src, iha_buffer dst, size_t w);

/* Checks that b holds at least `floats` floats from its offset (NULL mem
 * refused). */
iha_status mpi_check_buffer(iha_buffer b, size_t floats, const char *call, const char *name);

/* Every rank's local status agreed on: returns the local status when it failed,
 * otherwise IHA_ERROR_INVALID_ARGUMENT when another rank failed (the message
 * names it), else IHA_OK. */
iha_status mpi_agree(const mpi_ring *ring, iha_status local, const char *call);

/* Refuses (IHA_ERROR_INVALID_ARGUMENT) an output a of na floats that overlaps b of nb floats
 * in the same cl_mem: the run-major copies would hide the overlap from libiha's own check. */
iha_status mpi_check_apart(iha_buffer a, size_t na, const char *a_name, iha_buffer b, size_t nb, const char *b_name,
                           const char *call);

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
/* Uploads overlapped with compute: a second command queue on ctx's device (NULL where it cannot
 * be made: the uploads then go through ctx's own queue, in order), and a non-blocking write of
 * k then v (`floats` each, from src and src + floats) on it, its completion in *done (NULL
 * when nothing was enqueued); mpi_upload_wait waits for it and releases it. */
cl_command_queue mpi_upload_queue(iha_context *ctx);
iha_status mpi_upload(iha_context *ctx, cl_command_queue q, const float *src, iha_buffer k, iha_buffer v, size_t floats,
                      cl_event *done);
iha_status mpi_upload_wait(cl_event *done);
/* A device buffer of `floats` floats, or NULL (message set). */
cl_mem mpi_device_buffer(iha_context *ctx, size_t floats, const char *call);

#endif
