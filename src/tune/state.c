/* The context's tuning state: its profile, loaded when the context is created, and the GEMM
 * backend the profile or the built-in gives it. */
#include <stdlib.h>

#include "tune/state.h"
#include "runtime/error.h"

iha_status iha__tune_context_init(iha_context *ctx, const char *profile_option, int first_use, double budget_s)
{
    iha_tune_state *s = calloc(1, sizeof *s);
    IHA_RETURN_ERROR_IF(s == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    ctx->tune = s;
    s->first_use = first_use != 0;
    s->first_use_budget_s = budget_s > 0.0 ? budget_s : 10.0;
    IHA_FORWARD_IF_ERROR(iha__profile_open(ctx, profile_option, &s->profile));
    iha_tune_bucket none = {0, {0}};
    iha__tune_describe(&iha__tunable_gemm, &none, NULL, IHA_CONFIG_BUILTIN_TYPE, NULL, &s->gemm);
    /* The library's kernel is context state and costs nothing to choose; CLBlast's parameters
     * wait for the first layer call (see state.h). */
    iha_tune_config c;
    iha_gemm_config g;
    if (iha__tune_gemm_config(ctx, &c, NULL)) {
        iha__tune_gemm_own_config(&c, &g);
        if (g.own) return iha__tune_apply_gemm(ctx);
    }
    return IHA_OK;
}

void iha__tune_context_free(iha_context *ctx)
{
    if (ctx->tune == NULL) return;
    iha__profile_free(&ctx->tune->profile);
    free(ctx->tune->attempted);
    free(ctx->tune);
    ctx->tune = NULL;
}
