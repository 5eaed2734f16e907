// libFuzzer target: the token shard reader (data/shard.h, loom_shard_open) on arbitrary file
// contents. Accepted shards must hold exactly their header's token count, every token inside
// the vocabulary.
#include "data/shard.h"
#include "data/tokenizer.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/x_train_000000.bin", fuzz_dir());
    fuzz_write(path, data, size);
    loom_shard s;
    if (loom_shard_open(&s, path, LOOM_GPT2_VOCAB) != LOOM_OK) return 0; // a clean rejection
    if (s.num_tokens < 0 || (size_t)LOOM_SHARD_HEADER_BYTES + 2 * (size_t)s.num_tokens != size) abort();
    for (int64_t i = 0; i < s.num_tokens; i++) // every token readable and in range
        if (s.tokens[i] >= LOOM_GPT2_VOCAB) abort();
    loom_shard_close(&s);
    return 0;
}
