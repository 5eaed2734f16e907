// Fused softmax + cross-entropy over the first V of Vp columns (as llm.c's fused classifier):
// per row one pass for the max, one for the sum of exponentials (logsumexp, stable), and in
// the backward one pass that overwrites the logits with dloss * (softmax - onehot), so the
// probabilities are never stored.
// The vocabulary-parallel form (Megatron-LM, Shoeybi et al. 2019) runs the same passes over a
// shard's columns: crossentropy_partial keeps each row's (max, sum of exponentials, target
// logit), crossentropy_combine merges the shards' in shard order into the logsumexp and the
// loss, and crossentropy_backward is the fused op's gradient pass given that logsumexp.
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/cpu_ops.h"

// *m = max of z[0, n) (-INFINITY when n is 0), *s = sum of exp(z[j] - *m) (0 when n is 0)
static inline void row_max_sumexp(const float *z, int64_t n, float *m, float *s) {
    float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; j++) mx = z[j] > mx ? z[j] : mx;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; j++) sum += cpu_expf(z[j] - mx);
    *m = mx, *s = sum;
}

// z[0, n) = dloss * (exp(z - lse) - [j == tgt]) (tgt < 0: no target here), z[n, len) = 0
static inline void row_backward(float *z, int64_t n, int64_t len, float lse, int64_t tgt,
                                float dloss) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) z[j] = dloss * cpu_expf(z[j] - lse);
    if (tgt >= 0) z[tgt] -= dloss;
    for (int64_t j = n; j < len; j++) z[j] = 0.0f;
}

// Checks a shard's arguments (targets in [0,V)) and returns how many of its Vl columns are
// valid: those with vocab_start + j < V.
static int64_t shard_valid(loom_tensor logits, loom_tensor targets, int vocab_start, int V) {
    const int32_t *tgt = cpu_i32(targets);
    int64_t N = loom_rows(&logits), Vl = loom_cols(&logits);
    LOOM_CHECK(V > 0 && vocab_start >= 0 && loom_numel(&targets) == N);
    for (int64_t i = 0; i < N; i++) LOOM_CHECK(tgt[i] >= 0 && tgt[i] < V);
    return cpu_min64(Vl, V > vocab_start ? (int64_t)V - vocab_start : 0);
}

void cpu_softmax_crossentropy(loom_backend *be, loom_tensor losses, loom_tensor logits,
                              loom_tensor targets, int V, float dloss, bool backward) {
    float *loss = cpu_f32(losses), *z = cpu_f32(logits); // (N), (N,Vp)
    const int32_t *tgt = cpu_i32(targets); // (N)
    int64_t N = loom_rows(&logits), Vp = loom_cols(&logits);
    LOOM_CHECK(V <= Vp && loom_numel(&losses) == N);
    shard_valid(logits, targets, 0, V);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        float *zi = z + i * Vp, m, sum;
        row_max_sumexp(zi, V, &m, &sum);
        float lse = m + logf(sum);
        loss[i] = lse - zi[tgt[i]];
        if (backward) row_backward(zi, V, Vp, lse, tgt[i], dloss);
    }
}

void cpu_crossentropy_partial(loom_backend *be, loom_tensor partial, loom_tensor logits,
                              loom_tensor targets, int vocab_start, int V) {
    float *p = cpu_f32(partial); // (N,3)
    const float *z = cpu_f32(logits); // (N,Vl)
    const int32_t *tgt = cpu_i32(targets); // (N)
    int64_t N = loom_rows(&logits), Vl = loom_cols(&logits);
    int64_t n = shard_valid(logits, targets, vocab_start, V);
    LOOM_CHECK(loom_cols(&partial) == 3 && loom_rows(&partial) == N);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *zi = z + i * Vl;
        float *pi = p + i * 3;
        row_max_sumexp(zi, n, &pi[0], &pi[1]);
        int64_t j = cpu_shard_index(tgt[i], vocab_start, Vl);
        pi[2] = j >= 0 ? zi[j] : 0.0f;
    }
}

void cpu_crossentropy_combine(loom_backend *be, loom_tensor losses, loom_tensor lse,
                              loom_tensor partials) {
    float *loss = cpu_f32(losses), *l = cpu_f32(lse); // (N), (N)
    const float *p = cpu_f32(partials); // (R,N,3)
    int64_t N = loom_numel(&losses);
    LOOM_CHECK(partials.ndim == 3 && partials.shape[1] == N && partials.shape[2] == 3 &&
               loom_numel(&lse) == N);
    int64_t R = partials.shape[0];
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        float M = -INFINITY, S = 0.0f, zt = 0.0f;
        for (int64_t r = 0; r < R; r++) M = fmaxf(M, p[(r * N + i) * 3]);
        for (int64_t r = 0; r < R; r++) {
            const float *q = p + (r * N + i) * 3;
            if (q[1] != 0.0f) S += q[1] * cpu_expf(q[0] - M);
            zt += q[2];
        }
        l[i] = M + logf(S);
        loss[i] = l[i] - zt;
    }
}

void cpu_crossentropy_backward(loom_backend *be, loom_tensor logits, loom_tensor lse,
                               loom_tensor targets, int vocab_start, int V, float dloss) {
    float *z = cpu_f32(logits); // (N,Vl)
    const float *l = cpu_f32(lse); // (N)
    const int32_t *tgt = cpu_i32(targets); // (N)
    int64_t N = loom_rows(&logits), Vl = loom_cols(&logits);
    int64_t n = shard_valid(logits, targets, vocab_start, V);
    LOOM_CHECK(loom_numel(&lse) == N);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++)
        row_backward(z + i * Vl, n, Vl, l[i], cpu_shard_index(tgt[i], vocab_start, Vl), dloss);
}
