#include "model/gpt2_config.h"

#include <string.h>

typedef struct {
    const char *name;
    int L, NH, C, maxT;
} named_config;

static const named_config NAMED[] = {
    {"gpt2-mini", 4, 4, 128, 256},  {"gpt2", 12, 12, 768, 1024},
    {"gpt2-medium", 24, 16, 1024, 1024}, {"gpt2-large", 36, 20, 1280, 1024},
    {"gpt2-xl", 48, 25, 1600, 1024},
};

int loom_pad_vocab(int V) { return (V + 127) / 128 * 128; }

loom_status loom_gpt2_config_named(const char *name, loom_gpt2_config *cfg) {
    for (size_t i = 0; i < sizeof NAMED / sizeof NAMED[0]; i++) {
        if (strcmp(name, NAMED[i].name) != 0) continue;
        *cfg = (loom_gpt2_config){.max_seq_len = NAMED[i].maxT,
                                  .vocab_size = 50257,
                                  .padded_vocab_size = loom_pad_vocab(50257),
                                  .num_layers = NAMED[i].L,
                                  .num_heads = NAMED[i].NH,
                                  .channels = NAMED[i].C};
        return LOOM_OK;
    }
    return loom_fail(LOOM_EINVAL, "models are: gpt2-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl",
                     "unknown model '%s'", name);
}

loom_status loom_gpt2_config_validate(const loom_gpt2_config *c) {
    const char *hint = "check --layers/--heads/--channels/--max-seq or the model file header";
    if (c->num_layers < 1) return loom_fail(LOOM_EINVAL, hint, "layers must be >= 1, got %d", c->num_layers);
    if (c->num_heads < 1) return loom_fail(LOOM_EINVAL, hint, "heads must be >= 1, got %d", c->num_heads);
    if (c->channels < 1) return loom_fail(LOOM_EINVAL, hint, "channels must be >= 1, got %d", c->channels);
    if (c->max_seq_len < 1)
        return loom_fail(LOOM_EINVAL, hint, "max sequence length must be >= 1, got %d", c->max_seq_len);
    if (c->vocab_size < 1) return loom_fail(LOOM_EINVAL, hint, "vocabulary must be >= 1, got %d", c->vocab_size);
    if (c->channels % c->num_heads != 0)
        return loom_fail(LOOM_EINVAL, hint, "channels %d are not divisible by heads %d", c->channels,
                         c->num_heads);
    if (c->padded_vocab_size < c->vocab_size)
        return loom_fail(LOOM_EINVAL, hint, "padded vocabulary %d is smaller than the vocabulary %d",
                         c->padded_vocab_size, c->vocab_size);
    return LOOM_OK;
}

static const int64_t PER_LAYER_C2 = 12, PER_LAYER_C = 13; // ln1 2C, qkv 3C^2+3C, proj C^2+C, ln2 2C, fc 4C^2+4C, fcproj 4C^2+C

int64_t loom_gpt2_file_elements(const loom_gpt2_config *c) {
    int64_t C = c->channels, L = c->num_layers;
    return ((int64_t)c->padded_vocab_size + c->max_seq_len) * C + L * (PER_LAYER_C2 * C * C + PER_LAYER_C * C) + 2 * C;
}

int64_t loom_gpt2_num_params(const loom_gpt2_config *c) {
    int64_t C = c->channels, L = c->num_layers;
    int64_t per_layer = PER_LAYER_C2 * C * C + PER_LAYER_C * C;
    return (int64_t)c->vocab_size * C + (int64_t)c->max_seq_len * C + L * per_layer + 2 * C;
}

double loom_gpt2_flops_per_token(const loom_gpt2_config *c, int T) {
    return 6.0 * (double)loom_gpt2_num_params(c) + 6.0 * c->num_layers * (double)T * c->channels;
}
