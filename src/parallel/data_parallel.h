// Data parallelism over the ranks of a group: DDP with gradient buckets and ZeRO stages 1 and 2
// (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// SC'20; bucketing and overlap as PyTorch DDP, Li et al., VLDB'20).
//
// The flat gradient buffer is cut into buckets of about `bucket_mb` whose lengths are multiples
// of the world size W (only the last bucket may be ragged; it is padded through a staging
// buffer). Rank r owns piece r of every bucket; its "shard" is those pieces back to back. A
// bucket's reduce-scatter (average over ranks) starts during backward as soon as its last
// gradient is final (loom_gpt2.grads_ready calls loom_dp_grads_ready), overlapping the rest of
// backward. Then:
//   zero 0: the reduced pieces are all-gathered back into the full gradient buffer and every
//           rank updates every parameter (full AdamW state);
//   zero 1: each rank keeps AdamW state for its shard only, updates its pieces of the
//           parameters, and the parameters are all-gathered per bucket;
//   zero 2: as zero 1, and the gradients are reduced after every micro-batch into a shard
//           accumulator, so the full buffer holds one micro-batch only; zero 0 and 1 reduce
//           after the last micro-batch of the accumulation.
// All stages reduce with the same reduce-scatters and compute the gradient norm the same way
// (per rank piece, summed in rank order), so stages 0 and 1 give bit-identical weights; stage
// 2 sums micro-batches after the reduction instead of before, equal within rounding.
#pragma once
#include "backend/backend.h"
#include "comm/comm.h"
#include "model/gpt2_params.h"
#include "optim/adamw.h"

#include <stdbool.h>

typedef struct loom_dp loom_dp;

// comm reduces the backend's buffers (NCCL for GPU memory), host the same ranks' host values
// (the same group on the CPU). specs (nspecs) describe the flat buffers of num_elements
// (per_layer tensors have L layers). Errors: LOOM_EINVAL naming the value for a ZeRO stage
// outside 0..2, a bucket size <= 0, or more ranks than parameters; LOOM_ENOMEM.
loom_status loom_dp_create(loom_dp **out, loom_comm *comm, loom_comm *host, loom_backend *be,
                           const loom_param_spec *specs, int nspecs, int64_t num_elements, int zero,
                           double bucket_mb);
void loom_dp_free(loom_dp *dp);

// The optimizer's ranges over this rank's state, and the state's element count.
const loom_param_range *loom_dp_ranges(const loom_dp *dp, int *nranges);
int64_t loom_dp_state_elements(const loom_dp *dp);
int loom_dp_num_buckets(const loom_dp *dp);
int64_t loom_dp_bucket_elements(const loom_dp *dp); // the bucket length before the last

// Before micro-batch a of A writes its gradients into `grads` (the model's flat buffer).
void loom_dp_begin_micro_batch(loom_dp *dp, void *grads, int a, int A);
// The model's grads_ready hook (ctx = the loom_dp): starts the reductions of stage `stage`.
void loom_dp_grads_ready(void *ctx, int stage);
// After the micro-batch's backward: completes its reductions (zero 2: accumulates the shard and
// clears the full buffer). Errors: the first communication failure.
loom_status loom_dp_end_micro_batch(loom_dp *dp);
// After the last micro-batch: the reduced gradients the optimizer reads (indexed by state
// offset; *grads) and the global L2 norm of the averaged gradient (*norm).
loom_status loom_dp_reduced_grads(loom_dp *dp, void **grads, double *norm);
// After the optimizer step: all-gathers the updated parameter pieces (zero 1, 2).
loom_status loom_dp_gather_params(loom_dp *dp, void *params);
