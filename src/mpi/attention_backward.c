/* iha_mpi_attention_backward: the ring backward. Key and value blocks travel
 * with their running dK and dV; each rank adds its queries' share with
 * iha_attention_partial_backward once per (query run, key run) pair, and after
 * the last step each block's gradients make one more hop, home to their owner. */
#include <stdlib.h>
#include <string.h>

#include "mpi/ring.h"

static const char *const call = "iha_mpi_attention_backward";

/* This rank's query-side tensors as iha_attention_partial_backward takes them: the caller's
 * own buffers for one run, run-major device copies (mpi_run_offset) for two. */
typedef struct query_side {
    iha_buffer q, o, lse, dout, dq;
} query_side;

/* Where the pair loop stands: whether query run a's dq and, this step, key run b's dK and
 * dV have been started. */
typedef struct pair_state {
    int q_started[2], k_started[2];
    int accumulate_dq; /* the caller's dqt is added into: never start it */
} pair_state;

static iha_buffer at(iha_buffer b, size_t offset) { return (iha_buffer){b.mem, b.offset + offset}; }

/* Adds every visible pair's share of this rank's queries and key block j (k, v; dK, dV in
 * bdk, bdv, all run-major) into dq and the block's dK, dV. A key run's dK and dV are
 * overwritten by its first pair unless `resume` (they arrived holding earlier ranks'
 * shares). Returns the status; *any says whether a pair ran. */
static iha_status attend_block(iha_context *ctx, const mpi_ring *ring, const iha_shape *shape,
                               const iha_attention_options *options, const query_side *qs, int j, iha_buffer k,
                               iha_buffer v, iha_buffer bdk, iha_buffer bdv, int resume, pair_state *ps)
{
    const size_t d = ring->head_dim;
    iha_status st = IHA_OK;
    for (int a = 0; a < ring->nruns && st == IHA_OK; ++a)
        for (int b = 0; b < ring->nruns && st == IHA_OK; ++b) {
            const iha_mpi_run qr = mpi_ring_run(ring, ring->rank, a), kr = mpi_ring_run(ring, j, b);
            if (mpi_pair_hidden(options, qr, kr)) continue;
            const size_t qo = mpi_run_offset(ring, ring->rank, a, d), lo = mpi_run_offset(ring, ring->rank, a, 1),
                         ko = mpi_run_offset(ring, j, b, d);
            iha_attention_options ob = *options;
            ob.accumulate = resume || ps->k_started[b];
            const iha_shape local = {shape->batch, qr.count, shape->model_dim, shape->heads, d, shape->pseudo};
            const iha_partial_block pb = {qr.first, kr.first, kr.count, !ps->q_started[a] && !ps->accumulate_dq};
            st = iha_attention_partial_backward(ctx, &local, &ob, &pb, at(qs->q, qo), at(k, ko), at(v, ko),
                                                at(qs->o, qo), at(qs->lse, lo), at(qs->dout, qo), at(qs->dq, qo),
                                                at(bdk, ko), at(bdv, ko));
            ps->q_started[a] = ps->k_started[b] = 1;
        }
    return st;
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
    if (ring.runs == NULL) return st;
    if (st == IHA_OK && ctx == NULL) st = mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: ctx is NULL", call);
    const size_t mine = st == IHA_OK ? mpi_ring_tokens(&ring, ring.rank) : 0;
    const size_t n = st == IHA_OK ? mine * ring.row_elems : 0,
                 blk = st == IHA_OK ? ring.max_tokens * ring.row_elems : 0,
                 nl = st == IHA_OK ? mine * ring.lse_elems : 0;
    const iha_buffer in[6] = {qt, kt, vt, o, dout, dqt};
    const char *names[6] = {"qt", "kt", "vt", "o", "dout", "dqt"};
    for (int i = 0; i < 6 && st == IHA_OK; ++i) st = mpi_check_buffer(in[i], n, call, names[i]);
    if (st == IHA_OK) st = mpi_check_buffer(dkt, n, call, "dkt");
    if (st == IHA_OK) st = mpi_check_buffer(dvt, n, call, "dvt");
    if (st == IHA_OK) st = mpi_check_buffer(lse, nl, call, "lse");
    const iha_buffer all[9] = {qt, kt, vt, o, dout, lse, dqt, dkt, dvt};
    const char *const all_names[9] = {"qt", "kt", "vt", "o", "dout", "lse", "dqt", "dkt", "dvt"};
    for (int i = 6; i < 9 && st == IHA_OK; ++i) /* each output against everything before it */
        for (int k = 0; k < i && st == IHA_OK; ++k)
            st = mpi_check_apart(all[i], n, all_names[i], all[k], k == 5 ? nl : n, all_names[k], call);
    /* Host: held and arriving blocks of 4 tensors each (k, v, dk, dv, blk floats
     * apart). Two runs: the query side goes through run-major device copies (q, o, lse, dout,
     * dq in sd[0..4]). */
    const int staged = ring.nruns > 1;
    float *host = NULL;
    cl_mem dev[4] = {NULL, NULL, NULL, NULL}, sd[5] = {NULL, NULL, NULL, NULL, NULL};
    if (st == IHA_OK) {
        host = malloc(8 * blk * sizeof(float));
        if (host == NULL)
            st = mpi_fail(IHA_ERROR_HOST_MEMORY, "%s: no host memory for 8 blocks of %zu floats", call, blk);
    }
    for (int i = 0; i < 4 && st == IHA_OK; ++i)
        if ((dev[i] = mpi_device_buffer(ctx, blk, call)) == NULL) st = IHA_ERROR_DEVICE_MEMORY;
    for (int i = 0; i < 5 && st == IHA_OK && staged; ++i)
        if ((sd[i] = mpi_device_buffer(ctx, i == 2 ? nl : n, call)) == NULL) st = IHA_ERROR_DEVICE_MEMORY;
    query_side qs = {qt, o, lse, dout, dqt};
    if (staged) qs = (query_side){{sd[0], 0}, {sd[1], 0}, {sd[2], 0}, {sd[3], 0}, {sd[4], 0}};
    float *laid = staged ? host + 4 * blk : host;
    if (st == IHA_OK) st = mpi_read(ctx, kt, laid, n);
    if (st == IHA_OK) st = mpi_read(ctx, vt, laid + blk, n);
    if (st == IHA_OK && staged) {
        mpi_host_to_runs(&ring, ring.rank, laid, host, ring.head_dim);
        mpi_host_to_runs(&ring, ring.rank, laid + blk, host + blk, ring.head_dim);
        const iha_buffer from[5] = {qt, o, lse, dout, dqt};
        /* dq starts from the caller's dqt when it is added into. */
        for (int i = 0; i < (options->accumulate ? 5 : 4) && st == IHA_OK; ++i)
            st = mpi_device_to_runs(ctx, &ring, from[i], (iha_buffer){sd[i], 0}, i == 2 ? 1 : ring.head_dim);
    }
    st = mpi_agree(&ring, st, call);

    if (st == IHA_OK) {
        float *held = host, *arriving = host + 4 * blk;
        const iha_buffer bk = {dev[0], 0}, bv = {dev[1], 0}, bdk = {dev[2], 0}, bdv = {dev[3], 0};
        pair_state ps = {{0, 0}, {0, 0}, options->accumulate};
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
            if (local_st == IHA_OK && mpi_block_visible(options, &ring, j)) {
                /* The first step starts the own block's dK, dV; the caller's kt, vt serve when
                 * they are laid out as the block travels. */
                const int direct = s == 0 && !staged;
                const iha_buffer k = direct ? kt : bk, v = direct ? vt : bv;
                if (local_st == IHA_OK && !direct) local_st = mpi_write(ctx, held, bk, nj);
                if (local_st == IHA_OK && !direct) local_st = mpi_write(ctx, held + blk, bv, nj);
                if (local_st == IHA_OK && s > 0) local_st = mpi_write(ctx, held + 2 * blk, bdk, nj);
                if (local_st == IHA_OK && s > 0) local_st = mpi_write(ctx, held + 3 * blk, bdv, nj);
                ps.k_started[0] = ps.k_started[1] = 0;
                if (local_st == IHA_OK)
                    local_st = attend_block(ctx, &ring, shape, options, &qs, j, k, v, bdk, bdv, s > 0, &ps);
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
         * rank (run-major: laid out as the caller's before delivery). */
        float *gk = held + 2 * blk, *gv = held + 3 * blk;
        if (staged) {
            mpi_host_from_runs(&ring, ring.rank, held + 2 * blk, arriving, ring.head_dim);
            mpi_host_from_runs(&ring, ring.rank, held + 3 * blk, arriving + blk, ring.head_dim);
            gk = arriving;
            gv = arriving + blk;
        }
        float *scratch = arriving + 2 * blk;
        if (local_st == IHA_OK) local_st = deliver(ctx, gk, scratch, dkt, n, options->accumulate);
        if (local_st == IHA_OK) local_st = deliver(ctx, gv, scratch, dvt, n, options->accumulate);
        if (local_st == IHA_OK && staged) local_st = mpi_device_from_runs(ctx, &ring, qs.dq, dqt, ring.head_dim);
        if (local_st == IHA_OK) local_st = iha_context_finish(ctx);
        st = mpi_agree(&ring, local_st, call);
    }
    free(host);
    for (int i = 0; i < 4; ++i)
        if (dev[i] != NULL) clReleaseMemObject(dev[i]);
    for (int i = 0; i < 5; ++i)
        if (sd[i] != NULL) clReleaseMemObject(sd[i]);
    mpi_ring_close(&ring);
    return st;
}
