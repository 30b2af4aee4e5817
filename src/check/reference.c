/* A float64 reference of doc/spec.md's layer, forward and backward, for iha_check: plain loops,
 * written from doc/spec.md's steps like the test suite's reference/ (a static library the tests
 * and the tool link, not part of libiha, so the library keeps its own), small problems only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check/check.h"
#include "tune/buffers.h"

int iha__check_attention_slab(long T, long d, long P, int mask, long W, double scale, const double *q,
                              const double *k, const double *v, const double *go, double *o, double *dq, double *dk,
                              double *dv)
{
    double *p = malloc((size_t)T * sizeof *p);
    if (p == NULL) return -1;
    if (go) {
        memset(dq, 0, (size_t)(T * d) * sizeof *dq);
        memset(dk, 0, (size_t)(T * d) * sizeof *dk);
        memset(dv, 0, (size_t)(T * d) * sizeof *dv);
    }
    for (long t = 0; t < T; ++t) {
        const double *qt = q + t * d;
        double mx = -INFINITY, sum = 0.0;
        for (long u = 0; u < T; ++u) {
            p[u] = -INFINITY;
            if (!iha__tune_visible(t, u, P, mask, W)) continue;
            double dot = 0.0;
            for (long c = 0; c < d; ++c) dot += qt[c] * k[u * d + c];
            p[u] = dot * scale;
            mx = fmax(mx, p[u]);
        }
        for (long u = 0; u < T; ++u) sum += p[u] = p[u] == -INFINITY ? 0.0 : exp(p[u] - mx);
        double *ot = o + t * d;
        for (long c = 0; c < d; ++c) ot[c] = 0.0;
        for (long u = 0; u < T; ++u)
            for (long c = 0; c < d && sum > 0.0; ++c) ot[c] += p[u] / sum * v[u * d + c];
        if (go == NULL || sum == 0.0) continue;
        /* dS = P (dP - rowsum(dO * O)), dP = dO V^T; dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO. */
        const double *gt = go + t * d;
        double delta = 0.0;
        for (long c = 0; c < d; ++c) delta += gt[c] * ot[c];
        for (long u = 0; u < T; ++u) {
            const double pu = p[u] / sum;
            if (pu == 0.0) continue;
            double dp = 0.0;
            for (long c = 0; c < d; ++c) dp += gt[c] * v[u * d + c];
            const double ds = pu * (dp - delta) * scale;
            for (long c = 0; c < d; ++c) {
                dq[t * d + c] += ds * k[u * d + c];
                dk[u * d + c] += ds * qt[c];
                dv[u * d + c] += pu * gt[c];
            }
        }
    }
    free(p);
    return 0;
}

/* out [rows][cols] = a [rows][inner] b [inner][cols]; with ta, a is given as [inner][rows]; with
 * tb, b as [cols][inner]. */
static void matmul(const double *a, const double *b, size_t rows, size_t inner, size_t cols, int ta, int tb,
                   double *out)
{
    for (size_t i = 0; i < rows; ++i)
        for (size_t j = 0; j < cols; ++j) {
            double acc = 0.0;
            for (size_t l = 0; l < inner; ++l)
                acc += (ta ? a[l * rows + i] : a[i * inner + l]) * (tb ? b[j * inner + l] : b[l * cols + j]);
            out[i * cols + j] = acc;
        }
}

static double *widen(const float *x, size_t n)
{
    double *out = malloc((n ? n : 1) * sizeof *out);
    for (size_t i = 0; out && i < n; ++i) out[i] = x[i];
    return out;
}

/* Rotary of row x at virtual position t (rotate-half, base 10000); sign -1 is its inverse. */
static void rotate(double *x, size_t d, size_t t, double sign)
{
    for (size_t i = 0; i < d / 2; ++i) {
        const double a = (double)t * pow(10000.0, -2.0 * (double)i / (double)d), c = cos(a), s = sign * sin(a);
        const double x0 = x[i], x1 = x[i + d / 2];
        x[i] = x0 * c - x1 * s;
        x[i + d / 2] = x1 * c + x0 * s;
    }
}

/* Mixing tokens [B][N][H][d] into pseudo rows [B][H][T][d] with alpha [m][h][p] (back: the
 * transpose), and the collapse's counterpart with R [h][m][p] (back: its transpose). */
static void mix(const iha_check_layer *L, const float *w, int collapse, int back, double *tok, double *pseudo)
{
    const size_t B = L->B, N = L->N, H = L->H, d = L->d, P = L->P, T = N * P;
    for (size_t b = 0; b < B; ++b)
        for (size_t n = 0; n < N; ++n)
            for (size_t i = 0; i < H; ++i)     /* token head */
                for (size_t j = 0; j < H; ++j) /* pseudo head */
                    for (size_t p = 0; p < P; ++p) {
                        const double a = w[(i * H + j) * P + p]; /* alpha[m=i][h=j], R[h=i][m=j] */
                        double *x = tok + ((b * N + n) * H + i) * d, *y = pseudo + ((b * H + j) * T + n * P + p) * d;
                        for (size_t c = 0; c < d; ++c) {
                            if (back == collapse) y[c] += a * x[c]; /* forward mixing, or the collapse's backward */
                            else x[c] += a * y[c];
                        }
                    }
}

/* G[i][j][p] = sum over b, n, c of tok[b][n][i][c] pseudo[b][j][n*P+p][c]. */
static void mix_grad(const iha_check_layer *L, const double *tok, const double *pseudo, double *g)
{
    const size_t H = L->H, d = L->d, P = L->P, T = L->N * P;
    for (size_t i = 0; i < H; ++i)
        for (size_t j = 0; j < H; ++j)
            for (size_t p = 0; p < P; ++p) {
                double acc = 0.0;
                for (size_t b = 0; b < L->B; ++b)
                    for (size_t n = 0; n < L->N; ++n)
                        for (size_t c = 0; c < d; ++c)
                            acc += tok[((b * L->N + n) * H + i) * d + c] * pseudo[((b * H + j) * T + n * P + p) * d + c];
                g[(i * H + j) * P + p] = acc;
            }
}

enum { A_X, A_W0, A_DZ = A_W0 + 4, A_TOK = A_DZ + 1, A_PSEUDO = A_TOK + 4, A_COUNT = A_PSEUDO + 8 };

int iha__check_layer_reference(const iha_check_layer *L)
{
    const size_t BN = L->B * L->N, D = L->D, HD = L->H * L->d, d = L->d, T = L->N * L->P;
    const size_t virt = L->B * L->H * T * d;
    /* x, wq..wo, dz; tokens q, k, v, y; pseudo qt, kt, vt, o, dqt, dkt, dvt, do; then dq, dk, dv,
     * dy and a row block of dx in dtok. */
    double *a[A_COUNT] = {0};
    int ok = 1;
    a[A_X] = widen(L->x, BN * D);
    for (int i = 0; i < 4; ++i) a[A_W0 + i] = widen(L->w[i], D * HD);
    a[A_DZ] = widen(L->dz, BN * D);
    for (int i = 0; i < 4; ++i) a[A_TOK + i] = calloc(BN * HD, sizeof(double));
    for (int i = 0; i < 8; ++i) a[A_PSEUDO + i] = calloc(virt, sizeof(double));
    for (int i = 0; i < A_COUNT; ++i) ok &= a[i] != NULL;
    double *dtok = ok ? calloc(4 * BN * HD + BN * D, sizeof(double)) : NULL;
    ok &= dtok != NULL;
    double **tok = &a[A_TOK], **ps = &a[A_PSEUDO], **w = &a[A_W0];
    const double scale = 1.0 / sqrt((double)d);
    /* Forward: projections, mixing, rotary, attention, collapse, output projection. */
    for (int i = 0; ok && i < 3; ++i) {
        matmul(a[A_X], w[i], BN, D, HD, 0, 0, tok[i]);
        mix(L, L->alpha[i], 0, 0, tok[i], ps[i]);
    }
    for (size_t r = 0; ok && L->rope && r < L->B * L->H * T; ++r) {
        rotate(ps[0] + r * d, d, r % T, 1.0);
        rotate(ps[1] + r * d, d, r % T, 1.0);
    }
    for (size_t s = 0; ok && s < L->B * L->H; ++s) {
        const size_t at = s * T * d;
        ok &= iha__check_attention_slab((long)T, (long)d, (long)L->P, L->mask, L->window, scale, ps[0] + at,
                                        ps[1] + at, ps[2] + at, NULL, ps[3] + at, NULL, NULL, NULL) == 0;
    }
    if (ok) mix(L, L->r, 1, 0, tok[3], ps[3]);
    if (ok) matmul(tok[3], w[3], BN, HD, D, 0, 0, L->z);
    /* Backward, the steps in reverse. */
    double *dq = dtok, *dy = dtok + 3 * BN * HD, *dpseudo = ps[4];
    if (ok) {
        matmul(a[A_DZ], w[3], BN, D, HD, 0, 1, dy);
        matmul(tok[3], a[A_DZ], HD, BN, D, 1, 0, L->dw[3]);
        mix(L, L->r, 1, 1, dy, ps[7]);
        mix_grad(L, dy, ps[3], L->dr);
    }
    for (size_t s = 0; ok && s < L->B * L->H; ++s) {
        const size_t at = s * T * d;
        double *o = malloc(T * d * sizeof *o);
        ok &= o != NULL && iha__check_attention_slab((long)T, (long)d, (long)L->P, L->mask, L->window, scale,
                                                     ps[0] + at, ps[1] + at, ps[2] + at, ps[7] + at, o, dpseudo + at,
                                                     ps[5] + at, ps[6] + at) == 0;
        free(o);
    }
    for (size_t r = 0; ok && L->rope && r < L->B * L->H * T; ++r) {
        rotate(ps[4] + r * d, d, r % T, -1.0);
        rotate(ps[5] + r * d, d, r % T, -1.0);
    }
    if (ok) memset(L->dx, 0, BN * D * sizeof *L->dx);
    for (int i = 0; ok && i < 3; ++i) {
        mix(L, L->alpha[i], 0, 1, dq + i * BN * HD, ps[4 + i]);
        mix_grad(L, tok[i], ps[4 + i], L->dalpha[i]);
        matmul(a[A_X], dq + i * BN * HD, D, BN, HD, 1, 0, L->dw[i]);
        double *part = dtok + 4 * BN * HD;
        matmul(dq + i * BN * HD, w[i], BN, HD, D, 0, 1, part);
        for (size_t e = 0; e < BN * D; ++e) L->dx[e] += part[e];
    }
    for (int i = 0; i < A_COUNT; ++i) free(a[i]);
    free(dtok);
    return ok ? 0 : -1;
}
