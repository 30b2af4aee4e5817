/* Setting kernel arguments and launching, with every OpenCL call checked. */
#ifndef IHA_RUNTIME_LAUNCH_H
#define IHA_RUNTIME_LAUNCH_H
#include "runtime/context.h"

/* Sets arguments in order; the first failure sticks in err, so a launch checks once. */
typedef struct iha_args {
    cl_kernel kernel;
    cl_uint index;
    cl_int err;
} iha_args;

static inline iha_args iha__args_begin(cl_kernel kernel)
{
    iha_args a = {kernel, 0, CL_SUCCESS};
    return a;
}

static inline void iha__arg(iha_args *a, size_t size, const void *value)
{
    if (a->err == CL_SUCCESS) a->err = clSetKernelArg(a->kernel, a->index, size, value);
    a->index++;
}

static inline void iha__arg_mem(iha_args *a, cl_mem m) { iha__arg(a, sizeof m, &m); }
static inline void iha__arg_int(iha_args *a, cl_int x) { iha__arg(a, sizeof x, &x); }
static inline void iha__arg_ulong(iha_args *a, cl_ulong x) { iha__arg(a, sizeof x, &x); }
static inline void iha__arg_float(iha_args *a, cl_float x) { iha__arg(a, sizeof x, &x); }

/* A tensor argument pair: buffer, element offset. */
static inline void iha__arg_tensor(iha_args *a, cl_mem mem, size_t offset)
{
    iha__arg_mem(a, mem);
    iha__arg_ulong(a, offset);
}

/* A mixing or collapse matrix that may be absent (mem NULL: identity): buffer, offset and the
 * kernel's `identity` flag. An absent matrix passes `stand_in` so no argument is NULL. */
static inline void iha__arg_mixing(iha_args *a, cl_mem mem, size_t offset, cl_mem stand_in)
{
    iha__arg_tensor(a, mem ? mem : stand_in, mem ? offset : 0);
    iha__arg_int(a, mem == NULL);
}

/* Enqueues `a.kernel` over `global` rounded up to multiples of `local` (local may be NULL to
 * let the implementation choose). `what` names the kernel in messages. */
iha_status iha__launch(iha_context *ctx, const iha_args *a, cl_uint dims, const size_t *global, const size_t *local,
                       const char *what);
#endif
