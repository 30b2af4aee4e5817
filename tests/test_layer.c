/*
 * test_layer.c - random layers on host and device, their reference, and the checked forward run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "test_layer.h"

size_t tu_count_x(const iha_shape *s)
{
    return s->batch * s->tokens * s->model_dim;
}

size_t tu_count_w(const iha_shape *s)
{
    return s->model_dim * s->heads * s->head_dim;
}

size_t tu_count_mix(const iha_shape *s)
{
    return s->heads * s->heads * s->pseudo;
}

size_t tu_count_heads(const iha_shape *s)
{
    return s->batch * s->tokens * s->heads * s->head_dim;
}

size_t tu_count_virtual(const iha_shape *s)
{
    return s->batch * s->heads * s->tokens * s->pseudo * s->head_dim;
}

void tu_layer_init(tu_layer *l, const iha_shape *shape, uint64_t seed)
{
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    l->shape = *shape;
    size_t nw = tu_count_w(shape), nm = tu_count_mix(shape);
    float D = (float)shape->model_dim, H = (float)shape->heads;
    float HD = (float)(shape->heads * shape->head_dim), HP = (float)(shape->heads * shape->pseudo);
    /* Magnitudes in [0.1, 1] have mean square 0.37: these amplitudes give Qt and Kt entries of
     * about 0.9 in size, so scores (dot / sqrt(d)) of order 1. */
    l->x = tu_random_array(&rng, tu_count_x(shape), 1.0f);
    l->wq = tu_random_array(&rng, nw, 4.0f / sqrtf(D));
    l->wk = tu_random_array(&rng, nw, 4.0f / sqrtf(D));
    l->wv = tu_random_array(&rng, nw, 1.0f / sqrtf(D));
    l->wo = tu_random_array(&rng, nw, 1.0f / sqrtf(HD));
    l->alpha_q = tu_random_array(&rng, nm, 1.0f / sqrtf(H));
    l->alpha_k = tu_random_array(&rng, nm, 1.0f / sqrtf(H));
    l->alpha_v = tu_random_array(&rng, nm, 1.0f / sqrtf(H));
    l->r = tu_random_array(&rng, nm, 1.0f / sqrtf(HP));
}

void tu_layer_identity(tu_layer *l, int as_null)
{
    assert_int_equal(l->shape.pseudo, 1);
    float **mix[4] = {&l->alpha_q, &l->alpha_k, &l->alpha_v, &l->r};
    size_t H = l->shape.heads;
    for (int i = 0; i < 4; i++) {
        free(*mix[i]);
        *mix[i] = NULL;
        if (as_null)
            continue;
        *mix[i] = tu_malloc(H * H * sizeof(float));
        for (size_t a = 0; a < H; a++)
            for (size_t b = 0; b < H; b++)
                (*mix[i])[a * H + b] = a == b ? 1.0f : 0.0f;
    }
}

void tu_layer_free(tu_layer *l)
{
    float *arrays[9] = {l->x, l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    for (int i = 0; i < 9; i++)
        free(arrays[i]);
    memset(l, 0, sizeof *l);
}

iha_attention_options tu_options(int mask, int64_t window, int rope)
{
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.mask = mask;
    o.window = window;
    o.rope = rope;
    return o;
}

ref_problem tu_layer_problem(const tu_layer *l, const iha_attention_options *options)
{
    ref_problem p;
    memset(&p, 0, sizeof p);
    p.B = l->shape.batch;
    p.N = l->shape.tokens;
    p.D = l->shape.model_dim;
    p.H = l->shape.heads;
    p.d = l->shape.head_dim;
    p.P = l->shape.pseudo;
    p.mask = options->mask;
    p.window = (long long)options->window;
    p.scale = options->scale;
    p.rope = options->rope;
    p.rope_base = options->rope_base;
    p.x = l->x;
    p.wq = l->wq;
    p.wk = l->wk;
    p.wv = l->wv;
    p.wo = l->wo;
    p.alpha_q = l->alpha_q;
    p.alpha_k = l->alpha_k;
    p.alpha_v = l->alpha_v;
    p.r = l->r;
    return p;
}

double *tu_layer_reference(const tu_layer *l, const iha_attention_options *options)
{
    ref_problem p = tu_layer_problem(l, options);
    double *z = tu_malloc(tu_count_x(&l->shape) * sizeof *z);
    if (ref_forward(&p, NULL, 0, z) != 0)
        fail_msg("ref_forward refused the problem or ran out of memory");
    return z;
}

/* Per-tensor offsets for TU_API_DEVICE_OFFSETS: odd, different, and not multiples of 4. */
enum { OFF_X = 3, OFF_Z = 5, OFF_WQ = 1, OFF_WK = 7, OFF_WV = 2, OFF_WO = 11, OFF_AQ = 13, OFF_AK = 1,
       OFF_AV = 6, OFF_R = 9 };

static iha_buffer upload(iha_context *ctx, const float *data, size_t n, size_t offset)
{
    iha_buffer b = {NULL, offset};
    if (data)
        b.mem = tu_buffer_guarded(ctx, data, n, offset, TU_GUARD, TU_SENTINEL);
    return b;
}

void tu_device_layer_upload(iha_context *ctx, const tu_layer *l, int offsets, tu_device_layer *out)
{
    const iha_shape *s = &l->shape;
    size_t nx = tu_count_x(s), nw = tu_count_w(s), nm = tu_count_mix(s);
    int o = offsets != 0;
    memset(out, 0, sizeof *out);
    out->x = upload(ctx, l->x, nx, o ? OFF_X : 0);
    out->z = (iha_buffer){tu_buffer_guarded(ctx, NULL, nx, o ? OFF_Z : 0, TU_GUARD, TU_SENTINEL), o ? OFF_Z : 0};
    out->weights.wq = upload(ctx, l->wq, nw, o ? OFF_WQ : 0);
    out->weights.wk = upload(ctx, l->wk, nw, o ? OFF_WK : 0);
    out->weights.wv = upload(ctx, l->wv, nw, o ? OFF_WV : 0);
    out->weights.wo = upload(ctx, l->wo, nw, o ? OFF_WO : 0);
    out->weights.alpha_q = upload(ctx, l->alpha_q, nm, o ? OFF_AQ : 0);
    out->weights.alpha_k = upload(ctx, l->alpha_k, nm, o ? OFF_AK : 0);
    out->weights.alpha_v = upload(ctx, l->alpha_v, nm, o ? OFF_AV : 0);
    out->weights.r = upload(ctx, l->r, nm, o ? OFF_R : 0);
}

void tu_device_layer_release(tu_device_layer *d)
{
    iha_buffer *all[10] = {&d->x, &d->z, &d->weights.wq, &d->weights.wk, &d->weights.wv, &d->weights.wo,
                           &d->weights.alpha_q, &d->weights.alpha_k, &d->weights.alpha_v, &d->weights.r};
    for (int i = 0; i < 10; i++)
        tu_buffer_release(all[i]->mem);
    memset(d, 0, sizeof *d);
}

const char *tu_api_name(tu_api api)
{
    switch (api) {
    case TU_API_DEVICE:
        return "device";
    case TU_API_DEVICE_OFFSETS:
        return "offsets";
    default:
        return "host";
    }
}

static void check_forward_host(iha_context *ctx, const tu_layer *l, const iha_attention_options *options,
                               const double *zref, double tol)
{
    size_t nz = tu_count_x(&l->shape);
    float *z = tu_malloc((nz + TU_GUARD) * sizeof *z);
    tu_fill_nan(z, nz);
    tu_fill_value(z + nz, TU_GUARD, TU_SENTINEL);
    iha_host_weights w = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    iha_status status = iha_forward_host(ctx, &l->shape, options, &w, l->x, z);
    tu_assert_status(ctx, status, IHA_OK);
    for (size_t i = 0; i < TU_GUARD; i++)
        if (memcmp(&z[nz + i], &(float){TU_SENTINEL}, sizeof(float)) != 0)
            fail_msg("iha_forward_host wrote past the end of z (element %zu after it)", i);
    tu_assert_close("z (iha_forward_host)", z, zref, nz, tol);
    free(z);
}

static void check_forward_device(iha_context *ctx, const tu_layer *l, const iha_attention_options *options,
                                 int offsets, const double *zref, double tol)
{
    size_t nz = tu_count_x(&l->shape);
    tu_device_layer d;
    tu_device_layer_upload(ctx, l, offsets, &d);
    iha_status status = iha_forward(ctx, &l->shape, options, &d.weights, d.x, d.z);
    tu_assert_status(ctx, status, IHA_OK);
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    float *z = tu_malloc(nz * sizeof *z);
    tu_buffer_read(ctx, d.z.mem, d.z.offset, z, nz);
    tu_assert_guard(ctx, d.z.mem, nz, d.z.offset, TU_GUARD, TU_SENTINEL);
    tu_assert_close(offsets ? "z (iha_forward, offsets)" : "z (iha_forward)", z, zref, nz, tol);
    /* The inputs are read-only to the library. */
    tu_assert_guard(ctx, d.x.mem, nz, d.x.offset, TU_GUARD, TU_SENTINEL);
    float *x = tu_malloc(nz * sizeof *x);
    tu_buffer_read(ctx, d.x.mem, d.x.offset, x, nz);
    if (memcmp(x, l->x, nz * sizeof *x) != 0)
        fail_msg("iha_forward modified its input x");
    free(x);
    free(z);
    tu_device_layer_release(&d);
}

void tu_layer_check_forward(iha_context *ctx, const tu_layer *l, const iha_attention_options *options,
                            tu_api api, const double *zref, double tol)
{
    if (api == TU_API_HOST)
        check_forward_host(ctx, l, options, zref, tol);
    else
        check_forward_device(ctx, l, options, api == TU_API_DEVICE_OFFSETS, zref, tol);
}
