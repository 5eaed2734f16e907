// The parameter table: every tensor of a model as one rank holds it, in a model-neutral form,
// so that the optimizer, data parallelism, tensor parallelism and checkpoints work from it
// without knowing which model it is (DESIGN.md, src/model).
//
// Each entry is one tensor of one layer: its whole shape, the shard this rank holds under
// tensor parallelism (the shard spec says which dimension splits over tp ranks and how, as
// Megatron-LM's column-, row- and vocabulary-parallel layers, Shoeybi et al. 2019), where the
// shard lies in this rank's flat buffers, where the whole tensor lies in the model file, and
// how it is initialised. Flat buffers follow the table's order, which models make layer-major
// (DESIGN principle 3): one layer's (and one pipeline stage's) parameters are one contiguous
// slice on every rank. The model file's order (llm.c's, for GPT-2) is produced only when a file
// is written or read, through file_offset.
#pragma once
#include "core/status.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    LOOM_SHARD_REPLICATED, // every tp rank holds the whole tensor
    LOOM_SHARD_COLUMN,     // dim 0 split: output features of a torch.nn.Linear weight (OC, C) or its bias (OC)
    LOOM_SHARD_ROW,        // dim 1 split: input features of a Linear weight (OC, C)
    LOOM_SHARD_VOCAB,      // dim 0 of an embedding (Vp, C) split: rows of the (padded) vocabulary
} loom_shard_kind;

typedef struct {
    loom_shard_kind kind;
    // Split tensors: the split dimension is `chunks` equal blocks, each split over the tp ranks,
    // so a rank holds the same slice of every block (3 for a fused q,k,v projection: whole heads
    // of q, of k and of v). 1 otherwise.
    int chunks;
    // Replicated tensors: used on the rows of the residual stream (LayerNorm), which sequence
    // parallelism splits over the tp ranks, so each rank's gradient covers its rows only and
    // the gradients are summed over tp.
    bool sequence_parallel;
    // Replicated tensors: added to a partial sum that is then reduced over tp (the bias of a
    // row-parallel layer), so exactly one shard (tp rank 0) adds it.
    bool add_once;
} loom_shard_spec;

typedef enum { LOOM_INIT_NORMAL, LOOM_INIT_ZERO, LOOM_INIT_ONE } loom_init_rule;

typedef struct {
    char name[24];           // the tensor's name within its layer ("qkvw")
    int layer;               // block index; -1 before the blocks (embeddings); L after them (final norm)
    int ndim;                // 1 or 2
    int64_t shape[2];        // the whole tensor
    int64_t local_shape[2];  // this rank's shard
    int64_t numel, local_numel;
    loom_shard_spec shard;
    int64_t offset;          // the shard's first element in this rank's flat buffers
    int64_t whole_offset;    // the whole tensor's first element in the unsharded table's flat order
    int64_t file_offset;     // the whole tensor's first element in the model file
    // Initialisation: element i of the whole tensor (row-major) is 0, 1, or std x N(0,1) drawn
    // from Philox keyed by (seed, rng_stream, rng_offset + i) (core/rng.h), so every value is
    // the same under any sharding; rows from zero_rows_from on are 0 (vocabulary padding; 0 here:
    // no such rows).
    loom_init_rule init;
    float std;
    int64_t zero_rows_from;
    uint64_t rng_stream;
    int64_t rng_offset;
    bool weight_decay;       // AdamW decays it (matrices and embeddings)
    // Per rank: whether this rank's forward adds it (false for an add_once tensor on tp ranks
    // other than 0), and whether the global gradient norm counts it here (a replicated tensor is
    // counted on tp rank 0 only, so each parameter counts once).
    bool applies, counted;
} loom_param;

typedef struct {
    loom_param *params;
    int count;
    int64_t num_elements;  // this rank's flat buffers
    int64_t file_elements; // the whole model, as the model file holds it
    int tp_rank, tp_size;  // the tensor-parallel shard the table describes
} loom_param_table;

// A slice of a rank's flat buffers and where it lies in a compact buffer of its own (e.g. the
// optimizer state of a ZeRO shard): elements [offset, offset + numel) <-> [state_offset, +numel).
typedef struct {
    int64_t offset, state_offset, numel;
} loom_param_slice;

// Appends an entry (whole shape, spec, file offset, initialisation; name, layer) to the table;
// loom_param_table_shard lays the entries out afterwards.
void loom_param_table_add(loom_param_table *t, const loom_param *p);
// Sets every entry's shard for tp rank `tp_rank` of `tp_size`: local shapes, flat offsets in
// table order, and the per-rank flags. Errors: LOOM_EINVAL naming the tensor, its shape and
// tp_size when a split dimension (per chunk) does not divide by tp_size.
loom_status loom_param_table_shard(loom_param_table *t, int tp_rank, int tp_size);
void loom_param_table_free(loom_param_table *t);
// The entry whose shard holds flat element `flat` (binary search; -1 outside the buffer).
int loom_param_table_find(const loom_param_table *t, int64_t flat);

// Index within the whole tensor of element `local` of tp rank `tp_rank`'s shard of p.
int64_t loom_param_global_index(const loom_param *p, int tp_rank, int tp_size, int64_t local);
// Copies between tp rank `tp_rank`'s flat buffer (fp32, t->num_elements, the shards in table
// order) and the model file's flat order (fp32, t->file_elements): to_file places the shards
// into `file` (other elements untouched); otherwise extracts them into `local`.
void loom_param_table_copy(const loom_param_table *t, int tp_rank, float *local, float *file, bool to_file);
// This rank's initial parameters (fp32, t->num_elements, table order) from `seed`.
void loom_param_table_init(const loom_param_table *t, uint64_t seed, float *local);
