// bfloat16 <-> float32 on the host: bf16 is the top 16 bits of an IEEE float32; conversion to
// bf16 rounds to nearest, ties to even, and keeps NaNs NaN.
#pragma once
#include <stdint.h>
#include <string.h>

static inline float loom_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t loom_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
