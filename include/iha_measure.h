/*
 * iha_measure.h - what the device can do at all, for benchmarks and tools.
 *
 * The calls of iha.h compute; these measure the device and the library's kernels against it,
 * and give the unfused baseline that the fused attention is compared with. It includes iha.h;
 * nothing includes it implicitly.
 */
#ifndef IHA_MEASURE_H
#define IHA_MEASURE_H

#include "iha.h"

#ifdef __cplusplus
extern "C" {
#endif

/* These calls let a benchmark put the layer's speed next to what the device can do at all
 * (`iha bench` uses them). The iha_measure_* calls block until done: they time with a monotonic
 * clock around clFinish (the context's queue needs no profiling flag), run once untimed first so
 * that kernel builds and first-touch page faults are not timed, report the median of their
 * timed runs, and release their scratch buffers before returning. They take from milliseconds
 * to a few seconds. iha_attention_unfused is a computation, not a measurement: time it yourself
 * as you would iha_attention. */

/* The median seconds of one CLBlast SGEMM, C[m][n] = A[m][k] B[k][n] (row-major, no
 * transposes), over `reps` timed runs on the context's device (2*m*n*k / *seconds FLOP/s), with
 * the CLBlast parameters of the context's GEMM configuration (the profile's or the device type's
 * built-in, whichever backend it names; see iha_tune.h), applied first when no layer call has
 * applied them; CLBlast holds parameters process-wide per device, so this applies to every
 * context on the device, even one whose layer calls use the library's kernel. This is the
 * layer's GEMM rate where CLBlast is the backend. reps from 1 to 1000. Returns
 * IHA_ERROR_INVALID_ARGUMENT for a zero size or reps, IHA_ERROR_SIZE_OVERFLOW or
 * IHA_ERROR_DEVICE_MEMORY when a matrix does not fit in one device allocation, IHA_ERROR_GEMM
 * when CLBlast fails. */
IHA_API iha_status iha_measure_gemm(iha_context *ctx, size_t m, size_t n, size_t k, size_t reps, double *seconds);

/* The same measurement through the library's own SGEMM kernel (cl/gemm.cl, a register-tile
 * micro-kernel; see iha_tune.h for when layer calls use it) with the tile of the context's GEMM
 * configuration (the profile's, or the device type's built-in; the kernel's default tile when
 * the configuration is CLBlast's database). Same arguments and errors as iha_measure_gemm,
 * except IHA_ERROR_GEMM; also IHA_ERROR_BUILD when the kernel does not compile, and
 * IHA_ERROR_UNSUPPORTED when m or n comes within a few thousand of INT_MAX or k exceeds it (the
 * kernel indexes with int). Never calls into CLBlast. */
IHA_API iha_status iha_measure_gemm_kernel(iha_context *ctx, size_t m, size_t n, size_t k, size_t reps, double *seconds);

/* The device's float32 FMA rate in GFLOP/s (an FMA counts as 2 FLOPs), measured with the
 * library's own kernel (cl/measure_peak_fma.cl): independent chains of floatN FMAs held in
 * registers in each work-item, and enough work-items to occupy every compute unit (sizes from
 * device queries). The run length is calibrated to at least about 0.1 s; the result is the
 * median of 5 runs. This is the ceiling for compute-bound kernels; no real kernel reaches it. */
IHA_API iha_status iha_measure_peak_fma(iha_context *ctx, double *gflops);

/* The attention kernel's two inner loops alone, in GFLOP/s (an FMA counts as 2 FLOPs): the
 * register-tile kernel's score loop, one tile of query rows against one key block, and its P.V
 * loop, the tile's probabilities times the block's value rows (cl/attention.cl's functions,
 * launched from cl/measure_attention_loops.cl), each run over and over on one block that stays
 * in the first-level cache, with the configuration
 * iha_attention would use for `shape` and `options` (the profile's or the built-in; the same
 * compiled code), in work-groups of its size, 4 per compute unit on a CPU and 16 on a GPU.
 * Calibrated to about 0.1 s per run, the median of 5 runs each. Streaming keys and values from
 * memory, masks and the softmax only add to these loops, so where these work-items keep the
 * device as busy as iha_attention's do (CPUs), 2 / (1/score + 1/pv) bounds iha_attention's
 * GFLOP/s for this design: the kernel's ceiling, where iha_measure_peak_fma is the device's. On
 * a GPU take it as a guide: the fused kernel runs many more work-groups. Returns the
 * argument errors of iha_attention for shape and options, IHA_ERROR_INVALID_ARGUMENT for a NULL
 * output, IHA_ERROR_UNSUPPORTED when the configuration is the local-memory variant
 * (cl/attention_local.cl, GPUs' built-in for d <= 64), whose loops differ, or with packed
 * sequences (options->seq_lens), IHA_ERROR_BUILD. */
IHA_API iha_status iha_measure_attention_loops(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                               double *score_gflops, double *pv_gflops);

/* The device's copy bandwidth: a kernel (cl/measure_copy.cl) copies `bytes` from one device
 * buffer to another with vector loads and stores (float4 on a GPU, float16 on a CPU);
 * *bytes_per_second = 2*bytes / median time of 5 runs (each byte is read once and written
 * once, as STREAM's copy counts). `bytes` is rounded down to a multiple of the vector (16 or 64
 * bytes) and must be at least one vector and fit in one device allocation
 * (IHA_ERROR_INVALID_ARGUMENT, IHA_ERROR_DEVICE_MEMORY otherwise). Use a size well above the
 * device's last-level cache to measure memory rather than cache. */
IHA_API iha_status iha_measure_copy_bandwidth(iha_context *ctx, size_t bytes, double *bytes_per_second);

/* The unfused baseline of iha_attention: the same contract (qt, kt, vt, o
 * [batch][heads][tokens*pseudo][head_dim], every mask and window, options->rope must be 0, o must
 * not overlap the inputs, no LSE; packed sequences, options->seq_lens, are
 * IHA_ERROR_UNSUPPORTED), computed as a program without a fused kernel would: for each
 * (b, h) in turn, the whole score matrix S = scale * Qt Kt^T (T x T floats) by a CLBlast SGEMM,
 * a masked row softmax in place (cl/measure_softmax.cl; masked entries become 0), and
 * O = S Vt by the context's GEMM backend (see iha_tune.h). Masked blocks are computed and
 * discarded. For benchmarks only: it needs T*T*4 bytes of device memory in one buffer (kept in the context's workspace)
 * and returns IHA_ERROR_UNSUPPORTED when that exceeds the device's largest allocation, or for
 * half storage (options->storage must be IHA_STORAGE_F32). Like iha_attention it enqueues and
 * returns; the result is ready after iha_context_finish. */
IHA_API iha_status iha_attention_unfused(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                         iha_buffer qt, iha_buffer kt, iha_buffer vt, iha_buffer o);

#ifdef __cplusplus
}
#endif
#endif /* IHA_MEASURE_H */
