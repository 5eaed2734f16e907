// Private to the Hopper attention kernels (attention_forward_wgmma.cu, attention_backward_wgmma.cu):
// the block skeleton they share, after FlashAttention-3 (Shah et al. 2024): warpgroup 0 the
// producer (its first warp issues every bulk tensor copy, one lane of it; the warpgroup keeps 24
// registers), NWG consumer warpgroups after it (2 of 240 registers, or 3 of 160: the forward at
// head size 64, as FlashAttention-3's 192-row tiles there), 64 rows each of the block's own tile.
//
// Blocks are persistent (one an SM) and take work items (own tiles) from a counter as they finish
// the last (most work first, att_tile_at; the fused backward shortest first), so that no SM idles
// while another has items queued. Item k of a block starts at a named barrier (ATT_ITEM_START) of
// the producer warp and the consumers: before it the producer has issued item k's own operands and
// its first streamed tiles; after it, the consumers read item k's index from one of three slots
// (take_slot), and the producer copies item k+1's own operands into the other of two buffers (item
// k-1's, which the consumers finished before the barrier) while the consumers work on item k: the
// copies of one item overlap the products and stores of the last. Every shared-memory hand-off is
// a barrier both sides sync on (bar.sync, mbarrier), which compute-sanitizer's racecheck orders.
// Shared memory (att_smem): OWNB (2, or 1 where shared memory is short) buffers of NOWN "own"
// operands of 64 NWG rows x HS (Q, or K and V), one an item (with one buffer, item k+1's own
// operands are copied only once item k is done, after barrier k+1); then STAGES stages of two
// streamed operands of ROWS rows x HS (K and V, or Q and dO) that the block walks tile by tile,
// and NVEC fp32 vectors of ROWS (dkv: the streamed queries' -lse log2(e) and D, by bulk copies);
// then EXTRA bytes the kernel lays out itself (1024-aligned, `extra`); then the transaction
// barriers: per own buffer own_full (its operands landed), per stage and streamed operand full (it
// landed, operand 0 with the vectors) and empty (the 4 NWG consumer warps are done with it;
// operand 0's with vectors: the 128 NWG consumer threads); then the item slots. Every operand is
// HS/64 tiles of rows x 64 columns, 128-byte swizzled (hopper.cuh). Consumers wait on every
// streamed operand, use it or not, and release it: an operand's slot is refilled only after its
// copy landed and every consumer warp let it go (the forward lets K go before V).
#pragma once
#include "backend/cuda/attention.cuh"
#include "backend/cuda/hopper.cuh"

#define ATT_WG_ROWS 128 // own rows a block of 2 consumer warpgroups (64 each)
#define ATT_ITEM_START 1 // named barrier id
// Threads of a block with NWG consumer warpgroups, and the registers each consumer thread gets
// (the producer warpgroup keeps 24; the launch gave every thread 65,536 / threads, at most 168)
__host__ __device__ constexpr int att_threads(int nwg) { return 128 * (nwg + 1); }
__host__ __device__ constexpr int att_consumer_regs(int nwg) { return nwg == 2 ? 240 : 160; }

typedef struct {
    const CUtensorMap *map; // the tensor (hopper_tensor_map)
    int col;                // the operand's first column in it (head h's)
} att_src;
// A work item as the producer copies it: b, the own operands (at most 2) from row own_row, and n
// streamed tiles from rows row0 + i ROWS, with their values of the vectors (vec[v] + i ROWS: 16-byte
// aligned, readable ROWS past the last tile's first row).
typedef struct {
    att_src own[2], src[2];
    int own_row, row0, n, b;
    const float *vec[2];
} att_job;

template <int HS, int NWG, int NOWN, int ROWS, int STAGES, int NVEC = 0, int EXTRA = 0, int OWNB = 2> struct att_smem {
    static constexpr int NC = HS / 64;                    // 64-column tiles of an operand
    static constexpr int OWN_ROWS = 64 * NWG;             // rows of an own operand
    static constexpr int OWN = NC * OWN_ROWS * 128;       // its bytes
    static constexpr int ITEM_THREADS = 32 + 128 * NWG;   // the producer warp and the consumers
    static constexpr int TILE = NC * ROWS * 128;          // bytes of a streamed operand
    static constexpr int VEC = ROWS * 4;                  // bytes of a streamed vector (a multiple of 128)
    // byte offsets from the 1024-aligned base: the own buffers, the stages, the vectors, the extra
    // bytes, the barriers (own_full[2], full[2][STAGES], empty[2][STAGES]), the item slots
    static constexpr int STAGES_AT = OWNB * NOWN * OWN, VECS_AT = STAGES_AT + STAGES * 2 * TILE;
    static constexpr int EXTRA_AT = (VECS_AT + STAGES * NVEC * VEC + 1023) / 1024 * 1024;
    static constexpr int BARS_AT = EXTRA_AT + EXTRA, ITEM_AT = BARS_AT + (2 + 4 * STAGES) * 8;
    static constexpr size_t bytes = (size_t)ITEM_AT + 3 * 4 + 1024; // + the alignment of the base
    unsigned char *base; // the only member: every address is a constant offset from it

    // (an offset from raw, not an integer made a pointer: the compiler then knows every address
    // is in shared memory, and reads and writes it with shared-memory instructions)
    __device__ __forceinline__ explicit att_smem(unsigned char *raw) : base(raw + (-smem_addr(raw) & 1023)) {}
    // own operand i of the block's k-th item
    __device__ __forceinline__ unsigned char *own_op(int k, int i) const { return base + (k % OWNB * NOWN + i) * OWN; }
    __device__ __forceinline__ unsigned char *stage_op(int j, int which) const {
        return base + STAGES_AT + (j % STAGES * 2 + which) * TILE;
    }
    __device__ __forceinline__ float *stage_vec(int j, int v) const {
        return (float *)(base + VECS_AT + (j % STAGES * NVEC + v) * VEC);
    }
    __device__ __forceinline__ unsigned char *extra() const { return base + EXTRA_AT; }
    __device__ __forceinline__ uint64_t *bar(int i) const { return (uint64_t *)(base + BARS_AT) + i; }
    __device__ __forceinline__ uint64_t *own_full(int k) const { return bar(k % OWNB); }
    __device__ __forceinline__ uint64_t *full(int j, int which) const { return bar(2 + which * STAGES + j % STAGES); }
    __device__ __forceinline__ uint64_t *empty(int j, int which) const {
        return bar(2 + (2 + which) * STAGES + j % STAGES);
    }
    __device__ __forceinline__ int *item(int k) const { return (int *)(base + ITEM_AT) + k % 3; }
    // thread 0, then every thread past a barrier
    __device__ __forceinline__ void init() const {
        // own_full, full: 1 (the producer's expect); empty: every consumer warp, or every consumer
        // thread for operand 0's when it carries the vectors (release)
        for (int i = 0; i < 2 + 4 * STAGES; i++)
            mbar_init(bar(i), i < 2 + 2 * STAGES ? 1 : NVEC && i < 2 + 3 * STAGES ? 128 * NWG : 4 * NWG);
        mbar_fence_init();
    }
    // Every thread of the block, first: thread 0 sets the barriers up; the producer warpgroup
    // gives registers back, its first warp produces (as produce<LATE>), and it gets true (its
    // kernel then returns, or its other warps do other work); the consumer warpgroups take the
    // registers and get false.
    template <bool LATE = false, class Plan>
    __device__ __forceinline__ bool producer(int total, int *counter, Plan plan) const {
        if (threadIdx.x == 0) init();
        __syncthreads();
        if (threadIdx.x / 128 == 0) { // the producer warpgroup
            wg_regs_down<24>();
            if (threadIdx.x < 32) produce<LATE>(total, counter, plan);
            return true;
        }
        wg_regs_up<att_consumer_regs(NWG)>();
        return false;
    }
    // The producer warp (its lane 0 copies): the work items that *counter hands out (counter zero
    // at launch), in its order, until `total`; plan(item) says what to copy for it. The block takes
    // its next item when item k starts, or with LATE once item k's last tile is on its way, so
    // that items start in about the order they went out (the fused backward's items wait for
    // earlier ones: the dQ order). Items go only to running blocks, so the wait ends. The k-th
    // item's own operands go to buffer k % OWNB; the streamed tiles go through the stages, whose
    // phases run on across items (j counts the block's tiles).
    template <bool LATE, class Plan> __device__ void produce(int total, int *counter, Plan plan) const {
        int cur = take(counter), j = 0;
        if (threadIdx.x == 0) *item(0) = cur;
        if (OWNB == 2 && cur < total) load_own(0, plan(cur));
        for (int k = 0; cur < total; k++) {
            att_job job = plan(cur);
            int first = min(job.n, STAGES), next = 0;
            for (int i = 0; i < first; i++) load_tile(job, i, j + i);
            if (!LATE) next = take_slot(counter, k + 1);
            named_sync<ITEM_THREADS>(ATT_ITEM_START); // item k starts (item k - 1 is done)
            if (OWNB == 1) load_own(k, job);
            if (OWNB == 2 && !LATE && next < total) load_own(k + 1, plan(next));
            for (int i = first; i < job.n; i++) load_tile(job, i, j + i);
            if (LATE) next = take_slot(counter, k + 1);
            if (OWNB == 2 && LATE && next < total) load_own(k + 1, plan(next));
            j += job.n, cur = next;
        }
        named_sync<ITEM_THREADS>(ATT_ITEM_START); // the consumers read that there is no more work
    }
    // The next item of the counter, to every lane of the warp; take_slot also writes it into the
    // slot of the block's k-th item, after barrier k - 2 (the consumers last read that slot, item
    // k - 3's, between barriers k - 3 and k - 2) and before barrier k, after which they read it.
    __device__ __forceinline__ int take(int *counter) const {
        int taken = threadIdx.x == 0 ? atomicAdd(counter, 1) : 0;
        return __shfl_sync(0xffffffffu, taken, 0);
    }
    __device__ __forceinline__ int take_slot(int *counter, int k) const {
        int next = take(counter);
        if (threadIdx.x == 0) *item(k) = next;
        return next;
    }
    // Lane 0: the own operands of the block's k-th item into buffer k % OWNB.
    __device__ __forceinline__ void load_own(int k, const att_job &job) const {
        if (threadIdx.x != 0) return;
        mbar_expect(own_full(k), NOWN * OWN);
        for (int i = 0; i < NOWN; i++)
            for (int c = 0; c < NC; c++)
                tma_load(own_op(k, i) + c * OWN_ROWS * 128, job.own[i].map, job.own[i].col + 64 * c, job.own_row,
                         job.b, own_full(k));
    }
    // The producer warp: streamed tile i of an item, the block's j-th, each operand once tile
    // j - STAGES released its own.
    __device__ __forceinline__ void load_tile(const att_job &job, int i, int j) const {
        for (int w = 0; w < 2; w++) {
            if (j >= STAGES) mbar_wait(empty(j, w), (j / STAGES - 1) & 1);
            if (threadIdx.x != 0) continue;
            mbar_expect(full(j, w), TILE + (w ? 0 : NVEC * VEC));
            for (int c = 0; c < NC; c++)
                tma_load(stage_op(j, w) + c * ROWS * 128, job.src[w].map, job.src[w].col + 64 * c, job.row0 + i * ROWS,
                         job.b, full(j, w));
            for (int v = 0; w == 0 && v < NVEC; v++) bulk_load(stage_vec(j, v), job.vec[v] + i * ROWS, VEC, full(j, 0));
        }
    }
    // Consumers: the block's k-th work item (>= total: none left), once its own operands landed;
    // streamed operand `which` of the block's j-th streamed tile (0: with the vectors), once it
    // landed; let it go, or both (every thread of the warp calls, after its last product reading it).
    __device__ __forceinline__ int next_item(int k, int total) const {
        named_sync<ITEM_THREADS>(ATT_ITEM_START);
        int it = *item(k);
        if (it < total) mbar_wait(own_full(k), (k / OWNB) & 1);
        return it;
    }
    __device__ __forceinline__ void wait(int j, int which) const {
        mbar_wait(full(j, which), (j / STAGES) & 1);
    }
    // The vectors are read by every thread with plain loads, so every thread arrives (its
    // arrive releases its own reads, which racecheck follows), not one lane after __syncwarp.
    __device__ __forceinline__ void release(int j, int which) const {
        if (which == 0 && NVEC) {
            mbar_arrive(empty(j, which));
            return;
        }
        __syncwarp();
        if (threadIdx.x % 32 == 0) mbar_arrive(empty(j, which));
    }
    __device__ __forceinline__ void release(int j) const { release(j, 0), release(j, 1); }
};

// Persistent blocks, at most one an SM; the counter of handed-out items (4 bytes of device
// memory) is zeroed before the launch.
static inline unsigned att_grid(loom_cuda *cu, int total, int *counter) {
    CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), cu->stream));
    return (unsigned)(total < cu->sms ? total : cu->sms);
}

// Tiles of `step` keys from key 0 that some query row of [r0, r0 + n) before Tq sees (0 when r0 >=
// Tq): what a query tile streams (n = 128), or a consumer warpgroup's rows of it use (n = 64).
__device__ __forceinline__ int att_key_tiles(const attn_dims &d, int r0, int n, int step) {
    return r0 < d.Tq ? (att_visible(d, min(r0 + n, d.Tq) - 1) + step - 1) / step : 0;
}

// The consumer's two rows of an accumulator (64 x N, hopper.cuh): rows row0 + 16 warp + g and + 8.
__device__ __forceinline__ int att_wg_row(int row0) { return row0 + 16 * (threadIdx.x / 32 % 4) + threadIdx.x % 32 / 4; }

// P as register A fragments: k-step kk (16 columns) from accumulator n-tiles 2kk and 2kk+1;
// att_frag_put puts n-tile i (its 4 values v) in place, att_frags every n-tile of acc.
template <int K> __device__ __forceinline__ void att_frag_put(uint32_t (&a)[K][4], int i, const float *v) {
    a[i / 2][2 * (i & 1)] = pack_bf16(v[0], v[1]);
    a[i / 2][2 * (i & 1) + 1] = pack_bf16(v[2], v[3]);
}
template <int N> __device__ __forceinline__ void att_frags(uint32_t (&a)[N / 16][4], const float (&acc)[N / 2]) {
#pragma unroll
    for (int i = 0; i < N / 8; i++) att_frag_put(a, i, acc + 4 * i);
}

// d (64 x N) += A B with A (64 x K) register fragments and B (K x N) an N-major operand in shared
// memory: K rows of N/64 tiles of `rows` x 64 (rows >= K).
template <int N, int K>
__device__ __forceinline__ void att_product_rs(float (&d)[N / 2], const uint32_t (&a)[K / 16][4], const unsigned char *b,
                                               int rows) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) wgmma_bf16<N>::rs(d, a[kk], wg_desc(b + kk * 16 * 128, rows * 128), 1);
}
// d (64 x N) (+)= A B^T with A (64 x HS) at a and B (N x HS) at b, K-major operands in shared
// memory of HS/64 tiles of a_rows and b_rows rows; A's 64 rows start at row a_row0 of its tiles.
template <int N, int HS>
__device__ __forceinline__ void att_product_ss(float (&d)[N / 2], const unsigned char *a, int a_rows, int a_row0,
                                               const unsigned char *b, int b_rows) {
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++)
        wgmma_bf16<N>::ss(d, wg_desc(a + kk / 4 * a_rows * 128 + a_row0 * 128 + kk % 4 * 32, 0),
                          wg_desc(b + kk / 4 * b_rows * 128 + kk % 4 * 32, 0), kk > 0);
}
// d (64 x N) = A B with A (64 x K) K-major in shared memory at a (K/64 tiles of a_rows rows, its 64
// rows from row a_row0) and B (K x N) an N-major operand at b (K rows of N/64 tiles of b_rows rows)
template <int N, int K>
__device__ __forceinline__ void att_product_sn(float (&d)[N / 2], const unsigned char *a, int a_rows, int a_row0,
                                               const unsigned char *b, int b_rows) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++)
        wgmma_bf16<N>::template ss<1>(d, wg_desc(a + kk / 4 * a_rows * 128 + a_row0 * 128 + kk % 4 * 32, 0),
                                      wg_desc(b + kk * 16 * 128, b_rows * 128), kk > 0);
}

// The sum of v over the lanes of the warp with the same t = lane % 4 (an accumulator's 8 row
// groups), by a fixed tree: the same bits every run
__device__ __forceinline__ float att_sum_groups(float v) {
#pragma unroll
    for (int x = 4; x < 32; x *= 2) v += __shfl_xor_sync(0xffffffffu, v, x);
    return v;
}

// The column sums of the warp's 16 rows (att_wg_row: those < T) of a 64 x HS accumulator, times
// `scale`, into dst[0, HS) fp32: a bias gradient's partial sum over 16 rows (the whole warp calls)
template <int HS>
__device__ __forceinline__ void att_colsum16(float *dst, const float (&acc)[HS / 2], float scale, int row0, int T) {
    int rw = att_wg_row(row0), lane = threadIdx.x % 32;
    float s[HS / 4];
#pragma unroll
    for (int i = 0; i < HS / 8; i++)
#pragma unroll
        for (int e = 0; e < 2; e++)
            s[2 * i + e] = att_sum_groups(((rw < T ? acc[4 * i + e] : 0.0f) + (rw + 8 < T ? acc[4 * i + 2 + e] : 0.0f)) * scale);
#pragma unroll
    for (int i = 0; i < HS / 8; i++) // n-tile i by lanes 4 (i % 8) .. + 3
        if (i % 8 == lane / 4) *(float2 *)(dst + 8 * i + 2 * (lane % 4)) = make_float2(s[2 * i], s[2 * i + 1]);
}

// Stores the thread's two rows (att_wg_row(row0) and + 8, those in [0, T)) of a 64 x HS accumulator,
// times `scale`, as bf16 into dst (row stride ld), or with `add` added to what dst holds.
template <int HS>
__device__ __forceinline__ void att_store(bf16 *dst, int64_t ld, const float (&acc)[HS / 2], const float scale[2],
                                          int row0, int T, bool add) {
    int rw = att_wg_row(row0), t = threadIdx.x % 4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = rw + 8 * r;
        if (row < 0 || row >= T) continue;
#pragma unroll
        for (int i = 0; i < HS / 8; i++) {
            __nv_bfloat162 *p = reinterpret_cast<__nv_bfloat162 *>(dst + (int64_t)row * ld + 8 * i + 2 * t);
            float x = acc[4 * i + 2 * r] * scale[r], y = acc[4 * i + 2 * r + 1] * scale[r];
            if (add) {
                float2 old = __bfloat1622float2(*p);
                x += old.x, y += old.y;
            }
            *p = __floats2bfloat162_rn(x, y);
        }
    }
}
