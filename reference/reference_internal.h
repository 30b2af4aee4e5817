/*
 * reference_internal.h - the helpers reference.c shares with reference_backward.c: doc/spec.md's
 * steps on double arrays, one token, row or (b, h) slab at a time. Not for the tests.
 */
#ifndef IHA_REFERENCE_INTERNAL_H
#define IHA_REFERENCE_INTERNAL_H

#include "reference.h"

/* Sizes derived once from a problem. */
typedef struct ref_dims {
    size_t B, N, H, d, P, T, HD;
    double scale, base;
} ref_dims;

/* Validates the problem; `mixing` adds the checks of stages 2, 3 and 5. 0 or -1. */
int ref_dims_init(const ref_problem *p, int mixing, ref_dims *g);
/* The sequence of token n of batch row b: its first token and one past its last (0 and N
 * without packed sequences). */
void ref_sequence(const ref_problem *p, size_t b, size_t n, size_t *first, size_t *end);
/* The rotary position of virtual position t of batch row b: t, less the virtual position where
 * its sequence starts. */
size_t ref_position(const ref_problem *p, size_t b, size_t t);
/* doc/spec.md step 4's table: may virtual query t of batch row b see virtual key u? */
int ref_visible(const ref_problem *p, size_t b, size_t t, size_t u);
/* alpha[m][h][p] and R[h][m][p]; NULL is the identity of P = 1. */
double ref_alpha(const float *alpha, size_t H, size_t P, size_t m, size_t h, size_t p);
double ref_r(const float *r, size_t H, size_t P, size_t h, size_t m, size_t p);
/* doc/spec.md step 2 for token n of batch b: src is its [H][d] row, dst [B][H][T][d]. */
void ref_mix_token(const ref_dims *g, const float *alpha, const double *src, double *dst, size_t b, size_t n);
/* out[j] = sum_i in[i] * w[i][j], with w [rows][cols] (float): one token's projection. */
void ref_project(const double *in, const float *w, size_t rows, size_t cols, double *out);
/* doc/spec.md step 3 on one d-vector at virtual position t. */
void ref_rotate(double *x, size_t d, size_t t, double base);
/* doc/spec.md step 4 for query row t of one (b, h): q [d], k and v [T][d] -> o [d] and *lse (if not
 * NULL); scores is T doubles of scratch and holds the row's scaled scores afterwards. */
void ref_attend_row(const ref_problem *p, const ref_dims *g, const double *q, const double *k, const double *v,
                    size_t b, size_t t, double *scores, double *o, double *lse);
/* The attention backward of one (b, h) (b: the batch row): q, k, v, go = dLoss/dO [T][d] -> dq, dk, dv [T][d];
 * scores (T) and o (d) are scratch. */
void ref_attention_backward_slab(const ref_problem *p, const ref_dims *g, size_t b, const double *q, const double *k,
                                 const double *v, const double *go, double *dq, double *dk, double *dv,
                                 double *scores, double *o);

#endif /* IHA_REFERENCE_INTERNAL_H */
