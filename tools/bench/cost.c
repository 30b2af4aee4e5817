/*
 * cost.c - closed forms for the visible pairs of each mask, and the per-stage FLOPs of cost.h.
 */
#include "bench/cost.h"

/* sum over i = 0 .. n-1 of min(i + 1, cap): the keys seen by n consecutive queries when each
 * sees everything before it and itself, but at most `cap` keys. */
static double sum_capped(double n, double cap)
{
    if (cap >= n)
        return n * (n + 1) / 2;
    return cap * (cap + 1) / 2 + (n - cap) * cap;
}

double cost_visible_pairs(const iha_shape *shape, const iha_attention_options *options)
{
    double n = (double)shape->tokens, p = (double)shape->pseudo;
    /* A window of at least N tokens hides nothing; comparing in tokens avoids W*P overflow. */
    double w = options->window > 0 && (double)options->window < n ? (double)options->window : n;
    switch (options->mask) {
    case IHA_MASK_TOKEN_CAUSAL: /* P queries of token n see the P keys of min(n+1, W) tokens */
        return p * p * sum_capped(n, w);
    case IHA_MASK_NONE: /* tokens m with |n - m| < W: both sides of n, n itself once */
        return p * p * (2 * sum_capped(n, w) - n);
    default: /* causal over the virtual sequence: t sees min(t + 1, W*P) keys */
        return sum_capped(n * p, w * p);
    }
}

void cost_layer_flops(const iha_shape *shape, const iha_attention_options *options, cost_flops *out)
{
    double b = (double)shape->batch, n = (double)shape->tokens, dm = (double)shape->model_dim;
    double h = (double)shape->heads, d = (double)shape->head_dim, p = (double)shape->pseudo;
    out->projections = 3 * 2 * b * n * dm * h * d;
    out->mixing = 3 * 2 * b * n * h * h * p * d;
    out->attention = 4 * d * b * h * cost_visible_pairs(shape, options);
    out->collapse = 2 * b * n * h * h * p * d;
    out->output = 2 * b * n * dm * h * d;
}

double cost_total(const cost_flops *flops)
{
    return flops->projections + flops->mixing + flops->attention + flops->collapse + flops->output;
}
