/* iha_mpi_backward: the layer's backward over the ranks. Each rank recomputes its tokens'
 * forward (expand, the ring), runs the collapse's backward, the ring backward and the expand's
 * backward on its tokens, and the weight gradients, sums over the tokens, are summed over the
 * ranks. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/layer.h"

static const char *const call = "iha_mpi_backward";

/* The eight gradients in iha_layer_grads order, with their sizes in floats. */
enum { GRADS = 8 };

typedef struct grad_set {
    iha_buffer user[GRADS]; /* the caller's (mem NULL: not asked for) */
    size_t size[GRADS], at[GRADS], total;
    cl_mem device; /* this rank's sums, all eight back to back */
    float *host, *scratch;
} grad_set;

static void grads_layout(grad_set *g, const iha_shape *s, const iha_layer_grads *grads)
{
    memset(g, 0, sizeof *g);
    if (grads != NULL) {
        const iha_buffer u[GRADS] = {grads->wq,      grads->wk,      grads->wv,      grads->wo,
                                     grads->alpha_q, grads->alpha_k, grads->alpha_v, grads->r};
        memcpy(g->user, u, sizeof u);
    }
    const size_t proj = s->model_dim * s->heads * s->head_dim, mix = s->heads * s->heads * s->pseudo;
    for (int i = 0; i < GRADS; ++i) {
        g->size[i] = i < 4 ? proj : mix;
        g->at[i] = g->total;
        if (g->user[i].mem != NULL) g->total += g->size[i];
    }
}

/* The device stand-ins of the asked-for gradients, as an iha_layer_grads. */
static iha_layer_grads grads_device(const grad_set *g)
{
    iha_buffer b[GRADS];
    for (int i = 0; i < GRADS; ++i) b[i] = (iha_buffer){g->user[i].mem != NULL ? g->device : NULL, g->at[i]};
    return (iha_layer_grads){b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]};
}

static iha_status fill_zero(iha_context *ctx, iha_buffer b, size_t floats)
{
    if (floats == 0) return IHA_OK;
    const float zero = 0.0f;
    const cl_int e = clEnqueueFillBuffer(iha_context_cl_queue(ctx), b.mem, &zero, sizeof zero, b.offset * sizeof(float),
                                         floats * sizeof(float), 0, NULL, NULL);
    return e == CL_SUCCESS ? IHA_OK : mpi_fail(IHA_ERROR_OPENCL, "%s: clEnqueueFillBuffer failed (%d)", call, (int)e);
}

/* Sizes, and every output apart from the inputs and the other outputs. */
static iha_status check_outputs(const mpi_layer *L, const iha_layer_weights *w, const grad_set *g, iha_buffer x,
                                iha_buffer dz, iha_buffer dx)
{
    iha_status st = mpi_check_buffer(dz, L->x_elems, call, "dz");
    if (st == IHA_OK && dx.mem != NULL) st = mpi_check_buffer(dx, L->x_elems, call, "dx");
    static const char *const names[GRADS] = {"grads->wq",      "grads->wk",      "grads->wv",      "grads->wo",
                                             "grads->alpha_q", "grads->alpha_k", "grads->alpha_v", "grads->r"};
    for (int i = 0; i < GRADS && st == IHA_OK; ++i)
        if (g->user[i].mem != NULL) st = mpi_check_buffer(g->user[i], g->size[i], call, names[i]);
    if (st != IHA_OK) return st;
    /* Inputs: x, dz, the weights; outputs: dx and the gradients. */
    const iha_buffer weights[GRADS] = {w->wq, w->wk, w->wv, w->wo, w->alpha_q, w->alpha_k, w->alpha_v, w->r};
    iha_buffer in[2 + GRADS] = {x, dz}, out[1 + GRADS] = {dx};
    size_t nin[2 + GRADS] = {L->x_elems, L->x_elems}, nout[1 + GRADS] = {dx.mem != NULL ? L->x_elems : 0};
    for (int i = 0; i < GRADS; ++i) {
        in[2 + i] = weights[i];
        nin[2 + i] = g->size[i];
        out[1 + i] = g->user[i];
        nout[1 + i] = g->user[i].mem != NULL ? g->size[i] : 0;
    }
    for (int o = 0; o < 1 + GRADS; ++o) {
        for (int i = 0; i < 2 + GRADS; ++i)
            if (mpi_overlap(out[o], nout[o], in[i], nin[i]))
                return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: an output (%s) overlaps an input", call,
                                o == 0 ? "dx" : names[o - 1]);
        for (int p = o + 1; p < 1 + GRADS; ++p)
            if (mpi_overlap(out[o], nout[o], out[p], nout[p]))
                return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: two outputs overlap (%s and %s)", call,
                                o == 0 ? "dx" : names[o - 1], names[p - 1]);
    }
    return IHA_OK;
}

/* The expand's backward into dx (dx.mem may be NULL) and the gradient stand-ins, run by run; its
 * outputs are added into (the stand-ins start at zero, dx holds zeros or the caller's). */
static iha_status expand_backward(mpi_layer *L, iha_context *ctx, const iha_attention_options *options,
                                  const iha_layer_weights *w, const iha_layer_grads *dg, iha_buffer x,
                                  const cl_mem d[3], iha_buffer dx)
{
    iha_attention_options add = *options;
    add.accumulate = 1;
    iha_status st = IHA_OK;
    if (dx.mem != NULL && !options->accumulate) st = fill_zero(ctx, dx, L->x_elems);
    if (st == IHA_OK && L->nruns == 1) {
        st = iha_layer_expand_backward(ctx, &L->local, &add, w, L->runs[0].first, x, (iha_buffer){d[0], 0},
                                       (iha_buffer){d[1], 0}, (iha_buffer){d[2], 0}, dx, dg);
        return st == IHA_OK ? st : mpi_layer_failed(L, ctx, st, call, "iha_layer_expand_backward");
    }
    const iha_buffer xs = {L->stage[0], 0}, dxs = {dx.mem != NULL ? L->stage[1] : NULL, 0};
    const iha_buffer s[3] = {{L->stage[2], 0}, {L->stage[3], 0}, {L->stage[4], 0}};
    for (int i = 0; i < L->nruns && st == IHA_OK; ++i) {
        iha_shape rs = L->local;
        rs.tokens = L->runs[i].count;
        st = mpi_layer_copy_run(ctx, L, &L->token_rows, i, x, xs, 1);
        for (int t = 0; t < 3 && st == IHA_OK; ++t)
            st = mpi_layer_copy_run(ctx, L, &L->virtual_rows, i, (iha_buffer){d[t], 0}, s[t], 1);
        if (st == IHA_OK && dx.mem != NULL) st = mpi_layer_copy_run(ctx, L, &L->token_rows, i, dx, dxs, 1);
        if (st != IHA_OK) break;
        st = iha_layer_expand_backward(ctx, &rs, &add, w, L->runs[i].first, xs, s[0], s[1], s[2], dxs, dg);
        if (st != IHA_OK) return mpi_layer_failed(L, ctx, st, call, "iha_layer_expand_backward");
        if (dx.mem != NULL) st = mpi_layer_copy_run(ctx, L, &L->token_rows, i, dx, dxs, 0);
    }
    return st;
}

/* The ranks' sums of the gradients into the caller's buffers: overwritten, or added into. */
static iha_status deliver_grads(iha_context *ctx, const mpi_layer *L, grad_set *g, int accumulate)
{
    iha_status st = mpi_read(ctx, (iha_buffer){g->device, 0}, g->host, g->total);
    /* Every rank takes part in every reduction, whatever its read gave, so that none waits. */
    for (size_t done = 0; done < g->total;) {
        const size_t n = g->total - done < (size_t)INT_MAX ? g->total - done : (size_t)INT_MAX;
        if (MPI_Allreduce(MPI_IN_PLACE, g->host + done, (int)n, MPI_FLOAT, MPI_SUM, L->ring.comm) != MPI_SUCCESS &&
            st == IHA_OK)
            st = mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: MPI_Allreduce of the gradients failed", call);
        done += n;
    }
    for (int i = 0; i < GRADS && st == IHA_OK; ++i) {
        if (g->user[i].mem == NULL) continue;
        float *sum = g->host + g->at[i];
        if (accumulate) {
            st = mpi_read(ctx, g->user[i], g->scratch, g->size[i]);
            for (size_t k = 0; st == IHA_OK && k < g->size[i]; ++k) sum[k] += g->scratch[k];
        }
        if (st == IHA_OK) st = mpi_write(ctx, sum, g->user[i], g->size[i]);
    }
    return st;
}

iha_status iha_mpi_backward(iha_context *ctx, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                            const iha_attention_options *options, const iha_layer_weights *weights, iha_buffer x,
                            iha_buffer dz, iha_buffer dx, const iha_layer_grads *grads)
{
    mpi_layer L;
    iha_status st = mpi_layer_open(&L, ctx, comm, layout, shape, options, weights, x, call);
    if (L.ring.R == 0) return st;
    grad_set g;
    grads_layout(&g, shape != NULL ? shape : &L.local, grads);
    cl_mem dout = NULL, d[3] = {NULL, NULL, NULL};
    if (st == IHA_OK) st = check_outputs(&L, weights, &g, x, dz, dx);
    if (st == IHA_OK) {
        size_t largest = 0;
        for (int i = 0; i < GRADS; ++i)
            if (g.user[i].mem != NULL && g.size[i] > largest) largest = g.size[i];
        g.host = malloc((g.total + largest + 1) * sizeof(float));
        g.scratch = g.host != NULL ? g.host + g.total : NULL;
        if (g.host == NULL) st = mpi_fail(IHA_ERROR_HOST_MEMORY, "%s: no host memory for the gradients", call);
    }
    if (st == IHA_OK && ((dout = mpi_device_buffer(ctx, L.v_elems, call)) == NULL ||
                         (d[0] = mpi_device_buffer(ctx, L.v_elems, call)) == NULL ||
                         (d[1] = mpi_device_buffer(ctx, L.v_elems, call)) == NULL ||
                         (d[2] = mpi_device_buffer(ctx, L.v_elems, call)) == NULL ||
                         (g.total > 0 && (g.device = mpi_device_buffer(ctx, g.total, call)) == NULL)))
        st = IHA_ERROR_DEVICE_MEMORY;
    if (st == IHA_OK) st = fill_zero(ctx, (iha_buffer){g.device, 0}, g.total);
    if (st == IHA_OK) st = mpi_layer_expand(&L, ctx, options, weights, x, call);
    st = mpi_agree(&L.ring, st, call);

    const iha_buffer qt = {L.qt, 0}, kt = {L.kt, 0}, vt = {L.vt, 0}, o = {L.o, 0}, lse = {L.lse, 0};
    const iha_layer_grads dg = grads_device(&g);
    if (st == IHA_OK) st = iha_mpi_attention(ctx, comm, layout, shape, &L.ring_options, qt, kt, vt, o, lse);
    if (st == IHA_OK) {
        /* dO, dW_O and dR; the stand-ins of the other gradients stay zero here. */
        iha_status local =
            iha_layer_collapse_backward(ctx, &L.local, &L.ring_options, weights, o, dz, (iha_buffer){dout, 0}, &dg);
        if (local != IHA_OK) local = mpi_layer_failed(&L, ctx, local, call, "iha_layer_collapse_backward");
        st = mpi_agree(&L.ring, local, call);
    }
    if (st == IHA_OK)
        st = iha_mpi_attention_backward(ctx, comm, layout, shape, &L.ring_options, qt, kt, vt, o, lse,
                                        (iha_buffer){dout, 0}, (iha_buffer){d[0], 0}, (iha_buffer){d[1], 0},
                                        (iha_buffer){d[2], 0});
    if (st == IHA_OK) {
        iha_status local = expand_backward(&L, ctx, options, weights, &dg, x, d, dx);
        if (local == IHA_OK) local = iha_context_finish(ctx);
        st = mpi_agree(&L.ring, local, call);
    }
    if (st == IHA_OK && g.total > 0) st = mpi_agree(&L.ring, deliver_grads(ctx, &L, &g, options->accumulate), call);
    free(g.host);
    cl_mem all[5] = {dout, d[0], d[1], d[2], g.device};
    for (int i = 0; i < 5; ++i)
        if (all[i] != NULL) clReleaseMemObject(all[i]);
    mpi_layer_close(&L);
    return st;
}
