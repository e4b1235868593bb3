/* IEEE half and bfloat16 conversions, exact in both directions where the
 * value is representable (round to nearest even on the way down). */
#ifndef MR_HALF_H
#define MR_HALF_H

#include <stdint.h>
#include <string.h>

static inline float mr_bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t mr_f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float mr_bf16_to_f32(uint16_t h) { return mr_bits_to_f32((uint32_t)h << 16); }

static inline uint16_t mr_f32_to_bf16(float f)
{
    uint32_t u = mr_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float mr_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0)
            return mr_bits_to_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return mr_bits_to_f32(sign | 0x7f800000u | (man << 13));
    return mr_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t mr_f32_to_f16(float f)
{
    uint32_t u = mr_f32_to_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        float a = mr_bits_to_f32(absu);
        /* a * 2^24, rounded to nearest even by the FPU's default mode */
        float m = a * 16777216.0f;
        uint32_t mi = (uint32_t)m;
        float rem = m - (float)mi;
        if (rem > 0.5f || (rem == 0.5f && (mi & 1u)))
            mi++;
        return (uint16_t)(sign | mi);
    }
    uint32_t exp = ((absu >> 23) - 112) << 10;
    uint32_t man = (absu >> 13) & 0x3ffu;
    uint32_t h = exp | man;
    uint32_t rest = absu & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

#endif
