// The MLP's GELU products in bf16 on a 128 x 256 tile of our own, timed against cuBLASLt's (a
// design probe: bench/NOTES.md, twenty-eighth session).
//   AS_IS: D (M,N) = A (M,K) B                        (B K-major (N,K) or N-major (K,N))
//   GELU:  pre (M,N) = bf16(A W^T + bias), D = bf16(gelu(pre))   (W (N,K): the fc layer's forward)
//   DGELU: D (M,N) = bf16(bf16(A W) gelu'(pre)), colpart (M/128, N) fp32 D's column sums over each
//          128 rows (for the fc bias gradient)                   (W (K,N): the fcproj layer's input gradient)
// all bf16 but colpart, fp32 accumulation; M, N and K multiples of 128, 256 and 64.
// A persistent kernel in the design of CUTLASS's warp-specialized SM90 GEMMs, one block an SM:
//   warp 0: A's 128 x 64 and B's 256 x 64 k-blocks into a ring of GB_STAGES stages (TMA);
//   warps 1-3, the epilogue: the tile's bf16 D from shared memory, one row of 256 columns a warp
//     at a time (a lane 8 columns), the GELU or times gelu'(pre) (pre read from global memory),
//     stored to global memory;
//   warps 4-11, the products: two warpgroups, rows 0-63 and 64-127, wgmma m64n256k16 from shared
//     memory into 128 fp32 accumulators a thread, then bf16(D (+ bias)) into the tile buffer.
// Prints, for each form, cuBLASLt's best candidate (with the GELU_AUX_BIAS or DGELU epilogue) and
// ours: us, TFLOP/s, the ratio, and max |ours - cuBLASLt| / max |cuBLASLt|; then the column sums
// against their sum in double. Usage, on a GPU: bench_gemm_gelu [M N K] (default 16384 3072 768:
// gpt2's MLP at B=16); built with -DGB_STAGES=2 for a shorter ring.
#include "backend/cuda/fp8.cuh" // convert8: the GELU and its backward of 8 bf16, as the FP8 casts apply them
#include "backend/cuda/vec.cuh"
#include "bench_gemm.cuh"

#include <functional>

// OP (fp8.cuh's fp8_op): FP8_AS_IS the plain product, FP8_GELU the forward, FP8_DGELU the backward
#define GB_BM 128
#define GB_BN 256
#define GB_BK 64
#ifndef GB_STAGES
#define GB_STAGES 3
#endif
#define GB_A_BYTES (GB_BM * 128)                      // 16 KB
#define GB_B_BYTES (GB_BN * 128)                      // 32 KB
#define GB_STAGE_BYTES (GB_A_BYTES + GB_B_BYTES)
#define GB_D_OFF (GB_STAGES * GB_STAGE_BYTES)
#define GB_BOX (GB_BM * 128)                          // a 128 x 64 bf16 box of the tile buffer
#define GB_SUMS_OFF (GB_D_OFF + 4 * GB_BOX)           // float [2][3][256]
#define GB_BAR_OFF (GB_SUMS_OFF + 2 * 3 * GB_BN * 4)
#define GB_SMEM (GB_BAR_OFF + 128 + 1024)
#define GB_THREADS 384
#define GB_EPI 3                                      // epilogue warps

__device__ __forceinline__ uint32_t pack2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&h;
}

// ma: A (M,K) in 128-row boxes; mb: B (N,K) in 256-row boxes (BT 0) or (K,N) in 64-row boxes (BT 1)
template <int OP, int BT>
__global__ void __launch_bounds__(GB_THREADS, 1)
gemm_gelu_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb, int M, int N, int K,
                 const __nv_bfloat16 *bias, const __nv_bfloat16 *pre, __nv_bfloat16 *out, __nv_bfloat16 *pre_out,
                 float *colpart) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    uint64_t *full = (uint64_t *)(sm + GB_BAR_OFF), *empty = full + GB_STAGES;
    uint64_t *dfull = empty + GB_STAGES, *dfree = dfull + 1;
    uint8_t *db = sm + GB_D_OFF;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int tiles_n = N / GB_BN, tiles = M / GB_BM * tiles_n, kblocks = K / GB_BK;
    if (tid == 0) {
        for (int s = 0; s < GB_STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 2);
        mbar_init(dfull, 256), mbar_init(dfree, 32 * GB_EPI);
        mbar_fence_init();
    }
    __syncthreads();
    if (warp == 0) {
        if (lane == 0)
            for (int t = blockIdx.x, q = 0; t < tiles; t += gridDim.x) {
                int m0 = t / tiles_n * GB_BM, n0 = t % tiles_n * GB_BN;
                for (int kb = 0; kb < kblocks; kb++, q++) {
                    int s = q % GB_STAGES;
                    if (q >= GB_STAGES) mbar_wait(&empty[s], (q / GB_STAGES - 1) & 1);
                    uint8_t *st = sm + s * GB_STAGE_BYTES;
                    mbar_expect(&full[s], GB_STAGE_BYTES);
                    tma_load_2d(st, &ma, kb * GB_BK, m0, &full[s]);
                    if (BT)
                        for (int j = 0; j < 4; j++)
                            tma_load_2d(st + GB_A_BYTES + j * GB_BK * 128, &mb, n0 + 64 * j, kb * GB_BK, &full[s]);
                    else
                        tma_load_2d(st + GB_A_BYTES, &mb, kb * GB_BK, n0, &full[s]);
                }
            }
        return;
    }
    if (warp < 1 + GB_EPI) { // the epilogue: lane's 8 columns at box lane / 8, chunk lane % 8
        int e = warp - 1, box = lane / 8, ch = lane % 8, c0 = box * 64 + ch * 8;
        float *sums = (float *)(sm + GB_SUMS_OFF);
        for (int t = blockIdx.x, n = 0; t < tiles; t += gridDim.x, n++) {
            int m0 = t / tiles_n * GB_BM, n0 = t % tiles_n * GB_BN;
            float cs[FP8_VEC] = {};
            mbar_wait(dfull, n & 1);
            constexpr int R = 4;
            for (int r0 = e; r0 < GB_BM; r0 += R * GB_EPI) {
                uint4 dv[R] = {}, pv[R] = {};
#pragma unroll
                for (int u = 0; u < R; u++) {
                    int r = r0 + u * GB_EPI;
                    if (r < GB_BM) {
                        dv[u] = *(const uint4 *)(db + box * GB_BOX + r * 128 + ((ch ^ (r & 7)) << 4));
                        if (OP == FP8_DGELU) pv[u] = __ldcs((const uint4 *)(pre + (int64_t)(m0 + r) * N + n0 + c0));
                    }
                }
#pragma unroll
                for (int u = 0; u < R; u++) {
                    int r = r0 + u * GB_EPI;
                    if (r >= GB_BM) continue;
                    int64_t at = (int64_t)(m0 + r) * N + n0 + c0;
                    if (OP == FP8_GELU) *(uint4 *)(pre_out + at) = dv[u];
                    if (OP == FP8_AS_IS) {
                        *(uint4 *)(out + at) = dv[u];
                        continue;
                    }
                    float y[FP8_VEC];
                    convert8<OP>(y, dv[u], pv[u], 0.0f);
                    if (OP == FP8_DGELU) // the sums of the values as stored
#pragma unroll
                        for (int j = 0; j < FP8_VEC; j++) {
                            y[j] = __bfloat162float(__float2bfloat16(y[j]));
                            cs[j] += y[j];
                        }
                    vstore<__nv_bfloat16, FP8_VEC>(out + at, y);
                }
            }
            mbar_arrive(dfree);
            if (OP == FP8_DGELU) { // the three warps' sums, added in a fixed order
                float *sn = sums + (n & 1) * GB_EPI * GB_BN;
#pragma unroll
                for (int j = 0; j < FP8_VEC; j++) sn[e * GB_BN + c0 + j] = cs[j];
                named_sync<32 * GB_EPI>(1);
                for (int c = tid - 32; c < GB_BN; c += 32 * GB_EPI)
                    colpart[(int64_t)(m0 / GB_BM) * N + n0 + c] = sn[c] + sn[GB_BN + c] + sn[2 * GB_BN + c];
            }
        }
        return;
    }
    int wg = warp / 4 - 1, w = warp % 4, g = lane / 4, t4 = lane % 4;
    for (int t = blockIdx.x, q = 0, n = 0; t < tiles; t += gridDim.x, n++) {
        float d[128];
        for (int kb = 0; kb < kblocks; kb++, q++) {
            int s = q % GB_STAGES;
            mbar_wait(&full[s], (q / GB_STAGES) & 1);
            uint8_t *st = sm + s * GB_STAGE_BYTES;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint64_t a = wg_desc(st + wg * 64 * 128 + 32 * kk, 0);
                int acc = kb > 0 || kk > 0;
                if (BT)
                    wgmma_bf16<256>::ss<1>(d, a, wg_desc(st + GB_A_BYTES + kk * 16 * 128, GB_BK * 128), acc);
                else
                    wgmma_bf16<256>::ss<0>(d, a, wg_desc(st + GB_A_BYTES + 32 * kk, 0), acc);
            }
            wg_commit();
            wg_wait<1>();
            wg_hold(d);
            if (kb > 0 && tid % 128 == 0) mbar_arrive(&empty[(q - 1) % GB_STAGES]);
        }
        wg_wait<0>();
        wg_hold(d);
        if (tid % 128 == 0) mbar_arrive(&empty[(q - 1) % GB_STAGES]);
        if (n >= 1) mbar_wait(dfree, (n - 1) & 1);
        // row 64 wg + 16 w + g (+ 8 h), columns 8 i + 2 t4, +1: box i / 8, chunk (i % 8) ^ g
        int base = (wg * 64 + w * 16 + g) * 128 + 4 * t4, n0 = t % tiles_n * GB_BN;
        asm volatile("" : "+r"(base));
#pragma unroll
        for (int i = 0; i < 32; i++) {
            float2 bi = OP == FP8_GELU && bias
                            ? __bfloat1622float2(*(const __nv_bfloat162 *)(bias + n0 + 8 * i + 2 * t4))
                            : make_float2(0.0f, 0.0f);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float x0 = d[4 * i + 2 * h], x1 = d[4 * i + 2 * h + 1];
                if (OP == FP8_GELU && bias) x0 += bi.x, x1 += bi.y;
                *(uint32_t *)(db + (i >> 3) * GB_BOX + base + ((((i & 7) ^ g)) << 4) + h * 1024) = pack2(x0, x1);
            }
        }
        mbar_arrive(dfull);
    }
}

template <int OP, int BT>
static void run_ours(int sms, const void *A, const void *B, int M, int N, int K, const __nv_bfloat16 *bias,
                     const __nv_bfloat16 *pre, __nv_bfloat16 *out, __nv_bfloat16 *pre_out, float *colpart) {
    static bool set = false;
    if (!set) {
        CUDA_CHECK(
            cudaFuncSetAttribute(gemm_gelu_kernel<OP, BT>, cudaFuncAttributeMaxDynamicSharedMemorySize, GB_SMEM));
        set = true;
    }
    CUtensorMap ma = hopper_tensor_map_2d(A, 2, M, K, GB_BM);
    CUtensorMap mb = BT ? hopper_tensor_map_2d(B, 2, K, N, GB_BK) : hopper_tensor_map_2d(B, 2, N, K, GB_BN);
    int tiles = M / GB_BM * (N / GB_BN);
    gemm_gelu_kernel<OP, BT><<<tiles < sms ? tiles : sms, GB_THREADS, GB_SMEM>>>(ma, mb, M, N, K, bias, pre, out,
                                                                                pre_out, colpart);
    CUDA_CHECK(cudaGetLastError());
}

static __nv_bfloat16 *upload(size_t n, float scale) {
    std::vector<__nv_bfloat16> h(n);
    for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(scale * frand());
    __nv_bfloat16 *d;
    CUDA_CHECK(cudaMalloc(&d, n * 2));
    CUDA_CHECK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
    return d;
}
int main(int argc, char **argv) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "bench_gemm_gelu: no CUDA device\n");
        return 77;
    }
    int M = argc > 1 ? atoi(argv[1]) : 16384, N = argc > 2 ? atoi(argv[2]) : 3072, K = argc > 3 ? atoi(argv[3]) : 768;
    if (M % GB_BM || N % GB_BN || K % GB_BK) {
        fprintf(stderr, "bench_gemm_gelu: M %% 128, N %% 256 and K %% 64 must be 0\n");
        return 2;
    }
    int sms;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    size_t MN = (size_t)M * N;
    __nv_bfloat16 *A = upload((size_t)M * K, 1.0f), *W = upload((size_t)N * K, 0.05f), *bias = upload(N, 0.5f);
    __nv_bfloat16 *pre = upload(MN, 3.0f), *d_lt, *d_us, *aux_lt, *aux_us;
    float *colpart;
    CUDA_CHECK(cudaMalloc(&d_lt, MN * 2));
    CUDA_CHECK(cudaMalloc(&d_us, MN * 2));
    CUDA_CHECK(cudaMalloc(&aux_lt, MN * 2));
    CUDA_CHECK(cudaMalloc(&aux_us, MN * 2));
    CUDA_CHECK(cudaMalloc(&colpart, (size_t)(M / GB_BM) * N * 4));
    double flop = 2.0 * M * N * (double)K;
    printf("M %d N %d K %d, %d SMs, %d stages, %d bytes of shared memory\n", M, N, K, sms, GB_STAGES, GB_SMEM);
    printf("%-34s %11s %8s %11s %8s %8s %9s\n", "product", "cuBLASLt", "TFLOP/s", "ours", "TFLOP/s", "ours/lt",
           "rel err");
    // cuBLASLt's best candidate with epilogue ep (its bias, and aux: GELU's pre out, DGELU's pre in)
    // against ours (run), both timed; D and GELU's pre compared; returns our D on the host
    auto compare = [&](const char *name, int bt, cublasLtEpilogue_t ep, const void *lt_bias, const void *aux,
                       const std::function<void()> &run) {
        lt_gemm g;
        lt_init(g, M, N, K, bt, ep, lt_bias, aux);
        float tl = lt_best(g, W, A, d_lt);
        lt_run(g, g.best, W, A, d_lt);
        run();
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> us = to_host(d_us, MN);
        double err = rel_diff(us, to_host(d_lt, MN));
        if (ep == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) err = fmax(err, rel_diff(to_host(aux_us, MN), to_host(aux_lt, MN)));
        float tu = time_us(run);
        printf("%-34s %8.1f us %8.1f %8.1f us %8.1f %8.3f %9.2e\n", name, tl, flop / tl / 1e6, tu, flop / tu / 1e6,
               tu / tl, err);
        return us;
    };
    compare("plain, B (N,K)", 0, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL,
            [&] { run_ours<FP8_AS_IS, 0>(sms, A, W, M, N, K, NULL, NULL, d_us, NULL, NULL); });
    compare("plain, B (K,N)", 1, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL,
            [&] { run_ours<FP8_AS_IS, 1>(sms, A, W, M, N, K, NULL, NULL, d_us, NULL, NULL); });
    compare("GELU (gelu and pre), B (N,K)", 0, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, aux_lt,
            [&] { run_ours<FP8_GELU, 0>(sms, A, W, M, N, K, bias, NULL, d_us, aux_us, NULL); });
    std::vector<float> us = compare("DGELU (+ column sums), B (K,N)", 1, CUBLASLT_EPILOGUE_DGELU, NULL, pre,
            [&] { run_ours<FP8_DGELU, 1>(sms, A, W, M, N, K, NULL, pre, d_us, NULL, colpart); });
    std::vector<float> cp((size_t)(M / GB_BM) * N);
    CUDA_CHECK(cudaMemcpy(cp.data(), colpart, cp.size() * 4, cudaMemcpyDeviceToHost));
    double serr = 0, smax = 0; // each 128 rows' column sums of our D, in double, against the kernel's
    for (int p = 0; p < M / GB_BM; p++)
        for (int c = 0; c < N; c++) {
            double s = 0;
            for (int r = 0; r < GB_BM; r++) s += us[(size_t)(p * GB_BM + r) * N + c];
            serr = fmax(serr, fabs(s - cp[(size_t)p * N + c])), smax = fmax(smax, fabs(s));
        }
    printf("column sums: max |ours - double| / max %.2e\n", serr / smax);
    return 0;
}
