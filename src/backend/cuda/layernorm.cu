// LayerNorm over the last dim (Ba et al. 2016), eps 1e-5 as GPT-2, with the formulas of the CPU
// reference (cpu/layernorm.c, after llm.c's layernorm_forward/backward):
//   forward:  mean = sum(x)/C; rstd = 1/sqrt(sum((x-mean)^2)/C + eps); out = (x-mean)*rstd*w + b
//   backward: n = (x-mean)*rstd, g = w*dout:
//             dinp += (g - mean(g) - n*mean(g*n)) * rstd;  dw += sum_rows n*dout;  db += sum_rows dout
// One warp per row, 16-byte vectors along it (vec.cuh); in the forward the row stays in the
// lanes' registers between the passes up to C = 1024 (bf16), and in L1 beyond.
// residual_layernorm_forward is the forward kernel with the residual add in its first pass.
// The backward is one kernel: a block per fixed row chunk (cuda_row_chunk), whose warps take its
// rows in turn and keep their own dw/db sums in shared memory (a lane always owns the same
// columns, so no atomics); the block adds its warps' sums in warp order into a per-chunk partial,
// and cuda_add_partials_n adds the chunks in order (dw, db and dsum in one launch). Everything depends
// only on N and C, so the results repeat bit for bit. Up to C = 1792 (bf16) or 896 (fp32) a lane
// loads its vectors of dout, inp and dinp at once and holds them for the second pass: gpt2's
// C = 768 in bf16 on an H100, 45.7 -> 38.2 us a call (B=16; the row read twice, the second time
// mostly from L2 since the dw/db sums leave L1 little room).
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/vec.cuh"

typedef __nv_bfloat16 bf16;

#define LN_EPS 1e-5f
#define LN_ROWS_PER_BLOCK 8          // forward: warps per block, one row each
#define LN_COLS_ROWS 32              // forward writing the FP8 copy's transpose: rows per block (4 a warp)
#define LN_BWD_WARPS 16              // backward: warps per block at most, reading each row twice
// the same holding the row (~100 registers at gpt2's C: 2 blocks an SM; 154 at 7 vectors: 1)
#define LN_BWD_HELD_WARPS 8
#define LN_BWD_SMEM_MAX (200 << 10)  // bytes of shared memory per backward block at most
#define LN_BWD_HELD 7                // backward: 16-byte vectors of a row a lane holds at most
#define LN_FWD_HELD 4                // forward: the same (C <= 1024 in bf16; 8 was slower at C = 1600)

// The code with NV, the vectors a lane holds, as a constant: LN_FWD_HELD where a lane's vectors of
// W elements (W > 1) fit that many (C <= 32 W LN_FWD_HELD), else 0 (the row read in each pass);
// with W = 1 only NV = 0 is built
#define LN_HELD_DISPATCH(W, C, ...)                                                        \
    do {                                                                                   \
        if ((W) > 1 && (C) <= 32 * (W) * LN_FWD_HELD) {                                    \
            constexpr int NV = (W) > 1 ? LN_FWD_HELD : 0;                                  \
            __VA_ARGS__;                                                                   \
        } else {                                                                           \
            constexpr int NV = 0;                                                          \
            __VA_ARGS__;                                                                   \
        }                                                                                  \
    } while (0)

// Row `row` of out (N,C), mean (N), rstd (N) from x (N,C), w (C), b (C), by one warp; each vector
// of W outputs goes to sink(c, v) as well once stored (v as computed, before rounding to T; the
// sink may overwrite it).
// With RES, x is first written as ra + rb (rounded to T, as the plain residual add stores it; x
// may alias ra or rb: each lane reads back only what it wrote).
// A lane takes the vectors of W elements from columns lane W, (lane + 32) W, ... With NV > 0 (C <=
// 32 W NV) it holds them in registers across the three passes (mean, variance, output); with NV =
// 0 (any C) it reads the row again in each pass, from L1. Both sum in the same order, so they give
// the same bits. Holding the row takes the reloads' instructions out: the kernel was bound by
// its issue slots (70% busy at gpt2's C = 768 in bf16, 2.9 TB/s; ncu, H200).
template <typename T, int W, int NV, bool RES, typename Sink>
__device__ __forceinline__ void layernorm_row(T *out, float *mean, float *rstd, T *x, const T *ra, const T *rb,
                                              const T *w, const T *b, int64_t row, int C, Sink sink) {
    int lane = threadIdx.x % 32;
    x += row * C;
    float h[NV > 0 ? NV : 1][W]; // the lane's vectors of the row (NV = 0: the one at hand)
    // f(v, c) for each vector of the lane from column c, v its values (read from x first, with
    // NV = 0, where `reload`)
    auto each = [&](bool reload, auto &&f) {
        if constexpr (NV > 0) {
#pragma unroll
            for (int i = 0; i < NV; i++)
                if ((lane + 32 * i) * W < C) f(h[i], (lane + 32 * i) * W);
        } else {
            for (int c = lane * W; c < C; c += 32 * W) {
                if (reload) vload<T, W>(h[0], x + c);
                f(h[0], c);
            }
        }
    };
    float s = 0.0f;
    each(false, [&](float(&v)[W], int c) {
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
    });
    float m = warp_sum(s) / (float)C, var = 0.0f;
    each(true, [&](float(&v)[W], int) {
#pragma unroll
        for (int k = 0; k < W; k++) var += (v[k] - m) * (v[k] - m);
    });
    float r = 1.0f / sqrtf(warp_sum(var) / (float)C + LN_EPS);
    each(true, [&](float(&v)[W], int c) {
        float wv[W], bv[W];
        vload<T, W>(wv, w + c);
        vload<T, W>(bv, b + c);
#pragma unroll
        for (int k = 0; k < W; k++) v[k] = (v[k] - m) * r * wv[k] + bv[k];
        if (out) vstore<T, W>(out + row * C + c, v); // (NULL: the FP8 copy alone, in sink)
        sink(c, v);
    });
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// layernorm_row for each row, one warp a row
template <typename T, int W, int NV, bool RES>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, T *x, const T *ra, const T *rb,
                                         const T *w, const T *b, int64_t N, int C) {
    cuda_pdl_begin();
    int64_t row = (int64_t)blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row < N) layernorm_row<T, W, NV, RES>(out, mean, rstd, x, ra, rb, w, b, row, C, [](int, float *) {});
}

// The same in bf16 vectors with the output's E4M3 copy rows8 (N,C) (cuda_fp8_ln_out): fp8(y s) of
// each bf16 output y, as fp8.cu's casts convert it, s = *scale, and *record raised to the largest
// |y|; out NULL: the copy alone (backend.h's fp8_ln_copy_only). 6 blocks an SM where the row is not
// held (40 registers; 44 unbounded would leave 5), 4 where it is (62). With COLS (a held row) the
// copy's transpose cols8 (C,N) as well, for the layer's backward: a warp takes LN_COLS_ROWS /
// LN_ROWS_PER_BLOCK rows in turn, the block keeps its LN_COLS_ROWS rows of the copy in shared
// memory (rows of C + 8 bytes: fewer bank conflicts), then writes them transposed, 8x8 blocks as
// fp8.cu's transpose_kernel does, four threads to a column's 32 bytes (whole sectors); against that
// kernel after this one, the copy is not read back and there is one launch fewer.
template <int NV, bool RES, bool COLS>
__global__ void __launch_bounds__(32 * LN_ROWS_PER_BLOCK, NV > 0 ? 4 : 6)
    layernorm_fp8_kernel(bf16 *out, float *mean, float *rstd, bf16 *x, const bf16 *ra, const bf16 *rb, const bf16 *w,
                         const bf16 *b, int64_t N, int C, uint8_t *rows8, uint8_t *cols8, const float *scale,
                         unsigned *record) {
    cuda_pdl_begin();
    constexpr int TURNS = COLS ? LN_COLS_ROWS / LN_ROWS_PER_BLOCK : 1; // rows a warp takes
    extern __shared__ uint8_t ln_tile[]; // COLS: (LN_COLS_ROWS, C + 8) bytes
    int warp = threadIdx.x / 32;
    int64_t first = (int64_t)blockIdx.x * LN_ROWS_PER_BLOCK * TURNS; // the block's first row
    float s = *scale, amax = 0.0f;
    for (int i = 0; i < TURNS; i++) {
        int local = i * LN_ROWS_PER_BLOCK + warp;
        int64_t row = first + local;
        if (row >= N) break;
        uint8_t *r8 = rows8 + row * C, *t8 = ln_tile + (size_t)local * (C + 8);
        layernorm_row<bf16, FP8_VEC, NV, RES>(out, mean, rstd, x, ra, rb, w, b, row, C, [&](int c, float *v) {
#pragma unroll
            for (int k = 0; k < FP8_VEC; k++) v[k] = to_f32(from_f32<bf16>(v[k])), amax = fmaxf(amax, fabsf(v[k]));
            uint2 q = fp8_pack(v, s, __NV_E4M3);
            *(uint2 *)(r8 + c) = q;
            if (COLS) *(uint2 *)(t8 + c) = q;
        });
    }
    if constexpr (COLS) {
        __syncthreads();
        constexpr int G = LN_COLS_ROWS / FP8_VEC; // 8-row groups of the block
        for (int t = threadIdx.x; t < G * (C / FP8_VEC); t += blockDim.x) {
            int g = t % G, c = t / G * FP8_VEC; // G consecutive threads: one column group, all rows
            if (first + g * FP8_VEC >= N) continue;
            uint32_t lo[FP8_VEC], hi[FP8_VEC];
#pragma unroll
            for (int k = 0; k < FP8_VEC; k++) {
                uint2 q = *(const uint2 *)(ln_tile + (size_t)(g * FP8_VEC + k) * (C + 8) + c);
                lo[k] = q.x, hi[k] = q.y;
            }
            store_cols(cols8, lo, hi, first + g * FP8_VEC, c, N);
        }
    }
    record_max<32 * LN_ROWS_PER_BLOCK>(amax, record); // every thread: the rows past N with 0
}

// p[0..P) += v[0..P), one 16-byte access when P = 4 (p then 16-byte aligned)
template <int P> __device__ __forceinline__ void acc_add(float *p, const float *v) {
    if constexpr (P == 4) {
        float4 a = *(float4 *)p;
        a.x += v[0], a.y += v[1], a.z += v[2], a.w += v[3];
        *(float4 *)p = a;
    } else {
#pragma unroll
        for (int k = 0; k < P; k++) p[k] += v[k];
    }
}

// dinp (N,C) += the row-local part; partials (nchunks, S C) fp32, S = 2 or 3 sums: [chunk, c] =
// sum over the chunk's rows of n*dout, [chunk, C + c] = sum of dout, with S = 3 [chunk, 2C + c] =
// sum of dinp as stored. One block per chunk of `chunk` rows; shared memory: per warp S C floats,
// the sums one after another; element k of vector j of a row in group k / P of P consecutive
// floats, at [((k / P) * C/W + j) * P + k % P] (P = 4 where W allows: a warp's lanes then touch
// consecutive 16-byte words).
// A lane takes vectors lane, lane + 32, ... of W elements. With NV > 0 (C <= 32 W NV) it loads
// all of its dout, inp and dinp at once and holds them, as stored, between the two passes; with
// NV = 0 (any C) it reads the row twice, the second time from L1 or L2. Both sum in the same
// order, so they give the same bits.
template <typename T, int W, int NV>
__global__ void __launch_bounds__(32 * (NV > 0 ? LN_BWD_HELD_WARPS : LN_BWD_WARPS))
    layernorm_backward_kernel(T *dinp, float *partials, const T *dout, const T *inp, const T *w,
                              const float *mean, const float *rstd, int64_t N, int C, int64_t chunk, int S) {
    cuda_pdl_begin();
    extern __shared__ float ln_smem[];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32, nv = C / W;
    constexpr int HELD = NV > 0 ? NV : 1, P = W % 4 ? 1 : 4;
    float *acc = ln_smem + (int64_t)warp * S * C;
    for (int c = lane; c < S * C; c += 32) acc[c] = 0.0f;
    __syncwarp();
    int64_t r0 = (int64_t)blockIdx.x * chunk, r1 = r0 + chunk < N ? r0 + chunk : N;
    // f(i, j) for each vector j of the lane's row, the i-th it holds when NV > 0
    auto each = [&](auto &&f) {
        if constexpr (NV > 0) {
#pragma unroll
            for (int i = 0; i < NV; i++)
                if (lane + 32 * i < nv) f(i, lane + 32 * i);
        } else {
            for (int j = lane; j < nv; j += 32) f(0, j);
        }
    };
    for (int64_t row = r0 + warp; row < r1; row += warps) {
        const T *dy = dout + row * C, *x = inp + row * C;
        T *dx = dinp + row * C;
        T dh[HELD][W], xh[HELD][W], ih[HELD][W]; // NV > 0: the lane's vectors of dout, inp, dinp
        float m = mean[row], r = rstd[row], gsum = 0.0f, gnsum = 0.0f;
        if constexpr (NV > 0)
            each([&](int i, int j) {
                vload_raw<T, W>(dh[i], dy + j * W);
                vload_raw<T, W>(xh[i], x + j * W);
                vload_raw<T, W>(ih[i], dx + j * W);
            });
        // vector j of dout, inp and w as stored (converted where used: fewer registers)
        T d[W], xv[W], wv[W];
        auto load = [&](int i, int j) {
            if constexpr (NV > 0) {
#pragma unroll
                for (int k = 0; k < W; k++) d[k] = dh[i][k], xv[k] = xh[i][k];
            } else {
                vload_raw<T, W>(d, dy + j * W);
                vload_raw<T, W>(xv, x + j * W);
            }
            vload_raw<T, W>(wv, w + j * W);
        };
        each([&](int i, int j) {
            // NV = 0: dx is read in the second pass only: fetch it into L1 now
            if constexpr (NV == 0) asm volatile("prefetch.global.L1 [%0];" ::"l"(dx + j * W));
            load(i, j);
#pragma unroll
            for (int k = 0; k < W; k++) {
                float g = to_f32(wv[k]) * to_f32(d[k]);
                gsum += g;
                gnsum += g * (to_f32(xv[k]) - m) * r;
            }
        });
        float gmean = warp_sum(gsum) / (float)C, gnmean = warp_sum(gnsum) / (float)C;
        each([&](int i, int j) {
            float di[W];
            load(i, j);
            if constexpr (NV > 0) {
#pragma unroll
                for (int k = 0; k < W; k++) di[k] = to_f32(ih[i][k]);
            } else {
                vload<T, W>(di, dx + j * W);
            }
            float nd[W], dd[W];
#pragma unroll
            for (int k = 0; k < W; k++) {
                float n = (to_f32(xv[k]) - m) * r;
                dd[k] = to_f32(d[k]);
                nd[k] = n * dd[k];
                di[k] += (to_f32(wv[k]) * dd[k] - gmean - n * gnmean) * r;
            }
            vstore<T, W>(dx + j * W, di);
#pragma unroll
            for (int q = 0; q < W / P; q++) {
                acc_add<P>(acc + ((int64_t)q * nv + j) * P, nd + q * P);
                acc_add<P>(acc + C + ((int64_t)q * nv + j) * P, dd + q * P);
            }
            if (S == 3) {
#pragma unroll
                for (int k = 0; k < W; k++) di[k] = to_f32(from_f32<T>(di[k])); // as stored
#pragma unroll
                for (int q = 0; q < W / P; q++) acc_add<P>(acc + 2 * C + ((int64_t)q * nv + j) * P, di + q * P);
            }
        });
    }
    __syncthreads();
    for (int c = threadIdx.x; c < S * C; c += blockDim.x) {
        int cc = c % C, k = cc % W, at = (c / C) * C + ((k / P) * nv + cc / W) * P + k % P;
        float s = 0.0f;
        for (int wi = 0; wi < warps; wi++) s += ln_smem[(int64_t)wi * S * C + at];
        partials[(int64_t)blockIdx.x * S * C + c] = s;
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
    if (f.rows) { // the transpose too where a lane holds its row, else by a kernel after (from L2)
        bool in_kernel = false;
        LN_HELD_DISPATCH(FP8_VEC, C, {
            constexpr bool COLS = NV > 0;
            in_kernel = COLS && f.cols;
            auto plain = fused ? layernorm_fp8_kernel<NV, true, false> : layernorm_fp8_kernel<NV, false, false>;
            auto kernel = !in_kernel ? plain : fused ? layernorm_fp8_kernel<NV, true, COLS>
                                                     : layernorm_fp8_kernel<NV, false, COLS>;
            unsigned grid = in_kernel ? (unsigned)((N + LN_COLS_ROWS - 1) / LN_COLS_ROWS) : blocks;
            cuda_launch(cu->stream, kernel, grid, 32 * LN_ROWS_PER_BLOCK, in_kernel ? LN_COLS_ROWS * (C + 8) : 0,
                        f.copy_only ? NULL : (bf16 *)out.data, cuda_f32(mean), cuda_f32(rstd), (bf16 *)res.data,
                        (const bf16 *)a.data,
                        (const bf16 *)b.data, (const bf16 *)w.data, (const bf16 *)bias.data, N, (int)C, f.rows,
                        in_kernel ? f.cols : NULL, f.scale, f.record);
        });
        if (f.cols && !in_kernel) cuda_fp8_transpose(cu, f.cols, f.rows, N, C);
        return;
    }
    CUDA_DISPATCH(bf, vec, LN_HELD_DISPATCH(W, C, {
        auto kernel = fused ? layernorm_forward_kernel<T, W, NV, true> : layernorm_forward_kernel<T, W, NV, false>;
        cuda_launch(cu->stream, kernel, blocks, 32 * LN_ROWS_PER_BLOCK, 0, (T *)out.data, cuda_f32(mean),
                    cuda_f32(rstd), (T *)res.data, (const T *)a.data, (const T *)b.data, (const T *)w.data,
                    (const T *)bias.data, N, (int)C);
    }));
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

// layernorm_backward_kernel<T, W, held>
template <typename T, int W>
static void (*ln_backward_kernel(int held))(T *, float *, const T *, const T *, const T *, const float *,
                                            const float *, int64_t, int, int64_t, int) {
    if constexpr (W == 1) {
        return layernorm_backward_kernel<T, W, 0>;
    } else {
        static_assert(LN_BWD_HELD == 7, "the list below");
        decltype(&layernorm_backward_kernel<T, W, 0>) kernels[] = {
            layernorm_backward_kernel<T, W, 0>, layernorm_backward_kernel<T, W, 1>,
            layernorm_backward_kernel<T, W, 2>, layernorm_backward_kernel<T, W, 3>,
            layernorm_backward_kernel<T, W, 4>, layernorm_backward_kernel<T, W, 5>,
            layernorm_backward_kernel<T, W, 6>, layernorm_backward_kernel<T, W, 7>};
        return kernels[held];
    }
}

extern "C" void cuda_layernorm_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor db,
                                        loom_tensor dsum, loom_tensor dout, loom_tensor inp, loom_tensor w,
                                        loom_tensor mean, loom_tensor rstd) {
    loom_cuda *cu = cuda_of(be);
    bool bf = cuda_act(be, inp);
    int64_t N = loom_rows(&inp), C = loom_cols(&inp);
    LOOM_CHECK(cuda_act(be, dinp) == bf && cuda_act(be, dw) == bf && cuda_act(be, db) == bf &&
               cuda_act(be, dout) == bf && cuda_act(be, w) == bf);
    LOOM_CHECK(loom_rows(&dinp) == N && loom_cols(&dinp) == C && loom_rows(&dout) == N &&
               loom_cols(&dout) == C && loom_numel(&w) == C && loom_numel(&dw) == C &&
               loom_numel(&db) == C && loom_numel(&mean) == N && loom_numel(&rstd) == N);
    LOOM_CHECK(!dsum.data || (cuda_act(be, dsum) == bf && loom_numel(&dsum) == C));
    if (!N) return;
    // dinp's column sums in the kernel as a third sum where a warp's three fit (C up to 17066),
    // else by a pass of their own
    int S = dsum.data && (size_t)3 * C * sizeof(float) <= LN_BWD_SMEM_MAX ? 3 : 2;
    int64_t chunk = cuda_row_chunk(N), nchunks = (N + chunk - 1) / chunk;
    float *part = cuda_partials(cu, (size_t)(nchunks * S * C) * sizeof(float));
    bool vec = cuda_vec_ok(bf, C, dinp.data, dout.data, inp.data, w.data);
    CUDA_DISPATCH(bf, vec, {
        int held = W > 1 && C <= 32 * W * LN_BWD_HELD ? (int)(C / W + 31) / 32 : 0; // vectors a lane holds
        // warps as three sums allow, with dsum or without: dw and db repeat bit for bit either way
        int warps = held ? LN_BWD_HELD_WARPS : LN_BWD_WARPS;
        while (warps > 1 && (size_t)warps * 3 * C * sizeof(float) > LN_BWD_SMEM_MAX) warps /= 2;
        size_t smem = (size_t)warps * S * C * sizeof(float);
        LOOM_CHECK(smem <= LN_BWD_SMEM_MAX); // C up to 25600
        auto kernel = ln_backward_kernel<T, W>(held);
        if (smem > (48 << 10))
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        cuda_launch(cu->stream, kernel, (unsigned)nchunks, 32 * warps, smem, (T *)dinp.data, part, (const T *)dout.data,
                    (const T *)inp.data, (const T *)w.data, cuda_f32(mean), cuda_f32(rstd), N, (int)C, chunk, S);
    });
    void *dst[] = {dw.data, db.data, dsum.data};
    cuda_add_partials_n(cu, dst, S, bf, !be->grads_write, part, nchunks, S * C, C);
    if (dsum.data && S == 2) cuda_column_sums(cu, dsum.data, dinp.data, N, C, C, bf, !be->grads_write);
}
