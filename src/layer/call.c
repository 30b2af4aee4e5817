/* Entry and stage timing of the public layer calls. */
#include "layer/call.h"
#include "common/timing.h"
#include "runtime/error.h"

#include <string.h>
#include <time.h>


iha_status iha__stage_done(iha_context *ctx, double *slot, double *mark)
{
    if (!ctx->time_stages) return IHA_OK;
    IHA_CL_CHECK(ctx, clFinish(ctx->queue), "clFinish");
    const double t = iha__now_seconds();
    *slot += t - *mark;
    *mark = t;
    return IHA_OK;
}

iha_status iha__call_begin(iha_context *ctx, double *mark)
{
    if (ctx == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    iha__message_clear(&ctx->message);
    ctx->cl_error = 0;
    memset(&ctx->stage_times, 0, sizeof ctx->stage_times);
    if (ctx->workspace_suspect) { /* see context.h: a failed buffer is not reused */
        iha__workspace_release(ctx);
        ctx->workspace_suspect = 0;
    }
    if (ctx->time_stages) IHA_CL_CHECK(ctx, clFinish(ctx->queue), "clFinish");
    *mark = iha__now_seconds();
    return IHA_OK;
}
