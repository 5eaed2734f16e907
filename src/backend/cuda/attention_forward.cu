// Attention forward (backend.h): out (B,Tq,C) = softmax(q k^T / sqrt(hs)) v per head over the keys
// each query row sees, and lse (B,NH,Tq) fp32, without the (Tq,Tk) matrix; and the merge of two
// partial results by their lse.
// bf16 with hs 64 or 128 runs on Hopper's tensor cores (attention_forward_wgmma.cu). Everything else (fp32
// mode, other head sizes) runs the simple kernel here: one warp per query row i, walking its
// visible keys [0, n) 32 at a time (a key per lane) with an online softmax (Milakov & Gimelshein
// 2018):
//   s_j = q.k_j / sqrt(hs); m' = max(m, max_j s_j); l = l e^(m-m') + sum_j e^(s_j - m');
//   o = o e^(m-m') + sum_j e^(s_j - m') v_j        then out = o / l, lse = m + log l
// (a row that sees no key: out = 0, lse = -inf). The warp keeps q and o in shared memory (lane c
// owns channels c, c+32, ...), so any head size works; fp32 arithmetic throughout, expf/logf as
// the CPU reference.
#include "backend/cuda/attention.cuh"

#include <math.h>

#define AS_WARPS 4 // query rows per block
#define AS_MAX_HS 512

__global__ void attention_forward_simple_kernel(void *out, float *lse, const void *q, const void *kv, attn_dims d,
                                                float scale, bool bf) {
    cuda_pdl_begin();
    extern __shared__ float as_smem[]; // per warp: q (hs), o (hs), p (32)
    att_place w = att_row_place(d, AS_WARPS);
    int i = w.tile, lane = w.lane, hs = d.hs, C = d.C; // this warp's query row
    if (i >= d.Tq) return;
    float *qs = as_smem + w.warp * (2 * hs + 32), *os = qs + hs, *ps = os + hs;
    int64_t ldk = d.ldk, k_off = w.k, v_off = w.k + C;
    for (int c = lane; c < hs; c += 32) {
        qs[c] = ldx(q, w.q + (int64_t)i * d.ldq + c, bf);
        os[c] = 0.0f;
    }
    __syncwarp();
    float m = -INFINITY, l = 0.0f;
    int nvis = att_visible(d, i);
    for (int j0 = 0; j0 < nvis; j0 += 32) {
        int j = j0 + lane;
        float s = -INFINITY;
        if (j < nvis) {
            float dot = 0.0f;
            for (int c = 0; c < hs; c++) dot += qs[c] * ldx(kv, k_off + j * ldk + c, bf);
            s = scale * dot;
        }
        float mnew = fmaxf(m, warp_max(s)); // finite: key j0 < nvis is visible
        float corr = expf(m - mnew), p = j < nvis ? expf(s - mnew) : 0.0f;
        l = l * corr + warp_sum(p);
        m = mnew;
        ps[lane] = p;
        __syncwarp();
        int n = min(32, nvis - j0);
        for (int c = lane; c < hs; c += 32) {
            float acc = os[c] * corr;
            for (int jj = 0; jj < n; jj++) acc += ps[jj] * ldx(kv, v_off + (j0 + jj) * ldk + c, bf);
            os[c] = acc;
        }
        __syncwarp();
    }
    for (int c = lane; c < hs; c += 32) stx(out, w.o + (int64_t)i * C + c, nvis ? os[c] / l : 0.0f, bf);
    if (lane == 0) lse[(int64_t)w.bh * d.Tq + i] = nvis ? m + logf(l) : -INFINITY;
}

extern "C" void cuda_attention_forward(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor q,
                                       loom_tensor kv, int NH, loom_attn_span span) {
    loom_cuda *cu = cuda_of(be);
    attn_dims d = attn_check(be, out, lse, q, kv, NH, span);
    if (attn_use_wgmma(be, d) && attn_aligned16(q.data) && attn_aligned16(kv.data) && attn_aligned16(out.data)) {
        attention_forward_wgmma(cu, d, (__nv_bfloat16 *)out.data, (float *)lse.data, (const __nv_bfloat16 *)q.data,
                                (const __nv_bfloat16 *)kv.data);
        return;
    }
    LOOM_CHECK(d.hs <= AS_MAX_HS);
    dim3 grid((unsigned)((d.Tq + AS_WARPS - 1) / AS_WARPS), (unsigned)(d.B * d.NH));
    size_t smem = (size_t)AS_WARPS * (2 * d.hs + 32) * sizeof(float);
    cuda_launch(cu->stream, attention_forward_simple_kernel, grid, 32 * AS_WARPS, smem, out.data, (float *)lse.data,
                q.data, kv.data, d, 1.0f / sqrtf((float)d.hs), be->dtype == LOOM_BF16);
}

// One warp per (b, h, t) row of lse: every lane reads both lse values before lane 0 writes the merged one.
__global__ void attention_merge_kernel(void *out, float *lse, const void *out_part, const float *lse_part, int T,
                                       int NH, int hs, int64_t rows, bool bf) {
    cuda_pdl_begin();
    int64_t r = (int64_t)blockIdx.x * AS_WARPS + threadIdx.x / 32;
    if (r >= rows) return;
    int lane = threadIdx.x % 32, t = (int)(r % T), bh = (int)(r / T), b = bh / NH, h = bh % NH;
    float a = lse[r], p = lse_part[r], m = fmaxf(a, p);
    __syncwarp();
    if (m == -INFINITY) return; // neither side sees a key
    float wa = expf(a - m), wp = expf(p - m), inv = 1.0f / (wa + wp);
    int64_t off = ((int64_t)b * T + t) * NH * hs + h * hs;
    for (int c = lane; c < hs; c += 32)
        stx(out, off + c, (wa * ldx(out, off + c, bf) + wp * ldx(out_part, off + c, bf)) * inv, bf);
    if (lane == 0) lse[r] = m + logf(wa + wp);
}

extern "C" void cuda_attention_merge(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor out_part,
                                     loom_tensor lse_part, int NH) {
    LOOM_CHECK(out.ndim == 3 && NH > 0 && out.shape[2] % NH == 0);
    int64_t B = out.shape[0], T = out.shape[1], C = out.shape[2], rows = B * NH * T;
    bool bf = cuda_act(be, out);
    LOOM_CHECK(cuda_act(be, out_part) == bf && loom_numel(&out_part) == B * T * C);
    LOOM_CHECK(loom_numel(&lse) == rows && loom_numel(&lse_part) == rows);
    cuda_launch(cuda_of(be)->stream, attention_merge_kernel, (unsigned)((rows + AS_WARPS - 1) / AS_WARPS),
                32 * AS_WARPS, 0, out.data, cuda_f32(lse), out_part.data, cuda_f32(lse_part), (int)T, NH, (int)(C / NH),
                rows, bf);
}
