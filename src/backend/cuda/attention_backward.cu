// Causal attention backward (backend.h): dqkv (B,T,3C) from dout (B,T,C) and the forward's
// qkv, out and lse, recomputing the probabilities instead of storing them (Dao 2023):
//   D_i = dO_i . O_i;  P_ij = exp(s_ij - lse_i);  dS_ij = P_ij (dO_i . v_j - D_i)   (j <= i)
//   dq_i = sum_j dS_ij k_j / sqrt(hs);  dk_j = sum_i dS_ij q_i / sqrt(hs);  dv_j = sum_i P_ij dO_i
// bf16 with hs 64 or 128 runs on tensor cores (attention_backward_tc.cu, whose dq kernel also
// computes D). Everything else puts D in scratch first (one warp per row), then runs the two
// simple kernels here, one warp per row, as the simple forward: dq walks keys [0, i] for its
// query row i, dkv walks queries [j, T) for its key row j. Each output element is written by
// one warp (no atomics), so the result is deterministic.
#include "backend/cuda/attention.cuh"

#include <math.h>

#define AB_WARPS 4 // rows per block
#define AB_MAX_HS 512

// D (B,NH,T): one warp per (b, h, i)
__global__ void attention_backward_d_kernel(float *D, const void *dout, const void *out, int T,
                                            int NH, int hs, int64_t rows, bool bf) {
    int64_t r = (int64_t)blockIdx.x * AB_WARPS + threadIdx.x / 32;
    if (r >= rows) return;
    int lane = threadIdx.x % 32, i = (int)(r % T), bh = (int)(r / T), b = bh / NH, h = bh % NH;
    int64_t off = ((int64_t)b * T + i) * NH * hs + h * hs;
    float s = 0.0f;
    for (int c = lane; c < hs; c += 32) s += ldx(dout, off + c, bf) * ldx(out, off + c, bf);
    s = warp_sum(s);
    if (lane == 0) D[r] = s;
}

// sum over c of x[c] * y[off + c]
__device__ __forceinline__ float dot_row(const float *x, const void *y, int64_t off, int hs, bool bf) {
    float s = 0.0f;
    for (int c = 0; c < hs; c++) s += x[c] * ldx(y, off + c, bf);
    return s;
}

// One warp per query row i: dq_i. Shared per warp: q_i, dO_i, the dq accumulator, 32 dS values.
__global__ void attention_backward_dq_simple_kernel(void *dqkv, const void *dout, const void *qkv,
                                                    const float *lse, const float *D, int T, int NH,
                                                    int hs, float scale, bool bf) {
    extern __shared__ float ab_smem[];
    att_place w = att_row_place(T, NH, hs, AB_WARPS);
    int i = w.tile, lane = w.lane, bh = w.bh, C = NH * hs; // this warp's query row
    if (i >= T) return;
    float *qs = ab_smem + w.warp * (3 * hs + 32), *dos = qs + hs, *acc = dos + hs, *ds = acc + hs;
    int64_t ld = 3 * (int64_t)C, q_off = w.qkv, k_off = q_off + C, o_off = w.o + (int64_t)i * C;
    for (int c = lane; c < hs; c += 32) {
        qs[c] = ldx(qkv, q_off + i * ld + c, bf);
        dos[c] = ldx(dout, o_off + c, bf);
        acc[c] = 0.0f;
    }
    __syncwarp();
    float l = lse[(int64_t)bh * T + i], Di = D[(int64_t)bh * T + i];
    for (int j0 = 0; j0 <= i; j0 += 32) {
        int j = j0 + lane;
        float d = 0.0f;
        if (j <= i) {
            float p = expf(scale * dot_row(qs, qkv, k_off + j * ld, hs, bf) - l);
            d = p * (dot_row(dos, qkv, k_off + C + j * ld, hs, bf) - Di);
        }
        ds[lane] = d;
        __syncwarp();
        int n = min(32, i - j0 + 1);
        for (int c = lane; c < hs; c += 32) {
            float a = acc[c];
            for (int jj = 0; jj < n; jj++) a += ds[jj] * ldx(qkv, k_off + (j0 + jj) * ld + c, bf);
            acc[c] = a;
        }
        __syncwarp();
    }
    for (int c = lane; c < hs; c += 32) stx(dqkv, q_off + i * ld + c, scale * acc[c], bf);
}

// One warp per key row j: dk_j and dv_j. Shared per warp: k_j, v_j, two accumulators, 32 P and
// 32 dS values.
__global__ void attention_backward_dkv_simple_kernel(void *dqkv, const void *dout, const void *qkv,
                                                     const float *lse, const float *D, int T, int NH,
                                                     int hs, float scale, bool bf) {
    extern __shared__ float ab_smem[];
    att_place w = att_row_place(T, NH, hs, AB_WARPS);
    int j = w.tile, lane = w.lane, bh = w.bh, C = NH * hs; // this warp's key row
    if (j >= T) return;
    float *ks = ab_smem + w.warp * (4 * hs + 64), *vs = ks + hs, *dk = vs + hs, *dv = dk + hs;
    float *ps = dv + hs, *ds = ps + 32;
    int64_t ld = 3 * (int64_t)C, q_off = w.qkv, o_off = w.o;
    int64_t k_row = q_off + C + j * ld;
    for (int c = lane; c < hs; c += 32) {
        ks[c] = ldx(qkv, k_row + c, bf);
        vs[c] = ldx(qkv, k_row + C + c, bf);
        dk[c] = dv[c] = 0.0f;
    }
    __syncwarp();
    for (int i0 = j; i0 < T; i0 += 32) {
        int i = i0 + lane;
        float p = 0.0f, d = 0.0f;
        if (i < T) {
            p = expf(scale * dot_row(ks, qkv, q_off + i * ld, hs, bf) - lse[(int64_t)bh * T + i]);
            d = p * (dot_row(vs, dout, o_off + (int64_t)i * C, hs, bf) - D[(int64_t)bh * T + i]);
        }
        ps[lane] = p;
        ds[lane] = d;
        __syncwarp();
        int n = min(32, T - i0);
        for (int c = lane; c < hs; c += 32) {
            float ak = dk[c], av = dv[c];
            for (int ii = 0; ii < n; ii++) {
                av += ps[ii] * ldx(dout, o_off + (int64_t)(i0 + ii) * C + c, bf);
                ak += ds[ii] * ldx(qkv, q_off + (i0 + ii) * ld + c, bf);
            }
            dk[c] = ak;
            dv[c] = av;
        }
        __syncwarp();
    }
    for (int c = lane; c < hs; c += 32) {
        stx(dqkv, k_row + c, scale * dk[c], bf);
        stx(dqkv, k_row + C + c, dv[c], bf);
    }
}

extern "C" void cuda_attention_backward(loom_backend *be, loom_tensor dqkv, loom_tensor dout,
                                        loom_tensor qkv, loom_tensor out, loom_tensor lse, int NH) {
    loom_cuda *cu = cuda_of(be);
    attn_dims d = attn_check(be, qkv, out, lse, NH);
    bool bf = be->dtype == LOOM_BF16;
    LOOM_CHECK(cuda_act(be, dqkv) == bf && cuda_act(be, dout) == bf);
    LOOM_CHECK(loom_numel(&dqkv) == loom_numel(&qkv) && loom_numel(&dout) == loom_numel(&out));
    int64_t rows = (int64_t)d.B * d.NH * d.T;
    float *D = (float *)cuda_scratch(cu, (size_t)rows * sizeof(float));
    const float *l = (const float *)lse.data;
    if (attn_use_tc(be, d) && attn_aligned16(qkv.data) && attn_aligned16(dqkv.data) &&
        attn_aligned16(dout.data) && attn_aligned16(out.data)) { // computes D itself
        attention_backward_tc(cu, d, (__nv_bfloat16 *)dqkv.data, (const __nv_bfloat16 *)dout.data,
                              (const __nv_bfloat16 *)qkv.data, (const __nv_bfloat16 *)out.data, l, D);
        return;
    }
    attention_backward_d_kernel<<<(unsigned)((rows + AB_WARPS - 1) / AB_WARPS), 32 * AB_WARPS, 0,
                                  cu->stream>>>(D, dout.data, out.data, d.T, d.NH, d.hs, rows, bf);
    CUDA_LAUNCH_CHECK();
    LOOM_CHECK(d.hs <= AB_MAX_HS);
    dim3 grid((unsigned)((d.T + AB_WARPS - 1) / AB_WARPS), (unsigned)(d.B * d.NH));
    float scale = 1.0f / sqrtf((float)d.hs);
    attention_backward_dq_simple_kernel<<<grid, 32 * AB_WARPS,
                                          (size_t)AB_WARPS * (3 * d.hs + 32) * sizeof(float),
                                          cu->stream>>>(dqkv.data, dout.data, qkv.data, l, D, d.T,
                                                        d.NH, d.hs, scale, bf);
    CUDA_LAUNCH_CHECK();
    attention_backward_dkv_simple_kernel<<<grid, 32 * AB_WARPS,
                                           (size_t)AB_WARPS * (4 * d.hs + 64) * sizeof(float),
                                           cu->stream>>>(dqkv.data, dout.data, qkv.data, l, D, d.T,
                                                         d.NH, d.hs, scale, bf);
    CUDA_LAUNCH_CHECK();
}
