/*
 * random_layer.c - drawing a random layer and keeping host and device copies of it.
 */
#include "common/random_layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fail.h"
#include "common/rng.h"
#include "common/timer.h"

/* a*b*c*sizeof(float), or 0 when it overflows. */
static size_t bytes_of(size_t a, size_t b, size_t c)
{
    size_t n = a;
    if (b && n > SIZE_MAX / b)
        return 0;
    n *= b;
    if (c && n > SIZE_MAX / c)
        return 0;
    n *= c;
    return n > SIZE_MAX / sizeof(float) ? 0 : n * sizeof(float);
}

static float *random_tensor(rng *g, size_t bytes, float scale)
{
    float *t = malloc(bytes);
    if (t)
        rng_fill(g, t, bytes / sizeof(float), scale);
    return t;
}

static cl_mem upload(cl_context cl, const float *host, size_t bytes, cl_int *status)
{
    cl_mem_flags flags = CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0);
    return clCreateBuffer(cl, flags, bytes, (void *)host, status);
}

int random_layer_create(iha_context *ctx, const iha_shape *s, uint64_t seed, random_layer *layer, char *err,
                        size_t err_size)
{
    memset(layer, 0, sizeof *layer);
    layer->shape = *s;
    size_t hd = s->heads * s->head_dim; /* both small: the caller bounds every dimension */
    size_t x_bytes = bytes_of(s->batch, s->tokens, s->model_dim);
    size_t w_bytes = bytes_of(s->model_dim, hd, 1);
    size_t mix_bytes = bytes_of(s->heads, s->heads, s->pseudo);
    if (!x_bytes || !w_bytes || !mix_bytes)
        return tool_fail(err, err_size, "the shape's tensors are too large for this machine");
    rng g = {seed};
    float w_scale = 1.0f / sqrtf((float)s->model_dim), o_scale = 1.0f / sqrtf((float)hd);
    /* A pseudo-head sums H heads; a collapsed head sums H*P pseudo-heads. */
    float mix_scale = 1.0f / sqrtf((float)s->heads), r_scale = 1.0f / sqrtf((float)(s->heads * s->pseudo));
    layer->x = random_tensor(&g, x_bytes, 1.0f);
    layer->wq = random_tensor(&g, w_bytes, w_scale);
    layer->wk = random_tensor(&g, w_bytes, w_scale);
    layer->wv = random_tensor(&g, w_bytes, w_scale);
    layer->wo = random_tensor(&g, w_bytes, o_scale);
    layer->alpha_q = random_tensor(&g, mix_bytes, mix_scale);
    layer->alpha_k = random_tensor(&g, mix_bytes, mix_scale);
    layer->alpha_v = random_tensor(&g, mix_bytes, mix_scale);
    layer->r = random_tensor(&g, mix_bytes, r_scale);
    layer->z = malloc(x_bytes);
    if (!layer->x || !layer->wq || !layer->wk || !layer->wv || !layer->wo || !layer->alpha_q || !layer->alpha_k ||
        !layer->alpha_v || !layer->r || !layer->z) {
        random_layer_free(layer);
        return tool_fail(err, err_size, "out of host memory");
    }
    cl_context cl = iha_context_cl_context(ctx);
    cl_int st[10];
    iha_layer_weights *w = &layer->weights;
    layer->x_mem = upload(cl, layer->x, x_bytes, &st[0]);
    layer->z_mem = upload(cl, NULL, x_bytes, &st[1]);
    w->wq.mem = upload(cl, layer->wq, w_bytes, &st[2]);
    w->wk.mem = upload(cl, layer->wk, w_bytes, &st[3]);
    w->wv.mem = upload(cl, layer->wv, w_bytes, &st[4]);
    w->wo.mem = upload(cl, layer->wo, w_bytes, &st[5]);
    w->alpha_q.mem = upload(cl, layer->alpha_q, mix_bytes, &st[6]);
    w->alpha_k.mem = upload(cl, layer->alpha_k, mix_bytes, &st[7]);
    w->alpha_v.mem = upload(cl, layer->alpha_v, mix_bytes, &st[8]);
    w->r.mem = upload(cl, layer->r, mix_bytes, &st[9]);
    for (int i = 0; i < 10; i++) {
        if (st[i] != CL_SUCCESS) {
            random_layer_free(layer);
            return tool_fail(err, err_size, "clCreateBuffer failed with OpenCL error %d", (int)st[i]);
        }
    }
    return 0;
}

/* A 16-bit copy of n floats in `storage`, or NULL (status set). */
static cl_mem upload_16bit(cl_context cl, const float *host, size_t n, iha_storage storage, cl_int *status)
{
    uint16_t *h = malloc(n * sizeof *h);
    if (!h) {
        *status = CL_OUT_OF_HOST_MEMORY;
        return NULL;
    }
    if (host && storage == IHA_STORAGE_BF16)
        iha_bf16_from_float(host, h, n);
    else if (host)
        iha_half_from_float(host, h, n);
    else
        memset(h, 0, n * sizeof *h);
    cl_mem m = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof *h, h, status);
    free(h);
    return m;
}

int random_layer_use_storage(iha_context *ctx, random_layer *layer, iha_storage storage, char *err,
                             size_t err_size)
{
    const iha_shape *s = &layer->shape;
    const size_t nx = s->batch * s->tokens * s->model_dim, nw = s->model_dim * s->heads * s->head_dim,
                 nm = s->heads * s->heads * s->pseudo;
    iha_layer_weights *w = &layer->weights;
    cl_mem *mems[10] = {&layer->x_mem, &layer->z_mem, &w->wq.mem, &w->wk.mem, &w->wv.mem,
                        &w->wo.mem, &w->alpha_q.mem, &w->alpha_k.mem, &w->alpha_v.mem, &w->r.mem};
    const float *host[10] = {layer->x, NULL, layer->wq, layer->wk, layer->wv,
                             layer->wo, layer->alpha_q, layer->alpha_k, layer->alpha_v, layer->r};
    const size_t counts[10] = {nx, nx, nw, nw, nw, nw, nm, nm, nm, nm};
    cl_mem fresh[10] = {NULL};
    cl_int st = CL_SUCCESS;
    for (int i = 0; i < 10 && st == CL_SUCCESS; i++)
        fresh[i] = upload_16bit(iha_context_cl_context(ctx), host[i], counts[i], storage, &st);
    if (st != CL_SUCCESS) {
        for (int i = 0; i < 10; i++)
            if (fresh[i]) clReleaseMemObject(fresh[i]);
        return tool_fail(err, err_size, "creating 16-bit buffers failed: OpenCL error %d", (int)st);
    }
    for (int i = 0; i < 10; i++) {
        clReleaseMemObject(*mems[i]);
        *mems[i] = fresh[i];
    }
    layer->storage = storage;
    return 0;
}

int random_layer_poison_output(iha_context *ctx, random_layer *layer, char *err, size_t err_size)
{
    const float nan = NAN;
    const uint16_t nan_half = layer->storage == IHA_STORAGE_BF16 ? 0x7fc0u : 0x7e00u;
    size_t bytes = bytes_of(layer->shape.batch, layer->shape.tokens, layer->shape.model_dim);
    cl_command_queue queue = iha_context_cl_queue(ctx);
    cl_int st = layer->storage != IHA_STORAGE_F32
                    ? clEnqueueFillBuffer(queue, layer->z_mem, &nan_half, sizeof nan_half, 0, bytes / 2, 0, NULL, NULL)
                    : clEnqueueFillBuffer(queue, layer->z_mem, &nan, sizeof nan, 0, bytes, 0, NULL, NULL);
    if (st == CL_SUCCESS)
        st = clFinish(queue);
    return st == CL_SUCCESS ? 0 : tool_fail(err, err_size, "filling the output with NaN failed: OpenCL error %d", (int)st);
}

int random_layer_read_output(iha_context *ctx, random_layer *layer, char *err, size_t err_size)
{
    size_t bytes = bytes_of(layer->shape.batch, layer->shape.tokens, layer->shape.model_dim);
    if (layer->storage == IHA_STORAGE_F32) {
        cl_int st = clEnqueueReadBuffer(iha_context_cl_queue(ctx), layer->z_mem, CL_TRUE, 0, bytes, layer->z, 0, NULL,
                                        NULL);
        return st == CL_SUCCESS ? 0 : tool_fail(err, err_size, "reading the output failed: OpenCL error %d", (int)st);
    }
    uint16_t *h = malloc(bytes / 2);
    if (!h)
        return tool_fail(err, err_size, "out of host memory reading the output");
    cl_int st = clEnqueueReadBuffer(iha_context_cl_queue(ctx), layer->z_mem, CL_TRUE, 0, bytes / 2, h, 0, NULL, NULL);
    if (st == CL_SUCCESS && layer->storage == IHA_STORAGE_BF16)
        iha_bf16_to_float(h, layer->z, bytes / sizeof(float));
    else if (st == CL_SUCCESS)
        iha_half_to_float(h, layer->z, bytes / sizeof(float));
    free(h);
    return st == CL_SUCCESS ? 0 : tool_fail(err, err_size, "reading the output failed: OpenCL error %d", (int)st);
}

static void release(cl_mem *mem)
{
    if (*mem)
        clReleaseMemObject(*mem);
    *mem = NULL;
}

void random_layer_free(random_layer *layer)
{
    release(&layer->x_mem);
    release(&layer->z_mem);
    release(&layer->weights.wq.mem);
    release(&layer->weights.wk.mem);
    release(&layer->weights.wv.mem);
    release(&layer->weights.wo.mem);
    release(&layer->weights.alpha_q.mem);
    release(&layer->weights.alpha_k.mem);
    release(&layer->weights.alpha_v.mem);
    release(&layer->weights.r.mem);
    float **host[] = {&layer->x, &layer->wq, &layer->wk, &layer->wv, &layer->wo,
                      &layer->alpha_q, &layer->alpha_k, &layer->alpha_v, &layer->r, &layer->z};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) {
        free(*host[i]);
        *host[i] = NULL;
    }
}

int random_layer_grads_create(iha_context *ctx, const iha_shape *shape, random_layer_grads *g, char *err,
                              size_t err_size)
{
    const size_t x = shape->batch * shape->tokens * shape->model_dim, w = shape->model_dim * shape->heads * shape->head_dim,
                 mix = shape->heads * shape->heads * shape->pseudo;
    memset(g, 0, sizeof *g);
    for (int i = 0; i < 9; i++) {
        cl_int e = CL_SUCCESS;
        const size_t count = i == 0 ? x : i < 5 ? w : mix;
        g->mem[i] = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, count * sizeof(float), NULL, &e);
        if (e != CL_SUCCESS) {
            snprintf(err, err_size, "clCreateBuffer for a gradient failed (%d)", (int)e);
            random_layer_grads_free(g);
            return -1;
        }
    }
    size_t saved = 0;
    iha_status st = iha_saved_elements(ctx, shape, &saved);
    cl_int e = CL_SUCCESS;
    if (st == IHA_OK)
        g->saved = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, saved * sizeof(float), NULL, &e);
    if (st != IHA_OK || e != CL_SUCCESS) {
        snprintf(err, err_size, "the saved state: %s", st != IHA_OK ? iha_context_message(ctx) : "clCreateBuffer failed");
        random_layer_grads_free(g);
        return -1;
    }
    return 0;
}

void random_layer_grads_free(random_layer_grads *g)
{
    for (int i = 0; i < 9; i++) {
        if (g->mem[i]) clReleaseMemObject(g->mem[i]);
        g->mem[i] = NULL;
    }
    if (g->saved) clReleaseMemObject(g->saved);
    g->saved = NULL;
}

/* iha_backward, or with `from_saved` iha_backward_saved. */
static iha_status backward(iha_context *ctx, random_layer *layer, const iha_attention_options *options,
                           const random_layer_grads *g, int from_saved)
{
    iha_buffer b[9];
    for (int i = 0; i < 9; i++) b[i] = (iha_buffer){g->mem[i], 0};
    const iha_layer_grads grads = {b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8]};
    const iha_buffer x = {layer->x_mem, 0}, dz = {layer->z_mem, 0};
    iha_status st = from_saved ? iha_backward_saved(ctx, &layer->shape, options, &layer->weights, x,
                                                    (iha_buffer){g->saved, 0}, dz, b[0], &grads)
                               : iha_backward(ctx, &layer->shape, options, &layer->weights, x, dz, b[0], &grads);
    return st == IHA_OK ? iha_context_finish(ctx) : st;
}

iha_status random_layer_backward(iha_context *ctx, random_layer *layer, const iha_attention_options *options,
                                 const random_layer_grads *g)
{
    return backward(ctx, layer, options, g, 0);
}

iha_status random_layer_backward_saved(iha_context *ctx, random_layer *layer, const iha_attention_options *options,
                                       const random_layer_grads *g)
{
    return backward(ctx, layer, options, g, 1);
}

iha_status random_layer_forward_save(iha_context *ctx, random_layer *layer, const iha_attention_options *options,
                                     const random_layer_grads *g)
{
    iha_status st = iha_forward_save(ctx, &layer->shape, options, &layer->weights, (iha_buffer){layer->x_mem, 0},
                                     (iha_buffer){layer->z_mem, 0}, (iha_buffer){g->saved, 0});
    return st == IHA_OK ? iha_context_finish(ctx) : st;
}

iha_host_weights random_layer_host_weights(const random_layer *l)
{
    return (iha_host_weights){l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
}

iha_status random_layer_forward(iha_context *ctx, random_layer *l, const iha_attention_options *options)
{
    const iha_status st = iha_forward(ctx, &l->shape, options, &l->weights, (iha_buffer){l->x_mem, 0},
                                      (iha_buffer){l->z_mem, 0});
    return st == IHA_OK ? iha_context_finish(ctx) : st;
}

int random_layer_time_forward(iha_context *ctx, random_layer *layer, const iha_attention_options *options,
                              size_t reps, double *wall, iha_stage_times *stages, char *err, size_t err_size)
{
    /* One series per stage and one of wall times, each `reps` long. */
    double *samples = malloc(6 * reps * sizeof *samples);
    if (!samples)
        return tool_fail(err, err_size, "out of host memory");
    double *series[6];
    for (size_t k = 0; k < 6; k++)
        series[k] = samples + k * reps;
    iha_status st = IHA_OK;
    for (size_t i = 0; i < reps && st == IHA_OK; i++) {
        const double start = timer_seconds();
        st = random_layer_forward(ctx, layer, options);
        series[0][i] = timer_seconds() - start;
        iha_stage_times t;
        iha_context_stage_times(ctx, &t);
        series[1][i] = t.projections;
        series[2][i] = t.mixing;
        series[3][i] = t.attention;
        series[4][i] = t.collapse;
        series[5][i] = t.output;
    }
    if (st == IHA_OK) {
        *wall = timer_median(series[0], reps);
        *stages = (iha_stage_times){timer_median(series[1], reps), timer_median(series[2], reps),
                                    timer_median(series[3], reps), timer_median(series[4], reps),
                                    timer_median(series[5], reps)};
    }
    free(samples);
    if (st != IHA_OK)
        return tool_fail(err, err_size, "%s: %s", iha_status_name(st), iha_context_message(ctx));
    return 0;
}
