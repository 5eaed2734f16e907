// What the product probes (bench_ce_gemm.cu, bench_gemm_gelu.cu) share: random bf16 operands,
// cuBLASLt's product with its candidates timed, a timer and a comparison.
#pragma once
#include "backend/cuda/hopper.cuh"

#include <math.h>
#include <vector>

void cuda_check_failed(const char *what, const char *error, const char *call, const char *file, int line) {
    fprintf(stderr, "%s:%d: %s error %s in %s\n", file, line, what, error, call);
    exit(1);
}

// ---- host ----
static uint32_t rng_state = 12345;
static float frand() { // uniform [-1, 1)
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / (float)(1 << 23) - 1.0f;
}

// cuBLASLt's product, row-major D (M,N) bf16 = A (M,K) B with B (N,K) (bt 0) or (K,N) (bt 1), fp32
// accumulation, as column-major D^T = op(B) A^T; with the epilogue ep (its bias and aux, as loom's
// matmul.cu sets them), the heuristic's candidates (up to 16)
struct lt_gemm {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulHeuristicResult_t algos[16];
    int nalgo, best = 0;
    void *wsp;
    size_t wsb = 64 << 20;
};
static void lt_init(lt_gemm &g, int M, int N, int K, int bt, cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT,
                    const void *bias = NULL, const void *aux = NULL) {
    CUBLAS_CHECK(cublasLtCreate(&g.lt));
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = bt ? CUBLAS_OP_N : CUBLAS_OP_T;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    if (bias) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux) {
        int64_t ld = N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.la, CUDA_R_16BF, bt ? N : K, bt ? K : N, bt ? N : K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_16BF, K, M, K)); // A^T
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.ld, CUDA_R_16BF, N, M, N));
    CUDA_CHECK(cudaMalloc(&g.wsp, g.wsb));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g.wsb,
                                                      sizeof g.wsb));
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(g.lt, g.op, g.la, g.lb, g.ld, g.ld, pref, 16, g.algos, &g.nalgo));
}
// D = A B with candidate a
static void lt_run(lt_gemm &g, int a, const void *B, const void *A, void *D) {
    float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(g.lt, g.op, &one, B, g.la, A, g.lb, &zero, D, g.ld, D, g.ld, &g.algos[a].algo, g.wsp,
                                g.wsb, 0));
}

// Microseconds a run of f takes (the mean of reps after 3 untimed)
template <typename F> static float time_us(F f, int reps = 20) {
    for (int i = 0; i < 3; i++) f();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int i = 0; i < reps; i++) f();
    cudaEventRecord(e1);
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms * 1000.0f / reps;
}

// The fastest of cuBLASLt's candidates (into g.best) and its time, us
static float lt_best(lt_gemm &g, const void *B, const void *A, void *D) {
    float best = 1e30f;
    for (int a = 0; a < g.nalgo; a++) {
        float t = time_us([&] { lt_run(g, a, B, A, D); });
        if (t < best) best = t, g.best = a;
    }
    return best;
}

static std::vector<float> to_host(const __nv_bfloat16 *d, size_t n) {
    std::vector<__nv_bfloat16> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i]);
    return f;
}
// max |a - b| / max |b|
static double rel_diff(const std::vector<float> &a, const std::vector<float> &b) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < a.size(); i++) md = fmax(md, fabs(a[i] - b[i])), mb = fmax(mb, fabs(b[i]));
    return md / mb;
}
