// Attention backward on tensor cores for bf16, head size HS = 64 or 128, after FlashAttention-2
// (Dao 2023, Algorithm 2): P is recomputed tile by tile from Q, K and the forward's (merged) lse,
// never stored. With D = rowsum(dO * O) and scores S = Q K^T / sqrt(HS):
//   P = exp(S - lse);  dP = dO V^T;  dS = P * (dP - D)
//   dV += P^T dO;  dK += dS^T Q / sqrt(HS);  dQ += dS K / sqrt(HS)
// (written, or with span.accumulate added to what dq and dkv hold: the stores then read, add in
// fp32 and round once more).
// Instead of FA2's atomic adds into dQ, two kernels each own what they write, so there are no
// atomics and the result is deterministic; each recomputes S and dP (7 tile products per pair
// of tiles instead of 5). Both: blocks of NW = 4 warps own 64 rows, 16 per warp, whose fp32
// accumulators stay in registers (3 blocks an SM at HS = 64, 2 at 128); the other operand
// streams through a cp.async double buffer in shared memory (tile j+1 copies under the
// arithmetic of tile j); fragments by ldmatrix.
//   dq (runs first): block per (query tile, b, h); also writes D for its rows (from dO in
//        shared memory and O), which dkv reads. Walks key tiles of 64 from 0 to the keys its
//        last row sees: S = Q K^T, dP = dO V^T (16 x 64 per warp), dQ += dS K.
//   dkv: block per (key tile, b, h); walks query tiles of QSTEP from the first query that sees
//        the key tile (k0 - delta) to Tq:
//        S^T = K Q^T and dP^T = V dO^T, so that P^T and dS^T come out as A fragments for
//        dV += P^T dO and dK += dS^T Q.
// The mask (attention.cuh: key > query + delta, key >= Tk) is applied only on tiles crossing a
// warp's diagonal or the keys' end; tiles wholly masked for a warp are skipped. At HS = 64 a warp
// keeps its own rows' A fragments (Q, dO or K, V) in registers, at 128 it reads them from shared
// memory. Rows past Tq or Tk are zero, queries past Tq and rows whose lse is -inf get P = 0, and
// rows past the end are not stored.
#include "backend/cuda/attention.cuh"

struct fb_args {
    bf16 *dq, *dkv;
    const bf16 *q, *kv, *dout, *out;
    const float *lse;
    float *D;
    attn_dims d;
    float sl2, scale; // log2(e)/sqrt(HS), 1/sqrt(HS)
};

// -lse log2(e): the exponent offset of P = 2^(s sl2 - lse log2(e)); -inf (P = 0) for a row that
// sees no key (lse -inf) or is padding (lse +inf)
__device__ __forceinline__ float fb_neg_lse2(float lse) {
    return lse == -INFINITY ? -INFINITY : -lse * ATT_LOG2E;
}

template <int HS, int NW> struct fb_cfg { // NW warps a block, own 16 rows each
    static constexpr int OWN = 16 * NW, NTH = 32 * NW;
    static constexpr int LD = HS + ATT_PAD, KS = HS / 16, NT = HS / 8;
    static constexpr int QSTEP = HS == 64 ? 64 : 32; // dkv: queries per streamed tile
    static constexpr int KSTEP = 64;                 // dq: keys per streamed tile
    static constexpr bool REG = HS == 64;            // own rows' A fragments in registers
    static constexpr size_t dkv_smem = (size_t)(2 * OWN + 4 * QSTEP) * LD * 2 + 4 * QSTEP * 4;
    static constexpr size_t dq_smem = (size_t)(2 * OWN + 4 * KSTEP) * LD * 2;
};

// the A fragment k-step ks of the warp's 16 rows: from registers r, or from smem s (rows wr..)
template <bool REG, int KS>
__device__ __forceinline__ void fb_frag_a(uint32_t a[4], const uint32_t (*r)[4], const bf16 *s, int ld,
                                          int wr, int ks, int lane) {
    if constexpr (REG) {
#pragma unroll
        for (int e = 0; e < 4; e++) a[e] = r[ks][e];
    } else {
        ldsm_a(a, s, ld, wr, 16 * ks, lane);
    }
}

// x[0] (16 x 8SN) += A1 B1^T and y[0] += A2 B2^T: A from fb_frag_a, B = rows 0..8SN-1 of the
// smem arrays B1, B2 (rows are n: K, V, Q or dO)
template <bool REG, int KS, int SN>
__device__ __forceinline__ void fb_two_products(float (*x)[SN][4], float (*y)[SN][4], const uint32_t (*r1)[4],
                                                const uint32_t (*r2)[4], const bf16 *A1, const bf16 *A2,
                                                const bf16 *B1, const bf16 *B2, int ld, int wr, int lane) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint32_t a1[4], a2[4], b[4];
        fb_frag_a<REG, KS>(a1, r1, A1, ld, wr, ks, lane);
        fb_frag_a<REG, KS>(a2, r2, A2, ld, wr, ks, lane);
#pragma unroll
        for (int n2 = 0; n2 < SN / 2; n2++) {
            ldsm_b(b, B1, ld, 16 * n2, 16 * ks, lane);
            mma_bf16(x[0][2 * n2], a1, b[0], b[1]);
            mma_bf16(x[0][2 * n2 + 1], a1, b[2], b[3]);
            ldsm_b(b, B2, ld, 16 * n2, 16 * ks, lane);
            mma_bf16(y[0][2 * n2], a2, b[0], b[1]);
            mma_bf16(y[0][2 * n2 + 1], a2, b[2], b[3]);
        }
    }
}

template <int HS, int NW, int MINB>
__global__ void __launch_bounds__(32 * NW, MINB) attention_backward_dq_kernel(fb_args a) {
    using c = fb_cfg<HS, NW>;
    constexpr int OWN = c::OWN, NTH = c::NTH;
    constexpr int LD = c::LD, KS = c::KS, NT = c::NT, ST = c::KSTEP, SN = ST / 8;
    extern __shared__ __align__(16) unsigned char fb_smem[];
    bf16 *Qs = (bf16 *)fb_smem, *dOs = Qs + OWN * LD, *KV = dOs + OWN * LD; // KV: 2 stages of K, V
    att_place w = att_tile_place(a.d, true);
    int Tq = a.d.Tq, Tk = a.d.Tk, delta = a.d.delta, C = a.d.C, lane = w.lane, g = w.g, t = w.t, wr = 16 * w.warp;
    int64_t ldq = a.d.ldq, ldk = a.d.ldk;
    const bf16 *q = a.q + w.q, *k = a.kv + w.k, *v = k + C;
    int q0 = w.tile * OWN, qr = q0 + wr, nst = (att_visible(a.d, min(q0 + OWN, Tq) - 1) + ST - 1) / ST;
    att_load<HS, OWN, NTH>(Qs, q, ldq, q0, Tq);
    att_load<HS, OWN, NTH>(dOs, a.dout + w.o, C, q0, Tq);
    att_load<HS, ST, NTH>(KV, k, ldk, 0, Tk);
    att_load<HS, ST, NTH>(KV + ST * LD, v, ldk, 0, Tk);
    cp_async_commit();
    // while the copies fly: lane reads half a row of O (row qr + lane/2) and the lse of its rows
    int drow = qr + lane / 2;
    uint4 ov[HS / 16];
    const uint4 *op = (const uint4 *)(a.out + w.o + (int64_t)drow * C + (lane & 1) * (HS / 2));
#pragma unroll
    for (int i = 0; i < HS / 16; i++) ov[i] = drow < Tq ? op[i] : make_uint4(0, 0, 0, 0);
    float nl2[2]; // -lse log2(e) of rows qr + g, qr + g + 8; -inf past Tq (P = 0)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = qr + g + 8 * r;
        nl2[r] = row < Tq ? fb_neg_lse2(a.lse[(int64_t)w.bh * Tq + row]) : -INFINITY;
    }
    cp_async_wait_all();
    __syncthreads();
    const uint4 *dp = (const uint4 *)(dOs + (wr + lane / 2) * LD + (lane & 1) * (HS / 2));
    float dsum = 0.0f;
#pragma unroll
    for (int i = 0; i < HS / 16; i++) {
        uint4 x = dp[i], y = ov[i];
        const __nv_bfloat162 *xs = (const __nv_bfloat162 *)&x, *ys = (const __nv_bfloat162 *)&y;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 xf = __bfloat1622float2(xs[e]), yf = __bfloat1622float2(ys[e]);
            dsum += xf.x * yf.x + xf.y * yf.y;
        }
    }
    dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
    if ((lane & 1) == 0 && drow < Tq) a.D[(int64_t)w.bh * Tq + drow] = dsum; // for dkv
    float Dr[2] = {__shfl_sync(0xffffffffu, dsum, 2 * g), __shfl_sync(0xffffffffu, dsum, 2 * g + 16)};

    uint32_t qf[c::REG ? KS : 1][4], df[c::REG ? KS : 1][4];
    if constexpr (c::REG)
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            ldsm_a(qf[ks], Qs, LD, wr, 16 * ks, lane);
            ldsm_a(df[ks], dOs, LD, wr, 16 * ks, lane);
        }
    float dq[1][NT][4] = {};
    for (int j = 0; j < nst; j++) {
        const bf16 *Ks = KV + (j & 1) * 2 * ST * LD, *Vs = Ks + ST * LD;
        if (j + 1 < nst) {
            bf16 *Kn = KV + ((j + 1) & 1) * 2 * ST * LD;
            att_load<HS, ST, NTH>(Kn, k, ldk, (j + 1) * ST, Tk);
            att_load<HS, ST, NTH>(Kn + ST * LD, v, ldk, (j + 1) * ST, Tk);
        }
        cp_async_commit();
        int kt = j * ST;
        if (kt <= qr + 15 + delta) { // some key of the tile is visible to some row of the warp
            float s[1][SN][4] = {}, dpm[1][SN][4] = {};
            fb_two_products<c::REG, KS, SN>(s, dpm, qf, df, Qs, dOs, Ks, Vs, LD, wr, lane); // S, dP
            bool diag = kt + ST - 1 > qr + delta || kt + ST > Tk; // crosses the diagonal or the keys' end
#pragma unroll
            for (int nt = 0; nt < SN; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = att_exp2(fmaf(s[0][nt][e], a.sl2, nl2[e >> 1]));
                    int key = kt + 8 * nt + 2 * t + (e & 1);
                    if (diag && (key > qr + g + 8 * (e >> 1) + delta || key >= Tk)) p = 0.0f;
                    s[0][nt][e] = p * (dpm[0][nt][e] - Dr[e >> 1]); // dS
                }
            mma_frags_by_rows<1, NT, ST / 16>(dq, s, Ks, LD, lane); // dQ += dS K
        }
        cp_async_wait_all();
        __syncthreads();
    }
    if (a.d.add) att_store_rows<NT, true>(a.dq + w.q, ldq, dq[0], a.scale, a.scale, Qs + wr * LD, qr, Tq, lane);
    else att_store_rows<NT, false>(a.dq + w.q, ldq, dq[0], a.scale, a.scale, Qs + wr * LD, qr, Tq, lane);
}

// Issues the copies of query tile [qn, qn + ST) for dkv: Q, dO rows into Qn (dO after Q), lse
// and D into Ln (D after lse); past T, lse = +inf (P = 0) and D = 0
template <int HS, int ST, int NTH>
__device__ __forceinline__ void fb_stage_queries(bf16 *Qn, float *Ln, const bf16 *q, int64_t ld, const bf16 *dout,
                                                 int C, const float *lse, const float *D, int qn, int T) {
    att_load<HS, ST, NTH>(Qn, q, ld, qn, T);
    att_load<HS, ST, NTH>(Qn + ST * (HS + ATT_PAD), dout, C, qn, T);
    int i = (int)threadIdx.x % ST, which = (int)threadIdx.x / ST; // lse (0) or D (1)
    if (which == 0 && qn + i < T) cp_async4(Ln + i, lse + qn + i);
    if (which == 1 && qn + i < T) cp_async4(Ln + ST + i, D + qn + i);
    if (which < 2 && qn + i >= T) Ln[which * ST + i] = which ? 0.0f : INFINITY;
}

template <int HS, int NW, int MINB>
__global__ void __launch_bounds__(32 * NW, MINB) attention_backward_dkv_kernel(fb_args a) {
    using c = fb_cfg<HS, NW>;
    constexpr int OWN = c::OWN, NTH = c::NTH;
    constexpr int LD = c::LD, KS = c::KS, NT = c::NT, ST = c::QSTEP, SN = ST / 8;
    extern __shared__ __align__(16) unsigned char fb_smem[];
    bf16 *Ks = (bf16 *)fb_smem, *Vs = Ks + OWN * LD, *QD = Vs + OWN * LD; // QD: 2 stages of Q, dO
    float *LDs = (float *)(QD + 4 * ST * LD);                                      // 2 stages of lse, D
    att_place w = att_tile_place(a.d, false);
    int Tq = a.d.Tq, Tk = a.d.Tk, delta = a.d.delta, C = a.d.C, lane = w.lane, g = w.g, t = w.t, wr = 16 * w.warp;
    int64_t ldq = a.d.ldq, ldk = a.d.ldk;
    const bf16 *q = a.q + w.q, *k = a.kv + w.k, *dout = a.dout + w.o;
    const float *lse = a.lse + (int64_t)w.bh * Tq, *D = a.D + (int64_t)w.bh * Tq;
    int k0 = w.tile * OWN, kw = k0 + wr;
    int qs = min(max(k0 - delta, 0), Tq), nst = (Tq - qs + ST - 1) / ST; // query tiles from the first that sees k0
    att_load<HS, OWN, NTH>(Ks, k, ldk, k0, Tk);
    att_load<HS, OWN, NTH>(Vs, k + C, ldk, k0, Tk);
    fb_stage_queries<HS, ST, NTH>(QD, LDs, q, ldq, dout, C, lse, D, qs, Tq);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    uint32_t kf[c::REG ? KS : 1][4], vf[c::REG ? KS : 1][4];
    if constexpr (c::REG)
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            ldsm_a(kf[ks], Ks, LD, wr, 16 * ks, lane);
            ldsm_a(vf[ks], Vs, LD, wr, 16 * ks, lane);
        }
    float dk[1][NT][4] = {}, dv[1][NT][4] = {};
    for (int j = 0; j < nst; j++) {
        const bf16 *Qs = QD + (j & 1) * 2 * ST * LD, *dOs = Qs + ST * LD;
        const float *Ls = LDs + (j & 1) * 2 * ST, *Ds = Ls + ST;
        if (j + 1 < nst)
            fb_stage_queries<HS, ST, NTH>(QD + ((j + 1) & 1) * 2 * ST * LD, LDs + ((j + 1) & 1) * 2 * ST,
                                                 q, ldq, dout, C, lse, D, qs + (j + 1) * ST, Tq);
        cp_async_commit();
        int qt = qs + j * ST;
        if (qt + ST - 1 + delta >= kw) { // some query of the tile sees some key of the warp
            float st[1][SN][4] = {}, dpt[1][SN][4] = {};
            fb_two_products<c::REG, KS, SN>(st, dpt, kf, vf, Ks, Vs, Qs, dOs, LD, wr, lane); // S^T, dP^T
            bool diag = qt + delta < kw + 15;
#pragma unroll
            for (int nt = 0; nt < SN; nt++) {
                float2 L = *(const float2 *)(Ls + 8 * nt + 2 * t), Dd = *(const float2 *)(Ds + 8 * nt + 2 * t);
                float nl[2] = {fb_neg_lse2(L.x), fb_neg_lse2(L.y)}, dd[2] = {Dd.x, Dd.y};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = att_exp2(fmaf(st[0][nt][e], a.sl2, nl[e & 1]));
                    if (diag && qt + 8 * nt + 2 * t + (e & 1) + delta < kw + g + 8 * (e >> 1)) p = 0.0f;
                    st[0][nt][e] = p;                                // P^T
                    dpt[0][nt][e] = p * (dpt[0][nt][e] - dd[e & 1]); // dS^T
                }
            }
            mma_frags_by_rows<1, NT, ST / 16>(dv, st, dOs, LD, lane); // dV += P^T dO
            mma_frags_by_rows<1, NT, ST / 16>(dk, dpt, Qs, LD, lane); // dK += dS^T Q
        }
        cp_async_wait_all();
        __syncthreads();
    }
    if (a.d.add) {
        att_store_rows<NT, true>(a.dkv + w.k, ldk, dk[0], a.scale, a.scale, Ks + wr * LD, kw, Tk, lane);
        att_store_rows<NT, true>(a.dkv + w.k + C, ldk, dv[0], 1.0f, 1.0f, Vs + wr * LD, kw, Tk, lane);
    } else {
        att_store_rows<NT, false>(a.dkv + w.k, ldk, dk[0], a.scale, a.scale, Ks + wr * LD, kw, Tk, lane);
        att_store_rows<NT, false>(a.dkv + w.k + C, ldk, dv[0], 1.0f, 1.0f, Vs + wr * LD, kw, Tk, lane);
    }
}

template <int HS, int NW, int MINB>
static void launch_backward_tc(loom_cuda *cu, const fb_args *a) {
    using c = fb_cfg<HS, NW>;
    unsigned BNH = (unsigned)(a->d.B * a->d.NH), qgrid = (unsigned)((a->d.Tq + c::OWN - 1) / c::OWN) * BNH;
    unsigned kgrid = (unsigned)((a->d.Tk + c::OWN - 1) / c::OWN) * BNH;
    cudaFuncAttribute smem = cudaFuncAttributeMaxDynamicSharedMemorySize; // over 48 KB: opt in
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dq_kernel<HS, NW, MINB>, smem, (int)c::dq_smem));
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dkv_kernel<HS, NW, MINB>, smem, (int)c::dkv_smem));
    attention_backward_dq_kernel<HS, NW, MINB><<<qgrid, c::NTH, c::dq_smem, cu->stream>>>(*a); // writes D
    CUDA_LAUNCH_CHECK();
    attention_backward_dkv_kernel<HS, NW, MINB><<<kgrid, c::NTH, c::dkv_smem, cu->stream>>>(*a);
    CUDA_LAUNCH_CHECK();
}

void attention_backward_tc(loom_cuda *cu, attn_dims d, bf16 *dq, bf16 *dkv, const bf16 *dout, const bf16 *q,
                           const bf16 *kv, const bf16 *out, const float *lse, float *D) {
    float scale = 1.0f / sqrtf((float)d.hs);
    fb_args a = {dq, dkv, q, kv, dout, out, lse, D, d, scale * ATT_LOG2E, scale};
    // 4 warps (64 rows) a block; hs 64 fits 3 blocks an SM in 168 registers (measured on an H100:
    // 8 warps a block, or 2 blocks of 4, were up to 8% slower at T = 1K and equal at 16K)
    if (d.hs == 64)
        launch_backward_tc<64, 4, 3>(cu, &a);
    else
        launch_backward_tc<128, 4, 2>(cu, &a);
}
