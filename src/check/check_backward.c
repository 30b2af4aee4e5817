/* The families iha_check runs through public calls, as an application would, against the
 * float64 reference of reference.c: the attention backward (iha_attention, then
 * iha_attention_backward) and the layer (iha_forward and iha_backward), in float storage and
 * with half and with bfloat16 activations and weights. Their kernels have no tuning space: the configuration is
 * the device type's path. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check/check.h"
#include "kernels/attention_backward.h"
#include "runtime/error.h"
#include "tune/buffers.h"
#include "tune/search.h"

#define HALF_LIMIT 2e-3 /* doc/spec.md: half storage, float arithmetic */
#define BF16_LIMIT 1e-2 /* and bfloat16 storage */

static const char *const mask_names[3] = {"causal", "token_causal", "none"};

/* A tensor of the problem: host values (rounded to what is stored, for 16 bits) and its buffer. */
typedef struct tensor {
    size_t n;
    int storage; /* an iha_storage */
    float *host;
    cl_mem mem;
} tensor;

/* The host conversions of a 16-bit storage. */
static void to_bits(int storage, const float *src, uint16_t *dst, size_t n)
{
    if (storage == IHA_STORAGE_BF16)
        iha_bf16_from_float(src, dst, n);
    else
        iha_half_from_float(src, dst, n);
}

static void from_bits(int storage, const uint16_t *src, float *dst, size_t n)
{
    if (storage == IHA_STORAGE_BF16)
        iha_bf16_to_float(src, dst, n);
    else
        iha_half_to_float(src, dst, n);
}

/* A row's limit and the word its name and cases carry for the storage (NULL for float). */
static double storage_limit(int storage)
{
    return storage == IHA_STORAGE_F16 ? HALF_LIMIT : storage == IHA_STORAGE_BF16 ? BF16_LIMIT : IHA_TUNE_TOLERANCE;
}

static const char *storage_word(int storage)
{
    return storage == IHA_STORAGE_F16 ? "half" : storage == IHA_STORAGE_BF16 ? "bf16" : NULL;
}

static void tensors_free(tensor *t, int count)
{
    for (int i = 0; i < count; ++i) {
        free(t[i].host);
        iha__tune_release(&t[i].mem, 1);
    }
}

/* n values (random in [-scale, scale) from seed, or none for an output) on the device. */
static iha_status tensor_make(iha_context *ctx, tensor *t, size_t n, int storage, uint64_t seed, double scale,
                              int input)
{
    memset(t, 0, sizeof *t);
    t->n = n, t->storage = storage;
    const int half = storage != IHA_STORAGE_F32; /* 16 bits */
    t->host = input ? iha__tune_random(n, seed) : calloc(n ? n : 1, sizeof(float));
    uint16_t *bits = half ? calloc(n + 2, sizeof *bits) : NULL;
    iha_status st = t->host && (bits || !half) ? IHA_OK : iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    for (size_t i = 0; st == IHA_OK && i < n; ++i) t->host[i] = (float)(t->host[i] * scale);
    if (st == IHA_OK && half) {
        to_bits(storage, t->host, bits, n);
        from_bits(storage, bits, t->host, n);
    }
    if (st == IHA_OK)
        st = iha__tune_buffer(ctx, half ? (n + 1) / 2 : n, !input ? NULL : half ? (const float *)(const void *)bits : t->host,
                              &t->mem);
    free(bits);
    return st;
}

/* The tensor's values back in t->host. */
static iha_status tensor_read(iha_context *ctx, tensor *t)
{
    if (t->storage == IHA_STORAGE_F32) return iha__tune_read(ctx, t->mem, t->n, t->host);
    uint16_t *bits = malloc((t->n + 2) * sizeof *bits);
    IHA_RETURN_ERROR_IF(bits == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    cl_int err = clEnqueueReadBuffer(ctx->queue, t->mem, CL_TRUE, 0, t->n * sizeof *bits, bits, 0, NULL, NULL);
    if (err == CL_SUCCESS) from_bits(t->storage, bits, t->host, t->n);
    free(bits);
    return err == CL_SUCCESS ? IHA_OK : iha__fail_cl(ctx, err, "clEnqueueReadBuffer (check)");
}

static iha_buffer buf(const tensor *t) { return (iha_buffer){t->mem, 0}; }

static double *widen(const float *x, size_t n)
{
    double *out = malloc((n ? n : 1) * sizeof *out);
    for (size_t i = 0; out && i < n; ++i) out[i] = x[i];
    return out;
}

/* ---- The attention backward ---- */

enum { B_Q, B_K, B_V, B_DOUT, B_O, B_LSE, B_DQ, B_DK, B_DV, B_COUNT };

/* Relative error of dq, dk, dv against the float64 backward of each (b, h). */
static double backward_error(const iha_shape *s, int mask, long window, const tensor *t)
{
    const size_t T = s->tokens * s->pseudo, d = s->head_dim, n = s->batch * s->heads * T * d;
    double *in[4], *out[4];
    int ok = 1;
    for (int i = 0; i < 4; ++i) ok &= (in[i] = widen(t[B_Q + i].host, n)) != NULL;
    for (int i = 0; i < 4; ++i) ok &= (out[i] = calloc(n ? n : 1, sizeof(double))) != NULL;
    for (size_t bh = 0; ok && bh < s->batch * s->heads; ++bh) {
        const size_t at = bh * T * d;
        ok = iha__check_attention_slab((long)T, (long)d, (long)s->pseudo, mask, window, 1.0 / sqrt((double)d),
                                       in[0] + at, in[1] + at, in[2] + at, in[3] + at, out[3] + at, out[0] + at,
                                       out[1] + at, out[2] + at) == 0;
    }
    double e = ok ? 0.0 : INFINITY;
    for (int i = 0; ok && i < 3; ++i) e = fmax(e, iha__tune_rel_error(t[B_DQ + i].host, out[i], n));
    for (int i = 0; i < 4; ++i) free(in[i]), free(out[i]);
    return e;
}

static iha_status backward_case(iha_context *ctx, const iha_shape *s, int storage, int mask, long window,
                                double *error)
{
    const size_t T = s->tokens * s->pseudo, n = s->batch * s->heads * T * s->head_dim;
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.mask = mask, o.window = window, o.storage = storage;
    tensor t[B_COUNT];
    memset(t, 0, sizeof t);
    iha_status st = IHA_OK;
    for (int i = 0; i < B_COUNT && st == IHA_OK; ++i)
        st = tensor_make(ctx, &t[i], i == B_LSE ? n / s->head_dim : n, i == B_LSE ? IHA_STORAGE_F32 : storage,
                         81 + (uint64_t)i, 1.0, i <= B_DOUT);
    if (st == IHA_OK) st = iha_attention(ctx, s, &o, buf(&t[B_Q]), buf(&t[B_K]), buf(&t[B_V]), buf(&t[B_O]), buf(&t[B_LSE]));
    if (st == IHA_OK)
        st = iha_attention_backward(ctx, s, &o, buf(&t[B_Q]), buf(&t[B_K]), buf(&t[B_V]), buf(&t[B_O]), buf(&t[B_LSE]),
                                    buf(&t[B_DOUT]), buf(&t[B_DQ]), buf(&t[B_DK]), buf(&t[B_DV]));
    for (int i = B_DQ; i <= B_DV && st == IHA_OK; ++i) st = tensor_read(ctx, &t[i]);
    if (st == IHA_OK) *error = backward_error(s, mask, window, t);
    tensors_free(t, B_COUNT);
    return st;
}

/* Ragged shapes on both sides of the tile kernel's d = 64 boundary (the head widths of
 * check_kernels.c's buckets, whose programs the forward calls reuse), each under every mask,
 * global and with a window. */
iha_status iha__check_backward(iha_check_run *run, int storage)
{
    const char *word = storage_word(storage);
    static const iha_shape shapes[] = {{1, 11, 0, 2, 13, 3}, {2, 5, 0, 1, 128, 2}};
    iha_context *ctx = run->ctx;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
        const iha_shape *s = &shapes[i];
        char shape[160];
        snprintf(shape, sizeof shape, "B=%zu N=%zu H=%zu d=%zu P=%zu%s%s; 3 masks, global and window 3", s->batch,
                 s->tokens, s->heads, s->head_dim, s->pseudo, word ? ", storage " : "", word ? word : "");
        iha_check_row row;
        iha__check_row_init(&row, word ? word : "attention_backward",
                            iha__attention_backward_tiled(ctx, s->head_dim) ? "tiles" : "rows", IHA_CONFIG_BUILTIN_TYPE,
                            shape, storage_limit(storage));
        for (int c = 0; c < 6; ++c) {
            const int mask = c / 2;
            const long window = c % 2 ? 3 : 0;
            double error = 0.0;
            const iha_status st = backward_case(ctx, s, storage, mask, window, &error);
            if (st == IHA_ERROR_HOST_MEMORY) return st;
            char label[48];
            snprintf(label, sizeof label, "%s%s %s", word ? "attention backward " : "", mask_names[mask],
                     window ? "window 3" : "global");
            if (!iha__check_row_case(ctx, &row, st, error, label)) break;
        }
        iha__check_emit(run, &row);
    }
    return IHA_OK;
}

/* ---- The layer ---- */

/* Inputs x, wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r, dz; outputs z, dx, then the gradients
 * in iha_layer_grads order. */
enum { L_X, L_W, L_ALPHA = L_W + 4, L_R = L_ALPHA + 3, L_DZ, L_Z, L_DX, L_G, L_COUNT = L_G + 8 };

static size_t layer_count(const iha_shape *s, int i)
{
    const size_t BND = s->batch * s->tokens * s->model_dim, W = s->model_dim * s->heads * s->head_dim;
    const size_t M = s->heads * s->heads * s->pseudo;
    const int role = i >= L_G ? i - L_G + L_W : i; /* a gradient is shaped as its weight */
    return role == L_X || role == L_DZ || role == L_Z || role == L_DX ? BND : role < L_ALPHA ? W : M;
}

static double layer_error(const iha_shape *s, int mask, long window, const tensor *t)
{
    iha_check_layer L = {s->batch, s->tokens, s->model_dim, s->heads, s->head_dim, s->pseudo, mask, 1, window,
                         t[L_X].host, {NULL}, {NULL}, t[L_R].host, t[L_DZ].host, NULL, NULL, {NULL}, {NULL}, NULL};
    double *ref[L_COUNT] = {NULL};
    int ok = 1;
    for (int i = L_Z; i < L_COUNT; ++i) ok &= (ref[i] = calloc(layer_count(s, i), sizeof(double))) != NULL;
    for (int i = 0; i < 4; ++i) L.w[i] = t[L_W + i].host, L.dw[i] = ref[L_G + i];
    for (int i = 0; i < 3; ++i) L.alpha[i] = t[L_ALPHA + i].host, L.dalpha[i] = ref[L_G + 4 + i];
    L.z = ref[L_Z], L.dx = ref[L_DX], L.dr = ref[L_G + 7];
    double e = ok && iha__check_layer_reference(&L) == 0 ? 0.0 : INFINITY;
    for (int i = L_Z; i < L_COUNT && e < INFINITY; ++i) e = fmax(e, iha__tune_rel_error(t[i].host, ref[i], t[i].n));
    for (int i = L_Z; i < L_COUNT; ++i) free(ref[i]);
    return e;
}

static iha_status layer_case(iha_context *ctx, const iha_shape *s, int storage, int mask, long window, double *error)
{
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.mask = mask, o.window = window, o.rope = 1;
    o.storage = o.weight_storage = storage;
    tensor t[L_COUNT];
    memset(t, 0, sizeof t);
    iha_status st = IHA_OK;
    for (int i = 0; i < L_COUNT && st == IHA_OK; ++i) {
        /* Projections scaled by 1/sqrt(fan-in), so that scores stay of order one. */
        const double scale = i >= L_W && i < L_W + 3   ? 1.0 / sqrt((double)s->model_dim)
                             : i == L_W + 3 ? 1.0 / sqrt((double)(s->heads * s->head_dim)) : 1.0;
        st = tensor_make(ctx, &t[i], layer_count(s, i), storage, 91 + (uint64_t)i, scale, i <= L_DZ);
    }
    const iha_layer_weights w = {buf(&t[L_W]),         buf(&t[L_W + 1]),     buf(&t[L_W + 2]),
                                 buf(&t[L_W + 3]),     buf(&t[L_ALPHA]),     buf(&t[L_ALPHA + 1]),
                                 buf(&t[L_ALPHA + 2]), buf(&t[L_R])};
    const iha_layer_grads g = {buf(&t[L_G]),     buf(&t[L_G + 1]), buf(&t[L_G + 2]), buf(&t[L_G + 3]),
                               buf(&t[L_G + 4]), buf(&t[L_G + 5]), buf(&t[L_G + 6]), buf(&t[L_G + 7])};
    if (st == IHA_OK) st = iha_forward(ctx, s, &o, &w, buf(&t[L_X]), buf(&t[L_Z]));
    if (st == IHA_OK) st = iha_backward(ctx, s, &o, &w, buf(&t[L_X]), buf(&t[L_DZ]), buf(&t[L_DX]), &g);
    for (int i = L_Z; i < L_COUNT && st == IHA_OK; ++i) st = tensor_read(ctx, &t[i]);
    if (st == IHA_OK) *error = layer_error(s, mask, window, t);
    tensors_free(t, L_COUNT);
    return st;
}

/* A ragged layer with rotary (so every step of the backward runs), every mask, global and with
 * a window: z from iha_forward, dx and every gradient from iha_backward. d and P are those of
 * a bucket of check_kernels.c, whose programs it reuses. */
iha_status iha__check_layer(iha_check_run *run, int storage)
{
    const char *word = storage_word(storage);
    const iha_shape s = {2, 5, 24, 2, 128, 2};
    iha_context *ctx = run->ctx;
    char shape[160];
    snprintf(shape, sizeof shape, "B=2 N=5 D=24 H=2 d=128 P=2 rotary%s%s; 3 masks, global and window 2; z, dx, 8 gradients",
             word ? ", activations and weights in " : "", word ? word : "");
    char config[64];
    snprintf(config, sizeof config, "attention backward: %s", iha__attention_backward_tiled(ctx, s.head_dim) ? "tiles" : "rows");
    iha_check_row row;
    iha__check_row_init(&row, word ? word : "layer", config, IHA_CONFIG_BUILTIN_TYPE, shape, storage_limit(storage));
    for (int c = 0; c < 6; ++c) {
        const int mask = c / 2;
        const long window = c % 2 ? 2 : 0;
        double error = 0.0;
        const iha_status st = layer_case(ctx, &s, storage, mask, window, &error);
        if (st == IHA_ERROR_HOST_MEMORY) return st;
        char label[48];
        snprintf(label, sizeof label, "%s%s %s", word ? "layer " : "", mask_names[mask], window ? "window 2" : "global");
        if (!iha__check_row_case(ctx, &row, st, error, label)) break;
    }
    iha__check_emit(run, &row);
    return IHA_OK;
}
