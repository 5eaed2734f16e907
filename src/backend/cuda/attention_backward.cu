// Attention backward (backend.h): dq +=, dkv += from dout (B,Tq,C) and the forward's q, kv, out
// and (merged) lse, recomputing the probabilities instead of storing them (Dao 2023):
//   D_i = dO_i . O_i;  P_ij = exp(s_ij - lse_i);  dS_ij = P_ij (dO_i . v_j - D_i)   (key j visible to i)
//   dq_i += sum_j dS_ij k_j / sqrt(hs);  dk_j += sum_i dS_ij q_i / sqrt(hs);  dv_j += sum_i P_ij dO_i
// bf16 with hs 64 or 128 runs on Hopper's tensor cores (attention_backward_wgmma.cu, whose prep kernel
// computes D). Everything else puts D in scratch first (one warp per row), then runs the two
// simple kernels here, one warp per row, as the simple forward: dq walks the keys [0, n) its query
// row i sees, dkv walks the queries [j - delta, Tq) that see its key row j. Each output element
// is written by one warp (no atomics), so the result is deterministic. Rows whose lse is -inf
// (they see no key) add nothing. The bias gradient (dbias) is summed from the fp32 values inside
// the Hopper kernels, else by the column sums (reduce.cu) of what was written.
#include "backend/cuda/attention.cuh"

#include <math.h>

#define AB_WARPS 4 // rows per block
#define AB_MAX_HS 512

// D (B,NH,Tq): one warp per (b, h, i)
__global__ void attention_backward_d_kernel(float *D, const void *dout, const void *out, int T, int NH, int hs,
                                            int64_t rows, bool bf) {
    cuda_pdl_begin();
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

struct ab_args {
    void *dq, *dkv;
    const void *dout, *q, *kv;
    const float *lse, *D;
    attn_dims d;
    float scale;
    bool bf;
};

// One warp per query row i: dq_i. Shared per warp: q_i, dO_i, the dq accumulator, 32 dS values.
__global__ void attention_backward_dq_simple_kernel(ab_args a) {
    cuda_pdl_begin();
    extern __shared__ float ab_smem[];
    const attn_dims &d = a.d;
    att_place w = att_row_place(d, AB_WARPS);
    int i = w.tile, lane = w.lane, hs = d.hs, C = d.C; // this warp's query row
    if (i >= d.Tq) return;
    float *qs = ab_smem + w.warp * (3 * hs + 32), *dos = qs + hs, *acc = dos + hs, *ds = acc + hs;
    int64_t ldk = d.ldk, q_row = w.q + (int64_t)i * d.ldq, o_off = w.o + (int64_t)i * C;
    bool bf = a.bf;
    for (int c = lane; c < hs; c += 32) {
        qs[c] = ldx(a.q, q_row + c, bf);
        dos[c] = ldx(a.dout, o_off + c, bf);
        acc[c] = 0.0f;
    }
    __syncwarp();
    float l = a.lse[(int64_t)w.bh * d.Tq + i], Di = a.D[(int64_t)w.bh * d.Tq + i];
    int nvis = l == -INFINITY ? 0 : att_visible(d, i);
    for (int j0 = 0; j0 < nvis; j0 += 32) {
        int j = j0 + lane;
        float dsj = 0.0f;
        if (j < nvis) {
            float p = expf(a.scale * dot_row(qs, a.kv, w.k + j * ldk, hs, bf) - l);
            dsj = p * (dot_row(dos, a.kv, w.k + C + j * ldk, hs, bf) - Di);
        }
        ds[lane] = dsj;
        __syncwarp();
        int n = min(32, nvis - j0);
        for (int c = lane; c < hs; c += 32) {
            float x = acc[c];
            for (int jj = 0; jj < n; jj++) x += ds[jj] * ldx(a.kv, w.k + (j0 + jj) * ldk + c, bf);
            acc[c] = x;
        }
        __syncwarp();
    }
    for (int c = lane; c < hs; c += 32)
        stx(a.dq, q_row + c, (a.d.add ? ldx(a.dq, q_row + c, bf) : 0.0f) + a.scale * acc[c], bf);
}

// One warp per key row j: dk_j and dv_j. Shared per warp: k_j, v_j, two accumulators, 32 P and
// 32 dS values.
__global__ void attention_backward_dkv_simple_kernel(ab_args a) {
    cuda_pdl_begin();
    extern __shared__ float ab_smem[];
    const attn_dims &d = a.d;
    att_place w = att_row_place(d, AB_WARPS);
    int j = w.tile, lane = w.lane, hs = d.hs, C = d.C; // this warp's key row
    if (j >= d.Tk) return;
    float *ks = ab_smem + w.warp * (4 * hs + 64), *vs = ks + hs, *dk = vs + hs, *dv = dk + hs;
    float *ps = dv + hs, *ds = ps + 32;
    int64_t ldq = d.ldq, k_row = w.k + (int64_t)j * d.ldk;
    const float *lse = a.lse + (int64_t)w.bh * d.Tq, *D = a.D + (int64_t)w.bh * d.Tq;
    bool bf = a.bf;
    for (int c = lane; c < hs; c += 32) {
        ks[c] = ldx(a.kv, k_row + c, bf);
        vs[c] = ldx(a.kv, k_row + C + c, bf);
        dk[c] = dv[c] = 0.0f;
    }
    __syncwarp();
    int first = min(max(j - d.delta, 0), d.Tq); // the first query that sees key j
    for (int i0 = first; i0 < d.Tq; i0 += 32) {
        int i = i0 + lane;
        float p = 0.0f, dsi = 0.0f;
        if (i < d.Tq && lse[i] != -INFINITY) {
            p = expf(a.scale * dot_row(ks, a.q, w.q + i * ldq, hs, bf) - lse[i]);
            dsi = p * (dot_row(vs, a.dout, w.o + (int64_t)i * C, hs, bf) - D[i]);
        }
        ps[lane] = p;
        ds[lane] = dsi;
        __syncwarp();
        int n = min(32, d.Tq - i0);
        for (int c = lane; c < hs; c += 32) {
            float ak = dk[c], av = dv[c];
            for (int ii = 0; ii < n; ii++) {
                av += ps[ii] * ldx(a.dout, w.o + (int64_t)(i0 + ii) * C + c, bf);
                ak += ds[ii] * ldx(a.q, w.q + (i0 + ii) * ldq + c, bf);
            }
            dk[c] = ak;
            dv[c] = av;
        }
        __syncwarp();
    }
    for (int c = lane; c < hs; c += 32) {
        int64_t kc = k_row + c, vc = k_row + C + c;
        stx(a.dkv, kc, (a.d.add ? ldx(a.dkv, kc, bf) : 0.0f) + a.scale * dk[c], bf);
        stx(a.dkv, vc, (a.d.add ? ldx(a.dkv, vc, bf) : 0.0f) + dv[c], bf);
    }
}

extern "C" void cuda_attention_backward(loom_backend *be, loom_tensor dq, loom_tensor dkv, loom_tensor dbias,
                                        loom_tensor dout, loom_tensor q, loom_tensor kv, loom_tensor out,
                                        loom_tensor lse, int NH, loom_attn_span span) {
    loom_cuda *cu = cuda_of(be);
    attn_dims d = attn_check(be, out, lse, q, kv, NH, span);
    bool bf = be->dtype == LOOM_BF16;
    LOOM_CHECK(cuda_act(be, dq) == bf && cuda_act(be, dkv) == bf && cuda_act(be, dout) == bf);
    LOOM_CHECK(loom_numel(&dq) == loom_numel(&q) && loom_numel(&dkv) == loom_numel(&kv) &&
               loom_numel(&dout) == loom_numel(&out));
    if (dbias.data) LOOM_CHECK(!span.accumulate && cuda_act(be, dbias) == bf && loom_numel(&dbias) == 3 * d.C);
    int64_t rows = (int64_t)d.B * d.NH * d.Tq;
    const float *l = (const float *)lse.data;
    if (!d.add && d.delta < d.Tk - d.Tq) { // some key row no query sees, which the kernels skip: zero, then add
        size_t es = bf ? 2 : 4;
        CUDA_CHECK(cudaMemset2DAsync(dq.data, (size_t)d.ldq * es, 0, (size_t)d.C * es, (size_t)d.B * d.Tq, cu->stream));
        CUDA_CHECK(cudaMemset2DAsync((char *)dkv.data + (size_t)(d.ldk - 2 * d.C) * es, (size_t)d.ldk * es, 0,
                                     2 * (size_t)d.C * es, (size_t)d.B * d.Tk, cu->stream));
        d.add = 1;
    }
    if (attn_use_wgmma(be, d) && attn_aligned16(q.data) && attn_aligned16(kv.data) && attn_aligned16(dq.data) &&
        attn_aligned16(dkv.data) && attn_aligned16(dout.data) && attn_aligned16(out.data)) { // computes D itself
        attention_backward_wgmma(cu, d, (__nv_bfloat16 *)dq.data, (__nv_bfloat16 *)dkv.data,
                                 (const __nv_bfloat16 *)dout.data, (const __nv_bfloat16 *)q.data,
                                 (const __nv_bfloat16 *)kv.data, (const __nv_bfloat16 *)out.data, l,
                                 (__nv_bfloat16 *)dbias.data,
                                 cuda_scratch(cu, attention_backward_wgmma_scratch(d)));
        return;
    }
    float *D = (float *)cuda_scratch(cu, (size_t)rows * sizeof(float));
    cuda_launch(cu->stream, attention_backward_d_kernel, (unsigned)((rows + AB_WARPS - 1) / AB_WARPS), 32 * AB_WARPS, 0,
                D, dout.data, out.data, d.Tq, d.NH, d.hs, rows, bf);
    LOOM_CHECK(d.hs <= AB_MAX_HS);
    ab_args a = {dq.data, dkv.data, dout.data, q.data, kv.data, l, D, d, 1.0f / sqrtf((float)d.hs), bf};
    unsigned BNH = (unsigned)(d.B * d.NH);
    cuda_launch(cu->stream, attention_backward_dq_simple_kernel,
                dim3((unsigned)((d.Tq + AB_WARPS - 1) / AB_WARPS), BNH), 32 * AB_WARPS,
                (size_t)AB_WARPS * (3 * d.hs + 32) * sizeof(float), a);
    cuda_launch(cu->stream, attention_backward_dkv_simple_kernel,
                dim3((unsigned)((d.Tk + AB_WARPS - 1) / AB_WARPS), BNH), 32 * AB_WARPS,
                (size_t)AB_WARPS * (4 * d.hs + 64) * sizeof(float), a);
    if (dbias.data) { // written (not accumulated): the column sums of dq's q columns, then of dkv's k, v columns
        size_t es = bf ? 2 : 4;
        cuda_column_sums(cu, dbias.data, dq.data, (int64_t)d.B * d.Tq, d.C, d.ldq, bf, !be->grads_write);
        cuda_column_sums(cu, (char *)dbias.data + (size_t)d.C * es, (char *)dkv.data + (size_t)(d.ldk - 2 * d.C) * es,
                         (int64_t)d.B * d.Tk, 2 * d.C, d.ldk, bf, !be->grads_write);
    }
}
