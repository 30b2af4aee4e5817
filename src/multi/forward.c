/* iha_multi_forward: the layer over several contexts. Each context runs the per-token stages on
 * its part (iha_layer_expand at the part's first token), iha_multi_attention joins the parts,
 * and each context collapses its part (iha_layer_collapse). */
#include <stdio.h>
#include <stdlib.h>

#include "layer/plan.h"
#include "multi/multi.h"
#include "runtime/context.h"
#include "runtime/error.h"

static const char *const call = "iha_multi_forward";

/* Part i's x and z ([B][tokens][D]) and weights, checked on its context, z apart from them. */
static iha_status check_part(const multi_run *m, size_t i, const iha_layer_weights *weights, const iha_buffer *x,
                             const iha_buffer *z)
{
    iha_context *ctx = m->ctx[i];
    const iha_shape local = multi_part_shape(m, i);
    iha_plan p;
    char xn[32], zn[32];
    snprintf(xn, sizeof xn, "x[%zu]", i);
    snprintf(zn, sizeof zn, "z[%zu]", i);
    iha_status st = iha__plan_make(ctx, &local, &m->options, 1, &p);
    if (st == IHA_OK) st = iha__check_weights(ctx, &p, &weights[i], 1);
    if (st == IHA_OK) st = iha__check_buffer(ctx, x[i], p.x_elems, sizeof(float), xn);
    if (st == IHA_OK) st = iha__check_buffer(ctx, z[i], p.x_elems, sizeof(float), zn);
    if (st == IHA_OK) st = iha__check_apart_from_weights(ctx, &p, &weights[i], 1, z[i], p.x_elems, zn);
    return st == IHA_OK ? st : multi_fail_part(m, i, st, NULL);
}

/* z[i] apart from part i2's weights (those of another context: two contexts may share a
 * cl_context, and then an overlap would be a race between the parts). */
static iha_status check_apart_from_other_weights(const multi_run *m, size_t i, size_t i2, const iha_plan *p,
                                                 const iha_layer_weights *w, iha_buffer z, size_t n, const char *zn)
{
    const iha_buffer b[8] = {w->alpha_q, w->alpha_k, w->alpha_v, w->r, w->wq, w->wk, w->wv, w->wo};
    static const char *const names[8] = {"alpha_q", "alpha_k", "alpha_v", "r", "wq", "wk", "wv", "wo"};
    char other[48];
    for (int k = 0; k < 8; ++k) {
        if (b[k].mem == NULL) continue; /* the identity shortcut */
        snprintf(other, sizeof other, "weights[%zu].%s", i2, names[k]);
        IHA_FORWARD_IF_ERROR(iha__check_apart(m->ctx[i], z, n, sizeof(float), b[k], k < 4 ? p->mix_elems : p->w_elems,
                                              p->weight_bytes, zn, other));
    }
    return IHA_OK;
}

/* Once every part's x, z and weights passed their checks: z[i] apart from every x, every other
 * z and every other part's weights (two contexts may share a cl_context). */
static iha_status check_apart(const multi_run *m, size_t i, const iha_layer_weights *weights, const iha_buffer *x,
                              const iha_buffer *z)
{
    const size_t row = m->shape.batch * m->shape.model_dim, n = row * multi_tokens(m, i);
    const iha_shape local = multi_part_shape(m, i);
    char zn[32], other[32];
    snprintf(zn, sizeof zn, "z[%zu]", i);
    iha_plan p;
    iha_status st = iha__plan_make(m->ctx[i], &local, &m->options, 1, &p);
    for (size_t i2 = 0; i2 < m->R && st == IHA_OK; ++i2) {
        const size_t n2 = row * multi_tokens(m, i2);
        snprintf(other, sizeof other, "x[%zu]", i2);
        st = iha__check_disjoint(m->ctx[i], z[i], n, x[i2], n2, sizeof(float), zn, other);
        snprintf(other, sizeof other, "z[%zu]", i2);
        if (st == IHA_OK && i2 != i) st = iha__check_disjoint(m->ctx[i], z[i], n, z[i2], n2, sizeof(float), zn, other);
        if (st == IHA_OK && i2 != i) st = check_apart_from_other_weights(m, i, i2, &p, &weights[i2], z[i], n, zn);
    }
    return st == IHA_OK ? st : multi_fail_part(m, i, st, NULL);
}

/* Part i's qt, kt, vt, o and z's stand-in in its context's workspace, counted with the
 * attention's staging: the collapse writes the stand-in, and z[i] gets it only once every
 * part's collapse came through. */
enum { T_QT, T_KT, T_VT, T_O, T_Z, T_COUNT };
static iha_status part_tensors(const multi_run *m, size_t i, iha_buffer t[T_COUNT])
{
    const size_t n = multi_part_elems(m, i), zn = m->shape.batch * multi_tokens(m, i) * m->shape.model_dim;
    const size_t staging = m->R > 1 ? 2 * m->block_elems : 0, total = 4 * n + zn + staging + multi_part_lse(m, i);
    const iha_status st = iha__workspace_check_total(m->ctx[i], total, sizeof(float));
    if (st != IHA_OK) return multi_fail_part(m, i, st, NULL);
    for (int k = 0; k < T_COUNT; ++k) {
        t[k] = (iha_buffer){NULL, 0};
        IHA_FORWARD_IF_ERROR(
            multi_staging(m, i, k == T_Z ? IHA_WS_MULTI_Z : IHA_WS_MULTI_QT + k, k == T_Z ? zn : n, &t[k].mem));
    }
    return IHA_OK;
}

/* Part i's z stand-in copied into z[i]. */
static iha_status deliver(const multi_run *m, size_t i, cl_mem src, iha_buffer z)
{
    const size_t n = m->shape.batch * multi_tokens(m, i) * m->shape.model_dim;
    const cl_int err = clEnqueueCopyBuffer(m->ctx[i]->queue, src, z.mem, 0, z.offset * sizeof(float), n * sizeof(float),
                                           0, NULL, NULL);
    if (err != CL_SUCCESS) return multi_fail_part(m, i, iha__fail_cl(m->ctx[i], err, "clEnqueueCopyBuffer"), "z");
    return multi_flush(m, i);
}

static iha_status run(multi_run *m, const iha_layer_weights *weights, const iha_buffer *x, const iha_buffer *z)
{
    if (weights == NULL || x == NULL || z == NULL)
        return multi_fail_all(m, IHA_ERROR_INVALID_ARGUMENT, "weights, x and z must not be NULL");
    for (size_t i = 0; i < m->R; ++i) IHA_FORWARD_IF_ERROR(check_part(m, i, weights, x, z));
    for (size_t i = 0; i < m->R; ++i) IHA_FORWARD_IF_ERROR(check_apart(m, i, weights, x, z));
    /* qt, kt, vt and o of every part, as arrays over the parts, and the z stand-ins. */
    iha_buffer *t = calloc(T_COUNT * m->R, sizeof *t);
    if (t == NULL) return multi_fail_all(m, IHA_ERROR_HOST_MEMORY, "no host memory for the parts");
    iha_buffer *qt = t, *kt = t + m->R, *vt = t + 2 * m->R, *o = t + 3 * m->R, *zs = t + 4 * m->R;
    iha_status st = IHA_OK;
    for (size_t i = 0; i < m->R && st == IHA_OK; ++i) {
        iha_buffer part[T_COUNT];
        st = part_tensors(m, i, part);
        qt[i] = part[T_QT], kt[i] = part[T_KT], vt[i] = part[T_VT], o[i] = part[T_O], zs[i] = part[T_Z];
    }
    /* Nothing is enqueued before this point. */
    for (size_t i = 0; i < m->R && st == IHA_OK; ++i) {
        const iha_shape local = multi_part_shape(m, i);
        st = iha_layer_expand(m->ctx[i], &local, &m->options, &weights[i], m->start[i], x[i], qt[i], kt[i], vt[i]);
        if (st != IHA_OK) st = multi_fail_part(m, i, st, "iha_layer_expand");
        if (st == IHA_OK) st = multi_flush(m, i);
    }
    iha_attention_options rotated = m->options;
    rotated.rope = 0; /* applied by the expansion, at global positions */
    if (st == IHA_OK) st = iha_multi_attention(m->ctx, m->R, &m->shape, &rotated, qt, kt, vt, o, NULL);
    for (size_t i = 0; i < m->R && st == IHA_OK; ++i) {
        const iha_shape local = multi_part_shape(m, i);
        st = iha_layer_collapse(m->ctx[i], &local, &m->options, &weights[i], o[i], zs[i]);
        if (st != IHA_OK) st = multi_fail_part(m, i, st, "iha_layer_collapse");
        if (st == IHA_OK) st = multi_flush(m, i);
    }
    /* Every part came through: the caller's z. */
    for (size_t i = 0; i < m->R && st == IHA_OK; ++i) st = deliver(m, i, zs[i].mem, z[i]);
    st = multi_finish(m, st);
    free(t);
    return st;
}

iha_status iha_multi_forward(iha_context *const *contexts, size_t count, const iha_shape *shape,
                             const iha_attention_options *options, const iha_layer_weights *weights,
                             const iha_buffer *x, const iha_buffer *z)
{
    multi_run m;
    IHA_FORWARD_IF_ERROR(multi_open(&m, call, contexts, count, shape, options, 1));
    const iha_status st = run(&m, weights, x, z);
    multi_close(&m);
    return st;
}
