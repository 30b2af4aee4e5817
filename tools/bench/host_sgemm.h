/*
 * host_sgemm.h - the host CPU's SGEMM rate through CBLAS (OpenBLAS on Debian), the ceiling
 * that a CPU OpenCL device's kernels are compared with. The CBLAS is found at run time (dlopen:
 * host_sgemm.c says which libraries and why); without one the ceiling is not measured.
 */
#ifndef IHA_TOOLS_HOST_SGEMM_H
#define IHA_TOOLS_HOST_SGEMM_H

#include <stddef.h>

/* Nonzero when a CBLAS could be opened; host_sgemm_library names it ("OpenBLAS 0.3.21" or
 * "CBLAS in libblas.so.3"), "none found" otherwise. */
int host_sgemm_available(void);
const char *host_sgemm_library(void);

/* The median seconds of C[m][n] = A[m][k] B[k][n] (row-major floats) over `reps` runs after one
 * warm-up run, on all the host threads the BLAS uses. Returns 0, or -1 when no CBLAS was found
 * or host memory runs out. */
int host_sgemm_seconds(size_t m, size_t n, size_t k, size_t reps, double *seconds);

/* The CPU core whose kernels OpenBLAS runs ("SkylakeX", "Haswell": openblas_get_corename), or
 * NULL for another CBLAS or none. */
const char *host_sgemm_core(void);

/* Writes a warning that starts "no ceiling" into buf (size bytes) and returns 1 when OpenBLAS
 * runs the kernels of a core with narrower vectors than the host CPU's: Debian's OpenBLAS 0.3.21
 * picks Prescott (SSE3) on recent Xeons and EPYCs, and OPENBLAS_CORETYPE=Haswell forces AVX2 on
 * an AVX-512 CPU, at half its rate; every "of host SGEMM" ratio would be inflated. Else 0. */
int host_sgemm_core_warning(char *buf, size_t size);

#endif
