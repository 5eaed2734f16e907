// GELU with the tanh approximation (Hendrycks & Gimpel 2016) and its derivative in fp32, as
// llm.c's gelu_forward/gelu_backward: the elementwise ops (elementwise.cu) and the FP8 casts that
// apply the GELU or its backward as they read (fp8.cu) compute the same values.
#pragma once

#define GELU_S 0.7978845608028654f // sqrt(2/pi)
#define GELU_K 0.044715f

// gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
__device__ __forceinline__ float gelu_of(float x) {
    return 0.5f * x * (1.0f + tanhf(GELU_S * (x + GELU_K * x * x * x)));
}

// gelu'(x)
__device__ __forceinline__ float gelu_grad(float x) {
    float th = tanhf(GELU_S * (x + GELU_K * x * x * x)), sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_S * (1.0f + 3.0f * GELU_K * x * x);
}
