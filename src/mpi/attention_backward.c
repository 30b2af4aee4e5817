/* iha_mpi_attention_backward: the ring backward. Key and value blocks travel
 * with their running dK and dV; each rank adds its queries' share with
 * iha_attention_partial_backward, and after the last step each block's
 * gradients make one more hop, home to their owner. */
#include <stdlib.h>
#include <string.h>

#include "mpi/ring.h"

static const char *const call = "iha_mpi_attention_backward";

static int block_hidden(const iha_attention_options *options, const mpi_ring *ring, int j)
{
    return (options->mask == IHA_MASK_CAUSAL || options->mask == IHA_MASK_TOKEN_CAUSAL) &&
           ring->start[j] >= ring->start[ring->rank + 1];
}

/* The block's gradients into the caller's output: overwritten, or added into.
 */
static iha_status deliver(iha_context *ctx, const float *grad, float *scratch, iha_buffer out, size_t n, int accumulate)
{
    if (!accumulate) return mpi_write(ctx, grad, out, n);
    iha_status st = mpi_read(ctx, out, scratch, n);
    for (size_t i = 0; st == IHA_OK && i < n; ++i) scratch[i] += grad[i];
    return st == IHA_OK ? mpi_write(ctx, scratch, out, n) : st;
}

iha_status iha_mpi_attention_backward(iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                                      const iha_attention_options *options, iha_buffer qt, iha_buffer kt, iha_buffer vt,
                                      iha_buffer o, iha_buffer lse, iha_buffer dout, iha_buffer dqt, iha_buffer dkt,
                                      iha_buffer dvt)
{
    mpi_ring ring;
    iha_status st = mpi_ring_open(&ring, comm, layout, shape, options, call);
    if (ring.start == NULL) return st;
    if (st == IHA_OK && ctx == NULL) st = mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: ctx is NULL", call);
    const size_t mine = st == IHA_OK ? mpi_ring_tokens(&ring, ring.rank) : 0;
    const size_t n = st == IHA_OK ? mine * ring.row_elems : 0,
                 blk = st == IHA_OK ? ring.max_tokens * ring.row_elems : 0;
    const iha_buffer in[6] = {qt, kt, vt, o, dout, dqt};
    const char *names[6] = {"qt", "kt", "vt", "o", "dout", "dqt"};
    for (int i = 0; i < 6 && st == IHA_OK; ++i) st = mpi_check_buffer(in[i], n, call, names[i]);
    if (st == IHA_OK) st = mpi_check_buffer(dkt, n, call, "dkt");
    if (st == IHA_OK) st = mpi_check_buffer(dvt, n, call, "dvt");
    if (st == IHA_OK) st = mpi_check_buffer(lse, mine * ring.lse_elems, call, "lse");
    /* Host: held and arriving blocks of 4 tensors each (k, v, dk, dv, blk floats
     * apart). */
    float *host = NULL;
    cl_mem dev[4] = {NULL, NULL, NULL, NULL};
    if (st == IHA_OK) {
        host = malloc(8 * blk * sizeof(float));
        if (host == NULL)
            st = mpi_fail(IHA_ERROR_HOST_MEMORY, "%s: no host memory for 8 blocks of %zu floats", call, blk);
    }
    for (int i = 0; i < 4 && st == IHA_OK; ++i)
        if ((dev[i] = mpi_device_buffer(ctx, blk, call)) == NULL) st = IHA_ERROR_DEVICE_MEMORY;
    if (st == IHA_OK) st = mpi_read(ctx, kt, host, n);
    if (st == IHA_OK) st = mpi_read(ctx, vt, host + blk, n);
    st = mpi_agree(&ring, st, call);

    if (st == IHA_OK) {
        float *held = host, *arriving = host + 4 * blk;
        const iha_shape local = {shape->batch, mine, shape->model_dim, shape->heads, shape->head_dim, shape->pseudo};
        const iha_buffer bk = {dev[0], 0}, bv = {dev[1], 0}, bdk = {dev[2], 0}, bdv = {dev[3], 0};
        iha_status local_st = IHA_OK;
        for (int s = 0; s < ring.R; ++s) {
            const int j = (ring.rank - s + ring.R) % ring.R, jn = (j - 1 + ring.R) % ring.R;
            const size_t nj = mpi_ring_tokens(&ring, j) * ring.row_elems,
                         nn = mpi_ring_tokens(&ring, jn) * ring.row_elems;
            MPI_Request req[8];
            int nreq = 0;
            if (s + 1 < ring.R) { /* K and V go on ahead while this block's gradients
                                     are computed */
                MPI_Irecv(arriving, (int)nn, MPI_FLOAT, ring.prev, 1, comm, &req[nreq++]);
                MPI_Irecv(arriving + blk, (int)nn, MPI_FLOAT, ring.prev, 2, comm, &req[nreq++]);
                MPI_Isend(held, (int)nj, MPI_FLOAT, ring.next, 1, comm, &req[nreq++]);
                MPI_Isend(held + blk, (int)nj, MPI_FLOAT, ring.next, 2, comm, &req[nreq++]);
            }
            if (s == 0 || !block_hidden(options, &ring, j)) {
                iha_attention_options ob = *options;
                ob.accumulate = s > 0; /* the first step starts the block's dK, dV */
                const iha_buffer k = s == 0 ? kt : bk, v = s == 0 ? vt : bv;
                if (local_st == IHA_OK && s > 0) local_st = mpi_write(ctx, held, bk, nj);
                if (local_st == IHA_OK && s > 0) local_st = mpi_write(ctx, held + blk, bv, nj);
                if (local_st == IHA_OK && s > 0) local_st = mpi_write(ctx, held + 2 * blk, bdk, nj);
                if (local_st == IHA_OK && s > 0) local_st = mpi_write(ctx, held + 3 * blk, bdv, nj);
                /* dqt: the first step overwrites it unless the caller accumulates. */
                const iha_partial_block pb = {ring.start[ring.rank], ring.start[j], mpi_ring_tokens(&ring, j),
                                              s == 0 && !options->accumulate};
                if (local_st == IHA_OK)
                    local_st =
                        iha_attention_partial_backward(ctx, &local, &ob, &pb, qt, k, v, o, lse, dout, dqt, bdk, bdv);
                if (local_st == IHA_OK) local_st = mpi_read(ctx, bdk, held + 2 * blk, nj);
                if (local_st == IHA_OK) local_st = mpi_read(ctx, bdv, held + 3 * blk, nj);
                if (local_st != IHA_OK && iha_mpi_message()[0] == '\0')
                    mpi_fail(local_st, "%s: rank %d, key block %d: %s", call, ring.rank, j, iha_context_message(ctx));
            }
            /* The block's dK and dV follow its K and V; after the last step they go
             * home. */
            MPI_Irecv(arriving + 2 * blk, (int)nn, MPI_FLOAT, ring.prev, 3, comm, &req[nreq++]);
            MPI_Irecv(arriving + 3 * blk, (int)nn, MPI_FLOAT, ring.prev, 4, comm, &req[nreq++]);
            MPI_Isend(held + 2 * blk, (int)nj, MPI_FLOAT, ring.next, 3, comm, &req[nreq++]);
            MPI_Isend(held + 3 * blk, (int)nj, MPI_FLOAT, ring.next, 4, comm, &req[nreq++]);
            MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
            float *t = held;
            held = arriving;
            arriving = t;
        }
        /* After the last hop, held is this rank's own block, its gradients summed over every
         * rank. */
        if (local_st == IHA_OK) local_st = deliver(ctx, held + 2 * blk, arriving, dkt, n, options->accumulate);
        if (local_st == IHA_OK) local_st = deliver(ctx, held + 3 * blk, arriving, dvt, n, options->accumulate);
        if (local_st == IHA_OK) local_st = iha_context_finish(ctx);
        st = mpi_agree(&ring, local_st, call);
    }
    free(host);
    for (int i = 0; i < 4; ++i)
        if (dev[i] != NULL) clReleaseMemObject(dev[i]);
    mpi_ring_close(&ring);
    return st;
}
