// Fully sharded data parallelism: the parameters of ZeRO stage 3 (Rajbhandari et al., SC'20;
// PyTorch FSDP, Zhao et al., VLDB'23, whose FSDP2 fully_shard this follows).
//
// The model's parameters are cut into units, one layer each (the embeddings, every block, the
// final norm: the data-parallel buckets of ZeRO 3, parallel/data_parallel.h), and each rank
// keeps only its piece of every unit (`shard`, the buffer the optimizer updates; fp32 master
// weights, when the backend computes in bf16, stay in the optimizer as FSDP2's
// MixedPrecisionPolicy keeps them). The whole model is never resident:
//   before a unit's forward (LOOM_HOOK_FORWARD) its pieces are all-gathered into a unit buffer
//   and the next unit's gather is started (prefetch); before its backward (LOOM_HOOK_BACKWARD)
//   the same, prefetching the previous unit, and a zeroed gradient buffer is attached;
//   at most two block units are gathered at once: gathering another frees the least recently
//   used (FSDP's reshard after forward); the embedding and final-norm units stay gathered from
//   their first use to the end of the step (the tied output layer reads the embedding, as
//   FSDP2 keeps its root module), with their gradient buffers;
//   the gradient buffer of a unit is reduce-scattered into the gradient shard by the data
//   parallelism once it is final and handed back (loom_dp_units).
// With offload_params (ZeRO-Infinity's parameter offload to host memory, Rajbhandari et al.,
// SC'21) the shard lives in host memory (be->host_alloc) and each piece is copied to the device
// when its unit is gathered (on the backend's side stream, ahead of use when prefetched); the
// optimizer then updates the shard in host memory (optim/adamw.h's LOOM_ADAMW_OFFLOAD_PARAMS).
// Unit buffers are pieces x ranks elements (the last rank's piece padded with zeros) and are
// reused from a pool of freed buffers. The model's parameter and gradient views (loom_gpt2.p,
// .g) point into the gathered buffers while a unit is resident and are NULL otherwise.
#pragma once
#include "backend/backend.h"
#include "comm/comm.h"
#include "model/hooks.h"
#include "model/param_table.h"
#include "parallel/data_parallel.h"

typedef struct loom_fsdp loom_fsdp;

// Over the units of `dp` (created with ZeRO 3 over `comm`, the device group it shards over) of
// the model whose table, parameter and gradient views (table->count each) and hooks are given;
// layers -1 and num_layers are the pinned units; the shard in host memory with offload_params.
// Adds its hooks and becomes dp's unit owner. Errors: LOOM_ENOMEM for the shard or the first
// unit buffers.
loom_status loom_fsdp_create(loom_fsdp **out, loom_dp *dp, loom_comm *comm, loom_backend *be,
                             const loom_param_table *table, int num_layers, loom_tensor *params, loom_tensor *grads,
                             loom_hooks *hooks, bool offload_params);
void loom_fsdp_free(loom_fsdp *f);
// Bytes of unit buffers loom_fsdp_create reserves over W ranks for the model of `table` (what a
// step without a pipeline holds at most), without allocating.
size_t loom_fsdp_plan_units(const loom_param_table *table, int num_layers, int W, loom_dtype dtype);
// This rank's pieces of every unit (shard_n elements of be->dtype, laid out as the optimizer
// state: parallel/data_parallel.h's shard offsets); host memory with offload_params.
void *loom_fsdp_shard(const loom_fsdp *f);
int64_t loom_fsdp_shard_elements(const loom_fsdp *f);
// Sets the shard from the whole flat parameters (host fp32, table order, table->num_elements).
void loom_fsdp_set_params(loom_fsdp *f, const float *flat);
// The whole flat parameters (host fp32, table order) gathered unit by unit. Collective over the
// group. Errors: the first communication failure.
loom_status loom_fsdp_gather_params(loom_fsdp *f, float *flat);
// Frees every gathered unit and gradient buffer (after the optimizer updated the shard, or after
// an evaluation).
void loom_fsdp_reshard(loom_fsdp *f);
// The first communication failure in a hook since the last call (then cleared), or LOOM_OK.
loom_status loom_fsdp_error(loom_fsdp *f);
// Bytes of unit buffers (gathered parameters and gradients, in use or pooled): now and at most.
void loom_fsdp_memory(const loom_fsdp *f, size_t *now, size_t *peak);
