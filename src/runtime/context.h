/* The context structure and the runtime's part of its setup and teardown. The modules above the
 * runtime keep their state behind the pointers at the end; src/api/context.c sets them up in
 * order and frees them in reverse, so the runtime needs no knowledge of them. */
#ifndef IHA_RUNTIME_CONTEXT_H
#define IHA_RUNTIME_CONTEXT_H
#include "iha.h"
#include "common/message.h"
#include "runtime/device.h"
#include "runtime/program.h"
#include "runtime/workspace.h"

enum { IHA_MMA_NONE, IHA_MMA_HARDWARE, IHA_MMA_EMULATED };

struct iha_context {
    cl_platform_id platform;
    cl_device_id device;
    cl_context cl_ctx;
    cl_command_queue queue;
    iha_device_info info;
    iha_device_identity identity;
    /* CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT: the floats of the device's widest vector registers
     * (PoCL on a CPU: 16 with AVX-512, 8 with AVX2, 4 with SSE), which the built-in tile shapes
     * follow; 1 where the driver does not say. */
    unsigned vector_floats;
    /* Kernels may issue cache prefetches (__builtin_prefetch): PoCL's CPU device, where a
     * work-item reads its keys and values in order and would otherwise wait on each block. Some
     * clang-based implementations reject the intrinsic when the kernel is created (Oclgrind:
     * "Undefined external function: llvm.prefetch"); GPUs stage through local memory instead. */
    int cpu_prefetch;

    iha_message message;
    cl_int cl_error;

    char *cache_dir;  /* NULL: disk cache off */
    int cache_tidied; /* the disk cache's tidy-up ran (disk_cache.h): once per context */
    char cache_dir_refused[256]; /* why the chosen cache directory is off ("" when it is not) */
    char *kernel_dir; /* NULL: embedded sources */
    iha_program_cache programs;

    cl_mem workspace[IHA_WS_COUNT];
    size_t workspace_bytes[IHA_WS_COUNT];
    unsigned long workspace_generation[IHA_WS_COUNT];
    /* Set by a device-memory failure: the next call starts with no workspace. A lazily
     * allocating driver (NVIDIA's) accepts clCreateBuffer and fails at the first kernel that
     * uses the buffer; kept, such a buffer would fail every later call too. */
    int workspace_suspect;

    int time_stages;
    iha_stage_times stage_times;

    /* A driver that ends kernel loops after loop_limit iterations in all (runtime/loop_limit.h):
     * the probe's flag, one int on the device; NULL where loops run to completion. */
    long loop_limit;
    cl_mem loop_flag;

    /* The tensor-core attention (cl/attention_mma_nv.cl): IHA_MMA_HARDWARE on NVIDIA devices of
     * compute capability 8.0 or more, IHA_MMA_EMULATED where IHA_MMA_EMULATE=1 asks for its
     * emulated path (the tests, on any device), else IHA_MMA_NONE; a failed build of the
     * hardware path sets IHA_MMA_NONE, so the variant stops being offered. */
    int mma;

    /* The higher modules' state, owned by them. */
    struct iha_rope_cache *rope;  /* what the rotary table's slot holds (src/kernels/rope.h) */
    struct iha_gemm_state *gemm;  /* the backend of iha__sgemm (src/gemm/sgemm.h) */
    struct iha_tune_state *tune;  /* the tuning profile and the last call's choices (src/tune/state.h) */
    struct iha_kv_cache *kv_caches; /* the live KV caches created on this context (src/layer/kv_cache.c) */
};

/* What iha_context_create resolved from its options and the environment (src/api/context.c). */
typedef struct iha_runtime_options {
    const char *device;               /* device spec; NULL: first GPU, else first device */
    cl_context opencl_context;        /* with opencl_queue: borrowed instead of created */
    cl_command_queue opencl_queue;
    const char *cache_dir;            /* NULL: disk cache off */
    const char *kernel_dir;           /* NULL: embedded sources */
    int time_stages;
    int mma_emulate;                  /* IHA_MMA_EMULATED whatever the device */
} iha_runtime_options;

/* Chooses or borrows the device and queue, records the directories and probes the driver's loop
 * limit. On failure the context is left for iha__runtime_release. */
iha_status iha__runtime_setup(iha_context *ctx, const iha_runtime_options *options);
/* Before the higher modules let go of their state: writes pending programs to the disk cache
 * and waits for the queue. */
void iha__runtime_finish_pending(iha_context *ctx);
/* Releases what iha__runtime_setup made (the workspace, programs, queue and OpenCL context);
 * not the context's memory. */
void iha__runtime_release(iha_context *ctx);
#endif
