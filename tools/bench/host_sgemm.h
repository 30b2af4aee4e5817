/*
 * host_sgemm.h - the host CPU's SGEMM rate through CBLAS (OpenBLAS on Debian), the ceiling
 * that a CPU OpenCL device's kernels are compared with. CBLAS is an optional build dependency:
 * tools/CMakeLists.txt defines IHA_HAVE_CBLAS when it finds one.
 */
#ifndef IHA_TOOLS_HOST_SGEMM_H
#define IHA_TOOLS_HOST_SGEMM_H

#include <stddef.h>

/* Nonzero when this build has CBLAS; host_sgemm_library names it ("OpenBLAS 0.3.21" or a
 * generic name), "not built" otherwise. */
int host_sgemm_available(void);
const char *host_sgemm_library(void);

/* The median seconds of C[m][n] = A[m][k] B[k][n] (row-major floats) over `reps` runs after one
 * warm-up run, on all the host threads the BLAS uses. Returns 0, or -1 when CBLAS is not built
 * in or host memory runs out. */
int host_sgemm_seconds(size_t m, size_t n, size_t k, size_t reps, double *seconds);

/* The CPU core whose kernels OpenBLAS runs ("SkylakeX", "Haswell": openblas_get_corename), or
 * NULL for another CBLAS or none. */
const char *host_sgemm_core(void);

/* Writes a warning into buf (size bytes) and returns 1 when OPENBLAS_CORETYPE makes OpenBLAS run
 * the kernels of an older core than the host CPU supports (Haswell's AVX2 kernels on an AVX-512
 * CPU run at half its rate, so every "of host SGEMM" ratio would be doubled); else returns 0. */
int host_sgemm_core_warning(char *buf, size_t size);

#endif
