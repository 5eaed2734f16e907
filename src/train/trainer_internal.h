// Private to src/train: what trainer.c and step.c share.
#pragma once
#include "train/trainer.h"

// The model of the trainer as the pipeline executor drives it: micro-batch mb is loaded from
// t->batch(t->batch_ctx, t->batch_first + mb), each backward scaled by 1 / t->grad_accum.
loom_pp_model loom_train_pipeline_model(loom_trainer *t);
// The stage pipeline rank pp_rank holds: stage s of the schedule's S holds blocks
// [s L/S, (s+1) L/S); the whole model without a pipeline.
loom_stage loom_train_stage_of(const loom_trainer *t, const loom_gpt2_config *cfg, int pp_rank);
// The rows of each sequence this rank holds: T, or its T / cp under context parallelism.
static inline int loom_train_seq_rows(const loom_trainer *t) { return t->st.seq_len / t->mesh->size[LOOM_AXIS_CP]; }
// The parameter buffer the optimizer updates and its element count (*n, when n is not NULL):
// the model's flat buffer, or ZeRO 3's shard.
void *loom_train_params(const loom_trainer *t, int64_t *n);
