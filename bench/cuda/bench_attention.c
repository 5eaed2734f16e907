// Causal attention on the GPU: loom's FlashAttention-2-style kernels, forward and
// forward+backward, bf16, for T from 1024 to 16384 and head sizes 64 and 128, in TFLOP/s.
// FLOPs as FlashAttention counts them: forward 4 B NH T^2 hs / 2 (causal halves the square),
// backward 2.5x the forward. Run beside bench/peer/attention_torch.py (the same table for
// PyTorch's scaled_dot_product_attention with its flash and cuDNN backends).
//   bench_attention [REPS]
#include "backend/backend.h"
#include "core/rng.h"
#include "core/timer.h"

#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Median seconds of `reps` runs of fwd (and bwd when backward).
static double time_attention(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor qkv,
                             loom_tensor dqkv, loom_tensor dout, int NH, bool backward, int reps) {
    double *t = malloc((size_t)reps * sizeof(double));
    for (int r = -2; r < reps; r++) { // two warm-up runs
        be->synchronize(be);
        double t0 = loom_now();
        be->attention_forward(be, out, lse, qkv, qkv, NH, LOOM_ATTN_CAUSAL);
        if (backward) { // the backward adds into dqkv: zeroed first, as the model does
            be->zero(be, dqkv.data, loom_nbytes(&dqkv));
            be->attention_backward(be, dqkv, dqkv, (loom_tensor){0}, dout, qkv, qkv, out, lse, NH, LOOM_ATTN_CAUSAL);
        }
        be->synchronize(be);
        if (r >= 0) t[r] = loom_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp);
    double med = t[reps / 2];
    free(t);
    return med;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 10;
    loom_backend *be;
    if (loom_backend_create(&be, "cuda", LOOM_BF16) != LOOM_OK) {
        fprintf(stderr, "bench_attention: %s\n", loom_error_message());
        return 77;
    }
    // (B, NH, hs, T): 16 heads, B x T = 16K tokens, plus the 16 x 64 head, T=16384, B=1 case
    const int cases[][4] = {{16, 16, 64, 1024}, {8, 16, 64, 2048}, {4, 16, 64, 4096}, {2, 16, 64, 8192},
                            {1, 16, 64, 16384}, {16, 16, 128, 1024}, {8, 16, 128, 2048}, {4, 16, 128, 4096},
                            {2, 16, 128, 8192}, {1, 16, 128, 16384}};
    printf("| B | NH | hs | T | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |\n|---|---|---|---|---|---|---|---|\n");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int B = cases[c][0], NH = cases[c][1], hs = cases[c][2], T = cases[c][3], C = NH * hs;
        size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C;
        uint16_t *host = malloc(n3 * sizeof(uint16_t));
        float *tmp = malloc(n3 * sizeof(float));
        for (size_t i = 0; i < n3; i++) tmp[i] = (float)loom_rng_normal(42, c, i);
        loom_f32_to_dtype(host, LOOM_BF16, tmp, n3);
        void *qkv = be->alloc(be, n3 * 2), *dqkv = be->alloc(be, n3 * 2), *out = be->alloc(be, n1 * 2);
        void *dout = be->alloc(be, n1 * 2), *lse = be->alloc(be, (size_t)B * NH * T * 4);
        be->upload(be, qkv, host, n3 * 2);
        be->upload(be, dout, host, n1 * 2);
        loom_tensor tq = LOOM_VIEW(qkv, LOOM_BF16, B, T, 3 * C), tdq = LOOM_VIEW(dqkv, LOOM_BF16, B, T, 3 * C);
        loom_tensor to = LOOM_VIEW(out, LOOM_BF16, B, T, C), tdo = LOOM_VIEW(dout, LOOM_BF16, B, T, C);
        loom_tensor tl = LOOM_VIEW(lse, LOOM_F32, B, NH, T);
        double flops = 4.0 * B * NH * (double)T * T * hs / 2;
        double f = time_attention(be, to, tl, tq, tdq, tdo, NH, false, reps);
        double fb = time_attention(be, to, tl, tq, tdq, tdo, NH, true, reps);
        printf("| %d | %d | %d | %d | %.3f | %.1f | %.3f | %.1f |\n", B, NH, hs, T, f * 1e3, flops / f / 1e12,
               fb * 1e3, 3.5 * flops / fb / 1e12);
        be->free(be, qkv), be->free(be, dqkv), be->free(be, out), be->free(be, dout), be->free(be, lse);
        free(host);
        free(tmp);
    }
    loom_backend_destroy(be);
    return 0;
}
