/*
 * fuzz_api.c - libFuzzer target for the argument checks of the public API (include/iha.h).
 *
 * Each input picks a call (iha_forward, iha_attention_core, iha_attention, iha_forward_host,
 * iha_decode_step on a small KV cache with fuzzed per-sequence counts, iha_kv_cache_truncate,
 * iha_attention_backward, iha_backward, iha_forward_save, iha_backward_saved),
 * a shape, options (storage of activations and weights included: float, half, bfloat16 or invalid), and
 * for every tensor a buffer from a pool (sizes 1 to 16384 floats, NULL,
 * or a buffer of another OpenCL context) and an element offset. Dimensions and offsets come
 * from a table of edge values (0, 1, tails, 256/257, 2^32, SIZE_MAX, ...) or are raw.
 *
 * The oracle is written from the header, not from the library: a call that the header says
 * must be refused (a NULL or zero, d > 256, a bad mask, window, scale or rotary request, a
 * half-given or misplaced identity shortcut, a buffer of another context or too small for its
 * shape and offset, an output overlapping an input, a size that overflows size_t) must return
 * a documented refusal with a message and must leave every pool buffer as it was: nothing may
 * be enqueued. A valid call that is cheap (T <= 96, few elements, d from a small set so that
 * few programs are built) must succeed; a valid expensive one is not made.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iha.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define POOL 6
#define SENTINEL (-12345.5f)
static const size_t kPoolFloats[POOL] = {1, 7, 64, 1000, 4096, 16384};

static iha_context *g_ctx;
static iha_kv_cache *g_cache; /* B=2 sequences of up to 8 tokens, H=2, d=8, P=2, float */
static const iha_shape kCacheShape = {2, 8, 0, 2, 8, 2};
static cl_mem g_pool[POOL], g_foreign;
static cl_context g_other;
static float *g_expect; /* sentinel image of the largest buffer */

/* A trap rather than abort(): PoCL's LLVM installs its own handlers for fatal signals, which
 * hand a SIGILL back to libFuzzer's (so the input is saved) but let SIGABRT kill silently. */
static void die(const char *what)
{
    fprintf(stderr, "fuzz_api: %s\n", what);
    __builtin_trap();
}

static void fill_pool(void)
{
    for (int i = 0; i < POOL; i++)
        if (clEnqueueWriteBuffer(iha_context_cl_queue(g_ctx), g_pool[i], CL_TRUE, 0, kPoolFloats[i] * sizeof(float),
                                 g_expect, 0, NULL, NULL) != CL_SUCCESS)
            die("cannot fill the buffer pool");
}

static void setup(void)
{
    char message[512] = "";
    if (iha_context_create(&g_ctx, NULL, message, sizeof message) != IHA_OK) {
        fprintf(stderr, "fuzz_api: no context: %s\n", message);
        die("iha_context_create failed");
    }
    g_expect = malloc(kPoolFloats[POOL - 1] * sizeof *g_expect);
    if (!g_expect)
        die("out of memory");
    for (size_t i = 0; i < kPoolFloats[POOL - 1]; i++)
        g_expect[i] = SENTINEL;
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < POOL && err == CL_SUCCESS; i++)
        g_pool[i] = clCreateBuffer(iha_context_cl_context(g_ctx), CL_MEM_READ_WRITE, kPoolFloats[i] * sizeof(float),
                                   NULL, &err);
    cl_device_id device = iha_context_cl_device(g_ctx);
    if (err == CL_SUCCESS)
        g_other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (err == CL_SUCCESS)
        g_foreign = clCreateBuffer(g_other, CL_MEM_READ_WRITE, 65536, NULL, &err);
    if (err != CL_SUCCESS)
        die("cannot create the buffer pool");
    if (iha_kv_cache_create(g_ctx, &kCacheShape, IHA_STORAGE_F32, &g_cache) != IHA_OK)
        die("cannot create the KV cache");
    fill_pool();
}

/* Every pool buffer still holds only sentinels. */
static int pool_untouched(void)
{
    static float *got;
    if (!got && !(got = malloc(kPoolFloats[POOL - 1] * sizeof *got)))
        die("out of memory");
    for (int i = 0; i < POOL; i++) {
        if (clEnqueueReadBuffer(iha_context_cl_queue(g_ctx), g_pool[i], CL_TRUE, 0, kPoolFloats[i] * sizeof(float), got,
                                0, NULL, NULL) != CL_SUCCESS)
            die("cannot read the pool");
        if (memcmp(got, g_expect, kPoolFloats[i] * sizeof(float)) != 0)
            return 0;
    }
    return 1;
}

/* ---- Reading the input ---- */

typedef struct reader {
    const uint8_t *p;
    size_t left;
} reader;

static uint8_t take8(reader *r)
{
    if (!r->left)
        return 0;
    r->left--;
    return *r->p++;
}

static uint64_t take64(reader *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | take8(r);
    return v;
}

static const uint64_t kEdges[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 255, 256,
                                  257, 1000, 4096, 65537, (uint64_t)1 << 31, (uint64_t)1 << 32,
                                  ((uint64_t)1 << 32) + 1, (uint64_t)1 << 62, ((uint64_t)1 << 63) + 1, UINT64_MAX - 1,
                                  UINT64_MAX};
#define EDGE_COUNT (sizeof kEdges / sizeof kEdges[0])

/* A size: mostly small, sometimes an edge value, sometimes raw. */
static size_t take_size(reader *r)
{
    const uint8_t b = take8(r);
    if (b < 128)
        return b % 12 + (b >= 96 ? 1 : 0);
    if (b < 250)
        return (size_t)kEdges[b % EDGE_COUNT];
    return (size_t)take64(r);
}

static float take_float(reader *r)
{
    const uint8_t b = take8(r);
    static const float kFloats[] = {0.0f, 0.5f, 1.0f, -1.0f, 1e30f, -0.0f};
    if (b < 240)
        return kFloats[b % 6];
    if (b < 248)
        return b & 1 ? INFINITY : -INFINITY;
    if (b < 252)
        return NAN;
    uint32_t u = (uint32_t)take64(r);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

typedef struct tensor {
    int which; /* 0..POOL-1, POOL: NULL, POOL+1: the foreign buffer */
    size_t offset;
} tensor;

static tensor take_tensor(reader *r)
{
    const uint8_t b = take8(r);
    tensor t = {b % (POOL + 2), 0};
    if (b >= 128)
        t.offset = take_size(r);
    return t;
}

static cl_mem mem_of(tensor t) { return t.which < POOL ? g_pool[t.which] : t.which == POOL ? NULL : g_foreign; }
static iha_buffer buf_of(tensor t) { return (iha_buffer){mem_of(t), t.offset}; }

/* ---- The oracle, from the header ---- */

/* Exact products; 0 when one overflows size_t. */
static int mul(size_t *out, size_t a, size_t b) { return !__builtin_mul_overflow(a, b, out); }

/* Element sizes: offsets and sizes count elements of the tensor's storage type. */
static int fits(tensor t, size_t elems, size_t elem_bytes)
{
    size_t end, bytes;
    if (t.which >= POOL || __builtin_add_overflow(t.offset, elems, &end) || !mul(&bytes, end, elem_bytes))
        return 0;
    return bytes <= kPoolFloats[t.which] * sizeof(float);
}

/* Byte ranges; called only for tensors that fit, so nothing overflows. */
static int overlap(tensor a, size_t na, size_t ea, tensor b, size_t nb, size_t eb)
{
    return a.which == b.which && a.which < POOL &&
           !((a.offset + na) * ea <= b.offset * eb || (b.offset + nb) * eb <= a.offset * ea);
}

enum {
    CALL_FORWARD, CALL_CORE, CALL_ATTENTION, CALL_HOST, CALL_DECODE, CALL_TRUNCATE, CALL_BACKWARD, CALL_LAYER_BACKWARD,
    CALL_FORWARD_SAVE, CALL_BACKWARD_SAVED, CALL_COUNT
};
/* core: X..WV are q, y, k, v; attention: qt, o, kt, vt, lse; backward: backward_in, backward_out;
 * layer backward (and backward from saved state): X and Z are x and dz, the outputs in
 * call_case.grads; the saved pair's state in call_case.saved. */
enum { X, Z, WQ, WK, WV, WO, AQ, AK, AV, R, TENSORS };
/* iha_attention_backward's tensors: inputs qt, kt, vt, o, lse, dout and outputs dqt, dkt, dvt. */
static const int backward_in[6] = {X, WQ, WK, WV, WO, AQ}, backward_out[3] = {Z, AK, AV};

typedef struct call_case {
    int call;
    iha_shape shape;
    iha_attention_options options;
    tensor t[TENSORS];
    int with_counts;     /* decode: counts given (else NULL: shape.tokens each) */
    uint32_t counts[2];  /* decode: per sequence; truncate: counts[0] = b, counts[1] = tokens */
    tensor grads[9];     /* layer backward: dx, then the gradients in iha_layer_grads order */
    tensor saved;        /* iha_forward_save, iha_backward_saved */
} call_case;

/* The calls that take model_dim, and the two that read or write gradients. */
static int with_model_dim(int call)
{
    return call == CALL_FORWARD || call == CALL_HOST || call == CALL_DECODE || call == CALL_LAYER_BACKWARD ||
           call == CALL_FORWARD_SAVE || call == CALL_BACKWARD_SAVED;
}
static int with_grads(int call) { return call == CALL_LAYER_BACKWARD || call == CALL_BACKWARD_SAVED; }

/* 1 when the shape or the options alone make the header refuse the call. */
static int bad_shape_or_options(const call_case *c)
{
    const iha_shape *s = &c->shape;
    const iha_attention_options *o = &c->options;
    const size_t D = with_model_dim(c->call) ? s->model_dim : 1;
    if (!s->batch || !s->tokens || !s->heads || !s->head_dim || !s->pseudo || !D || s->head_dim > 256)
        return 1;
    if (o->mask < 0 || o->mask > 2 || o->window < 0 || !isfinite(o->scale))
        return 1;
    if (o->storage < IHA_STORAGE_F32 || o->storage > IHA_STORAGE_BF16 || o->weight_storage < IHA_STORAGE_F32 ||
        o->weight_storage > IHA_STORAGE_BF16)
        return 1;
    if (o->rope && (s->head_dim % 2 || !isfinite(o->rope_base) || o->rope_base < 0.0f))
        return 1;
    return o->rope && (c->call == CALL_ATTENTION || c->call == CALL_BACKWARD);
}

/* Bytes per element of activations (a), and of the weights (wb): the storage options'. */
static size_t act_bytes(const call_case *c) { return c->options.storage == IHA_STORAGE_F32 ? 4 : 2; }
static size_t weight_bytes(const call_case *c) { return c->options.weight_storage == IHA_STORAGE_F32 ? 4 : 2; }

/* Whether a call whose three inputs sit in X, WQ and WK and whose output in Z, n elements of
 * elem_bytes each, must refuse them: one does not fit its buffer, or the output overlaps an input. */
static int inputs_and_output_refused(const tensor *t, size_t n, size_t elem_bytes)
{
    const int io[4] = {X, WQ, WK, Z};
    for (int i = 0; i < 4; i++)
        if (!fits(t[io[i]], n, elem_bytes))
            return 1;
    for (int i = 0; i < 3; i++)
        if (overlap(t[Z], n, elem_bytes, t[io[i]], n, elem_bytes))
            return 1;
    return 0;
}

/* iha_attention_backward: activations in the storage's size (weight_storage is ignored: no
 * weights), lse float; every input and output fits (lse, in WO, is required), and no output
 * overlaps an input or another output. */
static int backward_must_refuse(const call_case *c, size_t virt, size_t lse)
{
    const size_t a = act_bytes(c);
    const tensor *t = c->t;
    for (int i = 0; i < 6; i++)
        if (!fits(t[backward_in[i]], backward_in[i] == WO ? lse : virt, backward_in[i] == WO ? 4 : a))
            return 1;
    for (int j = 0; j < 3; j++) {
        if (!fits(t[backward_out[j]], virt, a))
            return 1;
        for (int i = 0; i < 6; i++)
            if (overlap(t[backward_out[j]], virt, a, t[backward_in[i]], backward_in[i] == WO ? lse : virt,
                        backward_in[i] == WO ? 4 : a))
                return 1;
        for (int i = 0; i < j; i++)
            if (overlap(t[backward_out[j]], virt, a, t[backward_out[i]], virt, a))
                return 1;
    }
    return 0;
}

/* The saved pair's state (`saved` floats, whatever the storage): given, fitting, apart from x,
 * z or dz, and every weight given. */
static int saved_must_refuse(const call_case *c, size_t saved, size_t x, size_t w, size_t mix)
{
    const tensor *t = c->t;
    if (c->saved.which == POOL || !fits(c->saved, saved, 4))
        return 1;
    for (int i = 0; i < TENSORS; i++)
        if (t[i].which != POOL &&
            overlap(c->saved, saved, 4, t[i], i <= Z ? x : i <= WO ? w : mix, i <= Z ? act_bytes(c) : weight_bytes(c)))
            return 1;
    return 0;
}

/* iha_backward: x, dz and the weights as for iha_forward, in their storage; each given output
 * (dx [x] in the activations' storage, weight gradients [w] and mixing gradients [mix] in the
 * weights') fits and lies apart from x, dz, every weight given, every other output and, for
 * iha_backward_saved, the saved state. */
static int layer_backward_must_refuse(const call_case *c, size_t x, size_t w, size_t mix, size_t saved)
{
    const size_t rows = c->shape.batch * c->shape.tokens, hd = c->shape.heads * c->shape.head_dim; /* x, w fit */
    if (rows > INT_MAX / 2 || c->shape.model_dim > INT_MAX / 2 || hd > INT_MAX / 2 || mix > INT_MAX)
        return 1; /* the int indices of its transposes, products and mixing gradients */
    const tensor *t = c->t;
    const size_t a = act_bytes(c), wb = weight_bytes(c);
    if (!fits(t[X], x, a) || !fits(t[Z], x, a))
        return 1;
    size_t elems[9], bytes[9], in[TENSORS], in_bytes[TENSORS];
    for (int i = 0; i < TENSORS; i++) {
        in[i] = i <= Z ? x : i <= WO ? w : mix;
        in_bytes[i] = i <= Z ? a : wb;
    }
    for (int j = 0; j < 9; j++) {
        const tensor o = c->grads[j];
        elems[j] = j == 0 ? x : j < 5 ? w : mix;
        bytes[j] = j == 0 ? a : wb;
        if (o.which == POOL)
            continue; /* not asked for */
        if (!fits(o, elems[j], bytes[j]))
            return 1;
        for (int i = 0; i < TENSORS; i++)
            if (t[i].which != POOL && overlap(o, elems[j], bytes[j], t[i], in[i], in_bytes[i]))
                return 1;
        for (int i = 0; i < j; i++)
            if (c->grads[i].which != POOL && overlap(o, elems[j], bytes[j], c->grads[i], elems[i], bytes[i]))
                return 1;
    }
    if (c->call != CALL_BACKWARD_SAVED)
        return 0;
    if (saved_must_refuse(c, saved, x, w, mix))
        return 1;
    for (int j = 0; j < 9; j++)
        if (c->grads[j].which != POOL && overlap(c->grads[j], elems[j], bytes[j], c->saved, saved, 4))
            return 1;
    return 0;
}

/* 1: the header says this call must be refused; 0: it is valid. *cheap: small enough to run. */
static int must_refuse(const call_case *c, int *cheap)
{
    const iha_shape *s = &c->shape;
    const size_t D = with_model_dim(c->call) ? s->model_dim : 1;
    if (bad_shape_or_options(c))
        return 1;
    size_t T, BH, tok, virt, lse, x, w, mix, hd;
    if (!mul(&T, s->tokens, s->pseudo) || !mul(&BH, s->batch, s->heads) || !mul(&hd, BH, s->head_dim) ||
        !mul(&tok, hd, s->tokens) || !mul(&virt, hd, T) || !mul(&lse, BH, T) || !mul(&x, s->batch, s->tokens) ||
        !mul(&x, x, D) || !mul(&w, D, s->heads) || !mul(&w, w, s->head_dim) || !mul(&mix, s->heads, s->heads) ||
        !mul(&mix, mix, s->pseudo))
        return 1;
    const tensor *t = c->t;
    const size_t a = act_bytes(c), wb = weight_bytes(c);
    *cheap = T <= 96 && virt <= 8192 && x <= 8192 && (s->head_dim == 1 || s->head_dim == 3 || s->head_dim == 8 ||
                                                      s->head_dim == 16);
    if (c->call == CALL_BACKWARD)
        return backward_must_refuse(c, virt, lse);
    if (c->call == CALL_ATTENTION) { /* qt, kt, vt in X, WQ, WK; o in Z; the optional LSE in WO */
        if (inputs_and_output_refused(t, virt, a))
            return 1;
        const int io[4] = {X, WQ, WK, Z};
        if (t[WO].which != POOL) { /* the LSE is float whatever the storage */
            if (!fits(t[WO], lse, 4))
                return 1;
            for (int i = 0; i < 4; i++)
                if (overlap(t[WO], lse, 4, t[io[i]], virt, a))
                    return 1;
        }
        return 0;
    }
    const int nulls = (t[AQ].which == POOL) + (t[AK].which == POOL) + (t[AV].which == POOL) + (t[R].which == POOL);
    if ((nulls != 0 && nulls != 4) || (nulls == 4 && s->pseudo != 1))
        return 1;
    for (int i = AQ; i <= R && nulls == 0; i++)
        if (!fits(t[i], mix, wb))
            return 1;
    if (c->call == CALL_CORE) {
        if (inputs_and_output_refused(t, tok, a)) /* q, k, v, y */
            return 1;
        for (int i = AQ; i <= R && nulls == 0; i++)
            if (overlap(t[Z], tok, a, t[i], mix, wb))
                return 1;
        return 0;
    }
    const size_t saved = virt + lse; /* iha_saved_elements; lse <= virt, so no overflow */
    if (with_grads(c->call)) {
        for (int i = WQ; i <= WO; i++)
            if (!fits(t[i], w, wb))
                return 1;
        return layer_backward_must_refuse(c, x, w, mix, saved);
    }
    if (c->call == CALL_DECODE) { /* the cache's shape, and room for every sequence's tokens */
        if (s->batch != kCacheShape.batch || s->heads != kCacheShape.heads || s->head_dim != kCacheShape.head_dim ||
            s->pseudo != kCacheShape.pseudo)
            return 1;
        for (size_t b = 0; b < kCacheShape.batch; b++) {
            const size_t count = c->with_counts ? c->counts[b] : s->tokens;
            if (count > s->tokens || iha_kv_cache_length(g_cache, b) + count > kCacheShape.tokens)
                return 1;
        }
    }
    if (!fits(t[X], x, a) || !fits(t[Z], x, a))
        return 1;
    for (int i = WQ; i <= WO; i++)
        if (!fits(t[i], w, wb))
            return 1;
    if (overlap(t[Z], x, a, t[X], x, a))
        return 1;
    for (int i = WQ; i <= WO; i++)
        if (overlap(t[Z], x, a, t[i], w, wb))
            return 1;
    for (int i = AQ; i <= R && nulls == 0; i++)
        if (overlap(t[Z], x, a, t[i], mix, wb))
            return 1;
    return c->call == CALL_FORWARD_SAVE && saved_must_refuse(c, saved, x, w, mix);
}

static iha_status make_call(const call_case *c)
{
    const tensor *t = c->t;
    if (c->call == CALL_BACKWARD)
        return iha_attention_backward(g_ctx, &c->shape, &c->options, buf_of(t[X]), buf_of(t[WQ]), buf_of(t[WK]),
                                      buf_of(t[WV]), buf_of(t[WO]), buf_of(t[AQ]), buf_of(t[Z]), buf_of(t[AK]),
                                      buf_of(t[AV]));
    if (c->call == CALL_ATTENTION)
        return iha_attention(g_ctx, &c->shape, &c->options, buf_of(t[X]), buf_of(t[WQ]), buf_of(t[WK]), buf_of(t[Z]),
                             buf_of(t[WO]));
    const iha_layer_weights w = {buf_of(t[WQ]), buf_of(t[WK]), buf_of(t[WV]), buf_of(t[WO]),
                                 buf_of(t[AQ]), buf_of(t[AK]), buf_of(t[AV]), buf_of(t[R])};
    if (with_grads(c->call)) {
        const tensor *g = c->grads;
        const iha_layer_grads grads = {buf_of(g[1]), buf_of(g[2]), buf_of(g[3]), buf_of(g[4]),
                                       buf_of(g[5]), buf_of(g[6]), buf_of(g[7]), buf_of(g[8])};
        if (c->call == CALL_BACKWARD_SAVED) /* whatever the state holds: wrong gradients, never a fault */
            return iha_backward_saved(g_ctx, &c->shape, &c->options, &w, buf_of(t[X]), buf_of(c->saved),
                                      buf_of(t[Z]), buf_of(g[0]), &grads);
        return iha_backward(g_ctx, &c->shape, &c->options, &w, buf_of(t[X]), buf_of(t[Z]), buf_of(g[0]), &grads);
    }
    if (c->call == CALL_FORWARD_SAVE)
        return iha_forward_save(g_ctx, &c->shape, &c->options, &w, buf_of(t[X]), buf_of(t[Z]), buf_of(c->saved));
    if (c->call == CALL_DECODE)
        return iha_decode_step(g_ctx, g_cache, &c->shape, &c->options, &w, c->with_counts ? c->counts : NULL,
                               buf_of(t[X]), buf_of(t[Z]));
    if (c->call == CALL_CORE)
        return iha_attention_core(g_ctx, &c->shape, &c->options, &w, buf_of(t[X]), buf_of(t[WQ]), buf_of(t[WK]),
                                  buf_of(t[Z]));
    return iha_forward(g_ctx, &c->shape, &c->options, &w, buf_of(t[X]), buf_of(t[Z]));
}

/* iha_forward_host only where the header has it refuse before it reads host memory: a bad
 * shape or option, x or z NULL, or the identity shortcut half given or with P > 1. (The
 * harness's host arrays are one float long: a valid call would read past them.) */
static void host_call(const call_case *c)
{
    static float one[1];
    const float *p[TENSORS];
    for (int i = 0; i < TENSORS; i++)
        p[i] = c->t[i].which == POOL && (i == X || i == Z || i >= AQ) ? NULL : one;
    const int nulls = !p[AQ] + !p[AK] + !p[AV] + !p[R];
    if (!bad_shape_or_options(c) && p[X] && p[Z] && (nulls == 0 || (nulls == 4 && c->shape.pseudo == 1)))
        return;
    const iha_host_weights w = {p[WQ], p[WK], p[WV], p[WO], p[AQ], p[AK], p[AV], p[R]};
    if (iha_forward_host(g_ctx, &c->shape, &c->options, &w, p[X], (float *)p[Z]) == IHA_OK)
        die("iha_forward_host accepted a NULL tensor or a bad shape");
    if (!iha_context_message(g_ctx)[0])
        die("iha_forward_host refused without a message");
}

/* Truncation is valid for an existing sequence and at most its length; a refusal changes
 * nothing. */
static void truncate_call(const call_case *c)
{
    const size_t b = c->counts[0], tokens = c->counts[1];
    const size_t before[2] = {iha_kv_cache_length(g_cache, 0), iha_kv_cache_length(g_cache, 1)};
    const int valid = b < kCacheShape.batch && tokens <= before[b < 2 ? b : 0];
    const iha_status st = iha_kv_cache_truncate(g_cache, b, tokens);
    if (valid != (st == IHA_OK))
        die(valid ? "a valid truncation was refused" : "an invalid truncation was accepted");
    for (size_t i = 0; i < 2; i++) {
        const size_t want = valid && i == b ? tokens : before[i];
        if (iha_kv_cache_length(g_cache, i) != want)
            die("truncation left a wrong length");
    }
    if (!valid && !iha_context_message(g_ctx)[0])
        die("a refused truncation without a message");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_ctx)
        setup();
    reader r = {data, size};
    call_case c;
    memset(&c, 0, sizeof c);
    c.call = take8(&r) % CALL_COUNT;
    c.shape = (iha_shape){take_size(&r), take_size(&r), take_size(&r), take_size(&r), take_size(&r), take_size(&r)};
    iha_attention_options_init(&c.options);
    const uint8_t flags = take8(&r);
    c.options.mask = flags & 0x80 ? (int)(int32_t)take64(&r) : flags % 3;
    c.options.window = flags & 0x40 ? (int64_t)take64(&r) : (int64_t)(flags & 0x08 ? take_size(&r) : 0);
    c.options.rope = (flags & 0x10) != 0;
    c.options.scale = flags & 0x20 ? take_float(&r) : 0.0f;
    c.options.rope_base = flags & 0x04 ? take_float(&r) : 0.0f;
    for (int i = 0; i < TENSORS; i++)
        c.t[i] = take_tensor(&r);
    /* Read last, so inputs written before storage existed keep their meaning (float). */
    const uint8_t storage = take8(&r);
    c.options.storage = storage & 0x80 ? (int)(int32_t)take64(&r) : storage & 1;
    c.options.weight_storage = storage & 0x40 ? (int)(int32_t)take64(&r) : (storage >> 1) & 1;
    c.with_counts = (storage & 0x04) != 0;
    c.counts[0] = storage & 0x08 ? (uint32_t)take64(&r) : take8(&r) % 10;
    c.counts[1] = storage & 0x10 ? (uint32_t)take64(&r) : take8(&r) % 10;
    for (int i = 0; i < 9 && with_grads(c.call); i++)
        c.grads[i] = take_tensor(&r); /* last: the other calls' inputs keep their meaning */
    if (c.call == CALL_FORWARD_SAVE || c.call == CALL_BACKWARD_SAVED)
        c.saved = take_tensor(&r);

    if (c.call == CALL_HOST) {
        host_call(&c);
        return 0;
    }
    if (c.call == CALL_TRUNCATE) {
        truncate_call(&c);
        return 0;
    }
    const size_t lengths[2] = {iha_kv_cache_length(g_cache, 0), iha_kv_cache_length(g_cache, 1)};
    int cheap = 0;
    const int refuse = must_refuse(&c, &cheap);
    if (!refuse && !cheap)
        return 0; /* valid, but too much work for a fuzzer */
    const iha_status st = make_call(&c);
    char message[1024]; /* every call clears the message, iha_context_finish too */
    snprintf(message, sizeof message, "%s", iha_context_message(g_ctx));
    if (iha_context_finish(g_ctx) != IHA_OK)
        die("iha_context_finish failed");
    if (!refuse) {
        if (st != IHA_OK) {
            fprintf(stderr, "fuzz_api: a valid call was refused: %s: %s\n", iha_status_name(st), message);
            die("a valid call was refused");
        }
        fill_pool(); /* the outputs were written */
        if (c.call == CALL_DECODE && (iha_kv_cache_length(g_cache, 0) > 5 || iha_kv_cache_length(g_cache, 1) > 5))
            iha_kv_cache_reset(g_cache); /* keep room for valid steps */
        return 0;
    }
    if (st != IHA_ERROR_INVALID_ARGUMENT && st != IHA_ERROR_SIZE_OVERFLOW && st != IHA_ERROR_BUFFER_TOO_SMALL &&
        st != IHA_ERROR_UNSUPPORTED && st != IHA_ERROR_DEVICE_MEMORY) {
        fprintf(stderr, "fuzz_api: a call that must be refused returned %s: %s\n", iha_status_name(st), message);
        die("a call that must be refused was not");
    }
    if (!message[0])
        die("a refusal without a message");
    if (!pool_untouched())
        die("a refused call wrote into a buffer");
    if (iha_kv_cache_length(g_cache, 0) != lengths[0] || iha_kv_cache_length(g_cache, 1) != lengths[1])
        die("a refused call changed the cache's lengths");
    return 0;
}
