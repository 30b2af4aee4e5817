/*
 * host_sgemm.c - timing cblas_sgemm for host_sgemm.h, and which core OpenBLAS chose; without
 * IHA_HAVE_CBLAS only the "not built" answers are compiled, and without IHA_HAVE_OPENBLAS (another
 * CBLAS) no core is named.
 */
#include "bench/host_sgemm.h"

#ifdef IHA_HAVE_CBLAS

#include <cblas.h>
#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timer.h"

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

const char *host_sgemm_core(void)
{
#ifdef IHA_HAVE_OPENBLAS
    return openblas_get_corename();
#else
    return NULL;
#endif
}

/* The widest vector ISA an OpenBLAS core's kernels use: 3 AVX-512, 2 AVX2 with FMA, 1 AVX, 0
 * anything older or unknown. The names are openblas_get_corename's for x86 cores. */
static int core_level(const char *core)
{
    static const char *const avx512[] = {"skylakex", "cooperlake", "sapphirerapids"};
    static const char *const avx2[] = {"haswell", "zen"};
    static const char *const avx[] = {"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"};
    char name[32];
    size_t n = 0;
    for (; core[n] && n + 1 < sizeof name; n++)
        name[n] = (char)tolower((unsigned char)core[n]);
    name[n] = 0;
    for (size_t i = 0; i < sizeof avx512 / sizeof *avx512; i++)
        if (!strcmp(name, avx512[i]))
            return 3;
    for (size_t i = 0; i < sizeof avx2 / sizeof *avx2; i++)
        if (!strcmp(name, avx2[i]))
            return 2;
    for (size_t i = 0; i < sizeof avx / sizeof *avx; i++)
        if (!strcmp(name, avx[i]))
            return 1;
    return 0;
}

/* The same scale for the CPU this runs on; -1 where the compiler cannot ask (not x86, not GCC
 * or Clang), so that no warning is given. */
static int cpu_level(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    if (__builtin_cpu_supports("avx512f"))
        return 3;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 2;
    return __builtin_cpu_supports("avx") ? 1 : 0;
#else
    return -1;
#endif
}

int host_sgemm_core_warning(char *buf, size_t size)
{
    static const char *const isa[] = {"no AVX", "AVX", "AVX2", "AVX-512"};
    const char *forced = getenv("OPENBLAS_CORETYPE");
    const char *core = host_sgemm_core();
    if (!forced || !forced[0] || !core)
        return 0;
    int have = core_level(core), can = cpu_level();
    if (can < 0 || have >= can)
        return 0;
    snprintf(buf, size,
             "OPENBLAS_CORETYPE=%s runs OpenBLAS's %s kernels (%s) on a CPU with %s: host SGEMM is below "
             "this CPU's rate; unset it for this command (env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)",
             forced, core, isa[have], isa[can]);
    return 1;
}

#else

int host_sgemm_available(void) { return 0; }

const char *host_sgemm_library(void) { return "not built"; }

int host_sgemm_seconds(size_t m, size_t n, size_t k, size_t reps, double *seconds)
{
    (void)m, (void)n, (void)k, (void)reps, (void)seconds;
    return -1;
}

const char *host_sgemm_core(void) { return NULL; }

int host_sgemm_core_warning(char *buf, size_t size)
{
    (void)buf, (void)size;
    return 0;
}

#endif
