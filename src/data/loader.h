// Micro-batches from token shards. The shards matching a pattern (sorted by name) form one
// token stream of N tokens; each epoch holds nb = floor((N - 1) / (B*T)) micro-batches.
// Access is stateless: micro-batch i is a pure function of i (and the seed when shuffling), so a
// run resumes by its position alone and every layout of a run sees the same data (DESIGN
// principle 2).
//   - default order: micro-batch i (epoch e = i / nb, j = i % nb) takes tokens
//     [j*B*T, j*B*T + B*T + 1) of the stream: inputs are the first B*T, targets the last B*T
//     (the next token of each input), both as (B, T) int32 rows;
//   - --shuffle: each epoch e concatenates the shards in an order permuted from (seed, e),
//     starts at an offset in [0, N - 1 - nb*B*T] drawn from (seed, e), and visits its nb
//     micro-batches in an order permuted from (seed, e) (Fisher-Yates on Philox draws).
#pragma once
#include "core/status.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct loom_loader loom_loader;

// Opens every shard matching the glob `pattern` and validates it (loom_shard_open with
// vocab_size). Errors: LOOM_EIO when nothing matches (naming the pattern) or a file cannot be
// read; LOOM_EFORMAT for a bad shard; LOOM_EINVAL when B*T + 1 exceeds the stream's tokens.
loom_status loom_loader_open(loom_loader **out, const char *pattern, int B, int T, int vocab_size,
                             bool shuffle, uint64_t seed);
void loom_loader_close(loom_loader *l);
uint64_t loom_loader_num_batches(const loom_loader *l); // nb: micro-batches per epoch
uint64_t loom_loader_num_tokens(const loom_loader *l);  // N
// Micro-batch `index` (any index; epochs repeat): inputs and targets (B,T) int32, host memory.
void loom_loader_get(loom_loader *l, uint64_t index, int32_t *inputs, int32_t *targets);
