/*
 * host_sgemm.c - timing cblas_sgemm for host_sgemm.h; without IHA_HAVE_CBLAS only the
 * "not built" answers are compiled.
 */
#include "host_sgemm.h"

#ifdef IHA_HAVE_CBLAS

#include <cblas.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "timer.h"

int host_sgemm_available(void) { return 1; }

const char *host_sgemm_library(void)
{
#ifdef IHA_CBLAS_NAME
    return IHA_CBLAS_NAME;
#else
    return "CBLAS";
#endif
}

int host_sgemm_seconds(size_t m, size_t n, size_t k, size_t reps, double *seconds)
{
    /* CBLAS takes int sizes; each matrix must also fit in size_t bytes. */
    size_t cap = SIZE_MAX / sizeof(float);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || (m && k > cap / m) || (k && n > cap / k) || (m && n > cap / m))
        return -1;
    float *a = malloc(m * k * sizeof *a), *b = malloc(k * n * sizeof *b), *c = malloc(m * n * sizeof *c);
    double *samples = malloc(reps * sizeof *samples);
    int ok = a && b && c && samples && reps > 0;
    if (ok) {
        for (size_t i = 0; i < m * k; i++)
            a[i] = 0.25f;
        for (size_t i = 0; i < k * n; i++)
            b[i] = 0.5f;
        for (size_t r = 0; r <= reps; r++) { /* r == 0 warms up: threads start, pages fault in */
            double start = timer_seconds();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k, b, (int)n,
                        0.0f, c, (int)n);
            if (r > 0)
                samples[r - 1] = timer_seconds() - start;
        }
        *seconds = timer_median(samples, reps);
    }
    free(a);
    free(b);
    free(c);
    free(samples);
    return ok ? 0 : -1;
}

#else

int host_sgemm_available(void) { return 0; }

const char *host_sgemm_library(void) { return "not built"; }

int host_sgemm_seconds(size_t m, size_t n, size_t k, size_t reps, double *seconds)
{
    (void)m, (void)n, (void)k, (void)reps, (void)seconds;
    return -1;
}

#endif
