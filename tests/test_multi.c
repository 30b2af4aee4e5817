/*
 * test_multi.c - iha_multi_attention and iha_multi_attention_backward (include/iha_multi.h): a
 * sequence split over 1, 2 and 3 contexts on the one PoCL device (N not divisible by the count),
 * every mask, windows of 1 and 2 tokens spanning parts (and hiding whole blocks), gradients added
 * into with accumulate; the parts' o, lse, dqt, dkt and dvt against iha_attention and
 * iha_attention_backward on one context and the float64 reference; outputs at offsets with guards
 * around them; blocks long enough for the tile kernels' several key blocks and query tiles; the
 * split; refusals with nothing written and the message in the right context (z[0] overlapping
 * weights[1] on two contexts of one cl_context too);
 * iha_multi_forward (the layer stages around iha_multi_attention) against iha_forward.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "iha_multi.h"
#include "reference.h"
#include "test_layer.h"
#include "test_contexts.h"
#include "test_util.h"

typedef struct multi_case {
    size_t B, N, H, d, P, R;
    int mask;
    int64_t window;
    float scale;
    int accumulate; /* the backward adds into prefilled gradients */
} multi_case;

/* Rows [b][h][t0 .. t0+rows) of a [B][H][T][w] tensor to or from a [B][H][rows][w] block. */
static void copy_rows(float *whole, float *block, size_t BH, size_t T, size_t t0, size_t rows, size_t w, int out)
{
    for (size_t bh = 0; bh < BH; ++bh) {
        float *a = whole + (bh * T + t0) * w, *b = block + bh * rows * w;
        memcpy(out ? a : b, out ? b : a, rows * w * sizeof(float));
    }
}

static double rel_l2_f(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        const double e = (double)a[i] - (double)b[i];
        num += e * e;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void assert_close_f(const char *what, const multi_case *c, const float *a, const float *b, size_t n)
{
    const double e = rel_l2_f(a, b, n);
    if (!(e <= TU_TOL_F32))
        fail_msg("%s: relative L2 %.3g (N=%zu P=%zu d=%zu R=%zu mask=%d window=%lld accumulate=%d)", what, e, c->N,
                 c->P, c->d, c->R, c->mask, (long long)c->window, c->accumulate);
}

/* The tensors of one part, each at OFFSET in a guarded buffer: q, k, v, dout, o, lse, dq, dk, dv. */
enum { Q, K, V, G, O, L, DQ, DK, DV, SLOTS };

typedef struct part {
    size_t first, tokens, rows, elems; /* tokens from first; rows = tokens*P; elems = B*H*rows*d */
    cl_mem mem[SLOTS];
} part;

static size_t slot_elems(const part *p, int s, size_t BH) { return s == L ? BH * p->rows : p->elems; }

/* Part i's slice of `whole` (NULL: poisoned with NaN) into a guarded buffer of ctxs[i]. */
static cl_mem upload_slice(size_t i, const part *p, int s, const float *whole, size_t BH, size_t T, size_t P, size_t d,
                           float *tmp)
{
    if (whole != NULL) copy_rows((float *)whole, tmp, BH, T, p->first * P, p->rows, s == L ? 1 : d, 0);
    return tu_buffer_guarded(ctxs[i], whole != NULL ? tmp : NULL, slot_elems(p, s, BH), OFFSET, GUARD, SENTINEL);
}

/* Reads part i's slot s into its rows of `whole`, checking its guards. */
static void download_slice(size_t i, const part *p, int s, float *whole, size_t BH, size_t T, size_t P, size_t d,
                           float *tmp)
{
    const size_t n = slot_elems(p, s, BH);
    tu_buffer_read(ctxs[i], p->mem[s], OFFSET, tmp, n);
    tu_assert_guard(ctxs[i], p->mem[s], n, OFFSET, GUARD, SENTINEL);
    copy_rows(whole, tmp, BH, T, p->first * P, p->rows, s == L ? 1 : d, 1);
}

static iha_buffer at(cl_mem m) { return (iha_buffer){m, OFFSET}; }

static void run_case(const multi_case *c)
{
    const size_t BH = c->B * c->H, T = c->N * c->P, d = c->d, n = BH * T * d, rows = BH * T, R = c->R;
    const iha_shape whole = {c->B, c->N, 1, c->H, d, c->P};
    iha_attention_options o;
    iha_attention_options_init(&o);
    o.mask = c->mask;
    o.window = c->window;
    o.scale = c->scale;
    o.accumulate = c->accumulate;
    tu_rng rng = tu_rng_seeded(500 + c->N * 7 + R * 13 + (size_t)c->mask * 3 + (size_t)c->window * 17 + c->P);
    float *in[4], *prefill[3];
    for (int s = 0; s < 4; ++s) in[s] = tu_random_array(&rng, n, s == V || s == G ? 1.0f : 1.5f);
    for (int s = 0; s < 3; ++s) prefill[s] = tu_random_array(&rng, n, c->accumulate ? 0.5f : 0.0f);
    float *out_whole = tu_malloc((4 * n + rows) * sizeof(float)),
          *out_multi = tu_malloc((4 * n + rows) * sizeof(float));
    float *tmp = tu_malloc(n * sizeof(float));

    /* The whole sequence on one context: o, lse, then dq, dk, dv (added into the prefill with
     * accumulate). Layout of out_*: o, dq, dk, dv (n each), lse (rows). */
    cl_mem w[SLOTS];
    for (int s = 0; s < SLOTS; ++s) {
        w[s] = tu_buffer_new(tu_ctx, s == L ? rows : n);
        if (s < 4) tu_buffer_write(tu_ctx, w[s], 0, in[s], n);
        if (s >= DQ && c->accumulate) tu_buffer_write(tu_ctx, w[s], 0, prefill[s - DQ], n);
    }
    const iha_buffer wb[SLOTS] = {{w[0], 0}, {w[1], 0}, {w[2], 0}, {w[3], 0}, {w[4], 0},
                                  {w[5], 0}, {w[6], 0}, {w[7], 0}, {w[8], 0}};
    tu_assert_status(tu_ctx, iha_attention(tu_ctx, &whole, &o, wb[Q], wb[K], wb[V], wb[O], wb[L]), IHA_OK);
    tu_assert_status(
        tu_ctx,
        iha_attention_backward(tu_ctx, &whole, &o, wb[Q], wb[K], wb[V], wb[O], wb[L], wb[G], wb[DQ], wb[DK], wb[DV]),
        IHA_OK);
    tu_buffer_read(tu_ctx, w[O], 0, out_whole, n);
    for (int s = 0; s < 3; ++s) tu_buffer_read(tu_ctx, w[DQ + s], 0, out_whole + (1 + (size_t)s) * n, n);
    tu_buffer_read(tu_ctx, w[L], 0, out_whole + 4 * n, rows);

    /* The parts, each on its own context. */
    part parts[MAX_R];
    iha_buffer b[SLOTS][MAX_R];
    for (size_t i = 0; i < R; ++i) {
        part *p = &parts[i];
        iha_multi_split(c->N, R, i, &p->first, &p->tokens);
        p->rows = p->tokens * c->P;
        p->elems = BH * p->rows * d;
        for (int s = 0; s < SLOTS; ++s) {
            const float *src = s < 4 ? in[s] : s >= DQ && c->accumulate ? prefill[s - DQ] : NULL;
            p->mem[s] = upload_slice(i, p, s, src, BH, T, c->P, d, tmp);
            b[s][i] = at(p->mem[s]);
        }
    }
    tu_assert_status(ctxs[0], iha_multi_attention(ctxs, R, &whole, &o, b[Q], b[K], b[V], b[O], b[L]), IHA_OK);
    tu_assert_status(
        ctxs[0],
        iha_multi_attention_backward(ctxs, R, &whole, &o, b[Q], b[K], b[V], b[O], b[L], b[G], b[DQ], b[DK], b[DV]),
        IHA_OK);
    for (size_t i = 0; i < R; ++i) {
        download_slice(i, &parts[i], O, out_multi, BH, T, c->P, d, tmp);
        for (int s = 0; s < 3; ++s)
            download_slice(i, &parts[i], DQ + s, out_multi + (1 + (size_t)s) * n, BH, T, c->P, d, tmp);
        download_slice(i, &parts[i], L, out_multi + 4 * n, BH, T, c->P, d, tmp);
    }
    static const char *const what[4] = {"o", "dqt", "dkt", "dvt"};
    for (int s = 0; s < 4; ++s) assert_close_f(what[s], c, out_multi + (size_t)s * n, out_whole + (size_t)s * n, n);
    assert_close_f("lse", c, out_multi + 4 * n, out_whole + 4 * n, rows);

    /* The float64 reference; with accumulate the prefill is added to its gradients. */
    ref_problem rp = {
        .B = c->B, .N = c->N, .H = c->H, .d = d, .P = c->P, .mask = c->mask, .window = c->window, .scale = c->scale};
    double *ref = tu_malloc((3 * n + rows) * sizeof(double));
    assert_int_equal(ref_attention(&rp, in[Q], in[K], in[V], ref, ref + 3 * n), 0);
    tu_assert_close("o against the reference", out_multi, ref, n, TU_TOL_F32);
    tu_assert_close("lse against the reference", out_multi + 4 * n, ref + 3 * n, rows, TU_TOL_F32);
    assert_int_equal(ref_attention_backward(&rp, in[Q], in[K], in[V], in[G], ref, ref + n, ref + 2 * n), 0);
    for (int s = 0; s < 3; ++s) {
        if (c->accumulate)
            for (size_t e = 0; e < n; ++e) ref[(size_t)s * n + e] += prefill[s][e];
        tu_assert_close(what[1 + s], out_multi + (1 + (size_t)s) * n, ref + (size_t)s * n, n, 1e-4);
    }

    /* The forward without lse gives the same o. */
    tu_fill_nan(tmp, n);
    for (size_t i = 0; i < R; ++i) tu_buffer_write(ctxs[i], parts[i].mem[O], OFFSET, tmp, parts[i].elems);
    tu_assert_status(ctxs[0], iha_multi_attention(ctxs, R, &whole, &o, b[Q], b[K], b[V], b[O], NULL), IHA_OK);
    float *o_again = tu_malloc(n * sizeof(float));
    for (size_t i = 0; i < R; ++i) download_slice(i, &parts[i], O, o_again, BH, T, c->P, d, tmp);
    assert_memory_equal(o_again, out_multi, n * sizeof(float));

    for (size_t i = 0; i < R; ++i)
        for (int s = 0; s < SLOTS; ++s) tu_buffer_release(parts[i].mem[s]);
    for (int s = 0; s < SLOTS; ++s) tu_buffer_release(w[s]);
    for (int s = 0; s < 4; ++s) free(in[s]);
    for (int s = 0; s < 3; ++s) free(prefill[s]);
    free(out_whole), free(out_multi), free(tmp), free(ref), free(o_again);
}

static void parts_equal_one_context(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    /* Windows of 1 and 2 tokens span the parts' boundaries and, at N = 10 over 3 parts, hide
     * whole blocks. A window of 1 token takes P = 2: with P = 1 every query would see itself
     * alone, and its dqt, exactly 0, would compare rounding against rounding. */
    static const int64_t windows[3] = {0, 1, 2};
    for (size_t R = 1; R <= MAX_R; ++R)
        for (int mask = 0; mask < 3; ++mask)
            for (int w = 0; w < 3; ++w) {
                const size_t P = w == 1 ? 2 : (size_t)(1 + (mask + w) % 2);
                const multi_case c = {1, R == 2 ? 7 : 10, 2, 8, P, R, mask, windows[w], 0.0f, (mask + w + (int)R) % 2};
                run_case(&c);
            }
    /* Three parts of one token each, a window of 2: part 2 sees block 0 under the causal mask
     * with P = 2 only (its first query lies 3 virtual rows after the block's last key, inside
     * the window's 4; with P = 1 it lies 2 rows after, outside the window's 2). */
    for (int mask = 0; mask < 3; ++mask)
        for (size_t P = 1; P <= 2; ++P) {
            const multi_case c = {1, 3, 1, 8, P, 3, mask, 2, 0.0f, 0};
            run_case(&c);
        }
}

/* Blocks long enough for the tile kernels' several key blocks and query tiles, with tails:
 * d = 24 (a partial last chunk of the rows) over parts of 17 and 16 rows, and parts of 42
 * virtual rows (14 tokens of P = 3) over two and three contexts. */
static void long_blocks(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (int mask = 0; mask < 3; ++mask) {
        const multi_case c = {1, 33, 2, 24, 1, 2, mask, 0, 0.0f, mask == 1};
        run_case(&c);
    }
    for (int mask = 0; mask < 3; ++mask) {
        const multi_case c = {1, 28, 2, 8, 3, 2, mask, mask == 2 ? 5 : 0, 0.0f, mask == 0};
        run_case(&c);
    }
    const multi_case three = {1, 42, 1, 8, 3, 3, 1, 0, 0.0f, 0};
    run_case(&three);
}

/* B = 2, P = 3, a scale of its own, accumulate, three parts of a sequence of 11. */
static void batch_scale_accumulate(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (int mask = 0; mask < 3; ++mask) {
        const multi_case c = {2, 11, 2, 8, 3, 3, mask, mask == 2 ? 3 : 0, 0.3f, 1};
        run_case(&c);
    }
}

static void split(void **state)
{
    (void)state;
    size_t first = 9, count = 9;
    const size_t expect[3][2] = {{0, 4}, {4, 3}, {7, 3}};
    for (size_t i = 0; i < 3; ++i) {
        iha_multi_split(10, 3, i, &first, &count);
        assert_int_equal(first, expect[i][0]);
        assert_int_equal(count, expect[i][1]);
    }
    iha_multi_split(10, 3, 3, &first, &count);
    assert_int_equal(first + count, 0);
    iha_multi_split(10, 0, 0, &first, &count);
    assert_int_equal(first + count, 0);
    iha_multi_split(2, 3, 2, &first, NULL);
    assert_int_equal(first, 2);
    iha_multi_split(2, 3, 2, NULL, &count);
    assert_int_equal(count, 0);
}

/* Rows first .. first+count-1 of each batch row of x [B][N][D], to or from a [B][count][D] part. */
static void copy_tokens(float *whole, float *part, size_t B, size_t N, size_t D, size_t first, size_t count, int out)
{
    for (size_t b = 0; b < B; ++b) {
        float *a = whole + (b * N + first) * D, *p = part + b * count * D;
        memcpy(out ? a : p, out ? p : a, count * D * sizeof(float));
    }
}

/* iha_multi_forward against iha_forward on one context and the float64 layer; then z[1] too
 * small is refused with nothing written. */
static void run_layer(const iha_shape *shape, size_t R, const iha_attention_options *o, uint64_t seed)
{
    const size_t B = shape->batch, N = shape->tokens, D = shape->model_dim, nx = B * N * D;
    tu_layer l;
    double *zref = tu_layer_with_reference(&l, shape, seed, o);
    tu_device_layer dev[MAX_R];
    iha_layer_weights w[MAX_R];
    iha_buffer x[MAX_R], z[MAX_R];
    size_t first[MAX_R], count[MAX_R];
    float *tmp = tu_malloc(nx * sizeof(float)), *z_multi = tu_malloc(nx * sizeof(float));
    for (size_t i = 0; i < R; ++i) {
        tu_device_layer_upload(ctxs[i], &l, 0, &dev[i]);
        w[i] = dev[i].weights;
        iha_multi_split(N, R, i, &first[i], &count[i]);
        copy_tokens(l.x, tmp, B, N, D, first[i], count[i], 0);
        x[i] = at(tu_buffer_guarded(ctxs[i], tmp, B * count[i] * D, OFFSET, GUARD, SENTINEL));
        z[i] = at(tu_buffer_guarded(ctxs[i], NULL, B * count[i] * D, OFFSET, GUARD, SENTINEL));
    }
    tu_assert_status(ctxs[0], iha_multi_forward(ctxs, R, shape, o, w, x, z), IHA_OK);
    for (size_t i = 0; i < R; ++i) {
        const size_t n = B * count[i] * D;
        tu_buffer_read(ctxs[i], z[i].mem, OFFSET, tmp, n);
        tu_assert_guard(ctxs[i], z[i].mem, n, OFFSET, GUARD, SENTINEL);
        copy_tokens(z_multi, tmp, B, N, D, first[i], count[i], 1);
    }
    tu_assert_status(tu_ctx, iha_forward(tu_ctx, shape, o, &dev[0].weights, dev[0].x, dev[0].z), IHA_OK);
    tu_buffer_read(tu_ctx, dev[0].z.mem, dev[0].z.offset, tmp, nx);
    const multi_case c = {B, N, shape->heads, shape->head_dim, shape->pseudo, R, o->mask, o->window, 0.0f, 0};
    assert_close_f("z against iha_forward", &c, z_multi, tmp, nx);
    tu_assert_close("z against the reference", z_multi, zref, nx, TU_TOL_F32);
    if (R > 1) {
        tu_fill_value(tmp, nx, 3.0f);
        for (size_t i = 0; i < R; ++i) tu_buffer_write(ctxs[i], z[i].mem, OFFSET, tmp, B * count[i] * D);
        iha_buffer short_z[MAX_R];
        memcpy(short_z, z, sizeof z);
        short_z[R - 1].offset += D; /* the buffer's guard is shorter than a token of the batch */
        tu_assert_status(ctxs[R - 1], iha_multi_forward(ctxs, R, shape, o, w, x, short_z), IHA_ERROR_BUFFER_TOO_SMALL);
        assert_true(tu_contains_nocase(iha_context_message(ctxs[R - 1]), "z["));
        for (size_t i = 0; i < R; ++i) tu_assert_buffer_all(ctxs[i], z[i].mem, OFFSET, B * count[i] * D, 3.0f);
    }
    for (size_t i = 0; i < R; ++i) {
        tu_device_layer_release(&dev[i]);
        tu_buffer_release(x[i].mem), tu_buffer_release(z[i].mem);
    }
    tu_layer_free(&l);
    free(zref), free(tmp), free(z_multi);
}

/* The layer over 1 to 3 contexts (10 tokens: 5 + 5, 4 + 3 + 3): every mask, rotary at the parts'
 * global positions, a window spanning parts, B = 2. */
static void layer_equals_forward(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    for (size_t R = 1; R <= MAX_R; ++R)
        for (int mask = 0; mask < 3; ++mask) {
            const iha_shape shape = {2, 10, 16, 2, 8, 2}; /* one shape: one set of kernels to build */
            const iha_attention_options o = tu_options(mask, mask == 1 ? 2 : 0, mask != 2);
            run_layer(&shape, R, &o, 900 + R * 3 + (uint64_t)mask);
        }
}

/* Two iha contexts on one cl_context, the second borrowing the first's with a queue of its own:
 * z[0] overlapping weights[1] would be a race between the parts, and is refused with nothing
 * written. */
static void shared_cl_context(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    cl_int err;
    cl_command_queue queue =
        clCreateCommandQueue(iha_context_cl_context(tu_ctx), iha_context_cl_device(tu_ctx), 0, &err);
    assert_int_equal(err, CL_SUCCESS);
    iha_context_options co;
    iha_context_options_init(&co);
    co.opencl_context = iha_context_cl_context(tu_ctx);
    co.opencl_queue = queue;
    iha_context *borrowed = NULL;
    assert_int_equal(tu_context_open(&borrowed, &co), 0);
    clReleaseCommandQueue(queue); /* the context holds its own reference */
    iha_context *const pair[2] = {tu_ctx, borrowed};
    const iha_shape shape = {1, 6, 16, 2, 8, 2}; /* two parts of 3 tokens */
    const size_t D = shape.model_dim, part = 3 * D, nw = D * shape.heads * shape.head_dim;
    const iha_attention_options o = tu_options(1, 0, 1);
    tu_layer l;
    free(tu_layer_with_reference(&l, &shape, 77, &o));
    tu_device_layer dev[2];
    iha_layer_weights w[2];
    iha_buffer x[2], z[2];
    float *tmp = tu_malloc(nw * sizeof(float)), *before = tu_malloc(nw * sizeof(float));
    for (size_t i = 0; i < 2; ++i) {
        tu_device_layer_upload(pair[i], &l, 0, &dev[i]);
        w[i] = dev[i].weights;
        x[i] = at(tu_buffer_guarded(pair[i], l.x + i * part, part, OFFSET, GUARD, SENTINEL));
        z[i] = at(tu_buffer_guarded(pair[i], NULL, part, OFFSET, GUARD, SENTINEL));
    }
    tu_fill_value(tmp, part, 3.0f);
    tu_buffer_write(pair[1], z[1].mem, OFFSET, tmp, part);
    tu_buffer_read(pair[1], w[1].wq.mem, w[1].wq.offset, before, nw);
    z[0] = w[1].wq; /* a buffer of contexts[0]'s cl_context too */
    tu_assert_status(pair[0], iha_multi_forward(pair, 2, &shape, &o, w, x, z), IHA_ERROR_INVALID_ARGUMENT);
    assert_true(tu_contains_nocase(iha_context_message(pair[0]), "contexts[0]"));
    assert_true(tu_contains_nocase(iha_context_message(pair[0]), "weights[1].wq"));
    for (size_t i = 0; i < 2; ++i) tu_assert_status(pair[i], iha_context_finish(pair[i]), IHA_OK);
    tu_buffer_read(pair[1], w[1].wq.mem, w[1].wq.offset, tmp, nw);
    assert_memory_equal(tmp, before, nw * sizeof(float));
    tu_assert_buffer_all(pair[1], z[1].mem, OFFSET, part, 3.0f);
    for (size_t i = 0; i < 2; ++i) {
        tu_buffer_release(x[i].mem);
        if (i == 1) tu_buffer_release(z[i].mem);
        tu_device_layer_release(&dev[i]);
    }
    tu_layer_free(&l);
    iha_context_free(borrowed);
    free(tmp), free(before);
}

/* Each refusal leaves every output as it was and says why in the context it concerns. */
static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {1, 6, 1, 2, 8, 2}; /* two parts of 3 tokens: 96 floats per tensor */
    const size_t n = 96, rows = 12;
    iha_attention_options o;
    iha_attention_options_init(&o);
    float *fill = tu_malloc(4 * n * sizeof(float));
    tu_fill_value(fill, 4 * n, 3.0f);
    cl_mem in[2], out[2], lse[2];
    iha_buffer q[2], k[2], v[2], g[2], ob[2], dq[2], dk[2], dv[2], l[2];
    for (int i = 0; i < 2; ++i) {
        in[i] = tu_buffer_new(ctxs[i], 4 * n);
        out[i] = tu_buffer_new(ctxs[i], 4 * n);
        lse[i] = tu_buffer_new(ctxs[i], rows);
        tu_buffer_write(ctxs[i], in[i], 0, fill, 4 * n);
        tu_buffer_write(ctxs[i], out[i], 0, fill, 4 * n);
        tu_buffer_write(ctxs[i], lse[i], 0, fill, rows);
        q[i] = (iha_buffer){in[i], 0}, k[i] = (iha_buffer){in[i], n}, v[i] = (iha_buffer){in[i], 2 * n};
        g[i] = (iha_buffer){in[i], 3 * n}, ob[i] = (iha_buffer){out[i], 0}, dq[i] = (iha_buffer){out[i], n};
        dk[i] = (iha_buffer){out[i], 2 * n}, dv[i] = (iha_buffer){out[i], 3 * n}, l[i] = (iha_buffer){lse[i], 0};
    }
#define FORWARD(c, R, shape, opt, oo, ll) iha_multi_attention(c, R, shape, opt, q, k, v, oo, ll)
#define BACKWARD(R, opt, ll, dkk) iha_multi_attention_backward(ctxs, R, &s, opt, q, k, v, ob, ll, g, dq, dkk, dv)
    assert_int_equal(FORWARD(ctxs, 0, &s, &o, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(FORWARD(NULL, 2, &s, &o, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    iha_context *const missing[2] = {ctxs[0], NULL}, *const twice[2] = {ctxs[0], ctxs[0]};
    assert_int_equal(FORWARD(missing, 2, &s, &o, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    assert_true(tu_contains_nocase(iha_context_message(ctxs[0]), "contexts[1] is NULL"));
    assert_int_equal(FORWARD(twice, 2, &s, &o, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(FORWARD(ctxs, 2, NULL, &o, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    assert_true(tu_contains_nocase(iha_context_message(ctxs[1]), "iha_multi_attention"));
    const iha_shape one = {1, 1, 1, 2, 8, 2};
    assert_int_equal(FORWARD(ctxs, 2, &one, &o, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    iha_attention_options bad = o;
    bad.storage = IHA_STORAGE_F16;
    assert_int_equal(FORWARD(ctxs, 2, &s, &bad, ob, l), IHA_ERROR_UNSUPPORTED);
    bad = o;
    bad.rope = 1;
    assert_int_equal(FORWARD(ctxs, 2, &s, &bad, ob, l), IHA_ERROR_INVALID_ARGUMENT);
    bad = o;
    const size_t lens[2] = {3, 3};
    bad.seq_lens = lens;
    bad.seq_count = 2;
    assert_int_equal(FORWARD(ctxs, 2, &s, &bad, ob, l), IHA_ERROR_UNSUPPORTED);
    /* Part 1's o too small: reported in contexts[1] only. */
    const iha_buffer short_o[2] = {ob[0], {out[1], 3 * n + n / 2}};
    tu_assert_status(ctxs[1], FORWARD(ctxs, 2, &s, &o, short_o, l), IHA_ERROR_BUFFER_TOO_SMALL);
    assert_true(tu_contains_nocase(iha_context_message(ctxs[1]), "contexts[1]"));
    assert_true(tu_contains_nocase(iha_context_message(ctxs[1]), "o[1]"));
    assert_string_equal(iha_context_message(ctxs[0]), "");
    /* Part 0's buffer on the other context; o overlapping qt; lse overlapping o. */
    const iha_buffer foreign[2] = {ob[1], ob[1]}, over_q[2] = {{in[0], n / 2}, ob[1]}, over_o[2] = {{out[0], 8}, l[1]};
    assert_int_equal(FORWARD(ctxs, 2, &s, &o, foreign, l), IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(FORWARD(ctxs, 2, &s, &o, over_q, l), IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(FORWARD(ctxs, 2, &s, &o, ob, over_o), IHA_ERROR_INVALID_ARGUMENT);
    /* The backward: lse required, dkt[1] too small, dkt overlapping dqt. */
    const iha_buffer no_lse[2] = {l[0], {NULL, 0}}, short_dk[2] = {dk[0], {out[1], 3 * n + 1}};
    const iha_buffer over_dk[2] = {{out[0], n + 4}, dk[1]};
    assert_int_equal(BACKWARD(2, &o, NULL, dk), IHA_ERROR_INVALID_ARGUMENT);
    assert_int_equal(BACKWARD(2, &o, no_lse, dk), IHA_ERROR_INVALID_ARGUMENT);
    assert_true(tu_contains_nocase(iha_context_message(ctxs[1]), "contexts[1]"));
    assert_int_equal(BACKWARD(2, &o, l, short_dk), IHA_ERROR_BUFFER_TOO_SMALL);
    assert_int_equal(BACKWARD(2, &o, l, over_dk), IHA_ERROR_INVALID_ARGUMENT);
    o.accumulate = 1;
    assert_int_equal(BACKWARD(2, &o, l, short_dk), IHA_ERROR_BUFFER_TOO_SMALL);
#undef FORWARD
#undef BACKWARD
    for (int i = 0; i < 2; ++i) {
        tu_assert_status(ctxs[i], iha_context_finish(ctxs[i]), IHA_OK);
        tu_assert_buffer_all(ctxs[i], out[i], 0, 4 * n, 3.0f);
        tu_assert_buffer_all(ctxs[i], lse[i], 0, rows, 3.0f);
        tu_buffer_release(in[i]), tu_buffer_release(out[i]), tu_buffer_release(lse[i]);
    }
    free(fill);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(split),
        cmocka_unit_test(parts_equal_one_context),
        cmocka_unit_test(batch_scale_accumulate),
        cmocka_unit_test(long_blocks),
        cmocka_unit_test(layer_equals_forward),
        cmocka_unit_test(shared_cl_context),
        cmocka_unit_test(refusals),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], setup, teardown);
}
