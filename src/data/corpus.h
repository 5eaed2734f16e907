// Documents to tokenize: plain text files (each file one document) and JSON Lines files (each
// line one document: the object's "text" string, as in llm.c's and Hugging Face's datasets).
// Folders are walked recursively in name order, skipping hidden entries.
#pragma once
#include "core/status.h"

#include <stddef.h>

typedef struct {
    char *text; // UTF-8 as read (invalid bytes are replaced by the tokenizer)
    size_t len; // bytes
} loom_document;

typedef struct {
    loom_document *docs;
    size_t n, cap;
    size_t bytes; // total text bytes
    int files;
} loom_corpus;

// Adds the documents of a file or folder. format: "auto" (".jsonl"/".json" -> JSON Lines, else
// text), "text" or "jsonl". Errors: LOOM_EIO naming a missing or unreadable path, LOOM_EFORMAT
// naming the file and line of a JSON Lines record without a "text" string, LOOM_EINVAL for an
// unknown format.
loom_status loom_corpus_add(loom_corpus *c, const char *path, const char *format);
void loom_corpus_free(loom_corpus *c);
