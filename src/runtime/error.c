/* Recording failures in the context, and naming OpenCL error codes. */
#include "runtime/error.h"
#include "runtime/context.h"

#include <stdarg.h>

iha_status iha__fail(iha_context *ctx, iha_status status, const char *fmt, ...)
{
    if (ctx == NULL) return status;
    va_list ap;
    va_start(ap, fmt);
    iha__message_vprintf(&ctx->message, fmt, ap);
    va_end(ap);
    return status;
}

const char *iha__cl_error_name(cl_int err)
{
    switch (err) {
#define IHA_CL_NAME_(code) \
    case code:             \
        return #code;
        IHA_CL_NAME_(CL_SUCCESS)
        IHA_CL_NAME_(CL_DEVICE_NOT_FOUND)
        IHA_CL_NAME_(CL_DEVICE_NOT_AVAILABLE)
        IHA_CL_NAME_(CL_COMPILER_NOT_AVAILABLE)
        IHA_CL_NAME_(CL_MEM_OBJECT_ALLOCATION_FAILURE)
        IHA_CL_NAME_(CL_OUT_OF_RESOURCES)
        IHA_CL_NAME_(CL_OUT_OF_HOST_MEMORY)
        IHA_CL_NAME_(CL_PROFILING_INFO_NOT_AVAILABLE)
        IHA_CL_NAME_(CL_MEM_COPY_OVERLAP)
        IHA_CL_NAME_(CL_IMAGE_FORMAT_MISMATCH)
        IHA_CL_NAME_(CL_IMAGE_FORMAT_NOT_SUPPORTED)
        IHA_CL_NAME_(CL_BUILD_PROGRAM_FAILURE)
        IHA_CL_NAME_(CL_MAP_FAILURE)
        IHA_CL_NAME_(CL_MISALIGNED_SUB_BUFFER_OFFSET)
        IHA_CL_NAME_(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
        IHA_CL_NAME_(CL_INVALID_VALUE)
        IHA_CL_NAME_(CL_INVALID_DEVICE_TYPE)
        IHA_CL_NAME_(CL_INVALID_PLATFORM)
        IHA_CL_NAME_(CL_INVALID_DEVICE)
        IHA_CL_NAME_(CL_INVALID_CONTEXT)
        IHA_CL_NAME_(CL_INVALID_QUEUE_PROPERTIES)
        IHA_CL_NAME_(CL_INVALID_COMMAND_QUEUE)
        IHA_CL_NAME_(CL_INVALID_HOST_PTR)
        IHA_CL_NAME_(CL_INVALID_MEM_OBJECT)
        IHA_CL_NAME_(CL_INVALID_BINARY)
        IHA_CL_NAME_(CL_INVALID_BUILD_OPTIONS)
        IHA_CL_NAME_(CL_INVALID_PROGRAM)
        IHA_CL_NAME_(CL_INVALID_PROGRAM_EXECUTABLE)
        IHA_CL_NAME_(CL_INVALID_KERNEL_NAME)
        IHA_CL_NAME_(CL_INVALID_KERNEL_DEFINITION)
        IHA_CL_NAME_(CL_INVALID_KERNEL)
        IHA_CL_NAME_(CL_INVALID_ARG_INDEX)
        IHA_CL_NAME_(CL_INVALID_ARG_VALUE)
        IHA_CL_NAME_(CL_INVALID_ARG_SIZE)
        IHA_CL_NAME_(CL_INVALID_KERNEL_ARGS)
        IHA_CL_NAME_(CL_INVALID_WORK_DIMENSION)
        IHA_CL_NAME_(CL_INVALID_WORK_GROUP_SIZE)
        IHA_CL_NAME_(CL_INVALID_WORK_ITEM_SIZE)
        IHA_CL_NAME_(CL_INVALID_GLOBAL_OFFSET)
        IHA_CL_NAME_(CL_INVALID_EVENT_WAIT_LIST)
        IHA_CL_NAME_(CL_INVALID_EVENT)
        IHA_CL_NAME_(CL_INVALID_OPERATION)
        IHA_CL_NAME_(CL_INVALID_BUFFER_SIZE)
        IHA_CL_NAME_(CL_INVALID_GLOBAL_WORK_SIZE)
#undef IHA_CL_NAME_
    }
    return "CL_UNKNOWN_ERROR";
}

iha_status iha__fail_cl(iha_context *ctx, cl_int err, const char *what)
{
    iha_status status = (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
                         err == CL_OUT_OF_HOST_MEMORY || err == CL_INVALID_BUFFER_SIZE)
                            ? IHA_ERROR_DEVICE_MEMORY
                            : IHA_ERROR_OPENCL;
    if (ctx == NULL) return status;
    ctx->cl_error = err;
    if (status == IHA_ERROR_DEVICE_MEMORY) ctx->workspace_suspect = 1;
    return iha__fail(ctx, status, "%s failed: %s (%d)", what, iha__cl_error_name(err), (int)err);
}
