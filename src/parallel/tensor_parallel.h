// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion
// Parameter Language Models Using Model Parallelism") with optional sequence parallelism
// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"):
// the communication behind a model's tensor-parallel points (model/hooks.h) over the ranks of
// one tp group. The model splits its layers by the parameter table's shard specs (column-
// parallel qkv and fc, row-parallel projections, a vocabulary-parallel embedding and output
// layer); this module moves the activations:
//   gather  without sequence parallelism the identity; with it, an all-gather of the rows
//   reduce  without: an all-reduce (sum); with: a reduce-scatter (sum) of the rows
//   crossentropy  vocabulary-parallel: each rank's (max, sum of exponentials, target logit) per
//           row are all-gathered and combined (backend crossentropy_partial / _combine /
//           _backward), so the (N, Vp) logits never meet on one rank
//   gather_vocab  a row of logits all-gathered on the host (sampling)
// With sequence parallelism the rows of the residual stream are split, so the gradients of the
// tensors used there (LayerNorm weights, the table's `sequence_parallel` tensors) cover each
// rank's rows only: a LOOM_HOOK_GRADS hook sums them over the tp group as soon as their layer's
// backward is done, on the micro-batches whose gradients are synchronised.
#pragma once
#include "backend/backend.h"
#include "comm/comm.h"
#include "model/hooks.h"
#include "model/param_table.h"

#include <stdbool.h>

typedef struct loom_tp loom_tp;

// dev moves the backend's buffers (NCCL, staged MPI or, on the CPU, the host group) and host
// the same ranks' host values; max_rows bounds the rows of one crossentropy call (the model's
// logits chunk). Errors: LOOM_ENOMEM for the scratch.
loom_status loom_tp_create(loom_tp **out, loom_comm *dev, loom_comm *host, loom_backend *be,
                           bool sequence_parallel, int max_rows);
void loom_tp_free(loom_tp *tp);
// Sets a model's points and adds (before any data-parallel hook) the hook that sums the
// sequence-parallel gradients; table and grads (its gradient views, table.count, read when the
// hook runs) are the model's.
void loom_tp_attach(loom_tp *tp, loom_tp_points *points, loom_hooks *hooks, const loom_param_table *table,
                    const loom_tensor *grads);
// Before a micro-batch: whether its gradients are synchronised after it (the sums then run).
void loom_tp_begin_micro_batch(loom_tp *tp, bool sync);
// The first communication failure since the last call (then cleared), or LOOM_OK.
loom_status loom_tp_error(loom_tp *tp);
