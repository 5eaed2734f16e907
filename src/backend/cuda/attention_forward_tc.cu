// Attention forward on tensor cores, FlashAttention-2 (Dao 2023, Algorithm 1) for bf16 with head
// size HS = 64 or 128: bf16 mma.sync m16n8k16 with fp32 accumulation; the (Tq,Tk) scores exist
// only as 16-row x 64-key tiles in registers.
//
// One block per (query tile of 128 rows, b, h), 128/(16 MW) warps; warp w owns the MW 16-row
// m-tiles of rows q0 + 16 MW w... (MW = 2: 4 warps of 32 rows, so each K/V fragment read from
// shared memory feeds two mma). Q (128 x HS) is staged in shared memory once (and kept in
// registers where they allow: HS = 64 or MW = 1). The block walks the key tiles its last row
// sees (attention.cuh: [0, q0 + 128 + delta), at most Tk) in steps of 64, K and V (64 x HS each) double-buffered in shared memory through cp.async: the
// copy of tile j+1 runs under the arithmetic of tile j. Per key tile, per warp:
//   S = Q K^T (16 MW x 64, fp32; K fragments by ldmatrix); mask (key > query + delta or key >= Tk:
//   -inf) only on the tiles that cross the warp's diagonal or the end of the keys; tiles wholly
//   above the diagonal are skipped
//   online softmax in base 2 (m in raw score units, the scale folded into one FMA):
//   m' = max(m, rowmax S); P = 2^(S c - m' c) with c = log2(e)/sqrt(HS); l = l 2^((m-m') c) +
//   rowsum P; O = O 2^((m-m') c) + P V, P rounded to bf16 as the A operand (from registers)
// At the end O /= l and lse = m / sqrt(HS) + ln l (natural log, as backend.h wants; a row that saw
// no key: O = 0, lse = -inf); O goes out through shared memory in 16-byte stores. Rows past Tq (the
// last tile when Tq is not a multiple of 128) read zero rows and are not stored; keys past Tk are
// zero rows, masked.
#include "backend/cuda/attention.cuh"

#define FA_ROWS 128 // query rows per block
#define FA_KEYS 64  // keys per tile

static size_t fa_smem_bytes(int hs) { return (size_t)(FA_ROWS + 4 * FA_KEYS) * (hs + ATT_PAD) * sizeof(bf16); }

template <int HS, int MW>
__global__ void __launch_bounds__(256 / MW, MW == 2 ? 2 : 1)
attention_forward_tc_kernel(bf16 *out, float *lse, const bf16 *qg, const bf16 *kvg, attn_dims d, float sl2) {
    constexpr int LD = HS + ATT_PAD, KS = HS / 16, NT = HS / 8, SN = FA_KEYS / 8, NTH = 256 / MW;
    constexpr bool QREG = HS == 64 || MW == 1;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *Qs = (bf16 *)fa_smem, *KV = Qs + FA_ROWS * LD; // stage j: K at KV + 2j 64 LD, V after it
    att_place w = att_tile_place(d, true);
    int lane = w.lane, g = w.g, t = w.t, C = d.C, Tq = d.Tq, Tk = d.Tk, delta = d.delta;
    int64_t ldq = d.ldq, ldk = d.ldk;
    const bf16 *q = qg + w.q, *k = kvg + w.k, *v = k + C;
    int q0 = w.tile * FA_ROWS, wr = 16 * MW * w.warp, r0 = q0 + wr;               // block's, warp's first row
    int nkt = (att_visible(d, min(q0 + FA_ROWS, Tq) - 1) + FA_KEYS - 1) / FA_KEYS; // key tiles [0, nkt)

    att_load<HS, FA_ROWS, NTH>(Qs, q, ldq, q0, Tq);
    att_load<HS, FA_KEYS, NTH>(KV, k, ldk, 0, Tk);
    att_load<HS, FA_KEYS, NTH>(KV + FA_KEYS * LD, v, ldk, 0, Tk);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    uint32_t qf[MW][QREG ? KS : 1][4]; // the warp's queries as A fragments, when in registers
    if constexpr (QREG)
#pragma unroll
        for (int i = 0; i < MW; i++)
#pragma unroll
            for (int ks = 0; ks < KS; ks++) ldsm_a(qf[i][ks], Qs, LD, wr + 16 * i, 16 * ks, lane);

    float o[MW][NT][4] = {}, m[MW][2], l[MW][2] = {};
#pragma unroll
    for (int i = 0; i < MW; i++) m[i][0] = m[i][1] = -INFINITY;
    for (int j = 0; j < nkt; j++) {
        const bf16 *Ks = KV + (j & 1) * 2 * FA_KEYS * LD, *Vs = Ks + FA_KEYS * LD;
        if (j + 1 < nkt) { // prefetch tile j+1 into the other stage (free since the last barrier)
            bf16 *Kn = KV + ((j + 1) & 1) * 2 * FA_KEYS * LD;
            att_load<HS, FA_KEYS, NTH>(Kn, k, ldk, (j + 1) * FA_KEYS, Tk);
            att_load<HS, FA_KEYS, NTH>(Kn + FA_KEYS * LD, v, ldk, (j + 1) * FA_KEYS, Tk);
        }
        cp_async_commit();
        int k0 = j * FA_KEYS;
        if (k0 <= r0 + 16 * MW - 1 + delta) { // some key of the tile is visible to some row of the warp
            float s[MW][SN][4] = {};
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                uint32_t a[MW][4];
#pragma unroll
                for (int i = 0; i < MW; i++) {
                    if constexpr (QREG) {
#pragma unroll
                        for (int e = 0; e < 4; e++) a[i][e] = qf[i][ks][e];
                    } else {
                        ldsm_a(a[i], Qs, LD, wr + 16 * i, 16 * ks, lane);
                    }
                }
#pragma unroll
                for (int n2 = 0; n2 < SN / 2; n2++) {
                    uint32_t b[4];
                    ldsm_b(b, Ks, LD, 16 * n2, 16 * ks, lane);
#pragma unroll
                    for (int i = 0; i < MW; i++) {
                        mma_bf16(s[i][2 * n2], a[i], b[0], b[1]);
                        mma_bf16(s[i][2 * n2 + 1], a[i], b[2], b[3]);
                    }
                }
            }
            if (k0 + FA_KEYS - 1 > r0 + delta || k0 + FA_KEYS > Tk) // crosses the warp's diagonal or the keys' end
#pragma unroll
                for (int i = 0; i < MW; i++)
#pragma unroll
                    for (int nt = 0; nt < SN; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int row = r0 + 16 * i + g + 8 * (e >> 1), key = k0 + 8 * nt + 2 * t + (e & 1);
                            if (key > row + delta || key >= Tk) s[i][nt][e] = -INFINITY;
                        }
#pragma unroll
            for (int i = 0; i < MW; i++)
#pragma unroll
                for (int r = 0; r < 2; r++) { // a row's 64 scores are spread over a quad's 4 lanes
                    float mx = m[i][r];
#pragma unroll
                    for (int nt = 0; nt < SN; nt++) mx = fmaxf(mx, fmaxf(s[i][nt][2 * r], s[i][nt][2 * r + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    float msc = mx == -INFINITY ? 0.0f : mx * sl2; // a row with nothing visible yet
                    float corr = att_exp2(m[i][r] * sl2 - msc), sum = 0.0f;
                    m[i][r] = mx;
#pragma unroll
                    for (int nt = 0; nt < SN; nt++)
#pragma unroll
                        for (int e = 2 * r; e < 2 * r + 2; e++) {
                            s[i][nt][e] = att_exp2(fmaf(s[i][nt][e], sl2, -msc));
                            sum += s[i][nt][e];
                        }
                    l[i][r] = l[i][r] * corr + sum;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) o[i][nt][2 * r] *= corr, o[i][nt][2 * r + 1] *= corr;
                }
            mma_frags_by_rows<MW, NT, FA_KEYS / 16>(o, s, Vs, LD, lane); // O += P V
        }
        cp_async_wait_all(); // tile j+1 has landed, and every warp is done with tile j
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < MW; i++) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float L = l[i][r];
            L += __shfl_xor_sync(0xffffffffu, L, 1);
            L += __shfl_xor_sync(0xffffffffu, L, 2);
            inv[r] = L > 0.0f ? 1.0f / L : 0.0f; // a row that saw no key: O = 0
            int row = r0 + 16 * i + g + 8 * r;
            if (t == 0 && row < Tq)
                lse[(int64_t)w.bh * Tq + row] = L > 0.0f ? (m[i][r] * sl2 + __log2f(L)) * ATT_LN2 : -INFINITY;
        }
        // the warp's own rows of Qs (no longer read by anyone after the loop's last barrier)
        att_store_rows<NT, false>(out + w.o, C, o[i], inv[0], inv[1], Qs + (wr + 16 * i) * LD, r0 + 16 * i, Tq, lane);
    }
}

template <int HS, int MW>
static void launch_forward(loom_cuda *cu, attn_dims d, bf16 *out, float *lse, const bf16 *q, const bf16 *kv) {
    int BNH = d.B * d.NH, ntiles = (d.Tq + FA_ROWS - 1) / FA_ROWS, smem = (int)fa_smem_bytes(HS);
    float sl2 = ATT_LOG2E / sqrtf((float)HS);
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_tc_kernel<HS, MW>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attention_forward_tc_kernel<HS, MW><<<(unsigned)(ntiles * BNH), 256 / MW, smem, cu->stream>>>(
        out, lse, q, kv, d, sl2);
    CUDA_LAUNCH_CHECK();
}

void attention_forward_tc(loom_cuda *cu, attn_dims d, bf16 *out, float *lse, const bf16 *q, const bf16 *kv) {
    if (d.hs == 64) // MW = 1 (8 warps of 16 rows) measured 20-25% slower on an H100
        launch_forward<64, 2>(cu, d, out, lse, q, kv);
    else
        launch_forward<128, 2>(cu, d, out, lse, q, kv);
}
