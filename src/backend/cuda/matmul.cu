// Linear layer out = inp w^T + bias (w (OC,C) as torch.nn.Linear) through cuBLASLt, as llm.c's
// matmul_cublaslt: bf16 (or fp32) operands, fp32 accumulation (CUBLAS_COMPUTE_32F: in fp32 mode
// no TF32, so results match the CPU's sgemm to rounding). cuBLAS is column-major, so a
// row-major (R, K) array is handed over as the column-major (K, R) array it is in memory:
//   forward  out^T (OC,N)  = w^T[C,OC]^T * inp^T (C,N)          + bias   (BIAS epilogue)
//   dinp     dinp^T (C,N)  = w^T (C,OC) * dout^T (OC,N)
//   dw       dw^T (C,OC)  += inp^T (C,N) * (dout^T (OC,N))^T             (beta = 1)
//   dbias (OC) += column sums of dout: the BGRADB epilogue of the dw product (a reduction over
//                 its k = N) into a scratch vector that is then added, or, where cuBLASLt has
//                 no algorithm for that epilogue, a deterministic column sum (reduce.cu).
// Each call asks the heuristic for one algorithm for its shapes and its pointers' alignment.
#include "backend/cuda/cuda_ops.h"

typedef struct { // D (m,n) = op(A) op(B) + beta D, column-major, lds in elements
    const void *a, *b;
    void *d;
    int64_t m, n, k, lda, ldb, ldd;
    bool transa, transb;
    float beta;
    cublasLtEpilogue_t epilogue;
    void *bias; // bias (BIAS) or bias gradient (BGRADB), dtype of D; NULL without
} lt_gemm;

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

// Runs g and returns CUBLAS_STATUS_SUCCESS, or returns the heuristic's failure (nothing run)
// when cuBLASLt has no algorithm for it (NOT_SUPPORTED, or INVALID_VALUE for an epilogue it
// does not take with these types).
static cublasStatus_t lt_run(loom_cuda *cu, const lt_gemm *g) {
    cudaDataType_t type = cu->base.dtype == LOOM_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = g->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    lt_set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    lt_set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g->epilogue, sizeof g->epilogue);
    if (g->bias) lt_set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias);
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, type, g->transa ? g->k : g->m, g->transa ? g->m : g->k, g->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, type, g->transb ? g->n : g->k, g->transb ? g->k : g->n, g->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, type, g->m, g->n, g->ldd));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = cu->workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    lt_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, lt_alignment(g->a));
    lt_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, lt_alignment(g->b));
    lt_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, lt_alignment(g->d));
    lt_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, lt_alignment(g->d));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cu->lt, desc, la, lb, ld, ld, pref, 1, &heur, &found);
    if (st == CUBLAS_STATUS_SUCCESS && (found == 0 || heur.state != CUBLAS_STATUS_SUCCESS))
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS) {
        float alpha = 1.0f;
        CUBLAS_CHECK(cublasLtMatmul(cu->lt, desc, &alpha, g->a, la, g->b, lb, &g->beta, g->d, ld, g->d, ld,
                                    &heur.algo, cu->workspace, cu->workspace_bytes, cu->stream));
    }
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    if (st != CUBLAS_STATUS_SUCCESS && cu->debug)
        fprintf(stderr, "loom: cuda: no cuBLASLt algorithm for %lldx%lldx%lld (epilogue %d): %s\n",
                (long long)g->m, (long long)g->n, (long long)g->k, (int)g->epilogue,
                cublasLtGetStatusString(st));
    return st;
}

static void lt_must_run(loom_cuda *cu, const lt_gemm *g) {
    cublasStatus_t st = lt_run(cu, g);
    if (st == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "loom: cuBLASLt has no algorithm for a %lldx%lldx%lld %s matmul: %s\n",
            (long long)g->m, (long long)g->n, (long long)g->k, loom_dtype_name(cu->base.dtype),
            cublasLtGetStatusString(st));
    abort();
}

// out (N, OC) += bias (OC) broadcast over rows: the fallback when the BIAS epilogue has no
// algorithm (e.g. a bias at an odd address)
__global__ void add_bias_kernel(void *out, const void *bias, int64_t N, int64_t OC, bool bf) {
    GRID_STRIDE(i, N * OC) stx(out, i, ldx(out, i, bf) + ldx(bias, i % OC, bf), bf);
}

extern "C" void cuda_matmul_forward(loom_backend *be, loom_tensor out, loom_tensor inp,
                                    loom_tensor w, loom_tensor bias) {
    loom_cuda *cu = cuda_of(be);
    bool bf = cuda_act(be, inp);
    int64_t N = loom_rows(&inp), C = loom_cols(&inp), OC = loom_rows(&w);
    LOOM_CHECK(N > 0 && C > 0 && OC > 0 && cuda_act(be, w) == bf && cuda_act(be, out) == bf);
    LOOM_CHECK(loom_cols(&w) == C && loom_rows(&out) == N && loom_cols(&out) == OC);
    if (bias.data) LOOM_CHECK(cuda_act(be, bias) == bf && loom_numel(&bias) == OC);
    lt_gemm g = {w.data, inp.data, out.data, OC, N, C, C, C, OC, true, false, 0.0f,
                 bias.data ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias.data};
    if (lt_run(cu, &g) == CUBLAS_STATUS_SUCCESS) return;
    LOOM_CHECK(bias.data); // no algorithm even without an epilogue
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = NULL;
    lt_must_run(cu, &g);
    add_bias_kernel<<<cuda_blocks(N * OC, 256), 256, 0, cu->stream>>>(out.data, bias.data, N, OC, bf);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_matmul_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw,
                                     loom_tensor dbias, loom_tensor dout, loom_tensor inp,
                                     loom_tensor w) {
    loom_cuda *cu = cuda_of(be);
    bool bf = cuda_act(be, inp);
    int64_t N = loom_rows(&inp), C = loom_cols(&inp), OC = loom_rows(&w);
    LOOM_CHECK(N > 0 && C > 0 && OC > 0 && cuda_act(be, w) == bf && cuda_act(be, dout) == bf &&
               cuda_act(be, dw) == bf);
    LOOM_CHECK(loom_cols(&w) == C && loom_rows(&dout) == N && loom_cols(&dout) == OC &&
               loom_rows(&dw) == OC && loom_cols(&dw) == C);
    if (dinp.data) {
        LOOM_CHECK(cuda_act(be, dinp) == bf && loom_rows(&dinp) == N && loom_cols(&dinp) == C);
        lt_gemm g = {w.data, dout.data, dinp.data, C, N, OC, C, OC, C, false, false, 0.0f,
                     CUBLASLT_EPILOGUE_DEFAULT, NULL};
        lt_must_run(cu, &g);
    }
    void *bgrad = NULL; // the BGRADB output (be->dtype), then added into dbias
    if (dbias.data) {
        LOOM_CHECK(cuda_act(be, dbias) == bf && loom_numel(&dbias) == OC);
        bgrad = cuda_scratch(cu, (size_t)OC * loom_dtype_size(be->dtype));
    }
    lt_gemm g = {inp.data, dout.data, dw.data, C, OC, N, C, OC, C, false, true, 1.0f,
                 bgrad ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT, bgrad};
    if (bgrad && lt_run(cu, &g) == CUBLAS_STATUS_SUCCESS) {
        cuda_add_partials(cu, dbias.data, bf, bgrad, bf, 1, OC, OC); // dbias += bgrad
        return;
    }
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = NULL;
    lt_must_run(cu, &g);
    if (dbias.data) cuda_column_sums(cu, dbias.data, dout.data, N, OC, bf);
}
