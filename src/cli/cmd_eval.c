// `loom eval`: validation loss of a model file on token shards — the mean loss over the first
// N micro-batches of the deterministic order (data/loader.h).
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "core/log.h"
#include "data/loader.h"

#include <limits.h>
#include <math.h>

int loom_cmd_eval(int argc, char **argv) {
    const char *model_path = NULL, *data = NULL, *device = "auto", *precision = "auto";
    int B = 4, T = 0, batches = 10, threads = 0;
    const loom_flag flags[] = {
        {"model", FLAG_STR, &model_path, "llm.c model file (version 3 fp32 or 5 bf16)"},
        {"data", FLAG_STR, &data, "token shards (file or glob)"},
        {"batch", FLAG_INT, &B, "micro-batch size B", CLI_BATCH_RANGE},
        {"seq", FLAG_INT, &T, "sequence length T (0: the model's maximum)", CLI_SEQ_RANGE},
        {"batches", FLAG_INT, &batches, "micro-batches to average over", 1, INT_MAX},
        {"device", FLAG_STR, &device, CLI_DEVICE_HELP},
        {"precision", FLAG_STR, &precision, CLI_PRECISION_HELP},
        {"threads", FLAG_INT, &threads, "CPU threads (0: all cores)", CLI_THREADS_RANGE},
    };
    const loom_cli cli = {"eval", "Mean next-token loss of a model on token shards.",
                          "loom eval --model FILE --data PATTERN [--batch B --seq T --batches N]",
                          flags, (int)(sizeof flags / sizeof flags[0]), 0};
    bool help;
    char **pos;
    int npos;
    loom_backend *be = NULL;
    loom_gpt2 *m = NULL;
    loom_loader *loader = NULL;
    int32_t *x = NULL, *y = NULL;
    loom_status s = loom_flags_parse(&cli, argc, argv, &help, &pos, &npos);
    if (s == LOOM_OK && help) return 0;
    if (s == LOOM_OK && (!model_path || !data))
        s = loom_fail(LOOM_EINVAL, "run 'loom eval --help'", "--model and --data are required");
    if (s == LOOM_OK) s = cli_open_backend(device, precision, threads, 0, &be);
    if (s == LOOM_OK) s = cli_load_model(be, model_path, &m);
    if (s == LOOM_OK && T == 0) T = m->cfg.max_seq_len;
    if (s == LOOM_OK) s = loom_gpt2_alloc(m, B, T, false);
    if (s == LOOM_OK) s = loom_loader_open(&loader, data, B, T, m->cfg.vocab_size, false, 0);
    if (s == LOOM_OK && (uint64_t)batches > loom_loader_num_batches(loader))
        s = loom_fail(LOOM_EINVAL, "lower --batches, --batch or --seq",
                      "--batches %d exceeds the %llu micro-batches of B=%d x T=%d in %s", batches,
                      (unsigned long long)loom_loader_num_batches(loader), B, T, data);
    if (s == LOOM_OK) {
        x = loom_xmalloc((size_t)B * T * sizeof(int32_t));
        y = loom_xmalloc((size_t)B * T * sizeof(int32_t));
        double sum = 0;
        for (int i = 0; i < batches; i++) {
            loom_loader_get(loader, (uint64_t)i, x, y);
            sum += loom_gpt2_loss(m, x, y, B, T);
        }
        if (isfinite(sum))
            printf("val_loss: %.6f\n", sum / batches);
        else
            s = loom_fail(LOOM_EFORMAT, "its values overflow in the forward pass: is it from a diverged run?",
                          "the loss of %s on %s is %g, not a finite number", model_path, data, sum / batches);
    }
    if (s != LOOM_OK) loom_print_error();
    free(x);
    free(y);
    loom_loader_close(loader);
    loom_gpt2_free(m);
    loom_backend_destroy(be);
    return s == LOOM_OK ? 0 : 1;
}
