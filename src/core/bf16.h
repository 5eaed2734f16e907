// bfloat16 <-> float32 on the host: bf16 is the top 16 bits of an IEEE float32; conversion to
// bf16 rounds to nearest, ties to even, and keeps NaNs NaN. And an fp32 value split into a bf16
// and 16 more bits, on the host and the device.
#pragma once
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

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

// An fp32 value (its bits) held as two 16-bit halves, as the split master weights hold it
// (optim/adamw.h): the high half is the value rounded to bf16 by adding half a bf16 ulp to its
// bits (to nearest, ties away from zero: loom_f32_to_bf16's result but on a tie), the low half
// its low 16 bits. The rounding carries into the high half exactly when the low half's top bit is
// set, so loom_split_join gives every 32-bit pattern back from its two halves: no bit is lost.
// (A NaN's high half may not be a NaN; a finite value's is its nearest bf16, or an infinity past
// bf16's largest, as loom_f32_to_bf16 gives.)
static inline LOOM_HOST_DEVICE uint16_t loom_split_high(uint32_t bits) { return (uint16_t)((bits + 0x8000u) >> 16); }
static inline LOOM_HOST_DEVICE uint16_t loom_split_low(uint32_t bits) { return (uint16_t)bits; }
static inline LOOM_HOST_DEVICE uint32_t loom_split_join(uint16_t high, uint16_t low) {
    return (uint32_t)(uint16_t)(high - (low >> 15)) << 16 | low;
}
// The low half that, joined with the high half `high`, comes nearest to bits: bits' own low half
// where high is loom_split_high(bits), else the nearer end of what high reaches (high - 1/2 to
// high + 1/2 bf16 ulps: a value whose bf16 was rounded otherwise, e.g. ties to even).
static inline uint16_t loom_split_low_near(uint16_t high, uint32_t bits) {
    int64_t d = (int64_t)bits - ((int64_t)high << 16);
    return d > 0x7fff ? 0x7fff : d < -0x8000 ? 0x8000 : (uint16_t)bits;
}
