/*
 * test_stages.h - the layer stage tests' cases and helpers (tests/test_layer_stages.c, forward;
 * tests/test_layer_stages_backward.c, backward). Include after <cmocka.h>, test_util.h and
 * test_layer.h.
 */
#ifndef IHA_TESTS_TEST_STAGES_H
#define IHA_TESTS_TEST_STAGES_H

#include "iha.h"

#define ST_TOL_F16 2e-3 /* doc/spec.md: half storage, float accumulation */

/* A layer case: shape, mask, window, rotary, storage. */
typedef struct st_case {
    iha_shape s;
    int mask;
    int64_t window;
    int rope;
    int act, weight; /* IHA_STORAGE_F32 or IHA_STORAGE_F16 */
    int identity;    /* P = 1: the NULL shortcut for the mixing and collapse */
    int packed;      /* two packed sequences per batch row (options->seq_lens) */
} st_case;

/* Every mask, windows, rotary, P = 1 (the identity shortcut too) to 3, packed sequences, half
 * activations with half and with float weights; the half cases last. */
#define ST_CASES 8
extern const st_case st_cases[ST_CASES];

/* The case's options (its packed lengths in a static array: one case at a time). */
iha_attention_options st_case_options(const st_case *c);
/* The options of iha_attention and iha_attention_backward between the stages: the layer's,
 * with rope 0 (the expand stage has rotated the queries and keys). */
iha_attention_options st_attention_options(const iha_attention_options *layer);
/* The n elements of a tu_storage_upload tensor as malloc'ed floats, its guards checked. */
float *st_read(int storage, iha_buffer b, size_t n, const char *what);
/* A malloc'ed double copy of n floats. */
double *st_to_double(const float *x, size_t n);
/* The largest |a - b| over n floats; 0 is bit for bit (no NaN in either: checked elsewhere). */
double st_max_diff(const float *a, const float *b, size_t n);
/* Rows [first*P, (first + n)*P) of each head of a [1][H][T][d] tensor, as [1][H][n*P][d]
 * (malloc'ed). */
float *st_rows_of(const float *t, const iha_shape *s, size_t first, size_t n);
/* Fails unless every element of the n floats of b is still NaN (and its guards untouched). */
void st_assert_unwritten(iha_buffer b, size_t n, const char *what);
/* Fails unless the call returned `expected` with a message on tu_ctx. */
void st_assert_refused(iha_status st, iha_status expected);

#endif /* IHA_TESTS_TEST_STAGES_H */
