// Tokenizer speed: GPT-2 BPE encoding of a folder of text (default: the Brown corpus text made
// by `make demo`) in MB/s, on one core and on all cores (one encoder per thread, documents
// handed out dynamically). Each run starts with cold pre-token caches.
//   bench_tokenizer [FOLDER]
#include "core/timer.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "core/log.h"

#include <omp.h>
#include <stdio.h>

static double encode_all(const loom_tokenizer *tok, const loom_corpus *c, int threads, size_t *ntokens) {
    size_t total = 0;
    double t0 = loom_now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        loom_encoder *enc = loom_encoder_create(tok);
        int32_t *ids = NULL;
        size_t cap = 0;
#pragma omp for schedule(dynamic, 1)
        for (size_t d = 0; d < c->n; d++) {
            size_t n = 0;
            LOOM_CHECK(loom_encoder_encode(enc, c->docs[d].text, c->docs[d].len, &ids, &n, &cap) == LOOM_OK);
            total += n;
        }
        free(ids);
        loom_encoder_free(enc);
    }
    *ntokens = total;
    return loom_now() - t0;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : LOOM_DATA_DIR "/brown/text";
    loom_tokenizer *tok;
    loom_corpus c = {0};
    if (loom_tokenizer_load(&tok, NULL) != LOOM_OK || loom_corpus_add(&c, dir, "text") != LOOM_OK) {
        loom_print_error();
        return 1;
    }
    int all = omp_get_num_procs();
    printf("tokenizer: %zu documents, %.1f MB from %s\n", c.n, c.bytes / 1e6, dir);
    printf("| threads | seconds | MB/s | tokens | Mtokens/s |\n|---|---|---|---|---|\n");
    int counts[2] = {1, all};
    for (int i = 0; i < (all > 1 ? 2 : 1); i++) {
        size_t ntok;
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double dt = encode_all(tok, &c, counts[i], &ntok);
            if (dt < best) best = dt;
        }
        printf("| %d | %.3f | %.2f | %zu | %.2f |\n", counts[i], best, c.bytes / 1e6 / best, ntok, ntok / 1e6 / best);
    }
    loom_corpus_free(&c);
    loom_tokenizer_free(tok);
    return 0;
}
