// Training checkpoints: everything `loom train --resume` needs to continue a run so that its
// losses and final weights are bit-identical to an uninterrupted run. For step S, in the
// checkpoint folder:
//   model_S.bin          parameters, an llm.c model file (version 3, fp32) — also usable alone
//                        with `loom eval` / `loom sample` / `loom train --init`
//   state_S_R.bin        rank R's optimizer shard: header of 32 int64 (magic 20241122, version 1,
//                        rank, world size, step, elements, data position, seed), then the AdamW
//                        first and second moments (fp32 each)
//   ckpt_S.json          metadata (step, world size, files, model config, batch layout, seed,
//                        data position), written LAST: its presence marks the checkpoint complete
// (S as 8 digits, R as 5). Every file is written atomically (core/fileio.h), so a kill during a
// save leaves the previous checkpoint loadable; resume takes the newest step with metadata.
#pragma once
#include "model/gpt2_config.h"

#include <stdint.h>

enum { LOOM_STATE_MAGIC = 20241122 };

typedef struct {
    int64_t step;          // optimizer steps completed
    int64_t data_position; // micro-batches of the training stream consumed
    uint64_t seed;         // run seed (initialisation, shuffle, sampling)
    int micro_batch, seq_len, grad_accum, world_size; // the batch layout, checked at resume
    double train_loss;     // loss of the last step
} loom_train_state;

// Saves step st->step (single rank). Errors: LOOM_EIO naming the file that failed.
loom_status loom_ckpt_save(const char *dir, const loom_train_state *st, const loom_gpt2_config *cfg,
                           const float *params, const float *m, const float *v, int64_t n);
// Newest complete checkpoint in `dir`; *step = -1 when there is none. Errors: LOOM_EIO when
// `dir` cannot be read.
loom_status loom_ckpt_latest(const char *dir, int64_t *step);
// Loads step `step`: state, model config, parameters and moments (malloc'ed, *n elements each).
// Errors: LOOM_EIO / LOOM_EFORMAT naming the file and the disagreement.
loom_status loom_ckpt_load(const char *dir, int64_t step, loom_train_state *st,
                           loom_gpt2_config *cfg, float **params, float **m, float **v, int64_t *n);
