// Private to the CUDA backend: the backend object, the check macros, device helpers shared by
// the kernels, and the ops that cuda_backend.cu puts in the loom_backend table (their
// contracts are in backend/backend.h). Every file here is CUDA C compiled by nvcc: plain
// structs and functions, one concept per file; C linkage for what the C side calls.
//
// dtypes: parameters, activations and their gradients are `be->dtype` (fp32 or bf16) and are
// read through ldx/stx below with a flag `bf` chosen once per launch; statistics, optimizer
// state and master weights are fp32; all arithmetic is fp32 (fp64 for sums of squares).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "backend/backend.h"
}

// ---- checks: CUDA and cuBLAS failures are device or programmer errors, not user input ----
// They print file:line, the error string and the call, then abort.
[[noreturn]] void cuda_check_failed(const char *what, const char *error, const char *call,
                                    const char *file, int line);
#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        cudaError_t cuda_e_ = (call);                                                      \
        if (cuda_e_ != cudaSuccess)                                                        \
            cuda_check_failed("CUDA", cudaGetErrorString(cuda_e_), #call, __FILE__, __LINE__); \
    } while (0)
#define CUBLAS_CHECK(call)                                                                 \
    do {                                                                                   \
        cublasStatus_t cublas_s_ = (call);                                                 \
        if (cublas_s_ != CUBLAS_STATUS_SUCCESS)                                            \
            cuda_check_failed("cuBLAS", cublasLtGetStatusString(cublas_s_), #call, __FILE__, \
                              __LINE__);                                                   \
    } while (0)

// ---- launches: programmatic dependent launch (Hopper; CUDA C++ Programming Guide, "Programmatic
// Dependent Launch and Synchronization") ----
// Every kernel of this backend is launched by cuda_launch, on `stream` with programmatic stream
// serialization, and begins with cuda_pdl_begin(): it lets the next kernel of the stream launch
// (`griddepcontrol.launch_dependents`), then waits until the grids before it in the stream have
// completed and their writes are visible (`griddepcontrol.wait`). So a kernel's blocks are placed
// on the SMs while the kernel before it finishes, and start at once when it has, where an ordinary
// launch begins only after it; nothing before the wait touches memory, and a kernel completes
// only after its wait, so the stream's order holds as before. The kernels of cuBLASLt and CUB, and
// the memsets and copies, are launched as usual and wait for all that came before them. ctest's
// cuda_pdl_first (tests/cuda/pdl_first.sh) fails when a kernel here begins otherwise.
__device__ __forceinline__ void cuda_pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
template <typename... P, typename... A>
static inline void cuda_launch(cudaStream_t stream, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                               A &&...args) {
    cudaLaunchAttribute pdl = {};
    pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {grid, block, smem, stream, &pdl, 1};
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<A &&>(args)...));
}

// ---- the backend object ----
typedef struct {
    loom_backend base;        // first member: a loom_backend * of this backend is a loom_cuda *
    int device;
    int sms;                  // multiprocessors (the persistent kernels' grid)
    char pci_bus_id[32];      // base.pci_bus_id's text (cudaDeviceGetPCIBusId)
    cudaStream_t stream;      // every op and copy runs on it, in order
    cublasLtHandle_t lt;
    void *workspace;          // cuBLASLt workspace
    size_t workspace_bytes;
    void *scratch;            // per-op temporaries, reused in stream order (cuda_scratch)
    size_t scratch_bytes;
    uint64_t scratch_moves;   // times scratch or partials' buffer was reallocated (a recorded graph holds its address)
    struct cuda_partials_buf *partials; // cuda_partials and the adds waiting (reduce.cu; NULL before the first)
    bool debug;               // LOOM_CUDA_DEBUG set: say on stderr when an op takes a fallback path
    struct cuda_block *blocks; // live allocations (uthash by pointer), for base.bytes_in_use
    struct lt_algo *algos;     // cuBLASLt algorithms by product shape (matmul.cu)
    struct cuda_fp8_slots *fp8; // FP8 delayed scaling's slots (fp8_scaling.cu; NULL before the first)
    struct cuda_fp8_kept *fp8_kept; // FP8 copies made ahead of their products (fp8_kept.cu; NULL before)
    const void *fp8_unread;    // an input no backward reads (an MLP's GELU output not kept): no copy kept
    struct cuda_host_block *host_blocks; // live host_alloc allocations, for base.host_bytes_in_use
    cudaStream_t copy_stream;  // copy_async's side stream (created at its first use), and its
    cudaEvent_t ops_done;      // events: the ops issued before a copy, and each copy's completion
    cudaEvent_t *copy_done;    // (CUDA_COPY_EVENTS) ring indexed by ticket
    uint64_t copies;           // tickets handed out
} loom_cuda;

enum { CUDA_COPY_EVENTS = 256 };

// Host memory and side-stream copies (host_copy.cu): the backend table's host_alloc, host_free,
// copy_async, copy_wait, and the release of their stream and events at destroy.
void *cuda_host_alloc(loom_backend *be, size_t bytes);
void cuda_host_free(loom_backend *be, void *p);
uint64_t cuda_copy_async(loom_backend *be, void *dst, const void *src, size_t bytes, bool to_host);
void cuda_copy_wait(loom_backend *be, uint64_t ticket);
void cuda_host_copy_destroy(loom_cuda *cu);

// CUDA graphs of the stream's ops (graph.cu): the backend table's graph_begin, graph_end,
// graph_launch and graph_free.
void cuda_graph_begin(loom_backend *be);
void *cuda_graph_end(loom_backend *be);
bool cuda_graph_launch(loom_backend *be, void *graph);
void cuda_graph_free(loom_backend *be, void *graph);

// Counts `bytes` more (or fewer, when negative) device memory in use.
static inline void cuda_account(loom_cuda *cu, long long bytes) {
    cu->base.bytes_in_use += (size_t)bytes;
    if (cu->base.bytes_in_use > cu->base.peak_bytes) cu->base.peak_bytes = cu->base.bytes_in_use;
}

static inline loom_cuda *cuda_of(loom_backend *be) { return (loom_cuda *)be; }

// *buf made at least `bytes` (a buffer of *have bytes, moved: in whole MiB, at least twice its
// size, after the stream's ops; counted in bytes in use and in scratch_moves)
void cuda_grow(loom_cuda *cu, void **buf, size_t *have, size_t bytes);
// A device buffer of at least `bytes` for the temporaries of one op (partial sums, index
// lists). Valid until the next call; ops on the stream after this one may reuse it.
void *cuda_scratch(loom_cuda *cu, size_t bytes);

// b rounded up to a multiple of 256: where the next of several buffers carved from one starts
static inline size_t cuda_align256(size_t b) { return (b + 255) & ~(size_t)255; }

// Blocks for a grid-stride loop over n elements.
static inline unsigned cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : (b > 32768 ? 32768 : b));
}

// Checks that t holds parameters/activations (be->dtype) and says whether they are bf16.
static inline bool cuda_act(const loom_backend *be, loom_tensor t) {
    LOOM_CHECK(t.dtype == be->dtype);
    return t.dtype == LOOM_BF16;
}
static inline float *cuda_f32(loom_tensor t) {
    LOOM_CHECK(t.dtype == LOOM_F32);
    return (float *)t.data;
}
static inline const int32_t *cuda_i32(loom_tensor t) {
    LOOM_CHECK(t.dtype == LOOM_I32);
    return (const int32_t *)t.data;
}

// ---- device helpers ----
// element i of a be->dtype array as fp32, and the store back (round to nearest even)
__device__ __forceinline__ float ldx(const void *p, int64_t i, bool bf) {
    return bf ? __bfloat162float(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}
__device__ __forceinline__ void stx(void *p, int64_t i, float x, bool bf) {
    if (bf)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
    else
        ((float *)p)[i] = x;
}
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
// The index of vocabulary entry v (a token or a target, >= 0) in a vocabulary shard of n
// entries from vocab_start (>= 0; the vocabulary-parallel ops), or -1 outside the shard.
__host__ __device__ __forceinline__ int cuda_shard_index(int v, int vocab_start, int64_t n) {
    int j = v - vocab_start;
    return (uint64_t)(int64_t)j < (uint64_t)n ? j : -1; // j < 0 wraps past n: one compare
}
#define GRID_STRIDE(i, n)                                                                  \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);            \
         i += (int64_t)gridDim.x * blockDim.x)

// ---- deterministic column sums (reduce.cu) ----
// Row chunks of an (N, n) array: partial sums over fixed row chunks, then the chunks' sums
// added in chunk order. The chunking depends only on N, so results repeat bit for bit.
int64_t cuda_row_chunk(int64_t N);
// Device memory for `bytes` of partial sums that cuda_add_partials_n then adds, kept until it has
// (not reused by the next op, as cuda_scratch is), so that the add may wait.
float *cuda_partials(loom_cuda *cu, size_t bytes);
// dst[i] += (add) or = (not add: the backend's grads_write) the sum over p of partials[p * stride + i]
// (fp32) in a fixed order; dst bf16 where dst_bf, else fp32
void cuda_add_partials(loom_cuda *cu, void *dst, bool dst_bf, bool add, const float *partials, int64_t nparts,
                       int64_t stride, int64_t n);
// The same over ndst * n columns, column i going to dst[i / n][i % n] (up to three sums of n
// values, e.g. the LayerNorm backward's dw, db and dinp column sums). Launched at once, or, while
// the backend's grads_defer is set and the partials are cuda_partials', at cuda_flush_partials (the
// backend's grads_flush) in one launch with the others waiting there: a layer's five bias and
// LayerNorm adds in one launch instead of five (an add goes first where a waiting one touches the
// same destination, or the launch's table is full).
void cuda_add_partials_n(loom_cuda *cu, void *const *dst, int ndst, bool dst_bf, bool add, const float *partials,
                         int64_t nparts, int64_t stride, int64_t n);
void cuda_flush_partials(loom_cuda *cu);
void cuda_partials_free(loom_cuda *cu); // at destroy
// dst (n) += (add) or = column sums of x (N rows of n columns, row stride ld elements) of dtype
// bf ? bf16 : fp32, deterministically
void cuda_column_sums(loom_cuda *cu, void *dst, const void *x, int64_t N, int64_t n, int64_t ld, bool bf, bool add);

// ---- cuBLASLt products (matmul.cu) ----
// D (m,n) = op(A) op(B) + beta C, column-major, leading dimensions in elements; A, B, C and D of
// the backend's dtype, or A and B in FP8 (scale_a set: fp8.cu), D = scale_a scale_b op(A) op(B)
// + beta C then. C is D (in place) unless c is set.
typedef struct {
    const void *a, *b;
    void *d;
    const void *c; // C at another address than D, with D's layout (a residual added at beta 1); NULL: C is D
    int64_t m, n, k, lda, ldb, ldd;
    bool transa, transb;
    float beta;
    cublasLtEpilogue_t epilogue;
    void *bias; // the BIAS epilogues' bias (m), dtype of D; NULL without
    void *aux;  // the GELU epilogues' pre-activation (m,n), leading dimension m; NULL without
    // FP8 operands: the dequantizing scales (fp32 scalars in device memory; NULL: not FP8), the
    // element types (CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2), cuBLASLt's fast accumulation
    const float *scale_a, *scale_b;
    cudaDataType_t type_a, type_b;
    bool fast_accum;
} cuda_gemm;
// Runs g and returns CUBLAS_STATUS_SUCCESS, or returns why cuBLASLt has no algorithm for it
// (nothing run). The heuristic's answer per shape, types and alignments is cached.
cublasStatus_t cuda_gemm_run(loom_cuda *cu, const cuda_gemm *g);
// Which operand of a linear layer a product's A or B is: its scaling slot under delayed scaling
// (backend.h's fp8_site), and its format: output gradients E5M2, the others E4M3.
typedef enum { CUDA_FP8_INPUT, CUDA_FP8_WEIGHT, CUDA_FP8_GRAD, CUDA_FP8_ROLES } cuda_fp8_role;
// g (of the backend's dtype, bf16, as matmul.cu builds it) computed from FP8 copies of A and B
// (fp8.cu: per-tensor scales, from the current amax or delayed), A being operand role_a (the
// weight or the input) and B operand role_b (the input, or the output gradient: E5M2, no fast
// accumulation; else fast accumulation). Returns CUBLAS_STATUS_NOT_SUPPORTED, running nothing,
// when g does not suit FP8 (m, n or k not a multiple of 16, a strided operand or one not
// 16-byte aligned), or cuBLASLt's failure.
cublasStatus_t cuda_fp8_gemm_run(loom_cuda *cu, const cuda_gemm *g, cuda_fp8_role role_a, cuda_fp8_role role_b);
// A linear layer's two gradient products from FP8 copies, dout (N,OC) cast once for both: gi the
// dinp product (B = dout as it is), gw the dw product (B = dout transposed), as matmul.cu builds
// them; dbias (OC) bf16 += the column sums of dout when not NULL and gw ran (summed in the cast's
// one read of dout, in a fixed order). *si and *sw: each product's status as cuda_fp8_gemm_run's
// (NOT_SUPPORTED for both, running nothing, when either does not suit FP8).
void cuda_fp8_backward(loom_cuda *cu, const cuda_gemm *gi, const cuda_gemm *gw, void *dbias, cublasStatus_t *si,
                       cublasStatus_t *sw);
// The MLP's backward from FP8 copies (backend.h's mlp_backward), the GELU folded into the casts:
// the fcproj layer's products gi_p (dfch (N,OC) = dout (N,C) projw, plain) and gw_p (dprojw += dout^T
// act, act's copy kept from the forward or, with act_pre, cast from gelu(act_pre)), then the fc
// layer's gi_f (dinp = dfch' fcw) and gw_f (dfcw += dfch'^T inp), where dfch' = dfch gelu'(pre) is
// the fc layer's output gradient, which exists only in its E5M2 copies: cast from dfch, or, under
// delayed scaling with the backend's fp8_fast_dgrad, written by gi_p's product itself
// (cuda_fp8_dgelu_gemm), so that dfch is never written. dprojb (C) and dfcb (OC) bf16 += the column
// sums of dout and dfch' when not NULL. Products as matmul.cu builds them; the fcproj layer's
// casts take the slots of site site_proj, the fc layer's those of site_fc. False, running nothing,
// when a product does not suit FP8 or pre or act_pre is not 16-byte aligned (the caller runs the
// plain ops); a product cuBLASLt then refuses stops the program with a line naming it.
bool cuda_fp8_mlp_backward(loom_cuda *cu, const cuda_gemm *gi_p, const cuda_gemm *gw_p, void *dprojb,
                           const void *act_pre, const cuda_gemm *gi_f, const cuda_gemm *gw_f, void *dfcb,
                           const void *pre, int site_fc, int site_proj);
// The MLP's two forward products from FP8 copies with the GELU's output handed over in FP8
// (either recipe): gf the fc product (no GELU epilogue: D (N,OC) is pre, bf16), gp the fcproj
// product, whose B (the GELU's output, bf16) is neither written nor read. gelu(pre) is written as
// E4M3 by the fcproj layer's input scale, rows for gp and the transpose kept for the fcproj layer's
// backward (cuda_fp8_keep_cols, by pre: its dw product takes it instead of casting gelu(pre)
// again), raising that input slot's amax: under delayed scaling by the fc product itself
// (cuda_fp8_gelu_gemm), else by one cast that reads pre after cuBLASLt's product. cuBLASLt's GELU
// epilogue with an FP8 D took 116 us for gpt2's fc product at B=16 on an H200, the product with
// the bias alone 72 (the cast then 58, where the epilogue's output needed a transpose, 29). The
// fc layer's casts take the slots of site site_fc, the fcproj layer's those of site_proj.
// NOT_SUPPORTED, running nothing, when a product does not suit FP8 or pre is not dense and 16-byte
// aligned; another failure of cuBLASLt's is returned as it is, pre then maybe written and the
// copy forgotten (the caller runs the plain ops).
cublasStatus_t cuda_fp8_mlp_forward(loom_cuda *cu, const cuda_gemm *gf, const cuda_gemm *gp, int site_fc,
                                    int site_proj);

// ---- FP8 delayed scaling's slots (fp8_scaling.cu) ----
#define CUDA_FP8_E4M3_MAX 448.0f   // the largest finite E4M3 (inputs, weights)
#define CUDA_FP8_E5M2_MAX 57344.0f // and E5M2 (output gradients)
// How a cast scales: by *scale (delayed; inv holds 1/s) or by its current amax (scale NULL: the
// amax pass first, 1/s written to inv), and the slot amax it raises (NULL: none)
typedef struct {
    const float *scale;
    float *inv;
    unsigned *record;
} fp8_cast;
// Where cuda_fp8_dgelu_gemm writes y = dfch gelu'(pre) (M,N): rows (M,N) and cols (N,M) E5M2 by
// c.scale, c.record raised to max |y|; colpart (M/128, N) fp32 y's column sums over each 128 rows
typedef struct {
    uint8_t *rows, *cols;
    float *colpart;
    fp8_cast c;
} cuda_fp8_dgelu_out;
// The fcproj layer's input-gradient product dfch (M,N) = bf16(inv_a inv_b a8 b8^T), a8 (M,K) dout
// (E5M2), b8 (N,K) projw transposed (E4M3), with fast accumulation, times gelu'(pre) (M,N) bf16,
// into out's copies (gemm_fp8.cu): the bytes cuBLASLt's product and fp8.cu's DGELU cast write,
// dfch neither written nor read. False, running nothing, without delayed scaling's scale
// (out.c.scale), with M, N or K not a multiple of 128 (gpt2-xl's C = 1600), or an operand not
// 16-byte aligned.
bool cuda_fp8_dgelu_gemm(loom_cuda *cu, const uint8_t *a8, const float *inv_a, const uint8_t *b8, const float *inv_b,
                         const void *pre, int64_t M, int64_t N, int64_t K, cuda_fp8_dgelu_out out);
// The fc product of cuda_fp8_mlp_forward with the GELU output's cast in its epilogue (gemm_fp8.cu),
// under delayed scaling (c.scale: the fcproj layer's input cast): g as matmul.cu builds the forward
// product (D^T = pre (N,OC) bf16 = in (N,C) w^T + bias (OC), BIAS epilogue or none, no C, beta 0,
// dense D), w8 (OC,C) and in8 (N,C) its E4M3 copies with their 1/s; writes pre, rows (N,OC) =
// fp8(gelu(pre) s) and cols (OC,N) its transpose, raising c.record to max |gelu(pre)|: the bytes
// cuBLASLt's product with fast accumulation and fp8.cu's cast of gelu(pre) write. False, running
// nothing, without delayed scaling's scale, for another epilogue or a C, with N, OC or C not a
// multiple of 128 (gpt2-xl's C = 1600) or C above 1024 (gpt2-large's 1280: there cuBLASLt's product
// and the cast are faster), or an operand not 16-byte aligned.
bool cuda_fp8_gelu_gemm(loom_cuda *cu, const cuda_gemm *g, const uint8_t *w8, const float *inv_w, const uint8_t *in8,
                        const float *inv_in, uint8_t *rows, uint8_t *cols, fp8_cast c);
// The cast of operand `role` of the current site (be->fp8_site) under delayed scaling: from the
// slot's history once it has one, else by the current amax with 1/s into `inv` (and the slot's
// amax raised either way); without delayed scaling or a site, by the current amax alone.
fp8_cast cuda_fp8_cast_of(loom_cuda *cu, cuda_fp8_role role, float *inv);
// The same for operand `role` of site `site`.
fp8_cast cuda_fp8_cast_at(loom_cuda *cu, int site, cuda_fp8_role role, float *inv);
// The slot of operand `role` of site `site` under delayed scaling, with or without a history: where
// its scale, 1/scale and amax are (the scale meaningful once it has a history). Makes room for
// the slot (which moves the slots only when the site is a new highest one); counts no cast.
fp8_cast cuda_fp8_slot_of(loom_cuda *cu, int site, cuda_fp8_role role);
// Whether operand `role` of site `site` has a history under delayed scaling (its casts scale by it).
bool cuda_fp8_ready(const loom_cuda *cu, int site, cuda_fp8_role role);
// Frees delayed scaling's slots (at destroy).
void cuda_fp8_free(loom_cuda *cu);

// ---- FP8 copies made ahead of their products (fp8_kept.cu): a LayerNorm's of its output
// (backend.h's fp8_site_ln), a step's of its weights (fp8_weights) ----
// Where a LayerNorm writes the E4M3 copy of its output (N,C): rows (N,C), fp8(y s) of each bf16
// output y with s = *scale, raising *record to the largest |y| (fp32 bits); rows NULL: none; cols
// (C,N) where the rows copy is to be transposed for the layer's backward (cuda_fp8_transpose;
// NULL: none).
typedef struct {
    uint8_t *rows, *cols;
    const float *scale;
    unsigned *record;
    bool copy_only; // the bf16 output is not to be written (backend.h's fp8_ln_copy_only)
} cuda_fp8_ln_out;
// Called by every LayerNorm op about to write out (N,C): forgets the copy, then, under delayed
// scaling with the input slot of the layer named by fp8_site_ln ready and `fits` (the LayerNorm
// can write the copy at this shape), where to write the new one (kept as that layer's input's
// until the next LayerNorm op). Rows NULL when none is to be made, also when the device has no
// memory to spare for it.
cuda_fp8_ln_out cuda_fp8_kept_begin(loom_cuda *cu, const void *out, int64_t N, int64_t C, bool fits);
// Stops the program with a line naming `what` (a product) when x is the LayerNorm output that the
// last LayerNorm op left unwritten, its FP8 copy alone written (fp8_ln_copy_only).
void cuda_fp8_ln_unwritten(const loom_cuda *cu, const void *x, const char *what);
// The rows copy of site's input x (numel elements, bf16) that its LayerNorm made; NULL when x is
// not what the last LayerNorm op wrote with a copy for that site.
const uint8_t *cuda_fp8_kept_input(const loom_cuda *cu, int site, const void *x, int64_t numel);
// Where the forward writes the transposed E4M3 copy (C,N) of site's input x (N,C) bf16 (of gelu(x)
// with gelu), by the layer's input scale, for its backward's weight-gradient product: kept until x
// is written anew (this called for x again, or a LayerNorm op), in a buffer of x's address; *inv
// (when not NULL) where a cast by the current amax (the tensorwise recipe) writes the copy's 1/s.
// NULL when none is to be made: x is fp8_unread, under delayed scaling the slot without a history
// yet (the buffer is sized then all the same, so that a recorded step does not allocate), N or C
// not a multiple of 16, or no memory to spare.
uint8_t *cuda_fp8_keep_cols(loom_cuda *cu, int site, const void *x, int64_t N, int64_t C, bool gelu, float **inv);
// The transposed copy of site's input x (numel elements; of gelu(x) with gelu) kept for it, with
// *inv its own 1/s by the current amax (NULL under delayed scaling: the slot's); NULL when there
// is none.
const uint8_t *cuda_fp8_kept_cols(const loom_cuda *cu, int site, const void *x, int64_t numel, bool gelu,
                                  float **inv);
// Forgets the transposed copy of x (one that was to be made and was not).
void cuda_fp8_forget_cols(loom_cuda *cu, const void *x);
// Forgets every copy that stands for a tensor in [p, p + bytes), memory being freed: a tensor
// allocated there later is another, whatever its address (copies are told by address).
void cuda_fp8_kept_freed(loom_cuda *cu, const void *p, size_t bytes);
// Stops the program when x's transposed copy was promised to a caller for site's backward
// (input_kept answered true) and a product is about to read x instead (what: which one).
void cuda_fp8_unpromised(const loom_cuda *cu, const void *x, int site, const char *what);
// Frees the transposed copies' buffers that no cuda_fp8_keep_cols asked for since the last call
// (the tensors moved or are gone); at fp8_begin, except while a graph is being recorded.
void cuda_fp8_kept_collect(loom_cuda *cu);
// The copies a step's weights have (cuda_fp8_weights): of site's weight w (numel elements, bf16),
// its rows (OC,C) or with cols its transpose (C,OC), with *inv where its 1/s is when it is scaled
// by its current amax (NULL: by its slot's, delayed scaling); NULL when w has none this step.
const uint8_t *cuda_fp8_kept_weight(const loom_cuda *cu, int site, const void *w, int64_t numel, bool cols,
                                    float **inv);
// The weights' copies are stale from here on (fp8_roll: the optimizer may change the weights).
void cuda_fp8_weights_end(loom_cuda *cu);
// Frees the copies (at destroy).
void cuda_fp8_kept_free(loom_cuda *cu);

// A weight the grouped cast converts (cuda_fp8_cast_group): src (R,K) bf16 into rows (R,K) and
// cols (K,R) E4M3 by *scale with *record raised to its amax (delayed scaling), or with scale NULL
// by FMAX / *amax (its current amax, fp32 bits, from the amax pass) with 1/s into *inv; its tiles
// are blocks [first, first + tiles) of the launch, tiles_k of them along K
typedef struct {
    const void *src;
    uint8_t *rows, *cols;
    int R, K;
    const float *scale;
    unsigned *record;
    unsigned *amax;
    float *inv;
    int first, tiles_k;
} cuda_fp8_group;
// The tiles a weight (R,K) takes in the grouped cast, and how many of them lie along K.
int cuda_fp8_group_tiles(int R, int K, int *tiles_k);
// cols (K,R) = rows (R,K) transposed, FP8 bytes (R and K multiples of 16, 16-byte aligned): one
// read and one write of R K bytes.
void cuda_fp8_transpose(loom_cuda *cu, uint8_t *cols, const uint8_t *rows, int64_t R, int64_t K);
// One launch of `blocks` blocks converting the n weights of g (device memory, each weight's first
// tile following the last one's, R and K multiples of 16, 16-byte aligned) as quantize_kernel does
// (fp8.cu): the same bytes and amax as their casts one at a time. With current (their scales from
// their current amaxes; each *amax zeroed before) an amax pass over all of them first, another
// launch.
void cuda_fp8_cast_group(loom_cuda *cu, const cuda_fp8_group *g, int n, int blocks, bool current);

// Frees matmul.cu's cache of cuBLASLt algorithms (at destroy).
void cuda_matmul_free_cache(loom_cuda *cu);

// ---- the ops (one file each) ----
extern "C" {
void cuda_encoder_forward(loom_backend *be, loom_tensor out, loom_tensor tokens, loom_tensor wte,
                          loom_tensor wpe, int vocab_start);
void cuda_encoder_backward(loom_backend *be, loom_tensor dwte, loom_tensor dwpe, loom_tensor dout,
                           loom_tensor tokens, int vocab_start);
void cuda_layernorm_forward(loom_backend *be, loom_tensor out, loom_tensor mean, loom_tensor rstd,
                            loom_tensor inp, loom_tensor w, loom_tensor b);
void cuda_layernorm_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor db, loom_tensor dsum,
                             loom_tensor dout, loom_tensor inp, loom_tensor w, loom_tensor mean,
                             loom_tensor rstd);
void cuda_matmul_forward(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w,
                         loom_tensor bias);
void cuda_matmul_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor dbias,
                          loom_tensor dout, loom_tensor inp, loom_tensor w);
void cuda_attention_forward(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor q, loom_tensor kv,
                            int NH, loom_attn_span span);
void cuda_attention_backward(loom_backend *be, loom_tensor dq, loom_tensor dkv, loom_tensor dbias, loom_tensor dout,
                             loom_tensor q, loom_tensor kv, loom_tensor out, loom_tensor lse, int NH,
                             loom_attn_span span);
void cuda_attention_merge(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor out_part,
                          loom_tensor lse_part, int NH);
void cuda_gelu_forward(loom_backend *be, loom_tensor out, loom_tensor inp);
void cuda_gelu_backward(loom_backend *be, loom_tensor dinp, loom_tensor inp, loom_tensor dout);
void cuda_residual_forward(loom_backend *be, loom_tensor out, loom_tensor a, loom_tensor b);
void cuda_matmul_residual_forward(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w,
                                  loom_tensor bias, loom_tensor res);
void cuda_matmul_gelu_forward(loom_backend *be, loom_tensor out, loom_tensor pre, loom_tensor inp,
                              loom_tensor w, loom_tensor bias);
void cuda_matmul_gelu_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor dbias,
                               loom_tensor dout, loom_tensor inp, loom_tensor w, loom_tensor pre);
void cuda_mlp_forward(loom_backend *be, loom_tensor out, loom_tensor pre, loom_tensor act, bool act_kept,
                      loom_tensor inp, loom_tensor fcw, loom_tensor fcb, loom_tensor projw, loom_tensor projb,
                      loom_tensor res);
void cuda_mlp_backward(loom_backend *be, loom_tensor dinp, loom_tensor dfch, loom_tensor dfcw, loom_tensor dfcb,
                       loom_tensor dprojw, loom_tensor dprojb, loom_tensor dout, loom_tensor inp, loom_tensor fcw,
                       loom_tensor pre, loom_tensor act, bool act_kept, loom_tensor projw);
void cuda_residual_layernorm_forward(loom_backend *be, loom_tensor res, loom_tensor out,
                                     loom_tensor mean, loom_tensor rstd, loom_tensor a, loom_tensor b,
                                     loom_tensor w, loom_tensor bias);
void cuda_softmax_crossentropy(loom_backend *be, loom_tensor losses, loom_tensor logits,
                               loom_tensor targets, int V, float dloss, bool backward);
void cuda_crossentropy_partial(loom_backend *be, loom_tensor partial, loom_tensor logits,
                               loom_tensor targets, int vocab_start, int V);
void cuda_crossentropy_combine(loom_backend *be, loom_tensor losses, loom_tensor lse,
                               loom_tensor partials);
void cuda_crossentropy_backward(loom_backend *be, loom_tensor logits, loom_tensor lse,
                                loom_tensor targets, int vocab_start, int V, float dloss);
void cuda_adamw_update(loom_backend *be, loom_tensor param, loom_tensor master, loom_tensor grad,
                       loom_tensor m, loom_tensor v, loom_adamw_args args);
void cuda_step_scalars(loom_backend *be, loom_step_scalars *sc, loom_tensor losses, float max_norm);
double cuda_sumsq(loom_backend *be, loom_tensor x);
void cuda_sumsq_add(loom_backend *be, double *acc, loom_tensor x);
void cuda_fp8_begin(loom_backend *be);
void cuda_fp8_weights(loom_backend *be, const loom_tensor *w, const int *sites, int n);
bool cuda_input_kept(loom_backend *be, loom_tensor x, int site);
float *cuda_fp8_amax(loom_backend *be, size_t *n);
void cuda_fp8_roll(loom_backend *be);
size_t cuda_fp8_save(loom_backend *be, float *out);
loom_status cuda_fp8_load(loom_backend *be, const float *state, size_t n);
}
