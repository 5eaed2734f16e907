// Context parallelism: every sequence of a micro-batch is split over the cp ranks of a group for
// the whole model; only attention needs the tokens of other ranks, and this module supplies it
// through the model's context-parallel points (model/hooks.h).
//
// Layout ("zigzag", the causal load balance of Megatron-LM's and torchtitan's context
// parallelism): a sequence of T tokens is cut into 2 cp chunks of Tc = T / (2 cp) tokens, and
// rank i holds chunks i and 2cp-1-i, so that every rank has the same causal work. The rank's
// T / cp rows per sequence are its two chunks as two blocks of (B, Tc) rows (loom_cp_take_chunks
// lays out its micro-batch's tokens and targets so).
//
// Styles:
//   ring (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): the rank's queries meet
//       its own keys/values, then the cp-1 other ranks' as they travel around the ring by
//       send/recv, the transfer of the next overlapping the attention of the current; the
//       partial results merge by their log-sum-exp (backend attention_merge); pairs of chunks
//       wholly in the causal future are skipped. Backward: the keys/values travel around again
//       with their gradients, which each rank adds to and which arrive at their owner after cp
//       steps (the transfer of the gradients of one step overlaps the next step's attention).
//   ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses"): an all-to-all turns the sequence-split
//       q, k, v into head-split whole sequences (NH / cp heads each), the backend's causal
//       attention runs on them, and an all-to-all turns the output back; the backward redoes the
//       forward's all-to-alls of q, k, v and out (nothing head-split is kept between the passes)
//       and sends the gradient back the same way. Needs the heads (per tensor-parallel rank) to
//       divide by cp.
// Gradients of every parameter are then partial sums over the rank's tokens: data parallelism
// averages them over dp x cp (the mesh's shard group), and the loss is averaged over the same.
#pragma once
#include "backend/backend.h"
#include "comm/comm.h"
#include "model/hooks.h"

#include <stdint.h>

typedef enum { LOOM_CP_RING, LOOM_CP_ULYSSES } loom_cp_style;
typedef struct loom_cp loom_cp;

// "ring" or "ulysses". Errors: LOOM_EINVAL naming the unknown style.
loom_status loom_cp_style_parse(const char *name, loom_cp_style *style);
const char *loom_cp_style_name(loom_cp_style style);

// Context parallelism over `dev` (device buffers of be: NCCL, staged MPI, or on the CPU the host
// group) for micro-batches of B sequences of T tokens, attention of this rank's NH heads of C
// channels (its tensor-parallel shard). Errors: LOOM_EINVAL when T does not split into 2 x cp
// chunks or, with Ulysses, NH does not divide by cp; LOOM_ENOMEM for the scratch.
loom_status loom_cp_create(loom_cp **out, loom_comm *dev, loom_backend *be, loom_cp_style style, int B, int T, int C,
                           int NH);
void loom_cp_free(loom_cp *cp);
// Sets a model's context-parallel points (before loom_gpt2_alloc, which sizes for T / cp).
void loom_cp_attach(loom_cp *cp, loom_cp_points *points);
// In place: host int32 tokens (B,T) of a micro-batch (its inputs or targets) become this rank's
// two chunks, (2, B, Tc) in the first B T / cp entries.
void loom_cp_take_chunks(loom_cp *cp, int32_t *tokens);
// Bytes of the backend's memory it holds (the travelling keys/values and gradients, or the
// all-to-all buffers and head-split tensors).
size_t loom_cp_memory_bytes(const loom_cp *cp);
// The same bytes for P cp ranks, without allocating (the memory plan, train/plan.c).
size_t loom_cp_plan_bytes(loom_cp_style style, int P, int B, int T, int C, int NH, loom_dtype dtype);
// The first communication failure since the last call (then cleared), or LOOM_OK.
loom_status loom_cp_error(loom_cp *cp);
