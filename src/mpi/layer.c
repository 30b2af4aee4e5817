/* iha_mpi_forward: the layer over the ranks. Projections, mixing, rotary and collapse are per
 * token, so each rank runs them on its own tokens (libiha's layer stages, rotary at the tokens'
 * global positions); only the attention between them travels the ring. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/layer.h"

static int mul3(size_t a, size_t b, size_t c, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) return 0;
    const size_t ab = a * b;
    if (ab != 0 && c > SIZE_MAX / ab) return 0;
    *out = ab * c;
    return 1;
}

iha_buffer mpi_weight(const iha_layer_weights *w, int i)
{
    if (w == NULL) return (iha_buffer){NULL, 0};
    const iha_buffer all[8] = {w->wq, w->wk, w->wv, w->wo, w->alpha_q, w->alpha_k, w->alpha_v, w->r};
    return all[i];
}

size_t mpi_weight_elems(const iha_shape *s, int i)
{
    size_t n = SIZE_MAX;
    if (i < 4)
        mul3(s->model_dim, s->heads, s->head_dim, &n);
    else
        mul3(s->heads, s->heads, s->pseudo, &n);
    return n;
}

int mpi_overlap(iha_buffer a, size_t na, iha_buffer b, size_t nb)
{
    return a.mem != NULL && a.mem == b.mem && na != 0 && nb != 0 && a.offset < b.offset + nb &&
           b.offset < a.offset + na;
}

iha_status mpi_layer_failed(const mpi_layer *L, iha_context *ctx, iha_status st, const char *call, const char *what)
{
    return mpi_fail(st, "%s: rank %d: %s: %s", call, L->ring.rank, what, iha_context_message(ctx));
}

static iha_status check_open(mpi_layer *L, iha_context *ctx, iha_mpi_layout layout, const iha_shape *shape,
                             const iha_attention_options *options, const iha_layer_weights *weights, iha_buffer x,
                             const char *call)
{
    if (ctx == NULL || shape == NULL || options == NULL || weights == NULL)
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: ctx, shape, options and weights must not be NULL", call);
    const iha_shape *s = shape;
    if (s->batch == 0 || s->tokens == 0 || s->model_dim == 0 || s->heads == 0 || s->head_dim == 0 || s->pseudo == 0)
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: every field of the shape must be at least 1", call);
    if (options->storage != IHA_STORAGE_F32 || options->weight_storage != IHA_STORAGE_F32 ||
        options->seq_lens != NULL || options->seq_count != 0)
        return mpi_fail(IHA_ERROR_UNSUPPORTED,
                        "%s takes float32 activations and weights without packed sequences (storage and "
                        "weight_storage F32, seq_lens NULL)",
                        call);
    L->nruns = iha_mpi_runs(s->tokens, L->ring.R, L->ring.rank, layout, L->runs);
    if (L->nruns == 0) return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: layout %d is unknown", call, (int)layout);
    L->count = 0;
    for (int i = 0; i < L->nruns; ++i) {
        if (L->runs[i].count == 0)
            return mpi_fail(IHA_ERROR_INVALID_ARGUMENT,
                            "%s: %zu tokens are too few for %d ranks in this layout (every run needs a token)", call,
                            s->tokens, L->ring.R);
        L->run_start[i] = L->count;
        L->count += L->runs[i].count;
    }
    L->local = *s;
    L->local.tokens = L->count;
    const size_t B = s->batch, H = s->heads, P = s->pseudo;
    if (B > SIZE_MAX / H || !mul3(B, L->count, s->model_dim, &L->x_elems) || !mul3(B * H, L->count, P, &L->lse_elems) ||
        !mul3(L->lse_elems, s->head_dim, 1, &L->v_elems))
        return mpi_fail(IHA_ERROR_SIZE_OVERFLOW, "%s: this rank's tensor sizes overflow size_t", call);
    L->token_rows = (mpi_rows){B, 1, s->model_dim};
    L->virtual_rows = (mpi_rows){B * H, P, s->head_dim};
    L->ring_options = *options;
    L->ring_options.rope = 0;
    L->ring_options.accumulate = 0;
    return mpi_check_buffer(x, L->x_elems, call, "x");
}

iha_status mpi_layer_open(mpi_layer *L, iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                          const iha_attention_options *options, const iha_layer_weights *weights, iha_buffer x,
                          uint64_t extra, const char *call)
{
    memset(L, 0, sizeof *L);
    iha_status st = mpi_comm_open(&L->ring, comm, call);
    if (L->ring.R == 0) return st;
    /* First what every rank must pass alike (a collective every rank reaches), so that a
     * mismatch reads the same on every rank. */
    uint64_t v[MPI_FINGERPRINT];
    mpi_fingerprint(shape, options, (int)layout, extra, v);
    st = mpi_same_everywhere(&L->ring, v, call);
    if (st == IHA_OK) st = check_open(L, ctx, layout, shape, options, weights, x, call);
    cl_mem *virt[6] = {&L->qt, &L->kt, &L->vt, &L->o, &L->lse, &L->out};
    for (int i = 0; i < 6 && st == IHA_OK; ++i)
        if ((*virt[i] = mpi_device_buffer(ctx, i < 4 ? L->v_elems : i == 4 ? L->lse_elems : L->x_elems, call)) == NULL)
            st = IHA_ERROR_DEVICE_MEMORY;
    if (st == IHA_OK && L->nruns == 2) {
        const size_t c = L->runs[0].count > L->runs[1].count ? L->runs[0].count : L->runs[1].count;
        const size_t token = L->x_elems / L->count * c, virtual = L->v_elems / L->count * c;
        for (int i = 0; i < 5 && st == IHA_OK; ++i)
            if ((L->stage[i] = mpi_device_buffer(ctx, i < 2 ? token : virtual, call)) == NULL)
                st = IHA_ERROR_DEVICE_MEMORY;
    }
    return st;
}

iha_status mpi_copy_floats(iha_context *ctx, iha_buffer src, iha_buffer dst, size_t floats, const char *call)
{
    if (floats == 0) return IHA_OK;
    const size_t f = sizeof(float);
    const cl_int e = clEnqueueCopyBuffer(iha_context_cl_queue(ctx), src.mem, dst.mem, src.offset * f, dst.offset * f,
                                         floats * f, 0, NULL, NULL);
    return e == CL_SUCCESS ? IHA_OK : mpi_fail(IHA_ERROR_OPENCL, "%s: clEnqueueCopyBuffer failed (%d)", call, (int)e);
}

void mpi_layer_close(mpi_layer *L)
{
    cl_mem all[11] = {L->qt,       L->kt,       L->vt,       L->o,        L->lse,     L->out,
                      L->stage[0], L->stage[1], L->stage[2], L->stage[3], L->stage[4]};
    for (int i = 0; i < 11; ++i)
        if (all[i] != NULL) clReleaseMemObject(all[i]);
    memset(L, 0, sizeof *L);
}

iha_status mpi_layer_copy_run(iha_context *ctx, const mpi_layer *L, const mpi_rows *rows, int i, iha_buffer rank,
                              iha_buffer run, int to_run)
{
    const size_t k = rows->rows_per_token, all = L->count * k, mine = L->runs[i].count * k, at = L->run_start[i] * k;
    if (to_run) return mpi_copy_rows(ctx, rank, all, at, run, mine, 0, mine, rows->row_floats, rows->slabs);
    return mpi_copy_rows(ctx, run, mine, 0, rank, all, at, mine, rows->row_floats, rows->slabs);
}

/* The shape of run i alone. */
static iha_shape run_shape(const mpi_layer *L, int i)
{
    iha_shape s = L->local;
    s.tokens = L->runs[i].count;
    return s;
}

iha_status mpi_layer_expand(mpi_layer *L, iha_context *ctx, const iha_attention_options *options,
                            const iha_layer_weights *weights, iha_buffer x, const char *call)
{
    const iha_buffer qt = {L->qt, 0}, kt = {L->kt, 0}, vt = {L->vt, 0};
    iha_status st = IHA_OK;
    if (L->nruns == 1) {
        st = iha_layer_expand(ctx, &L->local, options, weights, L->runs[0].first, x, qt, kt, vt);
        return st == IHA_OK ? st : mpi_layer_failed(L, ctx, st, call, "iha_layer_expand");
    }
    const iha_buffer xs = {L->stage[0], 0}, s[3] = {{L->stage[2], 0}, {L->stage[3], 0}, {L->stage[4], 0}};
    const iha_buffer dst[3] = {qt, kt, vt};
    for (int i = 0; i < L->nruns && st == IHA_OK; ++i) {
        const iha_shape rs = run_shape(L, i);
        st = mpi_layer_copy_run(ctx, L, &L->token_rows, i, x, xs, 1);
        if (st != IHA_OK) break;
        st = iha_layer_expand(ctx, &rs, options, weights, L->runs[i].first, xs, s[0], s[1], s[2]);
        if (st != IHA_OK) return mpi_layer_failed(L, ctx, st, call, "iha_layer_expand");
        for (int t = 0; t < 3 && st == IHA_OK; ++t)
            st = mpi_layer_copy_run(ctx, L, &L->virtual_rows, i, dst[t], s[t], 0);
    }
    return st;
}

static const char *const forward_call = "iha_mpi_forward";

iha_status iha_mpi_forward(iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                           const iha_attention_options *options, const iha_layer_weights *weights, iha_buffer x,
                           iha_buffer z)
{
    const char *call = forward_call;
    mpi_layer L;
    iha_status st = mpi_layer_open(&L, ctx, comm, layout, shape, options, weights, x, 0, call);
    if (L.ring.R == 0) return st;
    if (st == IHA_OK) st = mpi_check_buffer(z, L.x_elems, call, "z");
    if (st == IHA_OK && mpi_overlap(x, L.x_elems, z, L.x_elems))
        st = mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: z overlaps x", call);
    for (int i = 0; i < 8 && st == IHA_OK; ++i)
        if (mpi_overlap(z, L.x_elems, mpi_weight(weights, i), mpi_weight_elems(&L.local, i)))
            st = mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: z overlaps a weight", call);
    if (st == IHA_OK) st = mpi_layer_expand(&L, ctx, options, weights, x, call);
    st = mpi_agree(&L.ring, st, call);
    /* iha_mpi_attention agrees on its own result, so every rank goes on or stops together. */
    if (st == IHA_OK)
        st = iha_mpi_attention(ctx, comm, layout, shape, &L.ring_options, (iha_buffer){L.qt, 0}, (iha_buffer){L.kt, 0},
                               (iha_buffer){L.vt, 0}, (iha_buffer){L.o, 0}, (iha_buffer){L.lse, 0});
    /* The collapse checks wo, r and its output: it writes into a stand-in, and z gets it only
     * once every rank's collapse has gone through. */
    if (st == IHA_OK) {
        iha_status local =
            iha_layer_collapse(ctx, &L.local, options, weights, (iha_buffer){L.o, 0}, (iha_buffer){L.out, 0});
        if (local == IHA_OK) local = iha_context_finish(ctx);
        if (local != IHA_OK) local = mpi_layer_failed(&L, ctx, local, call, "iha_layer_collapse");
        st = mpi_agree(&L.ring, local, call);
    }
    if (st == IHA_OK) {
        iha_status local = mpi_copy_floats(ctx, (iha_buffer){L.out, 0}, z, L.x_elems, call);
        if (local == IHA_OK) local = iha_context_finish(ctx);
        st = mpi_agree(&L.ring, local, call);
    }
    mpi_layer_close(&L);
    return st;
}
