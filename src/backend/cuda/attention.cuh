// Private to the attention files: shapes, the choice between the Hopper kernels and the simple
// ones, work placement, and the register fragments the Hopper kernels share.
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

// The Hopper kernels take bf16 with head size 64 or 128 and 16-byte aligned tensors (every row of
// a head is then 16-byte aligned too, as C is a multiple of 64: what the bulk tensor copies need).
static inline bool attn_use_wgmma(const loom_backend *be, attn_dims d) {
    return be->dtype == LOOM_BF16 && (d.hs == 64 || d.hs == 128);
}

// Where a thread of the attention kernels works. Hopper kernels: work items ntiles * B*NH
// (att_tile_at). Row kernels: grid (rows / warps, B*NH), one row per warp. q, k and o are the
// offsets of head (b, h), row 0, in q (B,Tq,ldq), in kv (B,Tk,ldk) (its keys; the values are C
// after them) and in out/dout (B,Tq,C).
typedef struct {
    int tile; // Hopper kernels: the item's tile; row kernels: the warp's row
    int bh, warp, lane;
    int64_t q, k, o;
} att_place;

__device__ __forceinline__ att_place att_place_of(const attn_dims &d, int bh, int tile) {
    att_place p;
    int b = bh / d.NH, h = bh % d.NH;
    p.tile = tile, p.bh = bh, p.warp = threadIdx.x / 32, p.lane = threadIdx.x % 32;
    p.q = (int64_t)b * d.Tq * d.ldq + h * d.hs;
    p.k = (int64_t)b * d.Tk * d.ldk + d.ldk - 2 * d.C + h * d.hs;
    p.o = (int64_t)b * d.Tq * d.C + h * d.hs;
    return p;
}
// Item order: heads in groups of G (about ATT_GROUP items: a few waves, so that the K/V or
// Q/dO rows they all stream stay in L2), within a group the tiles with the most work first:
// last_first for query tiles, plain order for key tiles (the backward's dK, dV).
#define ATT_GROUP 256
// Work item `index` of ntiles * B*NH
__device__ __forceinline__ att_place att_tile_at(const attn_dims &d, int index, int ntiles, bool last_first) {
    int BNH = d.B * d.NH, G = max(1, min(BNH, ATT_GROUP / ntiles));
    int g0 = index / (G * ntiles) * G, i = index % (G * ntiles), n = min(G, BNH - g0);
    int tile = i / n;
    return att_place_of(d, g0 + i % n, last_first ? ntiles - 1 - tile : tile);
}
__device__ __forceinline__ att_place att_row_place(const attn_dims &d, int warps) {
    return att_place_of(d, blockIdx.y, blockIdx.x * warps + threadIdx.x / 32);
}

// The Hopper kernels (bf16, hs 64 or 128; attention_wgmma.cuh):
// attention_forward_wgmma.cu: out, lse as cuda_attention_forward
void attention_forward_wgmma(loom_cuda *cu, attn_dims d, __nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                             const __nv_bfloat16 *kv);
// attention_backward_wgmma.cu: dq +=, dkv += (shaped as q, kv), and dbias (3C) += their column
// sums when not NULL (partials in cuda_partials, their add as cuda_add_partials'), with `scratch`
// of attention_backward_wgmma_scratch(d) bytes (16-byte aligned) for what its prep kernel computes
// (rowsum(dout * out) and -lse log2(e) per row), the work counter, the dQ order counters and the
// fp32 dQ accumulator
size_t attention_backward_wgmma_scratch(attn_dims d);
void attention_backward_wgmma(loom_cuda *cu, attn_dims d, __nv_bfloat16 *dq, __nv_bfloat16 *dkv,
                              const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *kv,
                              const __nv_bfloat16 *out, const float *lse, __nv_bfloat16 *dbias, void *scratch);

// ---- register fragments (PTX ISA: the bf16 A fragment of mma.m16n8k16 / wgmma.m64nNk16) ----
// Lane = 4 * g + t (g = groupID 0..7, t = thread in group 0..3). An accumulator n-tile (16x8
// fp32) is 4 floats: (row g, cols 2t, 2t+1), (row g+8, cols 2t, 2t+1); an A fragment (16x16 bf16)
// is 4 registers of 2: (row g, cols 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..). Two
// adjacent accumulator n-tiles, rounded to bf16, are exactly the A fragment of the next product
// (FlashAttention-2's P V without a trip through shared memory).
typedef __nv_bfloat16 bf16;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x = lo (low half), .y = hi
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ float att_exp2(float x) { // MUFU.EX2; 2^-inf = 0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
