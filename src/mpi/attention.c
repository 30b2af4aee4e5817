/* iha_mpi_attention: the ring forward. Each rank attends its queries over every
 * key and value block as the blocks travel rank -> rank + 1, merging with
 * iha_attention_partial. */
#include <stdlib.h>
#include <string.h>

#include "mpi/ring.h"

static const char *const call = "iha_mpi_attention";

/* The key block j holds no key visible to rank r's queries: causal masks, block
 * after them. */
static int block_hidden(const iha_attention_options *options, const mpi_ring *ring, int j)
{
    return (options->mask == IHA_MASK_CAUSAL || options->mask == IHA_MASK_TOKEN_CAUSAL) &&
           ring->start[j] >= ring->start[ring->rank + 1];
}

iha_status iha_mpi_attention(iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                             const iha_attention_options *options, iha_buffer qt, iha_buffer kt, iha_buffer vt,
                             iha_buffer o, iha_buffer lse)
{
    mpi_ring ring;
    iha_status st = mpi_ring_open(&ring, comm, layout, shape, options, call);
    if (ring.start == NULL) return st; /* no communicator to agree over, or no memory */
    if (st == IHA_OK && ctx == NULL) st = mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: ctx is NULL", call);
    const size_t mine = st == IHA_OK ? mpi_ring_tokens(&ring, ring.rank) : 0;
    const size_t n = mine * (st == IHA_OK ? ring.row_elems : 0),
                 blk = st == IHA_OK ? ring.max_tokens * ring.row_elems : 0;
    if (st == IHA_OK) st = mpi_check_buffer(qt, n, call, "qt");
    if (st == IHA_OK) st = mpi_check_buffer(kt, n, call, "kt");
    if (st == IHA_OK) st = mpi_check_buffer(vt, n, call, "vt");
    if (st == IHA_OK) st = mpi_check_buffer(o, n, call, "o");
    if (st == IHA_OK && lse.mem != NULL) st = mpi_check_buffer(lse, mine * ring.lse_elems, call, "lse");
    float *host = NULL;
    cl_mem dk = NULL, dv = NULL, dl = NULL;
    if (st == IHA_OK) {
        host = malloc(4 * blk * sizeof(float));
        if (host == NULL)
            st = mpi_fail(IHA_ERROR_HOST_MEMORY, "%s: no host memory for 4 blocks of %zu floats", call, blk);
    }
    if (st == IHA_OK && ring.R > 1 &&
        ((dk = mpi_device_buffer(ctx, blk, call)) == NULL || (dv = mpi_device_buffer(ctx, blk, call)) == NULL))
        st = IHA_ERROR_DEVICE_MEMORY;
    if (st == IHA_OK && lse.mem == NULL) {
        if ((dl = mpi_device_buffer(ctx, mine * ring.lse_elems, call)) == NULL) st = IHA_ERROR_DEVICE_MEMORY;
        lse = (iha_buffer){dl, 0};
    }
    if (st == IHA_OK) st = mpi_read(ctx, kt, host, n);
    if (st == IHA_OK) st = mpi_read(ctx, vt, host + n, n);
    st = mpi_agree(&ring, st, call);

    if (st == IHA_OK) {
        /* The held block (k then v, 2*blk floats) and the arriving one swap after
         * each hop. */
        float *held = host, *arriving = host + 2 * blk;
        const iha_shape local = {shape->batch, mine, shape->model_dim, shape->heads, shape->head_dim, shape->pseudo};
        iha_status local_st = IHA_OK;
        for (int s = 0; s < ring.R; ++s) {
            const int j = (ring.rank - s + ring.R) % ring.R, jn = (j - 1 + ring.R) % ring.R;
            const size_t nj = mpi_ring_tokens(&ring, j) * ring.row_elems,
                         nn = mpi_ring_tokens(&ring, jn) * ring.row_elems;
            MPI_Request req[4];
            int nreq = 0;
            if (s + 1 < ring.R) {
                /* The held block k and v are contiguous: one message each way, k then
                 * v. */
                MPI_Irecv(arriving, (int)(2 * nn), MPI_FLOAT, ring.prev, 1, comm, &req[nreq++]);
                MPI_Isend(held, (int)(2 * nj), MPI_FLOAT, ring.next, 1, comm, &req[nreq++]);
            }
            if (local_st == IHA_OK && (s == 0 || !block_hidden(options, &ring, j))) {
                iha_buffer bk = kt, bv = vt;
                if (s > 0) {
                    bk = (iha_buffer){dk, 0};
                    bv = (iha_buffer){dv, 0};
                    local_st = mpi_write(ctx, held, bk, nj);
                    if (local_st == IHA_OK) local_st = mpi_write(ctx, held + nj, bv, nj);
                }
                const iha_partial_block pb = {ring.start[ring.rank], ring.start[j], mpi_ring_tokens(&ring, j), s == 0};
                if (local_st == IHA_OK) local_st = iha_attention_partial(ctx, &local, options, &pb, qt, bk, bv, o, lse);
                if (local_st != IHA_OK && iha_mpi_message()[0] == '\0')
                    mpi_fail(local_st, "%s: rank %d, key block %d: %s", call, ring.rank, j, iha_context_message(ctx));
            }
            /* The partial step runs on the device while the hop completes. */
            MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
            if (local_st == IHA_OK) local_st = iha_context_finish(ctx);
            float *t = held;
            held = arriving;
            arriving = t;
        }
        st = mpi_agree(&ring, local_st, call);
    }
    free(host);
    if (dk != NULL) clReleaseMemObject(dk);
    if (dv != NULL) clReleaseMemObject(dv);
    if (dl != NULL) clReleaseMemObject(dl);
    mpi_ring_close(&ring);
    return st;
}
