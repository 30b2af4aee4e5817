/* Host conversions between float and bfloat16 (the upper 16 bits of a float32), bit-exact with
 * the device's bf16.clh (round to nearest even, NaN kept a quiet NaN), so a test or an
 * application can prepare and read IHA_STORAGE_BF16 buffers. */
#include <string.h>

#include "iha.h"

static uint16_t bf16_from_float(float value)
{
    uint32_t x;
    memcpy(&x, &value, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* NaN, kept quiet */
    /* Adding 0x7fff plus the lowest kept bit carries exactly when the dropped half is past the
     * halfway point, or at it with an odd kept part; a carry out of the largest finite value
     * reaches the infinity pattern, as rounding should. */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float bf16_to_float(uint16_t b)
{
    const uint32_t x = (uint32_t)b << 16;
    float out;
    memcpy(&out, &x, sizeof out);
    return out;
}

void iha_bf16_from_float(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_from_float(src[i]);
}

void iha_bf16_to_float(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}
