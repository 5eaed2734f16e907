// Vectorisable expf and tanhf for the CPU kernels. libm's expf/tanhf are not vectorised
// without -ffast-math, and softmax, cross-entropy and GELU spend their time in them.
// expf: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, and the Cephes expf
// polynomial for e^r (relative error about 1 ulp); 2^n is built in the exponent bits.
// Inputs are clamped to [-87.3, 88.3], so exp never returns 0 or inf (callers that need
// an exact 0, such as a causal mask, write it themselves); NaN propagates. The clamp maps NaN
// into the range too (comparisons with NaN are false), so the integer conversion and the shift
// that build 2^n only ever see a small n: NaN reaches them as no undefined behaviour, and is
// put back in the result.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float cpu_expf(float in) {
    float x = in > -87.3f ? in : -87.3f; // NaN -> -87.3
    x = x < 88.3f ? x : 88.3f;
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; // round(x / ln2)
    float r = fmaf(-n, 0.693359375f, x); // ln2 split in two parts
    r = fmaf(-n, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23; // n in [-126, 127]: a biased exponent of 1..254
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return in == in ? p * scale : in;
}

// tanh(x) = 1 - 2 / (e^{2x} + 1): absolute error about 1e-7, saturates to +-1 exactly.
static inline float cpu_tanhf(float x) { return 1.0f - 2.0f / (cpu_expf(2.0f * x) + 1.0f); }
