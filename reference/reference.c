/*
 * reference.c - float64 reference of doc/spec.md: projections, mixing into the interleaved virtual
 * sequence, rotary, masked softmax attention, collapse and output projection, in plain loops.
 * Clarity over speed; the only economy is computing just the rows a caller asks for.
 */
#include "reference.h"
#include "reference_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Validates the problem; `mixing` adds the checks of stages 2, 3 and 5. */
int ref_dims_init(const ref_problem *p, int mixing, ref_dims *g)
{
    if (!p || !p->B || !p->N || !p->H || !p->d || !p->P)
        return -1;
    if (p->mask < 0 || p->mask > 2 || p->window < 0)
        return -1;
    if (mixing && p->rope && p->d % 2 != 0)
        return -1;
    if (mixing && p->P > 1 && (!p->alpha_q || !p->alpha_k || !p->alpha_v || !p->r))
        return -1;
    if ((p->seq_lens == NULL) != (p->seq_count == 0))
        return -1;
    for (size_t i = 0, start = 0; i < p->seq_count; start += p->seq_lens[i++]) {
        if (p->seq_lens[i] == 0 || p->seq_lens[i] > p->B * p->N - start ||
            start / p->N != (start + p->seq_lens[i] - 1) / p->N)
            return -1;
        if (i + 1 == p->seq_count && start + p->seq_lens[i] != p->B * p->N)
            return -1;
    }
    g->B = p->B;
    g->N = p->N;
    g->H = p->H;
    g->d = p->d;
    g->P = p->P;
    g->T = p->N * p->P;
    g->HD = p->H * p->d;
    g->scale = p->scale != 0.0 ? p->scale : 1.0 / sqrt((double)p->d);
    g->base = p->rope_base != 0.0 ? p->rope_base : 10000.0;
    return 0;
}

void ref_sequence(const ref_problem *p, size_t b, size_t n, size_t *first, size_t *end)
{
    *first = 0, *end = p->N;
    const size_t at = b * p->N + n;
    for (size_t i = 0, start = 0; i < p->seq_count; start += p->seq_lens[i++])
        if (at < start + p->seq_lens[i]) {
            *first = start - b * p->N, *end = start + p->seq_lens[i] - b * p->N;
            return;
        }
}

size_t ref_position(const ref_problem *p, size_t b, size_t t)
{
    size_t first, end;
    ref_sequence(p, b, t / p->P, &first, &end);
    return t - first * p->P;
}

/* doc/spec.md step 4's table inside the sequence of query t ("Packed sequences"): keys of other
 * sequences are hidden, and positions count from the sequence's first token. */
int ref_visible(const ref_problem *p, size_t b, size_t t, size_t u)
{
    size_t first, end;
    ref_sequence(p, b, t / p->P, &first, &end);
    if (u / p->P < first || u / p->P >= end)
        return 0;
    t -= first * p->P, u -= first * p->P;
    size_t P = p->P, n = t / P, m = u / P;
    unsigned long long W = (unsigned long long)p->window;
    switch (p->mask) {
    case 0: /* t - u < W*P, written so that no product can wrap for huge windows */
        return u <= t && (W == 0 || (t - u) / P < W);
    case 1:
        return m <= n && (W == 0 || n - m < W);
    default:
        return W == 0 || (n > m ? n - m : m - n) < W;
    }
}

/* alpha[m][h][p]: source head m, target head h. NULL is the identity of P = 1. */
double ref_alpha(const float *alpha, size_t H, size_t P, size_t m, size_t h, size_t p)
{
    if (!alpha)
        return (m == h && p == 0) ? 1.0 : 0.0;
    return alpha[(m * H + h) * P + p];
}

/* R[h][m][p]: target head h, source head m. NULL is the identity of P = 1. */
double ref_r(const float *r, size_t H, size_t P, size_t h, size_t m, size_t p)
{
    if (!r)
        return (h == m && p == 0) ? 1.0 : 0.0;
    return r[(h * H + m) * P + p];
}

/* doc/spec.md step 2 for token n of batch b: dst[b][h][n*P+p] = sum_m alpha[m][h][p] * src[m], where
 * src is that token's [H][d] row and dst is [B][H][T][d]. */
void ref_mix_token(const ref_dims *g, const float *alpha, const double *src, double *dst, size_t b,
                   size_t n)
{
    for (size_t h = 0; h < g->H; h++) {
        for (size_t p = 0; p < g->P; p++) {
            double *out = dst + ((b * g->H + h) * g->T + n * g->P + p) * g->d;
            for (size_t c = 0; c < g->d; c++)
                out[c] = 0.0;
            for (size_t m = 0; m < g->H; m++) {
                double a = ref_alpha(alpha, g->H, g->P, m, h, p);
                for (size_t c = 0; c < g->d; c++)
                    out[c] += a * src[m * g->d + c];
            }
        }
    }
}

/* doc/spec.md step 3: rotate-half rotary of one d-vector at virtual position t. */
void ref_rotate(double *x, size_t d, size_t t, double base)
{
    size_t half = d / 2;
    for (size_t i = 0; i < half; i++) {
        double theta = pow(base, -2.0 * (double)i / (double)d);
        double angle = (double)t * theta;
        double c = cos(angle), s = sin(angle);
        double x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x1 * c + x0 * s;
    }
}

/* doc/spec.md step 4 for query row t of one (b, h): q is [d], k and v are [T][d]; writes o [d] and,
 * when lse is not NULL, *lse. scores is T doubles of scratch. */
void ref_attend_row(const ref_problem *p, const ref_dims *g, const double *q, const double *k,
                    const double *v, size_t b, size_t t, double *scores, double *o, double *lse)
{
    size_t d = g->d, seen = 0;
    double max = -INFINITY, sum = 0.0;
    for (size_t c = 0; c < d; c++)
        o[c] = 0.0;
    for (size_t u = 0; u < g->T; u++) {
        if (!ref_visible(p, b, t, u))
            continue;
        double s = 0.0;
        for (size_t c = 0; c < d; c++)
            s += q[c] * k[u * d + c];
        s *= g->scale;
        scores[u] = s;
        if (seen == 0 || s > max)
            max = s;
        seen++;
    }
    if (seen == 0) {
        if (lse)
            *lse = -INFINITY;
        return;
    }
    for (size_t u = 0; u < g->T; u++) {
        if (!ref_visible(p, b, t, u))
            continue;
        double w = exp(scores[u] - max);
        sum += w;
        for (size_t c = 0; c < d; c++)
            o[c] += w * v[u * d + c];
    }
    for (size_t c = 0; c < d; c++)
        o[c] /= sum;
    if (lse)
        *lse = max + log(sum);
}

/* Stages 2-5 on double Q, K, V [B][N][H][d]. Writes Y[b][n] [H][d] for each token row with
 * need[b*N+n] set (need == NULL: every row); other rows of y are left alone. Keys and values
 * are mixed for every token of a batch that has a needed row, queries only for needed rows. */
static int ref_stages(const ref_problem *p, const ref_dims *g, const double *q, const double *k,
                      const double *v, const unsigned char *need, double *y)
{
    size_t slab = g->T * g->d; /* one (b, h) of a virtual tensor */
    size_t total = g->B * g->H * slab;
    int rc = -1;
    double *qt = calloc(total, sizeof *qt);
    double *kt = calloc(total, sizeof *kt);
    double *vt = calloc(total, sizeof *vt);
    double *o = calloc(total, sizeof *o);
    double *scores = calloc(g->T, sizeof *scores);
    unsigned char *batch = calloc(g->B, 1);
    if (!qt || !kt || !vt || !o || !scores || !batch)
        goto done;
    for (size_t r = 0; r < g->B * g->N; r++)
        if (!need || need[r])
            batch[r / g->N] = 1;

    for (size_t b = 0; b < g->B; b++) {
        if (!batch[b])
            continue;
        const unsigned char *row_need = need ? need + b * g->N : NULL;
        for (size_t n = 0; n < g->N; n++) {
            size_t row = (b * g->N + n) * g->HD;
            ref_mix_token(g, p->alpha_k, k + row, kt, b, n);
            ref_mix_token(g, p->alpha_v, v + row, vt, b, n);
            if (!row_need || row_need[n])
                ref_mix_token(g, p->alpha_q, q + row, qt, b, n);
        }
        for (size_t h = 0; h < g->H && p->rope; h++) {
            for (size_t t = 0; t < g->T; t++) {
                size_t at = (b * g->H + h) * slab + t * g->d;
                ref_rotate(kt + at, g->d, ref_position(p, b, t), g->base);
                if (!row_need || row_need[t / g->P])
                    ref_rotate(qt + at, g->d, ref_position(p, b, t), g->base);
            }
        }
        for (size_t h = 0; h < g->H; h++) {
            size_t base = (b * g->H + h) * slab;
            for (size_t t = 0; t < g->T; t++) {
                if (row_need && !row_need[t / g->P])
                    continue;
                ref_attend_row(p, g, qt + base + t * g->d, kt + base, vt + base, b, t, scores,
                               o + base + t * g->d, NULL);
            }
        }
        for (size_t n = 0; n < g->N; n++) {
            if (row_need && !row_need[n])
                continue;
            for (size_t h = 0; h < g->H; h++) {
                double *out = y + (b * g->N + n) * g->HD + h * g->d;
                for (size_t c = 0; c < g->d; c++)
                    out[c] = 0.0;
                for (size_t m = 0; m < g->H; m++) {
                    for (size_t pp = 0; pp < g->P; pp++) {
                        double w = ref_r(p->r, g->H, g->P, h, m, pp);
                        const double *src = o + (b * g->H + m) * slab + (n * g->P + pp) * g->d;
                        for (size_t c = 0; c < g->d; c++)
                            out[c] += w * src[c];
                    }
                }
            }
        }
    }
    rc = 0;
done:
    free(qt);
    free(kt);
    free(vt);
    free(o);
    free(scores);
    free(batch);
    return rc;
}

void ref_project(const double *in, const float *w, size_t rows, size_t cols, double *out)
{
    for (size_t j = 0; j < cols; j++)
        out[j] = 0.0;
    for (size_t i = 0; i < rows; i++) {
        double a = in[i];
        for (size_t j = 0; j < cols; j++)
            out[j] += a * w[i * cols + j];
    }
}

int ref_forward(const ref_problem *p, const size_t *rows, size_t nrows, double *z)
{
    ref_dims g;
    if (ref_dims_init(p, 1, &g) != 0 || !p->D || !z)
        return -1;
    if (!p->x || !p->wq || !p->wk || !p->wv || !p->wo)
        return -1;
    size_t ntok = g.B * g.N, D = p->D, HD = g.HD;
    if (!rows)
        nrows = ntok;
    int rc = -1;
    unsigned char *need = calloc(ntok, 1);
    unsigned char *batch = calloc(g.B, 1);
    double *q = calloc(ntok * HD, sizeof *q);
    double *k = calloc(ntok * HD, sizeof *k);
    double *v = calloc(ntok * HD, sizeof *v);
    double *y = calloc(ntok * HD, sizeof *y);
    double *xrow = calloc(D, sizeof *xrow);
    if (!need || !batch || !q || !k || !v || !y || !xrow)
        goto done;
    for (size_t i = 0; i < nrows; i++) {
        size_t r = rows ? rows[i] : i;
        if (r >= ntok)
            goto done;
        need[r] = 1;
        batch[r / g.N] = 1;
    }
    for (size_t r = 0; r < ntok; r++) {
        if (!batch[r / g.N])
            continue;
        for (size_t i = 0; i < D; i++)
            xrow[i] = p->x[r * D + i];
        ref_project(xrow, p->wk, D, HD, k + r * HD);
        ref_project(xrow, p->wv, D, HD, v + r * HD);
        if (need[r])
            ref_project(xrow, p->wq, D, HD, q + r * HD);
    }
    if (ref_stages(p, &g, q, k, v, need, y) != 0)
        goto done;
    for (size_t i = 0; i < nrows; i++) {
        size_t r = rows ? rows[i] : i;
        ref_project(y + r * HD, p->wo, HD, D, z + i * D);
    }
    rc = 0;
done:
    free(need);
    free(batch);
    free(q);
    free(k);
    free(v);
    free(y);
    free(xrow);
    return rc;
}

/* n floats as doubles. */
static void widen(const float *in, size_t n, double *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = in[i];
}

/* A float array widened to a newly allocated double array (NULL on failure). */
static double *ref_widen(const float *x, size_t n)
{
    double *out = malloc((n ? n : 1) * sizeof *out);
    if (out)
        widen(x, n, out);
    return out;
}

int ref_attention_core(const ref_problem *p, const float *q, const float *k, const float *v, double *y)
{
    ref_dims g;
    if (ref_dims_init(p, 1, &g) != 0 || !q || !k || !v || !y)
        return -1;
    size_t n = g.B * g.N * g.HD;
    int rc = -1;
    double *qd = ref_widen(q, n), *kd = ref_widen(k, n), *vd = ref_widen(v, n);
    if (qd && kd && vd)
        rc = ref_stages(p, &g, qd, kd, vd, NULL, y);
    free(qd);
    free(kd);
    free(vd);
    return rc;
}

int ref_attention(const ref_problem *p, const float *qt, const float *kt, const float *vt, double *o,
                  double *lse)
{
    ref_dims g;
    if (ref_dims_init(p, 0, &g) != 0 || !qt || !kt || !vt || !o)
        return -1;
    size_t slab = g.T * g.d;
    int rc = -1;
    double *q = malloc(slab * sizeof *q), *k = malloc(slab * sizeof *k), *v = malloc(slab * sizeof *v);
    double *scores = malloc(g.T * sizeof *scores);
    if (!q || !k || !v || !scores)
        goto done;
    for (size_t bh = 0; bh < g.B * g.H; bh++) {
        widen(qt + bh * slab, slab, q), widen(kt + bh * slab, slab, k), widen(vt + bh * slab, slab, v);
        for (size_t t = 0; t < g.T; t++)
            ref_attend_row(p, &g, q + t * g.d, k, v, bh / g.H, t, scores, o + bh * slab + t * g.d,
                           lse ? lse + bh * g.T + t : NULL);
    }
    rc = 0;
done:
    free(q);
    free(k);
    free(v);
    free(scores);
    return rc;
}

void ref_attention_backward_slab(const ref_problem *p, const ref_dims *g, size_t b, const double *q, const double *k,
                                 const double *v, const double *go, double *dq, double *dk, double *dv,
                                 double *scores, double *o)
{
    const size_t d = g->d;
    for (size_t i = 0; i < g->T * d; i++)
        dq[i] = dk[i] = dv[i] = 0.0;
    for (size_t t = 0; t < g->T; t++) {
        double lse;
        ref_attend_row(p, g, q + t * d, k, v, b, t, scores, o, &lse);
        if (lse == -INFINITY)
            continue;
        double delta = 0.0; /* Dt[t] = dO[t] . O[t] */
        for (size_t c = 0; c < d; c++)
            delta += go[t * d + c] * o[c];
        for (size_t u = 0; u < g->T; u++) {
            if (!ref_visible(p, b, t, u))
                continue;
            const double pr = exp(scores[u] - lse);
            double dp = 0.0;
            for (size_t c = 0; c < d; c++)
                dp += go[t * d + c] * v[u * d + c];
            const double ds = pr * (dp - delta);
            for (size_t c = 0; c < d; c++) {
                dq[t * d + c] += g->scale * ds * k[u * d + c];
                dk[u * d + c] += g->scale * ds * q[t * d + c];
                dv[u * d + c] += pr * go[t * d + c];
            }
        }
    }
}

int ref_attention_backward(const ref_problem *p, const float *qt, const float *kt, const float *vt,
                           const float *dout, double *dqt, double *dkt, double *dvt)
{
    ref_dims g;
    if (ref_dims_init(p, 0, &g) != 0 || !qt || !kt || !vt || !dout || !dqt || !dkt || !dvt)
        return -1;
    const size_t slab = g.T * g.d;
    int rc = -1;
    double *q = malloc(slab * sizeof *q), *k = malloc(slab * sizeof *k), *v = malloc(slab * sizeof *v);
    double *go = malloc(slab * sizeof *go), *o = malloc(g.d * sizeof *o), *scores = malloc(g.T * sizeof *scores);
    if (!q || !k || !v || !go || !o || !scores)
        goto done;
    for (size_t bh = 0; bh < g.B * g.H; bh++) {
        widen(dout + bh * slab, slab, go);
        widen(qt + bh * slab, slab, q), widen(kt + bh * slab, slab, k), widen(vt + bh * slab, slab, v);
        ref_attention_backward_slab(p, &g, bh / g.H, q, k, v, go, dqt + bh * slab, dkt + bh * slab, dvt + bh * slab, scores,
                                    o);
    }
    rc = 0;
done:
    free(q);
    free(k);
    free(v);
    free(go);
    free(o);
    free(scores);
    return rc;
}
