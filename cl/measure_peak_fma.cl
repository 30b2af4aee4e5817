/* The device's peak FMA rate (src/measure/peak_fma.c): each work-item keeps FMA_CHAINS
 * independent chains of floatFMA_WIDTH values in registers and advances every chain by one
 * FMA per iteration, so that the FMA units never wait for a result (a chain's next FMA needs its
 * previous one: latency times issue rate chains hide it, 8 on a core with two FMA pipes of
 * latency 4). Explicit vectors inside a work-item let PoCL emit one full-width ymm or zmm FMA per
 * operation without having to vectorise across work-items; a vector narrower than the device's
 * registers (float8 on AVX-512) measures half the peak. */
#include "loop_probe.clh"

/* Lanes per chain: one register of the device (the host passes its preferred float vector
 * width): 8 fills an AVX2 register, 16 an AVX-512 one. */
#ifndef FMA_WIDTH
#define FMA_WIDTH 16
#endif
/* Independent chains per work-item: 12 hide a latency of up to 6 cycles on two FMA pipes, and
 * with the two constants take 14 registers, within AVX2's 16 and AVX-512's 32. */
#ifndef FMA_CHAINS
#define FMA_CHAINS 12
#endif

#define FMA_VEC_(w) float##w
#define FMA_VEC(w) FMA_VEC_(w)
typedef FMA_VEC(FMA_WIDTH) fma_vec;

/* x <- x*a + b with 0 < a < 1 converges to b/(1-a): the values stay normal and finite for any
 * iteration count. The sum is written out so that the compiler cannot drop the chains. */
__kernel void measure_peak_fma_f32(__global float *out, int iterations, float a, float b IHA_PROBE_PARAMS)
{
    const fma_vec va = (fma_vec)(a), vb = (fma_vec)(b);
    fma_vec x[FMA_CHAINS];
#pragma unroll
    for (int c = 0; c < FMA_CHAINS; ++c) x[c] = (fma_vec)((float)get_global_id(0) * 1e-9f + (float)c * 1e-3f);
    int i = 0;
    for (; i < iterations + IHA_PROBE_PAST; ++i) {
        IHA_PROBE_SKIP_PAST(i >= iterations);
#pragma unroll
        for (int c = 0; c < FMA_CHAINS; ++c) x[c] = fma(x[c], va, vb);
    }
    IHA_PROBE_EXPECT(i >= iterations + IHA_PROBE_PAST);
    fma_vec s = x[0];
#pragma unroll
    for (int c = 1; c < FMA_CHAINS; ++c) s += x[c];
    float total = 0.0f;
    const float *lanes = (const float *)&s;
    for (int l = 0; l < FMA_WIDTH; ++l) total += lanes[l];
    out[get_global_id(0)] = total;
    IHA_PROBE_CHECK();
}
