// GELU with the tanh approximation (Hendrycks & Gimpel 2016) and its derivative in fp32, the
// functions of llm.c's gelu_forward/gelu_backward, for the elementwise ops (elementwise.cu) and
// the FP8 casts that apply the GELU or its backward as they read (fp8.cu). They are written in the
// logistic form, since 0.5 (1 + tanh(u)) = sigmoid(2u):
//   gelu(x)  = 0.5 x (1 + tanh(u)) = x / (1 + e),  u = sqrt(2/pi) (x + 0.044715 x^3),  e = exp(-2u)
//   gelu'(x) = r + 2 sqrt(2/pi) x r (1 - r) (1 + 3 0.044715 x^2),  r = 1 / (1 + e),  1 - r = e r
// with e one MUFU.EX2 and r one MUFU.RCP: about a third of the instructions of tanhf (its
// polynomial and its branch), which left the FP8 casts that apply them issue-bound (ncu, H200:
// the GELU cast at 83% of its issue slots). Both approximations are good to a few fp32 ulps; e is
// clamped at 2^126, where the values are 0 to fp32's precision (x < -9.5), so it never overflows.
#pragma once

#define GELU_S 0.7978845608028654f            // sqrt(2/pi)
#define GELU_K 0.044715f
#define GELU_T1 (-2.0f * 1.4426950408889634f * GELU_S) // -2 log2(e) sqrt(2/pi): e = 2^(x (T1 + T3 x^2))
#define GELU_T3 (GELU_T1 * GELU_K)

// e = exp(-2u) of x, at most 2^126; r = 1 / (1 + e)
__device__ __forceinline__ float gelu_e(float x) {
    float t = fminf(x * fmaf(GELU_T3, x * x, GELU_T1), 126.0f), e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(t));
    return e;
}
__device__ __forceinline__ float gelu_r(float e) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
    return r;
}

// gelu(x) = x r
__device__ __forceinline__ float gelu_of(float x) { return x * gelu_r(gelu_e(x)); }

// gelu'(x) = r (1 + 2 sqrt(2/pi) x e r (1 + 3 0.044715 x^2))
__device__ __forceinline__ float gelu_grad(float x) {
    float e = gelu_e(x), r = gelu_r(e);
    // x (e r), not (x e) r: e r <= 1, where x e could overflow
    return r * fmaf(x * (e * r), fmaf(6.0f * GELU_S * GELU_K, x * x, 2.0f * GELU_S), 1.0f);
}
