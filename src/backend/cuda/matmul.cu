// Linear layer out = inp w^T + bias (w (OC,C) as torch.nn.Linear) through cuBLASLt, as llm.c's
// matmul_cublaslt: bf16 (or fp32) operands, fp32 accumulation (CUBLAS_COMPUTE_32F: in fp32 mode
// no TF32, so results match the CPU's sgemm to rounding). cuBLAS is column-major, so a
// row-major (R, K) array is handed over as the column-major (K, R) array it is in memory:
//   forward  out^T (OC,N)  = w^T[C,OC]^T * inp^T (C,N)          + bias   (BIAS epilogue)
//   dinp     dinp^T (C,N)  = w^T (C,OC) * dout^T (OC,N)
//   dw       dw^T (C,OC)  += inp^T (C,N) * (dout^T (OC,N))^T             (beta = 1; 0: grads_write)
//   dbias (OC) += (or =) column sums of dout (reduce.cu: deterministic; cuBLASLt's BGRADB epilogue ran
//                 as a kernel of its own after the product anyway, and a slower one: for gpt2's
//                 fc layer at B=16 T=1024 on an H100 46 us, against 38 us for ours)
// The MLP's GELU rides on epilogues in bf16 (as llm.c's gelu_fusion): GELU_AUX_BIAS writes
// gelu(inp w^T + bias) and keeps the pre-activation as the aux matrix; DGELU multiplies the
// dinp product by gelu'(pre) read from the aux matrix. In fp32 (the debugging mode, compared
// with the CPU to 1e-5) and where cuBLASLt has no algorithm, the separate GELU kernels run.
// Under precision "fp8" each product goes to fp8.cu first, which computes it from FP8 copies of
// its operands when it suits FP8, and runs here in bf16 otherwise; a layer's dinp and dw products
// share one cast of dout, and the DGELU product stays in bf16 (matmul_dinp says why).
// The heuristic's algorithm for a product's shapes, types, epilogue and pointer alignments is asked
// once and cached (a uthash table in the backend), since asking costs tens of microseconds of
// host time per call. With be->gemm_autotune the first product of each such key times the
// heuristic's first LT_TUNE_CANDIDATES candidates on its own operands instead (lt_tune) and
// caches the fastest, as PyTorch's max-autotune and cuDNN's benchmark mode choose.
#include "backend/cuda/cuda_ops.h"

#include <uthash.h>

typedef struct { // what the heuristic's answer depends on (no padding: hashed as bytes)
    int64_t m, n, k, lda, ldb, ldd;
    int32_t transa, transb, epilogue, dtype, type_a, type_b, fast_accum;
    uint32_t align_a, align_b, align_d, align_aux, align_c;
} lt_key;
static_assert(sizeof(lt_key) == 6 * 8 + 7 * 4 + 5 * 4, "lt_key is hashed as bytes: no padding");

#define LT_TUNE_CANDIDATES 8 // the heuristic's candidates lt_tune times
#define LT_TUNE_REPS 5       // timed runs of each, after one untimed
#define LT_TUNE_MARGIN 0.98f // another candidate replaces the heuristic's first only below this share of its time

struct lt_algo { // one cached heuristic answer
    lt_key key;
    cublasStatus_t status; // CUBLAS_STATUS_SUCCESS, or why there is no algorithm
    cublasLtMatmulAlgo_t algo;
    UT_hash_handle hh;
};

void cuda_matmul_free_cache(loom_cuda *cu) {
    lt_algo *a, *tmp;
    HASH_ITER(hh, cu->algos, a, tmp) {
        HASH_DEL(cu->algos, a);
        free(a);
    }
}

static uint32_t lt_alignment(const void *p) { // largest power of two <= 256 dividing p
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a /= 2;
    return a;
}

static void lt_set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                        const void *value, size_t size) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, value, size));
}

static void lt_set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                        uint32_t value) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value));
}

// Milliseconds a run of algo takes on the product's own operands (the mean of LT_TUNE_REPS after one
// untimed), writing D to `scratch` (C is read where beta is not 0, and an aux output is written
// with the values the product will write); a negative value where cuBLASLt refuses the algorithm.
static float lt_time(loom_cuda *cu, cublasLtMatmulDesc_t desc, const cuda_gemm *g, const void *c, void *scratch,
                     cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                     cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo, cudaEvent_t e0, cudaEvent_t e1) {
    float alpha = 1.0f, ms = 0.0f;
    for (int r = 0; r <= LT_TUNE_REPS; r++) {
        if (r == 1) CUDA_CHECK(cudaEventRecord(e0, cu->stream));
        if (cublasLtMatmul(cu->lt, desc, &alpha, g->a, la, g->b, lb, &g->beta, c, lc, scratch, ld, algo, cu->workspace,
                           cu->workspace_bytes, cu->stream) != CUBLAS_STATUS_SUCCESS)
            return -1.0f;
    }
    CUDA_CHECK(cudaEventRecord(e1, cu->stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / LT_TUNE_REPS;
}

// The fastest of the heuristic's first n candidates (cand[0] unless another takes under
// LT_TUNE_MARGIN of its time), timed on a scratch D of `dbytes` (backend memory, so it counts in
// the peak). cand[0] while the stream is being recorded into a graph (a recording cannot wait on
// events) or where the scratch does not fit.
static cublasLtMatmulAlgo_t lt_tune(loom_cuda *cu, cublasLtMatmulDesc_t desc, const cuda_gemm *g, const void *c,
                                    size_t dbytes, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                    cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                    const cublasLtMatmulHeuristicResult_t *cand, int n) {
    cudaStreamCaptureStatus capturing;
    CUDA_CHECK(cudaStreamIsCapturing(cu->stream, &capturing));
    void *scratch = capturing == cudaStreamCaptureStatusNone ? cu->base.alloc(&cu->base, dbytes) : NULL;
    if (!scratch) return cand[0].algo;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    int best = 0;
    float first = lt_time(cu, desc, g, c, scratch, la, lb, lc, ld, &cand[0].algo, e0, e1), best_t = first;
    for (int i = 1; i < n && first > 0.0f; i++) {
        float t = cand[i].state == CUBLAS_STATUS_SUCCESS
                      ? lt_time(cu, desc, g, c, scratch, la, lb, lc, ld, &cand[i].algo, e0, e1)
                      : -1.0f;
        if (t > 0.0f && t < best_t && t < LT_TUNE_MARGIN * first) best = i, best_t = t;
    }
    if (cu->debug)
        fprintf(stderr, "loom: cuda: tuned %lldx%lldx%lld (epilogue %d): candidate %d of %d, %.1f us (the heuristic's first %.1f)\n",
                (long long)g->m, (long long)g->n, (long long)g->k, (int)g->epilogue, best, n, best_t * 1e3f, first * 1e3f);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    cu->base.free(&cu->base, scratch);
    return cand[best].algo;
}

// The heuristic's failure is NOT_SUPPORTED, or INVALID_VALUE for an epilogue it does not take
// with these types.
cublasStatus_t cuda_gemm_run(loom_cuda *cu, const cuda_gemm *g) {
    cudaDataType_t type = cu->base.dtype == LOOM_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType_t type_a = g->scale_a ? g->type_a : type, type_b = g->scale_a ? g->type_b : type;
    const void *c = g->c ? g->c : g->d;
    int8_t fast = g->scale_a && g->fast_accum;
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = g->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    lt_set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    lt_set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g->epilogue, sizeof g->epilogue);
    if (g->bias) lt_set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias);
    if (g->aux) {
        lt_set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux, sizeof g->aux);
        lt_set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g->m, sizeof g->m);
    }
    if (g->scale_a) { // FP8: the scales, and the bias and aux in D's type (not the inputs')
        lt_set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->scale_a, sizeof g->scale_a);
        lt_set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->scale_b, sizeof g->scale_b);
        lt_set_desc(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
        if (g->bias) lt_set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type);
        if (g->aux) lt_set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &type, sizeof type);
    }
    cublasLtMatrixLayout_t la, lb, lc, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, type_a, g->transa ? g->k : g->m, g->transa ? g->m : g->k, g->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, type_b, g->transb ? g->n : g->k, g->transb ? g->k : g->n, g->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, type, g->m, g->n, g->ldd));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, type, g->m, g->n, g->ldd));
    lt_key key = {g->m, g->n, g->k, g->lda, g->ldb, g->ldd, g->transa, g->transb, (int32_t)g->epilogue,
                  (int32_t)type, (int32_t)type_a, (int32_t)type_b, fast,
                  lt_alignment(g->a), lt_alignment(g->b), lt_alignment(g->d), g->aux ? lt_alignment(g->aux) : 0,
                  lt_alignment(c)};
    lt_algo *hit;
    HASH_FIND(hh, cu->algos, &key, sizeof key, hit);
    if (!hit) {
        hit = (lt_algo *)loom_xcalloc(1, sizeof *hit);
        hit->key = key;
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = cu->workspace_bytes;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        lt_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
        lt_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
        lt_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
        lt_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d);
        cublasLtMatmulHeuristicResult_t heur[LT_TUNE_CANDIDATES] = {};
        int found = 0, ask = cu->base.gemm_autotune ? LT_TUNE_CANDIDATES : 1;
        hit->status = cublasLtMatmulAlgoGetHeuristic(cu->lt, desc, la, lb, lc, ld, pref, ask, heur, &found);
        if (hit->status == CUBLAS_STATUS_SUCCESS && (found == 0 || heur[0].state != CUBLAS_STATUS_SUCCESS))
            hit->status = CUBLAS_STATUS_NOT_SUPPORTED;
        hit->algo = heur[0].algo;
        if (hit->status == CUBLAS_STATUS_SUCCESS && found > 1) {
            size_t dbytes = (size_t)g->ldd * g->n * (type == CUDA_R_32F ? 4 : 2);
            hit->algo = lt_tune(cu, desc, g, c, dbytes, la, lb, lc, ld, heur, found);
        }
        CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
        HASH_ADD(hh, cu->algos, key, sizeof key, hit);
    }
    cublasStatus_t st = hit->status;
    if (st == CUBLAS_STATUS_SUCCESS) {
        float alpha = 1.0f;
        CUBLAS_CHECK(cublasLtMatmul(cu->lt, desc, &alpha, g->a, la, g->b, lb, &g->beta, c, lc, g->d, ld,
                                    &hit->algo, cu->workspace, cu->workspace_bytes, cu->stream));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lc));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    if (st != CUBLAS_STATUS_SUCCESS && cu->debug)
        fprintf(stderr, "loom: cuda: no cuBLASLt algorithm for %lldx%lldx%lld%s (epilogue %d): %s\n",
                (long long)g->m, (long long)g->n, (long long)g->k, g->scale_a ? " fp8" : "", (int)g->epilogue,
                cublasLtGetStatusString(st));
    return st;
}

// D (m,n) = op(A) op(B) + beta D of the backend's dtype on dense operands (the leading dimensions
// follow from the shapes), without an epilogue
static cuda_gemm dense_gemm(const void *a, const void *b, void *d, int64_t m, int64_t n, int64_t k, bool transa,
                            bool transb, float beta) {
    cuda_gemm g = {};
    g.a = a, g.b = b, g.d = d, g.m = m, g.n = n, g.k = k;
    g.lda = transa ? k : m, g.ldb = transb ? n : k, g.ldd = m;
    g.transa = transa, g.transb = transb, g.beta = beta, g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    return g;
}

// g in FP8 while the backend's fp8 is set and g suits FP8 (fp8.cu), else as given; a and b: the
// layer's operands that A and B are
static cublasStatus_t product(loom_cuda *cu, const cuda_gemm *g, cuda_fp8_role a, cuda_fp8_role b) {
    if (cu->base.fp8 && cuda_fp8_gemm_run(cu, g, a, b) == CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_SUCCESS;
    cuda_fp8_ln_unwritten(cu, g->b, "bf16 product");
    return cuda_gemm_run(cu, g);
}

static void must_product(loom_cuda *cu, const cuda_gemm *g, cuda_fp8_role a, cuda_fp8_role b) {
    cublasStatus_t st = product(cu, g, a, b);
    if (st == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "loom: cuBLASLt has no algorithm for a %lldx%lldx%lld %s matmul: %s\n",
            (long long)g->m, (long long)g->n, (long long)g->k, loom_dtype_name(cu->base.dtype),
            cublasLtGetStatusString(st));
    abort();
}

// out (N, OC) += bias (OC) broadcast over rows: the fallback when the BIAS epilogue has no
// algorithm (e.g. a bias at an odd address)
__global__ void add_bias_kernel(void *out, const void *bias, int64_t N, int64_t OC, bool bf) {
    cuda_pdl_begin();
    GRID_STRIDE(i, N * OC) stx(out, i, ldx(out, i, bf) + ldx(bias, i % OC, bf), bf);
}

// A linear layer's forward operands checked: out (N,OC), inp (N,C), w (OC,C), bias (OC) or none,
// of one activation dtype; returns whether it is bf16
static bool check_forward(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w, loom_tensor bias) {
    bool bf = cuda_act(be, inp);
    int64_t N = loom_rows(&inp), C = loom_cols(&inp), OC = loom_rows(&w);
    LOOM_CHECK(N > 0 && C > 0 && OC > 0 && cuda_act(be, w) == bf && cuda_act(be, out) == bf);
    LOOM_CHECK(loom_cols(&w) == C && loom_rows(&out) == N && loom_cols(&out) == OC);
    if (bias.data) LOOM_CHECK(cuda_act(be, bias) == bf && loom_numel(&bias) == OC);
    return bf;
}

// A residual added to a linear layer's output out: none (res.data NULL), or a separate buffer of
// out's shape and dtype (bf: whether it is bf16)
static void check_residual(loom_backend *be, loom_tensor out, loom_tensor res, bool bf) {
    if (res.data) LOOM_CHECK(res.data != out.data && cuda_act(be, res) == bf && loom_numel(&res) == loom_numel(&out));
}

// The forward product out^T (OC,N) = w (OC,C) . inp (N,C) with the bias epilogue (none without a
// bias), + res (N,OC) as C at beta 1 when res.data
static cuda_gemm forward_gemm(loom_tensor out, loom_tensor inp, loom_tensor w, loom_tensor bias, loom_tensor res) {
    cuda_gemm g = dense_gemm(w.data, inp.data, out.data, loom_rows(&w), loom_rows(&inp), loom_cols(&inp), true, false,
                             res.data ? 1.0f : 0.0f);
    g.epilogue = bias.data ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = bias.data;
    g.c = res.data;
    return g;
}

// The same with the GELU in the epilogue: out = gelu(pre), pre (the product + bias) kept as the aux
static cuda_gemm gelu_gemm(loom_tensor out, loom_tensor pre, loom_tensor inp, loom_tensor w, loom_tensor bias) {
    cuda_gemm g = forward_gemm(out, inp, w, bias, loom_tensor{});
    g.epilogue = bias.data ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    g.aux = pre.data;
    return g;
}

// out = inp w^T + bias (+ res when res.data, a separate buffer of out's shape): one product, or
// where cuBLASLt has no algorithm with the bias or C, the product and the adds as kernels of their own
static void linear_forward(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w, loom_tensor bias,
                           loom_tensor res) {
    loom_cuda *cu = cuda_of(be);
    bool bf = check_forward(be, out, inp, w, bias);
    int64_t N = loom_rows(&out), OC = loom_cols(&out);
    check_residual(be, out, res, bf);
    cuda_gemm g = forward_gemm(out, inp, w, bias, res);
    if (product(cu, &g, CUDA_FP8_WEIGHT, CUDA_FP8_INPUT) == CUBLAS_STATUS_SUCCESS) return;
    if (res.data) {
        linear_forward(be, out, inp, w, bias, loom_tensor{});
        cuda_residual_forward(be, out, res, out);
        return;
    }
    LOOM_CHECK(bias.data); // no algorithm even without an epilogue
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = NULL;
    must_product(cu, &g, CUDA_FP8_WEIGHT, CUDA_FP8_INPUT);
    cuda_launch(cu->stream, add_bias_kernel, cuda_blocks(N * OC, 256), 256, 0, out.data, bias.data, N, OC, bf);
}

extern "C" void cuda_matmul_forward(loom_backend *be, loom_tensor out, loom_tensor inp,
                                    loom_tensor w, loom_tensor bias) {
    linear_forward(be, out, inp, w, bias, loom_tensor{});
}

extern "C" void cuda_matmul_residual_forward(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w,
                                             loom_tensor bias, loom_tensor res) {
    LOOM_CHECK(res.data);
    linear_forward(be, out, inp, w, bias, res);
}

extern "C" void cuda_matmul_gelu_forward(loom_backend *be, loom_tensor out, loom_tensor pre,
                                         loom_tensor inp, loom_tensor w, loom_tensor bias) {
    bool bf = check_forward(be, pre, inp, w, bias);
    LOOM_CHECK(cuda_act(be, out) == bf && loom_rows(&out) == loom_rows(&pre) && loom_cols(&out) == loom_cols(&pre));
    cuda_gemm g = gelu_gemm(out, pre, inp, w, bias);
    if (bf && product(cuda_of(be), &g, CUDA_FP8_WEIGHT, CUDA_FP8_INPUT) == CUBLAS_STATUS_SUCCESS) return;
    cuda_matmul_forward(be, pre, inp, w, bias);
    cuda_gelu_forward(be, out, pre);
}

// Under precision fp8 with act not kept (--recompute gelu: the backward recomputes or skips it),
// the fc product writes pre alone and one cast of gelu(pre) makes the fcproj product's FP8 input
// and its kept transpose (cuda_fp8_mlp_forward): act is never written. Otherwise, or where that
// declines, the two plain ops, the fcproj product keeping no transposed copy of an act not kept
// (fp8_unread: its backward casts gelu(pre)).
extern "C" void cuda_mlp_forward(loom_backend *be, loom_tensor out, loom_tensor pre, loom_tensor act, bool act_kept,
                                 loom_tensor inp, loom_tensor fcw, loom_tensor fcb, loom_tensor projw,
                                 loom_tensor projb, loom_tensor res) {
    loom_cuda *cu = cuda_of(be);
    if (be->fp8 && !act_kept) { // (fp8: a bf16 backend)
        check_forward(be, pre, inp, fcw, fcb);
        check_residual(be, out, res, check_forward(be, out, act, projw, projb));
        cuda_gemm gf = forward_gemm(pre, inp, fcw, fcb, loom_tensor{}), gp = forward_gemm(out, act, projw, projb, res);
        if (cuda_fp8_mlp_forward(cu, &gf, &gp, be->fp8_site_fc, be->fp8_site) == CUBLAS_STATUS_SUCCESS) return;
    }
    cu->fp8_unread = act_kept ? NULL : act.data; // act not kept: its backward casts gelu(pre)
    loom_mlp_forward_ops(be, out, pre, act, act_kept, inp, fcw, fcb, projw, projb, res);
    cu->fp8_unread = NULL;
}

// The dinp product dinp (N,C) = dout (N,OC) @ w (OC,C) and the dw product dw (OC,C) += dout^T inp
static cuda_gemm dinp_gemm(loom_tensor dinp, loom_tensor dout, loom_tensor w) {
    return dense_gemm(w.data, dout.data, dinp.data, loom_cols(&w), loom_rows(&dout), loom_cols(&dout), false, false,
                      0.0f);
}
// dw (OC,C) += dout^T inp, or = with the backend's grads_write (beta 0: C not read)
static cuda_gemm dw_gemm(loom_backend *be, loom_tensor dw, loom_tensor dout, loom_tensor inp) {
    return dense_gemm(inp.data, dout.data, dw.data, loom_cols(&inp), loom_cols(&dout), loom_rows(&inp), false, true,
                      be->grads_write ? 0.0f : 1.0f);
}

// dinp = dout @ w, times gelu'(pre) when pre.data (bf16: the DGELU epilogue; otherwise the GELU
// backward kernel after the product). The DGELU product stays in bf16 under precision fp8: with
// FP8 operands cuBLASLt runs that epilogue as a kernel of its own (cublasLt::globalKernel), which
// took 343 us for gpt2's fcproj at B=16 on an H100, where the whole bf16 DGELU product takes 167.
static void matmul_dinp(loom_backend *be, loom_tensor dinp, loom_tensor dout, loom_tensor w,
                        loom_tensor pre) {
    loom_cuda *cu = cuda_of(be);
    cuda_gemm g = dinp_gemm(dinp, dout, w);
    if (pre.data && be->dtype == LOOM_BF16) {
        g.epilogue = CUBLASLT_EPILOGUE_DGELU;
        g.aux = pre.data;
        if (cuda_gemm_run(cu, &g) == CUBLAS_STATUS_SUCCESS) return;
        g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        g.aux = NULL;
    }
    must_product(cu, &g, CUDA_FP8_WEIGHT, CUDA_FP8_GRAD);
    if (pre.data) cuda_gelu_backward(be, dinp, pre, dinp);
}

// The dw product gw (unless done: it ran, and dbias with it), then dbias (OC) += (or =, grads_write)
// column sums of dout when dbias.data
static void matmul_dw(loom_backend *be, const cuda_gemm *gw, bool done, loom_tensor dbias, loom_tensor dout) {
    if (done) return;
    cuda_fp8_unpromised(cuda_of(be), gw->a, be->fp8_site, "weight-gradient product");
    must_product(cuda_of(be), gw, CUDA_FP8_INPUT, CUDA_FP8_GRAD);
    if (dbias.data)
        cuda_column_sums(cuda_of(be), dbias.data, dout.data, loom_rows(&dout), loom_cols(&dout), loom_cols(&dout),
                         cuda_act(be, dout), !be->grads_write);
}

static void check_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor dbias, loom_tensor dout,
                           loom_tensor inp, loom_tensor w) {
    bool bf = cuda_act(be, inp);
    int64_t N = loom_rows(&inp), C = loom_cols(&inp), OC = loom_rows(&w);
    LOOM_CHECK(N > 0 && C > 0 && OC > 0 && cuda_act(be, w) == bf && cuda_act(be, dout) == bf);
    LOOM_CHECK(loom_cols(&w) == C && loom_rows(&dout) == N && loom_cols(&dout) == OC);
    if (dinp.data) LOOM_CHECK(cuda_act(be, dinp) == bf && loom_rows(&dinp) == N && loom_cols(&dinp) == C);
    if (dw.data) LOOM_CHECK(cuda_act(be, dw) == bf && loom_rows(&dw) == OC && loom_cols(&dw) == C);
    if (dbias.data) LOOM_CHECK(cuda_act(be, dbias) == bf && loom_numel(&dbias) == OC);
}

// Under precision fp8 with both products, dout is cast once for the two, and dbias summed as it
// is read (cuda_fp8_backward); a product that did not run there runs on its own.
extern "C" void cuda_matmul_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw,
                                     loom_tensor dbias, loom_tensor dout, loom_tensor inp,
                                     loom_tensor w) {
    check_backward(be, dinp, dw, dbias, dout, inp, w);
    cublasStatus_t si = CUBLAS_STATUS_NOT_SUPPORTED, sw = CUBLAS_STATUS_NOT_SUPPORTED;
    cuda_gemm gi = dinp_gemm(dinp, dout, w), gw = dw_gemm(be, dw, dout, inp);
    if (be->fp8 && dinp.data && dw.data) cuda_fp8_backward(cuda_of(be), &gi, &gw, dbias.data, &si, &sw);
    if (dinp.data && si != CUBLAS_STATUS_SUCCESS) matmul_dinp(be, dinp, dout, w, loom_tensor{});
    if (dw.data) matmul_dw(be, &gw, sw == CUBLAS_STATUS_SUCCESS, dbias, dout);
}

extern "C" void cuda_matmul_gelu_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw,
                                          loom_tensor dbias, loom_tensor dout, loom_tensor inp,
                                          loom_tensor w, loom_tensor pre) {
    check_backward(be, dinp, dw, dbias, dout, inp, w);
    LOOM_CHECK(dinp.data && cuda_act(be, pre) == cuda_act(be, inp) && loom_numel(&pre) == loom_numel(&inp));
    matmul_dinp(be, dinp, dout, w, pre);
    if (!dw.data) return;
    cuda_gemm gw = dw_gemm(be, dw, dout, inp);
    matmul_dw(be, &gw, false, dbias, dout);
}

// Under precision fp8 with the weight gradients, the GELU's backward goes into the FP8 casts
// instead of the DGELU product, which stays in bf16 (matmul_dinp): the fcproj layer's dinp
// product is a plain FP8 one (or, with the backend's fp8_fast_dgrad, writes the fc layer's
// output-gradient copies itself), its dw product takes the transposed copy of the GELU output that
// the forward kept (fp8_kept.cu) or casts gelu(pre) (act is neither read nor recomputed), and the
// fc layer's output-gradient copies hold dfch gelu'(pre) (cuda_fp8_mlp_backward). Where the
// products do not suit FP8, the plain ops.
extern "C" void cuda_mlp_backward(loom_backend *be, loom_tensor dinp, loom_tensor dfch, loom_tensor dfcw,
                                  loom_tensor dfcb, loom_tensor dprojw, loom_tensor dprojb, loom_tensor dout,
                                  loom_tensor inp, loom_tensor fcw, loom_tensor pre, loom_tensor act, bool act_kept,
                                  loom_tensor projw) {
    if (be->fp8 && dfcw.data && dprojw.data) {
        check_backward(be, dfch, dprojw, dprojb, dout, act, projw);
        check_backward(be, dinp, dfcw, dfcb, dfch, inp, fcw);
        LOOM_CHECK(cuda_act(be, pre) == cuda_act(be, act) && loom_numel(&pre) == loom_numel(&act));
        loom_cuda *cu = cuda_of(be);
        cuda_gemm gi = dinp_gemm(dfch, dout, projw), gw = dw_gemm(be, dprojw, dout, act);
        cuda_gemm gi_fc = dinp_gemm(dinp, dfch, fcw), gw_fc = dw_gemm(be, dfcw, dfch, inp);
        // act's transposed copy where the forward kept one (fp8_kept.cu), else a cast of gelu(pre)
        float *inv;
        bool act_t = act_kept && cuda_fp8_kept_cols(cu, be->fp8_site, act.data, loom_numel(&act), false, &inv);
        if (cuda_fp8_mlp_backward(cu, &gi, &gw, dprojb.data, act_t ? NULL : pre.data, &gi_fc, &gw_fc, dfcb.data,
                                  pre.data, be->fp8_site_fc, be->fp8_site))
            return;
    }
    loom_mlp_backward_ops(be, dinp, dfch, dfcw, dfcb, dprojw, dprojb, dout, inp, fcw, pre, act, act_kept, projw);
}
