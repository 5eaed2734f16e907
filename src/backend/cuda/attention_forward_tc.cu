// Causal attention forward on tensor cores, FlashAttention-2 (Dao 2023, Algorithm 1) for bf16
// with head size HS = 64 or 128: bf16 mma.sync m16n8k16 with fp32 accumulation; the (T,T)
// scores exist only as one 64x64 tile in registers at a time.
//
// One block of 4 warps per (query tile of 64 rows, b, h); warp w owns query rows q0+16w..+15.
// Its Q fragments stay in registers; the block walks the key tiles [0, q0 + 64) in steps of 64,
// staging K and V (64 x HS each) in shared memory. Per key tile, per warp:
//   S = Q K^T (16 x 64, fp32), scaled by log2(e)/sqrt(HS), causal mask (key > query: -inf)
//   online softmax in base 2: m' = max(m, rowmax S); P = 2^(S - m'); l = l 2^(m-m') + rowsum P;
//   O = O 2^(m-m') + P V, with P rounded to bf16 as the A operand (straight from registers)
// At the end O /= l, and lse = (m + log2 l) ln 2 (natural log, as backend.h wants).
// Rows past T (the last tile when T is not a multiple of 64) read zero rows and are not stored;
// keys past T are always masked, because key > query for every query row < T.
#include "backend/cuda/attention.cuh"

#define FA_ROWS 64  // query rows per block, 16 per warp
#define FA_KEYS 64  // keys per tile
#define FA_THREADS 128

template <int HS>
__global__ void __launch_bounds__(FA_THREADS)
attention_forward_tc_kernel(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int T, int NH,
                            int BNH, float scale_log2) {
    constexpr int LD = HS + ATT_PAD, KS = HS / 16, NT = HS / 8;
    __shared__ __align__(16) __nv_bfloat16 Ks[FA_KEYS * LD], Vs[FA_KEYS * LD];
    att_place w = att_tile_place(T, NH, HS, BNH);
    int g = w.g, t = w.t, C = NH * HS;
    int64_t ld = 3 * (int64_t)C;
    const __nv_bfloat16 *q = qkv + w.qkv, *k = q + C, *v = q + 2 * C;
    int q0 = w.tile * FA_ROWS, r0 = q0 + 16 * w.warp; // block's and warp's first query row

    uint32_t qf[KS][4]; // this warp's 16 x HS queries as A fragments
    att_stage(Ks, q, ld, q0, FA_ROWS, T, HS);
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < KS; ks++) lds_frag_a(qf[ks], Ks, LD, 16 * w.warp, 16 * ks, g, t);

    float o[NT][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int kend = min(q0 + FA_ROWS, T); // keys [0, kend) are visible to some row of the block
    for (int k0 = 0; k0 < kend; k0 += FA_KEYS) {
        __syncthreads(); // everyone is done with the previous tile (and with Q in Ks)
        att_stage(Ks, k, ld, k0, FA_KEYS, T, HS);
        att_stage(Vs, v, ld, k0, FA_KEYS, T, HS);
        __syncthreads();
        float s[FA_KEYS / 8][4] = {};
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int nt = 0; nt < FA_KEYS / 8; nt++)
                mma_bf16(s[nt], qf[ks], lds_pair(Ks, (8 * nt + g) * LD + 16 * ks + 2 * t),
                         lds_pair(Ks, (8 * nt + g) * LD + 16 * ks + 2 * t + 8));
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < FA_KEYS / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = r0 + g + 8 * (i >> 1), key = k0 + 8 * nt + 2 * t + (i & 1);
                s[nt][i] = key <= row ? s[nt][i] * scale_log2 : -INFINITY;
                mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
            }
        float corr[2], msub[2];
#pragma unroll
        for (int r = 0; r < 2; r++) { // a row's 64 scores are spread over the 4 lanes of a quad
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mnew = fmaxf(m[r], mx[r]);
            msub[r] = mnew == -INFINITY ? 0.0f : mnew; // a row with nothing visible yet
            corr[r] = exp2f(m[r] - msub[r]);
            m[r] = mnew;
            l[r] *= corr[r];
        }
#pragma unroll
        for (int nt = 0; nt < FA_KEYS / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                s[nt][i] = exp2f(s[nt][i] - msub[i >> 1]);
                l[i >> 1] += s[nt][i];
            }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) o[nt][i] *= corr[i >> 1];
        mma_frags_by_rows<NT, FA_KEYS / 16>(o, s, Vs, LD, w.lane); // O += P V
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        int row = r0 + g + 8 * r;
        if (t == 0 && row < T) lse[(int64_t)w.bh * T + row] = (m[r] + log2f(l[r])) * ATT_LN2;
    }
    att_store_rows<NT>(out + w.o, C, o, 1.0f / l[0], 1.0f / l[1], r0, T, g, t);
}

void attention_forward_tc(loom_cuda *cu, attn_dims d, __nv_bfloat16 *out, float *lse,
                          const __nv_bfloat16 *qkv) {
    int BNH = d.B * d.NH, ntiles = (d.T + FA_ROWS - 1) / FA_ROWS;
    float scale_log2 = ATT_LOG2E / sqrtf((float)d.hs);
    unsigned grid = (unsigned)(ntiles * BNH);
    if (d.hs == 64)
        attention_forward_tc_kernel<64><<<grid, FA_THREADS, 0, cu->stream>>>(out, lse, qkv, d.T, d.NH, BNH, scale_log2);
    else
        attention_forward_tc_kernel<128><<<grid, FA_THREADS, 0, cu->stream>>>(out, lse, qkv, d.T, d.NH, BNH, scale_log2);
    CUDA_LAUNCH_CHECK();
}
