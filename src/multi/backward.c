/* iha_multi_backward: the layer's backward over several contexts. Each context recomputes its
 * part's forward (iha_layer_expand, then iha_multi_attention joins the parts), runs the
 * collapse's backward, iha_multi_attention_backward joins the parts again, and each context runs
 * the expand's backward into stand-ins. The parts' weight gradients are summed through host
 * memory in part order, so every context receives the same sum; dx and the gradients reach the
 * caller's buffers only after every part came through. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/accumulate.h"
#include "layer/plan.h"
#include "multi/multi.h"
#include "runtime/context.h"
#include "runtime/error.h"

static const char *const call = "iha_multi_backward";

/* The eight gradients in iha_layer_grads order. */
enum { GRADS = 8 };
static const char *const grad_names[GRADS] = {"wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r"};

static iha_buffer grad_member(const iha_layer_grads *g, int k)
{
    const iha_buffer b[GRADS] = {g->wq, g->wk, g->wv, g->wo, g->alpha_q, g->alpha_k, g->alpha_v, g->r};
    return b[k];
}

static iha_buffer weight_member(const iha_layer_weights *w, int k)
{
    const iha_buffer b[GRADS] = {w->wq, w->wk, w->wv, w->wo, w->alpha_q, w->alpha_k, w->alpha_v, w->r};
    return b[k];
}

typedef struct backward_args {
    const iha_layer_weights *weights;
    const iha_buffer *x, *dz, *dx;
    const iha_layer_grads *grads;
    size_t size[GRADS], at[GRADS], total; /* the asked-for gradients back to back */
    int asked[GRADS];                     /* asked for by some part */
} backward_args;

static iha_buffer part_dx(const backward_args *a, size_t i) { return a->dx != NULL ? a->dx[i] : (iha_buffer){NULL, 0}; }

static iha_buffer part_grad(const backward_args *a, size_t i, int k)
{
    return a->grads != NULL ? grad_member(&a->grads[i], k) : (iha_buffer){NULL, 0};
}

/* One part's tensors for the overlap checks: inputs x, dz and the weights, outputs dx and the
 * gradients, with their sizes (0: not given). */
typedef struct part_list {
    iha_buffer buf[2 + GRADS + 1 + GRADS];
    size_t elems[2 + GRADS + 1 + GRADS];
    char name[2 + GRADS + 1 + GRADS][40];
} part_list;
enum { IN_COUNT = 2 + GRADS, OUT_FIRST = 2 + GRADS, ALL = 2 + GRADS + 1 + GRADS };

static void list_part(const multi_run *m, const backward_args *a, size_t i, part_list *l)
{
    const size_t x_elems = m->shape.batch * multi_tokens(m, i) * m->shape.model_dim;
    snprintf(l->name[0], sizeof l->name[0], "x[%zu]", i);
    snprintf(l->name[1], sizeof l->name[1], "dz[%zu]", i);
    snprintf(l->name[OUT_FIRST], sizeof l->name[0], "dx[%zu]", i);
    l->buf[0] = a->x[i], l->elems[0] = x_elems;
    l->buf[1] = a->dz[i], l->elems[1] = x_elems;
    l->buf[OUT_FIRST] = part_dx(a, i);
    l->elems[OUT_FIRST] = l->buf[OUT_FIRST].mem != NULL ? x_elems : 0;
    for (int k = 0; k < GRADS; ++k) {
        snprintf(l->name[2 + k], sizeof l->name[0], "weights[%zu].%s", i, grad_names[k]);
        snprintf(l->name[OUT_FIRST + 1 + k], sizeof l->name[0], "grads[%zu].%s", i, grad_names[k]);
        l->buf[2 + k] = weight_member(&a->weights[i], k);
        l->elems[2 + k] = l->buf[2 + k].mem != NULL ? a->size[k] : 0;
        l->buf[OUT_FIRST + 1 + k] = part_grad(a, i, k);
        l->elems[OUT_FIRST + 1 + k] = l->buf[OUT_FIRST + 1 + k].mem != NULL ? a->size[k] : 0;
    }
}

/* Part i's weights, x, dz, dx and gradients, checked on its context. */
static iha_status check_part(const multi_run *m, const backward_args *a, size_t i)
{
    iha_context *ctx = m->ctx[i];
    const iha_shape local = multi_part_shape(m, i);
    iha_plan p;
    part_list l;
    list_part(m, a, i, &l);
    iha_status st = iha__plan_make(ctx, &local, &m->options, 1, &p);
    if (st == IHA_OK) st = iha__check_weights(ctx, &p, &a->weights[i], 1);
    for (int k = 0; k < 2 && st == IHA_OK; ++k) st = iha__check_buffer(ctx, l.buf[k], l.elems[k], 4, l.name[k]);
    for (int k = OUT_FIRST; k < ALL && st == IHA_OK; ++k)
        if (l.buf[k].mem != NULL) st = iha__check_buffer(ctx, l.buf[k], l.elems[k], 4, l.name[k]);
    for (int k = OUT_FIRST; k < ALL && st == IHA_OK; ++k)
        if (l.buf[k].mem != NULL)
            st = iha__check_apart_from_weights(ctx, &p, &a->weights[i], 1, l.buf[k], l.elems[k], l.name[k]);
    return st == IHA_OK ? st : multi_fail_part(m, i, st, NULL);
}

/* Once every part passed its checks: each output of part i apart from every input of every part
 * and every other output (two contexts may share a cl_context). */
static iha_status check_apart(const multi_run *m, const backward_args *a, size_t i, part_list *mine, part_list *other)
{
    list_part(m, a, i, mine);
    iha_status st = IHA_OK;
    for (size_t i2 = 0; i2 < m->R && st == IHA_OK; ++i2) {
        list_part(m, a, i2, other);
        for (int k = OUT_FIRST; k < ALL && st == IHA_OK; ++k) {
            if (mine->buf[k].mem == NULL) continue;
            for (int k2 = 0; k2 < ALL && st == IHA_OK; ++k2) {
                if (other->buf[k2].mem == NULL || (i2 == i && k2 == k)) continue;
                st = iha__check_disjoint(m->ctx[i], mine->buf[k], mine->elems[k], other->buf[k2], other->elems[k2],
                                         sizeof(float), mine->name[k], other->name[k2]);
            }
        }
    }
    return st == IHA_OK ? st : multi_fail_part(m, i, st, NULL);
}

/* Part i's buffers: the forward's qt, kt, vt, o (the forward's slots) and lse, the stand-ins of
 * dout, dqt, dkt, dvt, dx and the gradients, counted with iha_multi_attention_backward's staging
 * and Delta. b[0..10]: qt, kt, vt, o, lse, dout, dqt, dkt, dvt, dx, grads. */
enum { B_QT, B_KT, B_VT, B_O, B_LSE, B_DOUT, B_DQT, B_DKT, B_DVT, B_DX, B_GRADS, B_COUNT };
static iha_status part_buffers(const multi_run *m, const backward_args *a, size_t i, iha_buffer b[B_COUNT])
{
    const size_t n = multi_part_elems(m, i), lse = multi_part_lse(m, i);
    const size_t dx = part_dx(a, i).mem != NULL ? m->shape.batch * multi_tokens(m, i) * m->shape.model_dim : 0;
    const size_t staging = m->R > 1 ? 4 * m->block_elems : 0;
    const size_t total = 8 * n + 2 * lse + dx + a->total + staging;
    const iha_status st = iha__workspace_check_total(m->ctx[i], total, sizeof(float));
    if (st != IHA_OK) return multi_fail_part(m, i, st, NULL);
    static const int slot[B_COUNT] = {IHA_WS_MULTI_QT,  IHA_WS_MULTI_KT,   IHA_WS_MULTI_VT,   IHA_WS_MULTI_O,
                                      IHA_WS_MULTI_LSE, IHA_WS_MULTI_DOUT, IHA_WS_MULTI_DQT,  IHA_WS_MULTI_DKT,
                                      IHA_WS_MULTI_DVT, IHA_WS_MULTI_DX,   IHA_WS_MULTI_GRADS};
    const size_t floats[B_COUNT] = {n, n, n, n, lse, n, n, n, n, dx, a->total};
    for (int k = 0; k < B_COUNT; ++k) {
        b[k] = (iha_buffer){NULL, 0};
        if (floats[k] > 0) IHA_FORWARD_IF_ERROR(multi_staging(m, i, slot[k], floats[k], &b[k].mem));
    }
    return IHA_OK;
}

/* The stand-ins of part i's gradients, as an iha_layer_grads (every member some part asked for). */
static iha_layer_grads stand_in_grads(const backward_args *a, cl_mem g)
{
    iha_buffer b[GRADS];
    for (int k = 0; k < GRADS; ++k) b[k] = (iha_buffer){a->asked[k] ? g : NULL, a->at[k]};
    return (iha_layer_grads){b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]};
}

/* A stand-in's n floats into the caller's buffer: copied, or added in with accumulate. */
static iha_status deliver(const multi_run *m, size_t i, iha_buffer src, iha_buffer dst, size_t n, const char *what)
{
    iha_status st;
    if (m->options.accumulate)
        st = iha__accumulate_enqueue(m->ctx[i], IHA_STORAGE_F32, src, dst, n);
    else {
        const cl_int err = clEnqueueCopyBuffer(m->ctx[i]->queue, src.mem, dst.mem, src.offset * sizeof(float),
                                               dst.offset * sizeof(float), n * sizeof(float), 0, NULL, NULL);
        st = err == CL_SUCCESS ? IHA_OK : iha__fail_cl(m->ctx[i], err, "clEnqueueCopyBuffer");
    }
    return st == IHA_OK ? st : multi_fail_part(m, i, st, what);
}

/* Every part's gradient stand-in read back and summed in part order on the host, the sum written
 * back to every stand-in. */
static iha_status sum_grads(const multi_run *m, const backward_args *a, iha_buffer (*b)[B_COUNT], float *host)
{
    float *sum = host, *share = host + a->total;
    for (size_t i = 0; i < m->R; ++i) {
        float *dst = i == 0 ? sum : share;
        const cl_int err = clEnqueueReadBuffer(m->ctx[i]->queue, b[i][B_GRADS].mem, CL_TRUE, 0,
                                               a->total * sizeof(float), dst, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            return multi_fail_part(m, i, iha__fail_cl(m->ctx[i], err, "clEnqueueReadBuffer (gradients)"), NULL);
        if (i > 0)
            for (size_t e = 0; e < a->total; ++e) sum[e] += share[e];
    }
    for (size_t i = 0; i < m->R; ++i) IHA_FORWARD_IF_ERROR(multi_write(m, i, sum, b[i][B_GRADS].mem, a->total));
    return IHA_OK;
}

static iha_status compute(multi_run *m, const backward_args *a, iha_buffer (*b)[B_COUNT], iha_buffer *arrays,
                          float *host)
{
    const size_t R = m->R;
    iha_attention_options plain = m->options, rotated = m->options;
    plain.accumulate = 0; /* the stages and the attention write the stand-ins */
    rotated.accumulate = 0;
    rotated.rope = 0; /* applied by the expansion, at global positions */
    iha_buffer *t[9];
    for (int k = 0; k < 9; ++k) t[k] = arrays + k * R;
    for (size_t i = 0; i < R; ++i)
        for (int k = 0; k < 9; ++k) t[k][i] = b[i][k];
    iha_status st = IHA_OK;
    for (size_t i = 0; i < R && st == IHA_OK; ++i) {
        const iha_shape local = multi_part_shape(m, i);
        st = iha_layer_expand(m->ctx[i], &local, &plain, &a->weights[i], m->start[i], a->x[i], b[i][B_QT], b[i][B_KT],
                              b[i][B_VT]);
        if (st != IHA_OK) st = multi_fail_part(m, i, st, "iha_layer_expand");
        if (st == IHA_OK) st = multi_flush(m, i);
    }
    if (st == IHA_OK) st = iha_multi_attention(m->ctx, R, &m->shape, &rotated, t[0], t[1], t[2], t[3], t[4]);
    for (size_t i = 0; i < R && st == IHA_OK; ++i) {
        const iha_shape local = multi_part_shape(m, i);
        const iha_layer_grads g = stand_in_grads(a, b[i][B_GRADS].mem);
        st = iha_layer_collapse_backward(m->ctx[i], &local, &plain, &a->weights[i], b[i][B_O], a->dz[i], b[i][B_DOUT],
                                         &g);
        if (st != IHA_OK) st = multi_fail_part(m, i, st, "iha_layer_collapse_backward");
        if (st == IHA_OK) st = multi_flush(m, i);
    }
    if (st == IHA_OK)
        st = iha_multi_attention_backward(m->ctx, R, &m->shape, &rotated, t[0], t[1], t[2], t[3], t[4], t[5], t[6],
                                          t[7], t[8]);
    for (size_t i = 0; i < R && st == IHA_OK; ++i) {
        const iha_shape local = multi_part_shape(m, i);
        const iha_layer_grads g = stand_in_grads(a, b[i][B_GRADS].mem);
        st = iha_layer_expand_backward(m->ctx[i], &local, &plain, &a->weights[i], m->start[i], a->x[i], b[i][B_DQT],
                                       b[i][B_DKT], b[i][B_DVT], b[i][B_DX], &g);
        if (st != IHA_OK) st = multi_fail_part(m, i, st, "iha_layer_expand_backward");
        if (st == IHA_OK) st = multi_flush(m, i);
    }
    if (st == IHA_OK && a->total > 0 && R > 1) st = sum_grads(m, a, b, host);
    /* Every part came through: the caller's outputs. */
    for (size_t i = 0; i < R && st == IHA_OK; ++i) {
        const iha_buffer dx = part_dx(a, i);
        if (dx.mem != NULL)
            st = deliver(m, i, b[i][B_DX], dx, m->shape.batch * multi_tokens(m, i) * m->shape.model_dim, "dx");
        for (int k = 0; k < GRADS && st == IHA_OK; ++k) {
            const iha_buffer g = part_grad(a, i, k);
            if (g.mem != NULL)
                st = deliver(m, i, (iha_buffer){b[i][B_GRADS].mem, a->at[k]}, g, a->size[k], grad_names[k]);
        }
        if (st == IHA_OK) st = multi_flush(m, i);
    }
    return st;
}

static iha_status run(multi_run *m, backward_args *a)
{
    if (a->weights == NULL || a->x == NULL || a->dz == NULL)
        return multi_fail_all(m, IHA_ERROR_INVALID_ARGUMENT, "weights, x and dz must not be NULL");
    if (m->options.weight_storage != IHA_STORAGE_F32)
        return multi_fail_all(m, IHA_ERROR_UNSUPPORTED,
                              "takes float32 weights only (options->weight_storage must be IHA_STORAGE_F32)");
    const iha_shape *s = &m->shape;
    /* The plan bounds D*H*d and H*H*P, so these products and their sum fit. */
    const size_t w = s->model_dim * s->heads * s->head_dim, mix = s->heads * s->heads * s->pseudo;
    int wanted = 0;
    for (int k = 0; k < GRADS; ++k) {
        a->size[k] = k < 4 ? w : mix;
        a->at[k] = a->total;
        for (size_t i = 0; i < m->R; ++i)
            if (part_grad(a, i, k).mem != NULL) a->asked[k] = 1;
        if (a->asked[k]) a->total += a->size[k];
        wanted |= a->asked[k];
    }
    for (size_t i = 0; i < m->R; ++i) wanted |= part_dx(a, i).mem != NULL;
    for (size_t i = 0; i < m->R; ++i) IHA_FORWARD_IF_ERROR(check_part(m, a, i));
    part_list *lists = malloc(2 * sizeof *lists);
    iha_buffer(*b)[B_COUNT] = calloc(m->R, sizeof *b);
    iha_buffer *arrays = calloc(9 * m->R, sizeof *arrays);
    float *host = m->R > 1 && a->total > 0 ? malloc(2 * a->total * sizeof(float)) : NULL;
    iha_status st = IHA_OK;
    if (lists == NULL || b == NULL || arrays == NULL || (m->R > 1 && a->total > 0 && host == NULL))
        st = multi_fail_all(m, IHA_ERROR_HOST_MEMORY, "no host memory for the parts");
    for (size_t i = 0; i < m->R && st == IHA_OK; ++i) st = check_apart(m, a, i, &lists[0], &lists[1]);
    for (size_t i = 0; i < m->R && st == IHA_OK && wanted; ++i) st = part_buffers(m, a, i, b[i]);
    /* With accumulate the delivery adds part by part: its kernel is built on every context here,
     * so that no part's delivery fails for the build after an earlier part's has been added. */
    for (size_t i = 0; i < m->R && st == IHA_OK && wanted && m->options.accumulate; ++i) {
        st = iha__accumulate_kernel_get(m->ctx[i], IHA_STORAGE_F32);
        if (st != IHA_OK) st = multi_fail_part(m, i, st, "the accumulation kernel");
    }
    /* Nothing is enqueued before this point. */
    if (st == IHA_OK && wanted) st = compute(m, a, b, arrays, host);
    st = multi_finish(m, st);
    free(host);
    free(arrays);
    free(b);
    free(lists);
    return st;
}

iha_status iha_multi_backward(iha_context *const *contexts, size_t count, const iha_shape *shape,
                              const iha_attention_options *options, const iha_layer_weights *weights,
                              const iha_buffer *x, const iha_buffer *dz, const iha_buffer *dx,
                              const iha_layer_grads *grads)
{
    multi_run m;
    IHA_FORWARD_IF_ERROR(multi_open(&m, call, contexts, count, shape, options, 1));
    backward_args a = {weights, x, dz, dx, grads, {0}, {0}, 0, {0}};
    const iha_status st = run(&m, &a);
    multi_close(&m);
    return st;
}
