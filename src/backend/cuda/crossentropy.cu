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
// The vocabulary-parallel ops (Megatron-LM, Shoeybi et al. 2019) reuse the two passes over a
// shard's valid columns: crossentropy_partial is pass 1 (writing the row's (m, s, target
// logit)), crossentropy_combine merges the shards' triples one thread a row in shard order, and
// crossentropy_backward is pass 2 given the combined lse (a single fp32 here, as the contract
// has it). A target outside [0,V) gives NaN there too. No atomics: every result repeats.
#include "backend/cuda/hopper.cuh"
#include "backend/cuda/vec.cuh"

#include <math.h>

#define CE_THREADS 512
#define CE_SMEM_MAX (100 << 10) // largest cached row, bytes: two rows an SM (gpt2's: 98 KB bf16)

#define CE_LOG2E 1.4426950408889634f
// 2^x by the hardware's ex2 (2 ulp), results below 2^-126 flushed to 0 (exp2f keeps them, in four
// instructions where this is one): at two exponentials a logit the kernel is bound by instruction
// issue, not by memory (an H200 moved 2.9 of its 4.8 TB/s)
__device__ __forceinline__ float ce_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// exp(x) for x <= 0 as 2^(x log2 e), after one rounding of the argument (x is a difference from
// the row's max, close to exact)
__device__ __forceinline__ float ce_exp(float x) { return ce_exp2(x * CE_LOG2E); }

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

// One vector x of n valid values (n <= W; WHOLE: n = W, without the per-element bound) into a
// thread's online (m, s): rescaled once per vector, not per element
template <int W, bool WHOLE>
__device__ __forceinline__ void vector_max_sumexp(float &m, float &s, const float (&x)[W], int n) {
    float vm = -INFINITY;
#pragma unroll
    for (int k = 0; k < W; k++)
        if (WHOLE || k < n) vm = fmaxf(vm, x[k]);
    if (vm > m) {
        s *= ce_exp(m - vm);
        m = vm;
    }
#pragma unroll
    for (int k = 0; k < W; k++)
        if (WHOLE || k < n) s += ce_exp(x[k] - m);
}
template <int W> __device__ __forceinline__ void thread_max_sumexp(float &m, float &s, const float (&x)[W], int n) {
    if (n == W) vector_max_sumexp<W, true>(m, s, x, n);
    else vector_max_sumexp<W, false>(m, s, x, n);
}

// The threads' (m, s) pairs combined over the block, every thread getting the result. Ends past a
// block-wide barrier.
__device__ __forceinline__ void block_combine(float &m, float &s) {
    __shared__ float sm[CE_THREADS / 32], ss[CE_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1)
        lse_combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sm[warp] = m, ss[warp] = s;
    __syncthreads();
    m = -INFINITY, s = 0.0f;
    for (int w = 0; w < CE_THREADS / 32; w++) lse_combine(m, s, sm[w], ss[w]);
}

// (m, s) = (max of src[0, V), sum of exp(src[j] - m)) over the block, every thread getting them
// ((-INFINITY, 0) when V is 0): each thread keeps an online pair over its vectors (W-vectors j0 =
// its index W + k CE_THREADS W, in order), then the warps' and the block's pairs are combined.
// src[0, V) is read in W-vectors (V rounded up to W must be readable). Ends past a block-wide
// barrier, so every read of src comes before any write the caller makes after it.
template <typename T, int W>
__device__ __forceinline__ void block_max_sumexp(const T *src, int V, float &m, float &s) {
    float x[W];
    m = -INFINITY, s = 0.0f;
    for (int j0 = threadIdx.x * W; j0 < V; j0 += CE_THREADS * W) {
        vload<T, W>(x, src + j0);
        thread_max_sumexp<W>(m, s, x, V - j0 < W ? V - j0 : W);
    }
    block_combine(m, s);
}

// The gradient pass over one row, in place: z[j] = dloss * (exp((src[j] - m) - logs) - [j == tgt])
// on [0,V) (NaN when !valid), 0 on [V,Vp); src is z or a copy of it. Each element is read and
// written by one thread. The exponent is one FMA, 2^((x - m) log2 e - logs log2 e); a vector
// wholly below V without the target takes no per-element test.
template <typename T, int W>
__device__ __forceinline__ void block_backward(T *z, const T *src, int64_t Vp, int V, int tgt,
                                               bool valid, float dloss, float m, float logs) {
    float x[W], dl = valid ? dloss : NAN, c = logs * CE_LOG2E;
    auto prob = [&](float v) { return ce_exp2(fmaf(v - m, CE_LOG2E, -c)); }; // exp(v - lse)
    for (int j0 = threadIdx.x * W; j0 < Vp; j0 += CE_THREADS * W) {
        if (j0 + W <= V && (unsigned)(tgt - j0) >= (unsigned)W) {
            vload<T, W>(x, src + j0);
#pragma unroll
            for (int k = 0; k < W; k++) x[k] = dl * prob(x[k]);
        } else { // the vector with the target, or past V
            if (j0 < V) vload<T, W>(x, src + j0); // past V only zeros are written
#pragma unroll
            for (int k = 0; k < W; k++) {
                int j = j0 + k;
                x[k] = j >= V ? 0.0f : dl * (prob(x[k]) - (j == tgt ? 1.0f : 0.0f));
            }
        }
        vstore<T, W>(z + j0, x);
    }
}

// CACHED (16-byte vectors only): the row's vectors below V come into shared memory (dynamic, whole
// vectors) by one bulk copy (TMA), and both passes read them there (3% faster on an H200 than
// 16-byte loads through registers, 4 in flight a thread, and 5-8 were slower); the same vectors in
// the same order either way, so the same bits. Otherwise both passes read the row from logits.
template <typename T, int W, bool CACHED>
__global__ void crossentropy_kernel(float *losses, T *logits, const int32_t *targets, int64_t Vp,
                                    int V, float dloss, bool backward) {
    cuda_pdl_begin();
    extern __shared__ uint4 ce_row[];
    int64_t row = blockIdx.x;
    T *z = logits + row * Vp;
    const T *src = z;
    int tgt = targets[row];
    bool valid = tgt >= 0 && tgt < V;
    float m, s, zt;
    if constexpr (CACHED) { // the row into shared memory
        __shared__ uint64_t landed; // the copy's transaction barrier
        if (threadIdx.x == 0) {
            uint32_t bytes = (uint32_t)((V + W - 1) / W * 16);
            mbar_init(&landed, 1);
            mbar_fence_init();
            mbar_expect(&landed, bytes);
            bulk_load(ce_row, z, bytes, &landed);
        }
        __syncthreads(); // the barrier set up
        mbar_wait(&landed, 0); // the copy has read all of z it reads
        src = (const T *)ce_row;
    }
    zt = valid ? to_f32(src[tgt]) : NAN;
    block_max_sumexp<T, W>(src, V, m, s); // its barrier orders every read of z before the writes below
    float logs = logf(s); // lse = m + logs, kept in two parts: x - m is exact near the max
    if (threadIdx.x == 0) losses[row] = valid ? (m - zt) + logs : NAN;
    if (backward) block_backward<T, W>(z, src, Vp, V, tgt, valid, dloss, m, logs);
}

// ---- vocabulary-parallel: one block per row of a shard of Vl columns from vocab_start, whose
// first n (= clamp(V - vocab_start, 0, Vl)) columns are valid ----

// partial[row] = (m, s, the target's logit or 0) over the valid columns
template <typename T, int W>
__global__ void crossentropy_partial_kernel(float *partial, const T *logits, const int32_t *targets,
                                            int64_t Vl, int vocab_start, int V, int n) {
    cuda_pdl_begin();
    int64_t row = blockIdx.x;
    const T *z = logits + row * Vl;
    float m, s;
    block_max_sumexp<T, W>(z, n, m, s);
    if (threadIdx.x == 0) {
        int tgt = targets[row], j = cuda_shard_index(tgt, vocab_start, Vl);
        float *p = partial + row * 3;
        p[0] = m, p[1] = s;
        p[2] = tgt < 0 || tgt >= V ? NAN : j >= 0 ? to_f32(z[j]) : 0.0f;
    }
}

// one thread a row: the shards' partials (R,N,3) merged in shard order
__global__ void crossentropy_combine_kernel(float *losses, float *lse, const float *partials,
                                            int64_t N, int R) {
    cuda_pdl_begin();
    GRID_STRIDE(i, N) {
        float M = -INFINITY, S = 0.0f, zt = 0.0f;
        for (int r = 0; r < R; r++) M = fmaxf(M, partials[(r * N + i) * 3]);
        for (int r = 0; r < R; r++) {
            const float *q = partials + (r * N + i) * 3;
            if (q[1] != 0.0f) S += q[1] * expf(q[0] - M);
            zt += q[2];
        }
        float l = M + logf(S);
        lse[i] = l;
        losses[i] = l - zt;
    }
}

// dlogits in place from the combined lse, one block per row
template <typename T, int W>
__global__ void crossentropy_backward_kernel(T *logits, const float *lse, const int32_t *targets,
                                             int64_t Vl, int vocab_start, int V, int n, float dloss) {
    cuda_pdl_begin();
    int64_t row = blockIdx.x;
    T *z = logits + row * Vl;
    int tgt = targets[row];
    block_backward<T, W>(z, z, Vl, n, tgt - vocab_start, tgt >= 0 && tgt < V, dloss, lse[row], 0.0f);
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
        cuda_launch(cuda_of(be)->stream, kernel, (unsigned)N, CE_THREADS, smem, cuda_f32(losses), (T *)logits.data,
                    cuda_i32(targets), Vp, V, dloss, backward);
    });
}

// Checks a shard's arguments and returns its valid columns, clamp(V - vocab_start, 0, Vl).
static int shard_valid(loom_backend *be, loom_tensor logits, loom_tensor targets, int vocab_start, int V) {
    cuda_act(be, logits);
    cuda_i32(targets);
    int64_t N = loom_rows(&logits), Vl = loom_cols(&logits);
    LOOM_CHECK(V > 0 && vocab_start >= 0 && loom_numel(&targets) == N);
    int64_t n = V > vocab_start ? (int64_t)V - vocab_start : 0;
    return (int)(n < Vl ? n : Vl);
}

extern "C" void cuda_crossentropy_partial(loom_backend *be, loom_tensor partial, loom_tensor logits,
                                          loom_tensor targets, int vocab_start, int V) {
    bool bf = cuda_act(be, logits);
    int64_t N = loom_rows(&logits), Vl = loom_cols(&logits);
    int n = shard_valid(be, logits, targets, vocab_start, V);
    LOOM_CHECK(loom_cols(&partial) == 3 && loom_rows(&partial) == N);
    if (!N) return;
    CUDA_DISPATCH(bf, cuda_vec_ok(bf, Vl, logits.data), {
        cuda_launch(cuda_of(be)->stream, crossentropy_partial_kernel<T, W>, (unsigned)N, CE_THREADS, 0,
                    cuda_f32(partial), (const T *)logits.data, cuda_i32(targets), Vl, vocab_start, V, n);
    });
}

extern "C" void cuda_crossentropy_combine(loom_backend *be, loom_tensor losses, loom_tensor lse,
                                          loom_tensor partials) {
    int64_t N = loom_numel(&losses);
    LOOM_CHECK(partials.ndim == 3 && partials.shape[1] == N && partials.shape[2] == 3 &&
               loom_numel(&lse) == N);
    if (!N) return;
    cuda_launch(cuda_of(be)->stream, crossentropy_combine_kernel, cuda_blocks(N, 256), 256, 0, cuda_f32(losses),
                cuda_f32(lse), cuda_f32(partials), N, (int)partials.shape[0]);
}

extern "C" void cuda_crossentropy_backward(loom_backend *be, loom_tensor logits, loom_tensor lse,
                                           loom_tensor targets, int vocab_start, int V, float dloss) {
    bool bf = cuda_act(be, logits);
    int64_t N = loom_rows(&logits), Vl = loom_cols(&logits);
    int n = shard_valid(be, logits, targets, vocab_start, V);
    LOOM_CHECK(loom_numel(&lse) == N);
    if (!N) return;
    CUDA_DISPATCH(bf, cuda_vec_ok(bf, Vl, logits.data), {
        cuda_launch(cuda_of(be)->stream, crossentropy_backward_kernel<T, W>, (unsigned)N, CE_THREADS, 0,
                    (T *)logits.data, cuda_f32(lse), cuda_i32(targets), Vl, vocab_start, V, n, dloss);
    });
}
