/* Overflow-checked size arithmetic: every size derived from a user shape goes through these. */
#ifndef IHA_COMMON_CHECKED_H
#define IHA_COMMON_CHECKED_H
#include <stddef.h>
#include <stdint.h>

/* *out = a * b; returns 0 on overflow (then *out is unspecified). */
static inline int iha__mul(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

static inline int iha__add(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* *out = product of n factors; returns 0 on overflow. */
static inline int iha__mul_n(size_t *out, size_t n, const size_t *factors)
{
    size_t p = 1;
    for (size_t i = 0; i < n; ++i)
        if (!iha__mul(p, factors[i], &p)) return 0;
    *out = p;
    return 1;
}

static inline size_t iha__round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
#endif
