/*
 * cmd_generate_check.c - "iha generate-check": generation as an application runs it. A random
 * layer's tokens go through a KV cache one at a time (iha_decode_step), and every step's output
 * is compared with the same row of one full forward pass (iha_forward). Reports tokens per
 * second and cache bytes per token.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "commands/cli.h"
#include "common/layer_options.h"
#include "iha.h"
#include "common/mask_names.h"
#include "common/random_layer.h"
#include "common/timer.h"

static cli_option options[] = {
    CLI_OPTION_DEVICE,
    CLI_OPTION_TOKENS("tokens to generate (default 256)"),
    CLI_OPTION_MODEL_DIM("model width (default 256)"),
    CLI_OPTION_HEADS("8"),
    CLI_OPTION_HEAD_DIM("64"),
    CLI_OPTION_PSEUDO("4"),
    CLI_OPTION_MASK("causal or token_causal (default causal)"),
    CLI_OPTION_WINDOW("sliding window in tokens (default 0: global)"),
    CLI_OPTION_ROPE_BASE("apply rotary embedding with this base (default off)"),
    {"half", NULL, "store the cache in half precision (arithmetic stays float)", NULL},
    {"compact", NULL, "the compact cache: the heads' own keys and values, 1/P of the pseudo-token cache's bytes", NULL},
    {"cache-tokens", "L", "keep only each sequence's last L tokens, a ring (needs --window W <= L; default 0: all N)",
     NULL},
    CLI_OPTION_SEED,
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "generate-check",
    "[options]",
    "Feeds a random layer's N tokens one at a time through a pseudo-token KV cache (with --compact\n"
    "the compact one, which mixes the heads' own keys and values on read) and compares\n"
    "every step's output with the same row of a full forward pass (relative L2 error at most 1e-5\n"
    "with a float cache, 2e-3 with --half). Reports tokens per second and cache bytes per token.\n"
    "With --cache-tokens L below N the cache is a ring that keeps the last L tokens, so N may be\n"
    "far past L in memory that does not grow with N.\n"
    "Exit status: 0 success, 1 failure or check failed, 2 usage.",
    options,
};

typedef struct check_config {
    iha_shape shape;
    iha_attention_options options;
    iha_storage storage;
    size_t cache_tokens;
    int compact;
    uint64_t seed;
} check_config;

static int read_options(check_config *c)
{
    c->shape = (iha_shape){.batch = 1, .tokens = 256, .model_dim = 256, .heads = 8, .head_dim = 64, .pseudo = 4};
    iha_attention_options_init(&c->options);
    size_t seed = 1;
    c->cache_tokens = 0;
    iha_shape *s = &c->shape;
    if (cli_get_shape(&spec, 1 << 20, s) || cli_get_attention(&spec, 0, 1 << 24, &c->options) ||
        cli_get_size(&spec, "seed", 0, SIZE_MAX, &seed) || cli_get_size(&spec, "cache-tokens", 0, SIZE_MAX, &c->cache_tokens))
        return -1;
    /* Without a mask every token sees the later ones in the full pass, which a step that has
     * only the cached tokens cannot: the check would fail on every run. */
    if (c->options.mask == IHA_MASK_NONE) {
        cli_error(&spec, "--mask none lets tokens see later ones, which generation token by token cannot "
                         "(use causal or token_causal)");
        return -1;
    }
    c->storage = cli_get(&spec, "half") ? IHA_STORAGE_F16 : IHA_STORAGE_F32;
    c->compact = cli_get(&spec, "compact") != NULL;
    c->seed = seed;
    return cli_check_layer(&spec, s, &c->options, "the layer");
}

static int library_error(iha_context *ctx, iha_status st)
{
    cli_error(&spec, "%s: %s", iha_status_name(st), iha_context_message(ctx));
    return CLI_EXIT_FAILURE;
}

/* Generates token by token; accumulates the squared error against the full pass. */
static int generate(iha_context *ctx, const check_config *c, random_layer *layer, iha_kv_cache *cache, cl_mem xs,
                    cl_mem zs, double *err2, double *ref2, double *worst, double *seconds)
{
    const iha_shape *s = &c->shape;
    const size_t D = s->model_dim;
    const iha_shape step = {1, 1, D, s->heads, s->head_dim, s->pseudo};
    cl_command_queue q = iha_context_cl_queue(ctx);
    float *z = malloc(D * sizeof *z);
    if (!z) {
        cli_error(&spec, "out of memory");
        return CLI_EXIT_FAILURE;
    }
    const double start = timer_seconds();
    for (size_t n = 0; n < s->tokens; ++n) {
        cl_int e = clEnqueueWriteBuffer(q, xs, CL_FALSE, 0, D * sizeof(float), layer->x + n * D, 0, NULL, NULL);
        iha_status st = e == CL_SUCCESS
                            ? iha_decode_step(ctx, cache, &step, &c->options, &layer->weights, NULL,
                                              (iha_buffer){xs, 0}, (iha_buffer){zs, 0})
                            : IHA_ERROR_OPENCL;
        if (st == IHA_OK) e = clEnqueueReadBuffer(q, zs, CL_TRUE, 0, D * sizeof(float), z, 0, NULL, NULL);
        if (st != IHA_OK || e != CL_SUCCESS) {
            free(z);
            if (st != IHA_OK) return library_error(ctx, st);
            cli_error(&spec, "reading the step's output failed (OpenCL error %d)", (int)e);
            return CLI_EXIT_FAILURE;
        }
        double e2 = 0, r2 = 0;
        for (size_t i = 0; i < D; ++i) {
            const double ref = layer->z[n * D + i], diff = (double)z[i] - ref;
            e2 += diff * diff;
            r2 += ref * ref;
        }
        *err2 += e2;
        *ref2 += r2;
        const double rel = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
        if (!(rel <= *worst)) *worst = rel; /* NaN sticks */
    }
    *seconds = timer_seconds() - start;
    free(z);
    return CLI_EXIT_OK;
}

int cmd_generate_check(int argc, char **argv)
{
    int rc = cli_parse(&spec, argc, argv);
    if (rc >= 0) return rc;
    check_config c;
    if (read_options(&c)) return CLI_EXIT_USAGE;

    iha_context *ctx;
    if (cli_open_context(&spec, NULL, &ctx)) return CLI_EXIT_FAILURE;
    char why[1024];
    random_layer layer;
    iha_kv_cache *cache = NULL;
    cl_mem xs = NULL, zs = NULL;
    rc = CLI_EXIT_FAILURE;
    if (random_layer_create(ctx, &c.shape, c.seed, &layer, why, sizeof why)) {
        cli_error(&spec, "%s", why);
        iha_context_free(ctx);
        return CLI_EXIT_FAILURE;
    }
    iha_status st = iha_forward(ctx, &c.shape, &c.options, &layer.weights, (iha_buffer){layer.x_mem, 0},
                                (iha_buffer){layer.z_mem, 0});
    if (st == IHA_OK) st = iha_context_finish(ctx);
    if (st != IHA_OK) {
        rc = library_error(ctx, st);
        goto done;
    }
    if (random_layer_read_output(ctx, &layer, why, sizeof why)) {
        cli_error(&spec, "%s", why);
        goto done;
    }
    iha_kv_cache_options co;
    iha_kv_cache_options_init(&co);
    co.storage = (int)c.storage;
    co.window = c.options.window;
    co.cache_tokens = c.cache_tokens;
    co.compact = c.compact;
    st = iha_kv_cache_create_with(ctx, &c.shape, &co, &cache);
    if (st != IHA_OK) {
        rc = library_error(ctx, st);
        goto done;
    }
    cl_int e1 = CL_SUCCESS, e2 = CL_SUCCESS;
    xs = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_ONLY, c.shape.model_dim * sizeof(float), NULL, &e1);
    zs = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_WRITE_ONLY, c.shape.model_dim * sizeof(float), NULL, &e2);
    if (e1 != CL_SUCCESS || e2 != CL_SUCCESS) {
        cli_error(&spec, "clCreateBuffer failed (%d, %d)", (int)e1, (int)e2);
        goto done;
    }
    double err2 = 0, ref2 = 0, worst = 0, seconds = 0;
    rc = generate(ctx, &c, &layer, cache, xs, zs, &err2, &ref2, &worst, &seconds);
    if (rc != CLI_EXIT_OK) goto done;

    const iha_shape *s = &c.shape;
    const double limit = c.storage == IHA_STORAGE_F16 ? 2e-3 : 1e-5;
    const double rel = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    const int ok = rel <= limit && worst <= limit;
    printf("  device  %s\n", iha_context_device_name(ctx));
    printf("  layer   N=%zu D=%zu H=%zu d=%zu P=%zu, mask %s, window %lld, rotary %s, cache %s%s\n", s->tokens,
           s->model_dim, s->heads, s->head_dim, s->pseudo, mask_names[c.options.mask], (long long)c.options.window,
           c.options.rope ? "on" : "off", c.storage == IHA_STORAGE_F16 ? "half" : "float",
           c.compact ? ", compact" : ", pseudo-token");
    printf("  steps   %zu tokens one at a time in %.3f s: %.1f tokens/s (host copies and a blocking read per step "
           "included)\n",
           s->tokens, seconds, (double)s->tokens / seconds);
    const int ring = c.cache_tokens > 0 && c.cache_tokens < s->tokens;
    printf("  cache   %zu bytes, %zu bytes per token generated, holding %zu tokens%s\n", iha_kv_cache_bytes(cache),
           iha_kv_cache_bytes(cache) / s->tokens, ring ? c.cache_tokens : s->tokens, ring ? " (a ring)" : "");
    printf("  check   every step vs the full forward pass: relative L2 error %.2e overall, worst step %.2e (limit "
           "%.0e) %s\n",
           rel, worst, limit, ok ? "ok" : "FAILED");
    rc = ok ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
done:
    if (xs) clReleaseMemObject(xs);
    if (zs) clReleaseMemObject(zs);
    iha_kv_cache_free(cache);
    random_layer_free(&layer);
    iha_context_free(ctx);
    return rc;
}
