/* The profile's public calls: iha_context_profile and iha_profile_clear. */
#include <stdio.h>
#include <string.h>

#include "runtime/error.h"
#include "tune/state.h"

iha_status iha_context_profile(iha_context *ctx, iha_profile_info *info)
{
    if (ctx == NULL || info == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    const iha_profile *p = &ctx->tune->profile;
    memset(info, 0, sizeof *info);
    info->state = p->state;
    snprintf(info->path, sizeof info->path, "%s", p->path);
    snprintf(info->message, sizeof info->message, "%s", p->message);
    info->entries = p->count;
    if (p->state != IHA_PROFILE_IGNORED) return IHA_OK;
    return iha__fail(ctx, IHA_ERROR_PROFILE, "%s", p->message);
}

iha_status iha_profile_clear(iha_context *ctx)
{
    if (ctx == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    iha__message_clear(&ctx->message);
    IHA_FORWARD_IF_ERROR(iha__profile_clear(ctx, &ctx->tune->profile));
    /* Back to the built-in GEMM backend (which never overrides CLBlast's parameters). */
    return iha__tune_apply_gemm(ctx);
}
