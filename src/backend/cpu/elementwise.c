// Elementwise ops: GELU with the tanh approximation (Hendrycks & Gimpel 2016; forward and
// backward as llm.c's gelu_forward/gelu_backward) and the residual add.
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/cpu_ops.h"

#define GELU_S 0.7978845608028654f // sqrt(2/pi)
#define GELU_K 0.044715f

void cpu_gelu_forward(loom_backend *be, loom_tensor out, loom_tensor inp) {
    float *restrict o = cpu_f32(out);
    const float *restrict x = cpu_f32(inp);
    int64_t n = loom_numel(&inp);
    LOOM_CHECK(loom_numel(&out) == n);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        o[i] = 0.5f * xi * (1.0f + cpu_tanhf(GELU_S * (xi + GELU_K * xi * xi * xi)));
    }
}

// dinp may alias dout: each element is read before it is written
void cpu_gelu_backward(loom_backend *be, loom_tensor dinp, loom_tensor inp, loom_tensor dout) {
    float *dx = cpu_f32(dinp);
    const float *x = cpu_f32(inp), *dy = cpu_f32(dout);
    int64_t n = loom_numel(&inp);
    LOOM_CHECK(loom_numel(&dinp) == n && loom_numel(&dout) == n);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i], th = cpu_tanhf(GELU_S * (xi + GELU_K * xi * xi * xi));
        float sech2 = 1.0f - th * th;
        float grad =
            0.5f * (1.0f + th) + 0.5f * xi * sech2 * GELU_S * (1.0f + 3.0f * GELU_K * xi * xi);
        dx[i] = grad * dy[i];
    }
}

// out may alias a or b
void cpu_residual_forward(loom_backend *be, loom_tensor out, loom_tensor a, loom_tensor b) {
    float *o = cpu_f32(out);
    const float *ap = cpu_f32(a), *bp = cpu_f32(b);
    int64_t n = loom_numel(&out);
    LOOM_CHECK(loom_numel(&a) == n && loom_numel(&b) == n);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = ap[i] + bp[i];
}
