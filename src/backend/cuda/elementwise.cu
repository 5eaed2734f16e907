// Elementwise ops: GELU with the tanh approximation (Hendrycks & Gimpel 2016; forward and
// backward as llm.c's gelu_forward/gelu_backward) and the residual add. Grid-stride loops,
// one element per thread per step, fp32 arithmetic on be->dtype storage. Each element is read
// before it is written by the same thread, so the allowed aliasing (dinp = dout, out = a or b)
// is safe.
#include "backend/cuda/cuda_ops.h"

#define GELU_S 0.7978845608028654f // sqrt(2/pi)
#define GELU_K 0.044715f
#define EW_THREADS 256

__global__ void gelu_forward_kernel(void *out, const void *inp, int64_t n, bool bf) {
    GRID_STRIDE(i, n) {
        float x = ldx(inp, i, bf);
        stx(out, i, 0.5f * x * (1.0f + tanhf(GELU_S * (x + GELU_K * x * x * x))), bf);
    }
}

__global__ void gelu_backward_kernel(void *dinp, const void *inp, const void *dout, int64_t n,
                                     bool bf) {
    GRID_STRIDE(i, n) {
        float x = ldx(inp, i, bf), th = tanhf(GELU_S * (x + GELU_K * x * x * x));
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_S * (1.0f + 3.0f * GELU_K * x * x);
        stx(dinp, i, grad * ldx(dout, i, bf), bf);
    }
}

__global__ void residual_forward_kernel(void *out, const void *a, const void *b, int64_t n, bool bf) {
    GRID_STRIDE(i, n) stx(out, i, ldx(a, i, bf) + ldx(b, i, bf), bf);
}

// n, the element count all three tensors share (checked, as their dtypes), and whether it is bf16
static int64_t ew_numel(const loom_backend *be, bool *bf, loom_tensor x, loom_tensor y, loom_tensor z) {
    int64_t n = loom_numel(&x);
    *bf = cuda_act(be, x);
    LOOM_CHECK(cuda_act(be, y) == *bf && cuda_act(be, z) == *bf);
    LOOM_CHECK(loom_numel(&y) == n && loom_numel(&z) == n);
    return n;
}

#define EW_LAUNCH(kernel, n, ...)                                                          \
    do {                                                                                   \
        kernel<<<cuda_blocks(n, EW_THREADS), EW_THREADS, 0, cuda_of(be)->stream>>>(__VA_ARGS__); \
        CUDA_LAUNCH_CHECK();                                                               \
    } while (0)

extern "C" void cuda_gelu_forward(loom_backend *be, loom_tensor out, loom_tensor inp) {
    bool bf;
    int64_t n = ew_numel(be, &bf, out, inp, inp);
    if (n) EW_LAUNCH(gelu_forward_kernel, n, out.data, inp.data, n, bf);
}

extern "C" void cuda_gelu_backward(loom_backend *be, loom_tensor dinp, loom_tensor inp,
                                   loom_tensor dout) {
    bool bf;
    int64_t n = ew_numel(be, &bf, dinp, inp, dout);
    if (n) EW_LAUNCH(gelu_backward_kernel, n, dinp.data, inp.data, dout.data, n, bf);
}

extern "C" void cuda_residual_forward(loom_backend *be, loom_tensor out, loom_tensor a,
                                      loom_tensor b) {
    bool bf;
    int64_t n = ew_numel(be, &bf, out, a, b);
    if (n) EW_LAUNCH(residual_forward_kernel, n, out.data, a.data, b.data, n, bf);
}
