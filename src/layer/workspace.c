/* Workspace buffers that several layer calls take together. */
#include "layer/workspace.h"
#include "runtime/error.h"

iha_status iha__attention_backward_workspace(iha_context *ctx, int tiled, size_t delta_elems, size_t packed,
                                             size_t sums, cl_mem *delta, cl_mem packs[2], cl_mem *part)
{
    const size_t f = sizeof(float);
    packs[0] = packs[1] = *part = NULL;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_DELTA, delta_elems * f, delta));
    if (!tiled) return IHA_OK;
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_PACKED_Q, packed * f, &packs[0]));
    IHA_FORWARD_IF_ERROR(iha__workspace_get(ctx, IHA_WS_PACKED_DO, packed * f, &packs[1]));
    return iha__workspace_get(ctx, IHA_WS_DQ_PARTIAL, sums * f, part);
}
