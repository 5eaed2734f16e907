// Token shards and the loader on fresh random data: shard round trip and each validation error,
// the deterministic micro-batch order across shard boundaries and epochs, and the shuffled
// order (a permutation of whole micro-batches of a shard-permuted stream, fixed by the seed).
#include "harness.h"

#include "core/status.h"
#include "data/loader.h"
#include "data/shard.h"

#include <stdbool.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/loom_data_XXXXXX";

static void shard_path(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

static void write_raw(const char *name, const void *data, size_t bytes) {
    char path[256];
    shard_path(path, sizeof path, name);
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, bytes, f);
    fclose(f);
}

static void test_shard_errors(const uint16_t *tokens, int n) {
    char path[256];
    size_t bytes = 1024 + 2 * (size_t)n;
    char *file = malloc(bytes);
    int32_t h[256] = {LOOM_SHARD_MAGIC, LOOM_SHARD_VERSION, n};
    memcpy(file, h, sizeof h);
    memcpy(file + 1024, tokens, 2 * (size_t)n);
    loom_shard s;
    struct { const char *name, *want; size_t bytes; int field, value; } cases[] = {
        {"magic.bin", "bad magic 1234", bytes, 0, 1234},
        {"version.bin", "unsupported version 7", bytes, 1, 7},
        {"count.bin", "header says", bytes, 2, n + 1},
        {"short.bin", "shorter than", 1000, -1, 0},
        {"truncated.bin", "header says", bytes - 2, -1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *copy = malloc(bytes);
        memcpy(copy, file, bytes);
        if (cases[c].field >= 0) ((int32_t *)copy)[cases[c].field] = cases[c].value;
        write_raw(cases[c].name, copy, cases[c].bytes);
        shard_path(path, sizeof path, cases[c].name);
        loom_status st = loom_shard_open(&s, path, 50257);
        T_ASSERT(st == LOOM_EFORMAT && strstr(loom_error_message(), cases[c].want) &&
                     strstr(loom_error_message(), cases[c].name),
                 "%s: status %d, message '%s'", cases[c].name, st, loom_error_message());
        free(copy);
    }
    // a token beyond the vocabulary, named with its position
    int pos = t_randint(0, n - 1);
    ((uint16_t *)(file + 1024))[pos] = 60000;
    write_raw("range.bin", file, bytes);
    shard_path(path, sizeof path, "range.bin");
    char want[64];
    snprintf(want, sizeof want, "token 60000 at position %d", pos);
    T_ASSERT(loom_shard_open(&s, path, 50257) == LOOM_EFORMAT && strstr(loom_error_message(), want),
             "range: '%s'", loom_error_message());
    shard_path(path, sizeof path, "missing.bin");
    T_ASSERT(loom_shard_open(&s, path, 50257) == LOOM_EIO && strstr(loom_error_message(), "missing.bin"), "missing");
    free(file);
}

// tokens of the stream at position p, for shards a (na tokens) then b
static int stream_at(const uint16_t *a, int na, const uint16_t *b, int64_t p) { return p < na ? a[p] : b[p - na]; }

int main(void) {
    t_seed();
    if (!mkdtemp(dir)) return 1;
    int na = t_randint(300, 900), nb = t_randint(300, 900), V = 1000;
    uint16_t *a = malloc(2 * (size_t)na), *b = malloc(2 * (size_t)nb);
    for (int i = 0; i < na; i++) a[i] = (uint16_t)t_randint(0, V - 1);
    for (int i = 0; i < nb; i++) b[i] = (uint16_t)t_randint(0, V - 1);
    char path[256];
    shard_path(path, sizeof path, "x_train_000000.bin");
    T_ASSERT(loom_shard_write(path, a, na) == LOOM_OK, "write a");
    shard_path(path, sizeof path, "x_train_000001.bin");
    T_ASSERT(loom_shard_write(path, b, nb) == LOOM_OK, "write b");
    loom_shard s;
    T_ASSERT(loom_shard_open(&s, path, V) == LOOM_OK && s.num_tokens == nb &&
                 memcmp(s.tokens, b, 2 * (size_t)nb) == 0, "shard round trip");
    loom_shard_close(&s);
    test_shard_errors(a, na);

    // deterministic order over the two shards, B*T spanning the boundary, epochs wrapping
    int B = t_randint(1, 4), T = t_randint(5, 40), BT = B * T;
    char pattern[256];
    shard_path(pattern, sizeof pattern, "x_train_*.bin");
    loom_loader *l;
    T_ASSERT(loom_loader_open(&l, pattern, B, T, V, false, 0) == LOOM_OK, "open: %s", loom_error_message());
    uint64_t nbat = loom_loader_num_batches(l);
    T_ASSERT(loom_loader_num_tokens(l) == (uint64_t)(na + nb) && nbat == (uint64_t)(na + nb - 1) / (uint64_t)BT,
             "counts: %llu batches", (unsigned long long)nbat);
    int32_t *x = malloc(4 * (size_t)BT), *y = malloc(4 * (size_t)BT);
    int bad = 0;
    for (uint64_t i = 0; i < 2 * nbat + 3; i++) {
        loom_loader_get(l, i, x, y);
        int64_t start = (int64_t)(i % nbat) * BT;
        for (int k = 0; k < BT; k++)
            bad += x[k] != stream_at(a, na, b, start + k) || y[k] != stream_at(a, na, b, start + k + 1);
    }
    T_ASSERT(bad == 0, "deterministic order: %d wrong tokens", bad);
    loom_loader_close(l);

    // shuffled: every micro-batch of an epoch is a window of the stream in one of the two shard
    // orders, at offset + j*BT for a permutation j; the same seed repeats, another seed differs
    loom_loader *l2, *l3;
    T_ASSERT(loom_loader_open(&l, pattern, B, T, V, true, 7) == LOOM_OK, "open shuffled");
    loom_loader_open(&l2, pattern, B, T, V, true, 7);
    loom_loader_open(&l3, pattern, B, T, V, true, 8);
    int32_t *x2 = malloc(4 * (size_t)BT), *y2 = malloc(4 * (size_t)BT);
    int32_t *ex = malloc(4 * (size_t)BT * nbat), *ey = malloc(4 * (size_t)BT * nbat);
    int same_seed_diff = 0, other_seed_diff = 0, unexplained = 0;
    int64_t slack = na + nb - 1 - (int64_t)nbat * BT;
    bool *seen = calloc(nbat, 1);
    for (int e = 0; e < 3; e++) {
        for (uint64_t j = 0; j < nbat; j++) {
            uint64_t i = (uint64_t)e * nbat + j;
            loom_loader_get(l, i, ex + j * BT, ey + j * BT);
            loom_loader_get(l2, i, x2, y2);
            same_seed_diff += memcmp(ex + j * BT, x2, 4 * (size_t)BT) != 0 || memcmp(ey + j * BT, y2, 4 * (size_t)BT) != 0;
            loom_loader_get(l3, i, x2, y2);
            other_seed_diff += memcmp(ex + j * BT, x2, 4 * (size_t)BT) != 0;
        }
        // some shard order and offset must explain the epoch: batch j is the window at
        // offset + slot*BT of that stream, each slot used once
        bool explained = false;
        for (int order = 0; order < 2 && !explained; order++) {
            const uint16_t *p = order ? b : a, *q = order ? a : b;
            int np = order ? nb : na;
            for (int64_t off = 0; off <= slack && !explained; off++) {
                memset(seen, 0, nbat);
                bool all = true;
                for (uint64_t j = 0; j < nbat && all; j++) {
                    bool found = false;
                    for (uint64_t slot = 0; slot < nbat && !found; slot++) {
                        int64_t st = off + (int64_t)slot * BT;
                        bool match = !seen[slot];
                        for (int k = 0; k < BT && match; k++)
                            match = ex[j * BT + k] == stream_at(p, np, q, st + k) &&
                                    ey[j * BT + k] == stream_at(p, np, q, st + k + 1);
                        if (match) seen[slot] = found = true;
                    }
                    all = found;
                }
                explained = all;
            }
        }
        unexplained += !explained;
    }
    free(seen);
    free(ex);
    free(ey);
    T_ASSERT(same_seed_diff == 0, "same seed, different batches: %d", same_seed_diff);
    T_ASSERT(other_seed_diff > 0, "another seed gives the same order");
    T_ASSERT(unexplained == 0, "%d epochs are not a permutation of windows of a shard-permuted stream", unexplained);
    loom_loader_close(l);
    loom_loader_close(l2);
    loom_loader_close(l3);

    // errors: nothing matches; B*T + 1 beyond the data
    shard_path(pattern, sizeof pattern, "nothing_*.bin");
    T_ASSERT(loom_loader_open(&l, pattern, 1, 8, V, false, 0) == LOOM_EIO && strstr(loom_error_message(), "nothing_*.bin"),
             "no match: %s", loom_error_message());
    shard_path(pattern, sizeof pattern, "x_train_000000.bin");
    T_ASSERT(loom_loader_open(&l, pattern, na, 1, V, false, 0) == LOOM_EINVAL && strstr(loom_error_message(), "exceeds"),
             "too big: %s", loom_error_message());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    T_ASSERT(system(cmd) == 0, "cleanup");
    free(a), free(b), free(x), free(y), free(x2), free(y2);
    return t_done("data");
}
