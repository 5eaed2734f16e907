// The fcproj layer's input-gradient product in FP8 with the fc layer's output-gradient cast in its
// epilogue (the GELU's backward; delayed scaling, fast accumulation), on wgmma and TMA
// (hopper.cuh), for cuda_fp8_mlp_backward:
//   y (M,N)         = bf16(inv_a inv_b A8 B8^T) gelu'(pre)   A8 (M,K) dout (E5M2), B8 (N,K) projw^T (E4M3)
//   rows (M,N) E5M2 = fp8(y s),  cols (N,M) its transpose,  colpart (M/128, N) y's column sums over
//   each 128 rows,  *record raised to max |y|
// which is what cuBLASLt's FP8 product with fast accumulation followed by fp8.cu's DGELU cast of
// its output write, bit for bit (the column sums in another order): the product's output (M,N)
// bf16 is neither written nor read back. gpt2 B=16 (M 16384, N 3072, K 768) on an H200: 125 us,
// against 68 + 82 for the product and the cast (bench/NOTES.md, thirteenth session).
// A persistent kernel with warp roles, in the design of CUTLASS's warp-specialized SM90 GEMMs
// (KernelTmaWarpSpecialized), one block an SM, 128 x 128 tiles to the blocks in turn:
//   warp 16: A's and B's 128 x 128 k-blocks into a ring of DG_STAGES stages (TMA);
//   warp 17: pre's tile, a tile ahead of the epilogue (TMA);
//   warps 0-7, the products: two warpgroups, rows 0-63 and 64-127 of a tile, wgmma m64n128k32 over
//     its k-blocks with one fp32 accumulator (cuBLASLt's fast accumulation), then bf16(D) into the
//     tile buffer, and on to the next tile;
//   warps 8-15, the epilogue: each thread an 8x8 block of the buffer, times gelu'(pre), as E5M2
//     into the rows tile and, transposed in registers, the cols tile, both stored by TMA; the
//     column sums through shared memory.
// M, N and K must be multiples of 128.
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/hopper.cuh"

#define DG_TILE 128                       // a tile's rows and columns, and a k-block's bytes (K elements)
#define DG_STAGES 3                       // k-blocks in flight
#define DG_THREADS 576                    // 18 warps: 4 or 5 a scheduler, so 96 registers a thread
#define DG_FP8_TILE (DG_TILE * DG_TILE)   // an FP8 tile: 16 KB
#define DG_BF16_TILE (2 * DG_FP8_TILE)    // a bf16 tile: two 64-column halves, 32 KB
#define DG_D_OFF (DG_STAGES * 2 * DG_FP8_TILE)
#define DG_ROWS_OFF (DG_D_OFF + DG_BF16_TILE)
#define DG_COLS_OFF (DG_ROWS_OFF + DG_FP8_TILE)
#define DG_PRE_OFF (DG_COLS_OFF + DG_FP8_TILE)
#define DG_SUMS_OFF (DG_PRE_OFF + DG_BF16_TILE) // float [4][128]: each 32 rows' column sums
#define DG_BAR_OFF (DG_SUMS_OFF + 4 * DG_TILE * 4)
#define DG_SMEM (DG_BAR_OFF + 128 + 1024)       // and up to 1024 bytes to align the start

// maps (hopper_tensor_map_2d): ma A8 and mb B8 in 128-row boxes, mpre pre in 128-row boxes of 64
// columns, mrows rows and mcols cols in 128-row boxes; inv_a, inv_b, scale (s) and record as above
__global__ void __launch_bounds__(DG_THREADS, 1)
gemm_fp8_dgelu_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                      const __grid_constant__ CUtensorMap mpre, const __grid_constant__ CUtensorMap mrows,
                      const __grid_constant__ CUtensorMap mcols, int M, int N, int K, const float *inv_a,
                      const float *inv_b, const float *scale, unsigned *record, float *colpart) {
    cuda_pdl_begin();
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023); // 1024-byte aligned: the swizzle's
    uint64_t *full = (uint64_t *)(sm + DG_BAR_OFF), *empty = full + DG_STAGES;
    // dfull: a tile's bf16(D) is in the buffer; dfree: the epilogue has read it; prefull, prefree:
    // the same for pre's tile
    uint64_t *dfull = empty + DG_STAGES, *dfree = dfull + 1, *prefull = dfree + 1, *prefree = prefull + 1;
    float *sums = (float *)(sm + DG_SUMS_OFF);
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int tiles_n = N / DG_TILE, tiles = M / DG_TILE * tiles_n, kblocks = K / DG_TILE;
    if (tid == 0) {
        for (int s = 0; s < DG_STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 2);
        mbar_init(dfull, 256), mbar_init(dfree, 256), mbar_init(prefull, 1), mbar_init(prefree, 256);
        mbar_fence_init();
    }
    __syncthreads();
    if (warp == 16) { // A and B, k-block after k-block of this block's tiles (q counts them)
        if (lane == 0)
            for (int t = blockIdx.x, q = 0; t < tiles; t += gridDim.x) {
                int m0 = t / tiles_n * DG_TILE, n0 = t % tiles_n * DG_TILE;
                for (int kb = 0; kb < kblocks; kb++, q++) {
                    int s = q % DG_STAGES;
                    if (q >= DG_STAGES) mbar_wait(&empty[s], (q / DG_STAGES - 1) & 1);
                    uint8_t *st = sm + s * 2 * DG_FP8_TILE;
                    mbar_expect(&full[s], 2 * DG_FP8_TILE);
                    tma_load_2d(st, &ma, kb * DG_TILE, m0, &full[s]);
                    tma_load_2d(st + DG_FP8_TILE, &mb, kb * DG_TILE, n0, &full[s]);
                }
            }
        return;
    }
    if (warp == 17) { // pre, a tile ahead of the epilogue
        if (lane == 0)
            for (int t = blockIdx.x, n = 0; t < tiles; t += gridDim.x, n++) {
                int m0 = t / tiles_n * DG_TILE, n0 = t % tiles_n * DG_TILE;
                if (n > 0) mbar_wait(prefree, (n - 1) & 1);
                mbar_expect(prefull, DG_BF16_TILE);
                tma_load_2d(sm + DG_PRE_OFF, &mpre, n0, m0, prefull);
                tma_load_2d(sm + DG_PRE_OFF + DG_FP8_TILE, &mpre, n0 + 64, m0, prefull);
            }
        return;
    }
    if (warp < 8) { // the products
        int wg = warp / 4, w = warp % 4, g = lane / 4, t4 = lane % 4;
        float ab = *inv_a * *inv_b;
        uint8_t *db = sm + DG_D_OFF;
        for (int t = blockIdx.x, q = 0, n = 0; t < tiles; t += gridDim.x, n++) {
            float d[64];
            for (int kb = 0; kb < kblocks; kb++, q++) {
                int s = q % DG_STAGES;
                mbar_wait(&full[s], (q / DG_STAGES) & 1);
                uint8_t *st = sm + s * 2 * DG_FP8_TILE;
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < DG_TILE / 32; kk++)
                    wgmma_e5m2_e4m3_128(d, wg_desc(st + wg * 64 * DG_TILE + 32 * kk, 0),
                                        wg_desc(st + DG_FP8_TILE + 32 * kk, 0), kb > 0 || kk > 0);
                wg_commit();
                wg_wait<1>();
                wg_hold(d);
                if (kb > 0 && tid % 128 == 0) mbar_arrive(&empty[(q - 1) % DG_STAGES]);
            }
            wg_wait<0>();
            wg_hold(d);
            if (tid % 128 == 0) mbar_arrive(&empty[(q - 1) % DG_STAGES]);
            if (n >= 1) mbar_wait(dfree, (n - 1) & 1); // the epilogue is done with the last tile's D
            // row 64 wg + 16 w + g (+ 8 h), columns 8 i + 2 t4, +1: in the swizzled chunk (i % 8) ^ g
            int base = (wg * 64 + w * 16 + g) * 128 + (g << 4) + 4 * t4;
            asm volatile("" : "+r"(base)); // one offset, not one a column kept across the tiles
#pragma unroll
            for (int i = 0; i < 16; i++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *(__nv_bfloat162 *)(db + (base ^ ((i & 7) << 4)) + (i >> 3) * DG_FP8_TILE + h * 1024) =
                        __floats2bfloat162_rn(d[4 * i + 2 * h] * ab, d[4 * i + 2 * h + 1] * ab);
            mbar_arrive(dfull);
        }
        return;
    }
    // the epilogue: thread e takes the 8x8 block at rows 8 rb, columns 8 cb of the tile
    int e = tid - 256, ew = e / 32;
    int cb = ew % 2 * 8 + lane % 8, rb = ew / 2 * 4 + lane / 8;
    float s = *scale, m = 0.0f;
    const uint8_t *db = sm + DG_D_OFF, *pre = sm + DG_PRE_OFF;
    uint8_t *rows = sm + DG_ROWS_OFF, *cols = sm + DG_COLS_OFF;
    for (int t = blockIdx.x, n = 0; t < tiles; t += gridDim.x, n++) {
        int m0 = t / tiles_n * DG_TILE, n0 = t % tiles_n * DG_TILE;
        // row k of the block: in the buffers at dof + k*128, in the rows tile at rof + k*128, each in
        // the swizzled chunk ^ k; its column k in the cols tile at cof + k*128, chunk ^ k. Held, not
        // kept a row each across the tiles.
        int dof = cb / 8 * DG_FP8_TILE + rb * 1024 + ((cb & 7) << 4);
        int rof = rb * 1024 + ((cb >> 1) << 4) + (cb & 1) * 8, cof = cb * 1024 + ((rb >> 1) << 4) + (rb & 1) * 8;
        asm volatile("" : "+r"(dof), "+r"(rof), "+r"(cof));
        if (e == 0) bulk_wait_read(); // the last tile's stores have read the rows and cols tiles
        named_sync<256>(1);
        mbar_wait(dfull, n & 1);
        mbar_wait(prefull, n & 1);
        float cs[FP8_VEC] = {};
        uint32_t lo[FP8_VEC], hi[FP8_VEC]; // row k's bytes 0-3 and 4-7
#pragma unroll
        for (int k = 0; k < FP8_VEC; k++) {
            float x[FP8_VEC];
            int at = (dof ^ (k << 4)) + k * 128;
            m = convert8<FP8_DGELU>(x, *(const uint4 *)(db + at), *(const uint4 *)(pre + at), m);
#pragma unroll
            for (int j = 0; j < FP8_VEC; j++) cs[j] += x[j];
            uint2 q = fp8_pack(x, s, __NV_E5M2);
            lo[k] = q.x, hi[k] = q.y;
            *(uint2 *)(rows + (rof ^ (k << 4)) + k * 128) = q;
        }
        mbar_arrive(dfree);
        mbar_arrive(prefree);
        transpose8x8(lo, hi);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            *(uint2 *)(cols + (cof ^ (j << 4)) + j * 128) = make_uint2(lo[j], lo[4 + j]);
            *(uint2 *)(cols + (cof ^ ((4 + j) << 4)) + (4 + j) * 128) = make_uint2(hi[j], hi[4 + j]);
        }
#pragma unroll
        for (int j = 0; j < FP8_VEC; j++) { // over the warp's 4 row blocks (lanes 8 apart), in a fixed order
            cs[j] += __shfl_xor_sync(0xffffffffu, cs[j], 8);
            cs[j] += __shfl_xor_sync(0xffffffffu, cs[j], 16);
        }
        if (lane < 8)
#pragma unroll
            for (int j = 0; j < FP8_VEC; j++) sums[ew / 2 * DG_TILE + 8 * cb + j] = cs[j];
        fence_async_smem();
        named_sync<256>(1);
        if (e < DG_TILE) {
            float total = 0.0f;
            for (int r = 0; r < 4; r++) total += sums[r * DG_TILE + e];
            colpart[(int64_t)(m0 / DG_TILE) * N + n0 + e] = total;
        }
        if (e == 0) {
            tma_store_2d(&mrows, n0, m0, rows);
            tma_store_2d(&mcols, m0, n0, cols);
            bulk_commit();
        }
    }
    m = warp_max(m);
    if (lane == 0) atomicMax(record, __float_as_uint(m));
    if (e == 0) bulk_wait();
}

bool cuda_fp8_dgelu_gemm(loom_cuda *cu, const uint8_t *a8, const float *inv_a, const uint8_t *b8, const float *inv_b,
                         const void *pre, int64_t M, int64_t N, int64_t K, cuda_fp8_dgelu_out out) {
    bool aligned = (uintptr_t)a8 % 16 == 0 && (uintptr_t)b8 % 16 == 0 && (uintptr_t)pre % 16 == 0 &&
                   (uintptr_t)out.rows % 16 == 0 && (uintptr_t)out.cols % 16 == 0;
    if (!out.c.scale || !out.c.record || M % DG_TILE || N % DG_TILE || K % DG_TILE || !aligned) return false;
    CUtensorMap ma = hopper_tensor_map_2d(a8, 1, M, K, DG_TILE), mb = hopper_tensor_map_2d(b8, 1, N, K, DG_TILE);
    CUtensorMap mpre = hopper_tensor_map_2d(pre, 2, M, N, DG_TILE);
    CUtensorMap mrows = hopper_tensor_map_2d(out.rows, 1, M, N, DG_TILE);
    CUtensorMap mcols = hopper_tensor_map_2d(out.cols, 1, N, M, DG_TILE);
    CUDA_CHECK(cudaFuncSetAttribute(gemm_fp8_dgelu_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, DG_SMEM));
    int64_t tiles = M / DG_TILE * (N / DG_TILE);
    cuda_launch(cu->stream, gemm_fp8_dgelu_kernel, (unsigned)(tiles < cu->sms ? tiles : cu->sms), DG_THREADS, DG_SMEM,
                ma, mb, mpre, mrows, mcols, (int)M, (int)N, (int)K, inv_a, inv_b, out.c.scale, out.c.record,
                out.colpart);
    return true;
}
