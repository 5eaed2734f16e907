// FP8 products of the linear layers (precision "fp8"): each product's two operands rounded to
// FP8 with one scale per tensor from its current amax, as torchao's float8 training with the
// "tensorwise" recipe (Float8LinearConfig's default; Micikevicius et al., "FP8 Formats for Deep
// Learning", 2022):
//   s = FMAX / max(amax(|x|), 1e-12),  x8 = fp8(x s), rounded to nearest even, saturated at FMAX
//   product = (1/s_a)(1/s_b) A8 B8 on the FP8 tensor cores, accumulated in fp32, written in bf16
// Activations and weights in E4M3 (FMAX 448), output gradients in E5M2 (FMAX 57344: the wider
// range). Hopper's FP8 products in cuBLASLt take A transposed and B not (the "TN" layout), so the
// copies are A8 (m,k) and B8 (n,k) row-major, transposed from the bf16 operands where needed:
//   forward  out^T (OC,N) = w8 (OC,C) . inp8 (N,C)          (both as they are)
//   dinp     dinp^T (C,N) = (w^T)8 (C,OC) . dout8 (N,OC)    (w transposed)
//   dw       dw^T (C,OC) += (inp^T)8 (C,N) . (dout^T)8 (OC,N) (both transposed)
// where X . Y is X Y^T. The forward product uses cuBLASLt's fast accumulation, the gradients' do
// not (torchao's defaults), unless the input gradients' do too (fp8_fast_dgrad). The copies live
// in the backend's scratch: (m + n) k bytes. A layer's backward (cuda_fp8_backward) casts dout once
// for both of its products: one amax pass and one read of dout write dout8 and (dout^T)8 with the
// same scale, 2 N OC bytes beside the A copy.
// Delayed scaling (backend.h's fp8_history; fp8_scaling.cu keeps the slots): a cast whose slot has
// a history scales by the slot's s and raises the slot's amax as it converts, so one pass over the
// tensor does what the current amax does in two. The weight's and the input's copies in the
// backward take the forward's slots: the same tensors, so the same scales.
// An MLP's GELU folds into the casts of its two layers' backward (cuda_fp8_mlp_backward): the
// fcproj layer's input copy is cast from gelu(pre), and the fc layer's output gradient from
// dfch gelu'(pre), so neither the GELU's output nor the DGELU product's is needed in bf16; in the
// forward the fcproj product's input is cast from gelu(pre) too (cuda_fp8_mlp_forward). With the
// input-gradient products' fast accumulation (backend.h's fp8_fast_dgrad) under delayed scaling,
// the fcproj layer's dinp product writes the fc layer's output-gradient copies itself
// (gemm_fp8.cu), and dfch is not written at all.
// Under delayed scaling the forward product of a layer whose input is a LayerNorm's output takes
// that input's copy from the LayerNorm, which writes it as it writes the output (fp8_kept.cu).
// Each layer's input copy for its dw product, (inp^T)8, is made in the forward and kept to its
// backward (fp8_kept.cu): written beside the rows copy by a forward product's own cast of its
// input (either recipe: by the current amax the backward's cast would take the same scale; the
// fcproj layer's by the cast of gelu(pre)), or under delayed scaling transposed from the
// LayerNorm's copy (transpose_kernel) where the LayerNorm does not write it itself.
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/fp8.cuh"

#define FP8_WARP_R 64      // a warp's rows in quantize_kernel: 8 threads x FP8_VEC rows
#define FP8_WARP_C 32      // a warp's columns: 4 threads x FP8_VEC columns
#define FP8_THREADS 256
#define FP8_WARP_COLS 2    // warps along a block's columns (the other 4 along its rows)
#define FP8_TILE_R (FP8_WARP_R * (FP8_THREADS / 32 / FP8_WARP_COLS)) // a block's rows: 256
#define FP8_TILE_C (FP8_WARP_C * FP8_WARP_COLS)                      // a block's columns: 64
#define FP8_AMAX_BLOCKS 1024

// *amax = max(*amax, max |y|) over the n values y that a cast OP converts from x (and pre) (n bf16,
// 16-byte aligned, n a multiple of 8: read 8 at a time), as fp32 bits (>= 0: unsigned order is
// float order); FP8_THREADS a block. Read from the end back: the cast after it starts at the
// front, so that each pass begins where the one before it ended, in L2 (quantize_kernel).
template <int OP> __global__ void amax_kernel(const __nv_bfloat16 *x, const __nv_bfloat16 *pre, int64_t n, unsigned *amax) {
    cuda_pdl_begin();
    float m = 0.0f, v[FP8_VEC];
    GRID_STRIDE(j, n / FP8_VEC) {
        int64_t i = n / FP8_VEC - 1 - j;
        uint4 u = ((const uint4 *)x)[i];
        m = convert8<OP>(v, u, OP == FP8_DGELU ? ((const uint4 *)pre)[i] : u, m);
    }
    record_max<FP8_THREADS>(m, amax);
}

// The 8x8 block at (r, c) of the values that cast OP converts from src (R,K) (and pre), times s,
// into rows (R,K) and cols (K,R), each where not NULL; returns their largest |x| (NaN ignored),
// and with SUMS their 8 column sums added to cs (rows in order). The thread's 8 row loads (16 with
// pre) are in flight at once; cols takes the block transposed in registers.
template <int OP, bool SUMS>
__device__ __forceinline__ float quantize_block(uint8_t *rows, uint8_t *cols, float *cs, const __nv_bfloat16 *src,
                                                const __nv_bfloat16 *pre, int64_t r, int64_t c, int64_t R, int64_t K,
                                                float s, __nv_fp8_interpretation_t fmt) {
    uint4 v[FP8_VEC], p[FP8_VEC];
#pragma unroll
    for (int k = 0; k < FP8_VEC; k++) {
        v[k] = *(const uint4 *)(src + (r + k) * K + c);
        p[k] = OP == FP8_DGELU ? *(const uint4 *)(pre + (r + k) * K + c) : v[k];
    }
    uint32_t lo[FP8_VEC], hi[FP8_VEC]; // row k's bytes 0-3 and 4-7
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < FP8_VEC; k++) {
        float x[FP8_VEC];
        m = convert8<OP>(x, v[k], p[k], m);
#pragma unroll
        for (int e = 0; SUMS && e < FP8_VEC; e++) cs[e] += x[e];
        uint2 q = fp8_pack(x, s, fmt);
        lo[k] = q.x, hi[k] = q.y;
        if (rows) *(uint2 *)(rows + (r + k) * K + c) = q;
    }
    if (cols) store_cols(cols, lo, hi, r, c, R);
    return m;
}

// A cast's s: *scale (delayed scaling), or FMAX / *amax (the current amax; then the first thread
// of the grid, `first`, writes 1/s to *inv)
__device__ __forceinline__ float cast_scale(float *inv, bool e5m2, const unsigned *amax, const float *scale,
                                            bool first) {
    float s = scale ? *scale : (e5m2 ? CUDA_FP8_E5M2_MAX : CUDA_FP8_E4M3_MAX) / fmaxf(__uint_as_float(*amax), 1e-12f);
    if (!scale && first) *inv = 1.0f / s;
    return s;
}

// The 8x8 block a thread of quantize_kernel's tile (tr, tc) converts: its first row and column
__device__ __forceinline__ void tile_block(int64_t tr, int64_t tc, int64_t &r, int64_t &c) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    constexpr int XS = FP8_WARP_C / FP8_VEC; // a warp's threads along its columns
    r = tr * FP8_TILE_R + warp / FP8_WARP_COLS * FP8_WARP_R + lane / XS * FP8_VEC;
    c = tc * FP8_TILE_C + warp % FP8_WARP_COLS * FP8_WARP_C + lane % XS * FP8_VEC;
}

// fp8(y s) of the values y that cast OP converts from src (R,K) bf16 (and pre, shaped as src),
// R and K multiples of 8, 16-byte aligned, into rows (R,K) and cols (K,R) (its transpose), each
// where not NULL, with s from cast_scale; *record (when not NULL) raised to the largest |y| (fp32
// bits);
// colpart (with SUMS; (gridDim.y, K) fp32) the column sums of the block's FP8_TILE_R rows,
// added in a fixed order (a thread's rows in order, then its warp's lanes by a butterfly, then
// the warps along the rows in order).
// A thread converts an 8x8 block: the 4 threads of a warp along the columns read 64 contiguous
// bytes a row and write 32 to rows, the 8 along the rows write 64 contiguous bytes a cols row,
// so no sector is part-used and no shared memory is needed for the copies. The grid's x runs
// along a band of FP8_TILE_R rows, y over the bands, so a wave reads whole bands from the front:
// where the amax pass (read from the end back) has just left them in L2.
template <int OP, bool SUMS>
__global__ void quantize_kernel(uint8_t *rows, uint8_t *cols, float *inv, const __nv_bfloat16 *src,
                                const __nv_bfloat16 *pre, int64_t R, int64_t K, bool e5m2, const unsigned *amax,
                                const float *scale, unsigned *record, float *colpart) {
    cuda_pdl_begin();
    constexpr int RW = FP8_THREADS / 32 / FP8_WARP_COLS; // warps along a block's rows
    __shared__ float sums[RW][FP8_TILE_C];
    float s = cast_scale(inv, e5m2, amax, scale, blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    constexpr int XS = FP8_WARP_C / FP8_VEC; // a warp's threads along its columns
    int64_t r, c;
    tile_block(blockIdx.y, blockIdx.x, r, c);
    float cs[FP8_VEC] = {};
    float m = r < R && c < K ? quantize_block<OP, SUMS>(rows, cols, cs, src, pre, r, c, R, K, s,
                                                       e5m2 ? __NV_E5M2 : __NV_E4M3)
                             : 0.0f;
    if (SUMS) { // the same for the whole grid, as record
#pragma unroll
        for (int j = 0; j < FP8_VEC; j++) // over the lanes along the rows
            for (int o = XS; o < 32; o <<= 1) cs[j] += __shfl_xor_sync(0xffffffffu, cs[j], o);
        float *mine = sums[warp / FP8_WARP_COLS] + warp % FP8_WARP_COLS * FP8_WARP_C + lane * FP8_VEC;
        if (lane < XS)
            for (int j = 0; j < FP8_VEC; j++) mine[j] = cs[j];
        __syncthreads();
        int64_t col = (int64_t)blockIdx.x * FP8_TILE_C + threadIdx.x;
        if (threadIdx.x < FP8_TILE_C && col < K) {
            float t = 0.0f;
            for (int w = 0; w < RW; w++) t += sums[w][threadIdx.x];
            colpart[blockIdx.y * K + col] = t;
        }
    }
    if (record) record_max<FP8_THREADS>(m, record);
}

// quantize_kernel's rows copy alone (no cols, no column sums) as one flat grid-stride pass over
// src (n bf16, a multiple of 8): on an H200, 13M elements take 10.7 us this way and 14.8 in
// quantize_kernel's 2D tiles, which leave their waves part-full at such sizes
__global__ void quantize_rows_kernel(uint8_t *rows, float *inv, const __nv_bfloat16 *src, int64_t n, bool e5m2,
                                     const unsigned *amax, const float *scale, unsigned *record) {
    cuda_pdl_begin();
    float s = cast_scale(inv, e5m2, amax, scale, blockIdx.x == 0 && threadIdx.x == 0), m = 0.0f;
    __nv_fp8_interpretation_t fmt = e5m2 ? __NV_E5M2 : __NV_E4M3;
    GRID_STRIDE(i, n / FP8_VEC) {
        float x[FP8_VEC];
        m = unpack8(x, ((const uint4 *)src)[i], m);
        ((uint2 *)rows)[i] = fp8_pack(x, s, fmt);
    }
    if (record) record_max<FP8_THREADS>(m, record);
}

// cols (K,R) = rows (R,K) transposed (FP8 bytes), in quantize_kernel's tiles and 8x8 blocks
__global__ void transpose_kernel(uint8_t *cols, const uint8_t *rows, int64_t R, int64_t K) {
    cuda_pdl_begin();
    int64_t r, c;
    tile_block(blockIdx.x, blockIdx.y, r, c);
    if (r >= R || c >= K) return;
    uint32_t lo[FP8_VEC], hi[FP8_VEC];
#pragma unroll
    for (int k = 0; k < FP8_VEC; k++) {
        uint2 q = *(const uint2 *)(rows + (r + k) * K + c);
        lo[k] = q.x, hi[k] = q.y;
    }
    store_cols(cols, lo, hi, r, c, R);
}

void cuda_fp8_transpose(loom_cuda *cu, uint8_t *cols, const uint8_t *rows, int64_t R, int64_t K) {
    LOOM_CHECK(R % 16 == 0 && K % 16 == 0 && (uintptr_t)rows % 16 == 0 && (uintptr_t)cols % 16 == 0);
    dim3 grid((unsigned)((R + FP8_TILE_R - 1) / FP8_TILE_R), (unsigned)((K + FP8_TILE_C - 1) / FP8_TILE_C));
    cuda_launch(cu->stream, transpose_kernel, grid, FP8_THREADS, 0, cols, rows, R, K);
}

// The weights of g (n) each as quantize_kernel<FP8_AS_IS> casts it with both copies: block b
// takes tile b - first of the weight whose tiles hold it (the last weight whose first is at most
// b: a binary search), FP8_TILE_R x FP8_TILE_C as quantize_kernel's grid would. With AMAX only
// the weight's largest |x| into *amax; else the copies by *scale (delayed scaling, *record raised
// to the amax) or by FMAX / *amax (the current amax, 1/s into *inv by the weight's first thread).
template <bool AMAX> __global__ void quantize_group_kernel(const cuda_fp8_group *g, int n) {
    cuda_pdl_begin();
    int lo = 0, hi = n - 1, b = blockIdx.x;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (g[mid].first <= b) lo = mid;
        else hi = mid - 1;
    }
    const cuda_fp8_group w = g[lo];
    int t = b - w.first;
    int64_t r, c;
    tile_block(t / w.tiles_k, t % w.tiles_k, r, c);
    float s = AMAX ? 1.0f : cast_scale(w.inv, false, w.amax, w.scale, t == 0 && threadIdx.x == 0);
    float m = r < w.R && c < w.K ? quantize_block<FP8_AS_IS, false>(AMAX ? NULL : w.rows, AMAX ? NULL : w.cols, NULL,
                                                                    (const __nv_bfloat16 *)w.src, NULL, r, c, w.R, w.K,
                                                                    s, __NV_E4M3)
                                 : 0.0f;
    unsigned *into = AMAX ? w.amax : w.record;
    if (into) record_max<FP8_THREADS>(m, into);
}

int cuda_fp8_group_tiles(int R, int K, int *tiles_k) {
    *tiles_k = (K + FP8_TILE_C - 1) / FP8_TILE_C;
    return (R + FP8_TILE_R - 1) / FP8_TILE_R * *tiles_k;
}

void cuda_fp8_cast_group(loom_cuda *cu, const cuda_fp8_group *g, int n, int blocks, bool current) {
    if (current) cuda_launch(cu->stream, quantize_group_kernel<true>, (unsigned)blocks, FP8_THREADS, 0, g, n);
    cuda_launch(cu->stream, quantize_group_kernel<false>, (unsigned)blocks, FP8_THREADS, 0, g, n);
}

// ---- the casts and the products ----
// What a cast reads: the bf16 tensor x, converted as op says (pre: the GELU's input, for FP8_DGELU)
struct fp8_src {
    const void *x;
    fp8_op op;
    const void *pre;
};
static fp8_src as_is(const void *x) { return fp8_src{x, FP8_AS_IS, NULL}; }

template <int OP>
static void amax_launch(loom_cuda *cu, fp8_src src, int64_t n, unsigned *amax) {
    unsigned blocks = cuda_blocks(n / FP8_VEC, FP8_THREADS);
    cuda_launch(cu->stream, amax_kernel<OP>, blocks < FP8_AMAX_BLOCKS ? blocks : FP8_AMAX_BLOCKS, FP8_THREADS, 0,
                (const __nv_bfloat16 *)src.x, (const __nv_bfloat16 *)src.pre, n, amax);
}

template <int OP>
static void quantize_launch(loom_cuda *cu, uint8_t *rows, uint8_t *cols, fp8_cast c, unsigned *amax, fp8_src src,
                            int64_t R, int64_t K, bool e5m2, float *colpart);

// The FP8 copies of the values that src converts (R,K) row-major, as cast c says: rows (R,K) and
// cols (their transpose), each where not NULL; *amax a zeroed fp32 scratch for the current amax;
// colpart (when not NULL) their column sums over each FP8_TILE_R rows, (quantize_chunks(R), K) fp32
static int64_t quantize_chunks(int64_t R) { return (R + FP8_TILE_R - 1) / FP8_TILE_R; }
static void quantize(loom_cuda *cu, uint8_t *rows, uint8_t *cols, fp8_cast c, unsigned *amax, fp8_src src,
                     int64_t R, int64_t K, bool e5m2, float *colpart = NULL) {
    LOOM_CHECK((uintptr_t)src.x % 16 == 0 && R % 16 == 0 && K % 16 == 0); // 16-byte reads, whole 8x8 blocks
    LOOM_CHECK((src.op == FP8_DGELU) == (src.pre != NULL) && (uintptr_t)src.pre % 16 == 0);
    LOOM_CHECK(quantize_chunks(R) <= 65535); // gridDim.y
    switch (src.op) {
    case FP8_AS_IS: return quantize_launch<FP8_AS_IS>(cu, rows, cols, c, amax, src, R, K, e5m2, colpart);
    case FP8_GELU: return quantize_launch<FP8_GELU>(cu, rows, cols, c, amax, src, R, K, e5m2, colpart);
    case FP8_DGELU: return quantize_launch<FP8_DGELU>(cu, rows, cols, c, amax, src, R, K, e5m2, colpart);
    }
}

template <int OP>
static void quantize_launch(loom_cuda *cu, uint8_t *rows, uint8_t *cols, fp8_cast c, unsigned *amax, fp8_src src,
                            int64_t R, int64_t K, bool e5m2, float *colpart) {
    if (!c.scale) amax_launch<OP>(cu, src, R * K, amax);
    if (OP == FP8_AS_IS && !cols && !colpart) { // the rows copy alone: one flat pass, 8 blocks an SM at most
        int64_t blocks = (R * K / FP8_VEC + FP8_THREADS - 1) / FP8_THREADS;
        cuda_launch(cu->stream, quantize_rows_kernel, (unsigned)(blocks < 8 * cu->sms ? blocks : 8 * cu->sms),
                    FP8_THREADS, 0, rows, c.inv, (const __nv_bfloat16 *)src.x, R * K, e5m2, amax, c.scale, c.record);
        return;
    }
    dim3 grid((unsigned)((K + FP8_TILE_C - 1) / FP8_TILE_C), (unsigned)quantize_chunks(R));
    auto kernel = colpart ? quantize_kernel<OP, true> : quantize_kernel<OP, false>;
    cuda_launch(cu->stream, kernel, grid, FP8_THREADS, 0, rows, cols, c.inv, (const __nv_bfloat16 *)src.x,
                (const __nv_bfloat16 *)src.pre, R, K, e5m2, amax, c.scale, c.record, colpart);
}

// Whether g suits FP8: bf16, m, n and k multiples of 16 (cuBLASLt's FP8), dense operands (the
// leading dimensions follow from the shapes), 16-byte aligned
static bool fp8_fits(const loom_cuda *cu, const cuda_gemm *g) {
    bool dense = g->lda == (g->transa ? g->k : g->m) && g->ldb == (g->transb ? g->n : g->k);
    bool aligned = (uintptr_t)g->a % 16 == 0 && (uintptr_t)g->b % 16 == 0;
    return cu->base.dtype == LOOM_BF16 && g->m % 16 == 0 && g->n % 16 == 0 && g->k % 16 == 0 && dense && aligned;
}

// A (m,k) of g as its FP8 copy (E4M3), cast from src (g's bf16 A, or what it is made from): the
// bf16 A is (m,k) row-major with transa, else (k,m)
static void quantize_a(loom_cuda *cu, const cuda_gemm *g, uint8_t *a8, fp8_cast c, unsigned *amax, fp8_src src) {
    quantize(cu, g->transa ? a8 : NULL, g->transa ? NULL : a8, c, amax, src, g->transa ? g->m : g->k,
             g->transa ? g->k : g->m, false);
}

// B (n,k) of g as its FP8 copy, cast from src (g's bf16 B): the bf16 B is (k,n) row-major with
// transb, else (n,k); E5M2 for an output gradient
static void quantize_b(loom_cuda *cu, const cuda_gemm *g, uint8_t *b8, fp8_cast c, unsigned *amax, fp8_src src,
                       bool grad) {
    quantize(cu, g->transb ? NULL : b8, g->transb ? b8 : NULL, c, amax, src, g->transb ? g->k : g->n,
             g->transb ? g->n : g->k, grad);
}

// A (m,k) of g, operand `role` of layer `site`, as its FP8 copy: the step's copy of the layer's
// weight when A is that weight (rows as it is, cols transposed; fp8_kept.cu; c->inv then its 1/s
// where it has its own), else a8 cast from src (quantize_a) as c says
static const uint8_t *copy_a(loom_cuda *cu, const cuda_gemm *g, int site, cuda_fp8_role role, uint8_t *a8,
                             fp8_cast *c, unsigned *amax, fp8_src src) {
    bool weight = role == CUDA_FP8_WEIGHT && src.op == FP8_AS_IS && src.x == g->a;
    float *inv = NULL;
    const uint8_t *kept = weight ? cuda_fp8_kept_weight(cu, site, g->a, g->m * g->k, !g->transa, &inv) : NULL;
    if (kept) {
        if (inv) c->inv = inv; // scaled by the weight's current amax: its 1/s
        return kept;
    }
    quantize_a(cu, g, a8, *c, amax, src);
    return a8;
}

// B (n,k) of g, operand `role` of layer `site`, as its FP8 copy: the one the layer's LayerNorm
// made when B is the layer's input as that wrote it, rows as they are (fp8_kept.cu), else b8 cast
// from src (quantize_b) as c says; a forward product's cast of its input writes the input's
// transposed copy for the layer's backward as well, where one is kept (cuda_fp8_keep_cols; by the
// current amax c->inv is then the copy's own 1/s, which the backward takes with it)
static const uint8_t *copy_b(loom_cuda *cu, const cuda_gemm *g, int site, cuda_fp8_role role, uint8_t *b8,
                             fp8_cast *c, unsigned *amax, fp8_src src) {
    bool input = role == CUDA_FP8_INPUT && src.op == FP8_AS_IS && src.x == g->b && !g->transb;
    const uint8_t *kept = input ? cuda_fp8_kept_input(cu, site, g->b, g->n * g->k) : NULL;
    if (kept) return kept;
    cuda_fp8_ln_unwritten(cu, src.x, "FP8 product's cast");
    float *inv = NULL;
    uint8_t *cols = input ? cuda_fp8_keep_cols(cu, site, g->b, g->n, g->k, false, &inv) : NULL;
    if (cols && !c->scale) c->inv = inv;
    if (cols) quantize(cu, b8, cols, *c, amax, src, g->n, g->k, false);
    else quantize_b(cu, g, b8, *c, amax, src, role == CUDA_FP8_GRAD);
    return b8;
}

// g from a8 (m,k) and b8 (n,k) with their scales: a forward product (b not a gradient) or an
// input-gradient product (a the weight) under the backend's fp8_fast_dgrad with cuBLASLt's fast
// accumulation, the others' partial sums promoted (torchao's and Transformer Engine's defaults)
static cublasStatus_t fp8_run(loom_cuda *cu, const cuda_gemm *g, const uint8_t *a8, const float *inv_a,
                              const uint8_t *b8, const float *inv_b, cuda_fp8_role role_a, cuda_fp8_role role_b) {
    cuda_gemm f = *g;
    bool grad = role_b == CUDA_FP8_GRAD;
    f.a = a8, f.b = b8, f.lda = g->k, f.ldb = g->k, f.transa = true, f.transb = false;
    f.scale_a = inv_a, f.scale_b = inv_b;
    f.type_a = CUDA_R_8F_E4M3, f.type_b = grad ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
    f.fast_accum = !grad || (role_a == CUDA_FP8_WEIGHT && cu->base.fp8_fast_dgrad);
    return cuda_gemm_run(cu, &f);
}

// Stops with a line naming the product where cuBLASLt refuses an FP8 product that suits FP8 (the
// MLP's backward has no bf16 copy of dfch to fall back on)
static void fp8_must(cublasStatus_t st, const cuda_gemm *g) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "loom: cuBLASLt has no FP8 algorithm for a %lldx%lldx%lld product: %s\n", (long long)g->m,
            (long long)g->n, (long long)g->k, cublasLtGetStatusString(st));
    abort();
}

// The scratch's head: the casts' amax slots (FP8_CASTS at most), then their scales, each 16-byte
// aligned (cuBLASLt's FP8 kernels refuse others at run time: NOT_SUPPORTED); the copies follow at
// FP8_HEAD
#define FP8_HEAD 256
#define FP8_CASTS 8
struct fp8_head {
    unsigned *amax;
    float *inv[FP8_CASTS];
};
static fp8_head fp8_head_of(char *base) {
    fp8_head h;
    h.amax = (unsigned *)base;
    for (int i = 0; i < FP8_CASTS; i++) h.inv[i] = (float *)(base + 64) + 4 * i;
    return h;
}

// The amax slots zeroed when a cast scales by its current amax (`needed`: delayed scaling's casts
// with a history read none)
static void fp8_head_clear(loom_cuda *cu, fp8_head h, bool needed) {
    if (needed) CUDA_CHECK(cudaMemsetAsync(h.amax, 0, FP8_CASTS * sizeof(unsigned), cu->stream));
}

cublasStatus_t cuda_fp8_gemm_run(loom_cuda *cu, const cuda_gemm *g, cuda_fp8_role role_a, cuda_fp8_role role_b) {
    if (!fp8_fits(cu, g)) return CUBLAS_STATUS_NOT_SUPPORTED;
    size_t a_bytes = cuda_align256((size_t)(g->m * g->k));
    char *base = (char *)cuda_scratch(cu, FP8_HEAD + a_bytes + cuda_align256((size_t)(g->n * g->k)));
    fp8_head h = fp8_head_of(base);
    uint8_t *a8 = (uint8_t *)base + FP8_HEAD, *b8 = a8 + a_bytes;
    fp8_cast ca = cuda_fp8_cast_of(cu, role_a, h.inv[0]), cb = cuda_fp8_cast_of(cu, role_b, h.inv[1]);
    fp8_head_clear(cu, h, !ca.scale || !cb.scale);
    int site = cu->base.fp8_site;
    const uint8_t *a = copy_a(cu, g, site, role_a, a8, &ca, &h.amax[0], as_is(g->a));
    const uint8_t *b = copy_b(cu, g, site, role_b, b8, &cb, &h.amax[1], as_is(g->b));
    return fp8_run(cu, g, a, ca.inv, b, cb.inv, role_a, role_b);
}

// A layer's output gradient dout (N,OC) as the copies its backward takes: rows (N,OC) and cols
// (OC,N) in E5M2 by 1/s *inv, and its column sums over each `chunk` rows, colpart (N / chunk, OC)
// fp32 (NULL: none)
struct fp8_dout {
    uint8_t *rows, *cols;
    const float *inv;
    float *colpart;
    int64_t chunk;
};

// The input's copy of a layer's dw product gw (A (IC,N) as gw takes it, cast from x): its
// transposed copy kept from the forward (fp8_kept.cu; *c's inv then its own where it was scaled by
// its current amax), else x cast into a8 (in stream order after what ran before)
static const uint8_t *copy_input_t(loom_cuda *cu, int site, const cuda_gemm *gw, fp8_src x, uint8_t *a8, fp8_cast *c,
                                   unsigned *amax) {
    float *xinv = NULL;
    const uint8_t *xt = gw->transa ? NULL : cuda_fp8_kept_cols(cu, site, x.x, gw->m * gw->k, x.op == FP8_GELU, &xinv);
    if (xinv) c->inv = xinv;
    if (xt) return xt;
    cuda_fp8_unpromised(cu, x.x, site, "weight-gradient product's cast");
    quantize_a(cu, gw, a8, *c, amax, x);
    return a8;
}

// The dw product gw of layer `site` from dout's cols and the input's copy (copy_input_t), then
// dbias (OC, when not NULL) += (or =, grads_write) dout's column sums where the product ran
static cublasStatus_t dw_backward(loom_cuda *cu, int site, const cuda_gemm *gw, void *dbias, fp8_dout d, fp8_src x,
                                  uint8_t *a8, fp8_cast cx, unsigned *amax) {
    const uint8_t *xt = copy_input_t(cu, site, gw, x, a8, &cx, amax);
    cublasStatus_t st = fp8_run(cu, gw, xt, cx.inv, d.cols, d.inv, CUDA_FP8_INPUT, CUDA_FP8_GRAD);
    if (dbias && st == CUBLAS_STATUS_SUCCESS)
        cuda_add_partials(cu, dbias, true, !cu->base.grads_write, d.colpart, (gw->k + d.chunk - 1) / d.chunk, gw->n,
                          gw->n);
    return st;
}

void cuda_fp8_backward(loom_cuda *cu, const cuda_gemm *gi, const cuda_gemm *gw, void *dbias, cublasStatus_t *si,
                       cublasStatus_t *sw) {
    *si = *sw = CUBLAS_STATUS_NOT_SUPPORTED;
    int64_t N = gi->n, OC = gi->k; // dout (N,OC): gi's B as it is, gw's B transposed
    LOOM_CHECK(gi->b == gw->b && !gi->transb && gw->transb && gw->k == N && gw->n == OC);
    if (!fp8_fits(cu, gi) || !fp8_fits(cu, gw)) return;
    size_t d_bytes = cuda_align256((size_t)(N * OC)), p_bytes = dbias ? quantize_chunks(N) * OC * sizeof(float) : 0;
    size_t a_bytes = cuda_align256((size_t)(gi->m * gi->k > gw->m * gw->k ? gi->m * gi->k : gw->m * gw->k));
    char *base = (char *)cuda_scratch(cu, FP8_HEAD + 2 * d_bytes + a_bytes + p_bytes);
    fp8_head h = fp8_head_of(base);
    uint8_t *rows = (uint8_t *)base + FP8_HEAD, *a8 = rows + 2 * d_bytes;
    int site = cu->base.fp8_site;
    fp8_cast cd = cuda_fp8_cast_of(cu, CUDA_FP8_GRAD, h.inv[0]), cw = cuda_fp8_cast_of(cu, CUDA_FP8_WEIGHT, h.inv[1]);
    fp8_cast cx = cuda_fp8_cast_of(cu, CUDA_FP8_INPUT, h.inv[2]);
    fp8_head_clear(cu, h, !cd.scale || !cw.scale || !cx.scale);
    fp8_dout d = {rows, rows + d_bytes, cd.inv, dbias ? (float *)(a8 + a_bytes) : NULL, FP8_TILE_R};
    quantize(cu, d.rows, d.cols, cd, &h.amax[0], as_is(gi->b), N, OC, true, d.colpart); // one amax, one read of dout
    const uint8_t *wa = copy_a(cu, gi, site, CUDA_FP8_WEIGHT, a8, &cw, &h.amax[1], as_is(gi->a));
    *si = fp8_run(cu, gi, wa, cw.inv, d.rows, d.inv, CUDA_FP8_WEIGHT, CUDA_FP8_GRAD);
    *sw = dw_backward(cu, site, gw, dbias, d, as_is(gw->a), a8, cx, &h.amax[2]);
}

bool cuda_fp8_mlp_backward(loom_cuda *cu, const cuda_gemm *gi_p, const cuda_gemm *gw_p, void *dprojb,
                           const void *act_pre, const cuda_gemm *gi_f, const cuda_gemm *gw_f, void *dfcb,
                           const void *pre, int site_fc, int site_proj) {
    int64_t N = gi_p->n, C = gi_p->k, OC = gi_p->m; // dout (N,C), dfch (N,OC)
    LOOM_CHECK(gi_p->b == gw_p->b && gi_f->b == gi_p->d && gi_f->b == gw_f->b && gi_f->n == N && gi_f->k == OC);
    LOOM_CHECK(!gw_p->transa && !gw_f->transa && gi_p->d == gi_f->b);
    bool aligned = (uintptr_t)pre % 16 == 0 && (uintptr_t)act_pre % 16 == 0;
    if (!fp8_fits(cu, gi_p) || !fp8_fits(cu, gw_p) || !fp8_fits(cu, gi_f) || !fp8_fits(cu, gw_f) || !aligned)
        return false;
    size_t dp_bytes = cuda_align256((size_t)(N * C)), df_bytes = cuda_align256((size_t)(N * OC));
    size_t a_bytes = cuda_align256((size_t)(OC * (C > N ? C : N))); // a weight (OC,C) or an input's copy (OC,N)
    size_t pp_bytes = cuda_align256(quantize_chunks(N) * C * sizeof(float));
    // the fc layer's column sums: over 128 rows (gemm_fp8.cu) or FP8_TILE_R (the cast)
    char *base = (char *)cuda_scratch(cu, FP8_HEAD + 2 * dp_bytes + 2 * df_bytes + a_bytes + pp_bytes +
                                              (size_t)((N + 127) / 128) * OC * sizeof(float));
    fp8_head h = fp8_head_of(base);
    uint8_t *rows_p = (uint8_t *)base + FP8_HEAD, *rows_f = rows_p + 2 * dp_bytes, *a8 = rows_f + 2 * df_bytes;
    float *colpart_p = (float *)(a8 + a_bytes), *colpart_f = (float *)((char *)colpart_p + pp_bytes);
    // [fcproj, fc][dout, weight, input], the higher site's first: a site's first cast may move the
    // slots (to make room), which would leave pointers taken before it stale
    fp8_cast c[2][3];
    int fc_first = site_fc > site_proj;
    for (int j = 0; j < 2; j++) {
        int layer = j == 0 ? fc_first : !fc_first, site = layer ? site_fc : site_proj; // layer 1: the fc
        for (int r = 0; r < 3; r++)
            c[layer][r] = cuda_fp8_cast_at(cu, site, r == 0 ? CUDA_FP8_GRAD : r == 1 ? CUDA_FP8_WEIGHT : CUDA_FP8_INPUT,
                                           h.inv[3 * layer + r]);
    }
    bool current = false;
    for (int i = 0; i < 6; i++) current |= !c[i / 3][i % 3].scale;
    fp8_head_clear(cu, h, current);
    fp8_dout dp = {rows_p, rows_p + dp_bytes, c[0][0].inv, dprojb ? colpart_p : NULL, FP8_TILE_R};
    quantize(cu, dp.rows, dp.cols, c[0][0], &h.amax[0], as_is(gi_p->b), N, C, true, dp.colpart);
    // dfch's copies: written by the fcproj layer's dinp product itself (gemm_fp8.cu: delayed
    // scaling, fast accumulation for the input gradients), else cast from dfch after it
    const uint8_t *wp = copy_a(cu, gi_p, site_proj, CUDA_FP8_WEIGHT, a8, &c[0][1], &h.amax[1], as_is(gi_p->a));
    fp8_dout df = {rows_f, rows_f + df_bytes, c[1][0].inv, colpart_f, 128};
    bool fused = cu->base.fp8_fast_dgrad &&
                 cuda_fp8_dgelu_gemm(cu, dp.rows, dp.inv, wp, c[0][1].inv, pre, N, OC, C,
                                     cuda_fp8_dgelu_out{df.rows, df.cols, df.colpart, c[1][0]});
    if (!fused) {
        fp8_must(fp8_run(cu, gi_p, wp, c[0][1].inv, dp.rows, dp.inv, CUDA_FP8_WEIGHT, CUDA_FP8_GRAD), gi_p);
        df.chunk = FP8_TILE_R;
        quantize(cu, df.rows, df.cols, c[1][0], &h.amax[3], fp8_src{gi_f->b, FP8_DGELU, pre}, N, OC, true, df.colpart);
    }
    fp8_src act = act_pre ? fp8_src{act_pre, FP8_GELU, NULL} : as_is(gw_p->a);
    fp8_must(dw_backward(cu, site_proj, gw_p, dprojb, dp, act, a8, c[0][2], &h.amax[2]), gw_p);
    const uint8_t *wf = copy_a(cu, gi_f, site_fc, CUDA_FP8_WEIGHT, a8, &c[1][1], &h.amax[4], as_is(gi_f->a));
    fp8_must(fp8_run(cu, gi_f, wf, c[1][1].inv, df.rows, df.inv, CUDA_FP8_WEIGHT, CUDA_FP8_GRAD), gi_f);
    fp8_must(dw_backward(cu, site_fc, gw_f, dfcb, df, as_is(gw_f->a), a8, c[1][2], &h.amax[5]), gw_f);
    return true;
}

cublasStatus_t cuda_fp8_mlp_forward(loom_cuda *cu, const cuda_gemm *gf, const cuda_gemm *gp, int site_fc,
                                    int site_proj) {
    LOOM_CHECK(gp->k == gf->m && gp->n == gf->n && gf->transa && !gf->transb && gp->transa && !gp->transb &&
               !gf->aux); // gp's B (N,OC) is gelu(gf's D), both products in the forward's layout
    bool aligned = (uintptr_t)gf->d % 16 == 0 && gf->ldd == gf->m; // D (N,OC) dense: the cast reads it
    if (!fp8_fits(cu, gf) || !fp8_fits(cu, gp) || !aligned) return CUBLAS_STATUS_NOT_SUPPORTED;
    size_t act_bytes = cuda_align256((size_t)(gf->m * gf->n)), fw_bytes = cuda_align256((size_t)(gf->m * gf->k));
    size_t in_bytes = cuda_align256((size_t)(gf->n * gf->k)), pw_bytes = cuda_align256((size_t)(gp->m * gp->k));
    char *base = (char *)cuda_scratch(cu, FP8_HEAD + act_bytes + fw_bytes + in_bytes + pw_bytes);
    fp8_head h = fp8_head_of(base);
    uint8_t *act8 = (uint8_t *)base + FP8_HEAD, *fw8 = act8 + act_bytes, *in8 = fw8 + fw_bytes, *pw8 = in8 + in_bytes;
    // [fc, fcproj][input, weight], the higher site's first: a site's first cast may move the slots
    // (to make room), which would leave pointers taken before it stale
    fp8_cast c[2][2];
    int high = site_proj > site_fc;
    for (int j = 0; j < 2; j++) {
        int layer = j == 0 ? high : !high, site = layer ? site_proj : site_fc;
        c[layer][0] = cuda_fp8_cast_at(cu, site, CUDA_FP8_INPUT, h.inv[2 * layer]);
        c[layer][1] = cuda_fp8_cast_at(cu, site, CUDA_FP8_WEIGHT, h.inv[2 * layer + 1]);
    }
    fp8_cast cact = c[1][0], cpw = c[1][1], cin = c[0][0], cfw = c[0][1];
    fp8_head_clear(cu, h, !cpw.scale || !cfw.scale || !cin.scale || !cact.scale);
    const uint8_t *fw = copy_a(cu, gf, site_fc, CUDA_FP8_WEIGHT, fw8, &cfw, &h.amax[1], as_is(gf->a));
    const uint8_t *in = copy_b(cu, gf, site_fc, CUDA_FP8_INPUT, in8, &cin, &h.amax[2], as_is(gf->b));
    // gelu(pre) in FP8 for the fcproj product, and transposed for its backward (kept by pre, whose
    // GELU it is; sized from the first step on): written by the fc product itself under delayed
    // scaling (gemm_fp8.cu), else by one cast that reads pre after it
    int64_t N = gf->n, OC = gf->m;
    float *inv = NULL;
    uint8_t *act_t = cuda_fp8_keep_cols(cu, site_proj, gf->d, N, OC, true, &inv);
    if (act_t && !cact.scale) cact.inv = inv; // the copy's own 1/s, which the backward takes with it
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (!act_t || !cuda_fp8_gelu_gemm(cu, gf, fw, cfw.inv, in, cin.inv, act8, act_t, cact)) {
        st = fp8_run(cu, gf, fw, cfw.inv, in, cin.inv, CUDA_FP8_WEIGHT, CUDA_FP8_INPUT);
        if (st == CUBLAS_STATUS_SUCCESS)
            quantize(cu, act8, act_t, cact, &h.amax[3], fp8_src{gf->d, FP8_GELU, NULL}, N, OC, false);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        const uint8_t *pw = copy_a(cu, gp, site_proj, CUDA_FP8_WEIGHT, pw8, &cpw, &h.amax[0], as_is(gp->a));
        st = fp8_run(cu, gp, pw, cpw.inv, act8, cact.inv, CUDA_FP8_WEIGHT, CUDA_FP8_INPUT);
    }
    if (st != CUBLAS_STATUS_SUCCESS) cuda_fp8_forget_cols(cu, gf->d); // the plain ops write pre again
    return st;
}
