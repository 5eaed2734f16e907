#include "cli/common.h"

#include "ckpt/llmc_model.h"
#include "core/log.h"
#include "data/tokenizer.h"

#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

loom_status cli_open_backend(const char *device, const char *precision, int threads, int local_rank,
                             loom_backend **be) {
    omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs());
    return loom_backend_open(be, device, precision, local_rank);
}

loom_status cli_load_model(loom_backend *be, const char *path, loom_gpt2 **m) {
    loom_gpt2_config cfg;
    float *params;
    int64_t n;
    LOOM_TRY(loom_llmc_read(path, &cfg, &params, &n));
    loom_status s = loom_gpt2_create(m, be, &cfg);
    if (s == LOOM_OK) loom_gpt2_set_params(*m, params);
    free(params);
    return s;
}

loom_status cli_recompute_parse(const char *name, const char *precision, loom_recompute *mode) {
    if (strcmp(name, "auto") == 0) name = strcmp(precision, "fp8") == 0 ? "selective" : "none";
    loom_status s = loom_recompute_parse(name, mode);
    if (s != LOOM_OK)
        return loom_fail(LOOM_EINVAL, "modes are: auto, none, gelu, selective, full", "unknown --recompute mode '%s'",
                         name);
    return LOOM_OK;
}

loom_status cli_model_config(const char *name, int layers, int heads, int channels, int max_seq, int vocab,
                             loom_gpt2_config *cfg) {
    LOOM_TRY(loom_gpt2_config_named(name, cfg));
    if (layers > 0) cfg->num_layers = layers;
    if (heads > 0) cfg->num_heads = heads;
    if (channels > 0) cfg->channels = channels;
    if (max_seq > 0) cfg->max_seq_len = max_seq;
    if (vocab > 0) cfg->vocab_size = vocab, cfg->padded_vocab_size = loom_pad_vocab(vocab);
    return loom_gpt2_config_validate(cfg);
}

void cli_human_count(char *out, size_t cap, double n) {
    if (n >= 1e9) snprintf(out, cap, "%.2fB", n / 1e9);
    else if (n >= 1e6) snprintf(out, cap, "%.1fM", n / 1e6);
    else if (n >= 1e3) snprintf(out, cap, "%.1fK", n / 1e3);
    else snprintf(out, cap, "%.0f", n);
}

void cli_human_bytes(char *out, size_t cap, double b) { loom_format_bytes(out, cap, b, 2); }

void cli_human_duration(char *out, size_t cap, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
    else if (t >= 60) snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, cap, "%lds", t);
}

void cli_table_rule(void) {
    loom_info("+----------------------+------------------------------------------------------------+\n");
}

void cli_table_row(const char *key, const char *fmt, ...) {
    char value[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    loom_info("| %-20s | %-58s |\n", key, value);
}

int cli_print_token(int32_t token, void *ctx) {
    char *text;
    size_t len;
    if (loom_tokenizer_decode(ctx, &token, 1, &text, &len) == LOOM_OK) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        free(text);
    }
    return token == LOOM_EOT;
}
