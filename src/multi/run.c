/* The split of the sequence over the contexts, which key blocks each part sees, and the checks
 * every call of iha_multi.h makes before it enqueues anything. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer/call.h"
#include "layer/plan.h"
#include "multi/multi.h"
#include "runtime/context.h"
#include "runtime/error.h"

void iha_multi_split(size_t tokens, size_t parts, size_t part, size_t *first, size_t *count)
{
    size_t f = 0, c = 0;
    if (parts > 0 && part < parts) {
        const size_t base = tokens / parts, extra = tokens % parts;
        f = part * base + (part < extra ? part : extra);
        c = base + (part < extra ? 1 : 0);
    }
    if (first != NULL) *first = f;
    if (count != NULL) *count = c;
}

/* A failure of the common arguments, in every context the array holds. */
static iha_status fail_all(iha_context *const *contexts, size_t count, iha_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static iha_status fail_all(iha_context *const *contexts, size_t count, iha_status status, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    for (size_t i = 0; contexts != NULL && i < count; ++i)
        if (contexts[i] != NULL) iha__fail(contexts[i], status, "%s", text);
    return status;
}

/* The whole shape and options as iha_attention_partial takes them (a layer call: with model_dim
 * and rotary), checked on contexts[0]; its message then goes to every context. */
static iha_status check_problem(const multi_run *m, const iha_shape *shape, const iha_attention_options *options,
                                int layer)
{
    iha_context *ctx = m->ctx[0];
    iha_plan p;
    iha_status st = iha__plan_make(ctx, shape, options, layer, &p);
    if (st == IHA_OK && p.rope && !layer)
        st = iha__fail(ctx, IHA_ERROR_INVALID_ARGUMENT, "takes already rotated inputs: options->rope must be 0");
    if (st == IHA_OK && p.act_storage != IHA_STORAGE_F32)
        st = iha__fail(ctx, IHA_ERROR_UNSUPPORTED,
                       "takes float32 tensors only (options->storage must be IHA_STORAGE_F32)");
    if (st == IHA_OK && p.seq_lens != NULL)
        st = iha__fail(ctx, IHA_ERROR_UNSUPPORTED, "does not take packed sequences (options->seq_lens must be NULL)");
    if (st == IHA_OK && shape->tokens < m->R)
        st = iha__fail(ctx, IHA_ERROR_INVALID_ARGUMENT, "%zu tokens over %zu contexts; every part needs a token",
                       shape->tokens, m->R);
    if (st == IHA_OK) return IHA_OK;
    char text[512];
    snprintf(text, sizeof text, "%s", iha_context_message(ctx));
    return fail_all(m->ctx, m->R, st, "%s: %s", m->call, text);
}

iha_status multi_open(multi_run *m, const char *call, iha_context *const *contexts, size_t count,
                      const iha_shape *shape, const iha_attention_options *options, int layer)
{
    memset(m, 0, sizeof *m);
    m->call = call;
    if (contexts == NULL || count == 0) return IHA_ERROR_INVALID_ARGUMENT; /* no context to hold a message */
    double mark;
    for (size_t i = 0; i < count; ++i)
        if (contexts[i] != NULL) IHA_FORWARD_IF_ERROR(iha__call_begin(contexts[i], &mark));
    for (size_t i = 0; i < count; ++i) {
        if (contexts[i] == NULL)
            return fail_all(contexts, count, IHA_ERROR_INVALID_ARGUMENT, "%s: contexts[%zu] is NULL", call, i);
        for (size_t j = 0; j < i; ++j)
            if (contexts[j] == contexts[i])
                return fail_all(contexts, count, IHA_ERROR_INVALID_ARGUMENT,
                                "%s: contexts[%zu] is contexts[%zu] again; each part takes a context of its own", call,
                                i, j);
    }
    m->ctx = contexts;
    m->R = count;
    if (shape == NULL || options == NULL)
        return fail_all(contexts, count, IHA_ERROR_INVALID_ARGUMENT, "%s: shape and options must not be NULL", call);
    IHA_FORWARD_IF_ERROR(check_problem(m, shape, options, layer));
    m->shape = *shape;
    m->options = *options;
    m->start = malloc((count + 1) * sizeof *m->start);
    m->ready = calloc(count, sizeof *m->ready);
    if (m->start == NULL || m->ready == NULL) {
        multi_close(m);
        return fail_all(contexts, count, IHA_ERROR_HOST_MEMORY, "%s: no host memory for the split", call);
    }
    for (size_t j = 0; j < count; ++j) iha_multi_split(shape->tokens, count, j, &m->start[j], NULL);
    m->start[count] = shape->tokens;
    /* The whole shape's sizes passed the plan's overflow checks, so these products fit. */
    m->lse_elems = shape->batch * shape->heads * shape->pseudo;
    m->row_elems = m->lse_elems * shape->head_dim;
    m->block_elems = multi_tokens(m, 0) * m->row_elems; /* part 0 is one of the longest */
    return IHA_OK;
}

void multi_close(multi_run *m)
{
    for (size_t j = 0; m->ready != NULL && j < m->R; ++j)
        if (m->ready[j] != NULL) clReleaseEvent(m->ready[j]);
    free(m->ready);
    free(m->start);
    m->ready = NULL;
    m->start = NULL;
}

size_t multi_tokens(const multi_run *m, size_t j) { return m->start[j + 1] - m->start[j]; }

iha_shape multi_part_shape(const multi_run *m, size_t j)
{
    iha_shape s = m->shape;
    s.tokens = multi_tokens(m, j);
    return s;
}

size_t multi_part_elems(const multi_run *m, size_t j) { return multi_tokens(m, j) * m->row_elems; }
size_t multi_part_lse(const multi_run *m, size_t j) { return multi_tokens(m, j) * m->lse_elems; }

int multi_visible(const multi_run *m, size_t i, size_t j)
{
    const size_t qs = m->start[i], qe = m->start[i + 1], ks = m->start[j], ke = m->start[j + 1];
    const size_t W = (size_t)m->options.window, P = m->shape.pseudo;
    const int causal = m->options.mask == IHA_MASK_CAUSAL, token_causal = m->options.mask == IHA_MASK_TOKEN_CAUSAL;
    if ((causal || token_causal) && ks >= qe) return 0; /* every key after every query */
    if (W == 0) return 1;
    /* Keys before the queries: the nearest pair is the block's last token and the part's first.
     * Under the causal mask their virtual rows are (qs - ke)*P + 1 apart against a window of W*P
     * rows, which hides them from a distance of W tokens (W - 1 when P is 1); the token masks
     * count tokens, (qs - ke + 1) apart. */
    if (ke <= qs && qs - ke + (causal ? (P == 1) : 1) >= W) return 0;
    if (qe <= ks && ks - qe + 1 >= W) return 0; /* keys after the queries: only IHA_MASK_NONE gets here */
    return 1;
}

int multi_needed(const multi_run *m, size_t j)
{
    for (size_t i = 0; i < m->R; ++i)
        if (i != j && multi_visible(m, i, j)) return 1;
    return 0;
}

iha_status multi_fail_part(const multi_run *m, size_t i, iha_status status, const char *what)
{
    char text[1024];
    snprintf(text, sizeof text, "%s", iha_context_message(m->ctx[i]));
    return iha__fail(m->ctx[i], status, "%s: contexts[%zu]: %s%s%s", m->call, i, what ? what : "", what ? ": " : "",
                     text);
}

iha_status multi_fail_all(const multi_run *m, iha_status status, const char *what)
{
    return fail_all(m->ctx, m->R, status, "%s: %s", m->call, what);
}

static size_t tensor_elems(const multi_run *m, const multi_tensors *t, int k, size_t i)
{
    return t->is_lse[k] ? multi_part_lse(m, i) : multi_part_elems(m, i);
}

static int tensor_skipped(const multi_tensors *t, int k, size_t i)
{
    return t->optional[k] && (t->arrays[k] == NULL || t->arrays[k][i].mem == NULL);
}

iha_status multi_check_tensors(const multi_run *m, const multi_tensors *t)
{
    char name[64], other[64];
    for (int k = 0; k < t->n; ++k)
        if (t->arrays[k] == NULL && !t->optional[k])
            return fail_all(m->ctx, m->R, IHA_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", m->call, t->names[k]);
    for (size_t i = 0; i < m->R; ++i)
        for (int k = 0; k < t->n; ++k) {
            if (tensor_skipped(t, k, i)) continue;
            snprintf(name, sizeof name, "%s[%zu]", t->names[k], i);
            const iha_status st = iha__check_buffer(m->ctx[i], t->arrays[k][i], tensor_elems(m, t, k, i), 4, name);
            if (st != IHA_OK) return multi_fail_part(m, i, st, NULL);
        }
    /* Outputs apart from every tensor of every part: two contexts may share a cl_context. */
    for (size_t i = 0; i < m->R; ++i)
        for (int k = t->first_out; k < t->n; ++k) {
            if (tensor_skipped(t, k, i)) continue;
            snprintf(name, sizeof name, "%s[%zu]", t->names[k], i);
            for (size_t i2 = 0; i2 < m->R; ++i2)
                for (int k2 = 0; k2 < t->n; ++k2) {
                    if ((i2 == i && k2 == k) || tensor_skipped(t, k2, i2)) continue;
                    snprintf(other, sizeof other, "%s[%zu]", t->names[k2], i2);
                    const iha_status st =
                        iha__check_apart(m->ctx[i], t->arrays[k][i], tensor_elems(m, t, k, i), 4, t->arrays[k2][i2],
                                         tensor_elems(m, t, k2, i2), 4, name, other);
                    if (st != IHA_OK) return multi_fail_part(m, i, st, NULL);
                }
        }
    return IHA_OK;
}
