// Autoregressive sampling from a GPT-2: temperature and top-k (Fan et al. 2018), one token at a
// time over a sliding window of the model's allocated sequence length.
#pragma once
#include "model/gpt2.h"

#include <stdint.h>

typedef struct {
    float temperature; // 0: greedy (argmax); otherwise logits are divided by it
    int top_k;         // keep the k most likely tokens (0: all)
    uint64_t seed;     // draw i uses Philox (seed, LOOM_STREAM_SAMPLER, i): reproducible
} loom_sampling;

// Picks a token from logits[0, V) given a uniform number u in [0, 1).
int loom_sample_token(const float *logits, int V, const loom_sampling *s, double u);

// Called with each new token; return non-zero to stop early.
typedef int (*loom_token_fn)(int32_t token, void *ctx);

// Appends up to n_new tokens to tokens[0, n_prompt) (capacity n_prompt + n_new), calling `fn`
// for each. The model must be allocated (loom_gpt2_alloc) with B >= 1; the context is the last
// m->max_T tokens. Returns the number of tokens generated.
int loom_generate(loom_gpt2 *m, int32_t *tokens, int n_prompt, int n_new, const loom_sampling *s,
                  loom_token_fn fn, void *ctx);
