// libFuzzer target: GPT-2 BPE encoding (data/tokenizer.h) of arbitrary bytes. Byte-level BPE
// is lossless on valid UTF-8, so decode(encode(x)) must equal x with its invalid UTF-8 replaced
// by U+FFFD (loom_utf8_sanitize), and every id must be an ordinary token (< <|endoftext|>).
#include "data/tokenizer.h"
#include "fuzz_common.h"
#include "fuzz_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int32_t *ids;
    size_t n;
    if (loom_tokenizer_encode(tok, (const char *)data, size, &ids, &n) != LOOM_OK) return 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= LOOM_EOT) abort();
    char *text, *clean;
    size_t len, clean_len;
    if (loom_tokenizer_decode(tok, ids, n, &text, &len) != LOOM_OK) abort();
    clean = loom_utf8_sanitize((const char *)data, size, &clean_len);
    if (len != clean_len || memcmp(text, clean, len) != 0) {
        fprintf(stderr, "loom fuzz: decode(encode(x)) differs from x (%zu vs %zu bytes)\n", len, clean_len);
        abort();
    }
    if (loom_utf8_valid((const char *)data, size) != (size == clean_len && memcmp(data, clean, size) == 0))
        abort();
    free(clean);
    free(text);
    free(ids);
    return 0;
}
