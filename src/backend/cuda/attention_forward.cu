// Causal multi-head attention forward (backend.h): out (B,T,C) = softmax(q k^T / sqrt(hs)) v
// per head with the causal mask, and lse (B,NH,T) fp32, without the (T,T) matrix.
// bf16 with hs 64 or 128 runs on tensor cores (attention_forward_tc.cu). Everything else (fp32
// mode, other head sizes) runs the simple kernel here: one warp per query row i, walking keys
// [0, i] 32 at a time (a key per lane) with an online softmax (Milakov & Gimelshein 2018):
//   s_j = q.k_j / sqrt(hs); m' = max(m, max_j s_j); l = l e^(m-m') + sum_j e^(s_j - m');
//   o = o e^(m-m') + sum_j e^(s_j - m') v_j        then out = o / l, lse = m + log l
// The warp keeps q and o in shared memory (lane c owns channels c, c+32, ...), so any head
// size works; fp32 arithmetic throughout, expf/logf as the CPU reference.
#include "backend/cuda/attention.cuh"

#include <math.h>

#define AS_WARPS 4 // query rows per block
#define AS_MAX_HS 512

__global__ void attention_forward_simple_kernel(void *out, float *lse, const void *qkv, int T,
                                                int NH, int hs, float scale, bool bf) {
    extern __shared__ float as_smem[]; // per warp: q (hs), o (hs), p (32)
    att_place w = att_row_place(T, NH, hs, AS_WARPS);
    int i = w.tile, lane = w.lane, C = NH * hs; // this warp's query row
    if (i >= T) return;
    float *qs = as_smem + w.warp * (2 * hs + 32), *os = qs + hs, *ps = os + hs;
    int64_t ld = 3 * (int64_t)C, q_off = w.qkv, k_off = q_off + C, v_off = q_off + 2 * C;
    for (int c = lane; c < hs; c += 32) {
        qs[c] = ldx(qkv, q_off + i * ld + c, bf);
        os[c] = 0.0f;
    }
    __syncwarp();
    float m = -INFINITY, l = 0.0f;
    for (int j0 = 0; j0 <= i; j0 += 32) {
        int j = j0 + lane;
        float s = -INFINITY;
        if (j <= i) {
            float dot = 0.0f;
            for (int c = 0; c < hs; c++) dot += qs[c] * ldx(qkv, k_off + j * ld + c, bf);
            s = scale * dot;
        }
        float mnew = fmaxf(m, warp_max(s)); // finite: key j0 <= i is visible
        float corr = expf(m - mnew), p = j <= i ? expf(s - mnew) : 0.0f;
        l = l * corr + warp_sum(p);
        m = mnew;
        ps[lane] = p;
        __syncwarp();
        int n = min(32, i - j0 + 1);
        for (int c = lane; c < hs; c += 32) {
            float acc = os[c] * corr;
            for (int jj = 0; jj < n; jj++) acc += ps[jj] * ldx(qkv, v_off + (j0 + jj) * ld + c, bf);
            os[c] = acc;
        }
        __syncwarp();
    }
    for (int c = lane; c < hs; c += 32) stx(out, w.o + (int64_t)i * C + c, os[c] / l, bf);
    if (lane == 0) lse[(int64_t)w.bh * T + i] = m + logf(l);
}

extern "C" void cuda_attention_forward(loom_backend *be, loom_tensor out, loom_tensor lse,
                                       loom_tensor qkv, int NH) {
    loom_cuda *cu = cuda_of(be);
    attn_dims d = attn_check(be, qkv, out, lse, NH);
    if (attn_use_tc(be, d) && attn_aligned16(qkv.data) && attn_aligned16(out.data)) {
        attention_forward_tc(cu, d, (__nv_bfloat16 *)out.data, (float *)lse.data,
                             (const __nv_bfloat16 *)qkv.data);
        return;
    }
    LOOM_CHECK(d.hs <= AS_MAX_HS);
    dim3 grid((unsigned)((d.T + AS_WARPS - 1) / AS_WARPS), (unsigned)(d.B * d.NH));
    size_t smem = (size_t)AS_WARPS * (2 * d.hs + 32) * sizeof(float);
    attention_forward_simple_kernel<<<grid, 32 * AS_WARPS, smem, cu->stream>>>(
        out.data, (float *)lse.data, qkv.data, d.T, d.NH, d.hs, 1.0f / sqrtf((float)d.hs),
        be->dtype == LOOM_BF16);
    CUDA_LAUNCH_CHECK();
}
