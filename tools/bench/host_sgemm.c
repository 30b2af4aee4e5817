/*
 * host_sgemm.c - timing cblas_sgemm for host_sgemm.h, and which core OpenBLAS chose. The CBLAS is
 * opened with dlopen at the first call, so that only "iha bench" loads it: OpenBLAS starts its
 * threads when it loads, and under a tight address-space limit (ulimit -v) they loop in mmap at
 * exit, so every command that linked it would hang.
 */
#include "bench/host_sgemm.h"

#include <ctype.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timer.h"

/* CBLAS's enumerators (cblas.h), so that no header is needed at build time. */
#define CBLAS_ROW_MAJOR 101
#define CBLAS_NO_TRANS 111

typedef void (*sgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                         int lda, const float *b, int ldb, float beta, float *c, int ldc);
typedef char *(*name_fn)(void);

/* The libraries tried, in order: OpenBLAS, a CBLAS of its own, the BLAS (Debian's holds CBLAS). */
static const char *const kLibraries[] = {"libopenblas.so.0", "libcblas.so.3", "libblas.so.3"};

static struct {
    int tried;
    sgemm_fn sgemm;
    name_fn corename, config;
    char name[64];
} blas;

static void open_blas(void)
{
    if (blas.tried)
        return;
    blas.tried = 1;
    for (size_t i = 0; i < sizeof kLibraries / sizeof *kLibraries && !blas.sgemm; i++) {
        void *h = dlopen(kLibraries[i], RTLD_NOW | RTLD_LOCAL);
        if (h == NULL)
            continue;
        blas.sgemm = (sgemm_fn)(uintptr_t)dlsym(h, "cblas_sgemm");
        if (blas.sgemm == NULL) {
            dlclose(h);
            continue;
        }
        blas.corename = (name_fn)(uintptr_t)dlsym(h, "openblas_get_corename");
        blas.config = (name_fn)(uintptr_t)dlsym(h, "openblas_get_config");
        /* "OpenBLAS 0.3.21 DYNAMIC_ARCH ...": its first two words name it. */
        const char *config = blas.config ? blas.config() : NULL;
        int words = 0;
        size_t n = 0;
        for (; config && config[n] && n + 1 < sizeof blas.name; n++) {
            if (config[n] == ' ' && ++words == 2)
                break;
            blas.name[n] = config[n];
        }
        blas.name[n] = 0;
        if (n == 0)
            snprintf(blas.name, sizeof blas.name, "CBLAS in %s", kLibraries[i]);
    }
}

int host_sgemm_available(void)
{
    open_blas();
    return blas.sgemm != NULL;
}

const char *host_sgemm_library(void)
{
    open_blas();
    return blas.sgemm ? blas.name : "none found";
}

int host_sgemm_seconds(size_t m, size_t n, size_t k, size_t reps, double *seconds)
{
    open_blas();
    /* CBLAS takes int sizes; each matrix must also fit in size_t bytes. */
    size_t cap = SIZE_MAX / sizeof(float);
    if (!blas.sgemm || m > INT_MAX || n > INT_MAX || k > INT_MAX || (m && k > cap / m) || (k && n > cap / k) ||
        (m && n > cap / m))
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
            blas.sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, (int)m, (int)n, (int)k, 1.0f, a, (int)k, b,
                       (int)n, 0.0f, c, (int)n);
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
    open_blas();
    return blas.corename ? blas.corename() : NULL;
}

/* The widest vector ISA an OpenBLAS core's kernels use: 3 AVX-512, 2 AVX2 with FMA, 1 AVX, 0
 * anything older (Prescott's SSE3, Debian's default core) or unknown. The names are
 * openblas_get_corename's for x86 cores. */
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
    const char *core = host_sgemm_core();
    if (!core)
        return 0;
    int have = core_level(core), can = cpu_level();
    if (can < 0 || have >= can)
        return 0;
    const char *forced = getenv("OPENBLAS_CORETYPE");
    if (forced && forced[0])
        snprintf(buf, size,
                 "no ceiling: OPENBLAS_CORETYPE=%s runs OpenBLAS's %s kernels (%s) on a CPU with %s; unset it for "
                 "this command (env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)",
                 forced, core, isa[have], isa[can]);
    else
        snprintf(buf, size,
                 "no ceiling: this OpenBLAS runs its %s kernels (%s) on a CPU with %s; OPENBLAS_CORETYPE names a "
                 "wider core where the build has one",
                 core, isa[have], isa[can]);
    return 1;
}
