// The CUDA backend: the loom_backend table for one NVIDIA GPU (built for sm_90: H100/H200).
// Memory is device memory from cudaMalloc; every op, copy and memset runs on one stream that the
// backend owns (be->stream hands it out); upload, download, alloc and free wait for the
// stream, the ops do not. Matmuls go through one cuBLASLt handle with one workspace; the other
// ops are kernels, one concept per file beside this one (cuda_ops.h lists them).
#include "backend/cuda/cuda_ops.h"

#include <nvtx3/nvToolsExt.h>
#include <uthash.h>

#include <string.h>

#define LT_WORKSPACE_BYTES ((size_t)32 << 20) // cuBLASLt workspace (Hopper kernels like 32 MiB)

void cuda_check_failed(const char *what, const char *error, const char *call, const char *file,
                       int line) {
    fprintf(stderr, "loom: %s error at %s:%d: %s (%s)\n", what, file, line, error, call);
    abort();
}

struct cuda_block { // one live allocation
    void *ptr;
    size_t bytes;
    UT_hash_handle hh;
};

static void *cuda_alloc(loom_backend *be, size_t bytes) {
    loom_cuda *cu = cuda_of(be);
    size_t n = bytes == 0 ? 256 : bytes; // never NULL for a valid request
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); // clear it: running out is the caller's to report
        return NULL;
    }
    CUDA_CHECK(e);
    CUDA_CHECK(cudaMemsetAsync(p, 0, n, cu->stream));
    CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    cuda_block *b = (cuda_block *)loom_xmalloc(sizeof *b);
    b->ptr = p;
    b->bytes = n;
    HASH_ADD_PTR(cu->blocks, ptr, b);
    cuda_account(cu, (long long)n);
    return p;
}

static void cuda_free(loom_backend *be, void *p) {
    if (!p) return;
    loom_cuda *cu = cuda_of(be);
    CUDA_CHECK(cudaStreamSynchronize(cu->stream)); // no op may still use it
    CUDA_CHECK(cudaFree(p));
    cuda_block *b;
    HASH_FIND_PTR(cu->blocks, &p, b);
    LOOM_CHECK(b); // freeing what this backend did not allocate
    cuda_fp8_kept_freed(cu, p, b->bytes);
    cuda_account(cu, -(long long)b->bytes);
    HASH_DEL(cu->blocks, b);
    free(b);
}

static void cuda_upload(loom_backend *be, void *dst, const void *host_src, size_t bytes) {
    if (!bytes) return;
    loom_cuda *cu = cuda_of(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cu->stream));
    CUDA_CHECK(cudaStreamSynchronize(cu->stream)); // the caller may reuse host_src at once
}

static void cuda_download(loom_backend *be, void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return;
    loom_cuda *cu = cuda_of(be);
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cu->stream));
    CUDA_CHECK(cudaStreamSynchronize(cu->stream));
}

static void cuda_zero(loom_backend *be, void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_of(be)->stream));
}

static void cuda_copy(loom_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) // device or page-locked host memory: the addresses say which (unified addressing)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_of(be)->stream));
}

static void cuda_copy_2d(loom_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                         size_t width, size_t rows) {
    if (width && rows)
        CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                                     cuda_of(be)->stream));
}

static void cuda_synchronize(loom_backend *be) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_of(be)->stream));
}

static void cuda_grads_flush(loom_backend *be) { cuda_flush_partials(cuda_of(be)); }

void cuda_grow(loom_cuda *cu, void **buf, size_t *have, size_t bytes) {
    if (bytes <= *have) return;
    CUDA_CHECK(cudaStreamSynchronize(cu->stream)); // earlier ops may still read the old one
    if (*buf) CUDA_CHECK(cudaFree(*buf));
    size_t n = bytes > 2 * *have ? bytes : 2 * *have;
    n = (n + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1); // whole MiB
    *buf = NULL;
    CUDA_CHECK(cudaMalloc(buf, n));
    cuda_account(cu, (long long)n - (long long)*have);
    *have = n;
    cu->scratch_moves++;
}

void *cuda_scratch(loom_cuda *cu, size_t bytes) {
    cuda_grow(cu, &cu->scratch, &cu->scratch_bytes, bytes);
    return cu->scratch;
}

static void cuda_destroy(loom_backend *be) {
    loom_cuda *cu = cuda_of(be);
    CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    cuda_host_copy_destroy(cu);
    if (cu->scratch) CUDA_CHECK(cudaFree(cu->scratch));
    CUDA_CHECK(cudaFree(cu->workspace));
    cuda_matmul_free_cache(cu);
    cuda_fp8_free(cu);
    cuda_partials_free(cu);
    cuda_fp8_kept_free(cu);
    CUBLAS_CHECK(cublasLtDestroy(cu->lt));
    CUDA_CHECK(cudaStreamDestroy(cu->stream));
    cuda_block *b, *tmp;
    HASH_ITER(hh, cu->blocks, b, tmp) { // blocks still allocated: their records only
        HASH_DEL(cu->blocks, b);
        free(b);
    }
    free(cu);
}

static void cuda_memory_info(loom_backend *be, size_t *free_bytes, size_t *total_bytes) {
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

static void cuda_range_push(loom_backend *be, const char *name) { nvtxRangePushA(name); }
static void cuda_range_pop(loom_backend *be) { nvtxRangePop(); }

extern "C" int loom_backend_cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count;
}

// The device this process uses (index, made current; -1: the current one), or a one-line
// failure when there is none or it is not one this build has kernels for.
static loom_status cuda_pick_device(int index, int *device) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        const char *why = e == cudaSuccess || e == cudaErrorNoDevice ? "none found"
                          : e == cudaErrorInsufficientDriver
                              ? "the NVIDIA driver is missing or older than this build's CUDA runtime"
                              : cudaGetErrorString(e);
        return loom_fail(LOOM_EUNSUPPORTED, "run on a machine with an NVIDIA GPU and driver, or use --device cpu",
                         "no CUDA device: %s", why);
    }
    if (index >= count)
        return loom_fail(LOOM_EUNSUPPORTED, "run one rank per GPU on each host",
                         "CUDA device %d asked for, but this host has %d", index, count);
    if (index >= 0) CUDA_CHECK(cudaSetDevice(index));
    CUDA_CHECK(cudaGetDevice(device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, *device));
    if (prop.major != 9)
        return loom_fail(LOOM_EUNSUPPORTED, "use an H100/H200 (compute capability 9.0), or --device cpu",
                         "CUDA device %d (%s) has compute capability %d.%d; this build has kernels for 9.0 only",
                         *device, prop.name, prop.major, prop.minor);
    return LOOM_OK;
}

extern "C" loom_status loom_backend_cuda_create(loom_backend **out, loom_dtype dtype, int device_index) {
    *out = NULL;
    if (dtype != LOOM_F32 && dtype != LOOM_BF16)
        return loom_fail(LOOM_EUNSUPPORTED, "use --precision bf16 or fp32",
                         "the cuda backend computes in bf16 or fp32, not %s", loom_dtype_name(dtype));
    int device = 0;
    LOOM_TRY(cuda_pick_device(device_index, &device));
    loom_cuda *cu = (loom_cuda *)loom_xcalloc(1, sizeof *cu);
    cu->device = device;
    CUDA_CHECK(cudaDeviceGetAttribute(&cu->sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaDeviceGetPCIBusId(cu->pci_bus_id, (int)sizeof cu->pci_bus_id, device));
    const char *debug = getenv("LOOM_CUDA_DEBUG");
    cu->debug = debug && strcmp(debug, "0") != 0;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&cu->lt));
    cu->workspace_bytes = LT_WORKSPACE_BYTES;
    cudaError_t e = cudaMalloc(&cu->workspace, cu->workspace_bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        CUBLAS_CHECK(cublasLtDestroy(cu->lt));
        CUDA_CHECK(cudaStreamDestroy(cu->stream));
        free(cu);
        return loom_fail(LOOM_ENOMEM, "free the GPU of other processes",
                         "cannot allocate the %zu-byte cuBLASLt workspace on CUDA device %d: %s",
                         (size_t)LT_WORKSPACE_BYTES, device, cudaGetErrorString(e));
    }
    cu->base = loom_backend{ // C++20 designated initializers, in member order
        .name = "cuda",
        .dtype = dtype,
        .fp8 = false,
        .fp8_history = 0,
        .fp8_fast_dgrad = false,
        .fp8_site = -1,
        .fp8_site_fc = -1,
        .fp8_site_ln = -1,
        .fp8_ln_copy_only = false,
        .gemm_autotune = false,
        .grads_write = false,
        .grads_defer = false,
        .bytes_in_use = 0,
        .peak_bytes = 0,
        .host_bytes_in_use = 0,
        .host_peak_bytes = 0,
        .chunk_bytes = (size_t)256 << 20,
        .stream = cu->stream,
        .pci_bus_id = cu->pci_bus_id,
        .alloc = cuda_alloc,
        .free = cuda_free,
        .upload = cuda_upload,
        .download = cuda_download,
        .zero = cuda_zero,
        .copy = cuda_copy,
        .copy_2d = cuda_copy_2d,
        .synchronize = cuda_synchronize,
        .grads_flush = cuda_grads_flush,
        .host_alloc = cuda_host_alloc,
        .host_free = cuda_host_free,
        .copy_async = cuda_copy_async,
        .copy_wait = cuda_copy_wait,
        .memory_info = cuda_memory_info,
        .range_push = cuda_range_push,
        .range_pop = cuda_range_pop,
        .graph_begin = cuda_graph_begin,
        .graph_end = cuda_graph_end,
        .graph_launch = cuda_graph_launch,
        .graph_free = cuda_graph_free,
        .encoder_forward = cuda_encoder_forward,
        .encoder_backward = cuda_encoder_backward,
        .layernorm_forward = cuda_layernorm_forward,
        .layernorm_backward = cuda_layernorm_backward,
        .matmul_forward = cuda_matmul_forward,
        .matmul_backward = cuda_matmul_backward,
        .attention_forward = cuda_attention_forward,
        .attention_backward = cuda_attention_backward,
        .attention_merge = cuda_attention_merge,
        .gelu_forward = cuda_gelu_forward,
        .gelu_backward = cuda_gelu_backward,
        .residual_forward = cuda_residual_forward,
        .matmul_residual_forward = cuda_matmul_residual_forward,
        .matmul_gelu_forward = cuda_matmul_gelu_forward,
        .matmul_gelu_backward = cuda_matmul_gelu_backward,
        .mlp_forward = cuda_mlp_forward,
        .mlp_backward = cuda_mlp_backward,
        .residual_layernorm_forward = cuda_residual_layernorm_forward,
        .softmax_crossentropy = cuda_softmax_crossentropy,
        .crossentropy_partial = cuda_crossentropy_partial,
        .crossentropy_combine = cuda_crossentropy_combine,
        .crossentropy_backward = cuda_crossentropy_backward,
        .adamw_update = cuda_adamw_update,
        .sumsq = cuda_sumsq,
        .sumsq_add = cuda_sumsq_add,
        .step_scalars = cuda_step_scalars,
        .fp8_begin = cuda_fp8_begin,
        .fp8_weights = cuda_fp8_weights,
        .input_kept = cuda_input_kept,
        .fp8_amax = cuda_fp8_amax,
        .fp8_roll = cuda_fp8_roll,
        .fp8_save = cuda_fp8_save,
        .fp8_load = cuda_fp8_load,
        .destroy = cuda_destroy,
    };
    cuda_account(cu, (long long)cu->workspace_bytes);
    *out = &cu->base;
    return LOOM_OK;
}
