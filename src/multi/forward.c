/* iha_multi_forward: the layer over several contexts. Each context runs the per-token stages on
 * its part (iha_layer_expand at the part's first token), iha_multi_attention joins the parts,
 * and each context collapses its part (iha_layer_collapse). */
#include <stdio.h>
#include <stdlib.h>

#include "layer/plan.h"
#include "multi/multi.h"
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

/* Once every part's x and z passed their checks: z[i] apart from every x and every other z (two
 * contexts may share a cl_context). */
static iha_status check_apart(const multi_run *m, size_t i, const iha_buffer *x, const iha_buffer *z)
{
    const size_t row = m->shape.batch * m->shape.model_dim, n = row * multi_tokens(m, i);
    char zn[32], other[32];
    snprintf(zn, sizeof zn, "z[%zu]", i);
    iha_status st = IHA_OK;
    for (size_t i2 = 0; i2 < m->R && st == IHA_OK; ++i2) {
        const size_t n2 = row * multi_tokens(m, i2);
        snprintf(other, sizeof other, "x[%zu]", i2);
        st = iha__check_disjoint(m->ctx[i], z[i], n, x[i2], n2, sizeof(float), zn, other);
        snprintf(other, sizeof other, "z[%zu]", i2);
        if (st == IHA_OK && i2 != i) st = iha__check_disjoint(m->ctx[i], z[i], n, z[i2], n2, sizeof(float), zn, other);
    }
    return st == IHA_OK ? st : multi_fail_part(m, i, st, NULL);
}

/* Part i's qt, kt, vt and o in its context's workspace, counted with the attention's staging. */
static iha_status part_tensors(const multi_run *m, size_t i, iha_buffer t[4])
{
    const size_t n = multi_part_elems(m, i);
    const size_t staging = m->R > 1 ? 2 * m->block_elems : 0, total = 4 * n + staging + multi_part_lse(m, i);
    const iha_status st = iha__workspace_check_total(m->ctx[i], total, sizeof(float));
    if (st != IHA_OK) return multi_fail_part(m, i, st, NULL);
    for (int k = 0; k < 4; ++k) {
        t[k] = (iha_buffer){NULL, 0};
        IHA_FORWARD_IF_ERROR(multi_staging(m, i, IHA_WS_MULTI_QT + k, n, &t[k].mem));
    }
    return IHA_OK;
}

static iha_status run(multi_run *m, const iha_layer_weights *weights, const iha_buffer *x, const iha_buffer *z)
{
    if (weights == NULL || x == NULL || z == NULL)
        return multi_fail_all(m, IHA_ERROR_INVALID_ARGUMENT, "weights, x and z must not be NULL");
    for (size_t i = 0; i < m->R; ++i) IHA_FORWARD_IF_ERROR(check_part(m, i, weights, x, z));
    for (size_t i = 0; i < m->R; ++i) IHA_FORWARD_IF_ERROR(check_apart(m, i, x, z));
    /* qt, kt, vt and o of every part, as arrays over the parts. */
    iha_buffer *t = calloc(4 * m->R, sizeof *t);
    if (t == NULL) return multi_fail_all(m, IHA_ERROR_HOST_MEMORY, "no host memory for the parts");
    iha_buffer *qt = t, *kt = t + m->R, *vt = t + 2 * m->R, *o = t + 3 * m->R;
    iha_status st = IHA_OK;
    for (size_t i = 0; i < m->R && st == IHA_OK; ++i) {
        iha_buffer part[4];
        st = part_tensors(m, i, part);
        qt[i] = part[0], kt[i] = part[1], vt[i] = part[2], o[i] = part[3];
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
        st = iha_layer_collapse(m->ctx[i], &local, &m->options, &weights[i], o[i], z[i]);
        if (st != IHA_OK) st = multi_fail_part(m, i, st, "iha_layer_collapse");
        if (st == IHA_OK) st = multi_flush(m, i);
    }
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
