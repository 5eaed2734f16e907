// Private to the Hopper attention kernels (attention_forward_wgmma.cu, attention_backward_wgmma.cu):
// the block skeleton they share, after FlashAttention-3 (Shah et al. 2024): 384 threads, warpgroup
// 0 the producer (its first warp issues every bulk tensor copy, one lane of it; the warpgroup keeps
// 24 registers), warpgroups 1 and 2 the consumers (240 registers), 64 rows each of the block's own
// 128-row tile.
//
// Blocks are persistent (one an SM) and take work items (own tiles) from a counter as they finish
// the last (most work first, att_tile_at), so that no SM idles while another has items queued.
// The producer hands each item's index to the consumers through one shared-memory slot between
// two named barriers (item_full: written; item_empty: read, so the next may be written), and
// copies the next item's own operands into the other of two buffers while the consumers work on
// this one's: the copies of one item overlap the products and stores of the last.
// Shared memory (att_smem): two buffers of NOWN "own" operands of 128 rows x HS (Q, or Q and dO,
// or K and V), one an item; then STAGES stages of two streamed operands of ROWS rows x HS (K and
// V, or Q and dO) that the block walks tile by tile; then the transaction barriers: per own
// buffer own_full (its operands landed) and own_empty (the 8 consumer warps are done with them),
// per stage full[0], full[1] (each streamed operand landed) and empty (the 8 consumer warps are
// done with the stage); then the item slot. Every operand is HS/64 tiles of rows x 64 columns,
// 128-byte swizzled (hopper.cuh). Consumers wait on every stage, use it or not, and release it:
// a stage is refilled only after both of its copies landed and every consumer warp let it go.
#pragma once
#include "backend/cuda/attention.cuh"
#include "backend/cuda/hopper.cuh"

#define ATT_WG_ROWS 128 // own rows a block (2 consumer warpgroups x 64)
#define ATT_WG_THREADS 384
#define ATT_ITEM_THREADS (32 + 256) // the producer warp and the two consumer warpgroups
#define ATT_ITEM_FULL 1             // named barrier ids
#define ATT_ITEM_EMPTY 2

typedef struct {
    const CUtensorMap *map; // the tensor (hopper_tensor_map)
    int col;                // the operand's first column in it (head h's)
} att_src;

// A work item as the producer copies it: b, the own operands (at most 2) from row own_row, and n
// streamed tiles from rows row0 + i ROWS.
typedef struct {
    att_src own[2], src[2];
    int own_row, row0, n, b;
} att_job;

template <int HS, int NOWN, int ROWS, int STAGES> struct att_smem {
    static constexpr int NC = HS / 64;                    // 64-column tiles of an operand
    static constexpr int OWN = NC * ATT_WG_ROWS * 128;    // bytes of an own operand
    static constexpr int TILE = NC * ROWS * 128;          // bytes of a streamed operand
    static constexpr size_t bytes = (size_t)2 * NOWN * OWN + (size_t)STAGES * 2 * TILE + (4 + 3 * STAGES) * 8 + 8 + 1024;
    unsigned char *own, *stages;
    uint64_t *own_full, *own_empty, *full0, *full1, *empty;
    int *item; // the index of the work item the consumers take next

    __device__ __forceinline__ explicit att_smem(unsigned char *raw) {
        own = (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
        stages = own + 2 * NOWN * OWN;
        own_full = (uint64_t *)(stages + STAGES * 2 * TILE);
        own_empty = own_full + 2, full0 = own_full + 4, full1 = full0 + STAGES, empty = full1 + STAGES;
        item = (int *)(empty + STAGES);
    }
    // own operand i of the block's k-th item
    __device__ __forceinline__ unsigned char *own_op(int k, int i) const { return own + ((k & 1) * NOWN + i) * OWN; }
    __device__ __forceinline__ unsigned char *stage_op(int j, int which) const {
        return stages + (j % STAGES * 2 + which) * TILE;
    }
    // thread 0, then every thread past a barrier
    __device__ __forceinline__ void init() const {
        for (int b = 0; b < 2; b++) mbar_init(own_full + b, 1), mbar_init(own_empty + b, 8);
        for (int s = 0; s < STAGES; s++) mbar_init(full0 + s, 1), mbar_init(full1 + s, 1), mbar_init(empty + s, 8);
        mbar_fence_init();
    }
    // Every thread of the block, first: thread 0 sets the barriers up; the producer warpgroup
    // gives registers back, its first warp produces (as produce), and it gets true (its kernel
    // then returns); the consumer warpgroups take the registers and get false.
    template <class Plan> __device__ __forceinline__ bool producer(int total, int *counter, Plan plan) const {
        if (threadIdx.x == 0) init();
        __syncthreads();
        if (threadIdx.x / 128 == 0) { // the producer warpgroup
            wg_regs_down<24>();
            if (threadIdx.x < 32) produce(total, counter, plan);
            return true;
        }
        wg_regs_up<240>();
        return false;
    }
    // The producer warp (its lane 0 copies): work items blockIdx.x, then the next one that
    // *counter hands out (counter zero at launch), until `total`; plan(item) says what to copy for
    // it. The k-th item's own operands go to buffer k % 2 once the consumers let item k - 2's go;
    // the streamed tiles go through the stages, whose phases run on across items (j counts the
    // block's tiles).
    template <class Plan> __device__ void produce(int total, int *counter, Plan plan) const {
        bool leader = threadIdx.x == 0;
        int next = (int)blockIdx.x, j = 0;
        for (int k = 0;; k++) {
            if (k > 0) named_sync<ATT_ITEM_THREADS>(ATT_ITEM_EMPTY); // item k - 1 read
            if (leader) *item = next;
            named_arrive<ATT_ITEM_THREADS>(ATT_ITEM_FULL);
            if (next >= total) return; // the consumers read that there is no more work
            att_job job = plan(next);
            int taken = leader ? atomicAdd(counter, 1) : 0;
            next = (int)gridDim.x + __shfl_sync(0xffffffffu, taken, 0);
            uint64_t *full = own_full + (k & 1);
            if (k >= 2) mbar_wait(own_empty + (k & 1), ((k >> 1) - 1) & 1);
            if (leader) {
                mbar_expect(full, NOWN * OWN);
                for (int i = 0; i < NOWN; i++)
                    for (int c = 0; c < NC; c++)
                        tma_load(own_op(k, i) + c * ATT_WG_ROWS * 128, job.own[i].map, job.own[i].col + 64 * c,
                                 job.own_row, job.b, full);
            }
            for (int i = 0; i < job.n; i++, j++) {
                int s = j % STAGES;
                if (j >= STAGES) mbar_wait(empty + s, (j / STAGES - 1) & 1); // tile j - STAGES released
                for (int w = 0; leader && w < 2; w++) {
                    uint64_t *bar = (w ? full1 : full0) + s;
                    mbar_expect(bar, TILE);
                    for (int c = 0; c < NC; c++)
                        tma_load(stage_op(j, w) + c * ROWS * 128, job.src[w].map, job.src[w].col + 64 * c,
                                 job.row0 + i * ROWS, job.b, bar);
                }
            }
        }
    }
    // Consumers: the block's k-th work item (>= total: none left), once its own operands landed;
    // let them go (every thread of the warp calls, after its last product reading them); the
    // same for streamed operand `which` of the block's j-th streamed tile.
    __device__ __forceinline__ int next_item(int k, int total) const {
        named_sync<ATT_ITEM_THREADS>(ATT_ITEM_FULL);
        int it = *item;
        if (it >= total) return it;
        named_arrive<ATT_ITEM_THREADS>(ATT_ITEM_EMPTY);
        mbar_wait(own_full + (k & 1), (k >> 1) & 1);
        return it;
    }
    __device__ __forceinline__ void release_own(int k) const {
        __syncwarp();
        if (threadIdx.x % 32 == 0) mbar_arrive(own_empty + (k & 1));
    }
    __device__ __forceinline__ void wait(int j, int which) const {
        mbar_wait((which ? full1 : full0) + j % STAGES, (j / STAGES) & 1);
    }
    __device__ __forceinline__ void release(int j) const {
        __syncwarp();
        if (threadIdx.x % 32 == 0) mbar_arrive(empty + j % STAGES);
    }
};

// Persistent blocks, at most one an SM; the counter of handed-out items (4 bytes of device
// memory) is zeroed before the launch.
static inline unsigned att_grid(loom_cuda *cu, int total, int *counter) {
    CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), cu->stream));
    return (unsigned)(total < cu->sms ? total : cu->sms);
}

// The consumer's two rows of an accumulator (64 x N, hopper.cuh): rows row0 + 16 warp + g and + 8.
__device__ __forceinline__ int att_wg_row(int row0) { return row0 + 16 * (threadIdx.x / 32 % 4) + threadIdx.x % 32 / 4; }

// P as register A fragments: k-step kk (16 columns) from accumulator n-tiles 2kk and 2kk+1.
template <int N> __device__ __forceinline__ void att_frags(uint32_t (&a)[N / 16][4], const float (&acc)[N / 2]) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) frag_c_to_a(a[kk], acc + 8 * kk, acc + 8 * kk + 4);
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

// Stores the thread's two rows (att_wg_row(row0) and + 8, those < T) of a 64 x HS accumulator,
// times `scale`, as bf16 into dst (row stride ld), or with `add` added to what dst holds.
template <int HS>
__device__ __forceinline__ void att_store(bf16 *dst, int64_t ld, const float (&acc)[HS / 2], const float scale[2],
                                          int row0, int T, bool add) {
    int rw = att_wg_row(row0), t = threadIdx.x % 4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = rw + 8 * r;
        if (row >= T) continue;
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
