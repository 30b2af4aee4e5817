/* The context's GEMM backend: the profile's device-wide GEMM entry or the device type's
 * built-in, applied to the library's kernel or given to CLBlast. */
#include "gemm/gemm.h"
#include "runtime/error.h"
#include "tune/state.h"

int iha__tune_gemm_config(const iha_context *ctx, iha_tune_config *c, const iha_profile_entry **entry)
{
    const iha_tunable *t = &iha__tunable_gemm;
    const iha_profile *p = &ctx->tune->profile;
    const iha_profile_entry *e = NULL;
    for (size_t i = 0; i < p->count; ++i)
        if (p->entries[i].tunable == t && p->entries[i].is_default) e = &p->entries[i];
    if (entry != NULL) *entry = e;
    if (e != NULL) {
        *c = e->config;
        return 1;
    }
    iha_tune_bucket none = {0, {0}};
    return t->builtin(ctx, &none, c);
}

iha_status iha__tune_apply_gemm(iha_context *ctx)
{
    const iha_tunable *t = &iha__tunable_gemm;
    const iha_profile_entry *e;
    iha_tune_config c;
    iha_tune_bucket none = {0, {0}};
    ctx->tune->gemm_applied = 1;
    ctx->tune->clblast_applied = 0; /* the configuration may have changed (iha_tune, a clear) */
    if (!iha__tune_gemm_config(ctx, &c, &e)) {
        /* No profile entry and no built-in: CLBlast with its database. */
        ctx->gemm->config.own = 0;
        iha__tune_describe(t, &none, NULL, IHA_CONFIG_BUILTIN_TYPE, NULL, &ctx->tune->gemm);
        return IHA_OK;
    }
    if (e != NULL)
        iha__tune_describe(t, &e->bucket, &c, IHA_CONFIG_PROFILE_DEVICE, NULL, &ctx->tune->gemm);
    else
        iha__tune_describe(t, &none, &c, IHA_CONFIG_BUILTIN_TYPE, NULL, &ctx->tune->gemm);
    return t->apply(ctx, &c);
}

void iha__tune_gemm_ready(iha_context *ctx)
{
    if (!ctx->tune->gemm_applied && iha__tune_apply_gemm(ctx) != IHA_OK) iha__message_clear(&ctx->message);
}

void iha__tune_clblast_ready(iha_context *ctx)
{
    iha__tune_gemm_ready(ctx);
    iha_tune_config c;
    if (!ctx->gemm->config.own || ctx->tune->clblast_applied || !iha__tune_gemm_config(ctx, &c, NULL)) return;
    ctx->tune->clblast_applied = 1;
    if (iha__tune_gemm_clblast_apply(ctx, &c) != IHA_OK) iha__message_clear(&ctx->message);
}

void iha__tune_gemm_own_tile(iha_context *ctx, iha_gemm_config *out)
{
    iha_tune_config c;
    if (iha__tune_gemm_config(ctx, &c, NULL))
        iha__tune_gemm_own_config(&c, out);
    else
        iha__gemm_kernel_default(ctx, out);
    out->own = 1;
}
