/*
 * test_reference.c - checks the float64 reference itself on cases small enough to work out by
 * hand (trivial softmax, visibility sets of every mask and window, a known mixing and collapse,
 * rotary angles at virtual positions), and against a second writing of doc/spec.md's mixing and
 * collapse formulas, and its backward pass against finite differences of its forward, so that
 * the reference cannot silently be wrong. Needs no device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "reference.h"

#define EXACT 1e-12

static void assert_near(double got, double want)
{
    double tol = EXACT * (1.0 + fabs(want));
    if (!(fabs(got - want) <= tol))
        fail_msg("got %.17g, want %.17g", got, want);
}

/* Deterministic values in +-[0.1, 1], never zero (test_util.h is not used here: this file must
 * run without the library). */
static void fill(float *x, size_t n, unsigned seed)
{
    uint32_t s = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float magnitude = 0.1f + 0.9f * (float)(s >> 8) / 16777216.0f;
        x[i] = (s & 1u) ? -magnitude : magnitude;
    }
}

static ref_problem problem(size_t B, size_t N, size_t H, size_t d, size_t P, int mask, long long window)
{
    return (ref_problem){.B = B, .N = N, .H = H, .d = d, .P = P, .mask = mask, .window = window};
}

/* The mixing and collapse of p (doc/spec.md stages 2 and 5). */
static void set_mixing(ref_problem *p, const float *alpha_q, const float *alpha_k, const float *alpha_v, const float *r)
{
    p->alpha_q = alpha_q;
    p->alpha_k = alpha_k;
    p->alpha_v = alpha_v;
    p->r = r;
}

/* d = 1, T = 2, scale 1: Qt = [1, 1], Kt = [0, ln 3], Vt = [2, 6]. Row 1 sees scores [0, ln 3],
 * weights [1/4, 3/4]: o = 5, lse = ln 4. */
static void attention_two_keys_by_hand(void **state)
{
    (void)state;
    const float qt[2] = {1.0f, 1.0f}, vt[2] = {2.0f, 6.0f};
    float kt[2] = {0.0f, (float)log(3.0)};
    double l3 = (double)kt[1]; /* the stored float, so that the hand values are exact */
    double o[2], lse[2];

    ref_problem p = problem(1, 2, 1, 1, 1, 0, 0);
    p.scale = 1.0;
    assert_int_equal(ref_attention(&p, qt, kt, vt, o, lse), 0);
    assert_near(o[0], 2.0);
    assert_near(lse[0], 0.0);
    assert_near(o[1], (2.0 + 6.0 * exp(l3)) / (1.0 + exp(l3)));
    assert_true(fabs(o[1] - 5.0) < 1e-6);
    assert_near(lse[1], log(1.0 + exp(l3)));

    /* Bidirectional: row 0 sees both keys too. */
    p.mask = 2;
    assert_int_equal(ref_attention(&p, qt, kt, vt, o, lse), 0);
    assert_near(o[0], o[1]);
    assert_near(lse[0], log(1.0 + exp(l3)));

    /* Causal window of 1 token with P = 1: each query sees only itself. */
    p.mask = 0;
    p.window = 1;
    assert_int_equal(ref_attention(&p, qt, kt, vt, o, lse), 0);
    assert_near(o[0], 2.0);
    assert_near(o[1], 6.0);
    assert_near(lse[1], l3);

    /* Scale 2 doubles the scores: weights 1/(1+9), 9/(1+9). */
    p.window = 0;
    p.scale = 2.0;
    assert_int_equal(ref_attention(&p, qt, kt, vt, o, NULL), 0);
    assert_near(o[1], (2.0 + 6.0 * exp(2.0 * l3)) / (1.0 + exp(2.0 * l3)));
    assert_true(fabs(o[1] - 5.6) < 1e-6);

    /* Default scale is 1/sqrt(d): with d = 1 it is 1. */
    p.scale = 0.0;
    assert_int_equal(ref_attention(&p, qt, kt, vt, o, lse), 0);
    assert_near(lse[1], log(1.0 + exp(l3)));

    /* One token of P = 2 pseudo-tokens: causal hides u = 1 from t = 0, token_causal does not. */
    p = problem(1, 1, 1, 1, 2, 0, 0);
    p.scale = 1.0;
    assert_int_equal(ref_attention(&p, qt, kt, vt, o, lse), 0);
    assert_near(o[0], 2.0);
    p.mask = 1;
    assert_int_equal(ref_attention(&p, qt, kt, vt, o, lse), 0);
    assert_near(o[0], o[1]);
}

/* With Qt = 0 every visible score is 0, so lse = ln(count) and o = mean of Vt over the visible
 * keys. With Vt[u] = 2^u, count * o is the bit set of visible keys. N = 3, P = 2 (T = 6); the
 * expected sets are worked out by hand from doc/spec.md's table. */
static void attention_visibility_sets_by_hand(void **state)
{
    (void)state;
    static const struct {
        int mask;
        long long window;
        unsigned sets[6];
    } cases[] = {
        {0, 0, {0x01, 0x03, 0x07, 0x0f, 0x1f, 0x3f}}, /* causal: u <= t */
        {0, 1, {0x01, 0x03, 0x06, 0x0c, 0x18, 0x30}}, /* t - u < 2 */
        {0, 2, {0x01, 0x03, 0x07, 0x0f, 0x1e, 0x3c}}, /* t - u < 4 */
        {1, 0, {0x03, 0x03, 0x0f, 0x0f, 0x3f, 0x3f}}, /* token causal: m <= n */
        {1, 1, {0x03, 0x03, 0x0c, 0x0c, 0x30, 0x30}}, /* m == n */
        {1, 2, {0x03, 0x03, 0x0f, 0x0f, 0x3c, 0x3c}}, /* n - 1 <= m <= n */
        {2, 0, {0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f}}, /* none */
        {2, 1, {0x03, 0x03, 0x0c, 0x0c, 0x30, 0x30}}, /* |n - m| < 1 */
        {2, 2, {0x0f, 0x0f, 0x3f, 0x3f, 0x3c, 0x3c}}, /* |n - m| < 2 */
        {2, 5, {0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f}}, /* a window wider than the sequence */
    };
    float qt[6] = {0}, kt[6], vt[6];
    fill(kt, 6, 1);
    for (int u = 0; u < 6; u++)
        vt[u] = (float)(1u << u);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ref_problem p = problem(1, 3, 1, 1, 2, cases[i].mask, cases[i].window);
        double o[6], lse[6];
        assert_int_equal(ref_attention(&p, qt, kt, vt, o, lse), 0);
        for (int t = 0; t < 6; t++) {
            double count = exp(lse[t]);
            unsigned set = (unsigned)llround(o[t] * count);
            if (fabs(count - llround(count)) > 1e-9 || set != cases[i].sets[t])
                fail_msg("mask %d window %lld query %d: visible set 0x%02x (count %.3f), expected 0x%02x",
                         cases[i].mask, cases[i].window, t, set, count, cases[i].sets[t]);
        }
    }
}

/* N = 1, P = 1: the only key is the token itself, so Z = X W_V W_O whatever W_Q and W_K are.
 * X = [1, 2], W_V = [[1, 2], [3, 4]] -> [7, 10]; W_O = [[1, 0], [1, 1]] -> [17, 10]. */
static void forward_single_token_by_hand(void **state)
{
    (void)state;
    const float x[2] = {1, 2}, wv[4] = {1, 2, 3, 4}, wo[4] = {1, 0, 1, 1};
    float wq[4], wk[4];
    fill(wq, 4, 2);
    fill(wk, 4, 3);
    ref_problem p = problem(1, 1, 1, 2, 1, 0, 0);
    p.D = 2;
    p.x = x;
    p.wq = wq;
    p.wk = wk;
    p.wv = wv;
    p.wo = wo;
    double z[2];
    for (int mask = 0; mask < 3; mask++) {
        p.mask = mask;
        assert_int_equal(ref_forward(&p, NULL, 0, z), 0);
        assert_near(z[0], 17.0);
        assert_near(z[1], 10.0);
    }
    /* The same layer as two heads of width 1 (identity mixing): each head still sees only itself. */
    p.H = 2;
    p.d = 1;
    p.rope = 0;
    assert_int_equal(ref_forward(&p, NULL, 0, z), 0);
    assert_near(z[0], 17.0);
    assert_near(z[1], 10.0);
}

/* H = 2, P = 2, d = 1, N = 1 with Q = 0 (uniform weights). V = [1, 10] for heads 0, 1.
 * alpha_V[m][h][p] = 1..8 in memory order, so Vt[h][p] = alpha[0][h][p] + 10 alpha[1][h][p]:
 * Vt[0] = [51, 62], Vt[1] = [73, 84]. Causal: O[h][0] = Vt[h][0], O[h][1] = mean -> O[0] = [51,
 * 56.5], O[1] = [73, 78.5]. R[h][m][p] = {1, -1, 0.5, 2, 0, 1, -2, 0.25}:
 * Y[0] = 51 - 56.5 + 36.5 + 157 = 188; Y[1] = 56.5 - 146 + 19.625 = -69.875.
 * Token causal: O[0] = [56.5, 56.5], O[1] = [78.5, 78.5] -> Y = [196.25, -80.875]. */
static void core_known_mixing_by_hand(void **state)
{
    (void)state;
    const float q[2] = {0, 0}, v[2] = {1, 10};
    const float alpha_v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const float r[8] = {1, -1, 0.5f, 2, 0, 1, -2, 0.25f};
    float k[2], alpha_q[8], alpha_k[8];
    fill(k, 2, 4);
    fill(alpha_q, 8, 5);
    fill(alpha_k, 8, 6);
    ref_problem p = problem(1, 1, 2, 1, 2, 0, 0);
    set_mixing(&p, alpha_q, alpha_k, alpha_v, r);
    double y[2];
    assert_int_equal(ref_attention_core(&p, q, k, v, y), 0);
    assert_near(y[0], 188.0);
    assert_near(y[1], -69.875);
    p.mask = 1;
    assert_int_equal(ref_attention_core(&p, q, k, v, y), 0);
    assert_near(y[0], 196.25);
    assert_near(y[1], -80.875);
}

/* Rotary, H = 1, P = 1, N = 2, scale 1, q = k = e_j for both tokens, causal. Row 1 sees
 * s(1,0) = cos(theta_j) and s(1,1) = 1, so y1 = (e^cos(theta) v0 + e v1) / (e^cos(theta) + e).
 * theta_j = base^(-2j/d): d = 2, j = 0 -> 1; d = 4, j = 1 -> base^(-1/2). */
static void rotary_angles_by_hand(void **state)
{
    (void)state;
    static const struct {
        size_t d, j;
        double base, theta;
    } cases[] = {
        {2, 0, 0.0, 1.0},     /* default base */
        {4, 0, 0.0, 1.0},
        {4, 1, 0.0, 0.01},    /* 10000^(-1/2) */
        {4, 1, 100.0, 0.1},   /* 100^(-1/2) */
        {8, 2, 0.0, 0.01},    /* 10000^(-4/8) */
        {8, 3, 0.0, 0.001},   /* 10000^(-6/8) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t d = cases[i].d;
        float q[16] = {0}, k[16] = {0}, v[16];
        q[cases[i].j] = q[d + cases[i].j] = 1.0f;
        k[cases[i].j] = k[d + cases[i].j] = 1.0f;
        fill(v, 2 * d, 7);
        ref_problem p = problem(1, 2, 1, d, 1, 0, 0);
        p.scale = 1.0;
        p.rope = 1;
        p.rope_base = cases[i].base;
        double y[16];
        assert_int_equal(ref_attention_core(&p, q, k, v, y), 0);
        double w0 = exp(cos(cases[i].theta)), w1 = exp(1.0);
        for (size_t c = 0; c < d; c++) {
            assert_near(y[c], v[c]);
            assert_near(y[d + c], (w0 * v[c] + w1 * v[d + c]) / (w0 + w1));
        }
    }

    /* P = 2, N = 1: the two pseudo-tokens sit at virtual positions 0 and 1 (not both at token 0).
     * alpha_V = [1, 2] makes Vt = [v, 2v]; R = [0, 1] keeps O[t = 1] = (e^cos1 v + e 2v) / (e^cos1 + e). */
    const float q[2] = {1, 0}, k[2] = {1, 0}, v[2] = {0.5f, -3};
    const float ones[2] = {1, 1}, alpha_v[2] = {1, 2}, r[2] = {0, 1};
    ref_problem p = problem(1, 1, 1, 2, 2, 0, 0);
    p.scale = 1.0;
    p.rope = 1;
    set_mixing(&p, ones, ones, alpha_v, r);
    double y[2];
    assert_int_equal(ref_attention_core(&p, q, k, v, y), 0);
    double w0 = exp(cos(1.0)), w1 = exp(1.0);
    for (int c = 0; c < 2; c++)
        assert_near(y[c], (w0 * v[c] + w1 * 2.0 * v[c]) / (w0 + w1));
}

/* A random layer for the consistency checks below. */
typedef struct layer {
    size_t B, N, D, H, d, P;
    float *x, *wq, *wk, *wv, *wo, *aq, *ak, *av, *r;
} layer;

static layer layer_make(size_t B, size_t N, size_t D, size_t H, size_t d, size_t P, unsigned seed)
{
    layer l = {B, N, D, H, d, P, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t HD = H * d, HHP = H * H * P;
    float **arrays[9] = {&l.x, &l.wq, &l.wk, &l.wv, &l.wo, &l.aq, &l.ak, &l.av, &l.r};
    size_t sizes[9] = {B * N * D, D * HD, D * HD, D * HD, HD * D, HHP, HHP, HHP, HHP};
    for (int i = 0; i < 9; i++) {
        *arrays[i] = malloc(sizes[i] * sizeof(float));
        assert_non_null(*arrays[i]);
        fill(*arrays[i], sizes[i], seed + (unsigned)i);
    }
    return l;
}

static void layer_free(layer *l)
{
    float *arrays[9] = {l->x, l->wq, l->wk, l->wv, l->wo, l->aq, l->ak, l->av, l->r};
    for (int i = 0; i < 9; i++)
        free(arrays[i]);
}

static ref_problem layer_problem(const layer *l, int mask, long long window, int rope)
{
    ref_problem p = problem(l->B, l->N, l->H, l->d, l->P, mask, window);
    p.D = l->D;
    p.rope = rope;
    p.x = l->x;
    p.wq = l->wq;
    p.wk = l->wk;
    p.wv = l->wv;
    p.wo = l->wo;
    set_mixing(&p, l->aq, l->ak, l->av, l->r);
    return p;
}

/* Requested rows, in any order, equal the same rows of the full layer. */
static void forward_row_subset_matches_full(void **state)
{
    (void)state;
    layer l = layer_make(2, 5, 6, 2, 4, 3, 10);
    ref_problem p = layer_problem(&l, 0, 2, 1);
    double full[2 * 5 * 6], part[3 * 6];
    const size_t rows[3] = {7, 0, 3};
    assert_int_equal(ref_forward(&p, NULL, 0, full), 0);
    assert_int_equal(ref_forward(&p, rows, 3, part), 0);
    for (size_t i = 0; i < 3; i++)
        for (size_t j = 0; j < 6; j++)
            assert_near(part[i * 6 + j], full[rows[i] * 6 + j]);
    const size_t bad[1] = {10};
    assert_int_equal(ref_forward(&p, bad, 1, part), -1);
    layer_free(&l);
}

/* Z = (attention core of X W_Q, X W_K, X W_V) W_O, with the projections done here. */
static void forward_is_projections_around_core(void **state)
{
    (void)state;
    layer l = layer_make(2, 4, 5, 3, 2, 2, 20);
    size_t rows = l.B * l.N, HD = l.H * l.d;
    float *q = malloc(rows * HD * sizeof *q), *k = malloc(rows * HD * sizeof *k), *v = malloc(rows * HD * sizeof *v);
    double *y = malloc(rows * HD * sizeof *y), *z = malloc(rows * l.D * sizeof *z);
    assert_true(q && k && v && y && z);
    /* The core takes float inputs: compare against the layer with the same rounding of Q, K, V
     * by building the layer's projections in float and checking the core plus W_O in double. */
    for (size_t n = 0; n < rows; n++) {
        for (size_t j = 0; j < HD; j++) {
            double sq = 0, sk = 0, sv = 0;
            for (size_t i = 0; i < l.D; i++) {
                sq += (double)l.x[n * l.D + i] * l.wq[i * HD + j];
                sk += (double)l.x[n * l.D + i] * l.wk[i * HD + j];
                sv += (double)l.x[n * l.D + i] * l.wv[i * HD + j];
            }
            q[n * HD + j] = (float)sq;
            k[n * HD + j] = (float)sk;
            v[n * HD + j] = (float)sv;
        }
    }
    for (int mask = 0; mask < 3; mask++) {
        ref_problem p = layer_problem(&l, mask, 0, 0);
        assert_int_equal(ref_attention_core(&p, q, k, v, y), 0);
        assert_int_equal(ref_forward(&p, NULL, 0, z), 0);
        double err = 0, norm = 0;
        for (size_t n = 0; n < rows; n++) {
            for (size_t j = 0; j < l.D; j++) {
                double s = 0;
                for (size_t c = 0; c < HD; c++)
                    s += y[n * HD + c] * l.wo[c * l.D + j];
                err += (s - z[n * l.D + j]) * (s - z[n * l.D + j]);
                norm += z[n * l.D + j] * z[n * l.D + j];
            }
        }
        /* Only the float rounding of Q, K, V separates the two. */
        assert_true(sqrt(err / norm) < 1e-6);
    }
    free(q);
    free(k);
    free(v);
    free(y);
    free(z);
    layer_free(&l);
}

/* The core equals doc/spec.md's step 2 and step 5 written out again here around ref_attention. */
static void core_is_mixing_around_attention(void **state)
{
    (void)state;
    const size_t B = 2, N = 5, H = 2, d = 3, P = 3, T = N * P;
    layer l = layer_make(B, N, 1, H, d, P, 30);
    size_t nqkv = B * N * H * d, nt = B * H * T * d;
    float *q = malloc(nqkv * sizeof *q), *k = malloc(nqkv * sizeof *k), *v = malloc(nqkv * sizeof *v);
    float *qt = malloc(nt * sizeof *qt), *kt = malloc(nt * sizeof *kt), *vt = malloc(nt * sizeof *vt);
    double *o = malloc(nt * sizeof *o), *y = malloc(nqkv * sizeof *y);
    assert_true(q && k && v && qt && kt && vt && o && y);
    fill(q, nqkv, 31);
    fill(k, nqkv, 32);
    fill(v, nqkv, 33);
    const float *src[3] = {q, k, v}, *alpha[3] = {l.aq, l.ak, l.av};
    float *dst[3] = {qt, kt, vt};
    for (int s = 0; s < 3; s++)
        for (size_t b = 0; b < B; b++)
            for (size_t h = 0; h < H; h++)
                for (size_t t = 0; t < T; t++)
                    for (size_t c = 0; c < d; c++) {
                        size_t n = t / P, pp = t % P;
                        double acc = 0;
                        for (size_t m = 0; m < H; m++)
                            acc += (double)alpha[s][(m * H + h) * P + pp] * src[s][((b * N + n) * H + m) * d + c];
                        /* float storage, as the library's attention input would be */
                        dst[s][((b * H + h) * T + t) * d + c] = (float)acc;
                    }
    for (int mask = 0; mask < 3; mask++) {
        ref_problem p = layer_problem(&l, mask, mask == 1 ? 2 : 0, 0);
        assert_int_equal(ref_attention(&p, qt, kt, vt, o, NULL), 0);
        assert_int_equal(ref_attention_core(&p, q, k, v, y), 0);
        double err = 0, norm = 0;
        for (size_t b = 0; b < B; b++)
            for (size_t n = 0; n < N; n++)
                for (size_t h = 0; h < H; h++)
                    for (size_t c = 0; c < d; c++) {
                        double acc = 0;
                        for (size_t m = 0; m < H; m++)
                            for (size_t pp = 0; pp < P; pp++)
                                acc += (double)l.r[(h * H + m) * P + pp] * o[((b * H + m) * T + n * P + pp) * d + c];
                        double want = y[((b * N + n) * H + h) * d + c];
                        err += (acc - want) * (acc - want);
                        norm += want * want;
                    }
        assert_true(sqrt(err / norm) < 1e-6);
    }
    free(q);
    free(k);
    free(v);
    free(qt);
    free(kt);
    free(vt);
    free(o);
    free(y);
    layer_free(&l);
}

/* NULL mixing with P = 1 is the identity: the same as explicit identity arrays. */
static void null_mixing_is_identity(void **state)
{
    (void)state;
    layer l = layer_make(1, 6, 4, 3, 2, 1, 40);
    float eye[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    ref_problem p = layer_problem(&l, 0, 0, 1);
    p.alpha_q = p.alpha_k = p.alpha_v = p.r = eye;
    double a[6 * 4], b[6 * 4];
    assert_int_equal(ref_forward(&p, NULL, 0, a), 0);
    p.alpha_q = p.alpha_k = p.alpha_v = p.r = NULL;
    assert_int_equal(ref_forward(&p, NULL, 0, b), 0);
    for (size_t i = 0; i < 6 * 4; i++)
        assert_near(b[i], a[i]);
    layer_free(&l);
}

/* Invalid problems are refused, not computed. */
static void invalid_problems_are_refused(void **state)
{
    (void)state;
    layer l = layer_make(1, 2, 4, 1, 3, 2, 50);
    double z[2 * 4];
    ref_problem p = layer_problem(&l, 0, 0, 0);
    assert_int_equal(ref_forward(&p, NULL, 0, z), 0);
    p.rope = 1; /* odd d */
    assert_int_equal(ref_forward(&p, NULL, 0, z), -1);
    p = layer_problem(&l, 3, 0, 0);
    assert_int_equal(ref_forward(&p, NULL, 0, z), -1);
    p = layer_problem(&l, 0, -1, 0);
    assert_int_equal(ref_forward(&p, NULL, 0, z), -1);
    p = layer_problem(&l, 0, 0, 0);
    p.alpha_k = NULL; /* P = 2 */
    assert_int_equal(ref_forward(&p, NULL, 0, z), -1);
    p = layer_problem(&l, 0, 0, 0);
    p.N = 0;
    assert_int_equal(ref_forward(&p, NULL, 0, z), -1);
    layer_free(&l);
}

/* sum(dz * z) of the layer, the loss whose gradients ref_backward returns. */
static double layer_loss(const ref_problem *p, const float *dz)
{
    const size_t n = p->B * p->N * p->D;
    double *z = malloc(n * sizeof *z);
    assert_non_null(z);
    assert_int_equal(ref_forward(p, NULL, 0, z), 0);
    double loss = 0.0;
    for (size_t i = 0; i < n; i++)
        loss += dz[i] * z[i];
    free(z);
    return loss;
}

/* ref_backward against central differences of ref_forward, element by element of x and every
 * weight. The steps are the exact differences of the perturbed floats, so the quotient has only
 * its O(h^2) truncation error. `identity` (P = 1): the reference gets NULL mixing, the
 * differences explicit identity arrays, so the mixing gradients are checked at the identity. */
static void backward_case(size_t B, size_t N, size_t D, size_t H, size_t d, size_t P, int mask, long long window,
                          int rope, int identity)
{
    layer l = layer_make(B, N, D, H, d, P, 40 + (unsigned)(B + N + D + H + d + P));
    if (identity) {
        float *mix[4] = {l.aq, l.ak, l.av, l.r};
        for (int i = 0; i < 4; i++)
            for (size_t m = 0; m < H; m++)
                for (size_t h = 0; h < H; h++)
                    mix[i][m * H + h] = m == h ? 1.0f : 0.0f;
    }
    ref_problem p = layer_problem(&l, mask, window, rope);
    const size_t nx = B * N * D, nw = D * H * d, nm = H * H * P;
    float *dz = malloc(nx * sizeof *dz);
    assert_non_null(dz);
    fill(dz, nx, 99);
    double *grads[9];
    const size_t sizes[9] = {nx, nw, nw, nw, nw, nm, nm, nm, nm};
    for (int i = 0; i < 9; i++) {
        grads[i] = malloc(sizes[i] * sizeof(double));
        assert_non_null(grads[i]);
    }
    const ref_grads g = {grads[0], grads[1], grads[2], grads[3], grads[4], grads[5], grads[6], grads[7], grads[8]};
    ref_problem analytic = p;
    if (identity)
        analytic.alpha_q = analytic.alpha_k = analytic.alpha_v = analytic.r = NULL;
    assert_int_equal(ref_backward(&analytic, dz, &g), 0);

    float *tensors[9] = {l.x, l.wq, l.wk, l.wv, l.wo, l.aq, l.ak, l.av, l.r};
    static const char *const names[9] = {"x", "wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r"};
    for (int t = 0; t < 9; t++) {
        double err = 0.0, norm = 0.0;
        for (size_t i = 0; i < sizes[t]; i++) {
            const float keep = tensors[t][i];
            tensors[t][i] = keep + 1e-4f;
            const double up = tensors[t][i], plus = layer_loss(&p, dz);
            tensors[t][i] = keep - 1e-4f;
            const double down = tensors[t][i], minus = layer_loss(&p, dz);
            tensors[t][i] = keep;
            const double fd = (plus - minus) / (up - down);
            err += (fd - grads[t][i]) * (fd - grads[t][i]);
            norm += grads[t][i] * grads[t][i];
        }
        if (!(sqrt(err) <= 1e-6 * sqrt(norm)))
            fail_msg("d%s: relative L2 distance %.3g from central differences", names[t], sqrt(err / norm));
    }
    for (int i = 0; i < 9; i++)
        free(grads[i]);
    free(dz);
    layer_free(&l);
}

static void layer_backward_matches_differences(void **state)
{
    (void)state;
    backward_case(2, 3, 5, 2, 4, 2, 0, 0, 1, 0);  /* causal, rotary */
    backward_case(1, 4, 3, 3, 3, 3, 1, 2, 0, 0);  /* token_causal, window, odd d */
    backward_case(1, 3, 4, 2, 2, 1, 2, 0, 0, 1);  /* none, P = 1, identity mixing */
    backward_case(1, 5, 4, 1, 6, 2, 0, 2, 1, 0);  /* one head, window, rotary */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attention_two_keys_by_hand),
        cmocka_unit_test(attention_visibility_sets_by_hand),
        cmocka_unit_test(forward_single_token_by_hand),
        cmocka_unit_test(core_known_mixing_by_hand),
        cmocka_unit_test(rotary_angles_by_hand),
        cmocka_unit_test(forward_row_subset_matches_full),
        cmocka_unit_test(forward_is_projections_around_core),
        cmocka_unit_test(core_is_mixing_around_attention),
        cmocka_unit_test(null_mixing_is_identity),
        cmocka_unit_test(invalid_problems_are_refused),
        cmocka_unit_test(layer_backward_matches_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
