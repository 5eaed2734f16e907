// libFuzzer target: JSON Lines documents (data/corpus.h, loom_corpus_add with format "jsonl")
// encoded with GPT-2 BPE (data/tokenizer.h) through one encoder, as `loom tokenize` does; each
// document must decode back to its text with invalid UTF-8 replaced.
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "fuzz_common.h"
#include "fuzz_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/docs.jsonl", fuzz_dir());
    fuzz_write(path, data, size);
    loom_corpus c = {0};
    if (loom_corpus_add(&c, path, "jsonl") != LOOM_OK) { // a clean rejection
        loom_corpus_free(&c);
        return 0;
    }
    loom_encoder *enc = loom_encoder_create(tok);
    for (size_t d = 0; d < c.n; d++) {
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        if (loom_encoder_encode(enc, c.docs[d].text, c.docs[d].len, &ids, &n, &cap) == LOOM_OK) {
            char *text, *clean;
            size_t len, clean_len;
            if (loom_tokenizer_decode(tok, ids, n, &text, &len) != LOOM_OK) abort();
            clean = loom_utf8_sanitize(c.docs[d].text, c.docs[d].len, &clean_len);
            if (len != clean_len || memcmp(text, clean, len) != 0) abort();
            free(text);
            free(clean);
        }
        free(ids);
    }
    loom_encoder_free(enc);
    loom_corpus_free(&c);
    return 0;
}
