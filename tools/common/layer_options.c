/*
 * layer_options.c - the shared shape and attention options of layer_options.h, the library's
 * limits on a shape, and the context a command opens.
 */
#include "common/layer_options.h"

#include <limits.h>
#include <stdint.h>

#include "common/mask_names.h"

int cli_get_shape(const cli_spec *spec, size_t max_tokens, iha_shape *s)
{
    return cli_get_size(spec, "batch", 1, 1 << 16, &s->batch) || cli_get_size(spec, "n", 1, max_tokens, &s->tokens) ||
                   cli_get_size(spec, "model-dim", 1, 1 << 16, &s->model_dim) ||
                   cli_get_size(spec, "heads", 1, 1024, &s->heads) ||
                   cli_get_size(spec, "d", 1, CLI_MAX_HEAD_DIM, &s->head_dim) ||
                   cli_get_size(spec, "p", 1, 256, &s->pseudo)
               ? -1
               : 0;
}

int cli_get_attention(const cli_spec *spec, size_t min_window, size_t max_window, iha_attention_options *o)
{
    int mask = o->mask;
    size_t window = (size_t)o->window;
    float rope_base = o->rope_base;
    if (cli_get_choice(spec, "mask", mask_names, &mask) || cli_get_size(spec, "window", min_window, max_window, &window) ||
        cli_get_positive_float(spec, "rope-base", &rope_base))
        return -1;
    o->mask = mask;
    o->window = (int64_t)window;
    if (cli_get(spec, "rope-base")) {
        o->rope = 1;
        o->rope_base = rope_base;
    }
    return 0;
}

/* a * b > limit, without computing a product that could overflow. */
static int product_above(size_t a, size_t b, size_t limit) { return b && a > limit / b; }

int cli_check_layer(const cli_spec *spec, const iha_shape *s, const iha_attention_options *o, const char *what)
{
    if (s->head_dim > CLI_MAX_HEAD_DIM) {
        cli_error(spec, "%s: head width d = %zu is above the library's limit of %d", what, s->head_dim,
                  CLI_MAX_HEAD_DIM);
        return -1;
    }
    if (product_above(s->tokens, s->pseudo, INT_MAX / 4)) {
        cli_error(spec, "%s: T = N*P = %zu*%zu virtual tokens is above the library's limit of %d", what, s->tokens,
                  s->pseudo, INT_MAX / 4);
        return -1;
    }
    if (product_above(s->heads, s->pseudo, INT_MAX) || product_above(s->batch, s->heads, INT_MAX)) {
        cli_error(spec, "%s: H*P = %zu*%zu or B*H = %zu*%zu is above the library's limit of %d", what, s->heads,
                  s->pseudo, s->batch, s->heads, INT_MAX);
        return -1;
    }
    if (product_above(s->tokens, s->model_dim, (size_t)INT_MAX * 8)) {
        cli_error(spec, "%s: N*D = %zu*%zu is above the library's limit of %zu", what, s->tokens, s->model_dim,
                  (size_t)INT_MAX * 8);
        return -1;
    }
    if (o && o->rope && s->head_dim % 2) {
        cli_error(spec, "%s: rotary embedding (--rope-base) rotates pairs of channels and needs an even head "
                        "width, got d = %zu", what, s->head_dim);
        return -1;
    }
    return 0;
}

int cli_open_context(const cli_spec *spec, const iha_context_options *options, iha_context **ctx)
{
    iha_context_options o;
    if (options)
        o = *options;
    else
        iha_context_options_init(&o);
    o.device = cli_get(spec, "device");
    *ctx = NULL;
    char message[1024];
    const iha_status st = iha_context_create(ctx, &o, message, sizeof message);
    if (st != IHA_OK) {
        cli_error(spec, "%s: %s", iha_status_name(st), message);
        return -1;
    }
    return 0;
}

int cli_open_timed_context(const cli_spec *spec, iha_context **ctx)
{
    iha_context_options o;
    iha_context_options_init(&o);
    o.time_stages = 1;
    return cli_open_context(spec, &o, ctx);
}
