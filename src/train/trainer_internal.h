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
// Whether the schedule splits pipeline rank `rank`'s backward into its input and weight halves.
bool loom_train_splits_backward(const loom_pp_schedule *s, int rank);
// Refuses, before anything is allocated, a run whose memory plan (plan.c) does not fit in the
// backend's free memory (shared by the ranks on one device) or the host's, naming the flags that
// would make it fit. LOOM_DEVICE_MEMORY_GIB=X in the environment plans for a device with X GiB
// free. Errors: LOOM_ENOMEM with the plan, the free memory and the alternatives; those of the
// plan's model layout.
loom_status loom_train_check_memory(const loom_trainer *t, const loom_gpt2_config *cfg);
// The sizes a run's memory is made of, bytes per rank: the model's parameters (one copy), data
// parallelism's buffers, the AdamW state, ZeRO 3's shard and unit buffers, the activations (with
// context parallelism's buffers) and the offloaded ones.
typedef struct {
    size_t params, dp, state, shard, units, activations, activations_host;
} loom_train_parts;
// The memory report of those parts under config c (what lives on the backend, what is offloaded):
// the one formula of the plan (plan.c) and of the memory held (loom_trainer_memory).
loom_train_memory loom_train_memory_of(const loom_train_config *c, const loom_train_parts *p);
