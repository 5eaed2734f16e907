// Attention backward on Hopper (sm_90a) for bf16 with head size HS = 64 or 128: FlashAttention-2's
// (Dao 2023, Algorithm 2) as two kernels that each own what they write, instead of atomic adds
// into dQ, so that the result is deterministic (each recomputes S and dP: 7 tile products per
// pair of tiles instead of 5), on warpgroup products in the block skeleton of attention_wgmma.cuh
// (a producer warp copying by TMA, two consumer warpgroups of 64 own rows each; FlashAttention-3,
// Shah et al. 2024). With D = rowsum(dO * O), S = Q K^T:
//   P = exp(S / sqrt(HS) - lse);  dP = dO V^T;  dS = P * (dP - D)
//   dV += P^T dO;  dK += dS^T Q / sqrt(HS);  dQ += dS K / sqrt(HS)
// (written, or with span.accumulate added to what dq and dkv hold).
//   dq (runs first): work item (query tile of 128, b, h); owns Q and dO; computes D for its rows
//       from dO and O in global memory and writes it for dkv; streams key tiles (bw_dq_step) from
//       0 to the keys its last row sees: S = Q K^T and dP = dO V^T (both operands in shared
//       memory, K-major), dQ += dS K (dS as register fragments, K N-major).
//   dkv: work item (key tile of 128, b, h); owns K and V; streams query tiles of 64 from the
//       first query that sees the tile's first key (k0 - delta) to Tq: S^T = K Q^T and
//       dP^T = V dO^T, so that P^T and dS^T are register fragments for dV += P^T dO and
//       dK += dS^T Q (Q and dO N-major).
// The mask (key > query + delta, key >= Tk) is applied only on tiles crossing a warpgroup's
// diagonal or the keys' end; tiles wholly masked for a warpgroup are skipped. Rows past Tq or Tk
// arrive as zeros; queries past Tq and rows whose lse is -inf get P = 0; rows past the ends are
// not stored.
#include "backend/cuda/attention_wgmma.cuh"

#define BW_STEP 64  // streamed rows a tile of dkv (queries)
// keys a streamed tile of dq: 128 at HS = 64 (fewer, larger products), 64 at 128 (registers)
__host__ __device__ constexpr int bw_dq_step(int hs) { return hs == 64 ? 128 : 64; }
#define BW_STAGES 2

struct bw_args {
    bf16 *dq, *dkv;
    const bf16 *dout, *out;
    const float *lse;
    float *D;
    int *counter; // 2 ints: the dq and dkv kernels' handed-out work items
    attn_dims d;
    float sl2, scale; // log2(e)/sqrt(HS), 1/sqrt(HS)
};

// -lse log2(e): the exponent offset of P = 2^(s sl2 - lse log2(e)); -inf (P = 0) where lse is -inf
__device__ __forceinline__ float bw_neg_lse2(float lse) { return lse == -INFINITY ? -INFINITY : -lse * ATT_LOG2E; }

template <int HS>
__global__ void __launch_bounds__(ATT_WG_THREADS, 1)
attention_backward_dq_wgmma_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mdo,
                                   const __grid_constant__ CUtensorMap mkv, bw_args a) {
    extern __shared__ unsigned char bw_raw[];
    constexpr int DQ_STEP = bw_dq_step(HS);
    const att_smem<HS, 2, DQ_STEP, BW_STAGES> sm(bw_raw);
    const attn_dims &d = a.d;
    int Tq = d.Tq, ntiles = (Tq + ATT_WG_ROWS - 1) / ATT_WG_ROWS, total = ntiles * d.B * d.NH;
    // an item's copies: its Q and dO tiles (rows q0..), then the K and V tiles its last row sees
    auto plan = [&](int item) {
        att_place p = att_tile_at(d, item, ntiles, true);
        int h = p.bh % d.NH, q0 = p.tile * ATT_WG_ROWS, kcol = d.ldk - 2 * d.C + h * HS;
        int nst = (att_visible(d, min(q0 + ATT_WG_ROWS, Tq) - 1) + DQ_STEP - 1) / DQ_STEP;
        return att_job{{{&mq, h * HS}, {&mdo, h * HS}}, {{&mkv, kcol}, {&mkv, kcol + d.C}}, q0, 0, nst, p.bh / d.NH};
    };
    if (sm.producer(total, a.counter, plan)) return;
    int w = threadIdx.x / 128 - 1; // the consumer warpgroup (0 or 1)
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int j = 0; // key tiles of the block's earlier items
    for (int k = 0, item; (item = sm.next_item(k, total)) < total; k++) {
        att_place p = att_tile_at(d, item, ntiles, true);
        att_job job = plan(item);
        int q0 = job.own_row, nst = job.n;
        int r0 = q0 + 64 * w, rw = att_wg_row(r0); // the warpgroup's first row; the thread's rows rw, rw + 8
        // D of row r0 + tid/2 from half a row of dO and O each (lanes 2x, 2x+1 of a warp share row x)
        int drow = r0 + threadIdx.x % 128 / 2;
        float dsum = 0.0f;
        if (drow < Tq) {
            const uint4 *op = (const uint4 *)(a.out + p.o + (int64_t)drow * d.C + (lane & 1) * (HS / 2));
            const uint4 *dp = (const uint4 *)(a.dout + p.o + (int64_t)drow * d.C + (lane & 1) * (HS / 2));
#pragma unroll
            for (int i = 0; i < HS / 16; i++) {
                uint4 x = dp[i], y = op[i];
                const __nv_bfloat162 *xs = (const __nv_bfloat162 *)&x, *ys = (const __nv_bfloat162 *)&y;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 xf = __bfloat1622float2(xs[e]), yf = __bfloat1622float2(ys[e]);
                    dsum += xf.x * yf.x + xf.y * yf.y;
                }
            }
        }
        dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
        if ((lane & 1) == 0 && drow < Tq) a.D[(int64_t)p.bh * Tq + drow] = dsum; // for dkv
        float Dr[2] = {__shfl_sync(0xffffffffu, dsum, 2 * g), __shfl_sync(0xffffffffu, dsum, 2 * g + 16)};
        float nl2[2]; // -lse log2(e) of the thread's rows; -inf past Tq (P = 0)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = rw + 8 * r;
            nl2[r] = row < Tq ? bw_neg_lse2(a.lse[(int64_t)p.bh * Tq + row]) : -INFINITY;
        }
        int nkw = r0 < Tq ? (att_visible(d, min(r0 + 63, Tq - 1)) + DQ_STEP - 1) / DQ_STEP : 0; // tiles it sees
        float dq[HS / 2] = {};
        for (int jj = 0; jj < nst; jj++, j++) {
            sm.wait(j, 0);
            sm.wait(j, 1);
            if (jj < nkw) {
                float s[DQ_STEP / 2], dp[DQ_STEP / 2];
                wg_fence();
                att_product_ss<DQ_STEP, HS>(s, sm.own_op(k, 0), ATT_WG_ROWS, 64 * w, sm.stage_op(j, 0), DQ_STEP);  // S
                att_product_ss<DQ_STEP, HS>(dp, sm.own_op(k, 1), ATT_WG_ROWS, 64 * w, sm.stage_op(j, 1), DQ_STEP); // dP
                wg_commit();
                wg_wait<0>();
                wg_hold(s);
                wg_hold(dp);
                int kt = jj * DQ_STEP;
                bool diag = kt + DQ_STEP - 1 > r0 + d.delta || kt + DQ_STEP > d.Tk; // crosses the diagonal or the keys' end
#pragma unroll
                for (int i = 0; i < DQ_STEP / 8; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float pe = att_exp2(fmaf(s[4 * i + e], a.sl2, nl2[e >> 1]));
                        int key = kt + 8 * i + 2 * t + (e & 1);
                        if (diag && (key > rw + 8 * (e >> 1) + d.delta || key >= d.Tk)) pe = 0.0f;
                        s[4 * i + e] = pe * (dp[4 * i + e] - Dr[e >> 1]); // dS
                    }
                uint32_t da[DQ_STEP / 16][4];
                att_frags<DQ_STEP>(da, s);
                wg_hold(dq);
                wg_fence();
                att_product_rs<HS, DQ_STEP>(dq, da, sm.stage_op(j, 0), DQ_STEP); // dQ += dS K
                wg_commit();
                wg_wait<0>();
                wg_hold(dq);
            }
            sm.release(j);
        }
        sm.release_own(k);
        const float sc[2] = {a.scale, a.scale};
        att_store<HS>(a.dq + p.q, d.ldq, dq, sc, r0, Tq, d.add);
    }
}

template <int HS>
__global__ void __launch_bounds__(ATT_WG_THREADS, 1)
attention_backward_dkv_wgmma_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mdo,
                                    const __grid_constant__ CUtensorMap mkv, bw_args a) {
    extern __shared__ unsigned char bw_raw[];
    const att_smem<HS, 2, BW_STEP, BW_STAGES> sm(bw_raw);
    const attn_dims &d = a.d;
    int Tq = d.Tq, ntiles = (d.Tk + ATT_WG_ROWS - 1) / ATT_WG_ROWS, total = ntiles * d.B * d.NH;
    // an item's copies: its K and V tiles (rows k0..), then the Q and dO tiles from the first query
    // that sees k0 (qs) to Tq
    auto plan = [&](int item) {
        att_place p = att_tile_at(d, item, ntiles, false);
        int h = p.bh % d.NH, k0 = p.tile * ATT_WG_ROWS, kcol = d.ldk - 2 * d.C + h * HS;
        int qs = min(max(k0 - d.delta, 0), Tq), nst = (Tq - qs + BW_STEP - 1) / BW_STEP;
        return att_job{{{&mkv, kcol}, {&mkv, kcol + d.C}}, {{&mq, h * HS}, {&mdo, h * HS}}, k0, qs, nst, p.bh / d.NH};
    };
    if (sm.producer(total, a.counter + 1, plan)) return;
    int w = threadIdx.x / 128 - 1, t = threadIdx.x % 4; // w: the consumer warpgroup (0 or 1)
    int j = 0; // query tiles of the block's earlier items
    for (int k = 0, item; (item = sm.next_item(k, total)) < total; k++) {
        att_place p = att_tile_at(d, item, ntiles, false);
        att_job job = plan(item);
        int k0 = job.own_row, qs = job.row0, nst = job.n;
        int kw = k0 + 64 * w, rk = att_wg_row(kw); // the warpgroup's first key; the thread's keys rk, rk + 8
        const float *lse = a.lse + (int64_t)p.bh * Tq, *D = a.D + (int64_t)p.bh * Tq;
        float dk[HS / 2] = {}, dv[HS / 2] = {};
        for (int jj = 0; jj < nst; jj++, j++) {
            int qt = qs + jj * BW_STEP;
            sm.wait(j, 0);
            sm.wait(j, 1);
            if (qt + BW_STEP - 1 + d.delta >= kw && kw < d.Tk) { // some query of the tile sees some key of the warpgroup
                float nl[BW_STEP / 8][2], dd[BW_STEP / 8][2]; // -lse log2(e) and D of the thread's queries
#pragma unroll
                for (int i = 0; i < BW_STEP / 8; i++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        int q = qt + 8 * i + 2 * t + c;
                        nl[i][c] = q < Tq ? bw_neg_lse2(lse[q]) : -INFINITY;
                        dd[i][c] = q < Tq ? D[q] : 0.0f;
                    }
                float st[BW_STEP / 2], dpt[BW_STEP / 2];
                wg_fence();
                att_product_ss<BW_STEP, HS>(st, sm.own_op(k, 0), ATT_WG_ROWS, 64 * w, sm.stage_op(j, 0), BW_STEP);  // S^T
                att_product_ss<BW_STEP, HS>(dpt, sm.own_op(k, 1), ATT_WG_ROWS, 64 * w, sm.stage_op(j, 1), BW_STEP); // dP^T
                wg_commit();
                wg_wait<0>();
                wg_hold(st);
                wg_hold(dpt);
                bool diag = qt + d.delta < kw + 63; // some (key, query) pair of the warpgroup is masked
#pragma unroll
                for (int i = 0; i < BW_STEP / 8; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float pe = att_exp2(fmaf(st[4 * i + e], a.sl2, nl[i][e & 1]));
                        if (diag && qt + 8 * i + 2 * t + (e & 1) + d.delta < rk + 8 * (e >> 1)) pe = 0.0f;
                        st[4 * i + e] = pe;                                    // P^T
                        dpt[4 * i + e] = pe * (dpt[4 * i + e] - dd[i][e & 1]); // dS^T
                    }
                uint32_t pa[BW_STEP / 16][4], da[BW_STEP / 16][4];
                att_frags<BW_STEP>(pa, st);
                att_frags<BW_STEP>(da, dpt);
                wg_hold(dv);
                wg_hold(dk);
                wg_fence();
                att_product_rs<HS, BW_STEP>(dv, pa, sm.stage_op(j, 1), BW_STEP); // dV += P^T dO
                att_product_rs<HS, BW_STEP>(dk, da, sm.stage_op(j, 0), BW_STEP); // dK += dS^T Q
                wg_commit();
                wg_wait<0>();
                wg_hold(dv);
                wg_hold(dk);
            }
            sm.release(j);
        }
        sm.release_own(k);
        const float sk[2] = {a.scale, a.scale}, sv[2] = {1.0f, 1.0f};
        att_store<HS>(a.dkv + p.k, d.ldk, dk, sk, kw, d.Tk, d.add);
        att_store<HS>(a.dkv + p.k + d.C, d.ldk, dv, sv, kw, d.Tk, d.add);
    }
}

template <int HS>
static void launch_backward(loom_cuda *cu, const bw_args *a, const bf16 *q, const bf16 *kv) {
    const attn_dims &d = a->d;
    int BNH = d.B * d.NH;
    unsigned qgrid = att_grid(cu, (d.Tq + ATT_WG_ROWS - 1) / ATT_WG_ROWS * BNH, a->counter);
    unsigned kgrid = att_grid(cu, (d.Tk + ATT_WG_ROWS - 1) / ATT_WG_ROWS * BNH, a->counter + 1);
    constexpr int DQ_STEP = bw_dq_step(HS);
    int dq_smem = (int)att_smem<HS, 2, DQ_STEP, BW_STAGES>::bytes, dkv_smem = (int)att_smem<HS, 2, BW_STEP, BW_STAGES>::bytes;
    cudaFuncAttribute attr = cudaFuncAttributeMaxDynamicSharedMemorySize; // over 48 KB: opt in
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dq_wgmma_kernel<HS>, attr, dq_smem));
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dkv_wgmma_kernel<HS>, attr, dkv_smem));
    { // dq: own Q and dO tiles of 128 rows, streamed K and V tiles of DQ_STEP
        CUtensorMap mq = hopper_tensor_map(q, d.B, d.Tq, d.ldq, ATT_WG_ROWS);
        CUtensorMap mdo = hopper_tensor_map(a->dout, d.B, d.Tq, d.C, ATT_WG_ROWS);
        CUtensorMap mkv = hopper_tensor_map(kv, d.B, d.Tk, d.ldk, DQ_STEP);
        attention_backward_dq_wgmma_kernel<HS><<<qgrid, ATT_WG_THREADS, dq_smem, cu->stream>>>(mq, mdo, mkv, *a); // writes D
        CUDA_LAUNCH_CHECK();
    }
    { // dkv: own K and V tiles of 128 rows, streamed Q and dO tiles of BW_STEP
        CUtensorMap mq = hopper_tensor_map(q, d.B, d.Tq, d.ldq, BW_STEP);
        CUtensorMap mdo = hopper_tensor_map(a->dout, d.B, d.Tq, d.C, BW_STEP);
        CUtensorMap mkv = hopper_tensor_map(kv, d.B, d.Tk, d.ldk, ATT_WG_ROWS);
        attention_backward_dkv_wgmma_kernel<HS><<<kgrid, ATT_WG_THREADS, dkv_smem, cu->stream>>>(mq, mdo, mkv, *a);
        CUDA_LAUNCH_CHECK();
    }
}

void attention_backward_wgmma(loom_cuda *cu, attn_dims d, bf16 *dq, bf16 *dkv, const bf16 *dout, const bf16 *q,
                              const bf16 *kv, const bf16 *out, const float *lse, float *D, int *counter) {
    float scale = 1.0f / sqrtf((float)d.hs);
    bw_args a = {dq, dkv, dout, out, lse, D, counter, d, scale * ATT_LOG2E, scale};
    if (d.hs == 64)
        launch_backward<64>(cu, &a, q, kv);
    else
        launch_backward<128>(cu, &a, q, kv);
}
