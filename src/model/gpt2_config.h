// GPT-2 model configurations (Radford et al. 2019, "Language Models are Unsupervised
// Multitask Learners"; hyper-parameters of the released 124M..1.5B models).
#pragma once
#include "core/status.h"

#include <stdint.h>

typedef struct {
    int max_seq_len;       // maxT: positions the model has embeddings for
    int vocab_size;        // V: real vocabulary (50257 for GPT-2's BPE)
    int padded_vocab_size; // Vp: V rounded up to a multiple of 128 (padded rows are unused)
    int num_layers;        // L
    int num_heads;         // NH
    int channels;          // C (C % NH == 0; head size hs = C / NH)
} loom_gpt2_config;

// Fills *cfg for a named config: "gpt2-mini" (the CPU demo's default, 4 layers, 128 channels),
// "gpt2" (124M), "gpt2-medium" (350M), "gpt2-large" (774M), "gpt2-xl" (1.5B); all with the GPT-2
// vocabulary. Errors: LOOM_EINVAL for an unknown name (the hint lists the names).
loom_status loom_gpt2_config_named(const char *name, loom_gpt2_config *cfg);
// Checks a config is usable: every dim positive, C % NH == 0, V <= Vp. Errors: LOOM_EINVAL
// naming the bad value.
loom_status loom_gpt2_config_validate(const loom_gpt2_config *cfg);
// V rounded up to a multiple of 128.
int loom_pad_vocab(int V);
// Elements of the model file's parameters (llm.c order, vocabulary padding included).
int64_t loom_gpt2_file_elements(const loom_gpt2_config *cfg);
// Parameter count without the vocabulary padding (the usual "124M" figure counts tied wte once).
int64_t loom_gpt2_num_params(const loom_gpt2_config *cfg);
// Training FLOPs per token: 6 N + 6 L T C (Kaplan et al. 2020; PaLM appendix B), N without
// the embedding padding, T the sequence length trained on.
double loom_gpt2_flops_per_token(const loom_gpt2_config *cfg, int T);
