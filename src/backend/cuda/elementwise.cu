// Elementwise ops: GELU with the tanh approximation (Hendrycks & Gimpel 2016; forward and
// backward as llm.c's gelu_forward/gelu_backward) and the residual add. Grid-stride loops over
// 16-byte vectors (vec.cuh: 8 bf16 or 4 fp32 per thread per step, one element at a time when
// the count or an address does not allow it), fp32 arithmetic on be->dtype storage. Each
// vector is read before it is written by the same thread, so the allowed aliasing (dinp =
// dout, out = a or b) is safe.
#include "backend/cuda/gelu.cuh"
#include "backend/cuda/vec.cuh"

#define EW_THREADS 256

// nv = number of W-element vectors
template <typename T, int W>
__global__ void gelu_forward_kernel(T *out, const T *inp, int64_t nv) {
    cuda_pdl_begin();
    GRID_STRIDE(i, nv) {
        float x[W];
        vload<T, W>(x, inp + i * W);
#pragma unroll
        for (int k = 0; k < W; k++) x[k] = gelu_of(x[k]);
        vstore<T, W>(out + i * W, x);
    }
}

template <typename T, int W>
__global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, int64_t nv) {
    cuda_pdl_begin();
    GRID_STRIDE(i, nv) {
        float x[W], d[W];
        vload<T, W>(x, inp + i * W);
        vload<T, W>(d, dout + i * W);
#pragma unroll
        for (int k = 0; k < W; k++) d[k] *= gelu_grad(x[k]);
        vstore<T, W>(dinp + i * W, d);
    }
}

template <typename T, int W>
__global__ void residual_forward_kernel(T *out, const T *a, const T *b, int64_t nv) {
    cuda_pdl_begin();
    GRID_STRIDE(i, nv) {
        float x[W], y[W];
        vload<T, W>(x, a + i * W);
        vload<T, W>(y, b + i * W);
#pragma unroll
        for (int k = 0; k < W; k++) x[k] += y[k];
        vstore<T, W>(out + i * W, x);
    }
}

// n, the element count all three tensors share (checked, as their dtypes), whether they are
// bf16, and whether 16-byte vectors apply
static int64_t ew_numel(const loom_backend *be, bool *bf, bool *vec, loom_tensor x, loom_tensor y,
                        loom_tensor z) {
    int64_t n = loom_numel(&x);
    *bf = cuda_act(be, x);
    LOOM_CHECK(cuda_act(be, y) == *bf && cuda_act(be, z) == *bf);
    LOOM_CHECK(loom_numel(&y) == n && loom_numel(&z) == n);
    *vec = cuda_vec_ok(*bf, n, x.data, y.data, z.data);
    return n;
}

// launches kernel<T, W> over n / W vectors with the arguments cast to T pointers
#define EW_LAUNCH(kernel, n, bf, vec, ...)                                                 \
    CUDA_DISPATCH(bf, vec, {                                                               \
        cuda_launch(cuda_of(be)->stream, kernel<T, W>, cuda_blocks((n) / W, EW_THREADS),   \
                    EW_THREADS, 0, __VA_ARGS__, (n) / W);                                  \
    })

extern "C" void cuda_gelu_forward(loom_backend *be, loom_tensor out, loom_tensor inp) {
    bool bf, vec;
    int64_t n = ew_numel(be, &bf, &vec, out, inp, inp);
    if (n) EW_LAUNCH(gelu_forward_kernel, n, bf, vec, (T *)out.data, (const T *)inp.data);
}

extern "C" void cuda_gelu_backward(loom_backend *be, loom_tensor dinp, loom_tensor inp,
                                   loom_tensor dout) {
    bool bf, vec;
    int64_t n = ew_numel(be, &bf, &vec, dinp, inp, dout);
    if (n) EW_LAUNCH(gelu_backward_kernel, n, bf, vec, (T *)dinp.data, (const T *)inp.data, (const T *)dout.data);
}

extern "C" void cuda_residual_forward(loom_backend *be, loom_tensor out, loom_tensor a,
                                      loom_tensor b) {
    bool bf, vec;
    int64_t n = ew_numel(be, &bf, &vec, out, a, b);
    if (n) EW_LAUNCH(residual_forward_kernel, n, bf, vec, (T *)out.data, (const T *)a.data, (const T *)b.data);
}
