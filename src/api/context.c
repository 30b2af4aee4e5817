/* Context creation and teardown: the options and the environment resolved in one place, then
 * the modules set up in their order (runtime, kernels, gemm, tune) and freed in reverse. This is
 * the only place that reads the environment. */
#include "gemm/sgemm.h"
#include "kernels/rope.h"
#include "layer/kv_cache.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "tune/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void iha_context_options_init(iha_context_options *options)
{
    if (options) memset(options, 0, sizeof *options);
}

static char *join_path(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *p = malloc(na + nb + 2);
    if (p == NULL) return NULL;
    memcpy(p, a, na);
    p[na] = '/';
    memcpy(p + na + 1, b, nb + 1);
    return p;
}

/* Explicit option, else IHA_CACHE_DIR, else $XDG_CACHE_HOME/iha, else ~/.cache/iha; "off" in
 * any case disables. *dir is NULL for no disk cache; returns 0 only on allocation failure. */
static int choose_cache_dir(const char *option, char **dir)
{
    *dir = NULL;
    const char *chosen = option ? option : getenv("IHA_CACHE_DIR");
    if (chosen != NULL && chosen[0] != '\0') {
        if (strcasecmp(chosen, "off") == 0) return 1;
        return (*dir = strdup(chosen)) != NULL;
    }
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg != NULL && xdg[0] == '/') return (*dir = join_path(xdg, "iha")) != NULL;
    const char *home = getenv("HOME");
    if (home == NULL || home[0] == '\0') return 1; /* nowhere sensible: run without a disk cache */
    return (*dir = join_path(home, ".cache/iha")) != NULL;
}

static iha_status setup(iha_context *ctx, const iha_context_options *o)
{
    char *cache_dir = NULL;
    IHA_RETURN_ERROR_IF(!choose_cache_dir(o->cache_dir, &cache_dir), ctx, IHA_ERROR_HOST_MEMORY,
                        "out of host memory");
    const char *kernel_dir = o->kernel_dir ? o->kernel_dir : getenv("IHA_KERNEL_DIR");
    /* A test hook, not an option: the tensor-core attention's emulated path on any device. */
    const char *mma_emulate = getenv("IHA_MMA_EMULATE");
    iha_runtime_options r = {
        .device = o->device ? o->device : getenv("IHA_DEVICE"),
        .opencl_context = o->opencl_context,
        .opencl_queue = o->opencl_queue,
        .cache_dir = cache_dir,
        .kernel_dir = kernel_dir != NULL && kernel_dir[0] != '\0' ? kernel_dir : NULL,
        .time_stages = o->time_stages,
        .mma_emulate = mma_emulate != NULL && strcmp(mma_emulate, "1") == 0,
    };
    iha_status st = iha__runtime_setup(ctx, &r);
    free(cache_dir);
    IHA_FORWARD_IF_ERROR(st);
    IHA_FORWARD_IF_ERROR(iha__rope_cache_init(ctx));
    IHA_FORWARD_IF_ERROR(iha__gemm_context_init(ctx));
    const char *profile = o->profile ? o->profile : getenv("IHA_PROFILE");
    return iha__tune_context_init(ctx, profile, o->tune_on_first_use, o->tune_budget_s);
}

iha_status iha_context_create(iha_context **out, const iha_context_options *options, char *message,
                              size_t message_size)
{
    if (message && message_size) message[0] = '\0';
    if (out == NULL) {
        if (message && message_size)
            snprintf(message, message_size, "out is NULL: iha_context_create needs a place for the new context");
        return IHA_ERROR_INVALID_ARGUMENT;
    }
    *out = NULL;
    iha_context_options defaults;
    iha_context_options_init(&defaults);
    const iha_context_options *o = options ? options : &defaults;

    iha_context *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        if (message && message_size) snprintf(message, message_size, "out of host memory");
        return IHA_ERROR_HOST_MEMORY;
    }
    iha_status st = setup(ctx, o);
    if (st != IHA_OK) {
        if (message && message_size) snprintf(message, message_size, "%s", iha__message_text(&ctx->message));
        iha_context_free(ctx);
        return st;
    }
    *out = ctx;
    return IHA_OK;
}

void iha_context_free(iha_context *ctx)
{
    if (ctx == NULL) return;
    iha__runtime_finish_pending(ctx);
    iha__kv_caches_detach(ctx);
    iha__gemm_context_free(ctx);
    iha__tune_context_free(ctx);
    iha__rope_cache_free(ctx);
    iha__runtime_release(ctx);
    free(ctx);
}
