// gemm_fp8.cu's kernel alone, both forms (the fc product with the GELU's casts, the fcproj
// input-gradient product with the DGELU's), on random FP8 operands and without cuBLASLt: the
// program that scripts/device_gpu.sh runs under compute-sanitizer's racecheck. test_cuda_fp8 checks
// the kernel's results against the CPU; under racecheck it also runs cuBLASLt's FP8 kernels, which
// report hazards of their own and, with the 580 drivers, stop the sanitizer with an internal error
// (a hardware exception) before any kernel of loom's runs. Two shapes: gpt2's MLP at 256 rows (a
// tile a block) and 4096 x 1024 x 256 (256 tiles: two a block, the ring across them). Fails (exit 1)
// when a form declines to run or the amax it records is not positive and finite; exit 77 (skipped)
// without a CUDA device.
#include "backend/cuda/cuda_ops.h"

#include <math.h>
#include <string.h>

void cuda_check_failed(const char *what, const char *error, const char *call, const char *file, int line) {
    fprintf(stderr, "%s error: %s in %s at %s:%d\n", what, error, call, file, line);
    exit(1);
}

// bytes device bytes, each lo + a pseudo-random value below span
static void *random_bytes(size_t bytes, unsigned seed, unsigned lo, unsigned span) {
    uint8_t *h = (uint8_t *)malloc(bytes);
    for (size_t i = 0; i < bytes; i++) h[i] = (uint8_t)(lo + ((seed = seed * 1103515245u + 12345u) >> 16) % span);
    void *d;
    CUDA_CHECK(cudaMalloc(&d, bytes));
    CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

// Both forms at M x N x K; false when either declined or recorded a bad amax
static bool run(loom_cuda *cu, int M, int N, int K) {
    // E4M3 / E5M2 bytes 0x20-0x37 (small finite values of either format), bf16 pre and bias with
    // high bytes below 0x7f (finite)
    uint8_t *a8 = (uint8_t *)random_bytes((size_t)M * K, 1, 0x20, 0x18);
    uint8_t *b8 = (uint8_t *)random_bytes((size_t)N * K, 2, 0x20, 0x18);
    void *pre = random_bytes((size_t)M * N * 2, 3, 0, 0x7f), *bias = random_bytes((size_t)N * 2, 4, 0, 0x7f);
    uint8_t *rows, *cols;
    float *colpart, *scales;
    unsigned *record;
    CUDA_CHECK(cudaMalloc(&rows, (size_t)M * N));
    CUDA_CHECK(cudaMalloc(&cols, (size_t)M * N));
    CUDA_CHECK(cudaMalloc(&colpart, (size_t)(M / 128) * N * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&scales, 2 * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&record, 2 * sizeof(unsigned)));
    const float one[2] = {1.0f, 1.0f};
    CUDA_CHECK(cudaMemcpy(scales, one, sizeof one, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(record, 0, 2 * sizeof(unsigned)));
    // the forward: pre (M,N) = a8 b8^T + bias, as matmul.cu builds it (D^T: m = N, n = M)
    cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.d = pre, g.m = N, g.n = M, g.k = K, g.ldd = N, g.epilogue = CUBLASLT_EPILOGUE_BIAS, g.bias = bias;
    bool gelu = cuda_fp8_gelu_gemm(cu, &g, b8, scales, a8, scales, rows, cols, fp8_cast{scales, scales + 1, record});
    cuda_fp8_dgelu_out out = {rows, cols, colpart, fp8_cast{scales, scales + 1, record + 1}};
    bool dgelu = cuda_fp8_dgelu_gemm(cu, a8, scales, b8, scales, pre, M, N, K, out);
    unsigned amax[2];
    CUDA_CHECK(cudaMemcpyAsync(amax, record, sizeof amax, cudaMemcpyDeviceToHost, cu->stream));
    CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    float am[2];
    memcpy(am, amax, sizeof am);
    printf("M %d N %d K %d: gelu %s (amax %g), dgelu %s (amax %g)\n", M, N, K, gelu ? "ran" : "declined", am[0],
           dgelu ? "ran" : "declined", am[1]);
    void *all[] = {a8, b8, pre, bias, rows, cols, colpart, scales, record};
    for (void *p : all) CUDA_CHECK(cudaFree(p));
    return gelu && dgelu && am[0] > 0 && isfinite(am[0]) && am[1] > 0 && isfinite(am[1]);
}

int main(void) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("sanitize_gemm_fp8: no CUDA device, skipped\n");
        return 77;
    }
    loom_cuda cu;
    memset(&cu, 0, sizeof cu);
    CUDA_CHECK(cudaDeviceGetAttribute(&cu.sms, cudaDevAttrMultiProcessorCount, 0));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cu.stream, cudaStreamNonBlocking));
    bool ok = run(&cu, 256, 3072, 768) && run(&cu, 4096, 1024, 256);
    CUDA_CHECK(cudaStreamDestroy(cu.stream));
    return ok ? 0 : 1;
}
