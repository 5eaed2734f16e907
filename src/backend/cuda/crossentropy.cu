// Fused softmax + cross-entropy over the first V of Vp columns (as llm.c's fused classifier),
// never storing the probabilities. One block per row, 16-byte vectors along it (vec.cuh):
//   pass 1: each thread keeps an online (max m, sum s of exp(x - m)) over its columns (Milakov &
//           Gimelshein 2018), rescaled once per vector; the block combines them: loss = (m - logits[target]) + log s
//   pass 2 (backward): logits[j] = dloss * (exp((logits[j] - m) - log s) - [j == target]) on [0,V),
//           0 on [V,Vp), in place: each element is read and written by one thread, and
//           logits[target] is read before the block-wide barrier that precedes any write.
// logits (N,Vp) be->dtype, losses (N) fp32, targets (N) int32; a target outside [0,V) gives a
// NaN loss (and NaN gradients) rather than a read out of bounds. Keeping m and log s apart
// (rather than lse = m + log s) keeps exp's argument exact to fp32 rounding for large logits.
#include "backend/cuda/vec.cuh"

#include <math.h>

#define CE_THREADS 512
#define CE_COPY 4               // 16-byte loads in flight per thread while a row is cached
#define CE_SMEM_MAX (100 << 10) // largest cached row, bytes: two rows an SM (gpt2's: 98 KB bf16)

// exp(x) for x <= 0 as exp2(x log2 e): the hardware's ex2 (2 ulp) after one rounding of the
// argument (x is a difference from the row's max, close to exact), a few instructions where expf takes
// about twenty: at two exponentials per logit the kernel was bound by instruction issue
__device__ __forceinline__ float ce_exp(float x) { return exp2f(x * 1.4426950408889634f); }

// combine two (max, sum of exp(x - max)) pairs
__device__ __forceinline__ void lse_combine(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2, s = s2;
        return;
    }
    float mx = fmaxf(m, m2);
    s = s * ce_exp(m - mx) + s2 * ce_exp(m2 - mx);
    m = mx;
}

// CACHED (16-byte vectors only): the block first copies the row's vectors below V to shared
// memory (dynamic, whole vectors), CE_COPY loads in flight a thread, and both passes read them
// there; otherwise both passes read the row from logits.
template <typename T, int W, bool CACHED>
__global__ void crossentropy_kernel(float *losses, T *logits, const int32_t *targets, int64_t Vp,
                                    int V, float dloss, bool backward) {
    __shared__ float sm[CE_THREADS / 32], ss[CE_THREADS / 32];
    extern __shared__ uint4 ce_row[];
    int64_t row = blockIdx.x;
    T *z = logits + row * Vp;
    const T *src = z;
    if constexpr (CACHED) {
        constexpr int STEP = CE_THREADS * W;
        for (int j0 = threadIdx.x * W; j0 < V; j0 += CE_COPY * STEP) {
            uint4 r[CE_COPY];
#pragma unroll
            for (int u = 0; u < CE_COPY; u++)
                if (j0 + u * STEP < V) r[u] = *(const uint4 *)(z + j0 + u * STEP);
#pragma unroll
            for (int u = 0; u < CE_COPY; u++)
                if (j0 + u * STEP < V) ce_row[(j0 + u * STEP) / W] = r[u];
        }
        __syncthreads();
        src = (const T *)ce_row;
    }
    int tgt = targets[row];
    bool valid = tgt >= 0 && tgt < V;
    float zt = valid ? to_f32(src[tgt]) : NAN;
    float m = -INFINITY, s = 0.0f, x[W];
    for (int j0 = threadIdx.x * W; j0 < V; j0 += CE_THREADS * W) {
        vload<T, W>(x, src + j0); // j0 + W <= Vp: Vp is a multiple of W
        int n = V - j0 < W ? V - j0 : W; // the vector's columns below V
        float vm = -INFINITY;
#pragma unroll
        for (int k = 0; k < W; k++)
            if (k < n) vm = fmaxf(vm, x[k]);
        if (vm > m) { // rescale once per vector, not per element
            s *= ce_exp(m - vm);
            m = vm;
        }
#pragma unroll
        for (int k = 0; k < W; k++)
            if (k < n) s += ce_exp(x[k] - m);
    }
    for (int o = 16; o > 0; o >>= 1)
        lse_combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sm[warp] = m, ss[warp] = s;
    __syncthreads(); // also orders every read of z above before the writes below
    m = -INFINITY, s = 0.0f;
    for (int w = 0; w < CE_THREADS / 32; w++) lse_combine(m, s, sm[w], ss[w]);
    float logs = logf(s); // lse = m + logs, kept in two parts: x - m is exact near the max
    if (threadIdx.x == 0) losses[row] = valid ? (m - zt) + logs : NAN;
    if (!backward) return;
    for (int j0 = threadIdx.x * W; j0 < Vp; j0 += CE_THREADS * W) {
        if (j0 < V) vload<T, W>(x, src + j0); // past V only zeros are written
#pragma unroll
        for (int k = 0; k < W; k++) {
            int j = j0 + k;
            x[k] = j >= V ? 0.0f : valid ? dloss * (ce_exp((x[k] - m) - logs) - (j == tgt ? 1.0f : 0.0f)) : NAN;
        }
        vstore<T, W>(z + j0, x);
    }
}

extern "C" void cuda_softmax_crossentropy(loom_backend *be, loom_tensor losses, loom_tensor logits,
                                          loom_tensor targets, int V, float dloss, bool backward) {
    bool bf = cuda_act(be, logits);
    int64_t N = loom_rows(&logits), Vp = loom_cols(&logits);
    LOOM_CHECK(V > 0 && V <= Vp && loom_numel(&losses) == N && loom_numel(&targets) == N);
    if (!N) return;
    bool vec = cuda_vec_ok(bf, Vp, logits.data);
    size_t row_bytes = (size_t)(V + 7) / 8 * 8 * loom_dtype_size(be->dtype); // whole 16-byte vectors
    CUDA_DISPATCH(bf, vec, {
        auto kernel = crossentropy_kernel<T, W, false>;
        size_t smem = 0;
        if (W * sizeof(T) == 16 && row_bytes <= CE_SMEM_MAX) {
            kernel = crossentropy_kernel<T, W, W * sizeof(T) == 16>;
            smem = row_bytes;
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        }
        kernel<<<(unsigned)N, CE_THREADS, smem, cuda_of(be)->stream>>>(
            cuda_f32(losses), (T *)logits.data, cuda_i32(targets), Vp, V, dloss, backward);
        CUDA_LAUNCH_CHECK();
    });
}
