/*
 * reference.h - a float64 reference of doc/spec.md's forward and backward passes, in plain loops.
 * Written from doc/spec.md alone (not from the kernels): the tests and `iha demo` compare the
 * library against it. It depends on nothing but libc and libm.
 */
#ifndef IHA_REFERENCE_H
#define IHA_REFERENCE_H

#include <stddef.h>

typedef struct ref_problem {
    size_t B, N, D, H, d, P;
    int mask;            /* 0 causal, 1 token_causal, 2 none (same values as iha_mask) */
    long long window;    /* tokens, 0 = global */
    double scale;        /* 0 = 1/sqrt(d) */
    int rope;            /* nonzero: rotary at virtual positions (rotate-half, doc/spec.md step 3) */
    double rope_base;    /* 0 = 10000 */
    const float *x, *wq, *wk, *wv, *wo;           /* doc/spec.md's shapes */
    const float *alpha_q, *alpha_k, *alpha_v, *r; /* NULL = identity (only valid with P = 1) */
    /* Packed sequences (doc/spec.md): seq_count lengths in tokens over the B*N tokens, batch row 0
     * first, each at least 1, none crossing a row, together B*N; NULL (and 0) = one per row.
     * Attention runs per sequence, rotary positions restart at each sequence's first token. */
    const size_t *seq_lens;
    size_t seq_count;
} ref_problem;

/* Z rows of the full layer, in double. rows lists flat token-row indices b*N+n (any order);
 * z receives nrows*D doubles in that order. rows == NULL means all B*N rows in order (nrows is
 * then ignored). Computes only what those rows need (K/V for all tokens of the batches
 * involved, Q only for the requested tokens), so a demo can check sampled rows of a large layer
 * quickly. Returns 0, or -1 on allocation failure or an invalid problem (a zero dimension, an
 * unknown mask, a negative window, rotary with an odd d, NULL mixing with P > 1, a row index
 * out of range). */
int ref_forward(const ref_problem *p, const size_t *rows, size_t nrows, double *z);

/* Stages 2-5 only: q, k, v [B][N][H][d] -> y [B][N][H][d] (double). p->x/wq/wk/wv/wo and p->D
 * are unused. Returns 0 or -1 as ref_forward. */
int ref_attention_core(const ref_problem *p, const float *q, const float *k, const float *v, double *y);

/* Stage 4 only: qt, kt, vt [B][H][T][d] -> o [B][H][T][d], lse [B][H][T] (lse may be NULL).
 * Uses p->B, H, N, P, d, mask, window, scale; no rotary. A query that sees no key (impossible
 * with the three masks) gets o = 0 and lse = -infinity. Returns 0 or -1 as ref_forward. */
int ref_attention(const ref_problem *p, const float *qt, const float *kt, const float *vt, double *o,
                  double *lse);

/* The backward pass of stage 4 (doc/spec.md "The backward pass", attention): given qt, kt, vt and
 * dout = dLoss/dO, all [B][H][T][d], writes dqt, dkt, dvt [B][H][T][d] (double), recomputing
 * the forward's scores and LSE itself. Same parameters and return as ref_attention. */
int ref_attention_backward(const ref_problem *p, const float *qt, const float *kt, const float *vt,
                           const float *dout, double *dqt, double *dkt, double *dvt);

/* The gradients of the whole layer (doc/spec.md "The backward pass") for dLoss/dZ = dz [B][N][D], in
 * double: dx [B][N][D], wq, wk, wv [D][H*d], wo [H*d][D], alpha_q/k/v and r [H][H][P], every
 * one required. With P = 1 and NULL mixing (identity), the mixing gradients are those at the
 * identity. Returns 0, or -1 as ref_forward. */
typedef struct ref_grads {
    double *dx, *wq, *wk, *wv, *wo, *alpha_q, *alpha_k, *alpha_v, *r;
} ref_grads;
int ref_backward(const ref_problem *p, const float *dz, const ref_grads *out);

/* The gradients of stages 2-5 (ref_attention_core) for dLoss/dY = dy [B][N][H][d], in double:
 * dq, dk, dv [B][N][H][d] and alpha_q/k/v and r [H][H][P], every one required; the same steps
 * as ref_backward's between its projections. p->x/wq/wk/wv/wo and p->D are unused. Returns 0,
 * or -1 as ref_forward. */
typedef struct ref_core_grads {
    double *dq, *dk, *dv, *alpha_q, *alpha_k, *alpha_v, *r;
} ref_core_grads;
int ref_attention_core_backward(const ref_problem *p, const float *q, const float *k, const float *v,
                                const float *dy, const ref_core_grads *out);

#endif /* IHA_REFERENCE_H */
