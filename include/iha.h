/*
 * iha.h - Interleaved Head Attention on any OpenCL device.
 *
 * This header is the manual. It is C11, includes only <CL/cl.h>, <stddef.h> and <stdint.h>,
 * and every declaration below says what it needs, what it returns and who owns what.
 *
 * The computation is Duvvuri et al., "Interleaved Head Attention" (arXiv 2602.21371, 2026):
 * each head's queries, keys and values are mixed into P pseudo-heads, interleaved token-major
 * into a virtual sequence of T = N*P tokens, attended over with a flash-style kernel, and
 * collapsed back to H heads. The exact definition (shapes, index order, masks, rotary) is the
 * project's SPEC.md; the short form is repeated next to each call.
 *
 * Conventions that hold for every call
 * ------------------------------------
 * - Tensors are dense, row-major float32 (C order, last index fastest).
 * - Device tensors are passed as iha_buffer: an application-owned cl_mem plus an offset in
 *   ELEMENTS (floats), like CLBlast. The library never retains or frees them. Before any work
 *   is enqueued every buffer is checked against CL_MEM_SIZE; too small a buffer is refused
 *   with IHA_ERROR_BUFFER_TOO_SMALL and nothing is written.
 * - Work is enqueued on the context's in-order command queue and the call returns once it is
 *   enqueued: the outputs are ready after iha_context_finish() (or clFinish on the queue).
 *   Calls with a "_host" suffix are the exception: they block until results are in host memory.
 * - On failure a call returns a status other than IHA_OK and leaves a message in the context
 *   (iha_context_message). The library never aborts, never prints, reads the environment only
 *   in iha_context_create, and keeps no process-wide mutable state.
 * - Thread safety: different contexts may be used from different threads at the same time.
 *   One context must be used by one thread at a time (guard it with your own lock to share it).
 */
#ifndef IHA_H
#define IHA_H

#include <stddef.h>
#include <stdint.h>

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Version ---------------------------------------------------------------------------- */

#define IHA_VERSION_MAJOR 0
#define IHA_VERSION_MINOR 1
#define IHA_VERSION_PATCH 0
#define IHA_VERSION_NUMBER (IHA_VERSION_MAJOR * 10000 + IHA_VERSION_MINOR * 100 + IHA_VERSION_PATCH)
#define IHA_STRINGIFY_(x) #x
#define IHA_STRINGIFY(x) IHA_STRINGIFY_(x)
#define IHA_VERSION_STRING \
    IHA_STRINGIFY(IHA_VERSION_MAJOR) "." IHA_STRINGIFY(IHA_VERSION_MINOR) "." IHA_STRINGIFY(IHA_VERSION_PATCH)

/* The version of the library actually linked, as IHA_VERSION_NUMBER and as a string. */
unsigned iha_version_number(void);
const char *iha_version_string(void);

/* ---- Status codes ----------------------------------------------------------------------- */

/* One table: name, value, generic description. iha_status_name/iha_status_description read it. */
#define IHA_STATUS_MAP(X)                                                                          \
    X(IHA_OK, 0, "success")                                                                        \
    X(IHA_ERROR_INVALID_ARGUMENT, -1, "an argument is NULL, zero, negative or out of range")       \
    X(IHA_ERROR_UNSUPPORTED, -2, "valid request that this library or device does not support")     \
    X(IHA_ERROR_SIZE_OVERFLOW, -3, "a size computed from the shape overflows size_t")              \
    X(IHA_ERROR_BUFFER_TOO_SMALL, -4, "a buffer is smaller than its shape and offset require")     \
    X(IHA_ERROR_HOST_MEMORY, -5, "host memory allocation failed")                                  \
    X(IHA_ERROR_DEVICE_MEMORY, -6, "device memory allocation failed or the device ran out")        \
    X(IHA_ERROR_NO_DEVICE, -7, "no OpenCL device matches the request")                             \
    X(IHA_ERROR_BUILD, -8, "an OpenCL kernel failed to build; the message holds the build log")    \
    X(IHA_ERROR_OPENCL, -9, "an OpenCL call failed; iha_context_cl_error gives its code")          \
    X(IHA_ERROR_GEMM, -10, "CLBlast failed; the message holds its status code")                    \
    X(IHA_ERROR_IO, -11, "a file could not be read or written")

typedef enum iha_status {
#define IHA_STATUS_ENUM_(name, value, text) name = value,
    IHA_STATUS_MAP(IHA_STATUS_ENUM_)
#undef IHA_STATUS_ENUM_
} iha_status;

/* "IHA_ERROR_BUFFER_TOO_SMALL" for IHA_ERROR_BUFFER_TOO_SMALL; "IHA_STATUS_UNKNOWN" otherwise.
 * The returned strings are static. */
const char *iha_status_name(iha_status status);
/* A one-line generic description of a status (static string). The specific reason of the
 * last failure on a context is iha_context_message(). */
const char *iha_status_description(iha_status status);

/* ---- Devices ---------------------------------------------------------------------------- */

/* What iha_devices_list reports for each OpenCL device. Fixed layout, no pointers. */
typedef struct iha_device_info {
    unsigned platform_index, device_index; /* the P:D pair that IHA_DEVICE accepts */
    char platform_name[128];
    char platform_version[128];
    char device_name[128];
    char device_vendor[128];
    char driver_version[64];
    char device_version[64];
    int is_gpu, is_cpu;          /* CL_DEVICE_TYPE flags */
    int has_fp16;                /* cl_khr_fp16 advertised */
    unsigned compute_units;
    uint64_t global_mem_bytes;
    uint64_t max_alloc_bytes;    /* largest single buffer */
    uint64_t local_mem_bytes;
    int local_mem_is_global;     /* CL_GLOBAL: local memory is emulated (e.g. PoCL on a CPU) */
    size_t max_work_group_size;
} iha_device_info;

/* Fills up to `capacity` entries of `out` (which may be NULL when capacity is 0) and stores
 * the total number of devices on all platforms in *count. Returns IHA_ERROR_NO_DEVICE when
 * no OpenCL platform is installed, IHA_ERROR_INVALID_ARGUMENT when count is NULL. */
iha_status iha_devices_list(iha_device_info *out, size_t capacity, size_t *count);

/* ---- Context ---------------------------------------------------------------------------- */

/* A context owns (or borrows) one OpenCL device, context and in-order queue, the compiled
 * kernels, CLBlast state, internal workspace buffers and the last error message. */
typedef struct iha_context iha_context;

typedef struct iha_context_options {
    /* Device choice: "P:D" (platform and device index, see iha_devices_list) or a
     * case-insensitive substring of the platform or device name ("nvidia", "pocl", "cpu" and
     * "gpu" also match by device type). NULL: the environment variable IHA_DEVICE, else the
     * first GPU, else the first device of any type. Ignored when borrowing a queue. */
    const char *device;
    /* Program cache directory. NULL: $IHA_CACHE_DIR, else $XDG_CACHE_HOME/iha, else
     * ~/.cache/iha. The value "off" (here or in IHA_CACHE_DIR) disables the disk cache. */
    const char *cache_dir;
    /* Developer option: read kernel sources from this directory (the repository's cl/)
     * instead of the copies embedded at build time. NULL: $IHA_KERNEL_DIR, else embedded. */
    const char *kernel_dir;
    /* Borrow the application's OpenCL objects: set both or neither. The queue must belong to
     * the context and be in-order. The library retains them while the iha_context lives and
     * releases only its own references. */
    cl_context cl_context;
    cl_command_queue cl_queue;
    /* Nonzero: every layer call finishes the queue after each stage and records wall time per
     * stage (iha_context_stage_times). Serialises the queue; for tools and benchmarks. */
    int time_stages;
} iha_context_options;

/* Sets every field of *options to its default (all NULL/0). */
void iha_context_options_init(iha_context_options *options);

/* Creates a context. `options` may be NULL for all defaults. On success stores a new context
 * in *out (free it with iha_context_free). On failure stores NULL in *out and, when `message`
 * is not NULL, writes a NUL-terminated explanation of at most message_size bytes into it.
 * Returns IHA_ERROR_NO_DEVICE when no device matches, IHA_ERROR_OPENCL when the OpenCL
 * context or queue cannot be made, IHA_ERROR_INVALID_ARGUMENT for a half-given borrow or an
 * out-of-order queue. */
iha_status iha_context_create(iha_context **out, const iha_context_options *options, char *message,
                              size_t message_size);

/* Waits for queued work, releases everything the context owns and frees it. NULL is allowed.
 * Borrowed OpenCL objects and application buffers stay valid. */
void iha_context_free(iha_context *ctx);

/* The message of the last failed call on this context ("" when none). Owned by the context,
 * valid until the next call on it. For IHA_ERROR_BUILD it contains the OpenCL build log. */
const char *iha_context_message(const iha_context *ctx);
/* The OpenCL error code of the last IHA_ERROR_OPENCL / IHA_ERROR_DEVICE_MEMORY failure
 * (e.g. -4 for CL_MEM_OBJECT_ALLOCATION_FAILURE), or 0. */
cl_int iha_context_cl_error(const iha_context *ctx);

/* The OpenCL objects in use (owned by the context unless borrowed; do not release them). */
cl_context iha_context_cl_context(const iha_context *ctx);
cl_command_queue iha_context_cl_queue(const iha_context *ctx);
cl_device_id iha_context_cl_device(const iha_context *ctx);
/* The device's name, e.g. "pthread-haswell-AMD EPYC 7B13" (owned by the context). */
const char *iha_context_device_name(const iha_context *ctx);

/* Blocks until all work enqueued by the library on this context has finished. */
iha_status iha_context_finish(iha_context *ctx);

/* Releases internal workspace buffers (they are grown on demand and reused between calls). */
void iha_context_trim(iha_context *ctx);

/* Wall-clock seconds per stage of the last layer call, when options.time_stages was set
 * (all zero otherwise). */
typedef struct iha_stage_times {
    double projections; /* X W_Q, X W_K, X W_V */
    double mixing;      /* head mixing into pseudo-heads, interleaving, rotary */
    double attention;   /* flash attention over the T virtual tokens */
    double collapse;    /* fold-back of pseudo-heads with R */
    double output;      /* Y W_O */
} iha_stage_times;
void iha_context_stage_times(const iha_context *ctx, iha_stage_times *out);

/* ---- Problem description ---------------------------------------------------------------- */

/* Which virtual keys u a virtual query t sees (n = t/P, m = u/P are token indices):
 *   IHA_MASK_CAUSAL        u <= t            (the paper's causal mask over the expanded sequence)
 *   IHA_MASK_TOKEN_CAUSAL  m <= n            (the P pseudo-tokens of a token see each other)
 *   IHA_MASK_NONE          always            (bidirectional)
 * A window of W > 0 tokens additionally requires t - u < W*P, n - m < W, |n - m| < W
 * respectively. */
typedef enum iha_mask { IHA_MASK_CAUSAL = 0, IHA_MASK_TOKEN_CAUSAL = 1, IHA_MASK_NONE = 2 } iha_mask;

typedef struct iha_attention_options {
    int mask;           /* an iha_mask value; anything else is IHA_ERROR_INVALID_ARGUMENT */
    int64_t window;     /* sliding window in tokens; 0 = global; negative is invalid */
    float scale;        /* score scale; 0 means 1/sqrt(d); NaN or infinite is invalid */
    int rope;           /* nonzero: rotary embedding of Qt and Kt at virtual positions (d even) */
    float rope_base;    /* rotary base; 0 means 10000 */
} iha_attention_options;

/* Defaults: causal, global, scale 1/sqrt(d), no rotary. */
void iha_attention_options_init(iha_attention_options *options);

/* Shape of one layer. Limits: every field >= 1, head_dim <= 256; every tensor's element count
 * (and T = tokens*pseudo) must fit in size_t and each internal buffer in the device's largest
 * allocation. */
typedef struct iha_shape {
    size_t batch;     /* B */
    size_t tokens;    /* N, tokens per sequence */
    size_t model_dim; /* D */
    size_t heads;     /* H */
    size_t head_dim;  /* d, 1..256 */
    size_t pseudo;    /* P, pseudo-heads per head; 1 is plain multi-head attention */
} iha_shape;

/* A device tensor: an application-owned cl_mem and an offset in elements (floats). */
typedef struct iha_buffer {
    cl_mem mem;
    size_t offset;
} iha_buffer;

/* The parameters of one layer, all device tensors (shapes with H heads, d head width,
 * P pseudo-heads, D model width):
 *   wq, wk, wv  [D][H*d]   column block h*d .. h*d+d-1 is head h
 *   wo          [H*d][D]
 *   alpha_q/k/v [H][H][P]  index [m][h][p]: source head m, target head h, pseudo index p
 *   r           [H][H][P]  index [h][m][p]: target head h, source head m, pseudo index p
 * Identity shortcut: with P = 1, alpha_q, alpha_k, alpha_v and r may all have mem == NULL,
 * meaning identity mixing and collapse, i.e. standard multi-head attention. */
typedef struct iha_layer_weights {
    iha_buffer wq, wk, wv, wo;
    iha_buffer alpha_q, alpha_k, alpha_v, r;
} iha_layer_weights;

/* ---- Calls ------------------------------------------------------------------------------ */

/* One IHA layer: Z = IHA(X) with X, Z [B][N][D].
 *   Q = X W_Q (and K, V); Qt[b][h][n*P+p] = sum_m alpha_Q[m][h][p] Q[b][n][m] (and Kt, Vt);
 *   optional rotary of Qt, Kt at virtual position t; O = attention(Qt, Kt, Vt) per (b, h);
 *   Y[b][n][h] = sum_{m,p} R[h][m][p] O[b][m][n*P+p]; Z = Y W_O.
 * x and z must not overlap. Temporary tensors live in context-owned workspace, O(B*H*T*d)
 * floats; no T x T matrix is ever formed. */
iha_status iha_forward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                       const iha_layer_weights *weights, iha_buffer x, iha_buffer z);

/* The layer without its projections: takes projected Q, K, V [B][N][H][d] and writes
 * Y [B][N][H][d] (mixing, rotary, attention, collapse). shape->model_dim is ignored;
 * weights->wq/wk/wv/wo are ignored. y must not overlap q, k or v. */
iha_status iha_attention_core(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                              const iha_layer_weights *weights, iha_buffer q, iha_buffer k, iha_buffer v,
                              iha_buffer y);

/* Attention alone over already mixed (and rotated) virtual sequences:
 *   qt, kt, vt, o  [batch][heads][tokens*pseudo][head_dim]
 *   lse            [batch][heads][tokens*pseudo], the natural-log sum-exp of each row's
 *                  scaled scores, written only when lse.mem is not NULL.
 * `pseudo` only gives the masks their token structure; shape->model_dim is ignored and
 * options->rope must be 0 (rotate before calling). o must not overlap the inputs. */
iha_status iha_attention(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                         iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o, iha_buffer lse);

/* Host-memory convenience for applications without OpenCL code: the same as iha_forward,
 * with every tensor in host memory (same shapes; alpha/r may be NULL under the same identity
 * rule). Copies in, runs, copies z out, and blocks until done. */
typedef struct iha_host_weights {
    const float *wq, *wk, *wv, *wo;
    const float *alpha_q, *alpha_k, *alpha_v, *r;
} iha_host_weights;
iha_status iha_forward_host(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            const iha_host_weights *weights, const float *x, float *z);

#ifdef __cplusplus
}
#endif
#endif /* IHA_H */
