// The training step as a library (DESIGN.md, src/train): a trainer owns one rank's share of a
// run — the device mesh, the backend, its model shard, tensor and data parallelism and the
// optimizer — and runs optimizer steps, evaluations and checkpoints. `loom train` and
// `loom bench` both drive it; the CLI parses, prints and calls.
//
// A step over the global batch (G sequences of B x T tokens), on a rank with data-parallel
// index d of D and A = G / (D B) micro-batches:
//   for a in 0..A-1:   micro-batch index step x G/B + d x A + a of the data order (every rank of
//                      a tensor-parallel group reads the same; with cp > 1 each rank of a
//                      context-parallel group keeps its two chunks of every sequence); forward
//                      and backward, the gradient reductions starting from the model's hooks
//   with pp > 1:       the A micro-batches run through the pipeline schedule's actions instead
//                      (parallel/pipeline.h); then the tied embedding's two copies' gradients
//                      are summed over the embedding group and the gradients are reduced once
//   loss:              the last stage's, averaged over the data-parallel (x context-parallel) ranks
//   gradient norm:     summed over data-parallel pieces and model-parallel ranks, each parameter
//                      once; clipping by it
//   AdamW on this rank's state, the updated parameters gathered (ZeRO 1/2; ZeRO 3 keeps them
//                      sharded and gathers each unit when it is next used)
// so a run computes the same mathematics on every mesh (DESIGN principle 2).
#pragma once
#include "backend/backend.h"
#include "ckpt/checkpoint.h"
#include "comm/comm.h"
#include "model/gpt2.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "parallel/context_parallel.h"
#include "parallel/data_parallel.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"

#include <stdbool.h>

// The delayed FP8 recipe's default amax history, steps (Transformer Engine's default is longer,
// 1024; a short one lets the scales follow the early steps' fast-changing activations)
#define LOOM_FP8_HISTORY 16

typedef struct {
    loom_gpt2_config model;  // the architecture of a fresh run (ignored with init or a resume)
    const char *init;        // an llm.c model file to start from, or NULL
    int batch, seq;          // micro-batch B (sequences) and sequence length T (0: the model's maximum)
    int global_batch;        // sequences per optimizer step over all data-parallel ranks
    int tp, pp, cp;          // mesh degrees (dp is what the world leaves)
    const char *cp_style;    // with cp > 1: "ring" (NULL) or "ulysses" (parallel/context_parallel.h)
    int dp_replicate;        // hybrid sharding: dp in this many replicas, sharded within each (0 or 1: none)
    const char *pp_schedule; // with pp > 1: parallel/pipeline_schedule.h's names (NULL: "1f1b")
    int virtual_stages;      // stages per rank of the interleaved schedule (0: the schedule's own)
    bool sp;                 // sequence parallelism over the tp ranks
    int zero;                // ZeRO stage 0, 1, 2, 3
    double bucket_mb;        // gradient bucket size (MiB)
    loom_recompute recompute;
    bool offload_optimizer;  // AdamW state in host memory, stepped on the host's cores (ZeRO-Offload)
    bool offload_params;     // ZeRO 3's parameter shard in host memory (with offload_optimizer)
    bool offload_activations; // the blocks' saved activations in host memory (model/gpt2.h)
    bool cuda_graphs;        // each step replayed as one recorded CUDA graph (one rank; train/step_graph.c)
    bool gemm_autotune;      // matmul algorithms by measurement (backend.h's gemm_autotune; a GPU)
    int logits_chunk;        // rows of the output layer at a time (model/gpt2.h; 0: the backend's chunk_bytes)
    loom_adamw_config adamw;
    loom_lr_schedule lr;
    uint64_t seed;           // initialisation, shuffling, sampling, stochastic rounding
    const char *device, *precision; // loom_backend_open's names
    const char *fp8_recipe;  // with precision fp8: "tensorwise" (NULL) or "delayed" (backend.h's fp8_history)
    int fp8_history;         // the delayed recipe's amax history, steps (0: LOOM_FP8_HISTORY)
    bool fp8_fast_dgrad;     // FP8 input-gradient products with fast accumulation (backend.h's fp8_fast_dgrad)
    const char *device_comm; // "nccl" or "mpi" (staged through the host) for GPU buffers
    int threads;             // CPU threads (0: the host's cores shared among its ranks)
    const char *resume;      // a checkpoint folder to continue from (its newest step), or NULL
} loom_train_config;

// Writes micro-batch `index` of the data order: inputs, targets (B,T) int32, host memory.
typedef void (*loom_batch_fn)(void *ctx, uint64_t index, int32_t *inputs, int32_t *targets);

typedef struct {
    loom_train_config cfg;
    loom_comm *world;          // every rank of the run (not owned)
    loom_mesh *mesh;
    loom_backend *be;
    loom_gpt2 *model;          // this rank's stage and tensor-parallel shard
    loom_tp *tp;               // tensor parallelism (NULL with tp 1)
    loom_cp *cp;               // context parallelism (NULL with cp 1)
    loom_batch_fn cp_data;     // with cp: the data the step's batch function wraps
    void *cp_data_ctx;
    loom_pp_schedule *schedule; // pipeline parallelism (both NULL with pp 1)
    loom_pp *pipe;
    int pp_rank;               // this rank's pipeline stage
    loom_dp *dp;               // data parallelism over the same shard of the other replicas
    loom_fsdp *fsdp;           // ZeRO 3: the sharded parameters (NULL otherwise)
    loom_adamw *opt;           // over this rank's state
    int dp_rank, dp_size, grad_accum; // grad_accum: micro-batches per rank and step
    loom_train_state st;       // step, data position, layout; resumed or fresh
    int32_t *inputs, *targets; // (B,T) host
    loom_batch_fn batch;       // where the pipeline loads micro-batch mb: batch(ctx, first + mb)
    void *batch_ctx;
    uint64_t batch_first;
    void *reduced;             // the averaged gradients of the last backward (optimizer-state order)
    bool timed;                // synchronise to time the step's phases
    double time_opt;           // seconds of the last step's update (when timed; 0 for a replayed step,
                               // which is one)
    double time_wait;          // seconds of the last step this rank spent in the loss's all-reduce over
                               // the data- and context-parallel ranks, after its own micro-batches
                               // had finished: its wait for the slowest rank (0 on one rank)
    struct loom_step_graph *graph; // cuda_graphs: the step's recording (train/step_graph.c; else NULL)
} loom_trainer;

// One rank's share of a run: mesh, backend (openmp threads), model (fresh from cfg->init or
// cfg->model and cfg->seed, or resumed from cfg->resume's newest checkpoint, if any), tensor
// and data parallelism, optimizer. Collective over world; cfg->global_batch (0: dp x batch)
// must divide by dp x batch. Errors, agreed across ranks (*report is true on the one rank that
// should print): e.g. LOOM_EINVAL for a layout that cannot work or a checkpoint made on another
// mesh or batch layout; *out is then NULL.
loom_status loom_trainer_create(loom_trainer **out, loom_comm *world, const loom_train_config *cfg, bool *report);
void loom_trainer_free(loom_trainer *t);

typedef struct {
    double loss, norm; // the global mean loss and the gradient norm before clipping
    float lr;
    bool skipped;      // loom_train_step: the loss or the norm was not finite, so no update
} loom_step_result;

// Optimizer step t->st.step over the global batch: loom_train_backward, then loom_train_update,
// or loom_train_skip when the loss or the gradient norm is not finite (out->skipped). With
// cfg.cuda_graphs the step from the second on is one replayed recording (train/step_graph.c),
// with the same results to the bit. Errors: a communication failure (the same on every rank).
loom_status loom_train_step(loom_trainer *t, loom_batch_fn batch, void *ctx, loom_step_result *out);
// Its halves: the micro-batches' forward and backward with the gradient reductions (after it,
// t->reduced holds the averaged gradients the update reads; with ZeRO 0 that is the model's
// whole gradient buffer), the global loss, norm and learning rate; then the update of this
// rank's state, the parameters gathered, and t->st advanced.
loom_status loom_train_backward(loom_trainer *t, loom_batch_fn batch, void *ctx, loom_step_result *out);
loom_status loom_train_update(loom_trainer *t, const loom_step_result *r);
// Instead of the update (after loom_train_backward, on every rank): the step is skipped — no
// parameter or moment changes — and t->st advances past it and its data (a step whose loss or
// gradient norm is not finite, skipped as llm.c skips loss spikes; resume stays exact).
void loom_train_skip(loom_trainer *t);
// Mean loss over micro-batches 0..n-1 of `batch` (data-parallel rank d takes d, d + D, ...).
loom_status loom_train_eval(loom_trainer *t, loom_batch_fn batch, void *ctx, int n, double *loss);
// Saves step t->st.step into dir on every rank (model file gathered to rank 0, each rank's
// optimizer state, the metadata last). Errors: agreed across ranks (*report is true on the one
// rank that should print).
loom_status loom_trainer_save(loom_trainer *t, const char *dir, bool *report);

// Memory per rank, bytes.
typedef struct {
    size_t params_grads; // on the backend: parameters and gradients, with data parallelism's
                         // gradient shard and scratch, ZeRO 3's shard and unit buffers (at most)
    size_t activations;  // on the backend
    size_t optimizer;    // AdamW state (moments, master weights) on the backend; 0 when offloaded
    size_t offloaded;    // in host memory: AdamW state, ZeRO 3's parameter shard, activations
} loom_train_memory;
void loom_trainer_memory(const loom_trainer *t, loom_train_memory *mem);
// The same figures planned from the configuration alone (train/plan.c: what the trainer checks
// against free memory before allocating). Errors: those of the plan's model layout.
loom_status loom_trainer_plan(const loom_trainer *t, loom_train_memory *plan);
