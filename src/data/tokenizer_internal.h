// Private to src/data/tokenizer*.c: the loaded vocabulary and merge table.
#pragma once
#include "data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <uthash.h>

// A byte string -> int entry (vocabulary: token bytes -> id; merges: "a,b" bytes -> rank).
typedef struct {
    UT_hash_handle hh;
    int32_t value;
    uint32_t len;
    char key[];
} bytes_entry;

struct loom_tokenizer {
    bytes_entry *vocab;      // token bytes -> id
    bytes_entry *merges;     // bytes(a) ',' bytes(b) -> merge rank
    char **token_bytes;      // (V) id -> bytes, for decoding
    uint32_t *token_len;     // (V)
    int vocab_size;
    pcre2_code *pretokenizer; // GPT-2's regex, JIT-compiled; shared read-only by encoders
};

// Looks up key[0, len) in a bytes_entry table; returns its value or -1.
int32_t tok_lookup(const bytes_entry *table, const char *key, size_t len);
