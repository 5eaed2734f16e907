// Linear layer out = inp w^T + bias (w (OC,C) as torch.nn.Linear), all products through
// cblas_sgemm (row-major), as llm.c's matmul_forward/backward. The bias is broadcast into out
// first and the product added with beta = 1, so out is streamed once. The bias gradient sums
// the rows of dout through per-chunk partials (cpu_ops.h): independent of the thread count.
#include "backend/cpu/cpu_ops.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

void cpu_matmul_forward(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w,
                        loom_tensor bias) {
    float *o = cpu_f32(out); // (N,OC)
    const float *x = cpu_f32(inp), *wp = cpu_f32(w); // (N,C), (OC,C)
    int64_t N = loom_rows(&inp), C = loom_cols(&inp), OC = loom_rows(&w);
    LOOM_CHECK(N > 0 && C > 0 && OC > 0);
    LOOM_CHECK(loom_cols(&w) == C && loom_rows(&out) == N && loom_cols(&out) == OC);
    float beta = 0.0f;
    if (bias.data) {
        const float *bp = cpu_f32(bias); // (OC)
        LOOM_CHECK(loom_numel(&bias) == OC);
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++) memcpy(o + n * OC, bp, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1.0f, x, (int)C,
                wp, (int)C, beta, o, (int)OC);
}

void cpu_matmul_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor dbias,
                         loom_tensor dout, loom_tensor inp, loom_tensor w) {
    const float *d = cpu_f32(dout), *x = cpu_f32(inp), *wp = cpu_f32(w); // (N,OC), (N,C), (OC,C)
    int64_t N = loom_rows(&inp), C = loom_cols(&inp), OC = loom_rows(&w);
    LOOM_CHECK(N > 0 && C > 0 && OC > 0);
    LOOM_CHECK(loom_cols(&w) == C && loom_rows(&dout) == N && loom_cols(&dout) == OC);
    if (dinp.data) {
        float *dx = cpu_f32(dinp); // (N,C) =
        LOOM_CHECK(loom_rows(&dinp) == N && loom_cols(&dinp) == C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)OC, 1.0f, d,
                    (int)OC, wp, (int)C, 0.0f, dx, (int)C);
    }
    if (!dw.data) return;
    LOOM_CHECK(loom_rows(&dw) == OC && loom_cols(&dw) == C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1.0f, d, (int)OC,
                x, (int)C, be->grads_write ? 0.0f : 1.0f, cpu_f32(dw), (int)C); // (OC,C) += (or =)
    if (dbias.data) {
        LOOM_CHECK(loom_numel(&dbias) == OC);
        cpu_column_sums(cpu_f32(dbias), d, N, OC, OC, !be->grads_write);
    }
}
