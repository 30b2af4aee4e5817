/* iha_multi_attention: every context attends its part's queries over its own key block, then
 * over every other block its queries see, each block read to host once from its own context and
 * written to the staging buffers of the contexts that need it; iha_attention_partial merges. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/checked.h"
#include "layer/partial.h"
#include "multi/multi.h"
#include "runtime/error.h"

static const char *const call = "iha_multi_attention";

/* Part i's staging buffers and its running lse. */
typedef struct forward_part {
    cl_mem k, v;
    iha_buffer lse;
} forward_part;

static iha_status prepare(const multi_run *m, const iha_buffer *lse, forward_part *parts)
{
    for (size_t i = 0; i < m->R; ++i) {
        const int internal_lse = lse == NULL || lse[i].mem == NULL;
        const size_t staging = m->R > 1 ? 2 * m->block_elems : 0, own = internal_lse ? multi_part_lse(m, i) : 0;
        /* The partial steps' own workspace, counted with the staging and grown here so that no
         * step can fail for it. */
        size_t others, steps;
        if (!iha__add(staging, own, &others)) others = SIZE_MAX;
        const iha_status st = iha__partial_reserve(m->ctx[i], &m->shape, multi_tokens(m, 0), others, &steps);
        if (st != IHA_OK) return multi_fail_part(m, i, st, NULL);
        if (m->R > 1) {
            IHA_FORWARD_IF_ERROR(multi_staging(m, i, IHA_WS_MULTI_K, m->block_elems, &parts[i].k));
            IHA_FORWARD_IF_ERROR(multi_staging(m, i, IHA_WS_MULTI_V, m->block_elems, &parts[i].v));
        }
        parts[i].lse = internal_lse ? (iha_buffer){NULL, 0} : lse[i];
        if (internal_lse) IHA_FORWARD_IF_ERROR(multi_staging(m, i, IHA_WS_MULTI_LSE, own, &parts[i].lse.mem));
    }
    return IHA_OK;
}

/* Part i's queries over key block j, from kt and vt (its own block) or from staging. */
static iha_status attend(multi_run *m, size_t i, size_t j, float *host, const iha_buffer *qt, const iha_buffer *kt,
                         const iha_buffer *vt, const iha_buffer *o, const forward_part *part)
{
    iha_buffer k = kt[i], v = vt[i];
    if (j != i) {
        const size_t n = multi_part_elems(m, j);
        const float *block = multi_host_block(m, host, j);
        IHA_FORWARD_IF_ERROR(multi_ready(m, j));
        IHA_FORWARD_IF_ERROR(multi_write(m, i, block, part->k, n));
        IHA_FORWARD_IF_ERROR(multi_write(m, i, block + n, part->v, n));
        k = (iha_buffer){part->k, 0};
        v = (iha_buffer){part->v, 0};
    }
    const iha_shape local = multi_part_shape(m, i);
    const iha_partial_block pb = {m->start[i], m->start[j], multi_tokens(m, j), j == i};
    const iha_status st = iha_attention_partial(m->ctx[i], &local, &m->options, &pb, qt[i], k, v, o[i], part->lse);
    if (st != IHA_OK) {
        char what[64];
        snprintf(what, sizeof what, "key block %zu", j);
        return multi_fail_part(m, i, st, what);
    }
    return multi_flush(m, i);
}

static iha_status run(multi_run *m, const iha_buffer *qt, const iha_buffer *kt, const iha_buffer *vt,
                      const iha_buffer *o, const iha_buffer *lse)
{
    static const char *const names[5] = {"qt", "kt", "vt", "o", "lse"};
    static const int is_lse[5] = {0, 0, 0, 0, 1}, optional[5] = {0, 0, 0, 0, 1};
    const iha_buffer *const arrays[5] = {qt, kt, vt, o, lse};
    const multi_tensors t = {5, 3, arrays, names, is_lse, optional};
    IHA_FORWARD_IF_ERROR(multi_check_tensors(m, &t));
    forward_part *parts = calloc(m->R, sizeof *parts);
    float *host = m->R > 1 ? malloc(2 * m->shape.tokens * m->row_elems * sizeof(float)) : NULL;
    iha_status st = IHA_OK;
    if (parts == NULL || (m->R > 1 && host == NULL))
        st = multi_fail_all(m, IHA_ERROR_HOST_MEMORY, "no host memory for the key and value blocks");
    if (st == IHA_OK) st = prepare(m, lse, parts);
    /* Nothing is enqueued before this point. */
    if (st == IHA_OK) st = multi_read_blocks(m, kt, vt, host);
    for (size_t i = 0; i < m->R && st == IHA_OK; ++i) st = attend(m, i, i, host, qt, kt, vt, o, &parts[i]);
    /* Step s attends block i - s, the ring's order; every context's step is enqueued before the
     * next step's blocks are waited for. */
    for (size_t s = 1; s < m->R && st == IHA_OK; ++s)
        for (size_t i = 0; i < m->R && st == IHA_OK; ++i) {
            const size_t j = (i + m->R - s) % m->R;
            if (multi_visible(m, i, j)) st = attend(m, i, j, host, qt, kt, vt, o, &parts[i]);
        }
    st = multi_finish(m, st);
    free(host);
    free(parts);
    return st;
}

iha_status iha_multi_attention(iha_context *const *contexts, size_t count, const iha_shape *shape,
                               const iha_attention_options *options, const iha_buffer *qt, const iha_buffer *kt,
                               const iha_buffer *vt, const iha_buffer *o, const iha_buffer *lse)
{
    multi_run m;
    IHA_FORWARD_IF_ERROR(multi_open(&m, call, contexts, count, shape, options, 0));
    const iha_status st = run(&m, qt, kt, vt, o, lse);
    multi_close(&m);
    return st;
}
