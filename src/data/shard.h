// Token shards in llm.c's format (karpathy/llm.c, dev/data/data_common.py write_datafile):
// a header of 256 int32 — magic 20240520, version 1, token count N — then N uint16 tokens.
// Shards written by loom load in llm.c and the other way round.
#pragma once
#include "core/status.h"

#include <stddef.h>
#include <stdint.h>

enum { LOOM_SHARD_MAGIC = 20240520, LOOM_SHARD_VERSION = 1, LOOM_SHARD_HEADER_BYTES = 1024 };

typedef struct {
    char path[4096];
    int64_t num_tokens;     // N
    const uint16_t *tokens; // (N) mapped read-only
    void *map;
    size_t map_bytes;
} loom_shard;

// Maps `path` and validates it: header magic and version, file size = 1024 + 2N bytes, and
// every token < vocab_size. Errors: LOOM_EIO (missing/unreadable), LOOM_EFORMAT naming the file
// and the bad value (magic, version, size, or the first out-of-range token and its position).
loom_status loom_shard_open(loom_shard *s, const char *path, int vocab_size);
void loom_shard_close(loom_shard *s);

// Writes tokens[0, n) as a shard, atomically (core/fileio.h). Errors: LOOM_EINVAL when n does
// not fit the int32 count, LOOM_EIO.
loom_status loom_shard_write(const char *path, const uint16_t *tokens, int64_t n);
