#include "model/generate.h"

#include "core/rng.h"

#include <math.h>
#include <stdlib.h>

static int desc_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

int loom_sample_token(const float *logits, int V, const loom_sampling *s, double u) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (s->temperature <= 0.0f) return best;
    // top-k: logits below the k-th largest are dropped
    float cutoff = -INFINITY;
    if (s->top_k > 0 && s->top_k < V) {
        float *sorted = loom_xmalloc((size_t)V * sizeof(float));
        for (int i = 0; i < V; i++) sorted[i] = logits[i];
        qsort(sorted, (size_t)V, sizeof(float), desc_float);
        cutoff = sorted[s->top_k - 1];
        free(sorted);
    }
    double sum = 0;
    for (int i = 0; i < V; i++)
        if (logits[i] >= cutoff) sum += exp((double)(logits[i] - logits[best]) / s->temperature);
    double target = u * sum, acc = 0;
    int last = best;
    for (int i = 0; i < V; i++) {
        if (logits[i] < cutoff) continue;
        acc += exp((double)(logits[i] - logits[best]) / s->temperature);
        last = i;
        if (acc > target) return i;
    }
    return last;
}

int loom_generate(loom_gpt2 *m, int32_t *tokens, int n_prompt, int n_new, const loom_sampling *s,
                  loom_token_fn fn, void *ctx) {
    float *logits = loom_xmalloc((size_t)m->cfg.padded_vocab_size * sizeof(float));
    int n = n_prompt, made = 0;
    for (; made < n_new; made++) {
        int ctx_len = n < m->max_T ? n : m->max_T;
        loom_gpt2_next_logits(m, tokens + n - ctx_len, ctx_len, logits);
        double u = loom_rng_uniform(s->seed, LOOM_STREAM_SAMPLER, (uint64_t)n);
        int32_t token = loom_sample_token(logits, m->cfg.vocab_size, s, u);
        tokens[n++] = token;
        if (fn && fn(token, ctx)) {
            made++;
            break;
        }
    }
    free(logits);
    return made;
}
