// Private to the CUDA backend: the Hopper (sm_90a) building blocks of the attention kernels:
// warpgroup matrix products (wgmma), their shared-memory descriptors, transaction barriers
// (mbarrier) and bulk tensor copies (TMA), from the PTX ISA ("Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate Instructions", "Tensor Copy", "mbarrier") as FlashAttention-3 (Shah et al.
// 2024) and CUTLASS's SM90 collectives use them.
//
// Shared-memory tiles: a tile of R rows x 64 bf16 (or 128 FP8) columns (128 bytes a row), 1024-byte aligned, in
// TMA's 128-byte swizzle: the 16-byte chunk c of row r lies at r*128 + 16*(c ^ (r % 8)). A head of
// size 128 is two such tiles (columns 0-63, 64-127), one after the other. wgmma reads them through
// descriptors (wg_desc):
// - K-major operand (rows are M or N, the 64 columns are K): 8-row groups 1024 bytes apart (SBO);
//   the k-step kk (16 bf16 or 32 FP8 columns) starts 32*kk bytes into the rows (the swizzle is
//   applied by the hardware on the address bits).
// - N-major operand B (rows are K, the 64 columns are N): 8-row groups (K) 1024 bytes apart (SBO),
//   the next 64 columns (N) LBO bytes further (the next tile); the k-step kk starts at row 16*kk.
#pragma once
#include "backend/cuda/cuda_ops.h"

#include <cuda.h> // CUtensorMap

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the Hopper kernels need the sm_90a target (CMAKE_CUDA_ARCHITECTURES 90a-real)"
#endif

// ---- host: tensor maps ----
// A tensor map of a bf16 matrix (B, T, ld) (row stride ld elements, 16-byte aligned base, ld a
// multiple of 8) read in boxes of `rows` rows x 64 columns, 128-byte swizzled; rows past T read as
// zeros. Coordinates of a box: {column, row, b}.
CUtensorMap hopper_tensor_map(const void *base, int64_t B, int64_t T, int64_t ld, int rows);
// A tensor map of a dense row-major matrix (rows, cols) of esize-byte elements (1: FP8 bytes, 2:
// bf16; 16-byte aligned base, rows of a multiple of 16 bytes) read or written in boxes of box_rows
// rows x 128 bytes, 128-byte swizzled. Coordinates of a box: {column, row}.
CUtensorMap hopper_tensor_map_2d(const void *base, int esize, int64_t rows, int64_t cols, int box_rows);

// ---- device ----
// Shared-memory descriptor of a swizzled tile at p (see above): lbo = bytes to the next 64
// columns of an N-major operand (unused for K-major ones).
__device__ __forceinline__ uint64_t wg_desc(const void *p, uint32_t lbo) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 | (uint64_t)(1024 >> 4) << 32 |
           1ull << 62; // bits 62-63: 128-byte swizzle
}

// wgmma ordering: fence before the first product that reads registers written since; commit the
// issued products as a group; wait until at most N groups are in flight.
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulators across a wg_wait; for the
// register A fragments of a product in flight, from reusing their registers before the wg_wait
// that retires it (held after it: CUTLASS's warpgroup_fence_operand).
template <int R> __device__ __forceinline__ void wg_hold(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int K> __device__ __forceinline__ void wg_hold(uint32_t (&a)[K][4]) {
#pragma unroll
    for (int i = 0; i < K; i++) asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3])::"memory");
}

// Accumulator layout of a 64 x N product (fp32, N/2 registers a thread): warp w of the warpgroup
// holds rows 16w + g and 16w + g + 8 (g = lane / 4); d[4i + e] is row 16w + g + 8(e >> 1),
// column 8i + 2(lane % 4) + (e & 1). An A register fragment (64 x 16) has the same row split:
// {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)} as mma.sync's m16n8k16 A.
template <int N> struct wgmma_bf16;
// The accumulator operands of the statements below, d[i..i+31] read and written in place, and the
// register lists that name them
#define WG_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                   "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_ACC32(i) WG_ACC8(i), WG_ACC8(i + 8), WG_ACC8(i + 16), WG_ACC8(i + 24)
#define WG_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS64 WG_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
template <> struct wgmma_bf16<64> {
    // d (64 x 64) {+}= A B^T: A (64 x 16) and B (64 x 16) K-major in shared memory (descriptors);
    // with TB = 1, d {+}= A B with B (16 x 64) N-major
    template <int TB = 0> static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_REGS32 "}, %32, %33, p, 1, 1, 0, %35;\n}\n"
                     : WG_ACC32(0)
                     : "l"(a), "l"(b), "r"(accumulate), "n"(TB));
    }
    // d (64 x 64) {+}= A B: A (64 x 16) as a register fragment, B (16 x 64) N-major in shared memory
    static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t a[4], uint64_t b, int accumulate) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_REGS32 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                     : WG_ACC32(0)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
    }
};
template <> struct wgmma_bf16<128> {
    // d (64 x 128) {+}= A B^T: A (64 x 16) and B (128 x 16) K-major in shared memory (descriptors);
    // with TB = 1, d {+}= A B with B (16 x 128) N-major
    template <int TB = 0> static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS64 "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
                     : WG_ACC32(0), WG_ACC32(32)
                     : "l"(a), "l"(b), "r"(accumulate), "n"(TB));
    }
    // d (64 x 128) {+}= A B: A (64 x 16) as a register fragment, B (16 x 128) N-major in shared memory
    static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t a[4], uint64_t b, int accumulate) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                     : WG_ACC32(0), WG_ACC32(32)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
    }
};
#define WG_REGS128 WG_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, " \
    "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, " \
    "%119, %120, %121, %122, %123, %124, %125, %126, %127"
template <> struct wgmma_bf16<256> {
    // d (64 x 256) {+}= A B^T: A (64 x 16) and B (256 x 16) K-major in shared memory (descriptors);
    // with TB = 1, d {+}= A B with B (16 x 256) N-major
    template <int TB = 0>
    static __device__ __forceinline__ void ss(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_REGS128 "}, %128, %129, p, 1, 1, 0, "
                     "%131;\n}\n"
                     : WG_ACC32(0), WG_ACC32(32), WG_ACC32(64), WG_ACC32(96)
                     : "l"(a), "l"(b), "r"(accumulate), "n"(TB));
    }
    // d (64 x 256) {+}= A B: A (64 x 16) as a register fragment, B (16 x 256) N-major in shared memory
    static __device__ __forceinline__ void rs(float (&d)[128], const uint32_t a[4], uint64_t b, int accumulate) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_REGS128 "}, "
                     "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                     : WG_ACC32(0), WG_ACC32(32), WG_ACC32(64), WG_ACC32(96)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
    }
};
// d (64 x 128) {+}= A B^T: A (64 x 32) E5M2 (A_E5M2) or E4M3 and B (128 x 32) E4M3, K-major in
// shared memory (descriptors)
#define WG_FP8_128(A) "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n128k32.f32." A ".e4m3 {" WG_REGS64 "}, %64, %65, p, 1, 1;\n}\n"
template <bool A_E5M2>
__device__ __forceinline__ void wgmma_fp8_128(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
    if constexpr (A_E5M2)
        asm volatile(WG_FP8_128("e5m2") : WG_ACC32(0), WG_ACC32(32) : "l"(a), "l"(b), "r"(accumulate));
    else
        asm volatile(WG_FP8_128("e4m3") : WG_ACC32(0), WG_ACC32(32) : "l"(a), "l"(b), "r"(accumulate));
}
#undef WG_FP8_128
#undef WG_ACC8
#undef WG_ACC32
#undef WG_REGS32
#undef WG_REGS64
#undef WG_REGS128

// ---- transaction barriers (mbarrier) and bulk tensor copies ----
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// After the inits, before any thread or the copy engine uses the barriers.
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}
// Arrives once, and says `bytes` more are to come from copies in this phase.
__device__ __forceinline__ void mbar_expect(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
// Copies the box at {col, row, b} of the tensor map into dst, completing `bytes` on bar.
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, int col, int row, int b, uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(smem_addr(dst)), "l"(map), "r"(col), "r"(row), "r"(b), "r"(smem_addr(bar))
                 : "memory");
}
// The 2D forms (hopper_tensor_map_2d): a box at {col, row} into dst, completing its bytes on bar;
// src's box to {col, row} in global memory, in a bulk group (as bulk_store)
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int col, int row, uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(smem_addr(dst)), "l"(map), "r"(col), "r"(row), "r"(smem_addr(bar))
                 : "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, int col, int row, const void *src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(map), "r"(col),
                 "r"(row), "r"(smem_addr(src))
                 : "memory");
}
// Copies `bytes` (a multiple of 16) from src in global memory to dst, both 16-byte aligned,
// completing them on bar (a bulk copy without a tensor map: no bounds, no swizzle).
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
// Makes this thread's shared-memory writes visible to the async proxy (wgmma operands, bulk
// copies out of shared memory), before the barrier that hands them over.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Stores four 8x8 bf16 matrices transposed (stmatrix .trans): register i of the lane holds row
// lane/4, columns 2(lane%4), +1 of matrix i (a quarter of an A fragment); lane L gives the address of
// the 16 bytes of row L%8 of matrix L/8 as stored, i.e. of column L%8 of the matrix as held.
__device__ __forceinline__ void stsm_x4_trans(void *p, const uint32_t r[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(smem_addr(p)), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
// Bulk copies from shared memory to global memory (16-byte aligned, `bytes` a multiple of 16), in
// bulk groups: a plain store, or an add (fp32, performed in L2 element by element); commit the
// issued copies as a group; wait until the groups have read their sources (shared memory may be
// rewritten), or until they are complete (their writes visible to this thread).
__device__ __forceinline__ void bulk_store(void *dst, const void *src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_addr(src)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_add_f32(float *dst, const void *src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_addr(src)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Orders this thread's global-memory accesses of the generic proxy with those of its bulk copies.
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
// A counter in global memory that blocks pass on in order: read with acquire, add with release (gpu scope).
__device__ __forceinline__ int ld_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_add(int *p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// A named barrier (ids 1-15; 0 is __syncthreads) among `threads` threads, whole warps: waits for
// them all; it orders the shared-memory accesses around it.
template <int THREADS> __device__ __forceinline__ void named_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}
// Arrives at named barrier `id` of `threads` threads without waiting (the others sync on it).
template <int THREADS> __device__ __forceinline__ void named_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}
// Warpgroup register budget (setmaxnreg): the copy warpgroup gives registers back, the
// arithmetic ones take them.
template <int R> __device__ __forceinline__ void wg_regs_down() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void wg_regs_up() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
