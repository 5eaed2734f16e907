#include "cli/metrics.h"

#include "cli/version.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"

#include <errno.h>
#include <omp.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct cli_metrics {
    FILE *f;
    char path[4096];
};

// The byte offset just past the last training record of step `step` in text[0, size) (-1: none),
// and the count of records after it.
static long long end_of_step(const char *text, size_t size, int64_t step, int *after) {
    long long end = -1;
    int lines = 0;
    for (size_t at = 0; at < size;) {
        const char *nl = memchr(text + at, '\n', size - at);
        size_t next = nl ? (size_t)(nl - text) + 1 : size;
        cJSON *j = cJSON_ParseWithLength(text + at, next - at);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
        if (cJSON_IsNumber(s) && s->valuedouble == (double)step && cJSON_GetObjectItemCaseSensitive(j, "loss"))
            end = (long long)next, lines = 0;
        else if (next - at > 1)
            lines++;
        cJSON_Delete(j);
        at = next;
    }
    *after = lines;
    return end;
}

// Resuming after `step`: cuts off what the interrupted run wrote after step's record.
static void cut_after(const char *path, int64_t step) {
    struct stat st;
    char *text = NULL;
    size_t size = 0;
    int after = 0;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || loom_read_file(path, &text, &size) != LOOM_OK) {
        loom_info("note: --metrics %s: appending (resumed from step %lld)\n", path, (long long)step);
        return;
    }
    long long end = end_of_step(text, size, step, &after);
    free(text);
    if (end < 0)
        loom_info("note: --metrics %s: appending to the whole file (resumed from step %lld; it has no record of "
                  "that step)\n", path, (long long)step);
    else if (after == 0 || truncate(path, (off_t)end) != 0)
        loom_info("note: --metrics %s: appending (resumed from step %lld)\n", path, (long long)step);
    else
        loom_info("note: --metrics %s: appending (resumed from step %lld; dropped the %d record%s the interrupted "
                  "run wrote after it)\n", path, (long long)step, after, loom_plural(after));
}

loom_status cli_metrics_open(cli_metrics **out, const char *path, int64_t resume_step) {
    *out = NULL;
    struct stat st;
    if (resume_step > 0) cut_after(path, resume_step);
    else if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
        loom_info("note: --metrics %s: replacing the file (a fresh run; --resume appends)\n", path);
    FILE *f = fopen(path, resume_step > 0 ? "a" : "w");
    if (!f)
        return loom_fail(LOOM_EIO, "check --metrics: its folder must exist and be writable",
                         "cannot open metrics file %s: %s", path, strerror(errno));
    cli_metrics *m = loom_xcalloc(1, sizeof *m);
    m->f = f;
    snprintf(m->path, sizeof m->path, "%s", path);
    *out = m;
    return LOOM_OK;
}

loom_status cli_metrics_write(cli_metrics *m, const cJSON *record) {
    char *line = cJSON_PrintUnformatted(record);
    int bad = fprintf(m->f, "%s\n", line) < 0 || fflush(m->f) != 0;
    free(line);
    if (bad)
        return loom_fail(LOOM_EIO, "check the disk behind --metrics", "cannot write metrics file %s: %s", m->path,
                         strerror(errno));
    return LOOM_OK;
}

loom_status cli_metrics_numbers(cli_metrics *m, const char *const *keys, const double *vals, int n) {
    cJSON *j = cJSON_CreateObject();
    for (int i = 0; i < n; i++) loom_json_add_number(j, keys[i], vals[i]);
    loom_status s = cli_metrics_write(m, j);
    cJSON_Delete(j);
    return s;
}

loom_status cli_metrics_close(cli_metrics *m) {
    if (!m) return LOOM_OK;
    int bad = fclose(m->f) != 0;
    loom_status s = bad ? loom_fail(LOOM_EIO, "check the disk behind --metrics", "cannot write metrics file %s: %s",
                                    m->path, strerror(errno))
                        : LOOM_OK;
    free(m);
    return s;
}

// A float flag's value as the user wrote it (6e-4, not 0.000600000028...).
static double as_printed(float v) {
    char text[32];
    snprintf(text, sizeof text, "%.7g", (double)v);
    return strtod(text, NULL);
}

loom_status cli_metrics_config(cli_metrics *m, const train_options *o, const loom_trainer *t) {
    const loom_gpt2_config *c = &t->model->cfg;
    char mesh[96];
    loom_mesh_describe(t->mesh, mesh, sizeof mesh);
    cJSON *j = cJSON_CreateObject(), *cfg = cJSON_AddObjectToObject(j, "config");
    cJSON_AddStringToObject(cfg, "loom", cli_version());
    cJSON_AddStringToObject(cfg, "commit", cli_commit());
    cJSON_AddStringToObject(cfg, "model", o->run.init ? o->run.init : o->model);
    const char *keys[] = {"L", "NH", "C", "maxT", "V", "params"};
    double vals[] = {c->num_layers, c->num_heads, c->channels, c->max_seq_len, c->vocab_size,
                     (double)loom_gpt2_num_params(c)};
    for (int i = 0; i < 6; i++) loom_json_add_number(cfg, keys[i], vals[i]);
    cJSON_AddStringToObject(cfg, "mesh", mesh);
    const char *mkeys[] = {"tp", "pp", "cp", "dp", "zero", "micro_batch", "seq", "global_batch", "grad_accum"};
    double mvals[] = {o->run.tp, o->run.pp, o->run.cp, t->dp_size, o->run.zero, o->run.batch, t->st.seq_len,
                      t->cfg.global_batch, t->grad_accum};
    for (int i = 0; i < 9; i++) loom_json_add_number(cfg, mkeys[i], mvals[i]);
    cJSON_AddStringToObject(cfg, "device", t->be->name);
    cJSON_AddStringToObject(cfg, "precision", loom_backend_precision(t->be));
    if (t->be->fp8) cJSON_AddStringToObject(cfg, "fp8_recipe", t->be->fp8_history ? "delayed" : "tensorwise");
    if (t->be->fp8_history) loom_json_add_number(cfg, "fp8_history", t->be->fp8_history);
    if (t->be->fp8_fast_dgrad) cJSON_AddBoolToObject(cfg, "fp8_fast_dgrad", true);
    if (t->be->gemm_autotune) cJSON_AddBoolToObject(cfg, "gemm_autotune", true); // rounding may differ by run
    loom_json_add_number(cfg, "logits_chunk", t->model->logits_chunk); // the output weight's gradient sums by chunk
    loom_json_add_number(cfg, "threads", omp_get_max_threads());
    const char *okeys[] = {"steps", "lr", "min_lr", "warmup"};
    double ovals[] = {(double)o->steps, as_printed(o->run.lr.max_lr), as_printed(o->run.lr.min_lr), o->warmup};
    for (int i = 0; i < 4; i++) loom_json_add_number(cfg, okeys[i], ovals[i]);
    cJSON_AddStringToObject(cfg, "schedule", o->schedule);
    loom_json_add_number(cfg, "seed", (double)t->st.seed);
    cJSON_AddStringToObject(cfg, "train_data", o->train_data);
    loom_json_add_number(cfg, "from_step", (double)t->st.step);
    loom_status s = cli_metrics_write(m, j);
    cJSON_Delete(j);
    return s;
}
