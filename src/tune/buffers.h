/* Small helpers the tuning problems share: seeded random host data, device buffers made from
 * it, NaN poisoning, blocking reads, and the relative L2 error of doc/spec.md's numerical contract. */
#ifndef IHA_TUNE_BUFFERS_H
#define IHA_TUNE_BUFFERS_H
#include <stdint.h>

#include "runtime/context.h"
#include "tune/space.h"

/* n floats uniform in [-1, 1) from a xorshift64* stream seeded with `seed` (malloc'd; NULL when
 * out of memory). */
float *iha__tune_random(size_t n, uint64_t seed);

/* A device buffer of n floats holding `data` (NULL: uninitialised). */
iha_status iha__tune_buffer(iha_context *ctx, size_t n, const float *data, cl_mem *out);
/* A device buffer of a cache's n elements: the floats x, or with half storage x rounded to half
 * (x then holds the values stored, for the reference). */
iha_status iha__tune_buffer_stored(iha_context *ctx, float *x, size_t n, int half, cl_mem *out);
/* Rounds n floats to the values half storage keeps (round to nearest even). */
void iha__tune_round_half(float *x, size_t n);
/* Fills n floats with NaN (blocking). */
iha_status iha__tune_poison(iha_context *ctx, cl_mem mem, size_t n);
/* Blocking read of n floats from element offset 0. */
iha_status iha__tune_read(iha_context *ctx, cl_mem mem, size_t n, float *out);
/* Releases up to n buffers (NULL entries allowed). */
void iha__tune_release(cl_mem *mems, size_t n);

/* doc/spec.md's visibility rule: whether virtual query t sees virtual key u under mask and a window
 * of W tokens (0: global). */
int iha__tune_visible(long t, long u, long P, int mask, long W);

/* The verification reference of the attention kernels (doc/spec.md step 4) for one query row in
 * float64: out[d] = the softmax over the keys u < T that virtual query t sees (mask, window W in
 * tokens) of scale * dot(q, k[u]), applied to v[u]. k and v are rows [T][d]; s is scratch of T
 * doubles. A row that sees no key gets zeros. */
void iha__tune_reference_row(const float *q, const float *k, const float *v, long t, long T, long d, long P, int mask,
                             long W, double scale, double *s, double *out);

/* ||out - ref|| / ||ref||; +inf when an output is not finite. */
double iha__tune_rel_error(const float *out, const double *ref, size_t n);

/* The input copies a problem keeps: 1 to verify, else `asked` within [1, max]. */
int iha__tune_copy_count(int verify, int asked, int max);

/* A check whose output is one buffer of n floats: poisons it, enqueues the candidate (run with
 * copy 0 of the problem's inputs), reads it back, and sets *error to its relative error against
 * what reference writes for the problem. */
typedef iha_status (*iha_tune_run_fn)(iha_context *ctx, void *problem, const iha_tune_config *c, int copy);
iha_status iha__tune_check_output(iha_context *ctx, void *problem, const iha_tune_config *c, iha_tune_run_fn run,
                                  cl_mem output, size_t n, void (*reference)(const void *problem, double *ref),
                                  double *error);
#endif
