// Private to the attention files: shapes, the choice between the tensor-core kernels and the
// simple ones, and the bf16 mma.sync building blocks the tensor-core kernels share.
//
// Layout (backend.h): a query block q (B,Tq,ldq) with head h's queries at columns h*hs; a key and
// value block kv (B,Tk,ldk) with head h's keys at columns ldk - 2C + h*hs and its values C after
// them (ldq = C or 3C, ldk = 2C or 3C: q and kv may both be one qkv tensor); out/dout (B,Tq,C);
// lse (B,NH,Tq) fp32, the natural-log logsumexp of the scaled, visible scores of each query row.
// Query row i sees key rows [0, clamp(i + delta + 1, 0, Tk)) (loom_attn_delta: the causal mask at
// the blocks' global positions; delta = Tk without it), so the kernels mask key > row + delta and
// key >= Tk.
#pragma once
#include "backend/cuda/cuda_ops.h"

#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

typedef struct { // plain ints: passed to the kernels by value
    int B, Tq, Tk, C, NH, hs, ldq, ldk, delta;
    int add; // the backward adds into dq, dkv (else writes them)
} attn_dims;

static inline attn_dims attn_check(const loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor q,
                                   loom_tensor kv, int NH, loom_attn_span span) {
    LOOM_CHECK(q.ndim == 3 && kv.ndim == 3 && q.shape[0] == kv.shape[0] && q.shape[0] > 0);
    int64_t B = q.shape[0], Tq = q.shape[1], Tk = kv.shape[1], C = loom_cols(&out);
    LOOM_CHECK(Tq > 0 && Tk > 0 && NH > 0 && C > 0 && C % NH == 0 && loom_rows(&out) == B * Tq);
    LOOM_CHECK((q.shape[2] == C || q.shape[2] == 3 * C) && (kv.shape[2] == 2 * C || kv.shape[2] == 3 * C));
    LOOM_CHECK(loom_numel(&lse) == B * NH * Tq && Tq < INT32_MAX / 2 && Tk < INT32_MAX / 2);
    bool bf = cuda_act(be, out);
    LOOM_CHECK(cuda_act(be, q) == bf && cuda_act(be, kv) == bf);
    (void)cuda_f32(lse);
    return attn_dims{(int)B, (int)Tq, (int)Tk, (int)C, NH, (int)(C / NH), (int)q.shape[2], (int)kv.shape[2],
                     (int)loom_attn_delta(span, Tq, Tk), span.accumulate};
}

// The keys query row i sees: [0, att_visible(d, i))
__host__ __device__ __forceinline__ int att_visible(const attn_dims &d, int i) {
    int n = i + d.delta + 1;
    return n < 0 ? 0 : n > d.Tk ? d.Tk : n;
}

static inline bool attn_aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

// The tensor-core kernels take bf16 with head size 64 or 128 and 16-byte aligned tensors (every
// row of a head is then 16-byte aligned too, as C is a multiple of 64).
static inline bool attn_use_tc(const loom_backend *be, attn_dims d) {
    return be->dtype == LOOM_BF16 && (d.hs == 64 || d.hs == 128);
}

// Where a thread of the attention kernels works. Tiled kernels: grid ntiles * B*NH blocks
// (att_tile_place). Row kernels: grid (rows / warps, B*NH), one row per warp. q, k and o are the
// offsets of head (b, h), row 0, in q (B,Tq,ldq), in kv (B,Tk,ldk) (its keys; the values are C
// after them) and in out/dout (B,Tq,C).
typedef struct {
    int tile;                 // tiled kernels: the block's tile; row kernels: the warp's row
    int bh, warp, lane, g, t; // g, t: the lane's group and place in it (mma fragments)
    int64_t q, k, o;
} att_place;

__device__ __forceinline__ att_place att_place_of(const attn_dims &d, int bh, int tile) {
    att_place p;
    int b = bh / d.NH, h = bh % d.NH;
    p.tile = tile, p.bh = bh, p.warp = threadIdx.x / 32, p.lane = threadIdx.x % 32;
    p.g = p.lane / 4, p.t = p.lane % 4;
    p.q = (int64_t)b * d.Tq * d.ldq + h * d.hs;
    p.k = (int64_t)b * d.Tk * d.ldk + d.ldk - 2 * d.C + h * d.hs;
    p.o = (int64_t)b * d.Tq * d.C + h * d.hs;
    return p;
}
// Block order: heads in groups of G (about ATT_GROUP blocks: a few waves, so that the K/V or
// Q/dO rows they all stream stay in L2), within a group the tiles with the most work first:
// last_first for query tiles, plain order for key tiles (the backward's dK, dV).
#define ATT_GROUP 256
__device__ __forceinline__ att_place att_tile_place(const attn_dims &d, bool last_first) {
    int BNH = d.B * d.NH, ntiles = gridDim.x / BNH, G = max(1, min(BNH, ATT_GROUP / ntiles));
    int g0 = (int)blockIdx.x / (G * ntiles) * G, i = (int)blockIdx.x % (G * ntiles), n = min(G, BNH - g0);
    int tile = i / n;
    return att_place_of(d, g0 + i % n, last_first ? ntiles - 1 - tile : tile);
}
__device__ __forceinline__ att_place att_row_place(const attn_dims &d, int warps) {
    return att_place_of(d, blockIdx.y, blockIdx.x * warps + threadIdx.x / 32);
}

// attention_forward_tc.cu / attention_backward_tc.cu (bf16, hs 64 or 128)
void attention_forward_tc(loom_cuda *cu, attn_dims d, __nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                          const __nv_bfloat16 *kv);
// dq +=, dkv += (shaped as q, kv); D (B,NH,Tq): scratch for rowsum(dout * out) per head, which the
// dq kernel computes and writes
void attention_backward_tc(loom_cuda *cu, attn_dims d, __nv_bfloat16 *dq, __nv_bfloat16 *dkv,
                           const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *kv,
                           const __nv_bfloat16 *out, const float *lse, float *D);

// ---- tensor-core building blocks (PTX ISA: mma.m16n8k16 .bf16 fragments, ldmatrix, cp.async) ----
// Lane = 4 * g + t (g = groupID 0..7, t = thread in group 0..3). A (16x16, row-major) is 4
// registers of 2 bf16: (row g, cols 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..). B
// (16x8, "col") is 2 registers: (k 2t..2t+1, n g), (k 2t+8.., n g). C/D (16x8 fp32) is 4
// floats: (row g, cols 2t, 2t+1), (row g+8, cols 2t, 2t+1). A C fragment of two adjacent
// n-tiles, rounded to bf16, is exactly the A fragment of the next product (FlashAttention-2's
// P V without a trip through shared memory). All fragments come from shared memory through
// ldmatrix.x4 (four 8x8 matrices, lanes 8i..8i+7 address the rows of matrix i).
#define ATT_PAD 8 // bf16 of padding per shared-memory row: rows stay 16-byte aligned, and the
                  // 8 rows x 16 bytes of an ldmatrix matrix fall in 32 different banks
typedef __nv_bfloat16 bf16;

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

__device__ __forceinline__ float att_exp2(float x) { // MUFU.EX2; 2^-inf = 0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const bf16 *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// Fragments from a row-major smem array s (row stride ld), 16x16 block at rows r0.., cols c0..:
// the A fragment (rows are m, cols k: Q for Q K^T)
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const bf16 *s, int ld, int r0, int c0, int lane) {
    ldsm_x4(a, s + (r0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8);
}
// B fragments of two n-tiles when rows are n and cols k (K for Q K^T): b[0..1] for n r0..r0+7,
// b[2..3] for n r0+8..r0+15
__device__ __forceinline__ void ldsm_b(uint32_t b[4], const bf16 *s, int ld, int r0, int c0, int lane) {
    ldsm_x4(b, s + (r0 + (lane & 7) + (lane >> 4) * 8) * ld + c0 + ((lane >> 3) & 1) * 8);
}
// B fragments of two n-tiles when rows are k and cols n (V for P V): b[0..1] for n c0..c0+7,
// b[2..3] for n c0+8..c0+15
__device__ __forceinline__ void ldsm_bt(uint32_t b[4], const bf16 *s, int ld, int r0, int c0, int lane) {
    ldsm_x4_trans(b, s + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8);
}

// A fragment k-step kk (k = 16kk..16kk+15) from the C fragments of n-tiles 2kk and 2kk+1
__device__ __forceinline__ void frag_c_to_a(uint32_t a[4], const float s0[4], const float s1[4]) {
    a[0] = pack_bf16(s0[0], s0[1]);
    a[1] = pack_bf16(s0[2], s0[3]);
    a[2] = pack_bf16(s1[0], s1[1]);
    a[3] = pack_bf16(s1[2], s1[3]);
}

// acc[i] (16 x 8NT) += A_i B for the MW m-tiles of a warp: A_i given as fp32 C fragments p[i]
// of 2KT n-tiles (16 x 16KT, rounded to bf16 here), B = rows 0..16KT-1, cols 0..8NT-1 of the
// row-major smem array Bs (rows are k: V for O += P V, dO for dV += P^T dO, ...)
template <int MW, int NT, int KT>
__device__ __forceinline__ void mma_frags_by_rows(float (*acc)[NT][4], const float (*p)[2 * KT][4],
                                                  const bf16 *Bs, int ld, int lane) {
#pragma unroll
    for (int kk = 0; kk < KT; kk++) {
        uint32_t a[MW][4];
#pragma unroll
        for (int i = 0; i < MW; i++) frag_c_to_a(a[i], p[i][2 * kk], p[i][2 * kk + 1]);
#pragma unroll
        for (int n2 = 0; n2 < NT / 2; n2++) {
            uint32_t b[4];
            ldsm_bt(b, Bs, ld, 16 * kk, 16 * n2, lane);
#pragma unroll
            for (int i = 0; i < MW; i++) {
                mma_bf16(acc[i][2 * n2], a[i], b[0], b[1]);
                mma_bf16(acc[i][2 * n2 + 1], a[i], b[2], b[3]);
            }
        }
    }
}

// ---- asynchronous staging (cp.async, 16 bytes a thread; rows past T are zero-filled) ----
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool ok) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Issues the copy of rows [r0, r0 + ROWS) of one head's (T, HS) slice (row stride ld elements in
// global memory) into smem (row stride HS + ATT_PAD); rows >= T become zero. All NTHREADS call.
template <int HS, int ROWS, int NTHREADS>
__device__ __forceinline__ void att_load(bf16 *dst, const bf16 *src, int64_t ld, int r0, int T) {
    constexpr int PER_ROW = HS / 8, N = ROWS * PER_ROW;
    static_assert(N % NTHREADS == 0, "whole steps");
#pragma unroll
    for (int it = 0; it < N / NTHREADS; it++) {
        int i = it * NTHREADS + (int)threadIdx.x, r = i / PER_ROW, c = (i % PER_ROW) * 8;
        bool ok = r0 + r < T;
        cp_async16(dst + r * (HS + ATT_PAD) + c, src + (ok ? (int64_t)(r0 + r) * ld + c : 0), ok);
    }
}

// Stores rows g and g+8 of a warp's 16-row fp32 accumulator (NT n-tiles), row r scaled by sc[r],
// as bf16 into dst rows r0.. (row stride ld), skipping rows >= T, or with ADD adds them to what
// dst holds: through the warp's own 16 rows of smem (sm, row stride 8NT + ATT_PAD), so that global
// loads and stores are 16 bytes a lane.
template <int NT, bool ADD>
__device__ __forceinline__ void att_store_rows(bf16 *dst, int64_t ld, const float acc[NT][4], float sc0,
                                               float sc1, bf16 *sm, int r0, int T, int lane) {
    constexpr int LD = 8 * NT + ATT_PAD;
    int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        uint32_t *p = reinterpret_cast<uint32_t *>(sm + g * LD + 8 * nt + 2 * t);
        p[0] = pack_bf16(acc[nt][0] * sc0, acc[nt][1] * sc0);
        p[4 * LD] = pack_bf16(acc[nt][2] * sc1, acc[nt][3] * sc1); // row g + 8
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < NT / 2; it++) { // 16 rows x NT chunks of 16 bytes
        int i = it * 32 + lane, r = i / NT, c = (i % NT) * 8;
        if (r0 + r >= T) continue;
        uint4 x = *reinterpret_cast<const uint4 *>(sm + r * LD + c);
        uint4 *out = reinterpret_cast<uint4 *>(dst + (int64_t)(r0 + r) * ld + c);
        if constexpr (ADD) {
            uint4 y = *out;
            __nv_bfloat162 *xs = reinterpret_cast<__nv_bfloat162 *>(&x);
            const __nv_bfloat162 *ys = reinterpret_cast<const __nv_bfloat162 *>(&y);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 a = __bfloat1622float2(xs[e]), b = __bfloat1622float2(ys[e]);
                xs[e] = __floats2bfloat162_rn(a.x + b.x, a.y + b.y);
            }
        }
        *out = x;
    }
    __syncwarp();
}
