// `loom train` flags: the run's configuration, parsed and checked before anything is written.
#pragma once
#include "core/status.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    // model
    const char *model, *init;  // named config, or an llm.c model file to start from
    int layers, heads, channels, max_seq;
    // data and batch
    const char *train_data, *val_data;
    int batch, seq, global_batch; // micro-batch B, sequence T, sequences per optimizer step
    int grad_accum;               // derived: global_batch / (world size * batch), per rank
    bool shuffle;
    // optimisation
    int64_t steps;
    loom_adamw_config adamw;
    const char *schedule;
    loom_lr_schedule lr;
    int warmup;
    float min_lr;
    int64_t seed;
    // evaluation, samples, checkpoints, logging
    int val_every, val_batches, sample_every, sample_tokens, ckpt_every;
    const char *ckpt_dir, *metrics;
    bool resume;
    // execution and parallelism
    const char *device, *precision;
    int threads;
    int zero;        // ZeRO stage 0, 1, 2
    const char *recompute; // activation recomputation: none, gelu, full
    float bucket_mb; // gradient bucket size
} train_options;

// Parses and validates argv for a run on `world_size` data-parallel ranks. *help is set when
// --help was given. Errors: LOOM_EINVAL with a message naming the flag and value (e.g. a global
// batch that does not divide by world size x micro-batch).
loom_status train_options_parse(train_options *o, int argc, char **argv, int world_size, bool *help);
