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
    tu_rng rng = tu_rng_seeded(seed);
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

ref_problem tu_problem(const iha_shape *s, const iha_attention_options *options)
{
    return (ref_problem){.B = s->batch, .N = s->tokens, .D = s->model_dim, .H = s->heads, .d = s->head_dim,
                         .P = s->pseudo, .mask = options->mask, .window = (long long)options->window,
                         .scale = options->scale, .rope = options->rope, .rope_base = options->rope_base,
                         .seq_lens = options->seq_lens, .seq_count = options->seq_count};
}

ref_problem tu_layer_problem(const tu_layer *l, const iha_attention_options *options)
{
    ref_problem p = tu_problem(&l->shape, options);
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

double *tu_layer_with_reference(tu_layer *l, const iha_shape *shape, uint64_t seed,
                                const iha_attention_options *options)
{
    tu_layer_init(l, shape, seed);
    return tu_layer_reference(l, options);
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

void tu_layer_weights_release(iha_layer_weights *w)
{
    const iha_buffer all[8] = {w->wq, w->wk, w->wv, w->wo, w->alpha_q, w->alpha_k, w->alpha_v, w->r};
    for (int i = 0; i < 8; i++) tu_buffer_release(all[i].mem);
    memset(w, 0, sizeof *w);
}

void tu_device_layer_release(tu_device_layer *d)
{
    tu_layer_weights_release(&d->weights);
    tu_buffer_release(d->x.mem);
    tu_buffer_release(d->z.mem);
    memset(d, 0, sizeof *d);
}

void tu_assert_buffer_close(iha_context *ctx, const char *what, iha_buffer b, size_t n, const double *ref,
                            double tol)
{
    float *out = tu_malloc(n * sizeof *out);
    tu_buffer_read(ctx, b.mem, b.offset, out, n);
    tu_assert_guard(ctx, b.mem, n, b.offset, TU_GUARD, TU_SENTINEL);
    tu_assert_close(what, out, ref, n, tol);
    free(out);
}

void tu_check_random_core(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                          uint64_t seed, float qk_amplitude, int identity, const tu_core_layout *at)
{
    const size_t n = tu_count_heads(shape), nm = tu_count_mix(shape);
    tu_rng rng = tu_rng_seeded(seed);
    float *q = tu_random_array(&rng, n, qk_amplitude), *k = tu_random_array(&rng, n, qk_amplitude);
    float *v = tu_random_array(&rng, n, 1.0f);
    float *mix[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4 && !identity; i++)
        mix[i] = tu_random_array(&rng, nm, 1.0f / sqrtf((float)(shape->heads * (i == 3 ? shape->pseudo : 1))));
    ref_problem p = tu_problem(shape, options);
    p.alpha_q = mix[0], p.alpha_k = mix[1], p.alpha_v = mix[2], p.r = mix[3];
    double *yref = tu_malloc(n * sizeof *yref);
    assert_int_equal(ref_attention_core(&p, q, k, v, yref), 0);

    const size_t g = at->input_guard;
    iha_buffer qb = {tu_buffer_guarded(ctx, q, n, at->q, g, TU_SENTINEL), at->q};
    iha_buffer kb = {tu_buffer_guarded(ctx, k, n, at->k, g, TU_SENTINEL), at->k};
    iha_buffer vb = {tu_buffer_guarded(ctx, v, n, at->v, g, TU_SENTINEL), at->v};
    iha_buffer yb = {tu_buffer_guarded(ctx, NULL, n, at->y, TU_GUARD, TU_SENTINEL), at->y};
    iha_layer_weights w;
    memset(&w, 0, sizeof w);
    iha_buffer *wm[4] = {&w.alpha_q, &w.alpha_k, &w.alpha_v, &w.r};
    for (int i = 0; i < 4; i++)
        if (mix[i]) *wm[i] = (iha_buffer){tu_buffer_guarded(ctx, mix[i], nm, at->mix[i], TU_GUARD, TU_SENTINEL), at->mix[i]};

    tu_assert_status(ctx, iha_attention_core(ctx, shape, options, &w, qb, kb, vb, yb), IHA_OK);
    tu_assert_status(ctx, iha_context_finish(ctx), IHA_OK);
    tu_assert_buffer_close(ctx, "y (iha_attention_core)", yb, n, yref, TU_TOL_F32);
    tu_layer_weights_release(&w);
    tu_buffer_release(qb.mem), tu_buffer_release(kb.mem), tu_buffer_release(vb.mem), tu_buffer_release(yb.mem);
    for (int i = 0; i < 4; i++)
        free(mix[i]);
    free(q), free(k), free(v), free(yref);
}

void tu_check_decode_tokens(iha_context *ctx, const tu_layer *l, const tu_device_layer *dev,
                            const iha_attention_options *options, const double *zref, size_t tokens)
{
    const iha_shape *s = &l->shape;
    const size_t D = s->model_dim;
    const iha_shape step = {1, 1, D, s->heads, s->head_dim, s->pseudo};
    iha_kv_cache *cache = NULL;
    tu_assert_status(ctx, iha_kv_cache_create(ctx, s, IHA_STORAGE_F32, &cache), IHA_OK);
    cl_mem xs = tu_buffer_new(ctx, D), zs = tu_buffer_new(ctx, D);
    float *z = tu_malloc(D * sizeof *z);
    for (size_t n = 0; n < tokens; ++n) {
        tu_buffer_write(ctx, xs, 0, l->x + n * D, D);
        tu_assert_status(ctx,
                         iha_decode_step(ctx, cache, &step, options, &dev->weights, NULL, (iha_buffer){xs, 0},
                                         (iha_buffer){zs, 0}),
                         IHA_OK);
        tu_buffer_read(ctx, zs, 0, z, D);
        tu_assert_close("decoded z", z, zref + n * D, D, TU_TOL_F32);
    }
    free(z);
    tu_buffer_release(xs);
    tu_buffer_release(zs);
    iha_kv_cache_free(cache);
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
    tu_assert_buffer_close(ctx, offsets ? "z (iha_forward, offsets)" : "z (iha_forward)", d.z, nz, zref, tol);
    /* The inputs are read-only to the library. */
    tu_assert_guard(ctx, d.x.mem, nz, d.x.offset, TU_GUARD, TU_SENTINEL);
    float *x = tu_malloc(nz * sizeof *x);
    tu_buffer_read(ctx, d.x.mem, d.x.offset, x, nz);
    if (memcmp(x, l->x, nz * sizeof *x) != 0)
        fail_msg("iha_forward modified its input x");
    free(x);
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

void tu_check_random_layer(iha_context *ctx, const iha_shape *shape, uint64_t seed,
                           const iha_attention_options *options, tu_api api)
{
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, shape, seed, options);
    tu_layer_check_forward(ctx, &l, options, api, zref, TU_TOL_F32);
    free(zref);
    tu_layer_free(&l);
}

void tu_check_small_forward(iha_context *ctx, tu_api api)
{
    const iha_shape shape = {2, 9, 16, 2, 16, 2};
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.rope = 1;
    o.window = 3;
    tu_check_random_layer(ctx, &shape, 91, &o, api);
}

iha_host_weights tu_layer_host_weights(const tu_layer *l)
{
    return (iha_host_weights){l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
}
