#include "model/gpt2_params.h"

#include "core/rng.h"

#include <math.h>

int64_t loom_gpt2_param_table(const loom_gpt2_config *cfg, loom_param_spec *s) {
    int64_t Vp = cfg->padded_vocab_size, C = cfg->channels, L = cfg->num_layers;
    int64_t maxT = cfg->max_seq_len;
    float std = 0.02f, res_std = 0.02f / sqrtf(2.0f * (float)L);
    const loom_param_spec table[LOOM_GPT2_NUM_TENSORS] = {
        {"wte", 2, {Vp, C}, 0, 0, INIT_NORMAL, std, true, false, -1},
        {"wpe", 2, {maxT, C}, 0, 0, INIT_NORMAL, std, true, false, -1},
        {"ln1w", 2, {L, C}, 0, 0, INIT_ONE, 0, false, true, 0},
        {"ln1b", 2, {L, C}, 0, 0, INIT_ZERO, 0, false, true, 0},
        {"qkvw", 3, {L, 3 * C, C}, 0, 0, INIT_NORMAL, std, true, true, 0},
        {"qkvb", 2, {L, 3 * C}, 0, 0, INIT_ZERO, 0, false, true, 0},
        {"attprojw", 3, {L, C, C}, 0, 0, INIT_NORMAL, res_std, true, true, 0},
        {"attprojb", 2, {L, C}, 0, 0, INIT_ZERO, 0, false, true, 0},
        {"ln2w", 2, {L, C}, 0, 0, INIT_ONE, 0, false, true, 0},
        {"ln2b", 2, {L, C}, 0, 0, INIT_ZERO, 0, false, true, 0},
        {"fcw", 3, {L, 4 * C, C}, 0, 0, INIT_NORMAL, std, true, true, 0},
        {"fcb", 2, {L, 4 * C}, 0, 0, INIT_ZERO, 0, false, true, 0},
        {"fcprojw", 3, {L, C, 4 * C}, 0, 0, INIT_NORMAL, res_std, true, true, 0},
        {"fcprojb", 2, {L, C}, 0, 0, INIT_ZERO, 0, false, true, 0},
        {"lnfw", 1, {C}, 0, 0, INIT_ONE, 0, false, false, (int)L},
        {"lnfb", 1, {C}, 0, 0, INIT_ZERO, 0, false, false, (int)L},
    };
    int64_t offset = 0;
    for (int t = 0; t < LOOM_GPT2_NUM_TENSORS; t++) {
        s[t] = table[t];
        s[t].numel = 1;
        for (int d = 0; d < s[t].ndim; d++) s[t].numel *= s[t].shape[d];
        s[t].offset = offset;
        offset += s[t].numel;
    }
    return offset;
}

float loom_gpt2_init_value(const loom_gpt2_config *cfg, const loom_param_spec *spec, int t,
                           int64_t index, uint64_t seed) {
    switch (spec->init) {
    case INIT_ZERO: return 0.0f;
    case INIT_ONE: return 1.0f;
    case INIT_NORMAL:
        if (t == P_WTE && index / cfg->channels >= cfg->vocab_size) return 0.0f; // padded rows
        return spec->std * (float)loom_rng_normal(seed, (uint64_t)t, (uint64_t)index);
    }
    return 0.0f;
}
