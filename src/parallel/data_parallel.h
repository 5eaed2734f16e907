// Data parallelism over the ranks of a group: DDP with gradient buckets and ZeRO stages 1-3
// (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// SC'20; bucketing and overlap as PyTorch DDP, Li et al., VLDB'20), optionally hybrid (HSDP).
//
// The flat gradient buffer is cut into buckets of about `bucket_mb` whose lengths are multiples
// of the world size W (only the last bucket may be ragged; it is padded through a staging
// buffer). Rank r owns piece r of every bucket; its "shard" is those pieces back to back. A
// bucket's reduce-scatter (average over ranks) starts during backward as soon as its last
// gradient is final (loom_dp_grads_ready is the model's LOOM_HOOK_GRADS hook, model/hooks.h),
// overlapping the rest of backward. Then:
//   zero 0: the reduced pieces are all-gathered back into the full gradient buffer, each
//           bucket's all-gather starting during backward, at the hook of the layer after the
//           one that started its reduce-scatter (the ragged last bucket's after backward), and
//           every rank updates every parameter (full AdamW state);
//   zero 1: each rank keeps AdamW state for its shard only, updates its pieces of the
//           parameters, and the parameters are all-gathered per bucket;
//   zero 2: as zero 1, and the gradients are reduced after every micro-batch into a shard
//           accumulator, so the full buffer holds one micro-batch only; zero 0 and 1 reduce
//           after the last micro-batch of the accumulation;
//   zero 3: as zero 2 with one bucket per unit (one layer's parameters: the embeddings, each
//           block, the final norm), whose gradient buffer belongs to the unit's owner
//           (parallel/fsdp.h: the parameters are sharded too and gathered unit by unit): each
//           unit's reduction runs during the next unit's backward and then hands its buffer
//           back; this rank's parameter pieces live in the owner's shard, which the optimizer
//           updates in place, so nothing is gathered after the step.
// Hybrid sharding (torch FSDP's HYBRID_SHARD; ZeRO 1-3): the group is one replica's shard
// ranks, and each reduced piece is then averaged over the `replicas` group (the ranks holding
// the same piece in the other replicas), so the optimizer state is sharded within a replica and
// replicated across replicas.
// All stages reduce with the same reduce-scatters and compute the gradient norm the same way
// (per rank piece, summed in rank order), so stages 0 and 1 give bit-identical weights; stage
// 2 sums micro-batches after the reduction instead of before, equal within rounding.
//
// The flat buffers are those of one parameter table (model/param_table.h): under tensor
// parallelism each tp rank runs its own data parallelism over the same-shard ranks of the
// other replicas, and the gradient norm counts only the tensors the table marks `counted`, so
// the caller sums it over the model-parallel ranks to count every parameter once.
#pragma once
#include "backend/backend.h"
#include "comm/comm.h"
#include "model/param_table.h"

#include <stdbool.h>

typedef struct loom_dp loom_dp;

// comm reduces the backend's buffers (NCCL for GPU memory), host the same ranks' host values
// (the same group on the CPU); replicas (device buffers; NULL or one rank: no hybrid sharding);
// table describes the flat buffers. Errors: LOOM_EINVAL naming the value for a ZeRO stage
// outside 0..3, a bucket size <= 0, more ranks than parameters, or replicas with ZeRO 0;
// LOOM_ENOMEM.
loom_status loom_dp_create(loom_dp **out, loom_comm *comm, loom_comm *host, loom_comm *replicas, loom_backend *be,
                           const loom_param_table *table, int zero, double bucket_mb);
void loom_dp_free(loom_dp *dp);
// What loom_dp_create would hold over W ranks (replicas: HSDP), without allocating: *buffers
// bytes of the backend's memory (loom_dp_memory_bytes) and the optimizer's *state_elements.
// Errors: those of loom_dp_create's argument checks.
loom_status loom_dp_plan(const loom_param_table *table, int W, bool replicas, loom_dtype dtype, int zero,
                         double bucket_mb, size_t *buffers, int64_t *state_elements);

// What loom_dp_slices and loom_dp_state_elements give shard rank R of W under ZeRO `zero` with
// buckets of bucket_len elements (loom_dp_bucket_elements: ZeRO 0-2), into a malloc'ed *slices:
// the layout of another run's optimizer state, for a checkpoint resumed in another layout
// (train/reshard.c). Errors: as loom_dp_create's argument checks.
loom_status loom_dp_layout(const loom_param_table *table, int W, int R, int zero, int64_t bucket_len,
                           loom_param_slice **slices, int *nslices, int64_t *state_elements);
// The slices of the flat buffers this rank's optimizer updates (zero 0: all of it; zero 1/2 its
// pieces) and where their state lies, and the state's element count.
const loom_param_slice *loom_dp_slices(const loom_dp *dp, int *nslices);
int64_t loom_dp_state_elements(const loom_dp *dp);
int loom_dp_num_buckets(const loom_dp *dp);
// Bytes of the backend's memory it holds: the gradient shard, its scratch and staging buffers.
size_t loom_dp_memory_bytes(const loom_dp *dp);
int64_t loom_dp_bucket_elements(const loom_dp *dp); // the bucket length before the last
// Whether the gradients are reduced after micro-batch a of A (zero 2 with several ranks, zero 3:
// every micro-batch; else the last), i.e. whether the buffer then holds this micro-batch's only.
bool loom_dp_syncs(const loom_dp *dp, int a, int A);

// ZeRO 3: bucket b's flat elements [start, start + len), each rank's piece (elements; rank r's
// at start + r x piece) and this rank's piece's offset in the shard buffers.
void loom_dp_bucket(const loom_dp *dp, int b, int64_t *start, int64_t *len, int64_t *piece, int64_t *shard_offset);
// The owner of the units' gradient buffers (ZeRO 3): grads(ctx, b) is unit b's (piece x W
// elements of be->dtype, zero beyond len) when its reduction starts; reduced(ctx, b) says the
// reduction is in the shard, so the buffer may go.
typedef struct {
    void *ctx;
    void *(*grads)(void *ctx, int bucket);
    void (*reduced)(void *ctx, int bucket);
} loom_dp_units;
void loom_dp_set_units(loom_dp *dp, loom_dp_units units);

// Before a micro-batch writes its gradients into `grads` (the model's flat buffer): whether it
// is the step's first and whether its gradients are reduced (loom_dp_syncs; a pipeline, whose
// micro-batches interleave, reduces once after all of them, as one micro-batch).
void loom_dp_begin_micro_batch(loom_dp *dp, void *grads, bool first, bool sync);
// The model's LOOM_HOOK_GRADS hook (ctx = the loom_dp): starts the reductions of the buckets
// whose gradients are all final once `layer`'s are.
void loom_dp_grads_ready(void *ctx, int layer);
// After the micro-batch's backward: completes its reductions (zero 2: accumulates the shard and
// clears the full buffer). Errors: the first communication failure.
loom_status loom_dp_end_micro_batch(loom_dp *dp);
// After the last micro-batch: the reduced gradients the optimizer reads (indexed by state
// offset; *grads) and the sum of squares of the averaged gradient over the counted tensors of
// this table (*sumsq, fp64, summed over the data-parallel ranks in rank order).
loom_status loom_dp_reduced_grads(loom_dp *dp, void **grads, double *sumsq);
// The same when nothing is reduced (one rank, no replicas, ZeRO 0-2), without waiting for the
// backend (a recorded step): *grads, and the sum of squares added to *sumsq (fp64, backend memory,
// 0 before) by the backend (sumsq_add), the same additions in the same order as
// loom_dp_reduced_grads's on the host, so the same bits.
void loom_dp_local_grads(loom_dp *dp, void **grads, double *sumsq);
// After the optimizer step: starts the all-gathers of the updated parameter pieces into params
// (zero 1, 2, bucket by bucket in flat order; zero 3 gathers each unit when it is used) and
// returns without waiting, so that they run under the next forward (as Megatron-LM's
// distributed optimizer overlaps its parameter all-gather): loom_dp_params_ready, the model's
// LOOM_HOOK_FORWARD hook, waits for the buckets holding a tensor of that layer or an earlier
// one (with NCCL the compute stream waits; the host does not). Whatever reads the parameters
// outside a forward calls loom_dp_wait_params first. Errors: the first communication failure.
loom_status loom_dp_gather_params(loom_dp *dp, void *params);
void loom_dp_params_ready(void *ctx, int layer);
// Waits for every parameter all-gather in flight. Errors: the first communication failure,
// also of a wait in loom_dp_params_ready.
loom_status loom_dp_wait_params(loom_dp *dp);
