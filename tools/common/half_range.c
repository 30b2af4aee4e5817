/*
 * half_range.c - counting the float inputs that rounding to half precision loses (half_range.h).
 */
#include "common/half_range.h"

#include <math.h>
#include <stdio.h>

#define HALF_MIN_NORMAL 6.103515625e-05f  /* 2^-14 */
#define HALF_ROUNDS_TO_ZERO 2.98023224e-08f /* 2^-25: half the smallest subnormal, 2^-24 */
#define HALF_ROUNDS_TO_INF 65520.0f       /* halfway between 65504 and 2^16: rounds up, to infinity */

void half_range_count(const float *v, size_t n, half_range *r)
{
    for (size_t i = 0; i < n; i++) {
        const float a = fabsf(v[i]);
        if (a == 0.0f || !isfinite(a))
            continue;
        r->subnormal += a < HALF_MIN_NORMAL;
        r->zero += a <= HALF_ROUNDS_TO_ZERO;
        r->infinite += a >= HALF_ROUNDS_TO_INF;
    }
}

int half_range_describe(const char *what, size_t n, const half_range *r, char *buf, size_t size)
{
    buf[0] = '\0';
    int used = 0;
    if (r->subnormal)
        used = snprintf(buf, size, "%s: %zu of %zu values are below half's normal range (%.1e) and lose precision%s",
                        what, r->subnormal, n, (double)HALF_MIN_NORMAL, r->zero ? "; " : "");
    if (r->zero && used >= 0 && (size_t)used < size)
        used += snprintf(buf + used, size - (size_t)used, "%zu of them flush to zero", r->zero);
    if (r->infinite && used >= 0 && (size_t)used < size)
        snprintf(buf + used, size - (size_t)used, "%s%s: %zu of %zu values exceed half's largest (65504) and become infinite",
                 used ? "; " : "", what, r->infinite, n);
    return buf[0] != '\0';
}
