/* CLBlast's kernel parameters, for tuning. CLBlast keeps them in its own process-wide table
 * per device and precision: an override made here holds for every iha_context (and every other
 * CLBlast user) on that device in this process until it is overridden again. CLBlast 1.5.3 has
 * no call that restores its database (CLBlastClearCache keeps overrides) or reads it. */
#ifndef IHA_GEMM_GEMM_PARAMS_H
#define IHA_GEMM_GEMM_PARAMS_H
#include "runtime/context.h"

/* Sets the single-precision parameters of CLBlast kernel `kernel` ("Xgemm", "XgemmDirect",
 * "GemmRoutine") on the context's device: all of that kernel's parameters, by name. The next
 * SGEMM compiles (or reuses) the matching program. */
iha_status iha__gemm_override(iha_context *ctx, const char *kernel, size_t count, const char *const *names,
                              const size_t *values);
#endif
