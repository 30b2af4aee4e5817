/*
 * iha.h - Interleaved Head Attention on any OpenCL device.
 *
 * This header is the manual. It is C11 (and valid C++17 and later), includes only <CL/cl.h>,
 * <stddef.h> and <stdint.h>, and every declaration below says what it needs, what it returns
 * and who owns what. The stability of what it declares is doc/abi.md's subject.
 *
 * The computation is Duvvuri et al., "Interleaved Head Attention" (arXiv 2602.21371, 2026):
 * each head's queries, keys and values are mixed into P pseudo-heads, interleaved token-major
 * into a virtual sequence of T = N*P tokens, attended over with a flash-style kernel, and
 * collapsed back to H heads. The exact definition (shapes, index order, masks, rotary) is the
 * project's doc/spec.md; the short form is repeated next to each call.
 *
 * Two more headers, which nothing includes implicitly: iha_tune.h (how configurations are
 * chosen, iha_tune and its profiles, the self-check iha_check) and iha_measure.h (what the
 * device can do at all, for benchmarks).
 *
 * Conventions that hold for every call
 * ------------------------------------
 * - Tensors are dense and row-major (C order, last index fastest), float32 unless the call's
 *   options select half-precision storage (iha_attention_options.storage and weight_storage,
 *   IEEE binary16; arithmetic stays float32 either way).
 * - Device tensors are passed as iha_buffer: an application-owned cl_mem plus an offset in
 *   ELEMENTS of the tensor's storage type (floats, or halves), like CLBlast. The library
 *   never retains or frees them. They must belong to the context's cl_context (else
 *   IHA_ERROR_INVALID_ARGUMENT). Before any work is enqueued
 *   every buffer is checked against CL_MEM_SIZE; too small a buffer is refused with
 *   IHA_ERROR_BUFFER_TOO_SMALL and nothing is written. An output that overlaps an input in
 *   the same cl_mem is refused with IHA_ERROR_INVALID_ARGUMENT.
 * - NULL ctx, shape, options or weights is IHA_ERROR_INVALID_ARGUMENT.
 * - Size limits: a product of dimensions (or offset + count, or its bytes) that overflows size_t
 *   is IHA_ERROR_SIZE_OVERFLOW. The kernels index with 32-bit integers, so IHA_ERROR_UNSUPPORTED
 *   refuses T = N*P above INT_MAX/4, H*P above INT_MAX, B*H above INT_MAX and N*D above
 *   8*INT_MAX. An internal buffer larger than the device's largest allocation, or a call
 *   (iha_forward, iha_forward_save, iha_attention_core, iha_attention, iha_attention_backward,
 *   iha_attention_core_backward, iha_backward, iha_backward_saved, iha_decode_step) whose internal buffers
 *   together exceed the device's memory, is IHA_ERROR_DEVICE_MEMORY before anything is
 *   enqueued. After any IHA_ERROR_DEVICE_MEMORY the context's next call starts with fresh
 *   internal buffers (some drivers, NVIDIA's among them, accept an allocation and fail only
 *   when a kernel first uses it), so a smaller call on the same context can succeed.
 * - Work is enqueued on the context's in-order command queue and the call returns once it is
 *   enqueued: the outputs are ready after iha_context_finish() (or clFinish on the queue).
 *   Calls with a "_host" suffix are the exception: they block until results are in host memory.
 * - Drivers that end kernel loops early: Mesa's llvmpipe (rusticl, Clover) stops every loop of
 *   a kernel invocation after a fixed number of iterations in all, silently. iha_context_create
 *   detects such a driver; there every call waits for its kernels before it returns, and a call
 *   whose kernels were cut short returns IHA_ERROR_UNSUPPORTED naming the driver (its outputs
 *   are then unspecified; the next call is unaffected), never a wrong result. In practice that
 *   refuses long sequences (more than a few thousand virtual tokens at d = 64; doc/drivers.md).
 * - On failure a call returns a status other than IHA_OK and leaves a message in the context
 *   (iha_context_message). The library never aborts, never prints, reads the environment only
 *   in iha_context_create, and keeps no process-wide mutable state of its own. CLBlast, which
 *   runs the GEMMs where it is the context's GEMM backend (GPUs by default; see iha_tune.h), has
 *   process-wide caches: the library serialises its calls into CLBlast with one lock, and when
 *   the process's last context that ran a CLBlast GEMM is freed it empties CLBlast's
 *   program cache (CLBlastClearCache), which would otherwise keep every freed context's
 *   cl_context alive. An application that also calls CLBlast itself then sees CLBlast rebuild
 *   its programs on their next use.
 * - Thread safety: different contexts may be used from different threads at the same time.
 *   One context must be used by one thread at a time: to share it, hold your own lock around
 *   every call on it, iha_context_free and the calls on its KV caches (iha_kv_cache_*)
 *   included, and read iha_context_message before
 *   releasing the lock (the next call clears it). Outside that lock other threads may use the
 *   context's cl_context for their own buffers and queues (OpenCL calls are thread-safe), but
 *   must not write or release a buffer that a call reads or writes until that call's work has
 *   finished (iha_context_finish). Processes may share a program cache directory: entries
 *   are written to a temporary file and renamed, so a reader sees a whole entry or none.
 *   (tests/test_threads.c checks each of these.)
 */
#ifndef IHA_H
#define IHA_H

#include <stddef.h>
#include <stdint.h>

/* The library needs OpenCL 1.2 only. An application that wants a later version's declarations
 * defines CL_TARGET_OPENCL_VERSION itself before including this header. */
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

/* IHA_API marks every function of the API: the shared library is built with hidden visibility,
 * so these are the only symbols it exports (doc/abi.md). */
#ifndef IHA_API
#if defined(__GNUC__) || defined(__clang__)
#define IHA_API __attribute__((visibility("default")))
#else
#define IHA_API
#endif
#endif

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
IHA_API unsigned iha_version_number(void);
IHA_API const char *iha_version_string(void);

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
    X(IHA_ERROR_IO, -11, "a file could not be read or written")                                    \
    X(IHA_ERROR_PROFILE, -12, "the tuning profile was ignored: corrupt, or for another device or version")

typedef enum iha_status {
#define IHA_STATUS_ENUM_(name, value, text) name = value,
    IHA_STATUS_MAP(IHA_STATUS_ENUM_)
#undef IHA_STATUS_ENUM_
} iha_status;

/* "IHA_ERROR_BUFFER_TOO_SMALL" for IHA_ERROR_BUFFER_TOO_SMALL; "IHA_STATUS_UNKNOWN" otherwise.
 * The returned strings are static. */
IHA_API const char *iha_status_name(iha_status status);
/* A one-line generic description of a status (static string). The specific reason of the
 * last failure on a context is iha_context_message(). */
IHA_API const char *iha_status_description(iha_status status);

/* ---- Devices ---------------------------------------------------------------------------- */

/* What iha_devices_list reports for each OpenCL device. Fixed layout, no pointers: a string
 * longer than its field is cut at a character boundary (the library's cache and profile keys
 * use the whole strings). */
typedef struct iha_device_info {
    unsigned platform_index, device_index; /* the P:D pair that IHA_DEVICE accepts */
    char platform_name[128];
    char platform_version[128];
    char device_name[128];
    char device_vendor[128];
    char driver_version[128];
    char device_version[128];
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
IHA_API iha_status iha_devices_list(iha_device_info *out, size_t capacity, size_t *count);

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
     * ~/.cache/iha. The value "off" in any case (here or in IHA_CACHE_DIR) disables the disk
     * cache; so does a directory whose path leaves no room below PATH_MAX for the cache's file
     * names (iha_context_profile then says so). */
    const char *cache_dir;
    /* Developer option: read kernel sources from this directory (the repository's cl/)
     * instead of the copies embedded at build time. NULL: $IHA_KERNEL_DIR, else embedded. */
    const char *kernel_dir;
    /* Borrow the application's OpenCL objects: set both or neither. The queue must belong to
     * the context and be in-order. The library retains them while the iha_context lives and
     * releases only its own references. (Not named after their types: in C++ a member named
     * cl_context would change what cl_context means inside the struct.) */
    cl_context opencl_context;
    cl_command_queue opencl_queue;
    /* Nonzero: every layer call finishes the queue after each stage and records wall time per
     * stage (iha_context_stage_times). Serialises the queue; for tools and benchmarks. */
    int time_stages;
    /* Tuning profile (iha_tune.h): NULL: $IHA_PROFILE, else the device's file in the
     * cache directory; "off" in any case disables profiles; anything else is the profile's path. */
    const char *profile;
    /* Opt-in, never the default: nonzero makes a layer call whose kernels have no exact profile
     * entry tune them first (within tune_budget_s seconds per call; 0 means 10) and store the
     * result. The first such call then takes that long. Layer calls are iha_forward,
     * iha_attention_core, iha_attention, iha_attention_core_backward, iha_backward and
     * iha_decode_step (its decode kernels too); a call
     * is checked in full first, so a refused call never tunes, and iha_kv_cache_create never
     * does. The GEMM (backend and parameters) is tuned only by iha_tune. */
    int tune_on_first_use;
    double tune_budget_s;
} iha_context_options;

/* Sets every field of *options to its default (all NULL/0). */
IHA_API void iha_context_options_init(iha_context_options *options);

/* Creates a context. `options` may be NULL for all defaults. On success stores a new context
 * in *out (free it with iha_context_free). On failure stores NULL in *out (when out is not
 * NULL) and, when `message` is not NULL, writes a NUL-terminated explanation of at most
 * message_size bytes into it (for a NULL out too: there is no context to hold a message).
 * Returns IHA_ERROR_NO_DEVICE when no device matches, IHA_ERROR_OPENCL when the OpenCL
 * context or queue cannot be made, IHA_ERROR_INVALID_ARGUMENT for a half-given borrow or an
 * out-of-order queue.
 * Create one context per device (or per queue) and keep it for the process's life, rather than
 * one per request: a context builds its programs on first use (from the disk cache when it can)
 * and shares none with other contexts. On PoCL every program build also parses LLVM bitcode
 * into PoCL's process-wide LLVM context, whose metadata LLVM never frees, so a process that
 * creates and frees contexts in a loop grows by a few KiB per context that ran a layer
 * (doc/performance.md). The library itself holds nothing after iha_context_free, apart
 * from CLBlast's program cache (above), emptied when the last context that used CLBlast is
 * freed. */
IHA_API iha_status iha_context_create(iha_context **out, const iha_context_options *options, char *message,
                                      size_t message_size);

/* Waits for queued work, writes the programs the context built to the disk cache (as
 * iha_context_trim), releases everything the context owns and frees it. NULL is allowed.
 * Borrowed OpenCL objects and application buffers stay valid. */
IHA_API void iha_context_free(iha_context *ctx);

/* The message of the last failed call on this context ("" when none). Owned by the context,
 * valid until the next call on it: every call clears it on entry, so read it right after the
 * failure. For IHA_ERROR_BUILD it contains the OpenCL build log. */
IHA_API const char *iha_context_message(const iha_context *ctx);
/* The OpenCL error code of the last IHA_ERROR_OPENCL / IHA_ERROR_DEVICE_MEMORY failure
 * (e.g. -4 for CL_MEM_OBJECT_ALLOCATION_FAILURE), or 0. */
IHA_API cl_int iha_context_cl_error(const iha_context *ctx);

/* The OpenCL objects in use (owned by the context unless borrowed; do not release them). */
IHA_API cl_context iha_context_cl_context(const iha_context *ctx);
IHA_API cl_command_queue iha_context_cl_queue(const iha_context *ctx);
IHA_API cl_device_id iha_context_cl_device(const iha_context *ctx);
/* The device's name, e.g. "pthread-haswell-AMD EPYC 7B13" (owned by the context). */
IHA_API const char *iha_context_device_name(const iha_context *ctx);

/* Blocks until all work enqueued by the library on this context has finished. */
IHA_API iha_status iha_context_finish(iha_context *ctx);

/* Releases internal workspace buffers (they are grown on demand and reused between calls).
 * Blocks first until the context's queue has finished, as iha_context_finish (on a borrowed
 * queue that includes the application's own work on it), then writes the programs built since
 * the last trim to the disk cache, so that later processes load them instead of compiling.
 * Calls never write them themselves: on PoCL saving a program costs about what compiling it
 * did, and the first call would pay twice. A long-running process that wants its programs on
 * disk before it ends calls this once its first calls have run; iha_context_free writes the
 * rest. */
IHA_API void iha_context_trim(iha_context *ctx);

/* Wall-clock seconds per stage of the last layer call, when options.time_stages was set
 * (all zero otherwise). */
typedef struct iha_stage_times {
    double projections; /* X W_Q, X W_K, X W_V */
    double mixing;      /* head mixing into pseudo-heads, interleaving, rotary */
    double attention;   /* flash attention over the T virtual tokens */
    double collapse;    /* fold-back of pseudo-heads with R */
    double output;      /* Y W_O */
} iha_stage_times;
IHA_API void iha_context_stage_times(const iha_context *ctx, iha_stage_times *out);

/* ---- Problem description ---------------------------------------------------------------- */

/* Which virtual keys u a virtual query t sees (n = t/P, m = u/P are token indices):
 *   IHA_MASK_CAUSAL        u <= t            (the paper's causal mask over the expanded sequence)
 *   IHA_MASK_TOKEN_CAUSAL  m <= n            (the P pseudo-tokens of a token see each other)
 *   IHA_MASK_NONE          always            (bidirectional)
 * A window of W > 0 tokens additionally requires t - u < W*P, n - m < W, |n - m| < W
 * respectively. */
typedef enum iha_mask { IHA_MASK_CAUSAL = 0, IHA_MASK_TOKEN_CAUSAL = 1, IHA_MASK_NONE = 2 } iha_mask;

/* Storage type of tensors in device memory: of a call's activations and weights (the two
 * fields of iha_attention_options below) and of a KV cache. Arithmetic is float32 (with one
 * exception: on NVIDIA devices of compute capability 8.0 or more, a tuning profile may run the
 * attention core of a half or bfloat16 call on tensor cores, which round its inputs to 16 bits;
 * the tuner and iha_check accept that only within the storage's contract, and float storage
 * never gets it; doc/spec.md, "Numerical contract"):
 * IHA_STORAGE_F16 tensors are read with vload_half and written with vstore_half (round to
 * nearest even), which are core OpenCL and need no cl_khr_fp16, so half storage works on every
 * device. It halves the bytes of what it stores; results meet doc/spec.md's half-storage contract
 * (relative L2 error at most 2e-3 against float64 on the same float inputs).
 * IHA_STORAGE_BF16 tensors hold bfloat16 (the upper 16 bits of a float32: float's range, 8
 * significant bits) as uint16_t patterns, widened by a shift on load and rounded to nearest even
 * on store (NaN stays a quiet NaN, infinities stay infinite), with no extension needed either;
 * the same bytes as half, a coarser significand and no overflow below float's range. Results meet
 * the bfloat16 contract: relative L2 error at most 1e-2 against float64 on the same float inputs.
 * BF16 is accepted wherever F16 is. iha_half_from_float, iha_half_to_float, iha_bf16_from_float
 * and iha_bf16_to_float below convert host arrays. */
typedef enum iha_storage { IHA_STORAGE_F32 = 0, IHA_STORAGE_F16 = 1, IHA_STORAGE_BF16 = 2 } iha_storage;

typedef struct iha_attention_options {
    int mask;           /* an iha_mask value; anything else is IHA_ERROR_INVALID_ARGUMENT */
    int64_t window;     /* sliding window in tokens; 0 = global; negative is invalid */
    float scale;        /* score scale; 0 means 1/sqrt(d); NaN, infinite or above about 2.36e38 in
                         * magnitude is invalid (see "Non-finite values") */
    int rope;           /* nonzero: rotary embedding of Qt and Kt at virtual positions (d even) */
    float rope_base;    /* rotary base; 0 means 10000; negative, NaN or infinite is invalid */
    /* iha_storage of the call's activations: x and z (iha_forward, iha_decode_step), q, k, v
     * and y (iha_attention_core), qt, kt, vt and o (iha_attention), qt, kt, vt, o, dout, dqt,
     * dkt and dvt (iha_attention_backward), x, dz and dx (iha_backward, iha_backward_saved; z
     * for iha_forward_save). lse and the saved state stay float. Internal workspace is float: a half
     * or bfloat16 input is converted once on entry and such an output once on exit (memory-bound
     * passes over B*N*D or B*H*T*d elements). A value other than IHA_STORAGE_F32,
     * IHA_STORAGE_F16 or IHA_STORAGE_BF16 is IHA_ERROR_INVALID_ARGUMENT (also below). */
    int storage;
    /* iha_storage of every weight: wq, wk, wv, wo, alpha_q, alpha_k, alpha_v and r, and of every
     * gradient of iha_layer_grads (the backward calls convert them from float at the end). With
     * IHA_STORAGE_F16 or IHA_STORAGE_BF16, a projection of at most 16 rows (a decoding step) reads
     * the 16-bit weights directly (cl/convert.cl, memory-bound: half the bytes of float
     * weights); larger ones convert each weight matrix into float workspace (D*H*d floats) and
     * run the context's GEMM backend. */
    int weight_storage;
    /* Packed sequences (doc/spec.md, "Packed sequences"; doc/guide.md, "Packed batches"):
     * seq_count lengths in tokens, in order over the call's B*N tokens (batch row 0 first),
     * each at least 1, together B*N, none crossing a batch row; NULL with seq_count 0 (the
     * default) makes each batch row one sequence. Attention never crosses a sequence; masks
     * and windows apply inside each, counted from its first token (token n of a sequence that
     * starts at token s of its row is its token n - s, virtual position t - s*P), and rotary
     * positions restart there (virtual position (n - s)*P + p). Mixing, collapse and the
     * projections are per token and unchanged. Key blocks wholly in other sequences are
     * skipped, so a call costs about the sum of its sequences' costs. Honoured by
     * iha_forward, iha_forward_host, iha_forward_save, iha_backward, iha_backward_saved,
     * iha_attention, iha_attention_backward, iha_attention_core and
     * iha_attention_core_backward (pass the same lengths to a forward and its backward);
     * iha_decode_step reads them as a packed step with its own rules (see there); the
     * measurement calls of iha_measure.h refuse them (IHA_ERROR_UNSUPPORTED). Elsewhere a zero
     * length, a sum other than B*N, a sequence crossing a batch row, or a count without an
     * array (or an array without a count) is IHA_ERROR_INVALID_ARGUMENT, nothing written. The
     * array is read during the call and not kept. Workspace beyond each call's own: each
     * token's sequence bounds (2*B*N ints) and, with rotary, a rotary table per batch row
     * (B*T*d floats), counted with the rest before anything is enqueued. */
    const size_t *seq_lens;
    size_t seq_count;
    /* Backward calls: nonzero adds every gradient into its output buffer (accumulation over
     * micro-batches) instead of overwriting it: dqt, dkt, dvt of iha_attention_backward, dq, dk,
     * dv and the mixing gradients of iha_attention_core_backward, dx and every iha_layer_grads
     * member of iha_backward and iha_backward_saved. Each output is read and written in its own
     * storage: the sum is formed in float and rounded once into it (a half output gains one
     * rounding per call). The products that give dx and the gradients of wq, wk, wv and wo add
     * into a float output themselves (beta = 1); every other output is computed into float
     * workspace and added in one pass (the workspace each call lists). Forward calls ignore it. */
    int accumulate;
} iha_attention_options;

/* Defaults: causal, global, scale 1/sqrt(d), no rotary, float32 storage. */
IHA_API void iha_attention_options_init(iha_attention_options *options);

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

/* A device tensor: an application-owned cl_mem and an offset in elements of its storage type. */
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

/* ---- Non-finite values ------------------------------------------------------------------ */

/* Every call follows IEEE arithmetic as doc/spec.md's float64 computation would, over the visible keys
 * only (doc/numerics.md):
 *   - an output is non-finite exactly where that computation is: a NaN or infinity in an input
 *     (x, a weight, a mixing matrix, dz, a cached key or value) reaches every output that
 *     depends on it, and only those;
 *   - a masked key (or a padding key of a block) contributes nothing: not 0 times its value,
 *     so an infinite value of a key a query cannot see leaves that query finite;
 *   - a row whose visible scores include NaN or +inf, or are all -inf, is NaN (softmax's
 *     max-subtracted form gives inf - inf or 0/0 there), and so is its log-sum-exp;
 *   - where float32 overflows and float64 would not (scores beyond about 3.4e38: huge inputs
 *     or a huge scale), the affected rows are non-finite, never zeros or other finite values;
 *     a scale whose product with log2(e) overflows float32 (|scale| > FLT_MAX / log2(e),
 *     about 2.36e38) is IHA_ERROR_INVALID_ARGUMENT, since every score would be.
 * The library does not check inputs for non-finite values (that would cost a pass over them);
 * the caller can test the outputs. */

/* ---- Calls ------------------------------------------------------------------------------ */

/* One IHA layer: Z = IHA(X) with X, Z [B][N][D].
 *   Q = X W_Q (and K, V); Qt[b][h][n*P+p] = sum_m alpha_Q[m][h][p] Q[b][n][m] (and Kt, Vt);
 *   optional rotary of Qt, Kt at virtual position t; O = attention(Qt, Kt, Vt) per (b, h);
 *   Y[b][n][h] = sum_{m,p} R[h][m][p] O[b][m][n*P+p]; Z = Y W_O.
 * x and z must not overlap. Temporary tensors live in context-owned workspace, O(B*H*T*d)
 * floats; no T x T matrix is ever formed. */
IHA_API iha_status iha_forward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                               const iha_layer_weights *weights, iha_buffer x, iha_buffer z);

/* The layer without its projections: takes projected Q, K, V [B][N][H][d] and writes
 * Y [B][N][H][d] (mixing, rotary, attention, collapse). shape->model_dim is ignored;
 * weights->wq/wk/wv/wo are ignored. y must not overlap q, k or v. */
IHA_API iha_status iha_attention_core(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                      const iha_layer_weights *weights, iha_buffer q, iha_buffer k, iha_buffer v,
                                      iha_buffer y);

/* The gradients of iha_attention_core (doc/spec.md, "The backward pass", steps 2 to 5), for
 * training a layer whose projections the application runs itself: given its q, k, v
 * [B][N][H][d], the mixing and collapse weights and dy = dLoss/dy [B][N][H][d], writes
 * dq, dk, dv = dLoss/dq, dLoss/dk, dLoss/dv [B][N][H][d] and grads->alpha_q, alpha_k, alpha_v
 * and r ([H][H][P]). grads->wq, wk, wv and wo are ignored, as are weights->wq/wk/wv/wo and
 * shape->model_dim.
 *   - An output with mem NULL is not computed (dq, dk and dv each; grads may be NULL: no mixing
 *     gradients). Outputs are overwritten, or added into with options->accumulate.
 *   - Nothing is kept from the forward call: the call recomputes the mixing, rotary and
 *     attention from q, k and v (never a T x T matrix), then runs iha_backward's steps from dY:
 *     collapse, attention, inverse rotary, mixing.
 *   - The same shape, options and weights as iha_attention_core. options->storage half: q, k,
 *     v, dy, dq, dk and dv are half; weight_storage half: the mixing weights and their
 *     gradients are half; arithmetic is float, as in iha_backward. H*H*P above INT_MAX is
 *     IHA_ERROR_UNSUPPORTED.
 *   - With P = 1 and the identity shortcut (alpha and r NULL in weights), a gradient of
 *     alpha_q/k/v or r, when asked for, is the gradient at the identity.
 *   - Every output must lie apart from q, k, v, dy, the mixing weights and every other output
 *     (IHA_ERROR_INVALID_ARGUMENT); every element of each output is written.
 *   - Workspace, all of it: about (11 + S)*B*H*T*d + B*H*T*2 floats (T = N*P, S as in
 *     iha_attention_backward; 9 instead of 11 + S on GPUs); with half storage float copies of
 *     q, k, v, dy, dq, dk and dv (7*B*N*H*d); with half weights float copies of the mixing
 *     weights and gradients (8*H*H*P); with accumulate float stand-ins of float dq, dk, dv and
 *     mixing gradients (3*B*N*H*d + 4*H*H*P); all of it counted against the device's memory and
 *     allocated before anything is enqueued.
 *   - iha_context_stage_times: mixing (the forward's, and dQ, dK, dV, dalpha), attention
 *     (forward, backward and the inverse rotary), collapse (dO, dR). */
struct iha_layer_grads; /* below, with iha_backward */
IHA_API iha_status iha_attention_core_backward(iha_context *ctx, const iha_shape *shape,
                                               const iha_attention_options *options, const iha_layer_weights *weights,
                                               iha_buffer q, iha_buffer k, iha_buffer v, iha_buffer dy, iha_buffer dq,
                                               iha_buffer dk, iha_buffer dv, const struct iha_layer_grads *grads);

/* Attention alone over already mixed (and rotated) virtual sequences:
 *   qt, kt, vt, o  [batch][heads][tokens*pseudo][head_dim]
 *   lse            [batch][heads][tokens*pseudo], the natural-log sum-exp of each row's
 *                  scaled scores, written only when lse.mem is not NULL.
 * `pseudo` only gives the masks their token structure; shape->model_dim is ignored and
 * options->rope must be 0 (rotate before calling). o must not overlap the inputs. */
IHA_API iha_status iha_attention(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                 iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o, iha_buffer lse);

/* The gradients of iha_attention (doc/spec.md, "The backward pass", the attention step), for training:
 *   inputs   qt, kt, vt, o, dout  [batch][heads][tokens*pseudo][head_dim]
 *            lse                  [batch][heads][tokens*pseudo]
 *   outputs  dqt, dkt, dvt        [batch][heads][tokens*pseudo][head_dim]
 * where o and lse are what iha_attention wrote for qt, kt, vt with the same shape and options
 * (lse is required here), and dout = dLoss/do; shape->model_dim is ignored. FlashAttention-2 style: the probabilities are
 * recomputed from lse, so no T x T matrix is ever formed (workspace below). The same
 * options as iha_attention (mask, window, scale; rope must be 0; weight_storage is ignored);
 * options->storage half stores the eight activation tensors in half (lse stays float), with
 * float arithmetic. Each output must not overlap any input or another output
 * (IHA_ERROR_INVALID_ARGUMENT); every output element is written: overwritten, or added into
 * with options->accumulate. Internal workspace: B*H*T floats; on devices that are not GPUs packed copies of qt and dout (2*B*H*ceil(T/16)*16*d
 * floats) and S partial sums of dqt (S*B*H*ceil(T/16)*16*ceil(d/16)*16 floats, where
 * S = ceil(4 * compute units / (B*H)), at most 64/(B*H) (at least 1) and at most ceil(T/32)
 * (ceil(T/64) for d > 64): 1 for B*H = 8 on 2 cores); with half storage
 * float copies of the eight tensors (8*B*H*T*d floats), with float storage and accumulate
 * float stand-ins of the three outputs (3*B*H*T*d floats). All of it is counted against the
 * device's memory before anything is enqueued. Devices that are not GPUs run one
 * register-tile pass, built like the forward's kernel, that computes all three gradients; GPUs
 * run simpler row-per-work-item kernels, correct but slower.
 * iha_backward below is the whole layer's backward pass. */
IHA_API iha_status iha_attention_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                          iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o, iha_buffer lse,
                                          iha_buffer dout, iha_buffer dqt, iha_buffer dkt, iha_buffer dvt);

/* ---- Layer stages (the per-token ends of a layer, for sequence-parallel layers) ---------- */

/* iha_forward is expand, attention, collapse: iha_layer_expand runs the per-token stages
 * before attention and iha_layer_collapse those after it, so that an application (or
 * libiha_mpi, include/iha_mpi.h) can run the attention step its own way, over a sequence split
 * across devices, and still use the library's projections, mixing, rotary and collapse:
 *     iha_layer_expand(ctx, &shape, &options, &weights, 0, x, qt, kt, vt);
 *     iha_attention(ctx, &shape, &attention_options, qt, kt, vt, o, lse);   rope 0 there
 *     iha_layer_collapse(ctx, &shape, &options, &weights, o, z);
 * gives iha_forward's z within float rounding (on PoCL bit for bit with float storage; 16-bit
 * storage rounds qt, kt, vt and o between the calls, which iha_forward keeps in float). Mixing,
 * rotary and collapse are per token, so a run of tokens of a longer sequence goes through them
 * on its own: `first_token` is the run's first token in the whole sequence, which sets its
 * rotary positions. The backward is the same steps in reverse:
 *     iha_layer_collapse_backward(ctx, &shape, &options, &weights, o, dz, dout, &grads);
 *     iha_attention_backward(ctx, &shape, &attention_options, qt, kt, vt, o, lse, dout, dqt, dkt, dvt);
 *     iha_layer_expand_backward(ctx, &shape, &options, &weights, 0, x, dqt, dkt, dvt, dx, &grads);
 * gives iha_backward's dx and gradients within float rounding (the same kernels; bit for bit on
 * PoCL with float storage). Over runs of one sequence, each run's expand_backward gives its
 * rows of dx and its share of the gradients: with options->accumulate they add up to the
 * whole sequence's.
 * Rules of all four: each reads only the options and weights its comment names (the others may
 * hold anything); every buffer, overlap and size is checked as iha_forward checks them, and a
 * refused call writes nothing; options->storage and weight_storage as in iha_forward (the
 * activations, including qt, kt, vt, o and their gradients, in storage; the weights and their
 * gradients in weight_storage); B*N, D or H*d above INT_MAX/2 and H*H*P above INT_MAX are
 * IHA_ERROR_UNSUPPORTED in the backward two (as in iha_backward); with rotary,
 * (first_token + N)*P past INT_MAX/4 is IHA_ERROR_UNSUPPORTED. Every buffer a call uses is
 * counted against the device's memory and allocated before anything is enqueued.
 *
 * iha_layer_expand: x [B][N][D] -> qt, kt, vt [B][H][N*P][d] (T = N*P virtual rows per head):
 * Q = X W_Q, K = X W_K, V = X W_V, mixing by alpha_Q, alpha_K, alpha_V, and with options->rope
 * rotary of Qt and Kt at virtual position (first_token + n)*P + p of token n's pseudo-token p.
 * Reads options->storage, weight_storage, rope, rope_base, seq_lens and seq_count (mask,
 * window, scale and accumulate are ignored). With options->seq_lens rotary restarts at each
 * sequence as in iha_forward, and first_token must be 0 (IHA_ERROR_UNSUPPORTED otherwise). The
 * outputs must lie apart from x, the weights and each other; weights->wo and r are ignored (the
 * identity shortcut is alpha_q, alpha_k and alpha_v all NULL with P = 1). Workspace: Q, K, V
 * (3*B*N*H*d floats), with half storage float copies of x and the outputs (B*N*D + 3*B*H*T*d),
 * with 16-bit weights float mixing (4*H*H*P) and, past 16 rows, one converted D*H*d matrix. */
IHA_API iha_status iha_layer_expand(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                    const iha_layer_weights *weights, size_t first_token, iha_buffer x,
                                    iha_buffer qt, iha_buffer kt, iha_buffer vt);

/* iha_layer_collapse: o [B][H][N*P][d] (the attention step's output) -> z [B][N][D]: collapse
 * by R, then Z = Y W_O. options->storage as in iha_forward (o and z); only storage and
 * weight_storage are read from options. weights->wq, wk, wv and alpha_q/k/v are ignored (r may
 * be NULL with P = 1: the identity). z must lie apart from o and the weights. Workspace: Y
 * (B*N*H*d floats), with half storage float copies of o and z, with 16-bit weights float
 * mixing and, past 16 rows, one converted D*H*d matrix. */
IHA_API iha_status iha_layer_collapse(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                      const iha_layer_weights *weights, iha_buffer o, iha_buffer z);

/* The backward of iha_layer_collapse: given its o and dz = dLoss/dz [B][N][D], writes
 * dout = dLoss/do [B][H][N*P][d] and grads->wo and grads->r (the other members are ignored;
 * grads may be NULL, and any output with mem NULL is not computed). Outputs are overwritten,
 * or added into with options->accumulate (dout too: give it zeros, or accumulate 0, to get
 * dout alone). Y is recomputed from o (when grads->wo is wanted). Reads options->storage,
 * weight_storage and accumulate only; weights->wo and r as iha_layer_collapse. Every output
 * must lie apart from o, dz, the weights and the other outputs. Workspace: dY, and Y for
 * grads->wo (B*N*H*d floats each), a transpose's max(B*N*H*d, D*H*d), the mixing gradient's
 * partial sums for grads->r, with 16-bit storage float copies of the inputs and 16-bit weights,
 * and float stand-ins of outputs that are 16-bit or added into without a product. */
IHA_API iha_status iha_layer_collapse_backward(iha_context *ctx, const iha_shape *shape,
                                               const iha_attention_options *options,
                                               const iha_layer_weights *weights, iha_buffer o, iha_buffer dz,
                                               iha_buffer dout, const struct iha_layer_grads *grads);

/* The backward of iha_layer_expand: given its x and first_token and dqt, dkt, dvt =
 * dLoss/dqt, dLoss/dkt, dLoss/dvt [B][H][N*P][d] (as iha_attention_backward writes them),
 * writes dx = dLoss/dx [B][N][D] and grads->wq, wk, wv and alpha_q, alpha_k, alpha_v (wo and r
 * are ignored; grads may be NULL, and any output with mem NULL is not computed). The inverse
 * rotary runs at the same positions as the forward's, on copies (dqt, dkt, dvt are not
 * changed). Q, K and V are recomputed from x where their alpha's gradient is wanted. Outputs
 * are overwritten, or added into with options->accumulate (dx too). Reads iha_layer_expand's
 * options and accumulate; the same first_token rules. Every output must lie apart from x,
 * dqt, dkt, dvt, the weights and the other outputs. Workspace: dQ, dK, dV for dx or their
 * weight's gradient, Q, K, V for their alpha's (B*N*H*d floats each), float copies of dqt and
 * dkt with rotary (B*H*T*d each; and of dvt with half storage), x transposed (B*N*D) for the
 * weights' gradients, a weight transposed (D*H*d) for dx, the mixing gradients' partial sums,
 * with 16-bit storage a float x and 16-bit weights float copies (3*D*H*d + 4*H*H*P), and float
 * stand-ins of outputs that are 16-bit or added into without a product. */
IHA_API iha_status iha_layer_expand_backward(iha_context *ctx, const iha_shape *shape,
                                             const iha_attention_options *options, const iha_layer_weights *weights,
                                             size_t first_token, iha_buffer x, iha_buffer dqt, iha_buffer dkt,
                                             iha_buffer dvt, iha_buffer dx, const struct iha_layer_grads *grads);

/* ---- Partial attention (sequence-parallel building block) ------------------------------- */

/* Where one query block and one key block lie in a longer sequence, in tokens (virtual rows
 * are tokens times P): the queries are tokens q_offset .. q_offset + shape->tokens - 1, the keys
 * and values tokens k_offset .. k_offset + k_tokens - 1 of the same sequence (the blocks may
 * overlap, lie in either order or be the same block). */
typedef struct iha_partial_block {
    size_t q_offset; /* first token of the query block */
    size_t k_offset; /* first token of the key block */
    size_t k_tokens; /* tokens of the key block, at least 1 */
    int first;       /* nonzero: the call starts the running state (forward: o and lse; backward:
                      * dqt) by overwriting it; zero: it merges (adds) into it */
} iha_partial_block;

/* One step of sequence-parallel (ring) attention, doc/spec.md "Partial attention": attends the
 * query block over one key block and merges the result into a running state.
 *   qt, o   [batch][heads][tokens*pseudo][head_dim]     the query block and its running output
 *   lse     [batch][heads][tokens*pseudo]               its running natural-log sum-exp
 *   kt, vt  [batch][heads][k_tokens*pseudo][head_dim]   the key block
 * shape->tokens is the query block's length; masks and windows are those of iha_attention,
 * evaluated at global virtual positions (query row t is position q_offset*P + t, key row u is
 * k_offset*P + u): under IHA_MASK_CAUSAL a key block wholly after the queries contributes nothing,
 * one wholly before them is visible but for the window, and the diagonal block is causal.
 * The merge is the online-softmax rule, per row with block result (o_b, lse_b) over the row's
 * visible keys of the block: M = max(lse, lse_b), w = exp(lse - M), w_b = exp(lse_b - M),
 * o = (w o + w_b o_b) / (w + w_b), lse = M + log(w + w_b). A state with lse = -inf (and any o)
 * is empty and takes the block's result; block->first overwrites the state (o = 0, lse = -inf for
 * rows that see no key of the block) without reading it. A row that sees no key of the block keeps
 * its state bit for bit. After every key block of the sequence has been merged, in any order,
 * o and lse equal iha_attention's over the whole sequence within float rounding (the order
 * changes only the rounding); rows that saw no key anywhere keep lse = -inf and o = 0.
 * The state is read and written in place, so o and lse must lie apart from qt, kt, vt and each
 * other (qt, kt and vt may share memory). Float32 only: options->storage other than
 * IHA_STORAGE_F32, or options->seq_lens set, is IHA_ERROR_UNSUPPORTED; options->rope must be 0;
 * options->accumulate is ignored. A NULL block, k_tokens 0, or a buffer too small is refused
 * (nothing written); a block ending past virtual row INT_MAX/4 is IHA_ERROR_UNSUPPORTED. On
 * devices that are not GPUs the call runs iha_attention's register tiles over the key block
 * (cl/attention_partial_tiles.cl), as fast per key as iha_attention, with the key block packed
 * into workspace (B*H*ceil(k_tokens*P/16)*16*d floats, counted against the device's memory);
 * GPUs run one work-item per query row (cl/attention_partial.cl), with no workspace. */
IHA_API iha_status iha_attention_partial(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                         const iha_partial_block *block, iha_buffer qt, iha_buffer kt, iha_buffer vt,
                                         iha_buffer o, iha_buffer lse);

/* The backward of one partial step, FlashAttention-2 style: given the query block qt, the FINAL
 * o and lse (after every key block was merged), dout = dLoss/do and one key block kt, vt,
 *   dqt  [batch][heads][tokens*pseudo][head_dim]    gets the block's share of dLoss/dqt:
 *        overwritten with block->first, else added into (sum over the key blocks);
 *   dkt, dvt  [batch][heads][k_tokens*pseudo][head_dim]  get the query block's share of
 *        dLoss/dkt and dLoss/dvt: overwritten, or added into with options->accumulate (sum
 *        over the query blocks).
 * P_ij = exp(s_ij - lse_i) with the final lse and Delta_i = dout_i . o_i make each block's
 * terms exact, so summing dqt over all key blocks and dkt, dvt over all query blocks gives
 * iha_attention_backward on the whole sequence. Rows with lse = -inf get no gradient. Same
 * shape, options and block rules as iha_attention_partial (block->first only decides dqt's
 * overwrite); every output must lie apart from every input and the other outputs. On devices
 * that are not GPUs the call runs iha_attention_backward's register tiles over the block pair
 * (cl/attention_partial_backward_tiles.cl), as fast per pair as iha_attention_backward; GPUs,
 * and drivers that end kernel loops early (where iha_attention_backward does the same), run one
 * work-item per row (cl/attention_partial.cl). Workspace, counted against the device's memory
 * before anything is enqueued: B*H*T floats (Delta, T = tokens*pseudo); with the register tiles
 * also packed copies of qt and dout (2*B*H*ceil(T/16)*16*head_dim floats) and
 * S partial sums of dqt (S*B*H*ceil(T/16)*16*ceil(head_dim/16)*16 floats, S as in
 * iha_attention_backward, its bound by key groups counted over the key block's k_tokens*pseudo
 * rows). */
IHA_API iha_status iha_attention_partial_backward(iha_context *ctx, const iha_shape *shape,
                                                  const iha_attention_options *options, const iha_partial_block *block,
                                                  iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o,
                                                  iha_buffer lse, iha_buffer dout, iha_buffer dqt, iha_buffer dkt,
                                                  iha_buffer dvt);

/* The gradients of one layer's parameters, laid out as iha_layer_weights (wq, wk, wv [D][H*d],
 * wo [H*d][D], alpha_q/k/v and r [H][H][P]). A member with mem == NULL is not computed. */
typedef struct iha_layer_grads {
    iha_buffer wq, wk, wv, wo;
    iha_buffer alpha_q, alpha_k, alpha_v, r;
} iha_layer_grads;

/* The backward pass of iha_forward (doc/spec.md, "The backward pass"), for training: given x [B][N][D],
 * the weights and dz = dLoss/dz [B][N][D], writes dx = dLoss/dx [B][N][D] (skipped when dx.mem
 * is NULL) and every gradient of *grads whose mem is not NULL (grads may be NULL: only dx).
 * Outputs are overwritten, or with options->accumulate added into (micro-batches: one call per
 * micro-batch adds its gradients to the previous ones).
 *   - Nothing needs to be kept from the forward call: the call recomputes the forward's
 *     activations from x (one extra forward pass, about a fifth of the call's time), then runs
 *     the steps backwards: output projection, collapse, attention (as iha_attention_backward),
 *     inverse rotary, mixing, projections.
 *   - The same shape and options as iha_forward. options->storage half: x, dz and dx are half;
 *     weight_storage half: the weights and every gradient are half. The call converts them to
 *     float on entry (and the results back at the end) and computes in float; the gradients
 *     then meet doc/spec.md's half-storage contract against float64 on the float inputs
 *     (tests/test_half.c). B*N, D or H*d above INT_MAX/2 and H*H*P above INT_MAX are
 *     IHA_ERROR_UNSUPPORTED (its transposes, products and mixing gradients index with int).
 *   - With P = 1 and the identity shortcut (alpha and r NULL in weights), a gradient of
 *     alpha_q/k/v or r, when asked for, is the gradient at the identity.
 *   - Every output must lie apart from x, dz, every weight and every other output
 *     (IHA_ERROR_INVALID_ARGUMENT); every element of each output is written.
 *   - Workspace, all of it: about 9*B*N*H*d + B*N*D + (11 + S)*B*H*T*d floats (T = N*P; S the
 *     attention backward's partial sums of dQt, see iha_attention_backward; 9 instead of 11 + S
 *     on GPUs), with half storage also float copies of x, dz and dx (3*B*N*D) and of the
 *     weights and gradients (8*D*H*d + 8*H*H*P, and past 16 rows one more D*H*d for the
 *     forward's projections, converted as iha_forward converts them), with accumulate and float
 *     weights float stand-ins of the four mixing gradients (4*H*H*P), every buffer counted
 *     against the device's memory and allocated before anything is enqueued; never a T x T
 *     matrix.
 *   - iha_context_stage_times: projections (the forward's, and dX, dW_Q, dW_K, dW_V), mixing
 *     (the forward's, and dQ, dK, dV, dalpha), attention (forward, backward and the inverse
 *     rotary), collapse (the forward's, and dO, dR), output (dY, dW_O).
 *   - iha_forward_save and iha_backward_saved below are the same pass without the recomputed
 *     attention forward, for applications that can keep B*H*T*(d+1) floats between the two. */
IHA_API iha_status iha_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                const iha_layer_weights *weights, iha_buffer x, iha_buffer dz, iha_buffer dx,
                                const iha_layer_grads *grads);

/* Training without running the attention forward twice: iha_forward_save is iha_forward that
 * also keeps the attention step's output and log-sum-exp in `saved`, and iha_backward_saved is
 * iha_backward that reads them there instead of recomputing them (the attention forward is
 * most of iha_backward's recomputation, about a fifth of its time at the demo shape; the
 * projections, mixing and collapse are still recomputed from x, which costs little and keeps
 * `saved` small). A training step is then
 *     iha_forward_save(ctx, &shape, &options, &weights, x, z, saved);
 *     ... the loss and dz = dLoss/dz from z ...
 *     iha_backward_saved(ctx, &shape, &options, &weights, x, saved, dz, dx, &grads);
 *   - saved is an application-owned float32 buffer of iha_saved_elements floats from its
 *     offset (B*H*T*d + B*H*T, T = N*P), in a layout private to the library. It is the
 *     application's to keep, reuse or release between the two calls.
 *   - iha_backward_saved must get the same shape, options, weights and x as the
 *     iha_forward_save that wrote `saved`, with nothing written to them or to saved in between.
 *     The library cannot check that: anything else gives wrong gradients (never an access out
 *     of bounds).
 *   - saved is float whatever options->storage and weight_storage say; the other tensors
 *     follow them as in iha_forward and iha_backward. saved.mem NULL is
 *     IHA_ERROR_INVALID_ARGUMENT; a saved buffer smaller than iha_saved_elements is
 *     IHA_ERROR_BUFFER_TOO_SMALL.
 *   - iha_forward_save: saved must lie apart from x, z and every weight. z is bit for bit what
 *     iha_forward writes. Its workspace is iha_forward's less the B*H*T*d floats of O.
 *   - iha_backward_saved: iha_backward's rules and limits, with saved one more input that must
 *     lie apart from x, dz and the weights, and that no output may overlap. Its outputs are bit
 *     for bit iha_backward's for the same inputs. Its workspace is iha_backward's less
 *     B*H*T*d + B*H*T floats and the forward's packed keys. */
/* The number of floats of a saved buffer for this shape, into *elements (0 on failure). ctx may
 * be NULL; when it is not, a failure's reason goes to its message. The shape is checked as a
 * layer call checks it: IHA_ERROR_INVALID_ARGUMENT, IHA_ERROR_SIZE_OVERFLOW or
 * IHA_ERROR_UNSUPPORTED for a shape iha_forward would refuse. */
IHA_API iha_status iha_saved_elements(iha_context *ctx, const iha_shape *shape, size_t *elements);
IHA_API iha_status iha_forward_save(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                    const iha_layer_weights *weights, iha_buffer x, iha_buffer z, iha_buffer saved);
IHA_API iha_status iha_backward_saved(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                      const iha_layer_weights *weights, iha_buffer x, iha_buffer saved, iha_buffer dz,
                                      iha_buffer dx, const iha_layer_grads *grads);

/* Host-memory convenience for applications without OpenCL code: the same as iha_forward,
 * with every tensor in host memory (same shapes; alpha/r may be NULL under the same identity
 * rule). Copies in, runs, copies z out, and blocks until done. Host arrays are always float;
 * options->storage and weight_storage choose the device-side storage: with IHA_STORAGE_F16
 * (IHA_STORAGE_BF16) the tensors are rounded to half (bfloat16) on upload and z is read back from
 * it, which shows what that storage does to a layer's results. */
typedef struct iha_host_weights {
    const float *wq, *wk, *wv, *wo;
    const float *alpha_q, *alpha_k, *alpha_v, *r;
} iha_host_weights;
IHA_API iha_status iha_forward_host(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                    const iha_host_weights *weights, const float *x, float *z);

/* ---- Incremental decoding with a KV cache ------------------------------------------------ */

/* The cache's storage type is an iha_storage (see "Problem description"): float, or half or
 * bfloat16 with float arithmetic. A step's x and z follow options->storage, its weights
 * weight_storage. */

/* The cache of one layer: pseudo-keys and pseudo-values after mixing and rotary,
 * [batch][heads][max_tokens*pseudo][head_dim] each (or with iha_kv_cache_options.compact the
 * heads' own keys and values), and the current length of every sequence.
 * Owned by the application (create/free) and used only with the context that created it.
 * Its device buffers keep that context's cl_context alive until iha_kv_cache_free. A cache may
 * outlive its context: iha_context_free detaches it, after which iha_kv_cache_free, _reset,
 * _truncate, _length and _bytes still work (without messages, as there is no context) and
 * iha_decode_step refuses it with IHA_ERROR_INVALID_ARGUMENT. For thread safety the cache's
 * calls are calls on its context (see the top of this file). */
typedef struct iha_kv_cache iha_kv_cache;

/* Creates an empty cache for shape->batch sequences of up to shape->tokens tokens, with
 * shape->heads, shape->head_dim and shape->pseudo (shape->model_dim is ignored). Device memory:
 * 2 * B * H * tokens * P * d elements of `storage`, the keys' virtual length rounded up to the
 * attention kernel's key block (ATT_KB of the configuration chosen for the shape: 4, 8 or
 * 16; iha_kv_cache_bytes gives the exact figure). Shape errors as iha_forward's; a key buffer
 * larger than the device's largest allocation is IHA_ERROR_DEVICE_MEMORY. */
IHA_API iha_status iha_kv_cache_create(iha_context *ctx, const iha_shape *shape, iha_storage storage, iha_kv_cache **out);

/* Options of iha_kv_cache_create_with: iha_kv_cache_options_init (float storage, global, every
 * token kept, pseudo-token layout), then fields by name (the struct may grow; doc/abi.md). */
typedef struct iha_kv_cache_options {
    int storage;    /* iha_storage of the keys and values */
    int64_t window; /* the layer's window in tokens (its steps' options->window); only a ring uses it */
    /* L, tokens kept per sequence: 0 or >= shape->tokens keeps all (iha_kv_cache_create's cache);
     * window <= L < shape->tokens: a ring of each sequence's last L tokens, memory O(L). */
    size_t cache_tokens;
    /* 1: the compact layout (doc/spec.md, "The compact cache"): the heads' own keys and values,
     * 2 * H * d elements per token (multi-head attention's size, 1/P of the pseudo-token
     * cache's), mixed into pseudo-keys and -values by each step as it reads them. Every feature
     * above works on it; a ring also keeps the rotary angles of positions 0 .. P-1 (P * d
     * floats). With rotary it keeps each key rotated by its token's first virtual position and
     * adds the rest of the rotation on read, so its steps must keep the rotary setting (rope,
     * rope_base) of the first step after a reset: another is IHA_ERROR_INVALID_ARGUMENT.
     * 0: pseudo-keys and -values, 2 * H * P * d per token. */
    int compact;
} iha_kv_cache_options;
IHA_API void iha_kv_cache_options_init(iha_kv_cache_options *options);

/* iha_kv_cache_create with options (NULL: the defaults); a negative window, or a ring with
 * window 0 or L < window, is IHA_ERROR_INVALID_ARGUMENT. A ring (L tokens, window W) is an
 * ordinary cache whose sequences grow to shape->tokens, positions and rotary counting on, but:
 *   - holds R = L*P + P - 1 rows (the causal mask reads P - 1 rows of the token W back) rounded
 *     up to the key block: iha_kv_cache_bytes is 2 * B * H * R * d elements for any N;
 *   - serves steps whose window w has 1 <= w <= W (else IHA_ERROR_INVALID_ARGUMENT), and runs
 *     one of more than L - w + 1 tokens for some sequence as consecutive steps of at most that
 *     many (a prompt longer than L leaves its last L tokens) with one step's results; under
 *     IHA_MASK_NONE, whose queries read the step's later keys, such a step is refused instead.
 *     Such a step checks every sub-step and allocates the workspace of all of them (the chunk
 *     copies of x and z included, counted in the memory check) before enqueueing the first, so
 *     every refusal changes nothing. Only the device or the OpenCL implementation can then fail
 *     it between sub-steps (IHA_ERROR_OPENCL, IHA_ERROR_DEVICE_MEMORY, IHA_ERROR_BUILD,
 *     IHA_ERROR_GEMM); if it does, sequence b holds its tokens up to the last sub-step that
 *     completed (iha_kv_cache_length tells; a next step with the same window appends there and
 *     decodes right), z is unspecified, and the failed sub-step's tokens may count toward n_max
 *     below (as if appended: the ring's rows they would overwrite are treated as gone);
 *   - rewinds sequence b (iha_kv_cache_truncate) to n tokens only when n_max <= L or
 *     n >= n_max - L + W - 1, n_max its longest length since the last reset (so by at least
 *     L - W + 1 tokens), else IHA_ERROR_INVALID_ARGUMENT, nothing changed. */
IHA_API iha_status iha_kv_cache_create_with(iha_context *ctx, const iha_shape *shape,
                                            const iha_kv_cache_options *options, iha_kv_cache **out);
/* Releases the cache's device memory, after the context's queue has finished (while the
 * context lives). NULL is allowed. */
IHA_API void iha_kv_cache_free(iha_kv_cache *cache);
/* Forgets every sequence's tokens (lengths back to 0). */
IHA_API void iha_kv_cache_reset(iha_kv_cache *cache);
/* Rewinds sequence b to its first `tokens` tokens (at most its current length; a ring: within
 * what it holds), so an application can drop rejected tokens; IHA_ERROR_INVALID_ARGUMENT
 * otherwise. The next step appends at token `tokens`. */
IHA_API iha_status iha_kv_cache_truncate(iha_kv_cache *cache, size_t b, size_t tokens);
/* The current length of sequence b in tokens (0 for a bad index). */
IHA_API size_t iha_kv_cache_length(const iha_kv_cache *cache, size_t b);
/* Device bytes of the keys and values: 2 * B * H * P * d elements per token of capacity (a ring: above);
 * a compact cache 2 * B * H * d elements per token (a ring: of ring_tokens + 1 tokens, and its angles). */
IHA_API size_t iha_kv_cache_bytes(const iha_kv_cache *cache);

/* One decoding step: sequence b appends counts[b] new tokens (counts NULL: shape->tokens for
 * every sequence) at its current length n0_b, and gets their layer outputs.
 *   x  [B][k][D] the new tokens' layer inputs, k = shape->tokens (rows past counts[b] ignored)
 *   z  [B][k][D] their outputs, equal (within rounding) to rows n0_b .. n0_b+counts[b]-1 of
 *      iha_forward over tokens 0 .. n0_b+counts[b]-1; rows past counts[b] are written as 0.
 * One token (k = 1) is generation; a chunk is prefill; ragged counts let sequences of
 * different lengths share a step. The step computes the projections, mixes the new tokens into
 * pseudo-heads (rotary at virtual positions n*P+p), appends their keys and values to the cache
 * and attends under options' mask and window. shape->batch, heads, head_dim and pseudo must
 * equal the cache's. A step that would grow any sequence past the cache's max_tokens returns
 * IHA_ERROR_INVALID_ARGUMENT and writes nothing (cache and z untouched). A step that the device
 * fails after it was checked leaves every length as it was (on a ring its tokens may count
 * toward n_max; a ring's long step: see iha_kv_cache_create_with). On a ring the attention reads
 * only the ring: its cost follows the window, not the sequence's length.
 * Packed step (options->seq_lens set, a prefill of sequences of different lengths without
 * padding): seq_count must equal the cache's batch B and counts must be NULL; sequence b
 * appends seq_lens[b] tokens (0 to k = shape->tokens), and x and z hold the new tokens of all
 * sequences back to back, [sum of seq_lens][D] (sequence 0's first). It runs as the ragged
 * step of counts seq_lens on padded copies of x and z in workspace ([B][k][D] each). */
IHA_API iha_status iha_decode_step(iha_context *ctx, iha_kv_cache *cache, const iha_shape *shape,
                                   const iha_attention_options *options, const iha_layer_weights *weights,
                                   const uint32_t *counts, iha_buffer x, iha_buffer z);

/* ---- Half-precision and bfloat16 host arrays --------------------------------------------- */

/* Convert n elements between float and IEEE binary16 (as uint16_t bit patterns) in host memory,
 * for filling and reading IHA_STORAGE_F16 buffers. Rounding is to nearest even, as the device's
 * vstore_half; values beyond the half range become infinities, NaN stays NaN (quiet),
 * subnormals are kept. src and dst must not overlap; n == 0 does nothing. Thread-safe, no
 * context needed. */
IHA_API void iha_half_from_float(const float *src, uint16_t *dst, size_t n);
IHA_API void iha_half_to_float(const uint16_t *src, float *dst, size_t n);

/* Convert n elements between float and bfloat16 (as uint16_t bit patterns: a float's upper 16
 * bits) in host memory, for filling and reading IHA_STORAGE_BF16 buffers, bit-exact with the
 * device. Rounding is to nearest even; finite values past the largest bfloat16 (about 3.39e38)
 * become infinities, infinities stay infinite, NaN stays NaN (quiet), subnormals are kept.
 * iha_bf16_to_float is exact. src and dst must not overlap; n == 0 does nothing. Thread-safe, no
 * context needed. */
IHA_API void iha_bf16_from_float(const float *src, uint16_t *dst, size_t n);
IHA_API void iha_bf16_to_float(const uint16_t *src, float *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* IHA_H */
