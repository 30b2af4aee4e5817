/* Internal device buffers, grown on demand and reused between calls (workspace.c). The runtime
 * stores them by slot number and knows nothing of their roles: each module names its own slots
 * from its base below, in its own header, and asserts that they stay below the next base. */
#ifndef IHA_RUNTIME_WORKSPACE_H
#define IHA_RUNTIME_WORKSPACE_H
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include "iha.h"
#include <CL/cl.h>

typedef int iha_workspace_slot;

enum {
    IHA_WS_KERNELS_BASE = 0,  /* kernels/rope.h */
    IHA_WS_GEMM_BASE = 1,     /* gemm/gemm.h */
    IHA_WS_LAYER_BASE = 2,    /* layer/workspace.h */
    IHA_WS_MEASURE_BASE = 48, /* measure/measure.h */
    IHA_WS_MULTI_BASE = 49,   /* multi/multi.h */
    IHA_WS_COUNT = 65
};

/* A device buffer of at least `bytes` in workspace slot `slot` (reallocated when too small). */
iha_status iha__workspace_get(iha_context *ctx, iha_workspace_slot slot, size_t bytes, cl_mem *out);
/* Counts the times slot's buffer was replaced or released: an owner that keeps contents in a
 * slot between calls (the rotary table) compares it with the count it saw when it wrote them. */
unsigned long iha__workspace_generation(const iha_context *ctx, iha_workspace_slot slot);
void iha__workspace_release(iha_context *ctx);
/* Refuses a call whose internal buffers need more than the device's memory together, before
 * anything is allocated or enqueued (each one alone may still fit the largest allocation). */
iha_status iha__workspace_check_total(iha_context *ctx, size_t elems, size_t elem_bytes);
#endif
