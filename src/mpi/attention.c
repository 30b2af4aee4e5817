/* iha_mpi_attention: the ring forward. Each rank attends its queries over every
 * key and value block as the blocks travel rank -> rank + 1, merging with
 * iha_attention_partial once per (query run, key run) pair. */
#include <stdlib.h>
#include <string.h>

#include "mpi/ring.h"

static const char *const call = "iha_mpi_attention";

/* This rank's query-side tensors as iha_attention_partial takes them: the caller's own
 * buffers for one run, run-major device copies (mpi_run_offset) for two. */
typedef struct query_side {
    iha_buffer q, o, lse;
} query_side;

/* Attends every visible pair of this rank's query runs and key block j (run-major in bk, bv,
 * or the caller's kt, vt when `direct`), merging into the query side; started[a] says
 * whether query run a's state has been started. */
static iha_status attend_block(iha_context *ctx, const mpi_ring *ring, const iha_shape *shape,
                               const iha_attention_options *options, const query_side *qs, int j, iha_buffer bk,
                               iha_buffer bv, int started[2])
{
    const size_t d = ring->head_dim;
    iha_status st = IHA_OK;
    for (int a = 0; a < ring->nruns && st == IHA_OK; ++a)
        for (int b = 0; b < ring->nruns && st == IHA_OK; ++b) {
            const iha_mpi_run qr = mpi_ring_run(ring, ring->rank, a), kr = mpi_ring_run(ring, j, b);
            if (mpi_pair_hidden(options, qr, kr)) continue;
            const size_t qo = mpi_run_offset(ring, ring->rank, a, d), ko = mpi_run_offset(ring, j, b, d);
            const iha_shape local = {shape->batch, qr.count, shape->model_dim, shape->heads, d, shape->pseudo};
            const iha_partial_block pb = {qr.first, kr.first, kr.count, !started[a]};
            st = iha_attention_partial(
                ctx, &local, options, &pb, (iha_buffer){qs->q.mem, qs->q.offset + qo},
                (iha_buffer){bk.mem, bk.offset + ko}, (iha_buffer){bv.mem, bv.offset + ko},
                (iha_buffer){qs->o.mem, qs->o.offset + qo},
                (iha_buffer){qs->lse.mem, qs->lse.offset + mpi_run_offset(ring, ring->rank, a, 1)});
            started[a] = 1;
        }
    return st;
}

iha_status iha_mpi_attention(iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                             const iha_attention_options *options, iha_buffer qt, iha_buffer kt, iha_buffer vt,
                             iha_buffer o, iha_buffer lse)
{
    mpi_ring ring;
    iha_status st = mpi_ring_open(&ring, comm, layout, shape, options, call);
    if (ring.runs == NULL) return st; /* no communicator to agree over, or no memory */
    if (st == IHA_OK && ctx == NULL) st = mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: ctx is NULL", call);
    const size_t mine = st == IHA_OK ? mpi_ring_tokens(&ring, ring.rank) : 0;
    const size_t n = mine * (st == IHA_OK ? ring.row_elems : 0),
                 blk = st == IHA_OK ? ring.max_tokens * ring.row_elems : 0,
                 nl = st == IHA_OK ? mine * ring.lse_elems : 0;
    if (st == IHA_OK) st = mpi_check_buffer(qt, n, call, "qt");
    if (st == IHA_OK) st = mpi_check_buffer(kt, n, call, "kt");
    if (st == IHA_OK) st = mpi_check_buffer(vt, n, call, "vt");
    if (st == IHA_OK) st = mpi_check_buffer(o, n, call, "o");
    if (st == IHA_OK && lse.mem != NULL) st = mpi_check_buffer(lse, nl, call, "lse");
    const iha_buffer in[3] = {qt, kt, vt};
    const char *const in_names[3] = {"qt", "kt", "vt"};
    for (int i = 0; i < 3 && st == IHA_OK; ++i) {
        st = mpi_check_apart(o, n, "o", in[i], n, in_names[i], call);
        if (st == IHA_OK) st = mpi_check_apart(lse, nl, "lse", in[i], n, in_names[i], call);
    }
    if (st == IHA_OK) st = mpi_check_apart(lse, nl, "lse", o, n, "o", call);
    /* Two runs: queries, o and lse go through run-major copies, and the own block through
     * the staging buffers like every other block. */
    const int staged = ring.nruns > 1;
    float *host = NULL;
    /* Two staging pairs: the next block uploads into one while the held one is attended. */
    cl_mem dk[2] = {NULL, NULL}, dv[2] = {NULL, NULL}, dl = NULL, sq = NULL, so = NULL;
    cl_command_queue uq = NULL;
    cl_event uploaded = NULL;
    if (st == IHA_OK) {
        host = malloc(4 * blk * sizeof(float));
        if (host == NULL)
            st = mpi_fail(IHA_ERROR_HOST_MEMORY, "%s: no host memory for 4 blocks of %zu floats", call, blk);
    }
    /* One pair is enough when only one block is ever staged (two ranks, one run each). */
    const int pairs = ring.R > 2 || (staged && ring.R > 1) ? 2 : 1;
    for (int i = 0; i < pairs && st == IHA_OK && (ring.R > 1 || staged); ++i)
        if ((dk[i] = mpi_device_buffer(ctx, blk, call)) == NULL || (dv[i] = mpi_device_buffer(ctx, blk, call)) == NULL)
            st = IHA_ERROR_DEVICE_MEMORY;
    if (st == IHA_OK && (ring.R > 1 || staged)) uq = mpi_upload_queue(ctx);
    if (st == IHA_OK && staged &&
        ((sq = mpi_device_buffer(ctx, n, call)) == NULL || (so = mpi_device_buffer(ctx, n, call)) == NULL))
        st = IHA_ERROR_DEVICE_MEMORY;
    if (st == IHA_OK && (lse.mem == NULL || staged) && (dl = mpi_device_buffer(ctx, nl, call)) == NULL)
        st = IHA_ERROR_DEVICE_MEMORY;
    query_side qs = {qt, o, lse.mem == NULL ? (iha_buffer){dl, 0} : lse};
    if (staged) qs = (query_side){{sq, 0}, {so, 0}, {dl, 0}};
    /* The own block goes out run-major, as every block travels. */
    float *laid = staged ? host + 2 * blk : host;
    if (st == IHA_OK) st = mpi_read(ctx, kt, laid, n);
    if (st == IHA_OK) st = mpi_read(ctx, vt, laid + n, n);
    if (st == IHA_OK && staged) {
        mpi_host_to_runs(&ring, ring.rank, laid, host, ring.head_dim);
        mpi_host_to_runs(&ring, ring.rank, laid + n, host + n, ring.head_dim);
        st = mpi_device_to_runs(ctx, &ring, qt, qs.q, ring.head_dim);
    }
    st = mpi_agree(&ring, st, call);

    if (st == IHA_OK) {
        /* The held block (k then v, 2*blk floats) and the arriving one swap after
         * each hop. */
        float *held = host, *arriving = host + 2 * blk;
        int started[2] = {0, 0};
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
            /* Block s is in staging pair s % 2 (uploaded during step s - 1), or the caller's own
             * kt, vt at step 0. */
            const int pair = dk[1] != NULL ? s % 2 : 0, visible = mpi_block_visible(options, &ring, j);
            iha_buffer bk = kt, bv = vt;
            if (s > 0 || staged) {
                bk = (iha_buffer){dk[pair], 0};
                bv = (iha_buffer){dv[pair], 0};
                if (local_st == IHA_OK && s == 0 && visible)
                    local_st = mpi_upload(ctx, uq, held, bk, bv, nj, &uploaded);
            }
            if (local_st == IHA_OK) local_st = mpi_upload_wait(&uploaded);
            if (local_st == IHA_OK && visible) {
                local_st = attend_block(ctx, &ring, shape, options, &qs, j, bk, bv, started);
                if (local_st != IHA_OK && iha_mpi_message()[0] == '\0')
                    mpi_fail(local_st, "%s: rank %d, key block %d: %s", call, ring.rank, j, iha_context_message(ctx));
            }
            /* The partial steps run on the device while the hop completes, and the arriving block
             * uploads into the other staging pair while they still run. */
            MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
            if (local_st == IHA_OK && s + 1 < ring.R && mpi_block_visible(options, &ring, jn)) {
                const int next = dk[1] != NULL ? (s + 1) % 2 : 0;
                if (next == pair && (s > 0 || staged)) local_st = iha_context_finish(ctx); /* still being read */
                if (local_st == IHA_OK)
                    local_st = mpi_upload(ctx, uq, arriving, (iha_buffer){dk[next], 0}, (iha_buffer){dv[next], 0}, nn,
                                          &uploaded);
            }
            if (local_st == IHA_OK) local_st = iha_context_finish(ctx);
            float *t = held;
            held = arriving;
            arriving = t;
        }
        if (local_st == IHA_OK && staged) local_st = mpi_device_from_runs(ctx, &ring, qs.o, o, ring.head_dim);
        if (local_st == IHA_OK && staged && lse.mem != NULL)
            local_st = mpi_device_from_runs(ctx, &ring, qs.lse, lse, 1);
        if (local_st == IHA_OK) local_st = iha_context_finish(ctx);
        st = mpi_agree(&ring, local_st, call);
    }
    mpi_upload_wait(&uploaded); /* a failed step may leave one in flight */
    if (uq != NULL) clReleaseCommandQueue(uq);
    free(host);
    const cl_mem made[7] = {dk[0], dk[1], dv[0], dv[1], dl, sq, so};
    for (int i = 0; i < 7; ++i)
        if (made[i] != NULL) clReleaseMemObject(made[i]);
    mpi_ring_close(&ring);
    return st;
}
