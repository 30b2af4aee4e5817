/*
 * bench.h - "iha bench": what it was asked to run (bench_config) and what it measured
 * (bench_results), shared by the measuring (bench_ceilings.c, bench_core.c with the backward
 * pass, bench_layer.c, bench_decode.c, cold_start.c) and the reporting (bench_report.c) halves.
 * Every time is a median in seconds; every FLOP count follows doc/spec.md's cost model (cost.h), the
 * backward pass's FlashAttention-2's convention (bench_backward).
 */
#ifndef IHA_TOOLS_BENCH_H
#define IHA_TOOLS_BENCH_H

#include <stddef.h>

#include "bench/cost.h"
#include "iha.h"
#include "iha_measure.h"
#include "iha_tune.h"

/* The unfused baseline materialises T x T floats per (b, h); past this T it is not run. */
#define BENCH_BASELINE_MAX_T 8192
/* The most sequences --seq-lens takes. */
#define BENCH_MAX_SEQS 64

typedef struct bench_config {
    iha_shape core;                /* the attention problem (model_dim unused) */
    iha_shape layer;               /* the whole layer: the core's B, H, d, P with its own N and D */
    iha_attention_options options; /* mask and window of both */
    size_t reps;                   /* timed runs after one warm-up run */
    size_t baseline_reps;          /* timed single-sequence runs of the unfused baseline (it is slow) */
    const char *device;            /* NULL: $IHA_DEVICE or the default */
    int json;
    int run_layer, run_ceilings, run_baseline, run_cold_start;
    int run_backward;              /* --backward: also the core's and the layer's gradients (slow; off by default) */
    int run_decode;                /* --decode: only the decoding step (and the ceilings), not the core */
    size_t decode_tokens;          /* tokens already in the cache, per sequence */
    int decode_half;               /* the cache stores half */
    int decode_compact;            /* --compact: also the compact cache, in the same run */
    size_t ring_tokens;            /* --ring L: also a ring cache of L tokens against a full one (0: not run) */
    int half_weights;              /* --half-weights: the weights and x, z (the layer's, with --backward
                                      also dz, dx and the gradients; or the decoding step's) are
                                      stored half */
    size_t seq_lens[BENCH_MAX_SEQS]; /* --seq-lens: the packed row's sequences (core.tokens is their sum) */
    size_t seq_count;                /* 0: no --seq-lens */
    int bf16;                        /* --bf16: as --half-weights in bfloat16, and with --decode also
                                        the cache */
    int core_half;                   /* --core-half: the core's qt, kt, vt and o stored half */
} bench_config;

/* What a section holds: measured, skipped by an option, or not possible (note says why). */
typedef enum bench_state { BENCH_SKIPPED = 0, BENCH_RAN, BENCH_NOT_RUN } bench_state;

/* A GEMM of m x n x k: 2*m*n*k FLOPs. */
typedef struct bench_gemm {
    size_t m, n, k;
    double seconds;
} bench_gemm;

typedef struct bench_ceilings {
    bench_state state;
    char note[256];
    size_t copy_bytes;            /* bytes copied per run (read once, written once) */
    double copy_bytes_per_second; /* 2 * copy_bytes / seconds */
    bench_gemm clblast_square, clblast_projection;
    /* The library's SGEMM kernel (iha_measure_gemm_kernel): the projection shape and one row of
     * it (a decoding step's projection). */
    bench_gemm kernel_projection, kernel_row;
    double peak_fma_gflops;
    bench_state host_state; /* BENCH_NOT_RUN when not built with CBLAS or the device is no CPU */
    char host_note[128];
    char host_core[64];     /* OpenBLAS's core (host_sgemm_core), "" for another CBLAS */
    char host_warning[256]; /* host_sgemm_core_warning's text, "" when there is none */
    bench_gemm host_square, host_projection;
    /* The attention kernel's score and P.V loops alone for the core's shape
     * (iha_measure_attention_loops): BENCH_NOT_RUN with a note where the device's configuration
     * has no such loops (the local-memory variant), skipped with --decode. */
    bench_state loops_state;
    char loops_note[256];
    double loops_score_gflops, loops_pv_gflops;
    /* The compute ceilings (peak FMA, CLBlast and host SGEMM 1024^3) are measured again after
     * the attention core and the layer, because a shared machine's neighbours move every rate
     * by 10-30% for minutes at a time and one slow reading made ratios above 1. The fields above
     * keep the faster reading, so ratios are against the best the device showed in this run;
     * these keep both (before, after; 0 when the second was not taken). The attention loops
     * are read twice as well and keep their faster reading. */
    int rechecked;
    double peak_fma_readings[2];                     /* GFLOP/s */
    double clblast_square_readings[2], host_square_readings[2]; /* seconds */
} bench_ceilings;

/* The configuration one of the library's kernels ran with (iha_context_last_choices), so that
 * a report says which code its rates belong to: a tuned profile entry, a built-in default, or
 * the safe fallback (a correct, slow configuration used when the others are unusable for the
 * bucket), whose rates say nothing about the kernel's design. */
typedef struct bench_choice {
    int found; /* 0 when the call reported no entry for the kernel */
    char config[512];
    int source; /* an iha_config_source */
    char source_bucket[160];
} bench_choice;

/* Skipped with --decode, which measures a decoding step instead. */
typedef struct bench_core {
    bench_state state;
    double flops; /* 4*d per visible pair, B*H sequences */
    double bytes; /* fewest bytes: Qt, Kt, Vt read and O written once, 4*B*H*T*d*4 */
    double seconds;
    bench_choice choice; /* the attention kernel's */
} bench_core;

/* The baseline is timed on single (b, h) sequences and scaled by B*H (see bench_core.c). */
typedef struct bench_baseline {
    bench_state state;
    char note[256];
    double sequence_seconds; /* median over the timed sequences */
    double seconds;          /* sequence_seconds * B*H: the whole problem */
    size_t sequences_timed;  /* distinct sequences among the timed runs */
    double rel_difference;   /* ||fused - unfused|| / ||unfused|| over those sequences' outputs */
} bench_baseline;

/* iha_attention_backward on the core's problem, its o and lse from one iha_attention call
 * (bench_core.c). FLOPs follow FlashAttention-2's convention: five T x T products (S recomputed,
 * dP, dV, dQ, dK), 10*d per visible pair, 2.5 times the forward's 4*d. The library's kernels do
 * more (its dq and dk/dv kernels each recompute S and dP: 14*d), which the count leaves out. */
typedef struct bench_backward {
    bench_state state; /* skipped without --backward; never BENCH_NOT_RUN (a failure fails the run) */
    double flops;           /* 10*d per visible pair, B*H sequences */
    double seconds;
    double forward_seconds; /* the core's fused iha_attention in the same run */
} bench_backward;

/* Bytes each memory-bound stage must move at least (float32, every tensor touched once):
 *   mixing   reads Q, K, V (3*B*N*H*d) and alpha_Q/K/V (3*H*H*P), writes Qt, Kt, Vt (3*B*H*T*d);
 *   collapse reads O (B*H*T*d) and R (H*H*P), writes Y (B*N*H*d). */
typedef struct bench_layer {
    bench_state state;
    char note[256];
    iha_stage_times stages;
    double wall;
    cost_flops flops;
    double mixing_bytes, collapse_bytes;
    int library_gemm; /* the layer's GEMM backend was the library's kernel (else CLBlast) */
    /* With --backward: iha_backward of the same layer (dx and every weight's gradient), its
     * median wall time and stages (the meanings of iha_backward's stage times). */
    int backward_ran;
    double backward_wall;
    iha_stage_times backward_stages;
    /* And the training pair that skips the recomputed attention forward: median wall times of
     * iha_forward_save and iha_backward_saved, and the saved state's bytes. */
    double forward_save_wall, backward_saved_wall, saved_bytes;
} bench_layer;

/* One child process: context creation, then the first iha_forward of the layer shape, then a
 * second one, whose time is the layer's own: the first's excess over it is the start-up cost. */
typedef struct bench_cold_run {
    double context_seconds, forward_seconds, second_forward_seconds;
    double process_seconds; /* spawn to exit, seen by the parent: adds process start and teardown */
} bench_cold_run;

typedef struct bench_cold_start {
    bench_state state;
    char note[256];
    bench_cold_run empty; /* fresh IHA_CACHE_DIR and POCL_CACHE_DIR */
    bench_cold_run warm;  /* the same directories again, filled by the first child */
} bench_cold_start;

/* One generated token per sequence against a cache of decode_tokens tokens (bench_decode.c). */
typedef struct bench_decode {
    bench_state state;
    char note[256];
    double step_seconds;      /* the whole step: projections, mixing, attention, collapse, output */
    double attention_seconds; /* the step's attention stage */
    double cache_bytes_read;  /* the cached elements the new tokens' queries see, read once: pseudo-keys
                                 and -values, or a compact cache's K and V */
    double cache_bytes_per_token;
    bench_choice choice; /* the decode kernel's */
} bench_decode;

/* --decode --ring L (bench_ring.c): one generated token per sequence at L, 4L and 16L cached
 * tokens, on a ring cache of L tokens (the layer's window) and on a cache keeping every token. */
#define BENCH_RING_POSITIONS 3
typedef struct bench_ring_position {
    size_t tokens;                   /* tokens cached per sequence before the timed step */
    double ring_step_seconds, full_step_seconds;
    size_t ring_cache_bytes;         /* iha_kv_cache_bytes of the ring */
    size_t full_cache_bytes;         /* of a cache keeping every one of tokens + 1 tokens */
} bench_ring_position;

typedef struct bench_ring {
    bench_state state;
    char note[256];
    size_t cache_tokens; /* L */
    bench_ring_position at[BENCH_RING_POSITIONS];
} bench_ring;
/* --seq-lens (bench_packed.c): the attention core on one row packing the sequences, the same
 * sequences one by one, and one unpacked sequence of their total length. Pairs follow
 * doc/spec.md's cost model per sequence (4*d FLOPs each), over the H heads. */
typedef struct bench_packed {
    bench_state state;
    double packed_seconds, separate_seconds, unpacked_seconds;
    double visible_pairs;  /* of the packed row: the sum over its sequences */
    double unpacked_pairs; /* of one sequence of the total length */
    bench_choice choice;   /* the packed call's attention configuration */
} bench_packed;

/* The host's 1-minute load average (/proc/loadavg) when the run started and when it ended, and
 * its online CPUs: on a shared machine the figures depend on what else runs. known is 0 where
 * the host has no /proc/loadavg. */
typedef struct bench_host_load {
    int known;
    double start, end;
    long cpus;
} bench_host_load;

typedef struct bench_results {
    char device[256];
    int device_is_cpu;
    bench_host_load load;
    bench_ceilings ceilings;
    bench_core core;
    bench_baseline baseline;
    bench_backward backward;
    bench_layer layer;
    bench_cold_start cold;
    bench_decode decode;
    bench_decode decode_compact; /* the compact cache's step (--compact) */
    bench_ring ring;
    bench_packed packed;
} bench_results;

/* Prints "iha bench: <what>: <status name>: <context message>" to stderr; returns -1. */
int bench_fail(iha_context *ctx, iha_status status, const char *what);
/* The last call's configuration of `kernel` ("attention", "decode", ...) into *out. */
void bench_choice_get(const iha_context *ctx, const char *kernel, bench_choice *out);

/* The measurements, in the order they run (bench_<section>.c). Each returns 0, or -1 after
 * printing the failure to stderr; a section that cannot run on this device sets BENCH_NOT_RUN
 * and a note instead of failing. */
int bench_ceilings_run(iha_context *ctx, const bench_config *c, int device_is_cpu, bench_ceilings *out);
/* The second reading of the compute ceilings, after everything else in the process ran. */
int bench_ceilings_recheck(iha_context *ctx, const bench_config *c, bench_ceilings *out);
/* The core, then the baseline and the backward pass where the config asks for them. */
int bench_core_run(iha_context *ctx, const bench_config *c, bench_core *core, bench_baseline *baseline,
                   bench_backward *backward);
int bench_layer_run(iha_context *ctx, const bench_config *c, bench_layer *out);
/* compact: on the compact cache (iha_kv_cache_options.compact) instead of the pseudo-token one. */
int bench_decode_run(iha_context *ctx, const bench_config *c, int compact, bench_decode *out);
int bench_ring_run(iha_context *ctx, const bench_config *c, bench_ring *out);
int bench_packed_run(iha_context *ctx, const bench_config *c, bench_packed *out);

/* Cold start (cold_start.c): the parent spawns "iha bench <args> --cold-start-child DIR" twice
 * with a fresh POCL_CACHE_DIR in its environment; the child measures and prints one line. */
void bench_cold_start_run(int argc, char **argv, bench_cold_start *out);
int bench_cold_start_child(const bench_config *c, const char *cache_dir);

/* Output (bench_report.c). */
void bench_print_table(const bench_config *c, const bench_results *r);
void bench_print_json(const bench_config *c, const bench_results *r);

#endif
