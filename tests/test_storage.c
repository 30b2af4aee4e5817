/*
 * test_storage.c - the per-call checks of a 16-bit storage, shared by test_half.c and test_bf16.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "test_layer.h"
#include "test_storage.h"

const char *tu_storage_name(int storage)
{
    return storage == IHA_STORAGE_F16 ? "half" : storage == IHA_STORAGE_BF16 ? "bfloat16" : "float";
}

iha_buffer tu_storage_upload(int storage, const float *data, size_t n, size_t offset)
{
    return (iha_buffer){tu_tensor_guarded(tu_ctx, storage, data, n, offset, TU_GUARD, TU_SENTINEL), offset};
}

void tu_storage_read(int storage, iha_buffer b, size_t n, float *out, const char *what)
{
    tu_tensor_read_checked(tu_ctx, storage, b.mem, n, b.offset, TU_GUARD, TU_SENTINEL, out, what);
}

iha_layer_weights tu_storage_upload_weights(const tu_layer *l, int storage, size_t first)
{
    const size_t nw = tu_count_w(&l->shape), nm = tu_count_mix(&l->shape);
    const float *host[8] = {l->wq, l->wk, l->wv, l->wo, l->alpha_q, l->alpha_k, l->alpha_v, l->r};
    iha_buffer b[8];
    for (int i = 0; i < 8; ++i)
        b[i] = host[i] ? tu_storage_upload(storage, host[i], i < 4 ? nw : nm, first + (size_t)i)
                       : (iha_buffer){NULL, 0};
    return (iha_layer_weights){b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]};
}

/* The case's random layer, and its options with the activations and weights in the case's storage. */
static iha_attention_options case_layer(const tu_storage_case *c, int storage, uint64_t seed, tu_layer *l)
{
    const iha_shape s = {c->B, c->N, c->D, c->H, c->d, c->P};
    tu_layer_init(l, &s, seed);
    if (c->identity) tu_layer_identity(l, 1);
    iha_attention_options o = tu_options(c->mask, c->window, c->rope);
    o.storage = c->act ? storage : IHA_STORAGE_F32;
    o.weight_storage = c->weight ? storage : IHA_STORAGE_F32;
    return o;
}

void tu_storage_check_forward(const tu_storage_case *c, int storage, double tol, uint64_t seed)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    tu_layer l;
    const iha_attention_options o = case_layer(c, storage, seed + c->d + 13 * c->P, &l);
    const iha_shape s = l.shape;
    double *zref = tu_layer_reference(&l, &o);
    const size_t nx = tu_count_x(&s), off = c->offsets ? 3 : 0;
    iha_layer_weights w = tu_storage_upload_weights(&l, o.weight_storage, off);
    const iha_buffer x = tu_storage_upload(o.storage, l.x, nx, off);
    const iha_buffer z = tu_storage_upload(o.storage, NULL, nx, off + 2);

    tu_assert_status(tu_ctx, iha_forward(tu_ctx, &s, &o, &w, x, z), IHA_OK);
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    float *out = tu_malloc(nx * sizeof *out);
    char what[96];
    tu_storage_read(o.storage, z, nx, out, "z");
    snprintf(what, sizeof what, "z (%s storage)", tu_storage_name(storage));
    tu_assert_close(what, out, zref, nx, tol);

    /* The host call rounds the same way on upload: the same result within rounding. */
    const iha_host_weights hw = tu_layer_host_weights(&l);
    tu_assert_status(tu_ctx, iha_forward_host(tu_ctx, &s, &o, &hw, l.x, out), IHA_OK);
    snprintf(what, sizeof what, "z (iha_forward_host, %s storage)", tu_storage_name(storage));
    tu_assert_close(what, out, zref, nx, tol);

    free(out), free(zref);
    tu_layer_weights_release(&w);
    tu_buffer_release(x.mem), tu_buffer_release(z.mem);
    tu_layer_free(&l);
}

void tu_storage_check_core_and_attention(int storage, double tol, const iha_shape *shape, uint64_t layer_seed,
                                         uint64_t rng_seed)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = *shape;
    tu_layer l;
    tu_layer_init(&l, &s, layer_seed);
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 1);
    o.storage = o.weight_storage = storage;
    tu_rng rng = tu_rng_seeded(rng_seed);
    const size_t nh = tu_count_heads(&s), nv = tu_count_virtual(&s), nl = s.batch * s.heads * s.tokens * s.pseudo;
    float *q = tu_random_array(&rng, nh, 1.0f), *k = tu_random_array(&rng, nh, 1.0f);
    float *v = tu_random_array(&rng, nh, 1.0f);
    ref_problem rp = tu_layer_problem(&l, &o);
    double *yref = tu_malloc(nh * sizeof *yref);
    assert_int_equal(ref_attention_core(&rp, q, k, v, yref), 0);
    iha_layer_weights w = tu_storage_upload_weights(&l, storage, 0);
    const iha_buffer projections[4] = {w.wq, w.wk, w.wv, w.wo}; /* the core takes only the mixing */
    for (int i = 0; i < 4; ++i) tu_buffer_release(projections[i].mem);
    w.wq = w.wk = w.wv = w.wo = (iha_buffer){NULL, 0};
    const iha_buffer qb = tu_storage_upload(storage, q, nh, 1), kb = tu_storage_upload(storage, k, nh, 0);
    const iha_buffer vb = tu_storage_upload(storage, v, nh, 5), yb = tu_storage_upload(storage, NULL, nh, 7);
    tu_assert_status(tu_ctx, iha_attention_core(tu_ctx, &s, &o, &w, qb, kb, vb, yb), IHA_OK);
    float *y = tu_malloc(nh * sizeof *y);
    char what[96];
    tu_storage_read(storage, yb, nh, y, "y");
    snprintf(what, sizeof what, "y (iha_attention_core, %s)", tu_storage_name(storage));
    tu_assert_close(what, y, yref, nh, tol);

    /* iha_attention: qt, kt, vt and o in the storage; the log-sum-exp stays float. */
    o.rope = 0;
    rp = tu_layer_problem(&l, &o);
    float *qt = tu_random_array(&rng, nv, 1.0f), *kt = tu_random_array(&rng, nv, 1.0f);
    float *vt = tu_random_array(&rng, nv, 1.0f);
    double *oref = tu_malloc(nv * sizeof *oref), *lref = tu_malloc(nl * sizeof *lref);
    assert_int_equal(ref_attention(&rp, qt, kt, vt, oref, lref), 0);
    const iha_buffer qtb = tu_storage_upload(storage, qt, nv, 0), ktb = tu_storage_upload(storage, kt, nv, 3);
    const iha_buffer vtb = tu_storage_upload(storage, vt, nv, 0), ob = tu_storage_upload(storage, NULL, nv, 1);
    const iha_buffer lb = tu_storage_upload(IHA_STORAGE_F32, NULL, nl, 0);
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, &s, &o, qtb, ktb, vtb, ob, lb), IHA_OK);
    float *out = tu_malloc(nv * sizeof *out);
    tu_storage_read(storage, ob, nv, out, "o");
    snprintf(what, sizeof what, "o (iha_attention, %s)", tu_storage_name(storage));
    tu_assert_close(what, out, oref, nv, tol);
    snprintf(what, sizeof what, "lse (iha_attention, %s inputs)", tu_storage_name(storage));
    tu_assert_buffer_close(tu_ctx, what, lb, nl, lref, tol);

    free(q), free(k), free(v), free(y), free(yref), free(qt), free(kt), free(vt), free(out), free(oref), free(lref);
    const iha_buffer all[9] = {qb, kb, vb, yb, qtb, ktb, vtb, ob, lb};
    for (int i = 0; i < 9; ++i) tu_buffer_release(all[i].mem);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}

/* One iha_attention_backward call of tu_storage_check_attention_backward. */
static void check_attention_backward(int storage, double tol, const iha_shape *s, int mask, int64_t window,
                                     uint64_t seed)
{
    iha_attention_options o = tu_options(mask, window, 0);
    o.storage = storage;
    const size_t nv = tu_count_virtual(s), nl = s->batch * s->heads * s->tokens * s->pseudo;
    tu_rng rng = tu_rng_seeded(seed);
    float *in[4];
    for (int i = 0; i < 4; ++i) in[i] = tu_random_array(&rng, nv, 1.0f); /* qt, kt, vt, dout */
    const ref_problem rp = {.B = s->batch, .N = s->tokens, .H = s->heads, .d = s->head_dim, .P = s->pseudo,
                            .mask = mask, .window = window};
    double *ref[3];
    for (int i = 0; i < 3; ++i) ref[i] = tu_malloc(nv * sizeof(double));
    assert_int_equal(ref_attention_backward(&rp, in[0], in[1], in[2], in[3], ref[0], ref[1], ref[2]), 0);
    iha_buffer b[4], g[3];
    for (int i = 0; i < 4; ++i) b[i] = tu_storage_upload(storage, in[i], nv, (size_t)i);
    const iha_buffer ob = tu_storage_upload(storage, NULL, nv, 2);
    const iha_buffer lb = tu_storage_upload(IHA_STORAGE_F32, NULL, nl, 0);
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, s, &o, b[0], b[1], b[2], ob, lb), IHA_OK);
    for (int i = 0; i < 3; ++i) g[i] = tu_storage_upload(storage, NULL, nv, 3);
    tu_assert_status(tu_ctx, iha_attention_backward(tu_ctx, s, &o, b[0], b[1], b[2], ob, lb, b[3], g[0], g[1], g[2]),
                     IHA_OK);
    static const char *const names[3] = {"dqt", "dkt", "dvt"};
    float *got = tu_malloc(nv * sizeof *got);
    for (int i = 0; i < 3; ++i) {
        char what[64];
        snprintf(what, sizeof what, "%s (%s)", names[i], tu_storage_name(storage));
        tu_storage_read(storage, g[i], nv, got, what);
        tu_assert_close(what, got, ref[i], nv, tol);
        tu_buffer_release(g[i].mem);
        free(ref[i]);
    }
    for (int i = 0; i < 4; ++i) tu_buffer_release(b[i].mem), free(in[i]);
    tu_buffer_release(ob.mem), tu_buffer_release(lb.mem);
    free(got);
}

void tu_storage_check_attention_backward(int storage, double tol, const iha_shape shapes[3], uint64_t seed)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    check_attention_backward(storage, tol, &shapes[0], IHA_MASK_CAUSAL, 0, seed);
    check_attention_backward(storage, tol, &shapes[1], IHA_MASK_TOKEN_CAUSAL, 3, seed + 1);
    check_attention_backward(storage, tol, &shapes[2], IHA_MASK_NONE, 0, seed + 2);
}

/* One case of tu_storage_check_layer_backward. */
static void check_layer_backward(const tu_storage_case *c, int storage, double tol, uint64_t layer_seed,
                                 uint64_t dz_seed)
{
    tu_layer l;
    const iha_attention_options o = case_layer(c, storage, layer_seed + c->d + 7 * c->P, &l);
    const iha_shape s = l.shape;
    const size_t nx = tu_count_x(&s), nw = tu_count_w(&s), nm = tu_count_mix(&s);
    tu_rng rng = tu_rng_seeded(dz_seed + c->d);
    float *dz = tu_random_array(&rng, nx, 1.0f);
    iha_layer_weights w = tu_storage_upload_weights(&l, o.weight_storage, 0);
    const iha_buffer x = tu_storage_upload(o.storage, l.x, nx, 1), bdz = tu_storage_upload(o.storage, dz, nx, 2);

    enum { OUTS = 9 };
    size_t count[OUTS];
    int in[OUTS]; /* each gradient's storage */
    iha_buffer out[OUTS], again[OUTS];
    for (int i = 0; i < OUTS; ++i) {
        count[i] = i == 0 ? nx : i < 5 ? nw : nm;
        in[i] = i == 0 ? o.storage : o.weight_storage;
        out[i] = tu_storage_upload(in[i], NULL, count[i], 3);
        again[i] = tu_storage_upload(in[i], NULL, count[i], 1);
    }
    const iha_layer_grads g = {out[1], out[2], out[3], out[4], out[5], out[6], out[7], out[8]};
    const iha_layer_grads g2 = {again[1], again[2], again[3], again[4], again[5], again[6], again[7], again[8]};
    tu_assert_status(tu_ctx, iha_backward(tu_ctx, &s, &o, &w, x, bdz, out[0], &g), IHA_OK);

    size_t ns = 0;
    tu_assert_status(tu_ctx, iha_saved_elements(tu_ctx, &s, &ns), IHA_OK);
    cl_mem saved = tu_buffer_guarded(tu_ctx, NULL, ns, 0, TU_GUARD, TU_SENTINEL);
    const iha_buffer z = tu_storage_upload(o.storage, NULL, nx, 0);
    tu_assert_status(tu_ctx, iha_forward_save(tu_ctx, &s, &o, &w, x, z, (iha_buffer){saved, 0}), IHA_OK);
    tu_assert_status(tu_ctx, iha_backward_saved(tu_ctx, &s, &o, &w, x, (iha_buffer){saved, 0}, bdz, again[0], &g2),
                     IHA_OK);
    tu_assert_guard(tu_ctx, saved, ns, 0, TU_GUARD, TU_SENTINEL);
    double *zref = tu_layer_reference(&l, &o);
    float *zs = tu_malloc(nx * sizeof *zs);
    char what[96];
    tu_storage_read(o.storage, z, nx, zs, "z (iha_forward_save)");
    assert_int_equal(tu_count_nonfinite(zs, nx), 0);
    snprintf(what, sizeof what, "z (iha_forward_save, %s)", tu_storage_name(storage));
    tu_assert_close(what, zs, zref, nx, tol);
    free(zs), free(zref);

    double *ref[OUTS];
    for (int i = 0; i < OUTS; ++i) ref[i] = tu_malloc(count[i] * sizeof(double));
    const ref_grads rg = {ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], ref[6], ref[7], ref[8]};
    const ref_problem rp = tu_layer_problem(&l, &o);
    assert_int_equal(ref_backward(&rp, dz, &rg), 0);
    static const char *const names[OUTS] = {"dx", "dwq", "dwk", "dwv", "dwo", "dalpha_q", "dalpha_k", "dalpha_v", "dr"};
    for (int i = 0; i < OUTS; ++i) {
        float *got = tu_malloc(count[i] * sizeof *got), *got2 = tu_malloc(count[i] * sizeof *got2);
        tu_storage_read(in[i], out[i], count[i], got, names[i]);
        tu_storage_read(in[i], again[i], count[i], got2, names[i]);
        tu_assert_close(names[i], got, ref[i], count[i], tol);
        if (memcmp(got, got2, count[i] * sizeof *got) != 0)
            fail_msg("%s: iha_backward_saved differs from iha_backward with %s storage", names[i],
                     tu_storage_name(storage));
        free(got), free(got2), free(ref[i]);
        tu_buffer_release(out[i].mem), tu_buffer_release(again[i].mem);
    }
    tu_layer_weights_release(&w);
    tu_buffer_release(x.mem), tu_buffer_release(bdz.mem), tu_buffer_release(z.mem), tu_buffer_release(saved);
    free(dz);
    tu_layer_free(&l);
}

void tu_storage_check_layer_backward(int storage, double tol, uint64_t layer_seed, uint64_t dz_seed)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    static const tu_storage_case cases[] = {
        /* B N D H d P mask window rope act weight offsets identity */
        {2, 5, 12, 2, 8, 3, IHA_MASK_CAUSAL, 0, 1, 1, 1, 0, 0},
        {1, 9, 16, 2, 16, 1, IHA_MASK_CAUSAL, 0, 1, 0, 1, 0, 1},
        {1, 7, 9, 3, 5, 2, IHA_MASK_TOKEN_CAUSAL, 3, 0, 1, 0, 0, 0},
        /* 24 rows: the forward's projections convert the 16-bit weights instead of the GEMV */
        {2, 12, 16, 2, 8, 2, IHA_MASK_CAUSAL, 0, 1, 1, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        check_layer_backward(&cases[i], storage, tol, layer_seed, dz_seed);
}

void tu_storage_check_decode(const iha_shape *shape, int storage, int cache_storage, int mask, int64_t window,
                             size_t prefill, uint64_t seed, double tol)
{
    const iha_shape full = *shape;
    iha_attention_options o = tu_options(mask, window, shape->head_dim % 2 == 0); /* rotary needs an even d */
    o.storage = o.weight_storage = storage;
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, &full, seed, &o);
    const size_t D = full.model_dim, B = full.batch, N = full.tokens;
    iha_layer_weights w = tu_storage_upload_weights(&l, storage, 0);
    iha_kv_cache *cache = NULL;
    tu_assert_status(tu_ctx, iha_kv_cache_create(tu_ctx, &full, (iha_storage)cache_storage, &cache), IHA_OK);
    float *xs = tu_malloc(B * prefill * D * sizeof *xs), *zs = tu_malloc(B * prefill * D * sizeof *zs);
    float *z = tu_malloc(B * N * D * sizeof *z);
    for (size_t n = 0; n < N;) {
        const size_t k = n == 0 ? prefill : 1;
        const iha_shape step = {B, k, D, full.heads, full.head_dim, full.pseudo};
        for (size_t b = 0; b < B; ++b) memcpy(xs + b * k * D, l.x + (b * N + n) * D, k * D * sizeof *xs);
        const iha_buffer xb = tu_storage_upload(storage, xs, B * k * D, 1);
        const iha_buffer zb = tu_storage_upload(storage, NULL, B * k * D, 0);
        tu_assert_status(tu_ctx, iha_decode_step(tu_ctx, cache, &step, &o, &w, NULL, xb, zb), IHA_OK);
        tu_storage_read(storage, zb, B * k * D, zs, "z (decode step)");
        for (size_t b = 0; b < B; ++b) memcpy(z + (b * N + n) * D, zs + b * k * D, k * D * sizeof *z);
        tu_buffer_release(xb.mem), tu_buffer_release(zb.mem);
        n += k;
    }
    assert_int_equal(iha_kv_cache_length(cache, B - 1), N);
    char what[96];
    snprintf(what, sizeof what, "z (decode, %s, %s cache)", tu_storage_name(storage),
             tu_storage_name(cache_storage));
    tu_assert_close(what, z, zref, B * N * D, tol);
    iha_kv_cache_free(cache);
    free(xs), free(zs), free(z), free(zref);
    tu_layer_weights_release(&w);
    tu_layer_free(&l);
}
