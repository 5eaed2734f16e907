// `loom train` flags: the run's configuration, parsed and checked before anything is written.
#pragma once
#include "core/status.h"
#include "train/trainer.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    loom_train_config run;     // what the trainer takes (batch, mesh, ZeRO, optimizer, device ...)
    // model: a named config with overrides (run.init: an llm.c model file instead)
    const char *model;
    int layers, heads, channels, max_seq, vocab;
    // data
    const char *train_data, *val_data;
    bool shuffle;
    // optimisation
    int64_t steps;
    const char *schedule;
    int warmup;
    float min_lr;
    int64_t seed;
    // evaluation, samples, checkpoints, logging
    int val_every, val_batches, sample_every, sample_tokens, ckpt_every;
    const char *ckpt_dir, *metrics;
    const char *plot, *tensorboard; // --plot FILE.png|svg (redrawn from --metrics), --tensorboard DIR
    float peak_tflops;              // per device, for MFU (0: the GPU default, none on the cpu)
    bool resume;
    bool skip_nonfinite;   // skip steps whose loss or gradient norm is not finite (else: stop)
    const char *recompute; // activation recomputation: none, gelu, full
    const char *offload;   // what lives in host memory: "" or a comma list (optimizer, params, activations)
    float bucket_mb;       // gradient bucket size
    int dp;                // derived: data-parallel ranks = world / (tp pp cp)
} train_options;

// Parses and validates argv for a run on `world_size` ranks. *help is set when --help was
// given. Errors: LOOM_EINVAL with a message naming the flag and value (e.g. a global batch that
// does not divide by data-parallel ranks x micro-batch, or ranks that do not fill the mesh);
// LOOM_EUNSUPPORTED for sampling during training with --pp or --cp above 1.
loom_status train_options_parse(train_options *o, int argc, char **argv, int world_size, bool *help);

// --offload LIST (comma-separated: optimizer, params, activations) into run->offload_*; call it
// after run->zero is set. Errors: LOOM_EINVAL for an unknown item, params without --zero 3 and
// the offloaded optimizer, or stochastic rounding with an offloaded optimizer.
loom_status train_offload_parse(const char *offload, loom_train_config *run);
