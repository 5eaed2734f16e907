// Attention backward on Hopper (sm_90a) for bf16 with head size HS = 64 or 128, FlashAttention-2's
// (Dao 2023, Algorithm 2) on warpgroup products in the block skeleton of attention_wgmma.cuh (a
// producer warp copying by TMA, two consumer warpgroups of 64 own rows each; FlashAttention-3, Shah
// et al. 2024), deterministic. With D = rowsum(dO * O), S = Q K^T:
//   P = exp(S / sqrt(HS) - lse);  dP = dO V^T;  dS = P * (dP - D)
//   dV += P^T dO;  dK += dS^T Q / sqrt(HS);  dQ += dS K / sqrt(HS)
// (written, or with span.accumulate added to what dq and dkv hold).
//   prep (first): D and -lse log2(e) of every query row into scratch (bw_args), in rows padded to 4
//       (16-byte aligned, as the bulk copies need); zeroes the dQ order counters.
//   dkv: work item (key tile of 128, b, h); owns K and V; streams query tiles of bw_step(HS) rows,
//       with their rows of -lse log2(e) and D (bulk copies), from the first that sees the tile's
//       first key (bw_first_query) to Tq: S^T = K Q^T and dP^T = V dO^T, so that P^T and dS^T are
//       register fragments for dV += P^T dO and dK += dS^T Q (Q and dO N-major).
//   dkv computes dQ too: 5 tile products per pair of tiles, as FlashAttention-2 does. Each
//   warpgroup puts its dS (the tile's queries x its 64 keys) into shared memory (stmatrix,
//   transposed). At HS = 64 each computes dQ = dS K for the tile's queries over its own keys:
//   warpgroup 0 stores its fp32 partial in shared memory and warpgroup 1 adds its own (so the two
//   meet only there, not at a barrier every tile), and the two take turns to issue their products
//   (the forward's warpgroup scheduling, BW_TURN). At HS = 128 (registers) each computes its half
//   of dQ's columns over all 128 keys, from both halves of dS (a barrier of both warpgroups before
//   and after the dS store), and stores it beside the other's (FlashAttention-3's split there).
//   The partial goes to the producer warpgroup's second warp, which adds it into an fp32
//   accumulator (a bulk reduce-add in L2) when it is this key tile's turn at that query tile: a
//   counter per query tile passes the turn from key tile to key tile in a fixed order
//   (FlashAttention-3's deterministic mode), so the sums are the same bits in every run. The order is the last key tile first (bw_turn), which stores instead of adding:
//   a key tile starts at its diagonal and walks up, so the tile above it reached each query tile
//   one step earlier. Items go out in the same order within a head (shortest first), and only to
//   running blocks, so the turn always comes. dq_out then scales the accumulator into dq.
// With a bias gradient wanted (dbias), each warp sums the columns of its 16 rows of dK and dV as it
// stores them, and dq_out those of dQ, in fp32 before the rounding to bf16, into partials (16-row
// chunks x 3C); add_partials (reduce.cu) then adds the chunks in order into dbias.
// The mask (key > query + delta) is applied only on tiles crossing a warpgroup's diagonal; tiles
// wholly masked for a warpgroup are skipped (at HS = 128 only where neither warpgroup sees them).
// Rows past Tq or Tk arrive as zeros; queries past Tq and rows whose lse is -inf get P = 0; keys
// past Tk, zero rows of K, add nothing to dQ; rows past the ends are not stored.
#include "backend/cuda/attention_wgmma.cuh"
#include "backend/cuda/vec.cuh"

#include <limits.h>

// Queries a streamed tile: 128 at HS = 64 (fewer, larger products), 64 at 128 (registers)
__host__ __device__ constexpr int bw_step(int hs) { return hs == 64 ? 128 : 64; }
// Buffers of the own K and V: at HS = 128 two (128 KB) leave no room for the dQ hand-off beside
// the stages, so item k+1's K and V are copied once item k is done.
__host__ __device__ constexpr int bw_own_buffers(int hs) { return hs == 64 ? 2 : 1; }
// How the two warpgroups split a tile's dQ: at HS = 64 by keys (each all of dQ over its own 64
// keys, the partials summed in shared memory), at 128 by columns (each its HS/2 columns over all
// 128 keys, from both warpgroups' dS: 32 accumulator registers instead of 64).
__host__ __device__ constexpr bool bw_dq_cols(int hs) { return hs == 128; }
#define BW_STAGES 2
#define BW_NWG 2 // consumer warpgroups (64 of the 128 own keys each)
#define BW_DS 2 // named barriers BW_DS + w (by keys; by columns BW_DS for both): the dS half may be overwritten / is whole
#define BW_TURN 4 // named barriers BW_TURN + w: consumer warpgroup w's turn to issue its products (by keys)
static inline int bw_tp(int Tq) { return (Tq + 3) & ~3; }

// The first query row a key tile from k0 streams: the first that sees k0, rounded down to a
// multiple of step (so that every key tile streams the same query tiles); Tq if none sees it.
__host__ __device__ __forceinline__ int bw_first_query(const attn_dims &d, int k0, int step) {
    return min(max(k0 - d.delta, 0) / step * step, d.Tq);
}

// Bias partials: chunks of 16 rows (a warp's rows of a 64-row accumulator) a sequence
static inline int bw_bias_chunks(attn_dims d) { return (max(d.Tq, d.Tk) + 15) / 16; }

// scratch (bytes from its start): the work counter (16), nl and D (B*NH, Tp) each, 128 floats of
// zeros, then the dQ order counters (B*NH*MQ ints, MQ query tiles of bw_step) and the fp32 dQ
// accumulator (B*NH*MQ tiles of bw_step x HS in accumulator order, bw_dq_at). The bias partials
// (B * bw_bias_chunks, 3C) fp32 are cuda_partials', so that their add may wait (grads_defer).
struct bw_layout {
    size_t nl, D, sem, acc, bytes;
};
static bw_layout bw_layout_of(attn_dims d) {
    size_t bnh = (size_t)d.B * d.NH, step = (size_t)bw_step(d.hs), mq = (d.Tq + step - 1) / step;
    bw_layout l;
    l.nl = 16, l.D = l.nl + bnh * bw_tp(d.Tq) * 4, l.sem = l.D + bnh * bw_tp(d.Tq) * 4 + 128 * 4;
    l.acc = (l.sem + bnh * mq * 4 + 127) / 128 * 128;
    l.bytes = l.acc + bnh * mq * step * d.hs * 4;
    return l;
}
size_t attention_backward_wgmma_scratch(attn_dims d) { return bw_layout_of(d).bytes; }

struct bw_args {
    bf16 *dq, *dkv;
    const bf16 *dout, *out;
    const float *lse;
    // (B*NH, Tp) each: bw_neg_lse2(lse) and D of the query rows, from prep; D is 0 at rows [Tq, Tp)
    // and at the 128 floats past its end, which the last tile's copies may read
    float *nl, *D;
    int *counter; // the dkv kernel's handed-out work items
    int *sem;     // (B*NH, MQ) key tiles that have added into each query tile's dQ
    float *acc;   // the dQ accumulator
    float *bpart; // the bias partials (B * bch, 3C), or NULL: no bias gradient
    int Tp, mq, bch; // Tq rounded up to 4; query tiles of bw_step; bw_bias_chunks
    attn_dims d;
    float sl2, scale; // log2(e)/sqrt(HS), 1/sqrt(HS)
};

// -lse log2(e): the exponent offset of P = 2^(s sl2 - lse log2(e)); -inf (P = 0) where lse is -inf
__device__ __forceinline__ float bw_neg_lse2(float lse) { return lse == -INFINITY ? -INFINITY : -lse * ATT_LOG2E; }

// D and nl of row (bh, i) for i < Tp, two threads a row (each half of dO . O); the dQ order
// counters zeroed.
template <int HS> __global__ void attention_backward_prep_kernel(bw_args a) {
    cuda_pdl_begin();
    const attn_dims &d = a.d;
    int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 2;
    int half = threadIdx.x & 1, bh = (int)(r / a.Tp), i = (int)(r % a.Tp);
    bool in = bh < d.B * d.NH && i < d.Tq;
    float s = 0.0f;
    if (in) {
        int64_t o = ((int64_t)(bh / d.NH) * d.Tq + i) * d.C + bh % d.NH * HS + half * (HS / 2);
        const uint4 *op = (const uint4 *)(a.out + o), *dp = (const uint4 *)(a.dout + o);
#pragma unroll
        for (int k = 0; k < HS / 16; k++) {
            uint4 x = dp[k], y = op[k];
            const __nv_bfloat162 *xs = (const __nv_bfloat162 *)&x, *ys = (const __nv_bfloat162 *)&y;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 xf = __bfloat1622float2(xs[e]), yf = __bfloat1622float2(ys[e]);
                s += xf.x * yf.x + xf.y * yf.y;
            }
        }
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if (half || bh >= d.B * d.NH) return;
    a.D[r] = s; // 0 past Tq
    if (in) a.nl[r] = bw_neg_lse2(a.lse[(int64_t)bh * d.Tq + i]);
    if (in && i % bw_step(HS) == 0) a.sem[(int64_t)bh * a.mq + i / bw_step(HS)] = 0;
}

// The dQ hand-off in the extra shared memory: dS of the tile (bf16, queries x 128 keys as two
// K-major tiles of STEP rows x 64 keys, swizzled), the dQ partial (fp32, STEP x HS in accumulator
// order: blocks of 64 rows x N columns, down the rows (by keys: N = HS) or across the columns (by
// columns: N = HS/2, bw_dq_cols); block b, warp v, register quad i (of N/8), lane l at float4
// ((4b + v) N/8 + i) 32 + l), its full barrier (the threads that hand it over: warpgroup 1's 128
// when split by keys, both warpgroups' 256 by columns), empty barrier (the writer has read it),
// half barrier (by keys, warpgroup 0's 128 threads: its partial is in), and where it goes.
struct bw_meta {
    int64_t at; // float offset of the query tile in the accumulator
    int sem, n; // its order counter; this key tile's turn (bw_turn); n < 0: no more tiles
};
template <int HS> struct bw_dq_smem {
    static constexpr int STEP = bw_step(HS), DS = STEP * 128 * 2, ACC = STEP * HS * 4;
    static constexpr int bytes = DS + ACC + 24 + (int)sizeof(bw_meta);
    unsigned char *base;
    __device__ __forceinline__ unsigned char *ds() const { return base; }
    __device__ __forceinline__ float *acc() const { return (float *)(base + DS); }
    __device__ __forceinline__ uint64_t *full() const { return (uint64_t *)(base + DS + ACC); }
    __device__ __forceinline__ uint64_t *empty() const { return full() + 1; }
    __device__ __forceinline__ uint64_t *half() const { return full() + 2; }
    __device__ __forceinline__ bw_meta *meta() const { return (bw_meta *)(full() + 3); }
};
// The turn of key tile n (of 128 keys) at query tile m (of step rows): the key tiles that stream
// it are 0..last (bw_first_query), and they add in the order last, last - 1, ..., 0.
__device__ __forceinline__ int bw_turn(const attn_dims &d, int m, int n, int step) {
    int x = (m + 1) * step + d.delta; // n streams m when n ATT_WG_ROWS < x (x >= 1 then)
    return min((d.Tk + ATT_WG_ROWS - 1) / ATT_WG_ROWS - 1, (x - 1) / ATT_WG_ROWS) - n;
}
// Float offset of query tile m of head bh in the accumulator
__host__ __device__ __forceinline__ int64_t bw_dq_at(const bw_args &a, int bh, int m, int hs) {
    return ((int64_t)bh * a.mq + m) * bw_step(hs) * hs;
}

// The writer (lane 0 of the producer warpgroup's second warp): each dQ partial the consumers hand
// over, once it is this key tile's turn at the query tile, stored (turn 0) or added into the
// accumulator; then the turn passes on. Ends at the consumers' n < 0.
template <int HS> __device__ void bw_write_dq(const bw_dq_smem<HS> &x, const bw_args &a) {
    for (int u = 0;; u++) {
        mbar_wait(x.full(), u & 1);
        bw_meta m = *x.meta();
        if (m.n < 0) break;
        int *sem = a.sem + m.sem;
        while (m.n > 0 && ld_acquire(sem) != m.n) {
        }
        fence_async_global();
        if (m.n == 0)
            bulk_store(a.acc + m.at, x.acc(), bw_dq_smem<HS>::ACC);
        else
            bulk_add_f32(a.acc + m.at, x.acc(), bw_dq_smem<HS>::ACC);
        bulk_commit();
        bulk_wait_read();
        mbar_arrive(x.empty());
        bulk_wait();
        fence_async_global();
        red_release_add(sem, 1);
    }
}

// The warp's 16 keys of dS^T (da, as held: keys x STEP queries) into the dS tiles as queries x keys:
// k-step kk is queries 16kk..16kk+15, four 8x8 matrices (keys 0-7, 8-15 of the warp) x (queries
// +0-7, +8-15), stored transposed.
template <int STEP>
__device__ __forceinline__ void bw_store_ds(unsigned char *ds, const uint32_t (&da)[STEP / 16][4], int w) {
    int lane = threadIdx.x % 32, mi = lane / 8, r = lane % 8, chunk = 2 * (threadIdx.x / 32 % 4) + (mi & 1);
    unsigned char *p = ds + w * STEP * 128 + (8 * (mi >> 1) + r) * 128 + ((chunk ^ r) << 4);
#pragma unroll
    for (int kk = 0; kk < STEP / 16; kk++) stsm_x4_trans(p + kk * 16 * 128, da[kk]);
}

// The kernel's shared memory: two consumer warpgroups, own K and V, stages of Q and dO with their
// nl and D, the dQ hand-off
template <int HS>
using bw_smem = att_smem<HS, BW_NWG, 2, bw_step(HS), BW_STAGES, 2, bw_dq_smem<HS>::bytes, bw_own_buffers(HS)>;

template <int HS>
__global__ void __launch_bounds__(att_threads(BW_NWG), 1)
attention_backward_dkv_wgmma_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mdo,
                                    const __grid_constant__ CUtensorMap mkv, bw_args a) {
    cuda_pdl_begin();
    extern __shared__ unsigned char bw_raw[];
    constexpr int STEP = bw_step(HS);
    const bw_smem<HS> sm(bw_raw);
    const bw_dq_smem<HS> x{sm.extra()};
    const attn_dims &d = a.d;
    int Tq = d.Tq, ntiles = (d.Tk + ATT_WG_ROWS - 1) / ATT_WG_ROWS, total = ntiles * d.B * d.NH;
    // an item's copies: its K and V tiles (rows k0..), then the Q and dO tiles, with their nl and
    // D, from the first query tile that sees k0 (qs) to Tq. Fused, the key tiles of a head go out
    // last first: each adds to a query tile's dQ after the key tiles above it (bw_turn), which
    // reach that query tile earlier.
    auto plan = [&](int item) {
        att_place p = att_tile_at(d, item, ntiles, true);
        int h = p.bh % d.NH, k0 = p.tile * ATT_WG_ROWS, kcol = d.ldk - 2 * d.C + h * HS;
        int qs = bw_first_query(d, k0, STEP), nst = (Tq - qs + STEP - 1) / STEP;
        int64_t at = (int64_t)p.bh * a.Tp + qs;
        return att_job{{{&mkv, kcol}, {&mkv, kcol + d.C}}, {{&mq, h * HS}, {&mdo, h * HS}}, k0, qs, nst, p.bh / d.NH,
                       {a.nl + at, a.D + at}};
    };
    if (threadIdx.x == 0) // fenced in producer()
        mbar_init(x.full(), bw_dq_cols(HS) ? 256 : 128), mbar_init(x.empty(), 1), mbar_init(x.half(), 128);
    if (sm.template producer<true>(total, a.counter, plan)) {
        if (threadIdx.x == 32) bw_write_dq(x, a);
        return;
    }
    int w = threadIdx.x / 128 - 1, t = threadIdx.x % 4; // w: the consumer warpgroup (0 or 1)
    int j = 0; // query tiles of the block's earlier items
    for (int k = 0, item; (item = sm.next_item(k, total)) < total; k++) {
        att_place p = att_tile_at(d, item, ntiles, true);
        att_job job = plan(item);
        int k0 = job.own_row, nst = job.n;
        int kw = k0 + 64 * w, rk = att_wg_row(kw); // the warpgroup's first key; the thread's keys rk, rk + 8
        float dk[HS / 2] = {}, dv[HS / 2] = {};
        // Split by keys, the warpgroups take turns to issue their products (as the forward's FW_TURN):
        // w issues a tile's S^T and dP^T, then w + 1 does, then w its dV, dK, dQ, then w + 1, so
        // that one's exponentials and dS run under the other's products. Each takes 2 nst turns an
        // item; warpgroup 1 gives the first and does not pass its last. By columns the two meet at
        // the dS barrier every tile, so there is nothing to alternate.
        constexpr bool TURNS = !bw_dq_cols(HS);
        auto turn = [&]() {
            if (TURNS) named_sync<256>(BW_TURN + w);
        };
        auto pass = [&](bool last) {
            if (TURNS && (w == 0 || !last)) named_arrive<256>(BW_TURN + 1 - w);
        };
        if (TURNS && w == 1 && nst > 0) named_arrive<256>(BW_TURN);
        for (int jj = 0; jj < nst; jj++, j++) {
            int qt = job.row0 + jj * STEP;
            sm.wait(j, 0);
            sm.wait(j, 1);
            // some query of the tile sees some key of the warpgroup
            // (split by columns, both warpgroups take every tile: the first sees k0, and the
            // other's dS, all 0 where it sees nothing, is half of each one's dQ)
            bool seen = bw_dq_cols(HS) || (qt + STEP - 1 + d.delta >= kw && kw < d.Tk);
            uint32_t pa[STEP / 16][4], da[STEP / 16][4]; // P^T and dS^T as A fragments (att_frags)
            turn();
            if (seen) {
                float st[STEP / 2], dpt[STEP / 2];
                wg_fence();
                att_product_ss<STEP, HS>(st, sm.own_op(k, 0), ATT_WG_ROWS, 64 * w, sm.stage_op(j, 0), STEP);  // S^T
                att_product_ss<STEP, HS>(dpt, sm.own_op(k, 1), ATT_WG_ROWS, 64 * w, sm.stage_op(j, 1), STEP); // dP^T
                wg_commit();
                pass(false);
                wg_wait<0>();
                wg_hold(st);
                wg_hold(dpt);
                bool diag = qt + d.delta < kw + 63; // some (key, query) pair of the warpgroup is masked
                // there, a query before lo[r] does not see the thread's key rk + 8r
                const int lo[2] = {diag ? rk - d.delta : INT_MIN, diag ? rk + 8 - d.delta : INT_MIN};
                const float *nls = sm.stage_vec(j, 0), *D = sm.stage_vec(j, 1); // of the tile's queries
#pragma unroll
                for (int i = 0; i < STEP / 8; i++) {
                    int q = 8 * i + 2 * t; // the thread's queries qt + q, + 1
                    float2 l2 = *(const float2 *)(nls + q), d2 = *(const float2 *)(D + q);
                    float nl[2] = {l2.x, l2.y}, dd[2] = {d2.x, d2.y}, p[4], ds[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int query = qt + q + (e & 1);
                        float pe = att_exp2(fmaf(st[4 * i + e], a.sl2, nl[e & 1]));
                        // masked, or past Tq (nl there is another head's, or was never written); `|`,
                        // not `||`: a select, where the short circuit compiled to branches an element
                        p[e] = (query < lo[e >> 1]) | (query >= Tq) ? 0.0f : pe;
                        ds[e] = p[e] * (dpt[4 * i + e] - dd[e & 1]); // D is finite everywhere (bw_args)
                    }
                    att_frag_put(pa, i, p);
                    att_frag_put(da, i, ds);
                }
            } else
                pass(false);
            // dQ of the tile's queries: by keys, H blocks of 64 rows x HS over the warpgroup's keys;
            // by columns, one block of 64 rows x HS/2 (its columns) over all 128 keys
            constexpr bool COLS = bw_dq_cols(HS);
            constexpr int H = COLS ? 1 : STEP / 64, N = COLS ? HS / 2 : HS, Q = N / 8; // Q: register quads a row
            constexpr int DS_THREADS = COLS ? 256 : 128; // who reads a warpgroup's half of the dS tile
            float dq[H][N / 2];
            if (seen) { // the warpgroup's dS^T into its half of the dS tile; dV, dK, dQ
                int bar = COLS ? BW_DS : BW_DS + w;
                turn();
                named_sync<DS_THREADS>(bar); // the last dQ products reading the half are done in every warp
                bw_store_ds<STEP>(x.ds(), da, w);
                fence_async_smem();
                named_sync<DS_THREADS>(bar);
                wg_hold(dv);
                wg_hold(dk);
                wg_fence();
                att_product_rs<HS, STEP>(dv, pa, sm.stage_op(j, 1), STEP); // dV += P^T dO
                att_product_rs<HS, STEP>(dk, da, sm.stage_op(j, 0), STEP); // dK += dS^T Q
                wg_commit();
                wg_fence();
                if (COLS) // dQ = dS K: the whole dS tile, K's columns of the warpgroup
                    att_product_sn<N, 128>(dq[0], x.ds(), STEP, 0, sm.own_op(k, 0) + w * ATT_WG_ROWS * 128, ATT_WG_ROWS);
                else
#pragma unroll
                    for (int h = 0; h < H; h++) // dQ = dS K: the warpgroup's half of dS, its keys of K
                        att_product_sn<N, 64>(dq[h], x.ds() + w * STEP * 128, STEP, 64 * h, sm.own_op(k, 0) + 64 * w * 128,
                                              ATT_WG_ROWS);
                wg_commit();
                pass(jj == nst - 1);
                wg_wait<0>();
#pragma unroll
                for (int h = 0; h < H; h++) wg_hold(dq[h]);
                wg_hold(dv);
                wg_hold(dk);
            } else {
                turn();
                pass(jj == nst - 1);
            }
            sm.release(j);
            // The partial into shared memory (once the writer has read the last one), in accumulator
            // order (bw_dq_at): by columns each warpgroup stores its block and hands it to the writer;
            // by keys warpgroup 0 stores its partial, then warpgroup 1 adds its own and hands the sum.
            float4 *o = (float4 *)x.acc() + (threadIdx.x / 32 % 4) * Q * 32 + threadIdx.x % 32;
            const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (COLS || w == 0) {
                if (j > 0) mbar_wait(x.empty(), (j - 1) & 1);
                int b0 = COLS ? w : 0; // the first block it stores
#pragma unroll
                for (int h = 0; h < H; h++)
#pragma unroll
                    for (int i = 0; i < Q; i++) {
                        const float *v = dq[h] + 4 * i;
                        o[(4 * (b0 + h) * Q + i) * 32] = seen ? make_float4(v[0], v[1], v[2], v[3]) : zero;
                    }
                // the writer's bulk copy reads these values as they are where warpgroup 1
                // adds nothing (its keys unseen): fenced by the threads that wrote them
                fence_async_smem();
                if (!COLS) mbar_arrive(x.half());
            } else {
                mbar_wait(x.half(), j & 1);
                if (seen)
#pragma unroll
                    for (int h = 0; h < H; h++)
#pragma unroll
                        for (int i = 0; i < Q; i++) {
                            const float *v = dq[h] + 4 * i;
                            float4 *q = o + (4 * h * Q + i) * 32, y = *q;
                            *q = make_float4(y.x + v[0], y.y + v[1], y.z + v[2], y.w + v[3]);
                        }
                fence_async_smem();
            }
            if (COLS || w == 1) {
                int m = qt / STEP;
                if (threadIdx.x == 256) *x.meta() = {bw_dq_at(a, p.bh, m, HS), p.bh * a.mq + m, bw_turn(d, m, p.tile, STEP)};
                mbar_arrive(x.full());
            }
        }
        const float sk[2] = {a.scale, a.scale}, sv[2] = {1.0f, 1.0f};
        att_store<HS>(a.dkv + p.k, d.ldk, dk, sk, kw, d.Tk, d.add);
        att_store<HS>(a.dkv + p.k + d.C, d.ldk, dv, sv, kw, d.Tk, d.add);
        int chunk = kw / 16 + threadIdx.x / 32 % 4; // the warp's 16 keys
        if (a.bpart && chunk < a.bch) {
            float *part = a.bpart + ((int64_t)(p.bh / d.NH) * a.bch + chunk) * 3 * d.C + d.C + p.bh % d.NH * HS;
            att_colsum16<HS>(part, dk, a.scale, kw, d.Tk);
            att_colsum16<HS>(part + d.C, dv, 1.0f, kw, d.Tk);
        }
    }
    if (bw_dq_cols(HS) || w == 1) { // tell the writer there is no more
        if (j > 0) mbar_wait(x.empty(), (j - 1) & 1);
        if (threadIdx.x == 256) x.meta()->n = -1;
        mbar_arrive(x.full());
    }
}

// dq (=, or += with d.add) from the dkv kernel's accumulator times 1/sqrt(HS): one thread the four
// float4 that lanes 4k .. 4k + 3 of a register quad left, two rows (k and k + 8 of a warp's 16) x 8
// columns, stored 16 bytes a row (a warp: 8 rows x 32 columns twice, 64 contiguous bytes a row);
// rows of query tiles that no key tile streamed (they see no key) get 0. With bias partials, the
// column sums of each 16 rows < Tq, over the 8 threads that hold them.
template <int HS> __global__ void attention_backward_dq_out_kernel(bw_args a) {
    cuda_pdl_begin();
    constexpr bool COLS = bw_dq_cols(HS);
    constexpr int STEP = bw_step(HS), PER = STEP * HS / 16, N = COLS ? HS / 2 : HS, Q = N / 8; // threads a query tile; a block's columns, quads
    const attn_dims &d = a.d;
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (int64_t)d.B * d.NH * a.mq * PER) return;
    int64_t tile = g / PER;
    int o = (int)(g % PER), bh = (int)(tile / a.mq), m = (int)(tile % a.mq);
    // register quad i of warp v % 4 of block v / 4: 64 rows x N columns, blocks down the rows (by
    // keys) or across the columns (by columns); k: lanes 4k .. 4k + 3 of the quad
    int k = o % 8, i = o / 8 % Q, v = o / (8 * Q), blk = v / 4;
    int row = m * STEP + (COLS ? 0 : 64 * blk) + 16 * (v % 4) + k, col = (COLS ? N * blk : 0) + 8 * i;
    float y[2][8]; // rows row and row + 8, columns col .. col + 7, times the scale
    bool seen = m * STEP >= bw_first_query(d, 0, STEP);
#pragma unroll
    for (int l = 0; l < 4; l++) {
        float4 x = seen ? ((const float4 *)a.acc)[4 * g + l] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        y[0][2 * l] = x.x * a.scale, y[0][2 * l + 1] = x.y * a.scale;
        y[1][2 * l] = x.z * a.scale, y[1][2 * l + 1] = x.w * a.scale;
    }
    int chunk = (row - k) / 16; // the 16 rows (a warp's 32 threads are 4 quads of the same rows)
    if (a.bpart && chunk < a.bch) {
        float s[8];
#pragma unroll
        for (int c = 0; c < 8; c++) {
            s[c] = (row < d.Tq ? y[0][c] : 0.0f) + (row + 8 < d.Tq ? y[1][c] : 0.0f);
#pragma unroll
            for (int x = 1; x < 8; x *= 2) s[c] += __shfl_xor_sync(0xffffffffu, s[c], x); // over k
        }
        float4 *p = (float4 *)(a.bpart + ((int64_t)(bh / d.NH) * a.bch + chunk) * 3 * d.C + bh % d.NH * HS + col);
        if (k == 0) p[0] = make_float4(s[0], s[1], s[2], s[3]), p[1] = make_float4(s[4], s[5], s[6], s[7]);
    }
    bf16 *dq = a.dq + (int64_t)(bh / d.NH) * d.Tq * d.ldq + bh % d.NH * HS + col;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row + 8 * r >= d.Tq) continue;
        bf16 *p = dq + (int64_t)(row + 8 * r) * d.ldq;
        if (d.add) {
            float old[8];
            vload<bf16, 8>(old, p);
#pragma unroll
            for (int c = 0; c < 8; c++) y[r][c] += old[c];
        }
        vstore<bf16, 8>(p, y[r]);
    }
}

template <int HS>
static void launch_backward(loom_cuda *cu, const bw_args *a, const bf16 *q, const bf16 *kv) {
    const attn_dims &d = a->d;
    int BNH = d.B * d.NH;
    constexpr int STEP = bw_step(HS);
    int64_t prep_threads = 2 * (int64_t)BNH * a->Tp;
    cuda_launch(cu->stream, attention_backward_prep_kernel<HS>, (unsigned)((prep_threads + 255) / 256), 256, 0, *a);
    // dkv and the dQ partials: own K and V tiles of 128 rows, streamed Q and dO tiles of STEP
    int smem = (int)bw_smem<HS>::bytes; // over 48 KB: opt in
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dkv_wgmma_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem));
    unsigned grid = att_grid(cu, (d.Tk + ATT_WG_ROWS - 1) / ATT_WG_ROWS * BNH, a->counter);
    CUtensorMap mq = hopper_tensor_map(q, d.B, d.Tq, d.ldq, STEP);
    CUtensorMap mdo = hopper_tensor_map(a->dout, d.B, d.Tq, d.C, STEP);
    CUtensorMap mkv = hopper_tensor_map(kv, d.B, d.Tk, d.ldk, ATT_WG_ROWS);
    cuda_launch(cu->stream, attention_backward_dkv_wgmma_kernel<HS>, grid, att_threads(BW_NWG), smem, mq, mdo, mkv, *a);
    int64_t n = (int64_t)BNH * a->mq * STEP * HS / 16; // dq_out: a thread four float4 of the accumulator
    cuda_launch(cu->stream, attention_backward_dq_out_kernel<HS>, (unsigned)((n + 255) / 256), 256, 0, *a);
}

void attention_backward_wgmma(loom_cuda *cu, attn_dims d, bf16 *dq, bf16 *dkv, const bf16 *dout, const bf16 *q,
                              const bf16 *kv, const bf16 *out, const float *lse, bf16 *dbias, void *scratch) {
    float scale = 1.0f / sqrtf((float)d.hs);
    bw_layout l = bw_layout_of(d);
    char *s = (char *)scratch;
    int Tp = bw_tp(d.Tq), step = bw_step(d.hs), nparts = d.B * bw_bias_chunks(d);
    size_t bias_bytes = (size_t)nparts * 3 * d.C * sizeof(float);
    float *bpart = dbias ? cuda_partials(cu, bias_bytes) : NULL;
    CUDA_CHECK(cudaMemsetAsync(s + l.sem - 128 * 4, 0, 128 * sizeof(float), cu->stream)); // past D's end
    if (bpart && d.Tq != d.Tk) // the chunks past the shorter side's end are nobody's: zeros
        CUDA_CHECK(cudaMemsetAsync(bpart, 0, bias_bytes, cu->stream));
    bw_args a = {dq, dkv, dout, out, lse, (float *)(s + l.nl), (float *)(s + l.D), (int *)s, (int *)(s + l.sem),
                 (float *)(s + l.acc), bpart, Tp, (d.Tq + step - 1) / step, bw_bias_chunks(d), d, scale * ATT_LOG2E,
                 scale};
    if (d.hs == 64)
        launch_backward<64>(cu, &a, q, kv);
    else
        launch_backward<128>(cu, &a, q, kv);
    if (bpart) cuda_add_partials(cu, dbias, true, !cu->base.grads_write, bpart, nparts, 3 * d.C, 3 * d.C);
}
