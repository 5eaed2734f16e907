// Fused softmax + cross-entropy over the first V of Vp columns (as llm.c's fused classifier):
// per row one pass for the max, one for the sum of exponentials (logsumexp, stable), and in
// the backward one pass that overwrites the logits with dloss * (softmax - onehot), so the
// probabilities are never stored.
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/cpu_ops.h"

void cpu_softmax_crossentropy(loom_backend *be, loom_tensor losses, loom_tensor logits,
                              loom_tensor targets, int V, float dloss, bool backward) {
    float *loss = cpu_f32(losses), *z = cpu_f32(logits); // (N), (N,Vp)
    const int32_t *tgt = cpu_i32(targets); // (N)
    int64_t N = loom_rows(&logits), Vp = loom_cols(&logits);
    LOOM_CHECK(V > 0 && V <= Vp && loom_numel(&losses) == N && loom_numel(&targets) == N);
    for (int64_t i = 0; i < N; i++) LOOM_CHECK(tgt[i] >= 0 && tgt[i] < V);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        float *zi = z + i * Vp, m = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < V; j++) m = zi[j] > m ? zi[j] : m;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < V; j++) sum += cpu_expf(zi[j] - m);
        float lse = m + logf(sum);
        loss[i] = lse - zi[tgt[i]];
        if (!backward) continue;
#pragma omp simd
        for (int64_t j = 0; j < V; j++) zi[j] = dloss * cpu_expf(zi[j] - lse);
        zi[tgt[i]] -= dloss;
        for (int64_t j = V; j < Vp; j++) zi[j] = 0.0f;
    }
}
