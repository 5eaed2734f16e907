// The output layer's input-gradient product with the cross-entropy's backward in its prologue,
// timed against cuBLASLt's product of the dlogits the cross-entropy writes (a design probe that
// loom does not use: bench/NOTES.md, twenty-fifth session, has why).
//   dX (M, N) bf16 = dlogits (M, K) W (K, N),  dlogits[r][k] = dl (exp(logits[r][k] - lse[r]) - [k == tgt[r]])
//   on k < V, 0 on [V, K): logits (M, K) bf16 as the logits product writes them (K = Vp, the padded
//   vocabulary), W (K, N) bf16 the tied embedding (Vp x C), lse as the cross-entropy's (m, log s).
// Turning each k-block of logits into dlogits inside the product would spare the cross-entropy's
// second pass (a read and a write of M K bf16), provided the product keeps its pace. Forms timed:
// - ce_gemm_kernel: the consumers' register A fragments (ldmatrix, then the formula, then wgmma
//   m64n256k16 from registers), MODE 0 exact, 1 identity (the product's own pace), 2 with one
//   bf16x2 ex2 for two exponentials, 3 with every second exponential by a polynomial;
// - ce_gemm_tw_kernel: the formula applied in place in shared memory by three warps of their own,
//   the consumers reading the stage by descriptors.
// Each writes bf16 dX (split 1) or fp32 partials of k-splits added in order (split 2).
// Usage, on a GPU: bench_ce_gemm [M N] (default 8192 768, gpt2's chunk of rows and C).
#include "bench_gemm.cuh"

#define CG_BM 128
#define CG_BN 256
#define CG_BK 64
#define CG_STAGES 4
#define CG_A_BYTES (CG_BM * 128)          // 16 KB
#define CG_B_BYTES (4 * CG_BK * 128)      // four 64 x 64 tiles, 32 KB
#define CG_STAGE_BYTES (CG_A_BYTES + CG_B_BYTES)
#define CG_BAR_OFF (CG_STAGES * CG_STAGE_BYTES)
#define CG_SMEM (CG_BAR_OFF + 128 + 1024)
#define CG_THREADS 384
#define LOG2E 1.4426950408889634f
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

struct ce_row { float m, c, dl; int tgt; }; // max, log s * log2 e, dloss, target

// 2^x by a degree-3 polynomial on the FMA pipe (FlashAttention-4's trick; relative error 7.7e-5)
__device__ __forceinline__ float ex2_poly(float x) {
    x = fmaxf(x, -126.0f);
    float t = x + 12582912.0f, j = t - 12582912.0f, f = x - j; // j = rint(x), f in [-0.5, 0.5]
    float p = fmaf(fmaf(fmaf(0.05508868f, f, 0.24260405f), f, 0.69327624f), f, 0.99992894f);
    return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}
__device__ __forceinline__ uint32_t ex2_bf16x2(uint32_t x) {
    uint32_t y;
    asm("ex2.approx.ftz.bf16x2 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// MODE 0: the cross-entropy's backward; 1: identity (A = logits, the product's own pace);
// 2: as 0 with both exponentials by one bf16x2 ex2; 3: as 0 with the second by the polynomial
template <int MODE, bool EDGE>
__device__ __forceinline__ uint32_t ce_pair(uint32_t raw, const ce_row &r, int k, int V) {
    if (MODE == 1) return raw;
    float x0 = __uint_as_float(raw << 16), x1 = __uint_as_float(raw & 0xffff0000u);
    float a0 = fmaf(x0 - r.m, LOG2E, -r.c), a1 = fmaf(x1 - r.m, LOG2E, -r.c), p0, p1;
    if (MODE == 2) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a0, a1);
        uint32_t e = ex2_bf16x2(*(uint32_t *)&h);
        p0 = __uint_as_float(e << 16), p1 = __uint_as_float(e & 0xffff0000u);
    } else {
        p0 = ex2(a0), p1 = MODE == 3 ? ex2_poly(a1) : ex2(a1);
    }
    float v0, v1;
    if (!EDGE) {
        v0 = r.dl * p0, v1 = r.dl * p1;
    } else {
        v0 = k >= V ? 0.0f : r.dl * (p0 - (k == r.tgt ? 1.0f : 0.0f));
        v1 = k + 1 >= V ? 0.0f : r.dl * (p1 - (k + 1 == r.tgt ? 1.0f : 0.0f));
    }
    __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
    return *(uint32_t *)&h;
}

// The fragments of k-block kb's four k16 steps, transformed (rows r0 = g, r1 = g + 8 of the warp)
template <int MODE>
__device__ __forceinline__ void load_a(uint32_t (&a)[4][4], const uint8_t *As, int wrow, int lane, int k0,
                                       const ce_row &r0, const ce_row &r1, int V) {
    int q = lane / 8, rr = lane % 8, row = wrow + (q & 1) * 8 + rr;
    const uint8_t *base = As + row * 128;
    int t = lane % 4;
    bool edge = k0 + CG_BK > V || (unsigned)(r0.tgt - k0) < (unsigned)CG_BK ||
                (unsigned)(r1.tgt - k0) < (unsigned)CG_BK;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t raw[4];
        int chunk = 2 * kk + (q >> 1);
        ldsm_x4(raw, base + ((chunk ^ rr) << 4));
        int k = k0 + 16 * kk + 2 * t;
        if (MODE != 1 && edge) {
            a[kk][0] = ce_pair<MODE, true>(raw[0], r0, k, V);
            a[kk][1] = ce_pair<MODE, true>(raw[1], r1, k, V);
            a[kk][2] = ce_pair<MODE, true>(raw[2], r0, k + 8, V);
            a[kk][3] = ce_pair<MODE, true>(raw[3], r1, k + 8, V);
        } else {
            a[kk][0] = ce_pair<MODE, false>(raw[0], r0, k, V);
            a[kk][1] = ce_pair<MODE, false>(raw[1], r1, k, V);
            a[kk][2] = ce_pair<MODE, false>(raw[2], r0, k + 8, V);
            a[kk][3] = ce_pair<MODE, false>(raw[3], r1, k + 8, V);
        }
    }
}

// A warp's 64 x 256 accumulators into out (S == 1, bf16) or split sp's fp32 partials in ws: d[4i + e]
// is row `row` + 8 (e >> 1), column col + 8 i + (e & 1)
__device__ __forceinline__ void store_tile(const float (&d)[128], __nv_bfloat16 *out, float *ws, int M, int N, int S,
                                           int sp, int row, int col) {
#pragma unroll
    for (int i = 0; i < 32; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int64_t at = (int64_t)(row + 8 * h) * N + col + 8 * i;
            if (S == 1)
                *(__nv_bfloat162 *)(out + at) = __floats2bfloat162_rn(d[4 * i + 2 * h], d[4 * i + 2 * h + 1]);
            else
                *(float2 *)(ws + (int64_t)sp * M * N + at) = make_float2(d[4 * i + 2 * h], d[4 * i + 2 * h + 1]);
        }
}

// Work unit u: tile (u / S) of the M/128 x N/256 tiles, split u % S of the k-blocks.
// S == 1: out (M, N) bf16; S > 1: ws (S, M, N) fp32 partials.
template <int MODE>
__global__ void __launch_bounds__(CG_THREADS, 1)
ce_gemm_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb, int M, int N, int K,
               int V, int S, const ce_row *rows, __nv_bfloat16 *out, float *ws) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    uint64_t *full = (uint64_t *)(sm + CG_BAR_OFF), *empty = full + CG_STAGES;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int tiles_n = N / CG_BN, units = M / CG_BM * tiles_n * S, kblocks = K / CG_BK;
    if (tid == 0) {
        for (int s = 0; s < CG_STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 2);
        mbar_fence_init();
    }
    __syncthreads();
    if (warp < 4) { // the producer warpgroup: warp 0 issues the copies
        wg_regs_down<24>();
        if (warp == 0 && lane == 0)
            for (int u = blockIdx.x, q = 0; u < units; u += gridDim.x) {
                int tile = u / S, sp = u % S, m0 = tile / tiles_n * CG_BM, n0 = tile % tiles_n * CG_BN;
                int kb0 = (int)((int64_t)kblocks * sp / S), kb1 = (int)((int64_t)kblocks * (sp + 1) / S);
                for (int kb = kb0; kb < kb1; kb++, q++) {
                    int s = q % CG_STAGES;
                    if (q >= CG_STAGES) mbar_wait(&empty[s], (q / CG_STAGES - 1) & 1);
                    uint8_t *st = sm + s * CG_STAGE_BYTES;
                    mbar_expect(&full[s], CG_STAGE_BYTES);
                    tma_load_2d(st, &ma, kb * CG_BK, m0, &full[s]);
                    for (int j = 0; j < 4; j++)
                        tma_load_2d(st + CG_A_BYTES + j * CG_BK * 128, &mb, n0 + 64 * j, kb * CG_BK, &full[s]);
                }
            }
        return;
    }
    wg_regs_up<240>();
    int wg = warp / 4 - 1, w = warp % 4, g = lane / 4, t4 = lane % 4;
    int wrow = wg * 64 + w * 16; // the warp's first row in the tile
    for (int u = blockIdx.x, q = 0; u < units; u += gridDim.x) {
        int tile = u / S, sp = u % S, m0 = tile / tiles_n * CG_BM, n0 = tile % tiles_n * CG_BN;
        int kb0 = (int)((int64_t)kblocks * sp / S), kb1 = (int)((int64_t)kblocks * (sp + 1) / S);
        ce_row r0 = rows[m0 + wrow + g], r1 = rows[m0 + wrow + g + 8];
        float d[128];
        uint32_t fa[4][4], fb[4][4];
        auto stage = [&](int qq) { return sm + (qq % CG_STAGES) * CG_STAGE_BYTES; };
        auto issue = [&](uint32_t(&a)[4][4], int qq, bool first) {
            uint8_t *st = stage(qq);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                wgmma_bf16<256>::rs(d, a[kk], wg_desc(st + CG_A_BYTES + kk * 16 * 128, CG_BK * 128), !first || kk > 0);
            wg_commit();
        };
        int n = kb1 - kb0;
        // k-block j's products from `cur` while k-block j + 1's fragments go into `next`; then
        // `cur` is retired and its stage released. The two buffers alternate (unrolled by two, so
        // that each stays in registers).
        auto step = [&](uint32_t(&cur)[4][4], uint32_t(&next)[4][4], int j) {
            issue(cur, q + j, j == 0);
            if (j + 1 < n) {
                mbar_wait(&full[(q + j + 1) % CG_STAGES], ((q + j + 1) / CG_STAGES) & 1);
                load_a<MODE>(next, stage(q + j + 1), wrow, lane, (kb0 + j + 1) * CG_BK, r0, r1, V);
            }
            wg_wait<0>();
            wg_hold(d);
            wg_hold(cur);
            if (tid % 128 == 0) mbar_arrive(&empty[(q + j) % CG_STAGES]);
        };
        mbar_wait(&full[q % CG_STAGES], (q / CG_STAGES) & 1);
        load_a<MODE>(fa, stage(q), wrow, lane, kb0 * CG_BK, r0, r1, V);
        for (int i = 0; i < n; i += 2) {
            step(fa, fb, i);
            if (i + 1 < n) step(fb, fa, i + 1);
        }
        q += n;
        store_tile(d, out, ws, M, N, S, sp, m0 + wrow + g, n0 + 2 * t4);
    }
}


// The same product with the prologue in warps of its own: warp 0 copies (TMA) GF-style a ring of
// TW_STAGES stages ahead; warps 1-3 turn each stage's logits tile into dlogits in place (same
// swizzled layout, element by element: 16-byte chunk t of the tile's 1,024 to thread t % 96);
// warpgroups 1-2 run the products from shared memory. TRANSFORM false: the products read the
// logits tile itself (the plain product's pace), warps 1-3 idle.
#define TW_STAGES 4
#define TW_STAGE_BYTES (CG_A_BYTES + CG_B_BYTES)
#define TW_BAR_OFF (TW_STAGES * TW_STAGE_BYTES)
#define TW_SMEM (TW_BAR_OFF + 128 + 1024)
#define TW_XT 96 // prologue threads
template <bool TRANSFORM>
__global__ void __launch_bounds__(CG_THREADS, 1)
ce_gemm_tw_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb, int M, int N, int K,
                  int V, int S, const ce_row *__restrict__ rows, __nv_bfloat16 *out, float *ws) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    uint64_t *full = (uint64_t *)(sm + TW_BAR_OFF), *empty = full + TW_STAGES, *tfull = empty + TW_STAGES;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int tiles_n = N / CG_BN, units = M / CG_BM * tiles_n * S, kblocks = K / CG_BK;
    if (tid == 0) {
        for (int s = 0; s < TW_STAGES; s++)
            mbar_init(&full[s], 1), mbar_init(&empty[s], 2), mbar_init(&tfull[s], TW_XT);
        mbar_fence_init();
    }
    __syncthreads();
    struct span_t { int u, m0, n0, kb0, kb1, sp; };
    auto span = [&](int u) {
        span_t c;
        int tile = u / S;
        c.u = u, c.sp = u % S, c.m0 = tile / tiles_n * CG_BM, c.n0 = tile % tiles_n * CG_BN;
        c.kb0 = (int)((int64_t)kblocks * c.sp / S), c.kb1 = (int)((int64_t)kblocks * (c.sp + 1) / S);
        return c;
    };
    if (warp == 0) {
        if (lane == 0)
            for (int u = blockIdx.x, q = 0; u < units; u += gridDim.x) {
                span_t c = span(u);
                for (int kb = c.kb0; kb < c.kb1; kb++, q++) {
                    int s = q % TW_STAGES;
                    if (q >= TW_STAGES) mbar_wait(&empty[s], (q / TW_STAGES - 1) & 1);
                    uint8_t *st = sm + s * TW_STAGE_BYTES;
                    mbar_expect(&full[s], TW_STAGE_BYTES);
                    tma_load_2d(st, &ma, kb * CG_BK, c.m0, &full[s]);
                    for (int j = 0; j < 4; j++)
                        tma_load_2d(st + CG_A_BYTES + j * CG_BK * 128, &mb, c.n0 + 64 * j, kb * CG_BK, &full[s]);
                }
            }
        return;
    }
    if (warp < 4) {
        if (!TRANSFORM) return;
        constexpr int JOBS = (CG_BM * 8 + TW_XT - 1) / TW_XT; // 16-byte chunks a thread, at most
        int x = tid - 32;
        for (int u = blockIdx.x, q = 0; u < units; u += gridDim.x) {
            span_t c = span(u);
            for (int kb = c.kb0; kb < c.kb1; kb++, q++) {
                int s = q % TW_STAGES, k0 = kb * CG_BK;
                uint8_t *st = sm + s * TW_STAGE_BYTES;
                mbar_wait(&full[s], (q / TW_STAGES) & 1);
                uint4 v[JOBS];
#pragma unroll
                for (int i = 0; i < JOBS; i++) {
                    int t = x + TW_XT * i, row = t / 8, ch = t % 8;
                    if (t < CG_BM * 8) v[i] = *(const uint4 *)(st + row * 128 + ((ch ^ (row & 7)) << 4));
                }
#pragma unroll
                for (int i = 0; i < JOBS; i++) {
                    int t = x + TW_XT * i, row = t / 8, ch = t % 8, k = k0 + 8 * ch;
                    if (t >= CG_BM * 8) continue;
                    ce_row r = rows[c.m0 + row];
                    uint32_t *p = (uint32_t *)&v[i];
                    if (k + 8 > V || (unsigned)(r.tgt - k) < 8u)
#pragma unroll
                        for (int j = 0; j < 4; j++) p[j] = ce_pair<0, true>(p[j], r, k + 2 * j, V);
                    else
#pragma unroll
                        for (int j = 0; j < 4; j++) p[j] = ce_pair<0, false>(p[j], r, k + 2 * j, V);
                    *(uint4 *)(st + row * 128 + ((ch ^ (row & 7)) << 4)) = v[i];
                }
                fence_async_smem();
                mbar_arrive(&tfull[s]);
            }
        }
        return;
    }
    int wg = warp / 4 - 1, w = warp % 4, g = lane / 4, t4 = lane % 4;
    int wrow = wg * 64 + w * 16;
    for (int u = blockIdx.x, q = 0; u < units; u += gridDim.x) {
        span_t c = span(u);
        float d[128];
        for (int kb = c.kb0; kb < c.kb1; kb++, q++) {
            int s = q % TW_STAGES;
            uint8_t *st = sm + s * TW_STAGE_BYTES;
            mbar_wait(TRANSFORM ? &tfull[s] : &full[s], (q / TW_STAGES) & 1);
            const uint8_t *a = st + wg * 64 * 128;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                wgmma_bf16<256>::ss<1>(d, wg_desc(a + 32 * kk, 0),
                                       wg_desc(st + CG_A_BYTES + kk * 16 * 128, CG_BK * 128), kb > c.kb0 || kk > 0);
            wg_commit();
            wg_wait<1>();
            wg_hold(d);
            if (kb > c.kb0 && tid % 128 == 0) mbar_arrive(&empty[(q - 1) % TW_STAGES]);
        }
        wg_wait<0>();
        wg_hold(d);
        if (tid % 128 == 0) mbar_arrive(&empty[(q - 1) % TW_STAGES]);
        store_tile(d, out, ws, M, N, S, c.sp, c.m0 + wrow + g, c.n0 + 2 * t4);
    }
}

__global__ void splits_sum(__nv_bfloat16 *out, const float *ws, int64_t MN, int S) {
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= MN) return;
    float4 s = *(const float4 *)(ws + i);
    for (int p = 1; p < S; p++) {
        float4 v = *(const float4 *)(ws + p * MN + i);
        s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    *(__nv_bfloat162 *)(out + i) = __floats2bfloat162_rn(s.x, s.y);
    *(__nv_bfloat162 *)(out + i + 2) = __floats2bfloat162_rn(s.z, s.w);
}

// The cross-entropy's first pass, one block a row (plain: not timed against anything)
__global__ void ce_pass1(ce_row *rows, const __nv_bfloat16 *logits, const int *tgt, int K, int V, float dl) {
    int r = blockIdx.x;
    const __nv_bfloat16 *x = logits + (int64_t)r * K;
    __shared__ float red[32];
    float m = -INFINITY;
    for (int k = threadIdx.x; k < V; k += blockDim.x) m = fmaxf(m, __bfloat162float(x[k]));
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
    __syncthreads();
    m = -INFINITY;
    for (int i = 0; i < (int)blockDim.x / 32; i++) m = fmaxf(m, red[i]);
    __syncthreads();
    float s = 0.0f;
    for (int k = threadIdx.x; k < V; k += blockDim.x) s += expf(__bfloat162float(x[k]) - m);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        s = 0.0f;
        for (int i = 0; i < (int)blockDim.x / 32; i++) s += red[i];
        rows[r] = ce_row{m, logf(s) * LOG2E, dl, tgt[r]};
    }
}

// The cross-entropy's second pass as a kernel of its own (what the fused product removes): dlogits
// from logits, 8 elements a thread, the prologue's formula
__global__ void ce_pass2(__nv_bfloat16 *dlog, const __nv_bfloat16 *logits, const ce_row *rows, int64_t M, int K,
                         int V) {
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= M * K) return;
    int64_t r = i / K;
    int k = (int)(i % K);
    ce_row rr = rows[r];
    uint4 v = *(const uint4 *)(logits + i);
    uint32_t *p = (uint32_t *)&v;
    bool edge = k + 8 > V || (unsigned)(rr.tgt - k) < 8u;
    for (int j = 0; j < 4; j++)
        p[j] = edge ? ce_pair<0, true>(p[j], rr, k + 2 * j, V) : ce_pair<0, false>(p[j], rr, k + 2 * j, V);
    *(uint4 *)(dlog + i) = v;
}

int main(int argc, char **argv) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "bench_ce_gemm: no CUDA device\n");
        return 77;
    }
    int M = argc > 1 ? atoi(argv[1]) : 8192, N = argc > 2 ? atoi(argv[2]) : 768;
    int V = 50257, K = 50304;
    int sms;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    size_t MK = (size_t)M * K, KN = (size_t)K * N, MN = (size_t)M * N;
    std::vector<__nv_bfloat16> hl(MK), hw(KN);
    for (size_t i = 0; i < MK; i++) hl[i] = __float2bfloat16(3.0f * frand());
    for (size_t i = 0; i < KN; i++) hw[i] = __float2bfloat16((size_t)(i / N) < (size_t)V ? 0.05f * frand() : 0.0f);
    std::vector<int> ht(M);
    for (int r = 0; r < M; r++) ht[r] = (int)((frand() + 1.0f) * 0.5f * V) % V;
    __nv_bfloat16 *logits, *dlog, *W, *dx_lt, *dx_f, *dx_id, *dx_ltid;
    float *ws;
    int *tgt;
    ce_row *rows;
    CUDA_CHECK(cudaMalloc(&logits, MK * 2));
    CUDA_CHECK(cudaMalloc(&dlog, MK * 2));
    CUDA_CHECK(cudaMalloc(&W, KN * 2));
    CUDA_CHECK(cudaMalloc(&dx_lt, MN * 2));
    CUDA_CHECK(cudaMalloc(&dx_f, MN * 2));
    CUDA_CHECK(cudaMalloc(&dx_id, MN * 2));
    CUDA_CHECK(cudaMalloc(&dx_ltid, MN * 2));
    CUDA_CHECK(cudaMalloc(&ws, 4 * MN * 4));
    CUDA_CHECK(cudaMalloc(&tgt, M * 4));
    CUDA_CHECK(cudaMalloc(&rows, M * sizeof(ce_row)));
    CUDA_CHECK(cudaMemcpy(logits, hl.data(), MK * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(W, hw.data(), KN * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(tgt, ht.data(), M * 4, cudaMemcpyHostToDevice));
    float dl = 1.0f / (float)M;
    ce_pass1<<<M, 512>>>(rows, logits, tgt, K, V, dl);
    auto pass2 = [&] { ce_pass2<<<(unsigned)((MK / 8 + 255) / 256), 256>>>(dlog, logits, rows, M, K, V); };
    pass2();
    CUDA_CHECK(cudaDeviceSynchronize());
    lt_gemm g;
    lt_init(g, M, N, K, 1);
    double flop = 2.0 * M * N * (double)K;
    printf("M %d N %d K %d, %d cuBLASLt candidates\n", M, N, K, g.nalgo);
    float t2 = time_us(pass2);
    printf("%-44s %9.1f us  %6.2f TB/s\n", "cross-entropy pass 2 alone (read + write)", t2, 2.0 * MK * 2 / t2 / 1e6);
    float best = lt_best(g, W, dlog, dx_lt);
    int ba = g.best;
    float t_lt0 = time_us([&] { lt_run(g, 0, W, dlog, dx_lt); });
    printf("%-44s %9.1f us  %6.1f TFLOP/s (best of %d: %.1f us, #%d)\n", "cuBLASLt dlogits W (heuristic's first)",
           t_lt0,
           flop / t_lt0 / 1e6, g.nalgo, best, ba);
    lt_run(g, ba, W, dlog, dx_lt);
    lt_run(g, ba, W, logits, dx_ltid);
    CUtensorMap ma = hopper_tensor_map_2d(logits, 2, M, K, CG_BM), mb = hopper_tensor_map_2d(W, 2, K, N, CG_BK);
    CUDA_CHECK(cudaFuncSetAttribute(ce_gemm_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, CG_SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(ce_gemm_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, CG_SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(ce_gemm_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, CG_SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(ce_gemm_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, CG_SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(ce_gemm_tw_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, TW_SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(ce_gemm_tw_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, TW_SMEM));
    std::vector<float> ref = to_host(dx_lt, MN), refid = to_host(dx_ltid, MN);
    for (int S = 1; S <= 2; S++) {
        int units = M / CG_BM * (N / CG_BN) * S, grid = units < sms ? units : sms;
        auto fused = [&](int mode, __nv_bfloat16 *o) {
            if (mode == 0) ce_gemm_kernel<0><<<grid, CG_THREADS, CG_SMEM>>>(ma, mb, M, N, K, V, S, rows, o, ws);
            else if (mode == 1) ce_gemm_kernel<1><<<grid, CG_THREADS, CG_SMEM>>>(ma, mb, M, N, K, V, S, rows, o, ws);
            else if (mode == 2) ce_gemm_kernel<2><<<grid, CG_THREADS, CG_SMEM>>>(ma, mb, M, N, K, V, S, rows, o, ws);
            else ce_gemm_kernel<3><<<grid, CG_THREADS, CG_SMEM>>>(ma, mb, M, N, K, V, S, rows, o, ws);
            if (S > 1) splits_sum<<<(unsigned)((MN / 4 + 255) / 256), 256>>>(o, ws, (int64_t)MN, S);
        };
        fused(0, dx_f);
        fused(1, dx_id);
        CUDA_CHECK(cudaDeviceSynchronize());
        double e = rel_diff(to_host(dx_f, MN), ref), eid = rel_diff(to_host(dx_id, MN), refid);
        float tf = time_us([&] { fused(0, dx_f); }), ti = time_us([&] { fused(1, dx_id); });
        printf("split %d (%d units): fused %9.1f us %6.1f TFLOP/s (err %.2e) | identity %9.1f us %6.1f TFLOP/s "
               "(err %.2e)\n",
               S, units, tf, flop / tf / 1e6, e, ti, flop / ti / 1e6, eid);
        for (int tr = 1; tr >= 0; tr--) {
            auto run = [&] {
                if (tr) ce_gemm_tw_kernel<true><<<grid, CG_THREADS, TW_SMEM>>>(ma, mb, M, N, K, V, S, rows, dx_id, ws);
                else ce_gemm_tw_kernel<false><<<grid, CG_THREADS, TW_SMEM>>>(ma, mb, M, N, K, V, S, rows, dx_id, ws);
                if (S > 1) splits_sum<<<(unsigned)((MN / 4 + 255) / 256), 256>>>(dx_id, ws, (int64_t)MN, S);
            };
            run();
            CUDA_CHECK(cudaDeviceSynchronize());
            double em = rel_diff(to_host(dx_id, MN), tr ? ref : refid);
            float tm = time_us(run);
            printf("    %-36s %9.1f us %6.1f TFLOP/s (err %.2e)\n",
                   tr ? "prologue warps" : "prologue warps' plain product",
                   tm, flop / tm / 1e6, em);
        }
        for (int mode = 2; mode <= 3; mode++) {
            fused(mode, dx_id);
            CUDA_CHECK(cudaDeviceSynchronize());
            double em = rel_diff(to_host(dx_id, MN), ref);
            float tm = time_us([&] { fused(mode, dx_id); });
            printf("    %-36s %9.1f us %6.1f TFLOP/s (err %.2e)\n",
                   mode == 2 ? "bf16x2 ex2" : "half the ex2 by polynomial",
                   tm, flop / tm / 1e6, em);
        }
    }
    printf("saved if fused: pass 2 %.1f us + cuBLASLt %.1f us (best) = %.1f us against the fused product\n", t2, best,
           t2 + best);
    return 0;
}
