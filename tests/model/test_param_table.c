// The parameter table on fresh random values: for tp 1, 2, 4 (and 8 where it divides) every
// rank's shards of GPT-2's tensors, placed into the model file's order, rebuild the whole file
// exactly with each element written once; extracting takes them back; global_index agrees with
// the placement; the sharded initialisation is the whole model's, split; the layer-major
// table lists each block's tensors together with the model file's offsets; and tables that
// cannot split say which value is wrong.
#include "harness.h"

#include "model/gpt2.h"

#include <string.h>

static loom_gpt2_config tiny(void) {
    return (loom_gpt2_config){.max_seq_len = 24, .vocab_size = 200, .padded_vocab_size = 256, .num_layers = 3,
                              .num_heads = 8, .channels = 32};
}

static void test_shards(int tp) {
    loom_gpt2_config cfg = tiny();
    loom_stage whole = loom_gpt2_whole(&cfg);
    int64_t n = loom_gpt2_file_elements(&cfg);
    float *file = malloc((size_t)n * sizeof(float)), *rebuilt = malloc((size_t)n * sizeof(float));
    float *init_whole = malloc((size_t)n * sizeof(float)), *init_sharded = malloc((size_t)n * sizeof(float));
    int32_t *writes = calloc((size_t)n, sizeof(int32_t));
    t_fill_normal(file, (size_t)n, 1.0f);
    for (int64_t i = 0; i < n; i++) rebuilt[i] = NAN;
    loom_param_table t1;
    T_ASSERT(loom_gpt2_param_table(&cfg, &whole, 0, 1, &t1) == LOOM_OK, "whole table");
    float *w = malloc((size_t)t1.num_elements * sizeof(float));
    loom_param_table_init(&t1, 11, w);
    loom_param_table_copy(&t1, 0, w, init_whole, true);
    int bad_index = 0;
    int64_t total = 0;
    for (int r = 0; r < tp; r++) {
        loom_param_table t;
        T_ASSERT(loom_gpt2_param_table(&cfg, &whole, r, tp, &t) == LOOM_OK, "tp %d rank %d table", tp, r);
        total += t.num_elements;
        float *local = malloc((size_t)t.num_elements * sizeof(float)), *back = malloc((size_t)t.num_elements * sizeof(float));
        loom_param_table_copy(&t, r, local, file, false);
        loom_param_table_copy(&t, r, local, rebuilt, true);
        for (int i = 0; i < t.count; i++) {
            const loom_param *p = &t.params[i];
            for (int64_t k = 0; k < p->local_numel; k++) {
                int64_t g = loom_param_global_index(p, r, tp, k);
                bad_index += local[p->offset + k] != file[p->file_offset + g];
                if (p->shard.kind != LOOM_SHARD_REPLICATED || r == 0) writes[p->file_offset + g]++;
            }
        }
        loom_param_table_copy(&t, r, back, rebuilt, false);
        T_ASSERT(memcmp(back, local, (size_t)t.num_elements * sizeof(float)) == 0, "tp %d rank %d: extract", tp, r);
        loom_param_table_init(&t, 11, local);
        loom_param_table_copy(&t, r, local, init_sharded, true);
        free(local);
        free(back);
        loom_param_table_free(&t);
    }
    int64_t once = 0;
    for (int64_t i = 0; i < n; i++) once += writes[i] == 1;
    T_ASSERT(memcmp(file, rebuilt, (size_t)n * sizeof(float)) == 0, "tp %d: the shards rebuild the file", tp);
    T_ASSERT(bad_index == 0, "tp %d: %d elements disagree with global_index", tp, bad_index);
    T_ASSERT(once == n, "tp %d: %lld of %lld elements held by exactly one shard", tp, (long long)once, (long long)n);
    T_ASSERT(memcmp(init_whole, init_sharded, (size_t)n * sizeof(float)) == 0, "tp %d: sharded init", tp);
    T_ASSERT(tp > 1 || total == n, "tp 1 holds the whole file");
    free(w);
    free(file);
    free(rebuilt);
    free(init_whole);
    free(init_sharded);
    free(writes);
    loom_param_table_free(&t1);
}

static void test_layout(void) {
    loom_gpt2_config cfg = tiny();
    loom_stage whole = loom_gpt2_whole(&cfg);
    loom_param_table t;
    loom_gpt2_tensor f[LOOM_GPT2_NUM_TENSORS];
    T_ASSERT(loom_gpt2_file_layout(&cfg, f) == loom_gpt2_file_elements(&cfg), "file layout size");
    T_ASSERT(loom_gpt2_param_table(&cfg, &whole, 0, 1, &t) == LOOM_OK, "table");
    T_ASSERT(t.count == 4 + LOOM_GPT2_BLOCK_TENSORS * cfg.num_layers, "%d entries", t.count);
    int wrong = 0;
    for (int l = 0; l < cfg.num_layers; l++)
        for (int k = 0; k < LOOM_GPT2_BLOCK_TENSORS; k++) {
            const loom_param *p = &t.params[2 + l * LOOM_GPT2_BLOCK_TENSORS + k];
            const loom_gpt2_tensor *s = &f[LOOM_GPT2_BLOCK_FILE_TENSOR[k]];
            wrong += p->layer != l || strcmp(p->name, s->name) != 0 || p->numel * cfg.num_layers != s->numel ||
                     p->file_offset != s->offset + l * p->numel;
            if (k > 0) wrong += p->offset != p[-1].offset + p[-1].numel; // a block is one slice
        }
    T_ASSERT(wrong == 0, "%d block entries out of place", wrong);
    T_ASSERT(t.params[0].layer == -1 && t.params[t.count - 1].layer == cfg.num_layers, "embeddings first, lnf last");
    loom_param_table_free(&t);
    // a stage of blocks 1..2 with the head holds its own copy of wte, which the norm does not count
    loom_stage last = {1, {{1, 2}}, false, true};
    T_ASSERT(loom_gpt2_param_table(&cfg, &last, 0, 1, &t) == LOOM_OK, "last stage");
    T_ASSERT(t.count == 2 * LOOM_GPT2_BLOCK_TENSORS + 3 && strcmp(t.params[t.count - 1].name, "wte") == 0 &&
                 t.params[0].layer == 1 && !t.params[t.count - 1].counted && t.params[t.count - 2].counted,
             "last stage entries");
    T_ASSERT(t.file_elements == loom_gpt2_file_elements(&cfg), "a stage's table places it in the whole file");
    loom_param_table_free(&t);
    // two chunks (interleaved): blocks 0 and 2, layer-major, the embedding first
    loom_stage two = {2, {{0, 1}, {2, 1}}, true, false};
    T_ASSERT(loom_gpt2_param_table(&cfg, &two, 0, 1, &t) == LOOM_OK, "two chunks");
    T_ASSERT(t.count == 2 + 2 * LOOM_GPT2_BLOCK_TENSORS && t.params[2].layer == 0 &&
                 t.params[2 + LOOM_GPT2_BLOCK_TENSORS].layer == 2, "two chunks' entries");
    loom_param_table_free(&t);
}

static void test_errors(void) {
    loom_gpt2_config cfg = tiny();
    loom_stage whole = loom_gpt2_whole(&cfg);
    loom_param_table t;
    T_ASSERT(loom_gpt2_param_table(&cfg, &whole, 0, 3, &t) == LOOM_EINVAL &&
                 strstr(loom_error_message(), "over 3 ranks splits whole heads, but the model has 8 heads"),
             "heads: %s", loom_error_message());
    cfg.num_heads = 5, cfg.channels = 40, cfg.vocab_size = 50257, cfg.padded_vocab_size = 50304;
    T_ASSERT(loom_gpt2_param_table(&cfg, &whole, 0, 5, &t) == LOOM_EINVAL &&
                 strstr(loom_error_message(), "padded vocabulary 50304"),
             "vocabulary: %s", loom_error_message());
    loom_stage outside = {1, {{2, 5}}, false, true}, overlap = {2, {{0, 2}, {1, 1}}, true, true};
    T_ASSERT(loom_gpt2_param_table(&cfg, &outside, 0, 1, &t) == LOOM_EINVAL && strstr(loom_error_message(), "[2, 7)"),
             "stage: %s", loom_error_message());
    T_ASSERT(loom_gpt2_param_table(&cfg, &overlap, 0, 1, &t) == LOOM_EINVAL &&
                 strstr(loom_error_message(), "chunk 1's blocks [1, 2)"), "overlap: %s", loom_error_message());
}

int main(void) {
    t_seed();
    for (int tp = 1; tp <= 8; tp *= 2) test_shards(tp);
    test_layout();
    test_errors();
    return t_done("param_table");
}
