#include "ckpt/checkpoint.h"

#include "ckpt/llmc_model.h"
#include "core/fileio.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static void ckpt_path(char *out, size_t cap, const char *dir, const char *kind, int64_t step,
                      const char *ext) {
    snprintf(out, cap, "%s/%s_%08lld%s", dir, kind, (long long)step, ext);
}

static loom_status write_state(const char *path, const loom_train_state *st, const float *m,
                               const float *v, int64_t n) {
    int64_t h[32] = {LOOM_STATE_MAGIC, 1, 0, st->world_size, st->step, n, st->data_position,
                     (int64_t)st->seed};
    size_t bytes = (size_t)n * sizeof(float);
    return loom_atomic_save(path, (const void *[]){h, m, v}, (size_t[]){sizeof h, bytes, bytes}, 3);
}

static loom_status write_meta(const char *path, const loom_train_state *st,
                              const loom_gpt2_config *cfg, const char *model, const char *state) {
    cJSON *j = cJSON_CreateObject(), *c = cJSON_CreateObject(), *states = cJSON_CreateArray();
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, st->seed);
    cJSON_AddStringToObject(j, "format", "loom-checkpoint");
    cJSON_AddNumberToObject(j, "version", 1);
    cJSON_AddNumberToObject(j, "step", (double)st->step);
    cJSON_AddNumberToObject(j, "world_size", st->world_size);
    cJSON_AddStringToObject(j, "model", model);
    cJSON_AddItemToArray(states, cJSON_CreateString(state));
    cJSON_AddItemToObject(j, "states", states);
    cJSON_AddNumberToObject(c, "max_seq_len", cfg->max_seq_len);
    cJSON_AddNumberToObject(c, "vocab_size", cfg->vocab_size);
    cJSON_AddNumberToObject(c, "padded_vocab_size", cfg->padded_vocab_size);
    cJSON_AddNumberToObject(c, "num_layers", cfg->num_layers);
    cJSON_AddNumberToObject(c, "num_heads", cfg->num_heads);
    cJSON_AddNumberToObject(c, "channels", cfg->channels);
    cJSON_AddItemToObject(j, "config", c);
    cJSON_AddNumberToObject(j, "micro_batch", st->micro_batch);
    cJSON_AddNumberToObject(j, "seq_len", st->seq_len);
    cJSON_AddNumberToObject(j, "grad_accum", st->grad_accum);
    cJSON_AddStringToObject(j, "seed", seed);
    cJSON_AddNumberToObject(j, "data_position", (double)st->data_position);
    cJSON_AddNumberToObject(j, "train_loss", st->train_loss);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    loom_status s = loom_atomic_save(path, (const void *[]){text}, (size_t[]){strlen(text)}, 1);
    free(text);
    return s;
}

loom_status loom_ckpt_save(const char *dir, const loom_train_state *st, const loom_gpt2_config *cfg,
                           const float *params, const float *m, const float *v, int64_t n) {
    char model[4200], state[4200], meta[4200], model_name[64], state_name[64];
    ckpt_path(model, sizeof model, dir, "model", st->step, ".bin");
    snprintf(state, sizeof state, "%s/state_%08lld_%05d.bin", dir, (long long)st->step, 0);
    ckpt_path(meta, sizeof meta, dir, "ckpt", st->step, ".json");
    snprintf(model_name, sizeof model_name, "model_%08lld.bin", (long long)st->step);
    snprintf(state_name, sizeof state_name, "state_%08lld_%05d.bin", (long long)st->step, 0);
    LOOM_TRY(loom_llmc_write(model, cfg, params, n));
    LOOM_TRY(write_state(state, st, m, v, n));
    return write_meta(meta, st, cfg, model_name, state_name);
}

loom_status loom_ckpt_latest(const char *dir, int64_t *step) {
    *step = -1;
    DIR *d = opendir(dir);
    if (!d)
        return loom_fail(LOOM_EIO, "check --ckpt-dir", "cannot read checkpoint folder %s: %s", dir,
                         strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long s;
        char tail[8];
        // exactly ckpt_<digits>.json (a leftover temporary has a longer name)
        if (sscanf(e->d_name, "ckpt_%lld.%5s", &s, tail) == 2 && strcmp(tail, "json") == 0 &&
            strlen(e->d_name) == 18 && s > *step)
            *step = s;
    }
    closedir(d);
    return LOOM_OK;
}

static loom_status read_meta(const char *path, loom_train_state *st, char *state_name, size_t cap) {
    char *text;
    size_t len;
    LOOM_TRY(loom_read_file(path, &text, &len));
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    const char *fields[] = {"step", "world_size", "micro_batch", "seq_len", "grad_accum",
                            "data_position", "train_loss"};
    double vals[7];
    cJSON *seed = j ? cJSON_GetObjectItem(j, "seed") : NULL;
    cJSON *states = j ? cJSON_GetObjectItem(j, "states") : NULL;
    loom_status s = LOOM_OK;
    if (!j || !cJSON_IsString(seed) || !cJSON_IsArray(states) ||
        !cJSON_IsString(cJSON_GetArrayItem(states, 0)))
        s = loom_fail(LOOM_EFORMAT, "the checkpoint metadata is damaged; resume from an older step",
                      "checkpoint metadata %s is not valid loom checkpoint JSON", path);
    for (int i = 0; s == LOOM_OK && i < 7; i++) {
        cJSON *it = cJSON_GetObjectItem(j, fields[i]);
        if (!cJSON_IsNumber(it))
            s = loom_fail(LOOM_EFORMAT, NULL, "checkpoint metadata %s lacks the number '%s'", path,
                          fields[i]);
        else
            vals[i] = it->valuedouble;
    }
    if (s == LOOM_OK) {
        *st = (loom_train_state){.step = (int64_t)vals[0], .world_size = (int)vals[1],
                                 .micro_batch = (int)vals[2], .seq_len = (int)vals[3],
                                 .grad_accum = (int)vals[4], .data_position = (int64_t)vals[5],
                                 .train_loss = vals[6], .seed = strtoull(seed->valuestring, NULL, 10)};
        snprintf(state_name, cap, "%s", cJSON_GetArrayItem(states, 0)->valuestring);
    }
    cJSON_Delete(j);
    return s;
}

static loom_status read_state(const char *path, const loom_train_state *st, int64_t n, float *m,
                              float *v) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_EIO, NULL, "cannot open optimizer state %s: %s", path, strerror(errno));
    int64_t h[32];
    loom_status s = LOOM_OK;
    if (fread(h, sizeof h, 1, f) != 1 || h[0] != LOOM_STATE_MAGIC || h[1] != 1)
        s = loom_fail(LOOM_EFORMAT, NULL, "optimizer state %s: bad header", path);
    else if (h[4] != st->step || h[5] != n)
        s = loom_fail(LOOM_EFORMAT, "the checkpoint files are from different runs",
                      "optimizer state %s: step %lld with %lld elements, expected step %lld with %lld",
                      path, (long long)h[4], (long long)h[5], (long long)st->step, (long long)n);
    else if (fread(m, sizeof(float), (size_t)n, f) != (size_t)n ||
             fread(v, sizeof(float), (size_t)n, f) != (size_t)n)
        s = loom_fail(LOOM_EFORMAT, NULL, "optimizer state %s is truncated", path);
    fclose(f);
    return s;
}

loom_status loom_ckpt_load(const char *dir, int64_t step, loom_train_state *st,
                           loom_gpt2_config *cfg, float **params, float **m, float **v, int64_t *n) {
    char meta[4200], model[4200], state[4200], state_name[256];
    *params = *m = *v = NULL;
    ckpt_path(meta, sizeof meta, dir, "ckpt", step, ".json");
    ckpt_path(model, sizeof model, dir, "model", step, ".bin");
    LOOM_TRY(read_meta(meta, st, state_name, sizeof state_name));
    snprintf(state, sizeof state, "%s/%s", dir, state_name);
    LOOM_TRY(loom_llmc_read(model, cfg, params, n));
    *m = loom_xmalloc((size_t)*n * sizeof(float));
    *v = loom_xmalloc((size_t)*n * sizeof(float));
    loom_status s = read_state(state, st, *n, *m, *v);
    if (s != LOOM_OK) {
        free(*params);
        free(*m);
        free(*v);
        *params = *m = *v = NULL;
    }
    return s;
}
