// LayerNorm over the last dim (Ba et al. 2016), eps 1e-5 as GPT-2, with the formulas of the CPU
// reference (cpu/layernorm.c, after llm.c's layernorm_forward/backward):
//   forward:  mean = sum(x)/C; rstd = 1/sqrt(sum((x-mean)^2)/C + eps); out = (x-mean)*rstd*w + b
//   backward: n = (x-mean)*rstd, g = w*dout:
//             dinp += (g - mean(g) - n*mean(g*n)) * rstd;  dw += sum_rows n*dout;  db += sum_rows dout
// One warp per row for the row-local work (the row stays in L1 between the passes). dw/db sum
// over rows through fixed row chunks and an in-order pass (reduce.cu), so they repeat bit for bit.
#include "backend/cuda/cuda_ops.h"

#define LN_EPS 1e-5f
#define LN_ROWS_PER_BLOCK 8 // warps per block, one row each
#define LN_COL_THREADS 256

// out (N,C), mean (N), rstd (N) from inp (N,C), w (C), b (C)
__global__ void layernorm_forward_kernel(void *out, float *mean, float *rstd, const void *inp,
                                         const void *w, const void *b, int64_t N, int C, bool bf) {
    int64_t row = (int64_t)blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const int64_t off = row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += ldx(inp, off + c, bf);
    float m = warp_sum(s) / (float)C, v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = ldx(inp, off + c, bf) - m;
        v += d * d;
    }
    float r = 1.0f / sqrtf(warp_sum(v) / (float)C + LN_EPS);
    for (int c = lane; c < C; c += 32)
        stx(out, off + c, (ldx(inp, off + c, bf) - m) * r * ldx(w, c, bf) + ldx(b, c, bf), bf);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// dinp (N,C) += the row-local part of the backward
__global__ void layernorm_backward_dinp_kernel(void *dinp, const void *dout, const void *inp,
                                               const void *w, const float *mean, const float *rstd,
                                               int64_t N, int C, bool bf) {
    int64_t row = (int64_t)blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const int64_t off = row * C;
    float m = mean[row], r = rstd[row], gsum = 0.0f, gnsum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float g = ldx(w, c, bf) * ldx(dout, off + c, bf);
        gsum += g;
        gnsum += g * (ldx(inp, off + c, bf) - m) * r;
    }
    float gmean = warp_sum(gsum) / (float)C, gnmean = warp_sum(gnsum) / (float)C;
    for (int c = lane; c < C; c += 32) {
        float nrm = (ldx(inp, off + c, bf) - m) * r, g = ldx(w, c, bf) * ldx(dout, off + c, bf);
        stx(dinp, off + c, ldx(dinp, off + c, bf) + (g - gmean - nrm * gnmean) * r, bf);
    }
}

// partials (nchunks, 2C): [chunk, c] = sum over the chunk's rows of n*dout, [chunk, C + c] =
// sum of dout, rows in order. grid (ceil(C / LN_COL_THREADS), nchunks)
__global__ void layernorm_backward_partials_kernel(float *partials, const void *dout,
                                                   const void *inp, const float *mean,
                                                   const float *rstd, int64_t N, int C,
                                                   int64_t chunk, bool bf) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < N ? r0 + chunk : N;
    float pdw = 0.0f, pdb = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        float dy = ldx(dout, r * C + c, bf);
        pdw += (ldx(inp, r * C + c, bf) - mean[r]) * rstd[r] * dy;
        pdb += dy;
    }
    partials[blockIdx.y * 2 * (int64_t)C + c] = pdw;
    partials[blockIdx.y * 2 * (int64_t)C + C + c] = pdb;
}

static unsigned ln_row_blocks(int64_t N) {
    return (unsigned)((N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
}

extern "C" void cuda_layernorm_forward(loom_backend *be, loom_tensor out, loom_tensor mean,
                                       loom_tensor rstd, loom_tensor inp, loom_tensor w,
                                       loom_tensor b) {
    bool bf = cuda_act(be, inp);
    int64_t N = loom_rows(&inp), C = loom_cols(&inp);
    LOOM_CHECK(cuda_act(be, out) == bf && cuda_act(be, w) == bf && cuda_act(be, b) == bf);
    LOOM_CHECK(loom_rows(&out) == N && loom_cols(&out) == C && loom_numel(&w) == C &&
               loom_numel(&b) == C && loom_numel(&mean) == N && loom_numel(&rstd) == N);
    if (!N) return;
    layernorm_forward_kernel<<<ln_row_blocks(N), 32 * LN_ROWS_PER_BLOCK, 0, cuda_of(be)->stream>>>(
        out.data, cuda_f32(mean), cuda_f32(rstd), inp.data, w.data, b.data, N, (int)C, bf);
    CUDA_LAUNCH_CHECK();
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
    const float *mu = cuda_f32(mean), *rs = cuda_f32(rstd);
    layernorm_backward_dinp_kernel<<<ln_row_blocks(N), 32 * LN_ROWS_PER_BLOCK, 0, cu->stream>>>(
        dinp.data, dout.data, inp.data, w.data, mu, rs, N, (int)C, bf);
    CUDA_LAUNCH_CHECK();
    int64_t chunk = cuda_row_chunk(N), nchunks = (N + chunk - 1) / chunk;
    float *part = (float *)cuda_scratch(cu, (size_t)(nchunks * 2 * C) * sizeof(float));
    dim3 grid((unsigned)((C + LN_COL_THREADS - 1) / LN_COL_THREADS), (unsigned)nchunks);
    layernorm_backward_partials_kernel<<<grid, LN_COL_THREADS, 0, cu->stream>>>(
        part, dout.data, inp.data, mu, rs, N, (int)C, chunk, bf);
    CUDA_LAUNCH_CHECK();
    cuda_add_partials(cu, dw.data, bf, part, false, nchunks, 2 * C, C);
    cuda_add_partials(cu, db.data, bf, part + C, false, nchunks, 2 * C, C);
}
