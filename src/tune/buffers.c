/* Host data, device buffers and error measure for tuning problems. */
#include "tune/buffers.h"
#include "runtime/error.h"

#include <math.h>
#include <stdlib.h>

float *iha__tune_random(size_t n, uint64_t seed)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (x == NULL) return NULL;
    uint64_t s = seed * 2654435761u + 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < n; ++i) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        const uint64_t r = s * 0x2545f4914f6cdd1du;
        x[i] = (float)((double)(r >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    }
    return x;
}

iha_status iha__tune_buffer(iha_context *ctx, size_t n, const float *data, cl_mem *out)
{
    cl_int err = CL_SUCCESS;
    const size_t bytes = (n ? n : 1) * sizeof(float);
    IHA_RETURN_ERROR_IF(bytes > ctx->info.max_alloc_bytes, ctx, IHA_ERROR_DEVICE_MEMORY,
                        "a tuning buffer of %zu bytes exceeds the device's largest allocation", bytes);
    cl_mem_flags flags = CL_MEM_READ_WRITE | (data ? CL_MEM_COPY_HOST_PTR : 0);
    *out = clCreateBuffer(ctx->cl_ctx, flags, bytes, data ? (void *)data : NULL, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateBuffer (tuning problem)");
    return IHA_OK;
}

void iha__tune_round_half(float *x, size_t n)
{
    uint16_t h[256];
    for (size_t i = 0; i < n; i += 256) {
        const size_t m = n - i < 256 ? n - i : 256;
        iha_half_from_float(x + i, h, m);
        iha_half_to_float(h, x + i, m);
    }
}

iha_status iha__tune_buffer_stored(iha_context *ctx, float *x, size_t n, int half, cl_mem *out)
{
    if (!half) return iha__tune_buffer(ctx, n, x, out);
    /* Whole floats of half pairs: the last one padded. */
    uint16_t *h = calloc(n + 2, sizeof *h);
    IHA_RETURN_ERROR_IF(h == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    iha_half_from_float(x, h, n);
    iha_half_to_float(h, x, n);
    iha_status st = iha__tune_buffer(ctx, (n + 1) / 2, (const float *)(const void *)h, out);
    free(h);
    return st;
}

iha_status iha__tune_poison(iha_context *ctx, cl_mem mem, size_t n)
{
    const cl_float nan_value = NAN;
    IHA_CL_CHECK(ctx, clEnqueueFillBuffer(ctx->queue, mem, &nan_value, sizeof nan_value, 0, n * sizeof(float), 0, NULL, NULL),
                 "clEnqueueFillBuffer (poison)");
    return IHA_OK;
}

iha_status iha__tune_read(iha_context *ctx, cl_mem mem, size_t n, float *out)
{
    IHA_CL_CHECK(ctx, clEnqueueReadBuffer(ctx->queue, mem, CL_TRUE, 0, n * sizeof(float), out, 0, NULL, NULL),
                 "clEnqueueReadBuffer (tuning check)");
    return IHA_OK;
}

void iha__tune_release(cl_mem *mems, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        if (mems[i]) clReleaseMemObject(mems[i]);
        mems[i] = NULL;
    }
}

double iha__tune_rel_error(const float *out, const double *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(out[i])) return INFINITY;
        const double e = (double)out[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* doc/spec.md's visibility rule for virtual query t and key u (n, m: their tokens). */
int iha__tune_visible(long t, long u, long P, int mask, long W)
{
    const long n = t / P, m = u / P;
    if (mask == IHA_MASK_CAUSAL) return u <= t && (W == 0 || t - u < W * P);
    if (mask == IHA_MASK_TOKEN_CAUSAL) return m <= n && (W == 0 || n - m < W);
    return W == 0 || labs(n - m) < W;
}

void iha__tune_reference_row(const float *q, const float *k, const float *v, long t, long T, long d, long P, int mask,
                             long W, double scale, double *s, double *out)
{
    double mx = -INFINITY, sum = 0.0;
    for (long u = 0; u < T; ++u) {
        s[u] = -INFINITY;
        if (!iha__tune_visible(t, u, P, mask, W)) continue;
        double dot = 0.0;
        for (long c = 0; c < d; ++c) dot += (double)q[c] * k[u * d + c];
        s[u] = dot * scale;
        mx = s[u] > mx ? s[u] : mx;
    }
    for (long c = 0; c < d; ++c) out[c] = 0.0;
    for (long u = 0; u < T; ++u) {
        if (s[u] == -INFINITY) continue;
        const double e = exp(s[u] - mx);
        sum += e;
        for (long c = 0; c < d; ++c) out[c] += e * v[u * d + c];
    }
    if (sum > 0.0)
        for (long c = 0; c < d; ++c) out[c] /= sum;
}

int iha__tune_copy_count(int verify, int asked, int max)
{
    if (verify || asked < 1) return 1;
    return asked > max ? max : asked;
}

iha_status iha__tune_check_output(iha_context *ctx, void *problem, const iha_tune_config *c, iha_tune_run_fn run,
                                  cl_mem output, size_t n, void (*reference)(const void *problem, double *ref),
                                  double *error)
{
    float *out = malloc(n * sizeof *out);
    double *ref = calloc(n, sizeof *ref);
    iha_status st = out && ref ? IHA_OK : iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory");
    if (st == IHA_OK) st = iha__tune_poison(ctx, output, n);
    if (st == IHA_OK) st = run(ctx, problem, c, 0);
    if (st == IHA_OK) st = iha__tune_read(ctx, output, n, out);
    if (st == IHA_OK) {
        reference(problem, ref);
        *error = iha__tune_rel_error(out, ref, n);
    }
    free(out);
    free(ref);
    return st;
}
