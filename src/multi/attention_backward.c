/* iha_multi_attention_backward: every context runs iha_attention_partial_backward for its part's
 * queries over each key block they see. Its own block's dK and dV go straight into its outputs;
 * its share of another block's is read back to host, where the shares are summed in step order,
 * and the sum is added into the block's outputs on the block's context at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checked.h"
#include "kernels/accumulate.h"
#include "layer/partial.h"
#include "multi/multi.h"
#include "runtime/error.h"

static const char *const call = "iha_multi_attention_backward";

/* Part i's staging (a key block, its values, their gradients) and its two host slots for the
 * gradients it computes for other blocks: a step's slot is summed while the next step runs. */
typedef struct backward_part {
    cl_mem k, v, dk, dv;
    float *slot[2];  /* dK then dV of the block, 2 * block_elems floats */
    cl_event ev[2];  /* the slot's read */
    size_t block[2]; /* the slot's key block; R when the slot is empty */
} backward_part;

/* Host memory: the key and value blocks, the summed foreign gradients of each block (the same
 * layout: dK then dV), and every part's two slots. */
typedef struct backward_host {
    float *kv, *sums, *slots;
    char *has_sum; /* per block */
} backward_host;

/* Every context's buffers, before anything is enqueued on any: the staging, the workspace of
 * iha_attention_partial_backward for the longest key block (part 0's, so that no step can fail
 * for it), and the accumulation kernel that adds the other parts' shares into a block's dK and
 * dV (built here, so that no delivery can fail after another has been made). */
static iha_status prepare(const multi_run *m, backward_part *parts)
{
    for (size_t i = 0; i < m->R; ++i) {
        const size_t staging = m->R > 1 ? 4 * m->block_elems : 0;
        const iha_shape local = multi_part_shape(m, i);
        size_t steps;
        iha_status st = iha__partial_backward_reserve(m->ctx[i], &local, multi_tokens(m, 0), staging, &steps);
        if (st != IHA_OK) return multi_fail_part(m, i, st, NULL);
        parts[i].block[0] = parts[i].block[1] = m->R;
        if (m->R == 1) continue;
        IHA_FORWARD_IF_ERROR(multi_staging(m, i, IHA_WS_MULTI_K, m->block_elems, &parts[i].k));
        IHA_FORWARD_IF_ERROR(multi_staging(m, i, IHA_WS_MULTI_V, m->block_elems, &parts[i].v));
        IHA_FORWARD_IF_ERROR(multi_staging(m, i, IHA_WS_MULTI_DK, m->block_elems, &parts[i].dk));
        IHA_FORWARD_IF_ERROR(multi_staging(m, i, IHA_WS_MULTI_DV, m->block_elems, &parts[i].dv));
        if (multi_needed(m, i)) {
            st = iha__accumulate_kernel_get(m->ctx[i], IHA_STORAGE_F32);
            if (st != IHA_OK) return multi_fail_part(m, i, st, "the accumulation kernel");
        }
    }
    return IHA_OK;
}

static iha_status host_alloc(const multi_run *m, backward_part *parts, backward_host *h)
{
    memset(h, 0, sizeof *h);
    if (m->R == 1) return IHA_OK;
    size_t whole, slots, total, bytes;
    if (!iha__mul(2 * m->row_elems, m->shape.tokens, &whole) || !iha__mul(4 * m->block_elems, m->R, &slots) ||
        !iha__mul(whole, 2, &total) || !iha__add(total, slots, &total) || !iha__mul(total, sizeof(float), &bytes))
        return multi_fail_all(m, IHA_ERROR_HOST_MEMORY, "the host copies' sizes overflow size_t");
    h->kv = malloc(bytes);
    h->has_sum = calloc(m->R, 1);
    if (h->kv == NULL || h->has_sum == NULL)
        return multi_fail_all(m, IHA_ERROR_HOST_MEMORY, "no host memory for the key, value and gradient blocks");
    h->sums = h->kv + whole;
    h->slots = h->sums + whole;
    for (size_t i = 0; i < m->R; ++i)
        for (int s = 0; s < 2; ++s) parts[i].slot[s] = h->slots + (4 * i + 2 * (size_t)s) * m->block_elems;
    return IHA_OK;
}

static void host_free(backward_host *h)
{
    free(h->kv);
    free(h->has_sum);
}

/* The backward of part i's queries over key block j. Its own block writes (or adds into) dkt[i]
 * and dvt[i]; another block's shares go to staging and are read into the slot of the step. */
static iha_status step(multi_run *m, size_t i, size_t j, int slot, backward_host *h, const iha_buffer *const *b,
                       backward_part *part)
{
    const iha_buffer *qt = b[0], *kt = b[1], *vt = b[2], *o = b[3], *lse = b[4], *dout = b[5];
    const iha_buffer *dqt = b[6], *dkt = b[7], *dvt = b[8];
    const size_t n = multi_part_elems(m, j);
    iha_attention_options ob = m->options;
    iha_buffer k = kt[i], v = vt[i], dk = dkt[i], dv = dvt[i];
    if (j != i) {
        const float *block = multi_host_block(m, h->kv, j);
        IHA_FORWARD_IF_ERROR(multi_ready(m, j));
        IHA_FORWARD_IF_ERROR(multi_write(m, i, block, part->k, n));
        IHA_FORWARD_IF_ERROR(multi_write(m, i, block + n, part->v, n));
        k = (iha_buffer){part->k, 0};
        v = (iha_buffer){part->v, 0};
        dk = (iha_buffer){part->dk, 0};
        dv = (iha_buffer){part->dv, 0};
        ob.accumulate = 0;
    }
    const iha_shape local = multi_part_shape(m, i);
    /* dqt: the own block, first, overwrites it unless the caller accumulates. */
    const iha_partial_block pb = {m->start[i], m->start[j], multi_tokens(m, j), j == i && !m->options.accumulate};
    const iha_status st =
        iha_attention_partial_backward(m->ctx[i], &local, &ob, &pb, qt[i], k, v, o[i], lse[i], dout[i], dqt[i], dk, dv);
    if (st != IHA_OK) {
        char what[64];
        snprintf(what, sizeof what, "key block %zu", j);
        return multi_fail_part(m, i, st, what);
    }
    if (j != i) {
        IHA_FORWARD_IF_ERROR(multi_read(m, i, part->dk, part->slot[slot], n, NULL));
        IHA_FORWARD_IF_ERROR(multi_read(m, i, part->dv, part->slot[slot] + n, n, &part->ev[slot]));
        part->block[slot] = j;
    }
    return multi_flush(m, i);
}

/* Adds the shares in part i's slot, once read, into their block's sum. */
static iha_status collect(const multi_run *m, size_t i, int slot, backward_host *h, backward_part *part)
{
    const size_t j = part->block[slot];
    if (j == m->R) return IHA_OK;
    part->block[slot] = m->R;
    const cl_int err = clWaitForEvents(1, &part->ev[slot]);
    clReleaseEvent(part->ev[slot]);
    part->ev[slot] = NULL;
    if (err != CL_SUCCESS)
        return multi_fail_part(m, i, iha__fail_cl(m->ctx[i], err, "clWaitForEvents (gradient block)"), NULL);
    const size_t n = 2 * multi_part_elems(m, j);
    float *sum = multi_host_block(m, h->sums, j);
    const float *share = part->slot[slot];
    if (!h->has_sum[j])
        memcpy(sum, share, n * sizeof(float));
    else
        for (size_t e = 0; e < n; ++e) sum[e] += share[e];
    h->has_sum[j] = 1;
    return IHA_OK;
}

/* Block j's summed foreign gradients added into dkt[j] and dvt[j] on its own context. */
static iha_status deliver(const multi_run *m, size_t j, const backward_host *h, const iha_buffer *dkt,
                          const iha_buffer *dvt, const backward_part *part)
{
    if (!h->has_sum[j]) return IHA_OK;
    const size_t n = multi_part_elems(m, j);
    const float *sum = multi_host_block(m, h->sums, j);
    IHA_FORWARD_IF_ERROR(multi_write(m, j, sum, part->dk, n));
    IHA_FORWARD_IF_ERROR(multi_write(m, j, sum + n, part->dv, n));
    iha_status st = iha__accumulate_enqueue(m->ctx[j], IHA_STORAGE_F32, (iha_buffer){part->dk, 0}, dkt[j], n);
    if (st == IHA_OK) st = iha__accumulate_enqueue(m->ctx[j], IHA_STORAGE_F32, (iha_buffer){part->dv, 0}, dvt[j], n);
    if (st != IHA_OK) return multi_fail_part(m, j, st, "adding the other parts' gradients");
    return multi_flush(m, j);
}

static iha_status run(multi_run *m, const iha_buffer *const *b)
{
    static const char *const names[9] = {"qt", "kt", "vt", "o", "lse", "dout", "dqt", "dkt", "dvt"};
    static const int is_lse[9] = {0, 0, 0, 0, 1, 0, 0, 0, 0}, optional[9] = {0};
    const multi_tensors t = {9, 6, b, names, is_lse, optional};
    IHA_FORWARD_IF_ERROR(multi_check_tensors(m, &t));
    backward_part *parts = calloc(m->R, sizeof *parts);
    backward_host h = {0};
    iha_status st = parts == NULL ? multi_fail_all(m, IHA_ERROR_HOST_MEMORY, "no host memory for the parts") : IHA_OK;
    if (st == IHA_OK) st = host_alloc(m, parts, &h);
    if (st == IHA_OK) st = prepare(m, parts);
    /* Nothing is enqueued before this point. */
    if (st == IHA_OK) st = multi_read_blocks(m, b[1], b[2], h.kv);
    for (size_t i = 0; i < m->R && st == IHA_OK; ++i) st = step(m, i, i, 0, &h, b, &parts[i]);
    /* Step s: part i over block i - s, into slot s % 2, while the shares of step s - 1 are
     * summed; each block gets one share per step, so the sums follow the step order. */
    for (size_t s = 1; s < m->R && st == IHA_OK; ++s) {
        const int slot = (int)(s % 2);
        for (size_t i = 0; i < m->R && st == IHA_OK; ++i) {
            const size_t j = (i + m->R - s) % m->R;
            if (multi_visible(m, i, j)) st = step(m, i, j, slot, &h, b, &parts[i]);
        }
        for (size_t i = 0; i < m->R && st == IHA_OK; ++i) st = collect(m, i, 1 - slot, &h, &parts[i]);
    }
    for (size_t i = 0; i < m->R && st == IHA_OK; ++i)
        for (int slot = 0; slot < 2 && st == IHA_OK; ++slot) st = collect(m, i, slot, &h, &parts[i]);
    for (size_t j = 0; j < m->R && st == IHA_OK && m->R > 1; ++j) st = deliver(m, j, &h, b[7], b[8], &parts[j]);
    st = multi_finish(m, st);
    for (size_t i = 0; parts != NULL && i < m->R; ++i)
        for (int slot = 0; slot < 2; ++slot)
            if (parts[i].ev[slot] != NULL) clReleaseEvent(parts[i].ev[slot]);
    host_free(&h);
    free(parts);
    return st;
}

iha_status iha_multi_attention_backward(iha_context *const *contexts, size_t count, const iha_shape *shape,
                                        const iha_attention_options *options, const iha_buffer *qt,
                                        const iha_buffer *kt, const iha_buffer *vt, const iha_buffer *o,
                                        const iha_buffer *lse, const iha_buffer *dout, const iha_buffer *dqt,
                                        const iha_buffer *dkt, const iha_buffer *dvt)
{
    multi_run m;
    IHA_FORWARD_IF_ERROR(multi_open(&m, call, contexts, count, shape, options, 0));
    const iha_buffer *const b[9] = {qt, kt, vt, o, lse, dout, dqt, dkt, dvt};
    const iha_status st = run(&m, b);
    multi_close(&m);
    return st;
}
