/* The context structure and the error-flow helpers every module uses. */
#ifndef IHA_RUNTIME_CONTEXT_H
#define IHA_RUNTIME_CONTEXT_H
#include "iha.h"
#include "common/message.h"
#include "runtime/program.h"

/* Internal device buffers, grown on demand and reused between calls. */
typedef enum iha_workspace_slot {
    IHA_WS_Q,      /* projected Q  [B][N][H][d] */
    IHA_WS_K,
    IHA_WS_V,
    IHA_WS_QT,     /* pseudo-queries [B][H][T][d] */
    IHA_WS_KT,     /* pseudo-keys, packed in key blocks (see cl/attention.cl) */
    IHA_WS_VT,     /* pseudo-values [B][H][T][d] */
    IHA_WS_O,      /* attention output [B][H][T][d] */
    IHA_WS_Y,      /* collapsed [B][N][H][d] */
    IHA_WS_ROPE,   /* rotary cos/sin table [T][2][d/2] */
    IHA_WS_HOST_A, /* host-call staging */
    IHA_WS_HOST_B,
    IHA_WS_PARTIAL, /* decoding: partial softmax results per key split */
    IHA_WS_STEP,    /* decoding: per-sequence (n0, count) of the step */
    IHA_WS_SCORES, /* the unfused baseline's score matrix of one (b, h), [T][T] (src/measure) */
    IHA_WS_X,       /* half storage: x (or the first half input) converted to float */
    IHA_WS_OUT,     /* half storage: the float result before its conversion to half */
    IHA_WS_WEIGHT,  /* half weights: one projection matrix converted to float [D][H*d] */
    IHA_WS_MIXING,  /* half weights: alpha_q, alpha_k, alpha_v and r converted to float */
    IHA_WS_GEMM_B,  /* the library's SGEMM: B packed in panels (src/gemm/microkernel.c) */
    IHA_WS_DELTA,   /* attention backward: Dt = dO . O per virtual row [B][H][T] */
    /* The layer backward's own tensors, IHA_WS_GRAD_SLOTS slots from IHA_WS_GRAD (roles in
     * src/layer/layer_backward.c), apart from the slots the attention backward packs into. */
    IHA_WS_GRAD,
    IHA_WS_COUNT = IHA_WS_GRAD + 18
} iha_workspace_slot;
#define IHA_WS_GRAD_SLOTS (IHA_WS_COUNT - IHA_WS_GRAD)

/* The backend of the library's matrix products: src/gemm reads it, src/tune sets it (the
 * profile's GEMM entry or the device type's built-in) when the context is created and when it
 * tunes. own = 0 (the zeroed context): CLBlast. */
typedef struct iha_gemm_config {
    int own;      /* 1: cl/gemm.cl with the tile below; 0: CLBlast */
    int rows;     /* GEMM_MR: rows of C per work-item, 1 to 8 */
    int vec;      /* GEMM_VW: columns of C per work-item, 4, 8 or 16 */
    int unroll;   /* GEMM_KU: unrolling of the k loop, 1 to 16 */
    size_t group; /* row tiles per work-group */
} iha_gemm_config;

typedef struct iha_rope_key {
    size_t positions, head_dim;
    float base;
} iha_rope_key;

/* The device's identity strings whole (iha_device_info's copies are cut to their fields'
 * sizes): the program cache's and the profile's keys use these. */
typedef struct iha_device_identity {
    char *platform_version, *device_name, *device_vendor, *driver_version, *device_version;
} iha_device_identity;

struct iha_context {
    cl_platform_id platform;
    cl_device_id device;
    cl_context cl_ctx;
    cl_command_queue queue;
    iha_device_info info;
    iha_device_identity identity;

    iha_message message;
    cl_int cl_error;

    char *cache_dir;  /* NULL: disk cache off */
    int cache_tidied; /* the disk cache's tidy-up ran (disk_cache.h): once per context */
    char cache_dir_refused[256]; /* why the chosen cache directory is off ("" when it is not) */
    char *kernel_dir; /* NULL: embedded sources */
    iha_program_cache programs;
    int tuning; /* 1 while iha_tune's searches run: the programs they build are candidates */

    cl_mem workspace[IHA_WS_COUNT];
    size_t workspace_bytes[IHA_WS_COUNT];
    /* Set by a device-memory failure: the next call starts with no workspace. A lazily
     * allocating driver (NVIDIA's) accepts clCreateBuffer and fails at the first kernel that
     * uses the buffer; kept, such a buffer would fail every later call too. */
    int workspace_suspect;
    iha_rope_key rope_key; /* what IHA_WS_ROPE holds */

    int time_stages;
    iha_stage_times stage_times;

    /* A driver that ends kernel loops after loop_limit iterations in all (runtime/loop_limit.h):
     * the probe's flag, one int on the device; NULL where loops run to completion. */
    long loop_limit;
    cl_mem loop_flag;

    iha_gemm_config gemm; /* the backend of iha__sgemm (src/gemm/gemm.h) */
    struct iha_tune_state *tune; /* the tuning profile and the last call's choices (src/tune/state.h) */

    /* Set by src/gemm at the context's first CLBlast call; iha_context_free calls it after the
     * queue has finished (so the runtime needs no knowledge of CLBlast). */
    void (*release_gemm)(struct iha_context *ctx);

    /* The KV caches created on this context and not yet freed (src/layer/decode.c). A cache may
     * outlive its context: iha_context_free calls detach_kv_caches after the queue has
     * finished, which leaves each cache's own device buffers (they keep the cl_context alive)
     * and clears its pointer to the context. */
    struct iha_kv_cache *kv_caches;
    void (*detach_kv_caches)(struct iha_context *ctx);
};

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

/* A device buffer of at least `bytes` in workspace slot `slot` (reallocated when too small). */
iha_status iha__workspace_get(iha_context *ctx, iha_workspace_slot slot, size_t bytes, cl_mem *out);
void iha__workspace_release(iha_context *ctx);
/* Refuses a call whose internal buffers need more than the device's memory together, before
 * anything is allocated or enqueued (each one alone may still fit the largest allocation). */
iha_status iha__workspace_check_total(iha_context *ctx, size_t elems, size_t elem_bytes);

/* Device selection and description (device.c). */
iha_status iha__device_describe(cl_platform_id platform, cl_device_id device, unsigned pi, unsigned di,
                                iha_device_info *info);
/* The whole identity strings of a device (free them with iha__device_identity_free). */
iha_status iha__device_identity(cl_platform_id platform, cl_device_id device, iha_device_identity *id);
void iha__device_identity_free(iha_device_identity *id);
/* Chooses a device for `spec` (NULL: first GPU, else first device). On failure writes why
 * into msg. */
iha_status iha__device_select(const char *spec, cl_platform_id *platform, cl_device_id *device,
                              iha_device_info *info, iha_message *msg);
#endif
