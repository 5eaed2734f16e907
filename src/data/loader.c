#include "data/loader.h"

#include "core/rng.h"
#include "data/shard.h"

#include <glob.h>
#include <string.h>

enum { SHUFFLE_BATCHES, SHUFFLE_SHARDS, SHUFFLE_OFFSET }; // sub-streams of LOOM_STREAM_SHUFFLE

struct loom_loader {
    loom_shard *shards;
    int nshards;
    int B, T;
    uint64_t num_tokens, num_batches;
    bool shuffle;
    uint64_t seed;
    // the current epoch's layout (shuffle only)
    int64_t epoch;          // -1: none yet
    int *order;             // (nshards) shard order
    uint64_t *starts;       // (nshards) stream offset of each shard in that order
    uint64_t *batch_order;  // (num_batches)
    uint64_t offset;
};

static uint64_t draw_below(const loom_loader *l, int kind, int64_t epoch, uint64_t k, uint64_t n) {
    uint64_t index = ((uint64_t)epoch << 40) | k;
    return loom_rng_below(l->seed, LOOM_STREAM_SHUFFLE + (uint64_t)kind, index, n);
}

static void permute(const loom_loader *l, int kind, int64_t epoch, uint64_t *v, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) v[i] = i;
    for (uint64_t i = n; i > 1; i--) { // Fisher-Yates
        uint64_t j = draw_below(l, kind, epoch, i - 1, i), t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

// Lays out epoch e: shard order with stream starts, batch order, start offset.
static void set_epoch(loom_loader *l, int64_t e) {
    uint64_t *perm = loom_xmalloc((size_t)l->nshards * sizeof(uint64_t));
    if (l->shuffle) permute(l, SHUFFLE_SHARDS, e, perm, (uint64_t)l->nshards);
    else for (int i = 0; i < l->nshards; i++) perm[i] = (uint64_t)i;
    uint64_t start = 0;
    for (int i = 0; i < l->nshards; i++) {
        l->order[i] = (int)perm[i];
        l->starts[i] = start;
        start += (uint64_t)l->shards[perm[i]].num_tokens;
    }
    free(perm);
    if (l->shuffle) {
        permute(l, SHUFFLE_BATCHES, e, l->batch_order, l->num_batches);
        uint64_t slack = l->num_tokens - 1 - l->num_batches * (uint64_t)l->B * (uint64_t)l->T;
        l->offset = draw_below(l, SHUFFLE_OFFSET, e, 0, slack + 1);
    }
    l->epoch = e;
}

static loom_status open_shards(loom_loader *l, const char *pattern, int vocab_size) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc != 0) {
        if (rc != GLOB_NOMATCH) globfree(&g);
        return loom_fail(LOOM_EIO, "check the data path or glob (quote it in the shell)",
                         "no token shards match '%s'", pattern);
    }
    l->shards = loom_xcalloc(g.gl_pathc, sizeof(loom_shard));
    loom_status s = LOOM_OK;
    for (size_t i = 0; i < g.gl_pathc && s == LOOM_OK; i++) {
        s = loom_shard_open(&l->shards[i], g.gl_pathv[i], vocab_size);
        if (s == LOOM_OK) {
            l->nshards++;
            l->num_tokens += (uint64_t)l->shards[i].num_tokens;
        }
    }
    globfree(&g);
    return s;
}

loom_status loom_loader_open(loom_loader **out, const char *pattern, int B, int T, int vocab_size,
                             bool shuffle, uint64_t seed) {
    *out = NULL;
    loom_loader *l = loom_xcalloc(1, sizeof *l);
    *l = (loom_loader){.B = B, .T = T, .shuffle = shuffle, .seed = seed, .epoch = -1};
    loom_status s = open_shards(l, pattern, vocab_size);
    uint64_t need = (uint64_t)B * (uint64_t)T + 1;
    if (s == LOOM_OK && l->num_tokens < need)
        s = loom_fail(LOOM_EINVAL, "lower --batch or --seq, or give more data",
                      "micro-batch B=%d x T=%d (+1 target) = %llu tokens exceeds the %llu tokens of '%s'",
                      B, T, (unsigned long long)need, (unsigned long long)l->num_tokens, pattern);
    if (s != LOOM_OK) {
        loom_loader_close(l);
        return s;
    }
    l->num_batches = (l->num_tokens - 1) / ((uint64_t)B * (uint64_t)T);
    l->order = loom_xmalloc((size_t)l->nshards * sizeof(int));
    l->starts = loom_xmalloc((size_t)l->nshards * sizeof(uint64_t));
    if (shuffle) l->batch_order = loom_xmalloc((size_t)l->num_batches * sizeof(uint64_t));
    *out = l;
    return LOOM_OK;
}

void loom_loader_close(loom_loader *l) {
    if (!l) return;
    for (int i = 0; i < l->nshards; i++) loom_shard_close(&l->shards[i]);
    free(l->shards);
    free(l->order);
    free(l->starts);
    free(l->batch_order);
    free(l);
}

uint64_t loom_loader_num_batches(const loom_loader *l) { return l->num_batches; }
uint64_t loom_loader_num_tokens(const loom_loader *l) { return l->num_tokens; }

// Copies n tokens of the epoch's stream from position pos into out (int32).
static void read_stream(const loom_loader *l, uint64_t pos, uint64_t n, int32_t *out) {
    int i = 0;
    while (i + 1 < l->nshards && l->starts[i + 1] <= pos) i++;
    for (uint64_t done = 0; done < n; i++) {
        const loom_shard *sh = &l->shards[l->order[i]];
        uint64_t from = pos + done - l->starts[i], avail = (uint64_t)sh->num_tokens - from;
        uint64_t take = n - done < avail ? n - done : avail;
        for (uint64_t k = 0; k < take; k++) out[done + k] = sh->tokens[from + k];
        done += take;
    }
}

void loom_loader_get(loom_loader *l, uint64_t index, int32_t *inputs, int32_t *targets) {
    int64_t e = (int64_t)(index / l->num_batches);
    uint64_t j = index % l->num_batches, BT = (uint64_t)l->B * (uint64_t)l->T;
    if (e != l->epoch) set_epoch(l, e);
    uint64_t start = l->shuffle ? l->offset + l->batch_order[j] * BT : j * BT;
    read_stream(l, start, BT, inputs);
    read_stream(l, start + 1, BT, targets);
}
