#include "data/shard.h"

#include "core/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *HINT = "is it an llm.c token shard (e.g. made by 'loom tokenize')?";

static loom_status check_tokens(const loom_shard *s, int vocab_size) {
    for (int64_t i = 0; i < s->num_tokens; i++)
        if (s->tokens[i] >= vocab_size)
            return loom_fail(LOOM_EFORMAT, "was the shard made with another tokenizer?",
                             "%s: token %u at position %lld is outside the vocabulary (%d)", s->path,
                             s->tokens[i], (long long)i, vocab_size);
    return LOOM_OK;
}

loom_status loom_shard_open(loom_shard *s, const char *path, int vocab_size) {
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", path);
    int fd;
    LOOM_TRY(loom_open_regular(path, "token shard", "check the data path", &fd));
    struct stat st;
    int32_t h[256];
    loom_status r = LOOM_OK;
    if (fstat(fd, &st) != 0 || st.st_size < LOOM_SHARD_HEADER_BYTES ||
        pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        r = loom_fail(LOOM_EFORMAT, HINT, "%s: shorter than the 1024-byte shard header (%lld bytes)",
                      path, (long long)st.st_size);
    } else if (h[0] != LOOM_SHARD_MAGIC) {
        r = loom_fail(LOOM_EFORMAT, HINT, "%s: bad magic %d (expected %d)", path, h[0], LOOM_SHARD_MAGIC);
    } else if (h[1] != LOOM_SHARD_VERSION) {
        r = loom_fail(LOOM_EFORMAT, HINT, "%s: unsupported version %d (expected %d)", path, h[1],
                      LOOM_SHARD_VERSION);
    } else if (h[2] < 0 || st.st_size != LOOM_SHARD_HEADER_BYTES + 2 * (int64_t)h[2]) {
        r = loom_fail(LOOM_EFORMAT, "the file is truncated or its header is wrong",
                      "%s: header says %d tokens (%lld bytes) but the file holds %lld bytes", path,
                      h[2], (long long)(LOOM_SHARD_HEADER_BYTES + 2 * (int64_t)h[2]), (long long)st.st_size);
    } else {
        s->num_tokens = h[2];
        s->map_bytes = (size_t)st.st_size;
        s->map = mmap(NULL, s->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (s->map == MAP_FAILED) {
            s->map = NULL;
            r = loom_fail(LOOM_EIO, NULL, "cannot map token shard %s: %s", path, strerror(errno));
        } else {
            s->tokens = (const uint16_t *)((const char *)s->map + LOOM_SHARD_HEADER_BYTES);
            r = check_tokens(s, vocab_size);
        }
    }
    close(fd);
    if (r != LOOM_OK) loom_shard_close(s);
    return r;
}

void loom_shard_close(loom_shard *s) {
    if (s->map) munmap(s->map, s->map_bytes);
    s->map = NULL;
    s->tokens = NULL;
}

loom_status loom_shard_write(const char *path, const uint16_t *tokens, int64_t n) {
    if (n < 0 || n > INT32_MAX)
        return loom_fail(LOOM_EINVAL, "use smaller shards (--shard-tokens)",
                         "%lld tokens do not fit one shard's int32 count", (long long)n);
    int32_t h[256] = {LOOM_SHARD_MAGIC, LOOM_SHARD_VERSION, (int32_t)n};
    return loom_atomic_save(path, (const void *[]){h, tokens},
                            (size_t[]){sizeof h, (size_t)n * sizeof(uint16_t)}, 2);
}
