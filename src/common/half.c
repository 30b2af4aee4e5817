/* Host conversions between float and IEEE binary16, bit-exact with the device's vload_half
 * and vstore_half (round to nearest even), so a test or an application can prepare and read
 * IHA_STORAGE_F16 buffers. */
#include <string.h>

#include "iha.h"

static uint16_t half_from_float(float value)
{
    uint32_t x;
    memcpy(&x, &value, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u, abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu)); /* NaN, kept quiet */
    if (abs >= 0x38800000u) {                     /* at least 2^-14: a normal half, or too large */
        uint32_t m = abs - (112u << 23);          /* rebias the exponent from 127 to 15 */
        m = (m + 0x0fffu + ((m >> 13) & 1u)) >> 13; /* drop 13 bits, to nearest even */
        return (uint16_t)(sign | (m >= 0x7c00u ? 0x7c00u : m)); /* past 65504 rounds to infinity */
    }
    if (abs < 0x33000000u) return (uint16_t)sign; /* below 2^-25 (2^-25 itself ties to even 0) */
    /* A subnormal half: the value in units of 2^-24, rounded to nearest even. */
    const uint32_t e = abs >> 23, mant = (abs & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t q = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (q & 1u))) ++q; /* 0x400 is the smallest normal: fine */
    return (uint16_t)(sign | q);
}

static float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t x;
    if (e == 0) {
        const float v = (float)mant * 5.9604644775390625e-8f; /* 2^-24: exact */
        memcpy(&x, &v, sizeof x);
        x |= sign;
    } else if (e == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((e + 112u) << 23) | (mant << 13);
    }
    float out;
    memcpy(&out, &x, sizeof out);
    return out;
}

void iha_half_from_float(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; ++i) dst[i] = half_from_float(src[i]);
}

void iha_half_to_float(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}
