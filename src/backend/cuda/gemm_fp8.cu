// The MLP's FP8 products with the GELU's casts in their epilogue (delayed scaling), on wgmma and
// TMA (hopper.cuh), in two forms (OP):
// - FP8_GELU, the fc product of cuda_fp8_mlp_forward (fast accumulation, the forward's recipe):
//     pre (M,N) bf16  = bf16(inv_a inv_b A8 B8^T + bias)   A8 (M,K) the input, B8 (N,K) the weight (E4M3)
//     rows (M,N) E4M3 = fp8(gelu(pre) s),  cols (N,M) its transpose,  *record raised to max |gelu(pre)|
//   which is what cuBLASLt's product with the bias epilogue followed by fp8.cu's cast of gelu(pre)
//   write, bit for bit, pre not read back. gpt2 B=16 (M 16384, N 3072, K 768) on an H100: 120.5 us,
//   against 81 + 72 for the product and the cast (bench/NOTES.md, sixteenth session).
// - FP8_DGELU, the fcproj layer's input-gradient product of cuda_fp8_mlp_backward (fast
//   accumulation: --fp8-fast-dgrad), with the fc layer's output-gradient cast:
//     y (M,N)         = bf16(inv_a inv_b A8 B8^T) gelu'(pre)   A8 (M,K) dout (E5M2), B8 (N,K) projw^T (E4M3)
//     rows (M,N) E5M2 = fp8(y s),  cols (N,M) its transpose,  colpart (M/128, N) y's column sums over
//     each 128 rows,  *record raised to max |y|
//   which is what cuBLASLt's product followed by fp8.cu's DGELU cast of its output write, bit for
//   bit (the column sums in another order): the product's output is neither written nor read back.
//   gpt2 B=16 (M 16384, N 3072, K 768) on an H200: 125 us, against 68 + 82 for the product and the cast.
// A persistent kernel with warp roles, in the design of CUTLASS's warp-specialized SM90 GEMMs
// (KernelTmaWarpSpecialized), one block an SM, 128 x 128 tiles to the blocks in turn:
//   warp 16: A's and B's 128 x 128 k-blocks into a ring of GF_STAGES stages (TMA);
//   warp 17 (FP8_DGELU): pre's tile, a tile ahead of the epilogue (TMA);
//   warps 0-7, the products: two warpgroups, rows 0-63 and 64-127 of a tile, wgmma m64n128k32 over
//     its k-blocks with one fp32 accumulator (cuBLASLt's fast accumulation), then bf16(D (+ bias))
//     into the tile buffer, and on to the next tile;
//   warps 8-15, the epilogue: (FP8_GELU) pre stored from the tile buffer by TMA; each thread an 8x8
//     block of the buffer, its GELU or times gelu'(pre), into the rows tile and, transposed in
//     registers, the cols tile, both stored by TMA; (FP8_DGELU) the column sums through shared memory.
// M, N and K must be multiples of 128.
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/hopper.cuh"

#define GF_TILE 128                       // a tile's rows and columns, and a k-block's bytes (K elements)
#define GF_STAGES 3                       // k-blocks in flight
#define GF_THREADS 576                    // 18 warps: 4 or 5 a scheduler, so 96 registers a thread
#define GF_FP8_TILE (GF_TILE * GF_TILE)   // an FP8 tile: 16 KB
#define GF_BF16_TILE (2 * GF_FP8_TILE)    // a bf16 tile: two 64-column halves, 32 KB
#define GF_D_OFF (GF_STAGES * 2 * GF_FP8_TILE)
#define GF_ROWS_OFF (GF_D_OFF + GF_BF16_TILE)
#define GF_COLS_OFF (GF_ROWS_OFF + GF_FP8_TILE)
#define GF_PRE_OFF (GF_COLS_OFF + GF_FP8_TILE)
#define GF_SUMS_OFF (GF_PRE_OFF + GF_BF16_TILE) // float [4][128]: each 32 rows' column sums
#define GF_BAR_OFF (GF_SUMS_OFF + 4 * GF_TILE * 4)
#define GF_SMEM (GF_BAR_OFF + 128 + 1024)       // and up to 1024 bytes to align the start
// FP8_GELU's largest K: beyond it the product's part outweighs the cast it saves, and cuBLASLt's
// product followed by the cast is faster (H100, the forward of a delayed, fast-dgrad fp8 step:
// gpt2-medium's K = 1024 19.0-19.1 ms with this form against 19.3 without, gpt2-large's K = 1280
// 20.8-20.9 against 20.3; bench/NOTES.md, twenty-fifth session)
#define GF_GELU_K_MAX 1024

// maps (hopper_tensor_map_2d): ma A8 and mb B8 in 128-row boxes, mpre pre (FP8_GELU's output,
// FP8_DGELU's input) in 128-row boxes of 64 columns, mrows rows and mcols cols in 128-row boxes;
// bias (N) or NULL (FP8_GELU), inv_a, inv_b, scale (s), record and colpart (FP8_DGELU) as above
template <int OP>
__global__ void __launch_bounds__(GF_THREADS, 1)
gemm_fp8_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                const __grid_constant__ CUtensorMap mpre, const __grid_constant__ CUtensorMap mrows,
                const __grid_constant__ CUtensorMap mcols, int M, int N, int K, const float *inv_a,
                const float *inv_b, const __nv_bfloat16 *bias, const float *scale, unsigned *record,
                float *colpart) {
    cuda_pdl_begin();
    constexpr bool DGELU = OP == FP8_DGELU;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023); // 1024-byte aligned: the swizzle's
    uint64_t *full = (uint64_t *)(sm + GF_BAR_OFF), *empty = full + GF_STAGES;
    // dfull: a tile's bf16(D) is in the buffer; dfree: the epilogue has read it (FP8_GELU: and pre's
    // stores have); prefull, prefree: the same for pre's tile (FP8_DGELU)
    uint64_t *dfull = empty + GF_STAGES, *dfree = dfull + 1, *prefull = dfree + 1, *prefree = prefull + 1;
    float *sums = (float *)(sm + GF_SUMS_OFF);
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int tiles_n = N / GF_TILE, tiles = M / GF_TILE * tiles_n, kblocks = K / GF_TILE;
    if (tid == 0) {
        for (int s = 0; s < GF_STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 2);
        mbar_init(dfull, 256), mbar_init(dfree, 256), mbar_init(prefull, 1), mbar_init(prefree, 256);
        mbar_fence_init();
    }
    __syncthreads();
    if (warp == 16) { // A and B, k-block after k-block of this block's tiles (q counts them)
        if (lane == 0)
            for (int t = blockIdx.x, q = 0; t < tiles; t += gridDim.x) {
                int m0 = t / tiles_n * GF_TILE, n0 = t % tiles_n * GF_TILE;
                for (int kb = 0; kb < kblocks; kb++, q++) {
                    int s = q % GF_STAGES;
                    if (q >= GF_STAGES) mbar_wait(&empty[s], (q / GF_STAGES - 1) & 1);
                    uint8_t *st = sm + s * 2 * GF_FP8_TILE;
                    mbar_expect(&full[s], 2 * GF_FP8_TILE);
                    tma_load_2d(st, &ma, kb * GF_TILE, m0, &full[s]);
                    tma_load_2d(st + GF_FP8_TILE, &mb, kb * GF_TILE, n0, &full[s]);
                }
            }
        return;
    }
    if (warp == 17) { // pre, a tile ahead of the epilogue
        if (DGELU && lane == 0)
            for (int t = blockIdx.x, n = 0; t < tiles; t += gridDim.x, n++) {
                int m0 = t / tiles_n * GF_TILE, n0 = t % tiles_n * GF_TILE;
                if (n > 0) mbar_wait(prefree, (n - 1) & 1);
                mbar_expect(prefull, GF_BF16_TILE);
                tma_load_2d(sm + GF_PRE_OFF, &mpre, n0, m0, prefull);
                tma_load_2d(sm + GF_PRE_OFF + GF_FP8_TILE, &mpre, n0 + 64, m0, prefull);
            }
        return;
    }
    if (warp < 8) { // the products
        int wg = warp / 4, w = warp % 4, g = lane / 4, t4 = lane % 4;
        float ab = *inv_a * *inv_b;
        uint8_t *db = sm + GF_D_OFF;
        for (int t = blockIdx.x, q = 0, n = 0; t < tiles; t += gridDim.x, n++) {
            float d[64];
            for (int kb = 0; kb < kblocks; kb++, q++) {
                int s = q % GF_STAGES;
                mbar_wait(&full[s], (q / GF_STAGES) & 1);
                uint8_t *st = sm + s * 2 * GF_FP8_TILE;
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < GF_TILE / 32; kk++)
                    wgmma_fp8_128<DGELU>(d, wg_desc(st + wg * 64 * GF_TILE + 32 * kk, 0),
                                         wg_desc(st + GF_FP8_TILE + 32 * kk, 0), kb > 0 || kk > 0);
                wg_commit();
                wg_wait<1>();
                wg_hold(d);
                if (kb > 0 && tid % 128 == 0) mbar_arrive(&empty[(q - 1) % GF_STAGES]);
            }
            wg_wait<0>();
            wg_hold(d);
            if (tid % 128 == 0) mbar_arrive(&empty[(q - 1) % GF_STAGES]);
            if (n >= 1) mbar_wait(dfree, (n - 1) & 1); // the epilogue is done with the last tile's D
            // row 64 wg + 16 w + g (+ 8 h), columns 8 i + 2 t4, +1: in the swizzled chunk (i % 8) ^ g
            int base = (wg * 64 + w * 16 + g) * 128 + (g << 4) + 4 * t4, n0 = t % tiles_n * GF_TILE;
            asm volatile("" : "+r"(base)); // one offset, not one a column kept across the tiles
#pragma unroll
            for (int i = 0; i < 16; i++) {
                float2 bi = !DGELU && bias ? __bfloat1622float2(*(const __nv_bfloat162 *)(bias + n0 + 8 * i + 2 * t4))
                                           : make_float2(0.0f, 0.0f);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float x0 = d[4 * i + 2 * h] * ab, x1 = d[4 * i + 2 * h + 1] * ab;
                    if (!DGELU && bias) x0 += bi.x, x1 += bi.y; // not + 0: -0 stays -0, as cuBLASLt leaves it
                    *(__nv_bfloat162 *)(db + (base ^ ((i & 7) << 4)) + (i >> 3) * GF_FP8_TILE + h * 1024) =
                        __floats2bfloat162_rn(x0, x1);
                }
            }
            if (!DGELU) fence_async_smem(); // pre is stored from the buffer by TMA
            mbar_arrive(dfull);
        }
        return;
    }
    // the epilogue: thread e takes the 8x8 block at rows 8 rb, columns 8 cb of the tile
    int e = tid - 256, ew = e / 32;
    int cb = ew % 2 * 8 + lane % 8, rb = ew / 2 * 4 + lane / 8;
    float s = *scale, m = 0.0f;
    const uint8_t *db = sm + GF_D_OFF, *pre = sm + GF_PRE_OFF;
    uint8_t *rows = sm + GF_ROWS_OFF, *cols = sm + GF_COLS_OFF;
    for (int t = blockIdx.x, n = 0; t < tiles; t += gridDim.x, n++) {
        int m0 = t / tiles_n * GF_TILE, n0 = t % tiles_n * GF_TILE;
        // row k of the block: in the buffers at dof + k*128, in the rows tile at rof + k*128, each in
        // the swizzled chunk ^ k; its column k in the cols tile at cof + k*128, chunk ^ k. Held, not
        // kept a row each across the tiles.
        int dof = cb / 8 * GF_FP8_TILE + rb * 1024 + ((cb & 7) << 4);
        int rof = rb * 1024 + ((cb >> 1) << 4) + (cb & 1) * 8, cof = cb * 1024 + ((rb >> 1) << 4) + (rb & 1) * 8;
        asm volatile("" : "+r"(dof), "+r"(rof), "+r"(cof));
        if (e == 0) bulk_wait_read(); // the last tile's stores have read the rows and cols tiles
        named_sync<256>(1);
        mbar_wait(dfull, n & 1);
        if (!DGELU && e == 0) {
            tma_store_2d(&mpre, n0, m0, db);
            tma_store_2d(&mpre, n0 + 64, m0, db + GF_FP8_TILE);
            bulk_commit();
        }
        if (DGELU) mbar_wait(prefull, n & 1);
        float cs[FP8_VEC] = {};
        uint32_t lo[FP8_VEC], hi[FP8_VEC]; // row k's bytes 0-3 and 4-7
#pragma unroll
        for (int k = 0; k < FP8_VEC; k++) {
            float x[FP8_VEC];
            int at = (dof ^ (k << 4)) + k * 128;
            uint4 dv = *(const uint4 *)(db + at);
            m = convert8<OP>(x, dv, DGELU ? *(const uint4 *)(pre + at) : dv, m);
            if (DGELU)
#pragma unroll
                for (int j = 0; j < FP8_VEC; j++) cs[j] += x[j];
            uint2 q = fp8_pack(x, s, DGELU ? __NV_E5M2 : __NV_E4M3);
            lo[k] = q.x, hi[k] = q.y;
            *(uint2 *)(rows + (rof ^ (k << 4)) + k * 128) = q;
        }
        if (!DGELU && e == 0) bulk_wait_read(); // pre's stores have read the buffer
        mbar_arrive(dfree);
        if (DGELU) mbar_arrive(prefree);
        transpose8x8(lo, hi);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            *(uint2 *)(cols + (cof ^ (j << 4)) + j * 128) = make_uint2(lo[j], lo[4 + j]);
            *(uint2 *)(cols + (cof ^ ((4 + j) << 4)) + (4 + j) * 128) = make_uint2(hi[j], hi[4 + j]);
        }
        if (DGELU) {
#pragma unroll
            for (int j = 0; j < FP8_VEC; j++) { // over the warp's 4 row blocks (lanes 8 apart), in a fixed order
                cs[j] += __shfl_xor_sync(0xffffffffu, cs[j], 8);
                cs[j] += __shfl_xor_sync(0xffffffffu, cs[j], 16);
            }
            if (lane < 8)
#pragma unroll
                for (int j = 0; j < FP8_VEC; j++) sums[ew / 2 * GF_TILE + 8 * cb + j] = cs[j];
        }
        fence_async_smem();
        named_sync<256>(1);
        if (DGELU && e < GF_TILE) {
            float total = 0.0f;
            for (int r = 0; r < 4; r++) total += sums[r * GF_TILE + e];
            colpart[(int64_t)(m0 / GF_TILE) * N + n0 + e] = total;
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

// Both forms: false, running nothing, without delayed scaling's scale and record, with M, N or K
// not a multiple of 128, or an operand not 16-byte aligned (the bias: 4-byte)
template <int OP>
static bool gemm_fp8(loom_cuda *cu, const uint8_t *a8, const float *inv_a, const uint8_t *b8, const float *inv_b,
                     const void *pre, const void *bias, int64_t M, int64_t N, int64_t K, uint8_t *rows, uint8_t *cols,
                     fp8_cast c, float *colpart) {
    bool aligned = (uintptr_t)a8 % 16 == 0 && (uintptr_t)b8 % 16 == 0 && (uintptr_t)pre % 16 == 0 &&
                   (uintptr_t)rows % 16 == 0 && (uintptr_t)cols % 16 == 0 && (uintptr_t)bias % 4 == 0;
    if (!c.scale || !c.record || M % GF_TILE || N % GF_TILE || K % GF_TILE || !aligned) return false;
    CUtensorMap ma = hopper_tensor_map_2d(a8, 1, M, K, GF_TILE), mb = hopper_tensor_map_2d(b8, 1, N, K, GF_TILE);
    CUtensorMap mpre = hopper_tensor_map_2d(pre, 2, M, N, GF_TILE);
    CUtensorMap mrows = hopper_tensor_map_2d(rows, 1, M, N, GF_TILE);
    CUtensorMap mcols = hopper_tensor_map_2d(cols, 1, N, M, GF_TILE);
    CUDA_CHECK(cudaFuncSetAttribute(gemm_fp8_kernel<OP>, cudaFuncAttributeMaxDynamicSharedMemorySize, GF_SMEM));
    int64_t tiles = M / GF_TILE * (N / GF_TILE);
    cuda_launch(cu->stream, gemm_fp8_kernel<OP>, (unsigned)(tiles < cu->sms ? tiles : cu->sms), GF_THREADS, GF_SMEM,
                ma, mb, mpre, mrows, mcols, (int)M, (int)N, (int)K, inv_a, inv_b, (const __nv_bfloat16 *)bias, c.scale,
                c.record, colpart);
    return true;
}

bool cuda_fp8_dgelu_gemm(loom_cuda *cu, const uint8_t *a8, const float *inv_a, const uint8_t *b8, const float *inv_b,
                         const void *pre, int64_t M, int64_t N, int64_t K, cuda_fp8_dgelu_out out) {
    return gemm_fp8<FP8_DGELU>(cu, a8, inv_a, b8, inv_b, pre, NULL, M, N, K, out.rows, out.cols, out.c, out.colpart);
}

bool cuda_fp8_gelu_gemm(loom_cuda *cu, const cuda_gemm *g, const uint8_t *w8, const float *inv_w, const uint8_t *in8,
                        const float *inv_in, uint8_t *rows, uint8_t *cols, fp8_cast c) {
    // cuBLASLt's D^T: pre (g->n, g->m) row-major = in (g->n, g->k) w^T + bias
    bool epilogue = g->epilogue == (g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    if (!epilogue || g->c || g->beta != 0.0f || g->ldd != g->m) return false; // the copies are dense, K-major
    if (g->k > GF_GELU_K_MAX) return false;
    return gemm_fp8<FP8_GELU>(cu, in8, inv_in, w8, inv_w, g->d, g->bias, g->n, g->m, g->k, rows, cols, c, NULL);
}
