// The GPT-2 tokenizer the tokenizer targets share (fuzz_tokenizer_bytes.c, fuzz_tokenizer_jsonl.c):
// loaded once from the npm vocabulary at libFuzzer's initialisation; without it there is nothing
// to fuzz, so the target stops with one line.
#pragma once
#include "data/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>

static loom_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (loom_tokenizer_load(&tok, NULL) != LOOM_OK) {
        fprintf(stderr, "loom fuzz: cannot load the GPT-2 vocabulary: %s (hint: %s)\n",
                loom_error_message(), loom_error_hint());
        abort();
    }
    return 0;
}
