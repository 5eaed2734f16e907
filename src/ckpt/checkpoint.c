#include "ckpt/checkpoint.h"

#include "ckpt/llmc_model.h"
#include "core/fileio.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static void model_path(char *out, size_t cap, const char *dir, int64_t step) {
    snprintf(out, cap, "%s/model_%08lld.bin", dir, (long long)step);
}
static void state_path(char *out, size_t cap, const char *dir, int64_t step, int rank) {
    snprintf(out, cap, "%s/state_%08lld_%05d.bin", dir, (long long)step, rank);
}
static void meta_path(char *out, size_t cap, const char *dir, int64_t step) {
    snprintf(out, cap, "%s/ckpt_%08lld.json", dir, (long long)step);
}

loom_status loom_ckpt_save_model(const char *dir, const loom_train_state *st, const loom_gpt2_config *cfg,
                                 const float *params, int64_t n) {
    char path[4200];
    model_path(path, sizeof path, dir, st->step);
    return loom_llmc_write(path, cfg, params, n);
}

loom_status loom_ckpt_save_state(const char *dir, const loom_train_state *st, int rank, const float *m,
                                 const float *v, const float *master, int64_t n) {
    char path[4200];
    state_path(path, sizeof path, dir, st->step, rank);
    int64_t h[32] = {LOOM_STATE_MAGIC, LOOM_STATE_VERSION, rank, st->world_size, st->step, n,
                     st->data_position, (int64_t)st->seed, st->zero, master != NULL};
    size_t bytes = (size_t)n * sizeof(float);
    return loom_atomic_save(path, (const void *[]){h, m, v, master},
                            (size_t[]){sizeof h, bytes, bytes, bytes}, master ? 4 : 3);
}

static const char *NUMBERS[] = {"step", "world_size", "zero", "state_files", "bucket_elements", "micro_batch",
                                "seq_len", "grad_accum", "data_position", "train_loss", "tp", "pp", "cp", "sp",
                                "virtual_stages", "v_shape", "dp_replicate"};
enum { NNUMBERS = sizeof NUMBERS / sizeof NUMBERS[0], NREQUIRED = 14 };
// the numbers that came later, when absent: the pipeline's two and hybrid sharding's replicas
static const double LATER_DEFAULTS[NNUMBERS - NREQUIRED] = {1, 0, 1};
// The range of each number, in the order of NUMBERS (integers but train_loss)
enum { TRAIN_LOSS = 9 };
static const double NUMBER_RANGE[NNUMBERS][2] = {
    {0, 0x1p53}, {1, INT_MAX}, {0, 3}, {1, INT_MAX}, {0, 0x1p53}, {1, INT_MAX}, {1, INT_MAX}, {1, INT_MAX},
    {0, 0x1p53}, {-INFINITY, INFINITY}, {1, INT_MAX}, {1, INT_MAX}, {1, INT_MAX}, {0, 1}, {1, INT_MAX}, {0, 1},
    {1, INT_MAX}};
static const char *DAMAGED = "the checkpoint metadata is damaged; resume from an older step";
static bool number_ok(int i, double x) {
    return isfinite(x) && x >= NUMBER_RANGE[i][0] && x <= NUMBER_RANGE[i][1] && (i == TRAIN_LOSS || x == floor(x));
}

static void state_numbers(const loom_train_state *st, double v[NNUMBERS]) {
    const double vals[NNUMBERS] = {(double)st->step, st->world_size, st->zero, st->state_files,
                                   (double)st->bucket_elements, st->micro_batch, st->seq_len,
                                   st->grad_accum, (double)st->data_position, st->train_loss,
                                   st->tp, st->pp, st->cp, st->sp, st->virtual_stages, st->v_shape,
                                   st->dp_replicate};
    memcpy(v, vals, sizeof vals);
}

static const char *SHARD_KINDS[] = {"replicated", "column", "row", "vocab"};

// The table's tensors: name, layer, whole shape, this rank's shard shape and how it splits.
static cJSON *table_json(const loom_param_table *t) {
    cJSON *list = cJSON_CreateArray();
    for (int i = 0; i < t->count; i++) {
        const loom_param *p = &t->params[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", p->name);
        cJSON_AddNumberToObject(e, "layer", p->layer);
        cJSON_AddItemToObject(e, "shape", cJSON_CreateDoubleArray((const double[]){(double)p->shape[0], (double)(p->ndim > 1 ? p->shape[1] : 1)}, p->ndim));
        cJSON_AddItemToObject(e, "shard_shape", cJSON_CreateDoubleArray((const double[]){(double)p->local_shape[0], (double)p->local_shape[1]}, p->ndim));
        cJSON_AddStringToObject(e, "shard", SHARD_KINDS[p->shard.kind]);
        cJSON_AddNumberToObject(e, "chunks", p->shard.chunks);
        cJSON_AddNumberToObject(e, "file_offset", (double)p->file_offset);
        cJSON_AddItemToArray(list, e);
    }
    return list;
}

loom_status loom_ckpt_save_meta(const char *dir, const loom_train_state *st, const loom_gpt2_config *cfg,
                                const loom_param_table *table) {
    cJSON *j = cJSON_CreateObject(), *c = cJSON_CreateObject(), *states = cJSON_CreateArray();
    char name[64], path[4200];
    cJSON_AddStringToObject(j, "format", "loom-checkpoint");
    cJSON_AddNumberToObject(j, "version", 3);
    double vals[NNUMBERS];
    state_numbers(st, vals);
    for (int i = 0; i < NNUMBERS; i++) cJSON_AddNumberToObject(j, NUMBERS[i], vals[i]);
    snprintf(name, sizeof name, "%" PRIu64, st->seed); // as text: JSON numbers lose 64-bit seeds
    cJSON_AddStringToObject(j, "seed", name);
    snprintf(name, sizeof name, "model_%08lld.bin", (long long)st->step);
    cJSON_AddStringToObject(j, "model", name);
    for (int r = 0; r < st->state_files; r++) {
        snprintf(name, sizeof name, "state_%08lld_%05d.bin", (long long)st->step, r);
        cJSON_AddItemToArray(states, cJSON_CreateString(name));
    }
    cJSON_AddItemToObject(j, "states", states);
    const char *dims[] = {"max_seq_len", "vocab_size", "padded_vocab_size", "num_layers", "num_heads", "channels"};
    const int dimv[] = {cfg->max_seq_len, cfg->vocab_size, cfg->padded_vocab_size, cfg->num_layers,
                        cfg->num_heads, cfg->channels};
    for (int i = 0; i < 6; i++) cJSON_AddNumberToObject(c, dims[i], dimv[i]);
    cJSON_AddItemToObject(j, "config", c);
    cJSON_AddItemToObject(j, "params", table_json(table));
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    meta_path(path, sizeof path, dir, st->step);
    loom_status s = loom_atomic_save(path, (const void *[]){text}, (size_t[]){strlen(text)}, 1);
    free(text);
    return s;
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

loom_status loom_ckpt_load_meta(const char *dir, int64_t step, loom_train_state *st) {
    char path[4200], *text;
    size_t len;
    meta_path(path, sizeof path, dir, step);
    LOOM_TRY(loom_read_file(path, &text, &len));
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    cJSON *seed = j ? cJSON_GetObjectItem(j, "seed") : NULL;
    loom_status s = LOOM_OK;
    if (!j || !cJSON_IsString(seed))
        s = loom_fail(LOOM_EFORMAT, "the checkpoint metadata is damaged; resume from an older step",
                      "checkpoint metadata %s is not valid loom checkpoint JSON", path);
    double v[NNUMBERS];
    for (int i = 0; s == LOOM_OK && i < NNUMBERS; i++) {
        cJSON *it = cJSON_GetObjectItem(j, NUMBERS[i]);
        if (!it && i >= NREQUIRED)
            v[i] = LATER_DEFAULTS[i - NREQUIRED];
        else if (!cJSON_IsNumber(it))
            s = loom_fail(LOOM_EFORMAT, "was it written by an older loom?", "checkpoint metadata %s lacks the number '%s'",
                          path, NUMBERS[i]);
        else if (!number_ok(i, it->valuedouble))
            s = i == TRAIN_LOSS
                    ? loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'train_loss' is %g, not a finite number",
                                path, it->valuedouble)
                    : loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: '%s' is %.17g, not an integer in [%.0f, %.0f]",
                                path, NUMBERS[i], it->valuedouble, NUMBER_RANGE[i][0], NUMBER_RANGE[i][1]);
        else
            v[i] = it->valuedouble;
    }
    if (s == LOOM_OK)
        *st = (loom_train_state){.step = (int64_t)v[0], .world_size = (int)v[1], .zero = (int)v[2],
                                 .state_files = (int)v[3], .bucket_elements = (int64_t)v[4],
                                 .micro_batch = (int)v[5], .seq_len = (int)v[6], .grad_accum = (int)v[7],
                                 .data_position = (int64_t)v[8], .train_loss = v[9], .tp = (int)v[10],
                                 .pp = (int)v[11], .cp = (int)v[12], .sp = (int)v[13],
                                 .virtual_stages = (int)v[14], .v_shape = (int)v[15], .dp_replicate = (int)v[16],
                                 .seed = strtoull(seed->valuestring, NULL, 10)};
    cJSON_Delete(j);
    return s;
}

loom_status loom_ckpt_load_model(const char *dir, int64_t step, loom_gpt2_config *cfg, float **params,
                                 int64_t *n) {
    char path[4200];
    model_path(path, sizeof path, dir, step);
    return loom_llmc_read(path, cfg, params, n);
}

loom_status loom_ckpt_load_state(const char *dir, const loom_train_state *st, int rank, float *m, float *v,
                                 float *master, bool *has_master, int64_t n) {
    *has_master = false;
    char path[4200];
    state_path(path, sizeof path, dir, st->step, rank);
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_EIO, NULL, "cannot open optimizer state %s: %s", path, strerror(errno));
    int64_t h[32];
    loom_status s = LOOM_OK;
    if (fread(h, sizeof h, 1, f) != 1 || h[0] != LOOM_STATE_MAGIC || h[1] != LOOM_STATE_VERSION)
        s = loom_fail(LOOM_EFORMAT, NULL, "optimizer state %s: bad header", path);
    else if (h[2] != rank || h[4] != st->step || h[5] != n)
        s = loom_fail(LOOM_EFORMAT, "the checkpoint files are from different runs",
                      "optimizer state %s: rank %lld step %lld with %lld elements, expected rank %d step %lld "
                      "with %lld", path, (long long)h[2], (long long)h[4], (long long)h[5], rank,
                      (long long)st->step, (long long)n);
    else if (fread(m, sizeof(float), (size_t)n, f) != (size_t)n ||
             fread(v, sizeof(float), (size_t)n, f) != (size_t)n ||
             (master && h[9] && fread(master, sizeof(float), (size_t)n, f) != (size_t)n))
        s = loom_fail(LOOM_EFORMAT, NULL, "optimizer state %s is truncated", path);
    else
        *has_master = master && h[9];
    fclose(f);
    return s;
}
