// Private to src/train: what trainer.c and step.c share.
#pragma once
#include "train/trainer.h"

// The model of the trainer as the pipeline executor drives it: micro-batch mb is loaded from
// t->batch(t->batch_ctx, t->batch_first + mb), each backward scaled by 1 / t->grad_accum.
loom_pp_model loom_train_pipeline_model(loom_trainer *t);
// The stage pipeline rank pp_rank holds: stage s of the schedule's S holds blocks
// [s L/S, (s+1) L/S); the whole model without a pipeline.
loom_stage loom_train_stage_of(const loom_trainer *t, const loom_gpt2_config *cfg, int pp_rank);
// The same for any pipeline: pp ranks of V stages each, V-shaped or looped (pp 1, V 1: the whole
// model).
loom_stage loom_train_stage_at(const loom_gpt2_config *cfg, int pp, int V, bool v_shape, int pp_rank);
// The rows of each sequence this rank holds: T, or its T / cp under context parallelism.
static inline int loom_train_seq_rows(const loom_trainer *t) { return t->st.seq_len / t->mesh->size[LOOM_AXIS_CP]; }
// The parameter buffer the optimizer updates and its element count (*n, when n is not NULL):
// the model's flat buffer, or ZeRO 3's shard.
void *loom_train_params(const loom_trainer *t, int64_t *n);
// Where config c keeps the AdamW state (--offload optimizer, and params with it).
static inline loom_adamw_offload loom_train_adamw_offload(const loom_train_config *c) {
    return c->offload_params ? LOOM_ADAMW_OFFLOAD_PARAMS : c->offload_optimizer ? LOOM_ADAMW_OFFLOAD_STATE
                                                                                 : LOOM_ADAMW_ON_DEVICE;
}
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

// ---- a checkpoint of other data-parallel degrees (reshard.c) ----
// Whether the checkpoint in t->st was saved over other data-parallel degrees than this run's:
// ranks, ZeRO stage, replicas (HSDP), bucket size (the model-parallel layout, micro-batch and
// global batch being the same: trainer.c checks them first).
bool loom_train_reshards(const loom_trainer *t);
// This rank's optimizer state for its loom_dp_slices (m, v and, when master is not NULL, the
// master weights: loom_dp_state_elements each, zero outside the slices) from the checkpoint's
// state files of the shard ranks that held this rank's model shard; *has_master when they all
// had master weights; the FP8 scaling state into *fp8 (malloc'ed, *fp8_n values) as
// loom_ckpt_load_state gives it. Prints a note on rank 0. Errors: those of loom_ckpt_load_state
// for any of the files read; those of loom_dp_layout.
loom_status loom_train_load_resharded(const loom_trainer *t, float *m, float *v, float *master, bool *has_master,
                                      float **fp8, int64_t *fp8_n);

// ---- the step's parts that step.c and step_graph.c share ----
// The index in the data order of this rank's first micro-batch of step t->st.step.
uint64_t loom_train_first_micro_batch(const loom_trainer *t);
// loom_train_step launched op by op: loom_train_backward, then loom_train_update or, when the
// loss or the norm is not finite, loom_train_skip (out->skipped).
loom_status loom_train_step_ops(loom_trainer *t, loom_batch_fn batch, void *ctx, loom_step_result *out);
// FP8 around a step's micro-batches (with be->fp8; nothing otherwise): loom_train_fp8_begin
// waits for the parameters' all-gather in flight (ZeRO 1/2), zeroes delayed scaling's slot amaxes
// (casts outside training, an evaluation's or a sample's, count for nothing) and has the step's
// FP8 weights made (loom_gpt2_fp8_weights; under either recipe); loom_train_fp8_end takes the
// amaxes' max over the data-parallel ranks (which then scale alike, as one rank running all their
// micro-batches would) and rolls them into the histories, and the weights' copies go stale.
// Errors: those of the gather's wait and of the all-reduce.
loom_status loom_train_fp8_begin(loom_trainer *t);
loom_status loom_train_fp8_end(loom_trainer *t);
// After step t->st.step's update ran (loom_train_update's, or a replay's): its loss kept, and
// t->st past the step and its data.
void loom_train_updated(loom_trainer *t, const loom_step_result *r);

// ---- --cuda-graphs: the whole step recorded once and replayed (step_graph.c) ----
typedef struct loom_step_graph loom_step_graph;
// The recording's buffers for t's step: in host_alloc memory each micro-batch's tokens, the
// step's scalars and per-token losses; on the backend the scalars and losses. Errors: LOOM_ENOMEM.
loom_status loom_step_graph_create(loom_step_graph **out, loom_trainer *t);
void loom_step_graph_free(loom_step_graph *g, loom_backend *be);
// loom_train_step with t->graph: the first step op by op (loom_train_step_ops), each later one
// replayed (recorded first when there is no valid recording), its loss and norm read back once
// after it; the same results, skips and bookkeeping as loom_train_step_ops, to the bit.
loom_status loom_step_graph_step(loom_trainer *t, loom_batch_fn batch, void *ctx, loom_step_result *out);
