/* Packed sequences on the device (doc/spec.md, "Packed sequences"): each token's sequence bounds
 * for the attention kernels (cl/masks.clh), and the rotary table whose positions restart at each
 * sequence. iha__plan_make has checked the lengths (layer/plan.c). */
#include <stdlib.h>

#include "kernels/rope.h"
#include "layer/plan.h"
#include "layer/workspace.h"
#include "runtime/error.h"

iha_status iha__plan_sequences(iha_context *ctx, iha_plan *p)
{
    p->dims.seq_bounds = NULL;
    if (p->seq_lens == NULL) return IHA_OK;
    const size_t N = p->dims.N, tokens = p->dims.B * N; /* bounded by iha__plan_make */
    cl_int *host = malloc(2 * tokens * sizeof *host);
    IHA_RETURN_ERROR_IF(host == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for the sequence bounds");
    for (size_t i = 0, start = 0; i < p->seq_count; start += p->seq_lens[i++]) {
        /* Token indices within the batch row: a sequence never crosses one. */
        const cl_int first = (cl_int)(start % N), end = (cl_int)(start % N + p->seq_lens[i]);
        for (size_t n = start; n < start + p->seq_lens[i] && n < tokens; ++n) {
            host[2 * n] = first;
            host[2 * n + 1] = end;
        }
    }
    cl_mem bounds;
    iha_status st = iha__workspace_get(ctx, IHA_WS_SEQ_BOUNDS, 2 * tokens * sizeof *host, &bounds);
    cl_int err = CL_SUCCESS;
    /* Blocking: host is freed next, and the caller's lengths may change once the call returns. */
    if (st == IHA_OK)
        err = clEnqueueWriteBuffer(ctx->queue, bounds, CL_TRUE, 0, 2 * tokens * sizeof *host, host, 0, NULL, NULL);
    free(host);
    IHA_FORWARD_IF_ERROR(st);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clEnqueueWriteBuffer (sequence bounds)");
    p->dims.seq_bounds = bounds;
    return IHA_OK;
}

size_t iha__plan_sequences_elements(const iha_plan *p)
{
    if (p->seq_lens == NULL) return 0;
    /* iha__plan_make bounds B*N*D and B*H*T*d by SIZE_MAX / 8, so neither term overflows. */
    return 2 * p->dims.B * p->dims.N + (p->rope ? p->dims.B * p->dims.T * p->dims.d : 0);
}

iha_status iha__plan_rope_table(iha_context *ctx, const iha_plan *p, cl_mem *out)
{
    *out = NULL;
    if (!p->rope) return IHA_OK;
    const size_t T = p->dims.T, P = p->dims.P, N = p->dims.N, row = p->dims.d * sizeof(float); /* [2][d/2] */
    cl_mem table, packed;
    IHA_FORWARD_IF_ERROR(iha__rope_table(ctx, p->rope_first, T, p->dims.d, p->rope_base, &table));
    if (p->dims.seq_bounds == NULL) {
        *out = table;
        return IHA_OK;
    }
    /* Each sequence's rows are the table's first rows: its virtual positions start at 0. */
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_SEQ_ROPE, p->dims.B * T * row, &packed));
    for (size_t i = 0, start = 0; i < p->seq_count; start += p->seq_lens[i++]) {
        const size_t b = start / N, first = start % N;
        IHA_CL_CHECK(ctx,
                     clEnqueueCopyBuffer(ctx->queue, table, packed, 0, (b * T + first * P) * row,
                                         p->seq_lens[i] * P * row, 0, NULL, NULL),
                     "clEnqueueCopyBuffer (packed rotary table)");
    }
    *out = packed;
    return IHA_OK;
}
