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
//       from dO and O in global memory and writes it and -lse log2(e) for dkv (bw_args); streams
//       key tiles (bw_step) from 0 to the keys its last row sees: S = Q K^T and dP = dO V^T (both
//       operands in shared memory, K-major), dQ += dS K (dS as register fragments, K N-major).
//   dkv: work item (key tile of 128, b, h); owns K and V; streams query tiles (bw_step), with
//       their rows of -lse log2(e) and D (bulk copies), from the first query that sees the tile's
//       first key (k0 - delta, rounded down to a multiple of 4: the rows before it are masked) to
//       Tq: S^T = K Q^T and dP^T = V dO^T, so that P^T and dS^T are register fragments for
//       dV += P^T dO and dK += dS^T Q (Q and dO N-major).
// The mask (key > query + delta, key >= Tk) is applied only on tiles crossing a warpgroup's
// diagonal or the keys' end; tiles wholly masked for a warpgroup are skipped. Rows past Tq or Tk
// arrive as zeros; queries past Tq and rows whose lse is -inf get P = 0; rows past the ends are
// not stored.
#include "backend/cuda/attention_wgmma.cuh"

// Rows a streamed tile (keys for dq, queries for dkv): 128 at HS = 64 (fewer, larger products), 64
// at 128 (registers)
__host__ __device__ constexpr int bw_step(int hs) { return hs == 64 ? 128 : 64; }
#define BW_STAGES 2
static inline int bw_tp(int Tq) { return (Tq + 3) & ~3; }

// scratch: the counters (16 bytes), nl and D (bw_args), and 128 floats of zeros past D's end
size_t attention_backward_wgmma_scratch(attn_dims d) { return 16 + (2 * (size_t)d.B * d.NH * bw_tp(d.Tq) + 128) * 4; }

struct bw_args {
    bf16 *dq, *dkv;
    const bf16 *dout, *out;
    const float *lse;
    // (B*NH, Tp) each: bw_neg_lse2(lse) and D of the query rows, from dq for dkv; D is 0 at rows
    // [Tq, Tp) and at the 128 floats past its end, which the last tile's copies may read
    float *nl, *D;
    int *counter;  // 2 ints: the dq and dkv kernels' handed-out work items
    int Tp;        // Tq rounded up to 4: the rows of D and nl are 16-byte aligned, as bulk copies need
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
    constexpr int STEP = bw_step(HS);
    const att_smem<HS, 2, STEP, BW_STAGES> sm(bw_raw);
    const attn_dims &d = a.d;
    int Tq = d.Tq, ntiles = (Tq + ATT_WG_ROWS - 1) / ATT_WG_ROWS, total = ntiles * d.B * d.NH;
    // an item's copies: its Q and dO tiles (rows q0..), then the K and V tiles its last row sees
    auto plan = [&](int item) {
        att_place p = att_tile_at(d, item, ntiles, true);
        int h = p.bh % d.NH, q0 = p.tile * ATT_WG_ROWS, kcol = d.ldk - 2 * d.C + h * HS;
        int nst = att_key_tiles(d, q0, ATT_WG_ROWS, STEP);
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
        if ((lane & 1) == 0 && drow < a.Tp) { // for dkv (D = 0 past Tq)
            a.D[(int64_t)p.bh * a.Tp + drow] = dsum;
            if (drow < Tq) a.nl[(int64_t)p.bh * a.Tp + drow] = bw_neg_lse2(a.lse[(int64_t)p.bh * Tq + drow]);
        }
        float Dr[2] = {__shfl_sync(0xffffffffu, dsum, 2 * g), __shfl_sync(0xffffffffu, dsum, 2 * g + 16)};
        float nl2[2]; // -lse log2(e) of the thread's rows; -inf past Tq (P = 0)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = rw + 8 * r;
            nl2[r] = row < Tq ? bw_neg_lse2(a.lse[(int64_t)p.bh * Tq + row]) : -INFINITY;
        }
        int nkw = att_key_tiles(d, r0, 64, STEP); // tiles it sees
        float dq[HS / 2] = {};
        for (int jj = 0; jj < nst; jj++, j++) {
            sm.wait(j, 0);
            sm.wait(j, 1);
            if (jj < nkw) {
                float s[STEP / 2], dp[STEP / 2];
                wg_fence();
                att_product_ss<STEP, HS>(s, sm.own_op(k, 0), ATT_WG_ROWS, 64 * w, sm.stage_op(j, 0), STEP);  // S
                att_product_ss<STEP, HS>(dp, sm.own_op(k, 1), ATT_WG_ROWS, 64 * w, sm.stage_op(j, 1), STEP); // dP
                wg_commit();
                wg_wait<0>();
                wg_hold(s);
                wg_hold(dp);
                int kt = jj * STEP;
                bool diag = kt + STEP - 1 > r0 + d.delta || kt + STEP > d.Tk; // crosses the diagonal or the keys' end
#pragma unroll
                for (int i = 0; i < STEP / 8; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float pe = att_exp2(fmaf(s[4 * i + e], a.sl2, nl2[e >> 1]));
                        int key = kt + 8 * i + 2 * t + (e & 1);
                        if (diag && (key > rw + 8 * (e >> 1) + d.delta || key >= d.Tk)) pe = 0.0f;
                        s[4 * i + e] = pe * (dp[4 * i + e] - Dr[e >> 1]); // dS
                    }
                uint32_t da[STEP / 16][4];
                att_frags<STEP>(da, s);
                wg_hold(dq);
                wg_fence();
                att_product_rs<HS, STEP>(dq, da, sm.stage_op(j, 0), STEP); // dQ += dS K
                wg_commit();
                wg_wait<0>();
                wg_hold(dq);
            }
            sm.release(j);
        }
        const float sc[2] = {a.scale, a.scale};
        att_store<HS>(a.dq + p.q, d.ldq, dq, sc, r0, Tq, d.add);
    }
}

template <int HS>
__global__ void __launch_bounds__(ATT_WG_THREADS, 1)
attention_backward_dkv_wgmma_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mdo,
                                    const __grid_constant__ CUtensorMap mkv, bw_args a) {
    extern __shared__ unsigned char bw_raw[];
    constexpr int STEP = bw_step(HS);
    const att_smem<HS, 2, STEP, BW_STAGES, 2> sm(bw_raw);
    const attn_dims &d = a.d;
    int Tq = d.Tq, ntiles = (d.Tk + ATT_WG_ROWS - 1) / ATT_WG_ROWS, total = ntiles * d.B * d.NH;
    // an item's copies: its K and V tiles (rows k0..), then the Q and dO tiles, with their nl and
    // D, from the first query that sees k0 rounded down to a multiple of 4 (qs) to Tq
    auto plan = [&](int item) {
        att_place p = att_tile_at(d, item, ntiles, false);
        int h = p.bh % d.NH, k0 = p.tile * ATT_WG_ROWS, kcol = d.ldk - 2 * d.C + h * HS;
        int qs = min(max(k0 - d.delta, 0), Tq) & ~3, nst = (Tq - qs + STEP - 1) / STEP;
        int64_t at = (int64_t)p.bh * a.Tp + qs;
        return att_job{{{&mkv, kcol}, {&mkv, kcol + d.C}}, {{&mq, h * HS}, {&mdo, h * HS}}, k0, qs, nst, p.bh / d.NH,
                       {a.nl + at, a.D + at}};
    };
    if (sm.producer(total, a.counter + 1, plan)) return;
    int w = threadIdx.x / 128 - 1, t = threadIdx.x % 4; // w: the consumer warpgroup (0 or 1)
    int j = 0; // query tiles of the block's earlier items
    for (int k = 0, item; (item = sm.next_item(k, total)) < total; k++) {
        att_place p = att_tile_at(d, item, ntiles, false);
        att_job job = plan(item);
        int k0 = job.own_row, qs = job.row0, nst = job.n;
        int kw = k0 + 64 * w, rk = att_wg_row(kw); // the warpgroup's first key; the thread's keys rk, rk + 8
        float dk[HS / 2] = {}, dv[HS / 2] = {};
        for (int jj = 0; jj < nst; jj++, j++) {
            int qt = qs + jj * STEP;
            sm.wait(j, 0);
            sm.wait(j, 1);
            if (qt + STEP - 1 + d.delta >= kw && kw < d.Tk) { // some query of the tile sees some key of the warpgroup
                float st[STEP / 2], dpt[STEP / 2];
                wg_fence();
                att_product_ss<STEP, HS>(st, sm.own_op(k, 0), ATT_WG_ROWS, 64 * w, sm.stage_op(j, 0), STEP);  // S^T
                att_product_ss<STEP, HS>(dpt, sm.own_op(k, 1), ATT_WG_ROWS, 64 * w, sm.stage_op(j, 1), STEP); // dP^T
                wg_commit();
                wg_wait<0>();
                wg_hold(st);
                wg_hold(dpt);
                bool diag = qt + d.delta < kw + 63; // some (key, query) pair of the warpgroup is masked
                const float *nls = sm.stage_vec(j, 0), *D = sm.stage_vec(j, 1); // of the tile's queries
                uint32_t pa[STEP / 16][4], da[STEP / 16][4]; // P^T and dS^T as A fragments (att_frags)
#pragma unroll
                for (int i = 0; i < STEP / 8; i++) {
                    int q = 8 * i + 2 * t; // the thread's queries qt + q, + 1
                    float2 l2 = *(const float2 *)(nls + q), d2 = *(const float2 *)(D + q);
                    float nl[2] = {l2.x, l2.y}, dd[2] = {d2.x, d2.y}, p[4], ds[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int query = qt + q + (e & 1);
                        p[e] = att_exp2(fmaf(st[4 * i + e], a.sl2, nl[e & 1]));
                        // masked, or past Tq (nl there is another head's, or was never written)
                        if ((diag && query + d.delta < rk + 8 * (e >> 1)) || query >= Tq) p[e] = 0.0f;
                        ds[e] = p[e] * (dpt[4 * i + e] - dd[e & 1]); // D is finite everywhere (bw_args)
                    }
                    att_frag_put(pa, i, p);
                    att_frag_put(da, i, ds);
                }
                wg_hold(dv);
                wg_hold(dk);
                wg_fence();
                att_product_rs<HS, STEP>(dv, pa, sm.stage_op(j, 1), STEP); // dV += P^T dO
                att_product_rs<HS, STEP>(dk, da, sm.stage_op(j, 0), STEP); // dK += dS^T Q
                wg_commit();
                wg_wait<0>();
                wg_hold(dv);
                wg_hold(dk);
            }
            sm.release(j);
        }
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
    constexpr int STEP = bw_step(HS);
    int dq_smem = (int)att_smem<HS, 2, STEP, BW_STAGES>::bytes, dkv_smem = (int)att_smem<HS, 2, STEP, BW_STAGES, 2>::bytes;
    cudaFuncAttribute attr = cudaFuncAttributeMaxDynamicSharedMemorySize; // over 48 KB: opt in
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dq_wgmma_kernel<HS>, attr, dq_smem));
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dkv_wgmma_kernel<HS>, attr, dkv_smem));
    { // dq: own Q and dO tiles of 128 rows, streamed K and V tiles of STEP
        CUtensorMap mq = hopper_tensor_map(q, d.B, d.Tq, d.ldq, ATT_WG_ROWS);
        CUtensorMap mdo = hopper_tensor_map(a->dout, d.B, d.Tq, d.C, ATT_WG_ROWS);
        CUtensorMap mkv = hopper_tensor_map(kv, d.B, d.Tk, d.ldk, STEP);
        attention_backward_dq_wgmma_kernel<HS><<<qgrid, ATT_WG_THREADS, dq_smem, cu->stream>>>(mq, mdo, mkv, *a); // writes D
        CUDA_LAUNCH_CHECK();
    }
    { // dkv: own K and V tiles of 128 rows, streamed Q and dO tiles of STEP with their nl and D
        CUtensorMap mq = hopper_tensor_map(q, d.B, d.Tq, d.ldq, STEP);
        CUtensorMap mdo = hopper_tensor_map(a->dout, d.B, d.Tq, d.C, STEP);
        CUtensorMap mkv = hopper_tensor_map(kv, d.B, d.Tk, d.ldk, ATT_WG_ROWS);
        attention_backward_dkv_wgmma_kernel<HS><<<kgrid, ATT_WG_THREADS, dkv_smem, cu->stream>>>(mq, mdo, mkv, *a);
        CUDA_LAUNCH_CHECK();
    }
}

void attention_backward_wgmma(loom_cuda *cu, attn_dims d, bf16 *dq, bf16 *dkv, const bf16 *dout, const bf16 *q,
                              const bf16 *kv, const bf16 *out, const float *lse, void *scratch) {
    float scale = 1.0f / sqrtf((float)d.hs);
    int Tp = bw_tp(d.Tq);
    float *nl = (float *)((char *)scratch + 16), *D = nl + (size_t)d.B * d.NH * Tp;
    CUDA_CHECK(cudaMemsetAsync(D + (size_t)d.B * d.NH * Tp, 0, 128 * sizeof(float), cu->stream));
    bw_args a = {dq, dkv, dout, out, lse, nl, D, (int *)scratch, Tp, d, scale * ATT_LOG2E, scale};
    if (d.hs == 64)
        launch_backward<64>(cu, &a, q, kv);
    else
        launch_backward<128>(cu, &a, q, kv);
}
