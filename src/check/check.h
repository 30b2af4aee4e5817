/* iha_check's parts: how a row gathers its cases, the families that run the tuner's
 * verification problems (check_kernels.c), those that run public calls against the float64
 * reference (check_backward.c), and that reference (reference.c). */
#ifndef IHA_CHECK_CHECK_H
#define IHA_CHECK_CHECK_H
#include "iha_tune.h"
#include "runtime/context.h"

typedef struct iha_check_run {
    iha_context *ctx;
    unsigned families;
    const iha_check_options *options;
    iha_check_row *rows;
    size_t capacity;
    iha_check_summary *summary;
} iha_check_run;

/* A row with no case run yet: state ok, error 0. */
void iha__check_row_init(iha_check_row *row, const char *family, const char *config, int source, const char *shape,
                         double limit);
/* Folds one case into the row: a call that returned st (IHA_ERROR_UNSUPPORTED: refused; any
 * other failure: FAILED, with the status and the context's message in the note) or an error
 * against the limit (the note names the worst case). Clears the context's message, so that a
 * case's failure is not the check's. Returns 0 when the row should run no further cases. */
int iha__check_row_case(iha_context *ctx, iha_check_row *row, iha_status st, double error, const char *label);
/* st, or IHA_ERROR_UNSUPPORTED with a message when a kernel since the last probe had a loop cut
 * short by the driver (runtime/loop_limit.h). */
iha_status iha__check_probe(iha_context *ctx, iha_status st);
/* Counts the finished row, stores it when there is room and passes it to the callback. */
void iha__check_emit(iha_check_run *run, const iha_check_row *row);

/* The families. Each returns a failure only when the check cannot go on (host memory). */
iha_status iha__check_attention(iha_check_run *run);
iha_status iha__check_rows(iha_check_run *run);
iha_status iha__check_decode(iha_check_run *run);
iha_status iha__check_decode_compact(iha_check_run *run);
iha_status iha__check_gemm(iha_check_run *run);
iha_status iha__check_backward(iha_check_run *run, int storage); /* an iha_storage */
iha_status iha__check_layer(iha_check_run *run, int storage);

/* ---- The float64 reference of doc/spec.md (reference.c) ---- */

/* Attention of one (b, h) and, when go is not NULL, its backward: q, k, v, go [T][d] ->
 * o [T][d] and dq, dk, dv [T][d] (overwritten). Visibility as buffers.h's reference row. Returns
 * 0, or -1 when out of memory. */
int iha__check_attention_slab(long T, long d, long P, int mask, long W, double scale, const double *q,
                              const double *k, const double *v, const double *go, double *o, double *dq, double *dk,
                              double *dv);

/* One layer's forward and backward pass (doc/spec.md's steps, rotary when `rope`, base 10000, scale
 * 1/sqrt(d)): inputs x [B*N][D], w (wq, wk, wv [D][H*d], wo [H*d][D]), alpha (q, k, v) and r
 * [H][H][P], dz [B*N][D]; outputs z, dx, dw[4], dalpha[3], dr in the same shapes. */
typedef struct iha_check_layer {
    size_t B, N, D, H, d, P;
    int mask, rope;
    long window;
    const float *x, *w[4], *alpha[3], *r, *dz;
    double *z, *dx, *dw[4], *dalpha[3], *dr;
} iha_check_layer;
int iha__check_layer_reference(const iha_check_layer *layer);
#endif
