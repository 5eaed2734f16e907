// The GPT-2 parameter table: one entry per tensor, in llm.c's model-file order, each a slice of
// one flat buffer (DESIGN principle 3). Per-layer tensors are stacked along a leading L dim.
//
//   wte (Vp,C)  wpe (maxT,C)  ln1w ln1b (L,C)  qkvw (L,3C,C) qkvb (L,3C)  attprojw (L,C,C)
//   attprojb (L,C)  ln2w ln2b (L,C)  fcw (L,4C,C) fcb (L,4C)  fcprojw (L,C,4C) fcprojb (L,C)
//   lnfw lnfb (C)
//
// Initialisation follows GPT-2 (and llm.c's train_gpt2.py): weights N(0, 0.02), residual
// projections (attprojw, fcprojw) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1; padded
// vocabulary rows 0. Each value is drawn from Philox keyed by (seed, tensor index, element
// index in the whole tensor), so it is the same under any sharding.
#pragma once
#include "model/gpt2_config.h"

#include <stdbool.h>
#include <stdint.h>

enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB,
    LOOM_GPT2_NUM_TENSORS
};

typedef enum { INIT_NORMAL, INIT_ZERO, INIT_ONE } loom_init_rule;

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[4];
    int64_t numel;
    int64_t offset;     // elements from the start of the flat buffer
    loom_init_rule init;
    float std;          // for INIT_NORMAL
    bool weight_decay;  // AdamW decays matrices and embeddings only
    // When the gradient is final during backward, which runs in stages L (final LayerNorm and
    // output layer), L-1 .. 0 (the blocks, last first), -1 (embeddings): a per-layer tensor
    // (stacked on a leading L dim) is final for layer l after stage l; any other tensor after
    // stage grad_stage. Data parallelism starts a bucket's reduction at that point.
    bool per_layer;
    int grad_stage;
} loom_param_spec;

// Fills specs[LOOM_GPT2_NUM_TENSORS] and returns the total element count (with padding).
int64_t loom_gpt2_param_table(const loom_gpt2_config *cfg, loom_param_spec *specs);
// Value of element `index` (row-major within the tensor) of tensor `t` at initialisation.
float loom_gpt2_init_value(const loom_gpt2_config *cfg, const loom_param_spec *spec, int t,
                           int64_t index, uint64_t seed);
