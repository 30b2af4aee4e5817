/* The error flow every module uses: a failure is recorded in the context's message and returned
 * as a status (zstd's RETURN_ERROR_IF / FORWARD_IF_ERROR). */
#ifndef IHA_RUNTIME_ERROR_H
#define IHA_RUNTIME_ERROR_H
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include "iha.h"

/* Records a failure and returns `status`, for `return iha__fail(ctx, ...)`. */
iha_status iha__fail(iha_context *ctx, iha_status status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Records a failed OpenCL call `what` with its code, mapping allocation failures to
 * IHA_ERROR_DEVICE_MEMORY and the rest to IHA_ERROR_OPENCL. */
iha_status iha__fail_cl(iha_context *ctx, cl_int err, const char *what);
/* "CL_OUT_OF_RESOURCES" and so on; "CL_UNKNOWN_ERROR" for codes it does not know. */
const char *iha__cl_error_name(cl_int err);

#define IHA_RETURN_ERROR_IF(cond, ctx, status, ...)                 \
    do {                                                            \
        if (cond) return iha__fail((ctx), (status), __VA_ARGS__);   \
    } while (0)
#define IHA_FORWARD_IF_ERROR(expr)               \
    do {                                         \
        iha_status iha_fwd_ = (expr);            \
        if (iha_fwd_ != IHA_OK) return iha_fwd_; \
    } while (0)
#define IHA_CL_CHECK(ctx, call, what)                                  \
    do {                                                               \
        cl_int iha_cl_ = (call);                                       \
        if (iha_cl_ != CL_SUCCESS) return iha__fail_cl((ctx), iha_cl_, (what)); \
    } while (0)
#endif
