#include "model/gpt2_params.h"

#include <math.h>
#include <stdio.h>

const int LOOM_GPT2_BLOCK_FILE_TENSOR[LOOM_GPT2_BLOCK_TENSORS] = {
    P_QKVW, P_ATTPROJW, P_FCW, P_FCPROJW, P_LN1W, P_LN1B, P_QKVB, P_ATTPROJB, P_LN2W, P_LN2B, P_FCB, P_FCPROJB,
};

int64_t loom_gpt2_file_layout(const loom_gpt2_config *cfg, loom_gpt2_tensor *s) {
    int64_t Vp = cfg->padded_vocab_size, C = cfg->channels, L = cfg->num_layers;
    int64_t maxT = cfg->max_seq_len;
    float std = 0.02f, res_std = 0.02f / sqrtf(2.0f * (float)L);
    const loom_shard_spec rep = {LOOM_SHARD_REPLICATED, 1, false, false},
                          norm = {LOOM_SHARD_REPLICATED, 1, true, false},
                          once = {LOOM_SHARD_REPLICATED, 1, false, true},
                          col = {LOOM_SHARD_COLUMN, 1, false, false}, qkv = {LOOM_SHARD_COLUMN, 3, false, false},
                          row = {LOOM_SHARD_ROW, 1, false, false}, vocab = {LOOM_SHARD_VOCAB, 1, false, false};
    const loom_gpt2_tensor table[LOOM_GPT2_NUM_TENSORS] = {
        {"wte", 2, {Vp, C}, 0, 0, false, LOOM_INIT_NORMAL, std, true, vocab},
        {"wpe", 2, {maxT, C}, 0, 0, false, LOOM_INIT_NORMAL, std, true, rep},
        {"ln1w", 2, {L, C}, 0, 0, true, LOOM_INIT_ONE, 0, false, norm},
        {"ln1b", 2, {L, C}, 0, 0, true, LOOM_INIT_ZERO, 0, false, norm},
        {"qkvw", 3, {L, 3 * C, C}, 0, 0, true, LOOM_INIT_NORMAL, std, true, qkv},
        {"qkvb", 2, {L, 3 * C}, 0, 0, true, LOOM_INIT_ZERO, 0, false, qkv},
        {"attprojw", 3, {L, C, C}, 0, 0, true, LOOM_INIT_NORMAL, res_std, true, row},
        {"attprojb", 2, {L, C}, 0, 0, true, LOOM_INIT_ZERO, 0, false, once},
        {"ln2w", 2, {L, C}, 0, 0, true, LOOM_INIT_ONE, 0, false, norm},
        {"ln2b", 2, {L, C}, 0, 0, true, LOOM_INIT_ZERO, 0, false, norm},
        {"fcw", 3, {L, 4 * C, C}, 0, 0, true, LOOM_INIT_NORMAL, std, true, col},
        {"fcb", 2, {L, 4 * C}, 0, 0, true, LOOM_INIT_ZERO, 0, false, col},
        {"fcprojw", 3, {L, C, 4 * C}, 0, 0, true, LOOM_INIT_NORMAL, res_std, true, row},
        {"fcprojb", 2, {L, C}, 0, 0, true, LOOM_INIT_ZERO, 0, false, once},
        {"lnfw", 1, {C}, 0, 0, false, LOOM_INIT_ONE, 0, false, norm},
        {"lnfb", 1, {C}, 0, 0, false, LOOM_INIT_ZERO, 0, false, norm},
    };
    int64_t offset = 0;
    for (int t = 0; t < LOOM_GPT2_NUM_TENSORS; t++) {
        s[t] = table[t];
        s[t].numel = 1;
        for (int d = 0; d < s[t].ndim; d++) s[t].numel *= s[t].shape[d];
        s[t].offset = offset;
        offset += s[t].numel;
    }
    return offset;
}

loom_stage loom_gpt2_whole(const loom_gpt2_config *cfg) {
    return (loom_stage){1, {{0, cfg->num_layers}}, true, true};
}

// Table entry for layer `layer` of file tensor t (per-layer tensors: that layer's slice).
static void add(loom_param_table *table, const loom_gpt2_config *cfg, const loom_gpt2_tensor *f, int t, int layer) {
    const loom_gpt2_tensor *s = &f[t];
    int lead = s->per_layer ? 1 : 0;
    loom_param p = {.layer = layer, .ndim = s->ndim - lead, .shard = s->shard, .init = s->init, .std = s->std,
                    .rng_stream = (uint64_t)t, .weight_decay = s->weight_decay};
    snprintf(p.name, sizeof p.name, "%s", s->name);
    for (int d = 0; d < p.ndim; d++) p.shape[d] = s->shape[d + lead];
    int64_t per_layer = s->per_layer ? s->numel / s->shape[0] : 0;
    p.rng_offset = s->per_layer ? layer * per_layer : 0;
    p.file_offset = s->offset + p.rng_offset;
    if (t == P_WTE) p.zero_rows_from = cfg->vocab_size;
    loom_param_table_add(table, &p);
}

loom_status loom_gpt2_param_table(const loom_gpt2_config *cfg, const loom_stage *stage, int tp_rank,
                                  int tp_size, loom_param_table *out) {
    *out = (loom_param_table){0};
    int L = cfg->num_layers;
    if (cfg->num_heads % tp_size != 0)
        return loom_fail(LOOM_EINVAL, "use a --tp that divides the number of heads",
                         "tensor parallelism over %d ranks splits whole heads, but the model has %d heads",
                         tp_size, cfg->num_heads);
    if (cfg->padded_vocab_size % tp_size != 0)
        return loom_fail(LOOM_EINVAL, "use a --tp that divides the padded vocabulary",
                         "tensor parallelism over %d ranks splits the padded vocabulary %d unevenly", tp_size,
                         cfg->padded_vocab_size);
    if (stage->num_chunks < 1 || stage->num_chunks > LOOM_MAX_CHUNKS)
        return loom_fail(LOOM_EINVAL, NULL, "a stage of %d chunks (1 to %d)", stage->num_chunks, LOOM_MAX_CHUNKS);
    for (int c = 0, next = 0; c < stage->num_chunks; c++) { // next: the first block chunk c may start at
        const loom_chunk *k = &stage->chunk[c];
        if (k->first_block < next || k->num_blocks < 0 || k->first_block + k->num_blocks > L)
            return loom_fail(LOOM_EINVAL, NULL, "chunk %d's blocks [%d, %d) are not after the previous chunk's and "
                             "inside the model's %d blocks", c, k->first_block, k->first_block + k->num_blocks, L);
        next = k->first_block + k->num_blocks;
    }
    loom_gpt2_tensor f[LOOM_GPT2_NUM_TENSORS];
    loom_gpt2_file_layout(cfg, f);
    if (stage->embed) {
        add(out, cfg, f, P_WTE, -1);
        add(out, cfg, f, P_WPE, -1);
    }
    for (int c = 0; c < stage->num_chunks; c++)
        for (int l = stage->chunk[c].first_block; l < stage->chunk[c].first_block + stage->chunk[c].num_blocks; l++)
            for (int k = 0; k < LOOM_GPT2_BLOCK_TENSORS; k++) add(out, cfg, f, LOOM_GPT2_BLOCK_FILE_TENSOR[k], l);
    if (stage->head) {
        add(out, cfg, f, P_LNFW, L);
        add(out, cfg, f, P_LNFB, L);
        if (!stage->embed) add(out, cfg, f, P_WTE, L); // the tied output layer's own copy
    }
    loom_status s = loom_param_table_shard(out, tp_rank, tp_size);
    if (s != LOOM_OK) {
        loom_param_table_free(out);
        return s;
    }
    out->file_elements = loom_gpt2_file_layout(cfg, f); // the whole file, whatever this stage holds
    if (stage->head && !stage->embed) out->params[out->count - 1].counted = false; // the wte copy
    return LOOM_OK;
}
