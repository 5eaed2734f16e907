// Fused softmax + cross-entropy over the first V of Vp columns (as llm.c's fused classifier),
// never storing the probabilities. One block per row, 16-byte vectors along it (vec.cuh):
//   pass 1: each thread keeps an online (max m, sum s of exp(x - m)) over its columns (Milakov &
//           Gimelshein 2018), the block combines them: loss = (m - logits[target]) + log s
//   pass 2 (backward): logits[j] = dloss * (exp((logits[j] - m) - log s) - [j == target]) on [0,V),
//           0 on [V,Vp), in place: each element is read and written by one thread, and
//           logits[target] is read before the block-wide barrier that precedes any write.
// logits (N,Vp) be->dtype, losses (N) fp32, targets (N) int32; a target outside [0,V) gives a
// NaN loss (and NaN gradients) rather than a read out of bounds. Keeping m and log s apart
// (rather than lse = m + log s) keeps exp's argument exact to fp32 rounding for large logits.
#include "backend/cuda/vec.cuh"

#include <math.h>

#define CE_THREADS 512

// combine two (max, sum of exp(x - max)) pairs
__device__ __forceinline__ void lse_combine(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2, s = s2;
        return;
    }
    float mx = fmaxf(m, m2);
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}

template <typename T, int W>
__global__ void crossentropy_kernel(float *losses, T *logits, const int32_t *targets, int64_t Vp,
                                    int V, float dloss, bool backward) {
    __shared__ float sm[CE_THREADS / 32], ss[CE_THREADS / 32];
    int64_t row = blockIdx.x;
    T *z = logits + row * Vp;
    int tgt = targets[row];
    bool valid = tgt >= 0 && tgt < V;
    float zt = valid ? to_f32(z[tgt]) : NAN;
    float m = -INFINITY, s = 0.0f, x[W];
    for (int j0 = threadIdx.x * W; j0 < V; j0 += CE_THREADS * W) {
        vload<T, W>(x, z + j0); // j0 + W <= Vp: Vp is a multiple of W
#pragma unroll
        for (int k = 0; k < W; k++) {
            if (j0 + k >= V) break;
            if (x[k] > m) {
                s = s * expf(m - x[k]) + 1.0f;
                m = x[k];
            } else {
                s += expf(x[k] - m);
            }
        }
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
        vload<T, W>(x, z + j0);
#pragma unroll
        for (int k = 0; k < W; k++) {
            int j = j0 + k;
            x[k] = j >= V ? 0.0f : valid ? dloss * (expf((x[k] - m) - logs) - (j == tgt ? 1.0f : 0.0f)) : NAN;
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
    CUDA_DISPATCH(bf, vec, {
        crossentropy_kernel<T, W><<<(unsigned)N, CE_THREADS, 0, cuda_of(be)->stream>>>(
            cuda_f32(losses), (T *)logits.data, cuda_i32(targets), Vp, V, dloss, backward);
        CUDA_LAUNCH_CHECK();
    });
}
