/*
 * half_range.h - what rounding float inputs to half precision (--half) does to them that the
 * user should hear about: values below half's normal range lose precision, the smallest round
 * to zero, and the largest to infinity. The range is the user's choice; a clean result that
 * hides such a loss is not.
 */
#ifndef IHA_TOOLS_HALF_RANGE_H
#define IHA_TOOLS_HALF_RANGE_H

#include <stddef.h>

/* How many of n finite nonzero values leave half's normal range. */
typedef struct half_range {
    size_t subnormal; /* magnitude below 2^-14 (6.1e-5): fewer significant bits, rounding to a subnormal */
    size_t zero;      /* magnitude below 2^-25 (3.0e-8): rounds to zero */
    size_t infinite;  /* magnitude of 65520 and above: rounds to infinity */
} half_range;

/* Adds the values of v[0..n) to *r (start from a zeroed half_range). */
void half_range_count(const float *v, size_t n, half_range *r);

/* Writes into buf a sentence on what rounding `what` (n values, counted in *r) to half does,
 * e.g. "x: 32 of 32 values are below half's normal range (6.1e-05), 32 of them flush to zero";
 * returns 0 (buf empty) when every value stays in range. */
int half_range_describe(const char *what, size_t n, const half_range *r, char *buf, size_t size);

#endif
