/* Copy bandwidth (src/measure/copy_bandwidth.c): dst = src in COPY_VEC-float vectors, one
 * vector per work-item, so that each byte is read once and written once. */
#include "loop_probe.clh"

/* Floats per load and store: 4 is a 16-byte access, which every GPU coalesces; 16 is a cache
 * line, which PoCL copies fastest on a CPU (src/measure/copy_bandwidth.c). */
#ifndef COPY_VEC
#define COPY_VEC 4
#endif

#define COPY_TYPE_(w) float##w
#define COPY_TYPE(w) COPY_TYPE_(w)

__kernel void measure_copy_f32(__global const COPY_TYPE(COPY_VEC) *src, __global COPY_TYPE(COPY_VEC) *dst,
                               ulong vectors IHA_PROBE_PARAMS)
{
    const size_t i = get_global_id(0);
    if (i < vectors) dst[i] = src[i];
    IHA_PROBE_CHECK();
}
