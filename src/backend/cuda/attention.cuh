// Private to the attention files: shapes, the choice between the tensor-core kernels and the
// simple ones, and the bf16 mma.sync building blocks the tensor-core kernels share.
//
// Layout (backend.h): qkv (B,T,3C) with head h of q at columns h*hs, k at C + h*hs, v at
// 2C + h*hs; out/dout (B,T,C); lse (B,NH,T) fp32, the natural-log logsumexp of the scaled,
// masked scores of each query row.
#pragma once
#include "backend/cuda/cuda_ops.h"

#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

typedef struct {
    int B, T, C, NH, hs;
} attn_dims;

static inline attn_dims attn_check(const loom_backend *be, loom_tensor qkv, loom_tensor out,
                                   loom_tensor lse, int NH) {
    LOOM_CHECK(qkv.ndim == 3 && qkv.shape[0] > 0 && qkv.shape[1] > 0);
    LOOM_CHECK(NH > 0 && qkv.shape[2] > 0 && qkv.shape[2] % (3 * NH) == 0);
    attn_dims d = {(int)qkv.shape[0], (int)qkv.shape[1], (int)(qkv.shape[2] / 3), NH,
                   (int)(qkv.shape[2] / (3 * NH))};
    LOOM_CHECK(loom_rows(&out) == (int64_t)d.B * d.T && loom_cols(&out) == d.C);
    LOOM_CHECK(loom_numel(&lse) == (int64_t)d.B * d.NH * d.T);
    LOOM_CHECK(cuda_act(be, qkv) == cuda_act(be, out));
    (void)cuda_f32(lse);
    return d;
}

static inline bool attn_aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

// The tensor-core kernels take bf16 with head size 64 or 128 and 16-byte aligned tensors (every
// row of a head is then 16-byte aligned too, as C is a multiple of 64).
static inline bool attn_use_tc(const loom_backend *be, attn_dims d) {
    return be->dtype == LOOM_BF16 && (d.hs == 64 || d.hs == 128);
}

// Where a thread of the attention kernels works. Tiled kernels: grid ntiles * B*NH blocks, the
// last tiles (the most work under the causal mask) first. Row kernels: grid (rows / warps, B*NH),
// one row per warp. qkv and o are the offsets of head (b, h), row 0, in qkv (B,T,3C) and in
// out/dout (B,T,C).
typedef struct {
    int tile;                 // tiled kernels: the block's tile; row kernels: the warp's row
    int bh, warp, lane, g, t; // g, t: the lane's group and place in it (mma fragments)
    int64_t qkv, o;
} att_place;

__device__ __forceinline__ att_place att_place_of(int bh, int tile, int T, int NH, int hs) {
    att_place p;
    int b = bh / NH, h = bh % NH;
    p.tile = tile, p.bh = bh, p.warp = threadIdx.x / 32, p.lane = threadIdx.x % 32;
    p.g = p.lane / 4, p.t = p.lane % 4;
    p.qkv = (int64_t)b * T * 3 * NH * hs + h * hs;
    p.o = (int64_t)b * T * NH * hs + h * hs;
    return p;
}
__device__ __forceinline__ att_place att_tile_place(int T, int NH, int hs, int BNH) {
    int ntiles = gridDim.x / BNH;
    return att_place_of(blockIdx.x % BNH, ntiles - 1 - (int)(blockIdx.x / BNH), T, NH, hs);
}
__device__ __forceinline__ att_place att_row_place(int T, int NH, int hs, int warps) {
    return att_place_of(blockIdx.y, blockIdx.x * warps + threadIdx.x / 32, T, NH, hs);
}

// attention_forward_tc.cu / attention_backward_tc.cu (bf16, hs 64 or 128)
void attention_forward_tc(loom_cuda *cu, attn_dims d, __nv_bfloat16 *out, float *lse,
                          const __nv_bfloat16 *qkv);
// D (B,NH,T) = rowsum(dout * out) per head, computed by the caller (attention_backward.cu)
void attention_backward_tc(loom_cuda *cu, attn_dims d, __nv_bfloat16 *dqkv,
                           const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv, const float *lse,
                           const float *D);

// ---- mma.sync building blocks (PTX ISA, "Matrix fragments for mma.m16n8k16" with .bf16) ----
// Lane = 4 * g + t (g = groupID 0..7, t = thread in group 0..3). A (16x16, row-major) is 4
// registers of 2 bf16: (row g, cols 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..). B
// (16x8, "col") is 2 registers: (k 2t..2t+1, n g), (k 2t+8.., n g). C/D (16x8 fp32) is 4
// floats: (row g, cols 2t, 2t+1), (row g+8, cols 2t, 2t+1). A C fragment of two adjacent
// n-tiles, rounded to bf16, is exactly the A fragment of the next product (FlashAttention-2's
// P V without a trip through shared memory).
#define ATT_PAD 8 // bf16 of padding per shared-memory row: rows stay 16-byte aligned, and the
                  // 8 rows x 4 words of a fragment load fall in 32 different banks

// d += a b (16x8x16, bf16 in, fp32 accumulate)
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x = lo (low half), .y = hi
    return *reinterpret_cast<uint32_t *>(&v);
}

// two bf16 at s[i], s[i+1] (i even) as one register
__device__ __forceinline__ uint32_t lds_pair(const __nv_bfloat16 *s, int i) {
    return *reinterpret_cast<const uint32_t *>(s + i);
}

// A fragment of the 16x16 block at rows r0.., cols c0.. of a row-major smem array (row stride
// ld); also the two B registers of a "rows are n" operand (K for Q K^T) via lds_pair directly
__device__ __forceinline__ void lds_frag_a(uint32_t a[4], const __nv_bfloat16 *s, int ld, int r0,
                                           int c0, int g, int t) {
    a[0] = lds_pair(s, (r0 + g) * ld + c0 + 2 * t);
    a[1] = lds_pair(s, (r0 + g + 8) * ld + c0 + 2 * t);
    a[2] = lds_pair(s, (r0 + g) * ld + c0 + 2 * t + 8);
    a[3] = lds_pair(s, (r0 + g + 8) * ld + c0 + 2 * t + 8);
}

// B fragments of two n-tiles (cols c0..c0+15) for the k rows r0..r0+15 of a row-major smem
// array whose rows are k (V for P V): ldmatrix.x4.trans; b[0..1] for cols c0.., b[2..3] for
// cols c0+8... Lanes 8i..8i+7 address the rows of 8x8 matrix i.
__device__ __forceinline__ void lds_frag_b_trans(uint32_t b[4], const __nv_bfloat16 *s, int ld,
                                                 int r0, int c0, int lane) {
    const __nv_bfloat16 *p = s + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8;
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(addr));
}

// A fragment k-step kk (keys 16kk..16kk+15) from the C fragments s of n-tiles 2kk and 2kk+1
__device__ __forceinline__ void frag_c_to_a(uint32_t a[4], const float s0[4], const float s1[4]) {
    a[0] = pack_bf16(s0[0], s0[1]);
    a[1] = pack_bf16(s0[2], s0[3]);
    a[2] = pack_bf16(s1[0], s1[1]);
    a[3] = pack_bf16(s1[2], s1[3]);
}

// acc (16 x 8NT) += A B^T: A = rows r0..r0+15 of the row-major smem array As (16 x 16KS), B =
// rows 0..8NT-1 of the row-major smem array Bs (8NT x 16KS). The shape of S = Q K^T.
template <int NT, int KS>
__device__ __forceinline__ void mma_rows_by_rows(float acc[NT][4], const __nv_bfloat16 *As, int r0,
                                                 const __nv_bfloat16 *Bs, int ld, int g, int t) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint32_t a[4];
        lds_frag_a(a, As, ld, r0, 16 * ks, g, t);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            int off = (8 * nt + g) * ld + 16 * ks + 2 * t;
            mma_bf16(acc[nt], a, lds_pair(Bs, off), lds_pair(Bs, off + 8));
        }
    }
}

// acc (16 x 8NT) += P B: P (16 x 16KT) given as the fp32 C fragments p of 2KT n-tiles (rounded
// to bf16 here), B = rows 0..16KT-1 of the row-major smem array Bs (16KT x 8NT). The shape of
// O = P V.
template <int NT, int KT>
__device__ __forceinline__ void mma_frags_by_rows(float acc[NT][4], const float p[2 * KT][4],
                                                  const __nv_bfloat16 *Bs, int ld, int lane) {
#pragma unroll
    for (int kk = 0; kk < KT; kk++) {
        uint32_t a[4];
        frag_c_to_a(a, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int n2 = 0; n2 < NT / 2; n2++) {
            uint32_t b[4];
            lds_frag_b_trans(b, Bs, ld, 16 * kk, 16 * n2, lane);
            mma_bf16(acc[2 * n2], a, b[0], b[1]);
            mma_bf16(acc[2 * n2 + 1], a, b[2], b[3]);
        }
    }
}

// Copies rows [r0, r0 + rows) of one head's (T, HS) slice (row stride ld elements in global
// memory) into smem (row stride HS + ATT_PAD), 16 bytes per thread per step; rows >= T are 0.
__device__ __forceinline__ void att_stage(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int64_t ld,
                                          int r0, int rows, int T, int HS) {
    int per_row = HS / 8;
    for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
        int r = i / per_row, c = (i % per_row) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < T) v = *reinterpret_cast<const uint4 *>(src + (int64_t)(r0 + r) * ld + c);
        *reinterpret_cast<uint4 *>(dst + r * (HS + ATT_PAD) + c) = v;
    }
}

// stores rows g and g+8 of a warp's 16-row fp32 accumulator (NT n-tiles) times `scale` as bf16
// into dst rows r0 + g, r0 + g + 8 (row stride ld), skipping rows >= T
template <int NT>
__device__ __forceinline__ void att_store_rows(__nv_bfloat16 *dst, int64_t ld, const float acc[NT][4],
                                               float scale0, float scale1, int r0, int T, int g, int t) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = r0 + g + 8 * r;
        if (row >= T) continue;
        float sc = r ? scale1 : scale0;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            *reinterpret_cast<uint32_t *>(dst + (int64_t)row * ld + nt * 8 + 2 * t) =
                pack_bf16(acc[nt][2 * r] * sc, acc[nt][2 * r + 1] * sc);
    }
}
