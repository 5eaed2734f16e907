// Shared by the tests that build trainers on the CPU (tests/train, tests/parallel/test_fsdp.c): a
// small GPT-2's training configuration and a batch function of random tokens. Each test program
// includes it once.
#pragma once
#include "core/rng.h"
#include "train/trainer.h"

enum { TRAIN_B = 2, TRAIN_T = 16, TRAIN_V = 64 }; // micro-batch, sequence length, vocabulary

// Micro-batch `index` of the data order: (TRAIN_B, TRAIN_T) tokens and targets in [0, TRAIN_V)
// from the counter-based RNG, the same at every call.
static void t_random_batch(void *ctx, uint64_t index, int32_t *inputs, int32_t *targets) {
    uint64_t n = TRAIN_B * TRAIN_T;
    for (uint64_t i = 0; i < n; i++) {
        inputs[i] = (int32_t)loom_rng_below(5, 1, index * n + i, TRAIN_V);
        targets[i] = (int32_t)loom_rng_below(5, 2, index * n + i, TRAIN_V);
    }
}

// gpt2-mini cut to L blocks of C channels (2 heads) and a vocabulary of TRAIN_V (padded to 128),
// trained on the CPU in fp32 (one thread) on micro-batches of TRAIN_B x TRAIN_T, `global`
// sequences a step: AdamW with betas 0.9 and 0.95, weight decay 0.1 and clipping at norm 1, at
// the learning rates of `lr`.
static inline loom_train_config t_train_config(int L, int C, int global, loom_lr_schedule lr) {
    loom_train_config c = {.batch = TRAIN_B, .seq = TRAIN_T, .global_batch = global, .tp = 1, .pp = 1, .cp = 1,
                           .dp_replicate = 1, .bucket_mb = 25, .seed = 7,
                           .adamw = {.lr = lr.max_lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                     .grad_clip = 1.0f},
                           .lr = lr, .device = "cpu", .precision = "fp32", .device_comm = "mpi", .threads = 1};
    LOOM_CHECK(loom_gpt2_config_named("gpt2-mini", &c.model) == LOOM_OK);
    c.model.num_layers = L, c.model.channels = C, c.model.num_heads = 2, c.model.max_seq_len = TRAIN_T;
    c.model.vocab_size = TRAIN_V, c.model.padded_vocab_size = 128;
    return c;
}
