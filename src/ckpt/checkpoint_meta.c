// Checkpoint metadata (ckpt_S.json): written last by rank 0, it marks a checkpoint complete.
// Reading validates every field: a resume must never start from values a save cannot have
// written (a damaged or hand-edited file), since those resume and then write an unusable
// checkpoint, or allocate without bound.
#include "ckpt/checkpoint.h"

#include "core/fileio.h"
#include "core/json.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

static const char *DAMAGED = "the checkpoint metadata is damaged; resume from an older step";

// The numbers of the metadata: name, range, and the value when absent (NAN: required; the
// others came with later versions).
typedef struct {
    const char *name;
    double min, max, absent;
} number_field;

enum { TRAIN_LOSS = 9, NNUMBERS = 19 };
static const number_field NUMBERS[NNUMBERS] = {
    {"step", 0, 0x1p53, NAN},           {"world_size", 1, INT_MAX, NAN},     {"zero", 0, 3, NAN},
    {"state_files", 1, INT_MAX, NAN},   {"bucket_elements", 0, 0x1p53, NAN}, {"micro_batch", 1, INT_MAX, NAN},
    {"seq_len", 1, INT_MAX, NAN},       {"grad_accum", 1, INT_MAX, NAN},     {"data_position", 0, 0x1p53, NAN},
    {"train_loss", -INFINITY, INFINITY, NAN}, {"tp", 1, INT_MAX, NAN},        {"pp", 1, INT_MAX, NAN},
    {"cp", 1, INT_MAX, NAN},            {"sp", 0, 1, NAN},                   {"virtual_stages", 1, INT_MAX, 1},
    {"v_shape", 0, 1, 0},               {"dp_replicate", 1, INT_MAX, 1},     {"lr_total_steps", 0, 0x1p53, 0},
    {"model_crc32", 0, UINT32_MAX, -1}};

static void state_numbers(const loom_train_state *st, double v[NNUMBERS]) {
    const double vals[NNUMBERS] = {(double)st->step, st->world_size, st->zero, st->state_files,
                                   (double)st->bucket_elements, st->micro_batch, st->seq_len,
                                   st->grad_accum, (double)st->data_position, st->train_loss,
                                   st->tp, st->pp, st->cp, st->sp, st->virtual_stages, st->v_shape,
                                   st->dp_replicate, (double)st->lr_total_steps, (double)st->model_crc32};
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
        loom_json_add_number(e, "layer", p->layer);
        cJSON_AddItemToObject(e, "shape", cJSON_CreateDoubleArray((const double[]){(double)p->shape[0], (double)(p->ndim > 1 ? p->shape[1] : 1)}, p->ndim));
        cJSON_AddItemToObject(e, "shard_shape", cJSON_CreateDoubleArray((const double[]){(double)p->local_shape[0], (double)p->local_shape[1]}, p->ndim));
        cJSON_AddStringToObject(e, "shard", SHARD_KINDS[p->shard.kind]);
        loom_json_add_number(e, "chunks", p->shard.chunks);
        loom_json_add_number(e, "file_offset", (double)p->file_offset);
        cJSON_AddItemToArray(list, e);
    }
    return list;
}

loom_status loom_ckpt_save_meta(const char *dir, const loom_train_state *st, const loom_gpt2_config *cfg,
                                const loom_param_table *table) {
    cJSON *j = cJSON_CreateObject(), *c = cJSON_CreateObject(), *states = cJSON_CreateArray();
    char name[64], path[4200];
    cJSON_AddStringToObject(j, "format", "loom-checkpoint");
    loom_json_add_number(j, "version", LOOM_META_VERSION);
    double vals[NNUMBERS];
    state_numbers(st, vals);
    for (int i = 0; i < NNUMBERS; i++) loom_json_add_number(j, NUMBERS[i].name, vals[i]);
    snprintf(name, sizeof name, "%" PRIu64, st->seed); // as text: JSON numbers lose 64-bit seeds
    cJSON_AddStringToObject(j, "seed", name);
    loom_ckpt_path(name, sizeof name, NULL, LOOM_CKPT_MODEL, st->step, 0);
    cJSON_AddStringToObject(j, "model", name);
    for (int r = 0; r < st->state_files; r++) {
        loom_ckpt_path(name, sizeof name, NULL, LOOM_CKPT_STATE, st->step, r);
        cJSON_AddItemToArray(states, cJSON_CreateString(name));
    }
    cJSON_AddItemToObject(j, "states", states);
    const char *dims[] = {"max_seq_len", "vocab_size", "padded_vocab_size", "num_layers", "num_heads", "channels"};
    const int dimv[] = {cfg->max_seq_len, cfg->vocab_size, cfg->padded_vocab_size, cfg->num_layers,
                        cfg->num_heads, cfg->channels};
    for (int i = 0; i < 6; i++) loom_json_add_number(c, dims[i], dimv[i]);
    cJSON_AddItemToObject(j, "config", c);
    cJSON_AddItemToObject(j, "params", table_json(table));
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    loom_ckpt_path(path, sizeof path, dir, LOOM_CKPT_META, st->step, 0);
    loom_status s = loom_atomic_save(path, (const void *[]){text}, (size_t[]){strlen(text)}, 1);
    free(text);
    return s;
}

// "format" and "version". Errors: LOOM_EFORMAT.
static loom_status check_format(const char *path, const cJSON *j) {
    const cJSON *format = cJSON_GetObjectItem(j, "format"), *version = cJSON_GetObjectItem(j, "version");
    if (!cJSON_IsString(format) || strcmp(format->valuestring, "loom-checkpoint") != 0)
        return loom_fail(LOOM_EFORMAT, "is it the ckpt_S.json of a loom checkpoint folder?",
                         "checkpoint metadata %s: 'format' is not \"loom-checkpoint\"", path);
    if (!cJSON_IsNumber(version) || version->valuedouble < 3 || version->valuedouble > LOOM_META_VERSION ||
        version->valuedouble != floor(version->valuedouble))
        return loom_fail(LOOM_EFORMAT, "was it written by another version of loom?",
                         "checkpoint metadata %s: version %g; this loom reads versions 3 to %d", path,
                         cJSON_IsNumber(version) ? version->valuedouble : NAN, LOOM_META_VERSION);
    return LOOM_OK;
}

// The numbers, each in its range (integers but train_loss), into v. Errors: LOOM_EFORMAT.
static loom_status read_numbers(const char *path, const cJSON *j, double v[NNUMBERS]) {
    for (int i = 0; i < NNUMBERS; i++) {
        const number_field *f = &NUMBERS[i];
        const cJSON *it = cJSON_GetObjectItem(j, f->name);
        if (!it && !isnan(f->absent)) {
            v[i] = f->absent;
            continue;
        }
        if (!cJSON_IsNumber(it))
            return loom_fail(LOOM_EFORMAT, "was it written by an older loom?",
                             "checkpoint metadata %s lacks the number '%s'", path, f->name);
        double x = it->valuedouble;
        if (i == TRAIN_LOSS && !isfinite(x))
            return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'train_loss' is %g, not a finite number",
                             path, x);
        if (!isfinite(x) || x < f->min || x > f->max || (i != TRAIN_LOSS && x != floor(x)))
            return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: '%s' is %.17g, not an integer in [%.0f, %.0f]",
                             path, f->name, x, f->min, f->max);
        v[i] = x;
    }
    return LOOM_OK;
}

// The seed: decimal digits of an unsigned 64-bit integer. Errors: LOOM_EFORMAT.
static loom_status read_seed(const char *path, const cJSON *j, uint64_t *seed) {
    const cJSON *it = cJSON_GetObjectItem(j, "seed");
    if (!cJSON_IsString(it))
        return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s lacks the text 'seed'", path);
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(it->valuestring, &end, 10);
    if (!isdigit((unsigned char)it->valuestring[0]) || *end != '\0' || errno == ERANGE)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'seed' is '%s', not an unsigned 64-bit integer",
                         path, it->valuestring);
    *seed = v;
    return LOOM_OK;
}

// The numbers against each other and the file's step: what a save writes. Errors: LOOM_EFORMAT.
static loom_status check_consistent(const char *path, const loom_train_state *st, int64_t step) {
    if (st->step != step)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'step' is %lld, not %lld", path,
                         (long long)st->step, (long long)step);
    double mp = (double)st->tp * st->pp * st->cp, dp = st->world_size / mp;
    if (dp != floor(dp) || fmod(dp, st->dp_replicate) != 0)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: %d ranks do not fill a mesh of tp %d x pp %d x cp %d "
                         "with %d replicas", path, st->world_size, st->tp, st->pp, st->cp, st->dp_replicate);
    double states = st->zero == 0 ? mp : st->world_size;
    if (st->state_files != states)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'state_files' is %d, but ZeRO %d on %d ranks "
                         "saves %.0f", path, st->state_files, st->zero, st->world_size, states);
    if (st->sp && st->tp == 1)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'sp' is 1 with 'tp' 1", path);
    if (st->v_shape && st->virtual_stages != 2)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'v_shape' is 1 with %d virtual stages, not 2",
                         path, st->virtual_stages);
    double position = (double)st->step * dp * st->grad_accum;
    if ((double)st->data_position != position)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'data_position' is %lld, but %lld steps of "
                         "%.0f dp ranks x accumulation %d make %.0f", path, (long long)st->data_position,
                         (long long)st->step, dp, st->grad_accum, position);
    return LOOM_OK;
}

// "model" and "states" name this step's files, and the model file is there. Errors: LOOM_EFORMAT.
static loom_status check_files(const char *dir, const char *path, const cJSON *j, const loom_train_state *st) {
    char want[64], file[4200];
    const cJSON *model = cJSON_GetObjectItem(j, "model"), *states = cJSON_GetObjectItem(j, "states");
    loom_ckpt_path(want, sizeof want, NULL, LOOM_CKPT_MODEL, st->step, 0);
    if (!cJSON_IsString(model) || strcmp(model->valuestring, want) != 0)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'model' is not \"%s\"", path, want);
    if (!cJSON_IsArray(states) || cJSON_GetArraySize(states) != st->state_files)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'states' is not a list of state_files = %d "
                         "names", path, st->state_files);
    for (int r = 0; r < st->state_files; r++) {
        const cJSON *name = cJSON_GetArrayItem(states, r);
        loom_ckpt_path(want, sizeof want, NULL, LOOM_CKPT_STATE, st->step, r);
        if (!cJSON_IsString(name) || strcmp(name->valuestring, want) != 0)
            return loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s: 'states' entry %d is not \"%s\"", path, r,
                             want);
    }
    struct stat sb;
    loom_ckpt_path(file, sizeof file, dir, LOOM_CKPT_MODEL, st->step, 0);
    if (stat(file, &sb) != 0 || !S_ISREG(sb.st_mode))
        return loom_fail(LOOM_EFORMAT, "the checkpoint is incomplete; resume from an older step",
                         "checkpoint metadata %s names model file %s, which is %s", path, file,
                         stat(file, &sb) != 0 ? "missing" : loom_file_kind(sb.st_mode));
    return LOOM_OK;
}

loom_status loom_ckpt_load_meta(const char *dir, int64_t step, loom_train_state *st) {
    char path[4200], *text;
    size_t len;
    loom_ckpt_path(path, sizeof path, dir, LOOM_CKPT_META, step, 0);
    LOOM_TRY(loom_read_file(path, &text, &len));
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    loom_status s = cJSON_IsObject(j) ? check_format(path, j)
                                      : loom_fail(LOOM_EFORMAT, DAMAGED, "checkpoint metadata %s is not a JSON object", path);
    double v[NNUMBERS];
    uint64_t seed = 0;
    if (s == LOOM_OK) s = read_numbers(path, j, v);
    if (s == LOOM_OK) s = read_seed(path, j, &seed);
    if (s == LOOM_OK) {
        *st = (loom_train_state){.step = (int64_t)v[0], .world_size = (int)v[1], .zero = (int)v[2],
                                 .state_files = (int)v[3], .bucket_elements = (int64_t)v[4],
                                 .micro_batch = (int)v[5], .seq_len = (int)v[6], .grad_accum = (int)v[7],
                                 .data_position = (int64_t)v[8], .train_loss = v[9], .tp = (int)v[10],
                                 .pp = (int)v[11], .cp = (int)v[12], .sp = (int)v[13],
                                 .virtual_stages = (int)v[14], .v_shape = (int)v[15], .dp_replicate = (int)v[16],
                                 .lr_total_steps = (int64_t)v[17], .model_crc32 = (int64_t)v[18], .seed = seed};
        s = check_consistent(path, st, step);
    }
    if (s == LOOM_OK) s = check_files(dir, path, j, st);
    cJSON_Delete(j);
    return s;
}
