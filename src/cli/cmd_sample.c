// `loom sample`: generate text from a model file, streaming tokens as they are drawn.
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "model/generate.h"

#include <float.h>
#include <limits.h>
#include <string.h>


int loom_cmd_sample(int argc, char **argv) {
    const char *model_path = NULL, *prompt = "", *device = "auto", *precision = "auto", *vocab = NULL;
    int n = 64, top_k = 40, threads = 0;
    float temperature = 1.0f;
    int64_t seed = 1337;
    const loom_flag flags[] = {
        {"model", FLAG_STR, &model_path, "llm.c model file"},
        {"prompt", FLAG_STR, &prompt, "text to continue (empty: start of a document)"},
        {"tokens", FLAG_INT, &n, "tokens to generate at most (fewer when the model ends the document)", CLI_TOKENS_RANGE},
        {"temperature", FLAG_FLOAT, &temperature, "softmax temperature (0: greedy)", 0, FLT_MAX},
        {"top-k", FLAG_INT, &top_k, "sample among the k most likely tokens (0: all)", 0, INT_MAX},
        {"seed", FLAG_I64, &seed, "sampling seed", CLI_SEED_RANGE},
        {"vocab", FLAG_STR, &vocab, CLI_VOCAB_HELP},
        {"device", FLAG_STR, &device, CLI_DEVICE_HELP},
        {"precision", FLAG_STR, &precision, CLI_PRECISION_HELP},
        {"threads", FLAG_INT, &threads, "CPU threads (0: all cores)", CLI_THREADS_RANGE},
    };
    const loom_cli cli = {"sample",
                          "Generate text from a model, token by token, until --tokens tokens or the model draws\n"
                          "<|endoftext|> (id 50256, the end of a document; not printed), whichever comes first.",
                          "loom sample --model FILE [--prompt TEXT --tokens N --temperature X --top-k K]",
                          flags, (int)(sizeof flags / sizeof flags[0]), 0};
    bool help;
    char **pos;
    int npos;
    loom_backend *be = NULL;
    loom_gpt2 *m = NULL;
    loom_tokenizer *tok = NULL;
    int32_t *ids = NULL, *tokens = NULL;
    size_t nids = 0;
    loom_status s = loom_flags_parse(&cli, argc, argv, &help, &pos, &npos);
    if (s == LOOM_OK && help) return 0;
    if (s == LOOM_OK && !model_path) s = loom_fail(LOOM_EINVAL, "run 'loom sample --help'", "--model is required");
    if (s == LOOM_OK) s = loom_tokenizer_load(&tok, vocab);
    if (s == LOOM_OK) s = loom_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &nids);
    if (s == LOOM_OK) s = cli_open_backend(device, precision, threads, 0, &be);
    if (s == LOOM_OK) s = cli_load_model(be, model_path, &m);
    if (s == LOOM_OK) {
        int ctx = (int)nids + n < m->cfg.max_seq_len ? (int)nids + n : m->cfg.max_seq_len;
        s = loom_gpt2_alloc(m, 1, ctx > 0 ? ctx : 1, false);
    }
    if (s == LOOM_OK) {
        tokens = loom_xmalloc((nids + 1 + (size_t)n) * sizeof(int32_t));
        size_t np = 0;
        if (nids == 0) tokens[np++] = LOOM_EOT; // unconditional: start a new document
        for (size_t i = 0; i < nids; i++) {
            if (ids[i] >= m->cfg.vocab_size) {
                s = loom_fail(LOOM_EINVAL, "this model has a smaller vocabulary than GPT-2's",
                              "prompt token %d is outside the model's vocabulary (%d)", ids[i],
                              m->cfg.vocab_size);
                break;
            }
            tokens[np++] = ids[i];
        }
        if (s == LOOM_OK) {
            fwrite(prompt, 1, strlen(prompt), stdout);
            loom_sampling smp = {.temperature = temperature, .top_k = top_k, .seed = (uint64_t)seed};
            loom_generate(m, tokens, (int)np, n, &smp, cli_print_token, tok);
            printf("\n");
        }
    }
    if (s != LOOM_OK) loom_print_error();
    free(ids);
    free(tokens);
    loom_tokenizer_free(tok);
    loom_gpt2_free(m);
    loom_backend_destroy(be);
    return s == LOOM_OK ? 0 : 1;
}
