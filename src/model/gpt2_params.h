// GPT-2's parameters in two orders:
//
// The llm.c model file's tensor list (the file order), per-layer tensors stacked on a leading
// L dim:
//   wte (Vp,C)  wpe (maxT,C)  ln1w ln1b (L,C)  qkvw (L,3C,C) qkvb (L,3C)  attprojw (L,C,C)
//   attprojb (L,C)  ln2w ln2b (L,C)  fcw (L,4C,C) fcb (L,4C)  fcprojw (L,C,4C) fcprojb (L,C)
//   lnfw lnfb (C)
//
// The parameter table of one rank (model/param_table.h), layer-major: wte, wpe (first stage),
// then each block's 12 tensors (its four matrices, which AdamW decays, then its LayerNorm
// weights and biases, so each kind is one contiguous range), then lnfw, lnfb (last stage),
// each sharded
// over tensor-parallel ranks as Megatron-LM splits GPT (Shoeybi et al. 2019): qkvw, qkvb by
// output rows (3 chunks, so a rank holds whole heads of q, k and v), fcw, fcb by output rows,
// attprojw and fcprojw by input columns (row-parallel; their biases replicated and added once),
// wte by vocabulary rows (the embedding and the tied output layer), the rest replicated.
//
// Initialisation follows GPT-2 (and llm.c's train_gpt2.py): weights N(0, 0.02), residual
// projections (attprojw, fcprojw) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1; padded
// vocabulary rows 0. Each value is drawn from Philox keyed by (seed, file tensor index, element
// index in the stacked file tensor), so it is the same under any layout.
#pragma once
#include "model/gpt2_config.h"
#include "model/param_table.h"

#include <stdbool.h>
#include <stdint.h>

enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB,
    LOOM_GPT2_NUM_TENSORS
};
// A block's tensors, in the table's order: the matrices, then the vectors.
enum {
    B_QKVW, B_ATTPROJW, B_FCW, B_FCPROJW, B_LN1W, B_LN1B, B_QKVB, B_ATTPROJB, B_LN2W, B_LN2B, B_FCB,
    B_FCPROJB, LOOM_GPT2_BLOCK_TENSORS
};
// The file tensor (P_*) of block tensor k (B_*).
extern const int LOOM_GPT2_BLOCK_FILE_TENSOR[LOOM_GPT2_BLOCK_TENSORS];

// One tensor of the model file.
typedef struct {
    const char *name;
    int ndim;            // with the leading L dim of per-layer tensors
    int64_t shape[3];
    int64_t numel;
    int64_t offset;      // elements from the start of the file's parameters
    bool per_layer;      // stacked on a leading L dim
    loom_init_rule init;
    float std;           // for LOOM_INIT_NORMAL
    bool weight_decay;   // AdamW decays matrices and embeddings only
    loom_shard_spec shard; // of one layer's tensor
} loom_gpt2_tensor;

// A model chunk (a virtual pipeline stage): blocks [first_block, first_block + num_blocks).
typedef struct {
    int first_block, num_blocks;
} loom_chunk;

enum { LOOM_MAX_CHUNKS = 8 };

// What one rank holds of the model in a pipeline: its chunks (one, or V non-adjacent ones under
// the interleaved and V-shaped schedules; ascending and disjoint), plus the embedding before the
// first chunk (the rank holding block 0) and the final LayerNorm, output layer and loss after
// the last chunk (the rank holding block L-1).
typedef struct {
    int num_chunks;
    loom_chunk chunk[LOOM_MAX_CHUNKS];
    bool embed, head;
} loom_stage;

// Fills out[LOOM_GPT2_NUM_TENSORS] with the file's tensors; returns the file's element count.
int64_t loom_gpt2_file_layout(const loom_gpt2_config *cfg, loom_gpt2_tensor *out);
// The whole model as one stage.
loom_stage loom_gpt2_whole(const loom_gpt2_config *cfg);
// The table of `stage`'s parameters as tensor-parallel rank tp_rank of tp_size holds them:
// layer-major over the chunks in order; a head without the embedding keeps its own copy of
// the tied wte (layer L, not `counted`: the embedding's copy counts it). Errors: LOOM_EINVAL
// naming the value when the heads or the padded vocabulary do not divide by tp_size, or the
// chunks are not ascending, disjoint and inside the model.
loom_status loom_gpt2_param_table(const loom_gpt2_config *cfg, const loom_stage *stage, int tp_rank,
                                  int tp_size, loom_param_table *out);
