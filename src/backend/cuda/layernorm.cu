// LayerNorm over the last dim (Ba et al. 2016), eps 1e-5 as GPT-2, with the formulas of the CPU
// reference (cpu/layernorm.c, after llm.c's layernorm_forward/backward):
//   forward:  mean = sum(x)/C; rstd = 1/sqrt(sum((x-mean)^2)/C + eps); out = (x-mean)*rstd*w + b
//   backward: n = (x-mean)*rstd, g = w*dout:
//             dinp += (g - mean(g) - n*mean(g*n)) * rstd;  dw += sum_rows n*dout;  db += sum_rows dout
// One warp per row, 16-byte vectors along it (vec.cuh); the row stays in L1 between the passes.
// residual_layernorm_forward is the forward kernel with the residual add in its first pass.
// The backward is one kernel: a block per fixed row chunk (cuda_row_chunk), whose warps take its
// rows in turn and keep their own dw/db sums in shared memory (a lane always owns the same
// columns, so no atomics); the block adds its warps' sums in warp order into a per-chunk partial,
// and cuda_add_partials2 adds the chunks in order (dw and db in one launch). Everything depends
// only on N and C, so the results repeat bit for bit.
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/vec.cuh"

typedef __nv_bfloat16 bf16;

#define LN_EPS 1e-5f
#define LN_ROWS_PER_BLOCK 8          // forward: warps per block, one row each
#define LN_BWD_WARPS 16              // backward: warps per block at most
#define LN_BWD_SMEM_MAX (200 << 10)  // bytes of shared memory per backward block at most

// Row `row` of out (N,C), mean (N), rstd (N) from x (N,C), w (C), b (C), by one warp; each vector
// of W outputs goes to sink(c, v) as well once stored (v as computed, before rounding to T; the
// sink may overwrite it).
// With RES, x is first written as ra + rb (rounded to T, as the plain residual add stores it; x
// may alias ra or rb: each lane reads back only what it wrote).
template <typename T, int W, bool RES, typename Sink>
__device__ __forceinline__ void layernorm_row(T *out, float *mean, float *rstd, T *x, const T *ra, const T *rb,
                                              const T *w, const T *b, int64_t row, int C, Sink sink) {
    int lane = threadIdx.x % 32;
    x += row * C;
    float s = 0.0f, v[W];
    for (int c = lane * W; c < C; c += 32 * W) {
        if constexpr (RES) {
            float u[W];
            vload<T, W>(v, ra + row * C + c);
            vload<T, W>(u, rb + row * C + c);
#pragma unroll
            for (int k = 0; k < W; k++) v[k] = to_f32(from_f32<T>(v[k] + u[k]));
            vstore<T, W>(x + c, v);
        } else {
            vload<T, W>(v, x + c);
        }
#pragma unroll
        for (int k = 0; k < W; k++) s += v[k];
    }
    float m = warp_sum(s) / (float)C, var = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        vload<T, W>(v, x + c);
#pragma unroll
        for (int k = 0; k < W; k++) var += (v[k] - m) * (v[k] - m);
    }
    float r = 1.0f / sqrtf(warp_sum(var) / (float)C + LN_EPS);
    for (int c = lane * W; c < C; c += 32 * W) {
        float wv[W], bv[W];
        vload<T, W>(v, x + c);
        vload<T, W>(wv, w + c);
        vload<T, W>(bv, b + c);
#pragma unroll
        for (int k = 0; k < W; k++) v[k] = (v[k] - m) * r * wv[k] + bv[k];
        vstore<T, W>(out + row * C + c, v);
        sink(c, v);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// layernorm_row for each row, one warp a row
template <typename T, int W, bool RES>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, T *x, const T *ra, const T *rb,
                                         const T *w, const T *b, int64_t N, int C) {
    int64_t row = (int64_t)blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row < N) layernorm_row<T, W, RES>(out, mean, rstd, x, ra, rb, w, b, row, C, [](int, float *) {});
}

// The same in bf16 vectors with the output's E4M3 copy rows8 (N,C) (cuda_fp8_ln_out): fp8(y s)
// of each bf16 output y, as fp8.cu's casts convert it, s = *scale, and *record raised to the
// largest |y|. 6 blocks an SM (40 registers; 44 unbounded would leave 5).
template <bool RES>
__global__ void __launch_bounds__(32 * LN_ROWS_PER_BLOCK, 6)
    layernorm_fp8_kernel(bf16 *out, float *mean, float *rstd, bf16 *x, const bf16 *ra, const bf16 *rb, const bf16 *w,
                         const bf16 *b, int64_t N, int C, uint8_t *rows8, const float *scale, unsigned *record) {
    int64_t row = (int64_t)blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / 32;
    float s = *scale, amax = 0.0f;
    uint8_t *r8 = rows8 + row * C;
    if (row < N)
        layernorm_row<bf16, FP8_VEC, RES>(out, mean, rstd, x, ra, rb, w, b, row, C, [&](int c, float *v) {
#pragma unroll
            for (int k = 0; k < FP8_VEC; k++) v[k] = to_f32(from_f32<bf16>(v[k])), amax = fmaxf(amax, fabsf(v[k]));
            *(uint2 *)(r8 + c) = fp8_pack(v, s, __NV_E4M3);
        });
    record_max<32 * LN_ROWS_PER_BLOCK>(amax, record); // every thread: the rows past N with 0
}

// dinp (N,C) += the row-local part; partials (nchunks, 2C) fp32: [chunk, c] = sum over the
// chunk's rows of n*dout, [chunk, C + c] = sum of dout. One block per chunk of `chunk` rows;
// shared memory: per warp 2C floats, element k of vector j of a row at [k * C/W + j] (so the
// lanes of a warp hit consecutive words), db after dw.
template <typename T, int W>
__global__ void layernorm_backward_kernel(T *dinp, float *partials, const T *dout, const T *inp,
                                          const T *w, const float *mean, const float *rstd,
                                          int64_t N, int C, int64_t chunk) {
    extern __shared__ float ln_smem[];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32, nv = C / W;
    float *acc = ln_smem + (int64_t)warp * 2 * C;
    for (int c = lane; c < 2 * C; c += 32) acc[c] = 0.0f;
    __syncwarp();
    int64_t r0 = (int64_t)blockIdx.x * chunk, r1 = r0 + chunk < N ? r0 + chunk : N;
    for (int64_t row = r0 + warp; row < r1; row += warps) {
        const T *dy = dout + row * C, *x = inp + row * C;
        T *dx = dinp + row * C;
        float m = mean[row], r = rstd[row], gsum = 0.0f, gnsum = 0.0f, d[W], xv[W], wv[W];
        for (int c = lane * W; c < C; c += 32 * W) {
            // dx is read in the second loop only: fetch it into L1 now, in the same round trip
            asm volatile("prefetch.global.L1 [%0];" ::"l"(dx + c));
            vload<T, W>(d, dy + c);
            vload<T, W>(xv, x + c);
            vload<T, W>(wv, w + c);
#pragma unroll
            for (int k = 0; k < W; k++) {
                float g = wv[k] * d[k];
                gsum += g;
                gnsum += g * (xv[k] - m) * r;
            }
        }
        float gmean = warp_sum(gsum) / (float)C, gnmean = warp_sum(gnsum) / (float)C;
        for (int c = lane * W, j = lane; c < C; c += 32 * W, j += 32) {
            float di[W];
            vload<T, W>(d, dy + c);
            vload<T, W>(xv, x + c);
            vload<T, W>(wv, w + c);
            vload<T, W>(di, dx + c);
#pragma unroll
            for (int k = 0; k < W; k++) {
                float n = (xv[k] - m) * r;
                di[k] += (wv[k] * d[k] - gmean - n * gnmean) * r;
                acc[k * nv + j] += n * d[k];
                acc[C + k * nv + j] += d[k];
            }
            vstore<T, W>(dx + c, di);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
        int cc = c % C, at = (c / C) * C + (cc % W) * nv + cc / W;
        float s = 0.0f;
        for (int wi = 0; wi < warps; wi++) s += ln_smem[(int64_t)wi * 2 * C + at];
        partials[(int64_t)blockIdx.x * 2 * C + c] = s;
    }
}

// res = a + b first when a.data (residual_layernorm_forward), then the LayerNorm of res
static void layernorm_forward(loom_backend *be, loom_tensor res, loom_tensor out, loom_tensor mean,
                              loom_tensor rstd, loom_tensor a, loom_tensor b, loom_tensor w,
                              loom_tensor bias) {
    bool bf = cuda_act(be, res), fused = a.data != NULL;
    int64_t N = loom_rows(&res), C = loom_cols(&res);
    LOOM_CHECK(cuda_act(be, out) == bf && cuda_act(be, w) == bf && cuda_act(be, bias) == bf);
    LOOM_CHECK(loom_rows(&out) == N && loom_cols(&out) == C && loom_numel(&w) == C &&
               loom_numel(&bias) == C && loom_numel(&mean) == N && loom_numel(&rstd) == N);
    if (fused)
        LOOM_CHECK(cuda_act(be, a) == bf && cuda_act(be, b) == bf && loom_numel(&a) == N * C &&
                   loom_numel(&b) == N * C);
    if (!N) return;
    bool vec = cuda_vec_ok(bf, C, out.data, res.data, w.data, bias.data, fused ? a.data : NULL) &&
               cuda_vec_ok(bf, C, fused ? b.data : NULL);
    loom_cuda *cu = cuda_of(be);
    cuda_fp8_ln_out f = cuda_fp8_kept_begin(cu, out.data, N, C, bf && vec && C % 16 == 0);
    unsigned blocks = (unsigned)((N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
    if (f.rows) {
        auto kernel = fused ? layernorm_fp8_kernel<true> : layernorm_fp8_kernel<false>;
        kernel<<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, cu->stream>>>(
            (bf16 *)out.data, cuda_f32(mean), cuda_f32(rstd), (bf16 *)res.data, (const bf16 *)a.data,
            (const bf16 *)b.data, (const bf16 *)w.data, (const bf16 *)bias.data, N, (int)C, f.rows, f.scale, f.record);
        CUDA_LAUNCH_CHECK();
        return;
    }
    CUDA_DISPATCH(bf, vec, {
        auto kernel = fused ? layernorm_forward_kernel<T, W, true> : layernorm_forward_kernel<T, W, false>;
        kernel<<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, cu->stream>>>(
            (T *)out.data, cuda_f32(mean), cuda_f32(rstd), (T *)res.data, (const T *)a.data,
            (const T *)b.data, (const T *)w.data, (const T *)bias.data, N, (int)C);
        CUDA_LAUNCH_CHECK();
    });
}

extern "C" void cuda_layernorm_forward(loom_backend *be, loom_tensor out, loom_tensor mean,
                                       loom_tensor rstd, loom_tensor inp, loom_tensor w,
                                       loom_tensor b) {
    loom_tensor none = {};
    layernorm_forward(be, inp, out, mean, rstd, none, none, w, b);
}

extern "C" void cuda_residual_layernorm_forward(loom_backend *be, loom_tensor res, loom_tensor out,
                                                loom_tensor mean, loom_tensor rstd, loom_tensor a,
                                                loom_tensor b, loom_tensor w, loom_tensor bias) {
    LOOM_CHECK(a.data && b.data);
    layernorm_forward(be, res, out, mean, rstd, a, b, w, bias);
}

extern "C" void cuda_layernorm_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw,
                                        loom_tensor db, loom_tensor dout, loom_tensor inp,
                                        loom_tensor w, loom_tensor mean, loom_tensor rstd) {
    loom_cuda *cu = cuda_of(be);
    bool bf = cuda_act(be, inp);
    int64_t N = loom_rows(&inp), C = loom_cols(&inp);
    LOOM_CHECK(cuda_act(be, dinp) == bf && cuda_act(be, dw) == bf && cuda_act(be, db) == bf &&
               cuda_act(be, dout) == bf && cuda_act(be, w) == bf);
    LOOM_CHECK(loom_rows(&dinp) == N && loom_cols(&dinp) == C && loom_rows(&dout) == N &&
               loom_cols(&dout) == C && loom_numel(&w) == C && loom_numel(&dw) == C &&
               loom_numel(&db) == C && loom_numel(&mean) == N && loom_numel(&rstd) == N);
    if (!N) return;
    int warps = LN_BWD_WARPS;
    while (warps > 1 && (size_t)warps * 2 * C * sizeof(float) > LN_BWD_SMEM_MAX) warps /= 2;
    size_t smem = (size_t)warps * 2 * C * sizeof(float);
    LOOM_CHECK(smem <= LN_BWD_SMEM_MAX); // C up to 25600
    int64_t chunk = cuda_row_chunk(N), nchunks = (N + chunk - 1) / chunk;
    float *part = (float *)cuda_scratch(cu, (size_t)(nchunks * 2 * C) * sizeof(float));
    bool vec = cuda_vec_ok(bf, C, dinp.data, dout.data, inp.data, w.data);
    CUDA_DISPATCH(bf, vec, {
        if (smem > (48 << 10))
            CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<T, W>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        layernorm_backward_kernel<T, W><<<(unsigned)nchunks, 32 * warps, smem, cu->stream>>>(
            (T *)dinp.data, part, (const T *)dout.data, (const T *)inp.data, (const T *)w.data,
            cuda_f32(mean), cuda_f32(rstd), N, (int)C, chunk);
        CUDA_LAUNCH_CHECK();
    });
    cuda_add_partials2(cu, dw.data, db.data, C, bf, part, false, nchunks, 2 * C, 2 * C); // dw, then db
}
