// Causal attention backward on tensor cores for bf16, head size HS = 64 or 128, after
// FlashAttention-2 (Dao 2023, Algorithm 2): P is recomputed tile by tile from Q, K and the
// forward's lse, never stored. With D = rowsum(dO * O) (computed by the caller) and
// scores S = Q K^T / sqrt(HS):
//   P = exp(S - lse);  dP = dO V^T;  dS = P * (dP - D)
//   dV = P^T dO;  dK = dS^T Q / sqrt(HS);  dQ = dS K / sqrt(HS)
// Instead of FA2's atomic adds into dQ, two kernels each own what they write, so there are no
// atomics and the result is deterministic; each recomputes S and dP (about 1.4x the mma work):
//   dkv: one block per (key tile of 64, b, h), warp w owns keys k0+16w..+15 and keeps their
//        dK, dV in registers; it walks query tiles of 32 from k0 to T, computing S^T = K Q^T
//        and dP^T = V dO^T so that P^T and dS^T come out as A fragments for dV and dK.
//   dq:  one block per (query tile of 64, b, h), warp w owns queries q0+16w..+15 and keeps
//        dQ in registers; it walks key tiles of 32 from 0 to the diagonal.
// A block's own 64 rows of two tensors and the current 32 rows of two others sit in shared
// memory (52 KB at HS = 128: dynamic, opted in). Rows past T are zero and masked.
#include "backend/cuda/attention.cuh"

#define FB_OWN 64    // rows a block owns, 16 per warp
#define FB_STEP 32   // rows per streamed tile
#define FB_THREADS 128

struct fb_args {
    __nv_bfloat16 *dqkv;
    const __nv_bfloat16 *qkv, *dout;
    const float *lse, *D;
    int T, NH, BNH;
    float scale_log2, scale;
};

static size_t fb_smem_bytes(int hs) {
    return (size_t)(2 * FB_OWN + 2 * FB_STEP) * (hs + ATT_PAD) * sizeof(__nv_bfloat16) +
           2 * FB_STEP * sizeof(float);
}

template <int HS>
__global__ void __launch_bounds__(FB_THREADS) attention_backward_dkv_kernel(fb_args a) {
    constexpr int LD = HS + ATT_PAD, NT = HS / 8;
    extern __shared__ __align__(16) unsigned char fb_smem[];
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)fb_smem, *Vs = Ks + FB_OWN * LD;
    __nv_bfloat16 *Qs = Vs + FB_OWN * LD, *dOs = Qs + FB_STEP * LD;
    float *lse_s = (float *)(dOs + FB_STEP * LD), *D_s = lse_s + FB_STEP;
    att_place w = att_tile_place(a.T, a.NH, HS, a.BNH);
    int T = a.T, C = a.NH * HS, g = w.g, t = w.t;
    int64_t ld = 3 * (int64_t)C;
    const __nv_bfloat16 *q = a.qkv + w.qkv, *dout = a.dout + w.o;
    int k0 = w.tile * FB_OWN, kr0 = k0 + 16 * w.warp; // block's and warp's first key
    att_stage(Ks, q + C, ld, k0, FB_OWN, T, HS);
    att_stage(Vs, q + 2 * C, ld, k0, FB_OWN, T, HS);
    float dk[NT][4] = {}, dv[NT][4] = {};
    for (int q0 = k0; q0 < T; q0 += FB_STEP) {
        __syncthreads(); // the previous step's Qs/dOs are no longer read
        att_stage(Qs, q, ld, q0, FB_STEP, T, HS);
        att_stage(dOs, dout, C, q0, FB_STEP, T, HS);
        for (int i = threadIdx.x; i < FB_STEP; i += FB_THREADS) {
            bool in = q0 + i < T;
            lse_s[i] = in ? a.lse[(int64_t)w.bh * T + q0 + i] * ATT_LOG2E : 0.0f;
            D_s[i] = in ? a.D[(int64_t)w.bh * T + q0 + i] : 0.0f;
        }
        __syncthreads();
        float st[FB_STEP / 8][4] = {}, dpt[FB_STEP / 8][4] = {}; // S^T, dP^T (16 keys x 32 queries)
        mma_rows_by_rows<FB_STEP / 8, HS / 16>(st, Ks, 16 * w.warp, Qs, LD, g, t);
        mma_rows_by_rows<FB_STEP / 8, HS / 16>(dpt, Vs, 16 * w.warp, dOs, LD, g, t);
#pragma unroll
        for (int nt = 0; nt < FB_STEP / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = kr0 + g + 8 * (i >> 1), qi = 8 * nt + 2 * t + (i & 1), query = q0 + qi;
                float p = query >= key && query < T ? exp2f(st[nt][i] * a.scale_log2 - lse_s[qi]) : 0.0f;
                st[nt][i] = p;                           // P^T
                dpt[nt][i] = p * (dpt[nt][i] - D_s[qi]); // dS^T
            }
        mma_frags_by_rows<NT, FB_STEP / 16>(dv, st, dOs, LD, w.lane); // dV += P^T dO
        mma_frags_by_rows<NT, FB_STEP / 16>(dk, dpt, Qs, LD, w.lane); // dK += dS^T Q
    }
    att_store_rows<NT>(a.dqkv + w.qkv + C, ld, dk, a.scale, a.scale, kr0, T, g, t);
    att_store_rows<NT>(a.dqkv + w.qkv + 2 * C, ld, dv, 1.0f, 1.0f, kr0, T, g, t);
}

template <int HS>
__global__ void __launch_bounds__(FB_THREADS) attention_backward_dq_kernel(fb_args a) {
    constexpr int LD = HS + ATT_PAD, NT = HS / 8;
    extern __shared__ __align__(16) unsigned char fb_smem[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fb_smem, *dOs = Qs + FB_OWN * LD;
    __nv_bfloat16 *Ks = dOs + FB_OWN * LD, *Vs = Ks + FB_STEP * LD;
    att_place w = att_tile_place(a.T, a.NH, HS, a.BNH);
    int T = a.T, C = a.NH * HS, g = w.g, t = w.t;
    int64_t ld = 3 * (int64_t)C;
    const __nv_bfloat16 *q = a.qkv + w.qkv, *dout = a.dout + w.o;
    int q0 = w.tile * FB_OWN, qr0 = q0 + 16 * w.warp; // block's and warp's first query
    att_stage(Qs, q, ld, q0, FB_OWN, T, HS);
    att_stage(dOs, dout, C, q0, FB_OWN, T, HS);
    float lse_r[2], D_r[2]; // rows qr0 + g and qr0 + g + 8
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = qr0 + g + 8 * r;
        lse_r[r] = row < T ? a.lse[(int64_t)w.bh * T + row] * ATT_LOG2E : 0.0f;
        D_r[r] = row < T ? a.D[(int64_t)w.bh * T + row] : 0.0f;
    }
    float dq[NT][4] = {};
    int kend = min(q0 + FB_OWN, T);
    for (int k0 = 0; k0 < kend; k0 += FB_STEP) {
        __syncthreads(); // the previous step's Ks/Vs are no longer read
        att_stage(Ks, q + C, ld, k0, FB_STEP, T, HS);
        att_stage(Vs, q + 2 * C, ld, k0, FB_STEP, T, HS);
        __syncthreads();
        float s[FB_STEP / 8][4] = {}, dp[FB_STEP / 8][4] = {}; // S, dP (16 queries x 32 keys)
        mma_rows_by_rows<FB_STEP / 8, HS / 16>(s, Qs, 16 * w.warp, Ks, LD, g, t);
        mma_rows_by_rows<FB_STEP / 8, HS / 16>(dp, dOs, 16 * w.warp, Vs, LD, g, t);
#pragma unroll
        for (int nt = 0; nt < FB_STEP / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = qr0 + g + 8 * (i >> 1), key = k0 + 8 * nt + 2 * t + (i & 1);
                float p = key <= row && row < T ? exp2f(s[nt][i] * a.scale_log2 - lse_r[i >> 1]) : 0.0f;
                s[nt][i] = p * (dp[nt][i] - D_r[i >> 1]); // dS
            }
        mma_frags_by_rows<NT, FB_STEP / 16>(dq, s, Ks, LD, w.lane); // dQ += dS K
    }
    att_store_rows<NT>(a.dqkv + w.qkv, ld, dq, a.scale, a.scale, qr0, T, g, t);
}

template <int HS>
static void launch_backward_tc(loom_cuda *cu, const fb_args *a, unsigned grid) {
    int smem = (int)fb_smem_bytes(HS);
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dkv_kernel<HS>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dq_kernel<HS>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attention_backward_dkv_kernel<HS><<<grid, FB_THREADS, smem, cu->stream>>>(*a);
    CUDA_LAUNCH_CHECK();
    attention_backward_dq_kernel<HS><<<grid, FB_THREADS, smem, cu->stream>>>(*a);
    CUDA_LAUNCH_CHECK();
}

void attention_backward_tc(loom_cuda *cu, attn_dims d, __nv_bfloat16 *dqkv,
                           const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv, const float *lse,
                           const float *D) {
    int BNH = d.B * d.NH, ntiles = (d.T + FB_OWN - 1) / FB_OWN;
    float scale = 1.0f / sqrtf((float)d.hs);
    fb_args a = {dqkv, qkv, dout, lse, D, d.T, d.NH, BNH, scale * ATT_LOG2E, scale};
    if (d.hs == 64)
        launch_backward_tc<64>(cu, &a, (unsigned)(ntiles * BNH));
    else
        launch_backward_tc<128>(cu, &a, (unsigned)(ntiles * BNH));
}
