// `loom tokenize`: text and JSON Lines in, GPT-2 token shards out (llm.c format), with a
// validation split; `loom encode` / `loom decode`: text <-> ids on the command line.
//
// Tokenize reads and encodes everything before it writes anything, so bad input leaves no
// partial output. Each document becomes <|endoftext|> followed by its tokens (as llm.c's
// dataset scripts do). Split: with fraction f, document i goes to validation when
// floor((i+1) f) > floor(i f) — evenly spread over the inputs; a single document instead gives
// the last f of its tokens to validation.
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/corpus.h"
#include "data/shard.h"
#include "core/fileio.h"
#include "data/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    uint16_t *tokens;
    int64_t n, cap;
} token_stream;

static void stream_push(token_stream *s, const int32_t *ids, size_t n) {
    if (s->n + (int64_t)n > s->cap) {
        s->cap = 2 * (s->n + (int64_t)n) + 1024;
        s->tokens = realloc(s->tokens, (size_t)s->cap * sizeof(uint16_t));
        LOOM_CHECK(s->tokens);
    }
    for (size_t i = 0; i < n; i++) s->tokens[s->n++] = (uint16_t)ids[i];
}

// Encodes every document in parallel (one encoder per thread). ids[d], nids[d] per document.
static loom_status encode_all(const loom_tokenizer *tok, const loom_corpus *c, int32_t **ids, size_t *nids) {
    loom_status first_error = LOOM_OK;
    char message[1024] = "", hint[512] = "";
#pragma omp parallel
    {
        loom_encoder *enc = loom_encoder_create(tok);
#pragma omp for schedule(dynamic, 1)
        for (size_t d = 0; d < c->n; d++) {
            size_t cap = 0;
            nids[d] = 0;
            loom_status s = loom_encoder_encode(enc, c->docs[d].text, c->docs[d].len, &ids[d], &nids[d], &cap);
#pragma omp critical
            if (s != LOOM_OK && first_error == LOOM_OK) {
                first_error = s;
                snprintf(message, sizeof message, "%s", loom_error_message());
                snprintf(hint, sizeof hint, "%s", loom_error_hint());
            }
        }
        loom_encoder_free(enc);
    }
    if (first_error != LOOM_OK) return loom_fail(first_error, hint, "%s", message);
    return LOOM_OK;
}

// Writes a stream as shards <out>/<name>_<split>_NNNNNN.bin of at most shard_tokens each.
// On failure the shards already written by this call are removed.
static loom_status write_split(const token_stream *s, const char *out, const char *name, const char *split,
                               int64_t shard_tokens, int *nshards) {
    *nshards = 0;
    char path[4200];
    for (int64_t off = 0; off < s->n; off += shard_tokens, (*nshards)++) {
        int64_t n = s->n - off < shard_tokens ? s->n - off : shard_tokens;
        snprintf(path, sizeof path, "%s/%s_%s_%06d.bin", out, name, split, *nshards);
        loom_status st = loom_shard_write(path, s->tokens + off, n);
        if (st != LOOM_OK) {
            for (int k = 0; k < *nshards; k++) {
                snprintf(path, sizeof path, "%s/%s_%s_%06d.bin", out, name, split, k);
                unlink(path);
            }
            return st;
        }
    }
    return LOOM_OK;
}

int loom_cmd_tokenize(int argc, char **argv) {
    const char *out = NULL, *name = "data", *format = "auto", *vocab = NULL;
    float val_fraction = 0.1f;
    int64_t shard_tokens = 100000000;
    int threads = 0;
    const loom_flag flags[] = {
        {"out", FLAG_STR, &out, "output folder for the shards (created if missing)"},
        {"name", FLAG_STR, &name, "shard name prefix: NAME_train_000000.bin, NAME_val_000000.bin"},
        {"val-fraction", FLAG_FLOAT, &val_fraction, "share of documents for the validation split", 0, 1, FLAG_BELOW_MAX},
        {"shard-tokens", FLAG_I64, &shard_tokens, "tokens per shard at most", 1, INT32_MAX},
        {"format", FLAG_STR, &format, "auto (.jsonl/.json are JSON Lines), text or jsonl"},
        {"vocab", FLAG_STR, &vocab, CLI_VOCAB_HELP},
        {"threads", FLAG_INT, &threads, "encoding threads (0: all cores)", CLI_THREADS_RANGE},
    };
    const loom_cli cli = {"tokenize", "Tokenize text or JSON Lines files into GPT-2 token shards.",
                          "loom tokenize --out DIR [flags] INPUT...", flags,
                          (int)(sizeof flags / sizeof flags[0]), 1 << 20};
    bool help;
    char **inputs;
    int ninputs;
    loom_status s = loom_flags_parse(&cli, argc, argv, &help, &inputs, &ninputs);
    if (s == LOOM_OK && help) return 0;
    if (s == LOOM_OK && (!out || ninputs == 0))
        s = loom_fail(LOOM_EINVAL, "e.g. loom tokenize --out data/x texts/", "--out and at least one input are required");
    loom_tokenizer *tok = NULL;
    loom_corpus corpus = {0};
    if (s == LOOM_OK) s = loom_tokenizer_load(&tok, vocab);
    for (int i = 0; s == LOOM_OK && i < ninputs; i++) s = loom_corpus_add(&corpus, inputs[i], format);
    if (s == LOOM_OK && corpus.n == 0)
        s = loom_fail(LOOM_EINVAL, "give text files, folders of them, or JSON Lines", "no documents found in the inputs");
    if (s == LOOM_OK && mkdir(out, 0755) != 0 && errno != EEXIST)
        s = loom_fail(LOOM_EIO, "check --out", "cannot create output folder %s: %s", out, strerror(errno));
    int32_t **ids = s == LOOM_OK ? loom_xcalloc(corpus.n, sizeof *ids) : NULL;
    size_t *nids = s == LOOM_OK ? loom_xcalloc(corpus.n, sizeof *nids) : NULL;
    omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs());
    double t0 = loom_now();
    if (s == LOOM_OK) s = encode_all(tok, &corpus, ids, nids);
    double dt = loom_now() - t0;
    token_stream train = {0}, val = {0};
    int ntrain = 0, nval = 0;
    if (s == LOOM_OK) {
        const int32_t eot = LOOM_EOT;
        for (size_t d = 0; d < corpus.n; d++) {
            bool to_val = floor((double)(d + 1) * val_fraction) > floor((double)d * val_fraction);
            token_stream *dst = to_val ? &val : &train;
            stream_push(dst, &eot, 1);
            stream_push(dst, ids[d], nids[d]);
        }
        if (val_fraction > 0 && val.n == 0) { // one document: the last tokens validate
            int64_t k = (int64_t)ceil(val_fraction * (double)train.n);
            val.tokens = loom_xmalloc((size_t)k * sizeof(uint16_t));
            memcpy(val.tokens, train.tokens + train.n - k, (size_t)k * sizeof(uint16_t));
            val.n = k;
            train.n -= k;
        }
        s = write_split(&val, out, name, "val", shard_tokens, &nval);
        if (s == LOOM_OK) s = write_split(&train, out, name, "train", shard_tokens, &ntrain);
    }
    if (s == LOOM_OK)
        loom_info("tokenized %zu document%s from %d file%s (%.1f MB) in %.2f s: %.2f MB/s on %d thread%s\n"
                  "  train: %lld token%s in %d shard%s, val: %lld token%s in %d shard%s -> %s/%s_*.bin\n",
                  corpus.n, loom_plural((long long)corpus.n), corpus.files, loom_plural(corpus.files),
                  corpus.bytes / 1e6, dt, corpus.bytes / 1e6 / dt, omp_get_max_threads(),
                  loom_plural(omp_get_max_threads()), (long long)train.n, loom_plural(train.n), ntrain,
                  loom_plural(ntrain), (long long)val.n, loom_plural(val.n), nval, loom_plural(nval), out, name);
    else
        loom_print_error();
    for (size_t d = 0; ids && d < corpus.n; d++) free(ids[d]);
    free(ids);
    free(nids);
    free(train.tokens);
    free(val.tokens);
    loom_corpus_free(&corpus);
    loom_tokenizer_free(tok);
    return s == LOOM_OK ? 0 : 1;
}

// Reads all of stdin into a malloc'ed buffer, NUL-terminated (*len excludes the NUL).
static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16;
    char *buf = loom_xmalloc(cap);
    *len = 0;
    size_t got;
    while ((got = fread(buf + *len, 1, cap - *len, stdin)) > 0) {
        *len += got;
        if (*len == cap) buf = realloc(buf, cap *= 2);
        LOOM_CHECK(buf);
    }
    buf[*len] = '\0'; // decode tokenizes it as a string (the loop leaves *len < cap)
    return buf;
}

int loom_cmd_encode(int argc, char **argv) {
    const char *text = NULL, *vocab = NULL;
    const loom_flag flags[] = {
        {"text", FLAG_STR, &text, "text to encode (default: the file argument, or stdin)"},
        {"vocab", FLAG_STR, &vocab, CLI_VOCAB_HELP},
    };
    const loom_cli cli = {"encode", "Print the GPT-2 token ids of a text, separated by spaces.",
                          "loom encode [--text TEXT | FILE]", flags, 2, 1};
    bool help;
    char **pos;
    int npos;
    loom_status s = loom_flags_parse(&cli, argc, argv, &help, &pos, &npos);
    if (s == LOOM_OK && help) return 0;
    char *data = NULL;
    size_t len = 0;
    if (s == LOOM_OK && !text) {
        if (npos) s = loom_read_file(pos[0], &data, &len);
        else data = read_stdin(&len);
    }
    loom_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (s == LOOM_OK) s = loom_tokenizer_load(&tok, vocab);
    if (s == LOOM_OK) s = loom_tokenizer_encode(tok, text ? text : data, text ? strlen(text) : len, &ids, &n);
    if (s == LOOM_OK) {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    } else {
        loom_print_error();
    }
    free(ids);
    free(data);
    loom_tokenizer_free(tok);
    return s == LOOM_OK ? 0 : 1;
}

int loom_cmd_decode(int argc, char **argv) {
    const char *vocab = NULL;
    bool exact = false;
    const loom_flag flags[] = {
        {"vocab", FLAG_STR, &vocab, CLI_VOCAB_HELP},
        {"no-newline", FLAG_BOOL, &exact, "write the text's bytes only (round trips: encode | decode --no-newline)"},
    };
    const loom_cli cli = {"decode",
                          "Write the text of GPT-2 token ids (arguments, or stdin), then a newline when it lacks one.",
                          "loom decode [--no-newline] [ID...]", flags, 2, 1 << 20};
    bool help;
    char **pos;
    int npos;
    loom_status s = loom_flags_parse(&cli, argc, argv, &help, &pos, &npos);
    if (s == LOOM_OK && help) return 0;
    size_t len = 0, n = 0;
    char *input = NULL, *save = NULL, *text = NULL;
    int32_t *ids = NULL;
    if (s == LOOM_OK && npos == 0) input = read_stdin(&len);
    size_t cap = npos ? (size_t)npos : len / 2 + 1;
    ids = loom_xmalloc(cap * sizeof(int32_t));
    for (int i = 0; s == LOOM_OK; i++) {
        char *word = npos ? (i < npos ? pos[i] : NULL) : strtok_r(i ? NULL : input, " \t\r\n", &save);
        if (!word) break;
        char *end;
        long v = strtol(word, &end, 10);
        if (*end != '\0' || end == word || v < INT32_MIN || v > INT32_MAX)
            s = loom_fail(LOOM_EINVAL, "give integer token ids", "'%s' is not a token id", word);
        else
            ids[n++] = (int32_t)v;
    }
    loom_tokenizer *tok = NULL;
    if (s == LOOM_OK) s = loom_tokenizer_load(&tok, vocab);
    if (s == LOOM_OK) s = loom_tokenizer_decode(tok, ids, n, &text, &len);
    if (s == LOOM_OK) { // the text, ending with a newline (added when it lacks one)
        fwrite(text, 1, len, stdout);
        if (!exact && (len == 0 || text[len - 1] != '\n')) fputc('\n', stdout);
    } else {
        loom_print_error();
    }
    free(text);
    free(ids);
    free(input);
    loom_tokenizer_free(tok);
    return s == LOOM_OK ? 0 : 1;
}
