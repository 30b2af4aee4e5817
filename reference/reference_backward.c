/*
 * reference_backward.c - float64 reference of doc/spec.md's backward pass, of a whole layer and of
 * its core (stages 2-5), in plain loops: the forward's activations, then dY, dO, the attention
 * backward, the inverse rotary, the mixing's and projections' gradients. Written from
 * doc/spec.md, not from the kernels.
 */
#include "reference.h"
#include "reference_internal.h"

#include <math.h>
#include <stdlib.h>

/* The activations and gradients of one layer, all double. */
typedef struct ref_state {
    double *x, *q, *k, *v;           /* [B*N][D], then [B][N][H][d] */
    double *qt, *kt, *vt, *o;        /* [B][H][T][d], after rotary */
    double *y, *dy, *dq, *dk, *dv;   /* [B][N][H][d] */
    double *dout, *dqt, *dkt, *dvt;  /* [B][H][T][d] */
    double *scores, *row;            /* scratch: T and d */
} ref_state;

/* Every array of a ref_state, for allocation and release. */
#define STATE_ARRAYS(s)                                                                                  \
    {&(s)->x,  &(s)->q,   &(s)->k,   &(s)->v,    &(s)->qt,  &(s)->kt,  &(s)->vt,     &(s)->o,  &(s)->y, \
     &(s)->dy, &(s)->dq,  &(s)->dk,  &(s)->dv,   &(s)->dout, &(s)->dqt, &(s)->dkt,  &(s)->dvt, &(s)->scores, \
     &(s)->row}
enum { REF_ARRAYS = 19 };

static void state_free(ref_state *s)
{
    double **a[REF_ARRAYS] = STATE_ARRAYS(s);
    for (int i = 0; i < REF_ARRAYS; i++)
        free(*a[i]);
}

/* Zeroed arrays (the steps below accumulate into several); -1 if one cannot be allocated. */
static int state_alloc(ref_state *s, const ref_dims *g, size_t D)
{
    const size_t tok = g->B * g->N * g->HD, virt = g->B * g->H * g->T * g->d;
    const size_t sizes[REF_ARRAYS] = {g->B * g->N * D, tok, tok, tok, virt, virt, virt, virt, tok, tok,
                                      tok,             tok, tok, virt, virt, virt, virt, g->T, g->d};
    double **a[REF_ARRAYS] = STATE_ARRAYS(s);
    for (int i = 0; i < REF_ARRAYS; i++)
        *a[i] = NULL;
    for (int i = 0; i < REF_ARRAYS; i++)
        if (!(*a[i] = calloc(sizes[i] ? sizes[i] : 1, sizeof(double))))
            return -1;
    return 0;
}

/* out [rows][cols] = in [rows][inner] * w [inner][cols], w float: ref_project row by row. */
static void matmul(const double *in, const float *w, size_t rows, size_t inner, size_t cols, double *out)
{
    for (size_t i = 0; i < rows; i++)
        ref_project(in + i * inner, w, inner, cols, out + i * cols);
}

/* out [rows][inner] (+)= in [rows][cols] * transpose of w [inner][cols]. */
static void matmul_wt(const double *in, const float *w, size_t rows, size_t cols, size_t inner, double *out,
                      int accumulate)
{
    for (size_t i = 0; i < rows; i++)
        for (size_t l = 0; l < inner; l++) {
            double acc = accumulate ? out[i * inner + l] : 0.0;
            for (size_t j = 0; j < cols; j++)
                acc += in[i * cols + j] * w[l * cols + j];
            out[i * inner + l] = acc;
        }
}

/* out [a_cols][b_cols] = transpose of a [rows][a_cols] * b [rows][b_cols]. */
static void matmul_at(const double *a, const double *b, size_t rows, size_t a_cols, size_t b_cols, double *out)
{
    for (size_t i = 0; i < a_cols; i++)
        for (size_t j = 0; j < b_cols; j++) {
            double acc = 0.0;
            for (size_t r = 0; r < rows; r++)
                acc += a[r * a_cols + i] * b[r * b_cols + j];
            out[i * b_cols + j] = acc;
        }
}

/* G[i][j][p] = sum over b, n, c of tok[b][n][i][c] * virt[b][j][n*P+p][c]: dR (tok dY, virt O)
 * and dalpha (tok Q, virt dQt). */
static void mixing_grad(const ref_dims *g, const double *tok, const double *virt, double *out)
{
    for (size_t i = 0; i < g->H; i++)
        for (size_t j = 0; j < g->H; j++)
            for (size_t p = 0; p < g->P; p++) {
                double acc = 0.0;
                for (size_t b = 0; b < g->B; b++)
                    for (size_t n = 0; n < g->N; n++) {
                        const double *a = tok + ((b * g->N + n) * g->H + i) * g->d;
                        const double *v = virt + ((b * g->H + j) * g->T + n * g->P + p) * g->d;
                        for (size_t c = 0; c < g->d; c++)
                            acc += a[c] * v[c];
                    }
                out[(i * g->H + j) * g->P + p] = acc;
            }
}

/* The forward's activations after Q, K and V (stages 2-5): the rotated pseudo tensors, O and Y. */
static void forward_core(const ref_problem *p, const ref_dims *g, ref_state *s)
{
    const size_t slab = g->T * g->d;
    for (size_t b = 0; b < g->B; b++)
        for (size_t n = 0; n < g->N; n++) {
            const size_t row = (b * g->N + n) * g->HD;
            ref_mix_token(g, p->alpha_q, s->q + row, s->qt, b, n);
            ref_mix_token(g, p->alpha_k, s->k + row, s->kt, b, n);
            ref_mix_token(g, p->alpha_v, s->v + row, s->vt, b, n);
        }
    for (size_t bh = 0; bh < g->B * g->H && p->rope; bh++)
        for (size_t t = 0; t < g->T; t++) {
            ref_rotate(s->qt + bh * slab + t * g->d, g->d, ref_position(p, bh / g->H, t), g->base);
            ref_rotate(s->kt + bh * slab + t * g->d, g->d, ref_position(p, bh / g->H, t), g->base);
        }
    for (size_t bh = 0; bh < g->B * g->H; bh++)
        for (size_t t = 0; t < g->T; t++)
            ref_attend_row(p, g, s->qt + bh * slab + t * g->d, s->kt + bh * slab, s->vt + bh * slab, bh / g->H, t, s->scores,
                           s->o + bh * slab + t * g->d, NULL);
    /* Collapse: Y[b][n][h] = sum_{m,p} R[h][m][p] O[b][m][n*P+p]. */
    for (size_t b = 0; b < g->B; b++)
        for (size_t n = 0; n < g->N; n++)
            for (size_t h = 0; h < g->H; h++) {
                double *out = s->y + ((b * g->N + n) * g->H + h) * g->d;
                for (size_t m = 0; m < g->H; m++)
                    for (size_t pp = 0; pp < g->P; pp++) {
                        const double w = ref_r(p->r, g->H, g->P, h, m, pp);
                        const double *src = s->o + (b * g->H + m) * slab + (n * g->P + pp) * g->d;
                        for (size_t c = 0; c < g->d; c++)
                            out[c] += w * src[c];
                    }
            }
}

/* The forward's activations: Q, K, V, then stages 2-5. */
static void forward(const ref_problem *p, const ref_dims *g, ref_state *s)
{
    const size_t ntok = g->B * g->N;
    for (size_t i = 0; i < ntok * p->D; i++)
        s->x[i] = p->x[i];
    matmul(s->x, p->wq, ntok, p->D, g->HD, s->q);
    matmul(s->x, p->wk, ntok, p->D, g->HD, s->k);
    matmul(s->x, p->wv, ntok, p->D, g->HD, s->v);
    forward_core(p, g, s);
}

/* The inverse of ref_rotate at position t: the gradient through the rotation. */
static void rotate_back(double *x, size_t d, size_t t, double base)
{
    const size_t half = d / 2;
    for (size_t i = 0; i < half; i++) {
        const double angle = (double)t * pow(base, -2.0 * (double)i / (double)d);
        const double c = cos(angle), s = sin(angle), x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c + x1 * s;
        x[i + half] = x1 * c - x0 * s;
    }
}

/* doc/spec.md's backward steps 2-5 from s->dy, on the forward's activations in s: dO and dR,
 * the attention, the inverse rotary, then dQ, dK, dV (into s) and the dalphas. */
static void backward_core(const ref_problem *p, const ref_dims *gp, ref_state *sp, double *dr, double *const dalpha[3])
{
    const ref_dims g = *gp;
    ref_state s = *sp;
    const size_t slab = g.T * g.d;

    /* Collapse: dO[b][m][n*P+p] = sum_h R[h][m][p] dY[b][n][h]; dR = G(dY, O). */
    for (size_t b = 0; b < g.B; b++)
        for (size_t n = 0; n < g.N; n++)
            for (size_t m = 0; m < g.H; m++)
                for (size_t pp = 0; pp < g.P; pp++) {
                    double *d_o = s.dout + (b * g.H + m) * slab + (n * g.P + pp) * g.d;
                    for (size_t h = 0; h < g.H; h++) {
                        const double w = ref_r(p->r, g.H, g.P, h, m, pp);
                        const double *dy = s.dy + ((b * g.N + n) * g.H + h) * g.d;
                        for (size_t c = 0; c < g.d; c++)
                            d_o[c] += w * dy[c];
                    }
                }
    mixing_grad(&g, s.dy, s.o, dr);

    /* Attention, then the inverse rotary. */
    for (size_t bh = 0; bh < g.B * g.H; bh++) {
        const size_t at = bh * slab;
        ref_attention_backward_slab(p, &g, bh / g.H, s.qt + at, s.kt + at, s.vt + at, s.dout + at, s.dqt + at, s.dkt + at,
                                    s.dvt + at, s.scores, s.row);
        for (size_t t = 0; t < g.T && p->rope; t++) {
            rotate_back(s.dqt + at + t * g.d, g.d, ref_position(p, bh / g.H, t), g.base);
            rotate_back(s.dkt + at + t * g.d, g.d, ref_position(p, bh / g.H, t), g.base);
        }
    }

    /* Mixing: dQ[b][n][m] = sum_{h,p} alpha_Q[m][h][p] dQt[b][h][n*P+p]; dalpha_Q = G(Q, dQt). */
    const float *alphas[3] = {p->alpha_q, p->alpha_k, p->alpha_v};
    double *dpseudo[3] = {s.dqt, s.dkt, s.dvt}, *dtok[3] = {s.dq, s.dk, s.dv}, *tok[3] = {s.q, s.k, s.v};
    for (int i = 0; i < 3; i++) {
        for (size_t b = 0; b < g.B; b++)
            for (size_t n = 0; n < g.N; n++)
                for (size_t m = 0; m < g.H; m++) {
                    double *dst = dtok[i] + ((b * g.N + n) * g.H + m) * g.d;
                    for (size_t h = 0; h < g.H; h++)
                        for (size_t pp = 0; pp < g.P; pp++) {
                            const double a = ref_alpha(alphas[i], g.H, g.P, m, h, pp);
                            const double *src = dpseudo[i] + (b * g.H + h) * slab + (n * g.P + pp) * g.d;
                            for (size_t c = 0; c < g.d; c++)
                                dst[c] += a * src[c];
                        }
                }
        mixing_grad(&g, tok[i], dpseudo[i], dalpha[i]);
    }
}

/* doc/spec.md's backward steps from dZ, on the forward's activations in s. */
static int backward(const ref_problem *p, const ref_dims *gp, ref_state *sp, const float *dz, const ref_grads *out)
{
    const ref_dims g = *gp;
    ref_state s = *sp;
    const size_t ntok = g.B * g.N, D = p->D;

    /* Output projection: dY = dZ W_O^T, dW_O = Y^T dZ. */
    double *dzd = malloc(ntok * D * sizeof *dzd);
    if (!dzd)
        return -1;
    for (size_t i = 0; i < ntok * D; i++)
        dzd[i] = dz[i];
    matmul_wt(dzd, p->wo, ntok, D, g.HD, s.dy, 0);
    matmul_at(s.y, dzd, ntok, g.HD, D, out->wo);
    free(dzd);

    double *const dalpha[3] = {out->alpha_q, out->alpha_k, out->alpha_v};
    backward_core(p, &g, &s, out->r, dalpha);

    /* Projections: dW_Q = X^T dQ (K, V alike), dX = dQ W_Q^T + dK W_K^T + dV W_V^T. */
    const float *ws[3] = {p->wq, p->wk, p->wv};
    double *dw[3] = {out->wq, out->wk, out->wv}, *dtok[3] = {s.dq, s.dk, s.dv};
    for (int i = 0; i < 3; i++) {
        matmul_at(s.x, dtok[i], ntok, D, g.HD, dw[i]);
        matmul_wt(dtok[i], ws[i], ntok, g.HD, D, out->dx, i > 0);
    }
    return 0;
}

int ref_backward(const ref_problem *p, const float *dz, const ref_grads *out)
{
    ref_dims g;
    if (ref_dims_init(p, 1, &g) != 0 || !p->D || !dz || !out || !p->x || !p->wq || !p->wk || !p->wv || !p->wo)
        return -1;
    if (!out->dx || !out->wq || !out->wk || !out->wv || !out->wo || !out->alpha_q || !out->alpha_k ||
        !out->alpha_v || !out->r)
        return -1;
    ref_state s;
    int rc = state_alloc(&s, &g, p->D);
    if (rc == 0) {
        forward(p, &g, &s);
        rc = backward(p, &g, &s, dz, out);
    }
    state_free(&s);
    return rc;
}

int ref_attention_core_backward(const ref_problem *p, const float *q, const float *k, const float *v,
                                const float *dy, const ref_core_grads *out)
{
    ref_dims g;
    if (ref_dims_init(p, 1, &g) != 0 || !q || !k || !v || !dy || !out)
        return -1;
    if (!out->dq || !out->dk || !out->dv || !out->alpha_q || !out->alpha_k || !out->alpha_v || !out->r)
        return -1;
    ref_state s;
    int rc = state_alloc(&s, &g, 0);
    if (rc == 0) {
        const size_t n = g.B * g.N * g.HD;
        for (size_t i = 0; i < n; i++) {
            s.q[i] = q[i];
            s.k[i] = k[i];
            s.v[i] = v[i];
            s.dy[i] = dy[i];
        }
        forward_core(p, &g, &s);
        double *const dalpha[3] = {out->alpha_q, out->alpha_k, out->alpha_v};
        backward_core(p, &g, &s, out->r, dalpha);
        double *const dst[3] = {out->dq, out->dk, out->dv}, *const src[3] = {s.dq, s.dk, s.dv};
        for (int t = 0; t < 3; t++)
            for (size_t i = 0; i < n; i++)
                dst[t][i] = src[t][i];
    }
    state_free(&s);
    return rc;
}
