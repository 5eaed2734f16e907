// The CPU backend: fp32 only, the reference that GPU kernels and parallel layouts are tested
// against (DESIGN.md principle 4). Memory is ordinary host memory; the ops live one concept
// per file beside this one (cpu_ops.h lists them).
#include "backend/cpu/cpu_ops.h"

#include <stdlib.h>
#include <string.h>

// Each block starts with a 64-byte header holding its size (for the memory accounting), so
// the caller's pointer stays 64-byte aligned.
enum { HEADER = 64 };

// A block counted in *in_use (and *peak): device-side or host-side accounting.
static void *counted_alloc(size_t bytes, size_t *in_use, size_t *peak) {
    size_t n = (bytes + 63) / 64 * 64; // aligned_alloc wants a multiple
    char *p = aligned_alloc(64, HEADER + n);
    if (!p) return NULL;
    memset(p + HEADER, 0, n);
    memcpy(p, &n, sizeof n);
    *in_use += n;
    if (*in_use > *peak) *peak = *in_use;
    return p + HEADER;
}

static void counted_free(void *p, size_t *in_use) {
    if (!p) return;
    size_t n;
    memcpy(&n, (char *)p - HEADER, sizeof n);
    *in_use -= n;
    free((char *)p - HEADER);
}

static void *cpu_alloc(loom_backend *be, size_t bytes) { return counted_alloc(bytes, &be->bytes_in_use, &be->peak_bytes); }
static void cpu_free(loom_backend *be, void *p) { counted_free(p, &be->bytes_in_use); }
// the host memory of what is offloaded, counted apart from the backend's own
static void *cpu_host_alloc(loom_backend *be, size_t bytes) {
    return counted_alloc(bytes, &be->host_bytes_in_use, &be->host_peak_bytes);
}
static void cpu_host_free(loom_backend *be, void *p) { counted_free(p, &be->host_bytes_in_use); }

static void cpu_copy(loom_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}

static uint64_t cpu_copy_async(loom_backend *be, void *dst, const void *src, size_t bytes, bool to_host) {
    cpu_copy(be, dst, src, bytes);
    return 0;
}

static void cpu_copy_wait(loom_backend *be, uint64_t ticket) {}

static void cpu_memory_info(loom_backend *be, size_t *free_bytes, size_t *total_bytes) {
    loom_host_memory_info(free_bytes, total_bytes);
}

static void cpu_copy_2d(loom_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                        size_t width, size_t rows) {
    for (size_t i = 0; i < rows; i++) memcpy((char *)dst + i * dst_pitch, (const char *)src + i * src_pitch, width);
}

static void cpu_zero(loom_backend *be, void *p, size_t bytes) {
    if (bytes) memset(p, 0, bytes);
}

static void cpu_synchronize(loom_backend *be) {}

static void cpu_grads_flush(loom_backend *be) {}

static void cpu_destroy(loom_backend *be) { free(be); }

loom_status loom_backend_cpu_create(loom_backend **out, loom_dtype dtype) {
    *out = NULL;
    if (dtype != LOOM_F32)
        return loom_fail(LOOM_EUNSUPPORTED, "use fp32 on the cpu, or a cuda device for bf16",
                         "the cpu backend computes in fp32 only, not %s", loom_dtype_name(dtype));
    loom_backend *be = loom_xmalloc(sizeof *be);
    *be = (loom_backend){
        .name = "cpu",
        .dtype = LOOM_F32,
        .fp8_site = -1,
        .fp8_site_fc = -1, // no FP8 here (the fp8_ ops NULL)
        .fp8_site_ln = -1,
        .fp8_ln_copy_only = false,
        .grads_write = false,
        .grads_defer = false,
        .chunk_bytes = (size_t)32 << 20,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .upload = cpu_copy,
        .download = cpu_copy,
        .zero = cpu_zero,
        .copy = cpu_copy,
        .copy_2d = cpu_copy_2d,
        .synchronize = cpu_synchronize,
        .grads_flush = cpu_grads_flush,
        .host_alloc = cpu_host_alloc,
        .host_free = cpu_host_free,
        .copy_async = cpu_copy_async,
        .copy_wait = cpu_copy_wait,
        .memory_info = cpu_memory_info,
        .encoder_forward = cpu_encoder_forward,
        .encoder_backward = cpu_encoder_backward,
        .layernorm_forward = cpu_layernorm_forward,
        .layernorm_backward = cpu_layernorm_backward,
        .matmul_forward = cpu_matmul_forward,
        .matmul_backward = cpu_matmul_backward,
        .attention_forward = cpu_attention_forward,
        .attention_backward = cpu_attention_backward,
        .attention_merge = cpu_attention_merge,
        .gelu_forward = cpu_gelu_forward,
        .gelu_backward = cpu_gelu_backward,
        .residual_forward = cpu_residual_forward,
        .matmul_residual_forward = loom_matmul_residual_forward_ops,
        .matmul_gelu_forward = cpu_matmul_gelu_forward,
        .matmul_gelu_backward = cpu_matmul_gelu_backward,
        .mlp_forward = loom_mlp_forward_ops,
        .mlp_backward = loom_mlp_backward_ops,
        .residual_layernorm_forward = cpu_residual_layernorm_forward,
        .softmax_crossentropy = cpu_softmax_crossentropy,
        .crossentropy_partial = cpu_crossentropy_partial,
        .crossentropy_combine = cpu_crossentropy_combine,
        .crossentropy_backward = cpu_crossentropy_backward,
        .adamw_update = cpu_adamw_update,
        .sumsq = cpu_sumsq,
        .sumsq_add = cpu_sumsq_add,
        .step_scalars = cpu_step_scalars,
        .destroy = cpu_destroy,
    };
    *out = be;
    return LOOM_OK;
}
