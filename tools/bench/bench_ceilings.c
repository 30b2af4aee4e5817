/*
 * bench_ceilings.c - what the device can do at all, measured in the same run as the layer:
 * copy bandwidth, CLBlast SGEMM (square and the layer's projection shape), the library's own
 * SGEMM kernel (the projection shape and one row of it), the library's peak-FMA kernel, the
 * attention kernel's own inner loops alone, and on a CPU device the host's SGEMM through CBLAS
 * with the OpenBLAS core it ran.
 */
#include <stdio.h>

#include "bench/bench.h"
#include "bench/host_sgemm.h"

/* Well above any CPU's last-level cache, small enough for every device's largest buffer. */
#define COPY_BYTES ((size_t)256 << 20)
#define SQUARE 1024

static cl_ulong max_alloc_bytes(iha_context *ctx)
{
    cl_ulong bytes = 0;
    if (clGetDeviceInfo(iha_context_cl_device(ctx), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof bytes, &bytes, NULL) !=
        CL_SUCCESS)
        bytes = 0;
    return bytes;
}

static int device_gemm(iha_context *ctx, int kernel, size_t reps, bench_gemm *g)
{
    iha_status st = kernel ? iha_measure_gemm_kernel(ctx, g->m, g->n, g->k, reps, &g->seconds)
                           : iha_measure_gemm(ctx, g->m, g->n, g->k, reps, &g->seconds);
    if (st == IHA_OK)
        return 0;
    char what[96];
    snprintf(what, sizeof what, "%s SGEMM %zux%zux%zu", kernel ? "library" : "CLBlast", g->m, g->n, g->k);
    return bench_fail(ctx, st, what);
}

/* The fused kernel's own loops for the core's shape: a ceiling of the design, not the device. */
static int attention_loops(iha_context *ctx, const bench_config *c, double *score, double *pv, bench_ceilings *out)
{
    iha_status st = iha_measure_attention_loops(ctx, &c->core, &c->options, score, pv);
    if (st == IHA_ERROR_UNSUPPORTED) {
        out->loops_state = BENCH_NOT_RUN;
        snprintf(out->loops_note, sizeof out->loops_note, "%s", iha_context_message(ctx));
        return 0;
    }
    return st == IHA_OK ? 0 : bench_fail(ctx, st, "attention loops");
}

static void host_gemms(const bench_config *c, int device_is_cpu, bench_ceilings *out)
{
    out->host_square = out->clblast_square;
    out->host_projection = out->clblast_projection;
    if (!host_sgemm_available()) {
        out->host_state = BENCH_NOT_RUN;
        snprintf(out->host_note, sizeof out->host_note, "no CBLAS library found (libopenblas.so.0, libcblas.so.3 or libblas.so.3)");
        return;
    }
    if (!device_is_cpu) {
        out->host_state = BENCH_NOT_RUN;
        snprintf(out->host_note, sizeof out->host_note, "the device is not the host CPU");
        return;
    }
    if (host_sgemm_seconds(out->host_square.m, out->host_square.n, out->host_square.k, c->reps,
                           &out->host_square.seconds) ||
        host_sgemm_seconds(out->host_projection.m, out->host_projection.n, out->host_projection.k, c->reps,
                           &out->host_projection.seconds)) {
        out->host_state = BENCH_NOT_RUN;
        snprintf(out->host_note, sizeof out->host_note, "host SGEMM failed (out of host memory?)");
        return;
    }
    out->host_state = BENCH_RAN;
    const char *core = host_sgemm_core();
    snprintf(out->host_core, sizeof out->host_core, "%s", core ? core : "");
    snprintf(out->host_note, sizeof out->host_note, "%s", host_sgemm_library());
    if (!host_sgemm_core_warning(out->host_warning, sizeof out->host_warning))
        out->host_warning[0] = 0;
}

int bench_ceilings_run(iha_context *ctx, const bench_config *c, int device_is_cpu, bench_ceilings *out)
{
    out->copy_bytes = COPY_BYTES;
    cl_ulong cap = max_alloc_bytes(ctx);
    if (cap && out->copy_bytes > cap)
        out->copy_bytes = (size_t)cap;
    iha_status st = iha_measure_copy_bandwidth(ctx, out->copy_bytes, &out->copy_bytes_per_second);
    if (st != IHA_OK)
        return bench_fail(ctx, st, "copy bandwidth");
    out->clblast_square = (bench_gemm){SQUARE, SQUARE, SQUARE, 0};
    const iha_shape *l = &c->layer;
    out->clblast_projection = (bench_gemm){l->batch * l->tokens, l->heads * l->head_dim, l->model_dim, 0};
    out->kernel_projection = out->clblast_projection;
    out->kernel_row = (bench_gemm){1, out->clblast_projection.n, out->clblast_projection.k, 0};
    if (device_gemm(ctx, 0, c->reps, &out->clblast_square) || device_gemm(ctx, 0, c->reps, &out->clblast_projection) ||
        device_gemm(ctx, 1, c->reps, &out->kernel_projection) || device_gemm(ctx, 1, c->reps, &out->kernel_row))
        return -1;
    st = iha_measure_peak_fma(ctx, &out->peak_fma_gflops);
    if (st != IHA_OK)
        return bench_fail(ctx, st, "peak FMA");
    if (!c->run_decode) {
        out->loops_state = BENCH_RAN;
        if (attention_loops(ctx, c, &out->loops_score_gflops, &out->loops_pv_gflops, out))
            return -1;
    }
    host_gemms(c, device_is_cpu, out);
    out->peak_fma_readings[0] = out->peak_fma_gflops;
    out->clblast_square_readings[0] = out->clblast_square.seconds;
    out->host_square_readings[0] = out->host_square.seconds;
    out->state = BENCH_RAN;
    return 0;
}

static double faster(double a, double b) { return a > 0 && (b <= 0 || a < b) ? a : b; }

/* A second reading that fails leaves the first one standing (the failure is printed): the run's
 * other results are worth keeping. */
int bench_ceilings_recheck(iha_context *ctx, const bench_config *c, bench_ceilings *out)
{
    if (out->state != BENCH_RAN)
        return 0;
    bench_gemm square = out->clblast_square;
    if (device_gemm(ctx, 0, c->reps, &square))
        square.seconds = 0;
    double peak = 0;
    iha_status st = iha_measure_peak_fma(ctx, &peak);
    if (st != IHA_OK) {
        peak = 0;
        bench_fail(ctx, st, "peak FMA");
    }
    if (out->loops_state == BENCH_RAN) {
        double score = 0, pv = 0;
        st = iha_measure_attention_loops(ctx, &c->core, &c->options, &score, &pv);
        if (st != IHA_OK) {
            score = pv = 0;
            bench_fail(ctx, st, "attention loops");
        }
        out->loops_score_gflops = score > out->loops_score_gflops ? score : out->loops_score_gflops;
        out->loops_pv_gflops = pv > out->loops_pv_gflops ? pv : out->loops_pv_gflops;
    }
    double host = 0;
    if (out->host_state == BENCH_RAN &&
        host_sgemm_seconds(out->host_square.m, out->host_square.n, out->host_square.k, c->reps, &host))
        host = 0; /* the first reading stands */
    out->rechecked = 1;
    out->peak_fma_readings[1] = peak;
    out->clblast_square_readings[1] = square.seconds;
    out->host_square_readings[1] = host;
    out->peak_fma_gflops = peak > out->peak_fma_gflops ? peak : out->peak_fma_gflops;
    out->clblast_square.seconds = faster(square.seconds, out->clblast_square.seconds);
    out->host_square.seconds = faster(host, out->host_square.seconds);
    return 0;
}
