// Attention forward on Hopper (sm_90a) for bf16 with head size HS = 64 or 128, in the design of
// FlashAttention-3 (Shah et al. 2024, Algorithm 1) and the block skeleton of attention_wgmma.cuh:
// warpgroup products (wgmma) on tiles that the copy engine (TMA) brings into shared memory.
//
// Work item: a query tile of 64 NWG rows of one (b, h): NWG = 3 consumer warpgroups at HS = 64
// (more warps a scheduler to hide each one's chain of products and exponentials: FlashAttention-3's
// 192-row tiles, tile_size_fwd_sm90), 2 at 128 (registers). The producer copies its Q once, then
// the K and V tiles (128 keys each) its last row sees (attention.cuh: [0, q0 + rows + delta), at
// most Tk). Each consumer warpgroup (64 of the rows), per key tile that some of its rows see (the
// products of tile j issued with the last tile's P V, which runs under tile j's softmax):
//   S = Q K^T (64 x 128, fp32 in registers; both operands in shared memory, K-major)
//   mask (key > row + delta or key >= Tk: -inf) on tiles crossing the warpgroup's diagonal or the
//   keys' end; online softmax in base 2 as attention_forward.cu's simple kernel does it in base e
//   (m in raw score units, the scale folded into one FMA: P = 2^(S c - m' c), c = log2(e)/sqrt(HS))
//   O = O 2^((m-m') c) + P V (P rounded to bf16 as the register A operand; V N-major)
// then O /= l, lse = m / sqrt(HS) + ln l (a row that saw no key: O = 0, lse = -inf), stored from
// the accumulator registers; rows outside [0, Tq) are not stored. The warpgroups take turns to issue a
// tile's products (FlashAttention-3's warpgroup scheduling barriers: FW_TURN), so that one's
// softmax runs while another's products do. Rows outside [0, Tq) and keys past Tk arrive as
// zeros (the tensor maps' bounds), and are masked.
#include "backend/cuda/attention_wgmma.cuh"

#define FW_KEYS 128 // keys per tile
#define FW_STAGES 2 // K/V tiles in flight
#define FW_TURN 2   // named barriers FW_TURN + w: consumer warpgroup w's turn to issue its products
__host__ __device__ constexpr int fw_nwg(int hs) { return hs == 64 ? 3 : 2; }
template <int HS> using fw_smem = att_smem<HS, fw_nwg(HS), 1, FW_KEYS, FW_STAGES>;

template <int HS>
__global__ void __launch_bounds__(att_threads(fw_nwg(HS)), 1)
attention_forward_wgmma_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mkv,
                               bf16 *out, float *lse, int *counter, attn_dims d, float sl2) {
    cuda_pdl_begin();
    extern __shared__ unsigned char fw_raw[];
    constexpr int NWG = fw_nwg(HS), ROWS = 64 * NWG; // consumer warpgroups, an item's query rows
    const fw_smem<HS> sm(fw_raw);
    int Tq = d.Tq, ntiles = (Tq + ROWS - 1) / ROWS, total = ntiles * d.B * d.NH;
    // an item's copies: its Q tile (rows q0..), then the K and V tiles its last row sees. Tiles end
    // at Tq, so that where ROWS does not divide Tq the ragged tile is the first (from row Tq -
    // ntiles ROWS < 0: rows before 0 arrive as zeros, see nothing under the causal mask and are not
    // stored), which the mask leaves one key tile, not the last, which would stream every key
    // with only some of its warpgroups at work (gpt2's T = 1024 at hs 64: 5 1/3 tiles of 192 rows).
    auto plan = [&](int item) {
        att_place p = att_tile_at(d, item, ntiles, true);
        int h = p.bh % d.NH, q0 = Tq - (ntiles - p.tile) * ROWS, kcol = d.ldk - 2 * d.C + h * HS;
        int nkt = att_key_tiles(d, q0, ROWS, FW_KEYS);
        return att_job{{{&mq, h * HS}, {}}, {{&mkv, kcol}, {&mkv, kcol + d.C}}, q0, 0, nkt, p.bh / d.NH};
    };
    if (sm.producer(total, counter, plan)) return;
    int w = threadIdx.x / 128 - 1, t = threadIdx.x % 4; // w: the consumer warpgroup (0 .. NWG - 1)
    int j = 0; // key tiles of the block's earlier items
    for (int k = 0, item; (item = sm.next_item(k, total)) < total; k++) {
        att_place p = att_tile_at(d, item, ntiles, true);
        att_job job = plan(item);
        int q0 = job.own_row, nkt = job.n;
        int r0 = q0 + 64 * w, rw = att_wg_row(r0); // the warpgroup's first row; the thread's rows rw, rw + 8
        int nkw = att_key_tiles(d, r0, 64, FW_KEYS); // tiles it sees
        float o[HS / 2] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
        // Tile jj's scores sc = S: masked, the running max m and sum l moved on, sc = P (unnormalised),
        // corr the factor that rescales what O holds.
        auto softmax = [&](int jj, float(&sc)[FW_KEYS / 2], float(&corr)[2]) {
            int k0 = jj * FW_KEYS;
            if (k0 + FW_KEYS - 1 > r0 + d.delta || k0 + FW_KEYS > d.Tk) // crosses the diagonal or the keys' end
#pragma unroll
                for (int i = 0; i < FW_KEYS / 8; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int row = rw + 8 * (e >> 1), key = k0 + 8 * i + 2 * t + (e & 1);
                        if (key > row + d.delta || key >= d.Tk) sc[4 * i + e] = -INFINITY;
                    }
#pragma unroll
            for (int r = 0; r < 2; r++) { // a row's 128 scores are spread over a quad's 4 lanes
                float mx = m[r];
#pragma unroll
                for (int i = 0; i < FW_KEYS / 8; i++) mx = fmaxf(mx, fmaxf(sc[4 * i + 2 * r], sc[4 * i + 2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float msc = mx == -INFINITY ? 0.0f : mx * sl2, sum = 0.0f; // msc 0: a row with nothing visible yet
                corr[r] = att_exp2(m[r] * sl2 - msc);
                m[r] = mx;
#pragma unroll
                for (int i = 0; i < FW_KEYS / 8; i++)
#pragma unroll
                    for (int e = 2 * r; e < 2 * r + 2; e++) {
                        sc[4 * i + e] = att_exp2(fmaf(sc[4 * i + e], sl2, -msc));
                        sum += sc[4 * i + e];
                    }
                l[r] = l[r] * corr[r] + sum;
            }
        };
        // The consumer warpgroups take turns to issue a tile's products (FlashAttention-3's warpgroup
        // scheduling barriers), so that one's softmax runs while another's products do: warpgroup w
        // waits at barrier FW_TURN + w, issues, and passes the turn to w + 1 (the last to 0). Every
        // warpgroup takes nkt turns an item, those past its own tiles empty; the last warpgroup gives
        // warpgroup 0 its first turn and does not pass its last, so no arrival outlives the item.
        auto turn = [&]() { named_sync<256>(FW_TURN + w); };
        auto pass = [&](int jj) {
            if (w != NWG - 1 || jj < nkt - 1) named_arrive<256>(FW_TURN + (w + 1) % NWG);
        };
        if (w == NWG - 1 && nkt > 0) named_arrive<256>(FW_TURN);
        uint32_t pa[FW_KEYS / 16][4]; // P of the last tile, the A operand of its O += P V
        if (nkw > 0) { // tile 0: S = Q K^T, its softmax (O is still 0)
            float sc[FW_KEYS / 2], corr[2];
            sm.wait(j, 0);
            wg_fence();
            turn();
            att_product_ss<FW_KEYS, HS>(sc, sm.own_op(k, 0), ROWS, 64 * w, sm.stage_op(j, 0), FW_KEYS);
            wg_commit();
            pass(0);
            wg_wait<0>();
            wg_hold(sc);
            sm.release(j, 0); // K
            softmax(0, sc, corr);
            att_frags<FW_KEYS>(pa, sc);
        }
        // Tile jj > 0 issues S = Q K^T, then the last tile's O += P V, which runs under this tile's
        // softmax (FlashAttention-3's overlap within a warpgroup, its Algorithm 2): the products
        // and the exponentials of one warpgroup overlap, not only the two warpgroups'.
        for (int jj = 1; jj < nkw; jj++) {
            int jt = j + jj;
            float sc[FW_KEYS / 2], corr[2];
            sm.wait(jt, 0);
            sm.wait(jt - 1, 1);
            wg_hold(o);
            wg_fence();
            turn();
            att_product_ss<FW_KEYS, HS>(sc, sm.own_op(k, 0), ROWS, 64 * w, sm.stage_op(jt, 0), FW_KEYS); // S = Q K^T
            wg_commit();
            att_product_rs<HS, FW_KEYS>(o, pa, sm.stage_op(jt - 1, 1), FW_KEYS); // O += P V, the last tile's
            wg_commit();
            pass(jj);
            wg_wait<1>(); // S landed; O += P V may still run
            wg_hold(sc);
            sm.release(jt, 0); // K
            softmax(jj, sc, corr);
            wg_wait<0>(); // O += P V retired: the last tile's V and P fragments are free
            wg_hold(o);
            wg_hold(pa);
            sm.release(jt - 1, 1);
#pragma unroll
            for (int i = 0; i < HS / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[4 * i + e] *= corr[e >> 1];
            att_frags<FW_KEYS>(pa, sc);
        }
        if (nkw > 0) { // the last visible tile's O += P V
            int jt = j + nkw - 1;
            sm.wait(jt, 1);
            wg_hold(o);
            wg_fence();
            att_product_rs<HS, FW_KEYS>(o, pa, sm.stage_op(jt, 1), FW_KEYS);
            wg_commit();
            wg_wait<0>();
            wg_hold(o);
            sm.release(jt, 1);
        }
        for (int jj = nkw; jj < nkt; jj++) { // tiles no row of the warpgroup sees: let them go once landed
            sm.wait(j + jj, 0);
            sm.wait(j + jj, 1);
            turn();
            pass(jj);
            sm.release(j + jj);
        }
        j += nkt;
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float L = l[r];
            L += __shfl_xor_sync(0xffffffffu, L, 1);
            L += __shfl_xor_sync(0xffffffffu, L, 2);
            inv[r] = L > 0.0f ? 1.0f / L : 0.0f; // a row that saw no key: O = 0
            int row = rw + 8 * r;
            if (t == 0 && row >= 0 && row < Tq) lse[(int64_t)p.bh * Tq + row] = L > 0.0f ? (m[r] * sl2 + __log2f(L)) * ATT_LN2 : -INFINITY;
        }
        att_store<HS>(out + p.o, d.C, o, inv, r0, Tq, false);
    }
}

template <int HS>
static void launch_forward(loom_cuda *cu, attn_dims d, bf16 *out, float *lse, const bf16 *q, const bf16 *kv) {
    constexpr int ROWS = 64 * fw_nwg(HS);
    int total = (d.Tq + ROWS - 1) / ROWS * d.B * d.NH, *counter = (int *)cuda_scratch(cu, sizeof(int));
    int smem = (int)fw_smem<HS>::bytes;
    CUtensorMap mq = hopper_tensor_map(q, d.B, d.Tq, d.ldq, ROWS), mkv = hopper_tensor_map(kv, d.B, d.Tk, d.ldk, FW_KEYS);
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_wgmma_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem));
    cuda_launch(cu->stream, attention_forward_wgmma_kernel<HS>, att_grid(cu, total, counter), att_threads(fw_nwg(HS)),
                smem, mq, mkv, out, lse, counter, d, ATT_LOG2E / sqrtf((float)HS));
}

void attention_forward_wgmma(loom_cuda *cu, attn_dims d, bf16 *out, float *lse, const bf16 *q, const bf16 *kv) {
    if (d.hs == 64)
        launch_forward<64>(cu, d, out, lse, q, kv);
    else
        launch_forward<128>(cu, d, out, lse, q, kv);
}
