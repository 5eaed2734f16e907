#include "cli/plot.h"

#include "core/fileio.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

enum { TRAIN_COLS = 5 }; // step, loss, lr, tokens/s, MFU (%)

typedef struct {
    double *train, *val; // rows of TRAIN_COLS numbers, of (step, val_loss)
    int ntrain, nval, cap_train, cap_val;
    bool has_mfu;
    char title[512];
} series;

static double number(const cJSON *j, const char *key, double scale) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(v) ? v->valuedouble * scale : NAN; // NaN: gnuplot skips the point
}

static double *grow(double *rows, int *cap, int n, int cols) {
    if (n < *cap) return rows;
    *cap = *cap ? 2 * *cap : 256;
    double *more = realloc(rows, (size_t)*cap * cols * sizeof(double));
    if (!more) abort();
    return more;
}

// The title from a configuration record: model, mesh, batch, precision, commit.
static void set_title(series *s, const cJSON *c) {
    const char *keys[] = {"model", "mesh", "precision", "device", "commit"};
    const char *v[5];
    for (int i = 0; i < 5; i++) {
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(c, keys[i]);
        v[i] = cJSON_IsString(item) ? item->valuestring : "?";
    }
    snprintf(s->title, sizeof s->title, "%s (L=%g C=%g NH=%g), %s, B=%g T=%g global batch %g, %s on %s, commit %s",
             v[0], number(c, "L", 1), number(c, "C", 1), number(c, "NH", 1), v[1], number(c, "micro_batch", 1),
             number(c, "seq", 1), number(c, "global_batch", 1), v[2], v[3], v[4][0] ? v[4] : "unknown");
}

// One line of the metrics file into s. Errors: LOOM_EFORMAT naming path:line.
static loom_status add_record(series *s, const char *path, int line, const char *text, size_t len) {
    cJSON *j = cJSON_ParseWithLength(text, len);
    const char *hint = "give a --metrics file that 'loom train' wrote";
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return loom_fail(LOOM_EFORMAT, hint, "%s:%d: not %s", path, line, j ? "a JSON object" : "valid JSON");
    }
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(j, "config");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(j, "step");
    double loss = number(j, "loss", 1), val = number(j, "val_loss", 1);
    loom_status st = LOOM_OK;
    if (cJSON_IsObject(config)) {
        if (!s->title[0]) set_title(s, config);
    } else if (cJSON_IsNumber(step) && !isnan(loss)) {
        s->train = grow(s->train, &s->cap_train, s->ntrain, TRAIN_COLS);
        double *row = s->train + (size_t)TRAIN_COLS * s->ntrain++;
        row[0] = step->valuedouble, row[1] = loss, row[2] = number(j, "lr", 1);
        row[3] = number(j, "tokens_per_s", 1), row[4] = number(j, "mfu", 100);
        s->has_mfu |= !isnan(row[4]);
    } else if (cJSON_IsNumber(step) && !isnan(val)) {
        s->val = grow(s->val, &s->cap_val, s->nval, 2);
        s->val[2 * s->nval] = step->valuedouble, s->val[2 * s->nval + 1] = val, s->nval++;
    } else {
        st = loom_fail(LOOM_EFORMAT, hint, "%s:%d: not a metrics record (a \"config\", or a \"step\" with a numeric "
                       "\"loss\" or \"val_loss\")", path, line);
    }
    cJSON_Delete(j);
    return st;
}

static loom_status read_series(const char *path, series *s) {
    char *text;
    size_t size;
    LOOM_TRY(loom_read_file(path, &text, &size));
    loom_status st = LOOM_OK;
    int line = 0;
    for (size_t at = 0; at < size && st == LOOM_OK;) {
        const char *nl = memchr(text + at, '\n', size - at);
        size_t next = nl ? (size_t)(nl - text) + 1 : size;
        line++;
        if (strspn(text + at, " \t\r\n") < next - at) st = add_record(s, path, line, text + at, next - at);
        at = next;
    }
    free(text);
    if (st == LOOM_OK && s->ntrain == 0)
        st = loom_fail(LOOM_EFORMAT, "plot a run's --metrics file after its first step",
                       "%s holds no training steps (records with \"step\" and \"loss\")", path);
    return st;
}

// A gnuplot single-quoted string (no escapes; a quote is doubled).
static void put_quoted(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

static void write_script(FILE *f, const series *s, bool svg, const char *out) {
    fprintf(f, "set terminal %s size 1200,900 noenhanced font 'sans,10' background 'white'\nset output ",
            svg ? "svg dynamic" : "pngcairo");
    put_quoted(f, out);
    fprintf(f, "\n$train << EOD\n");
    for (int i = 0; i < s->ntrain; i++) {
        const double *r = s->train + (size_t)TRAIN_COLS * i;
        fprintf(f, "%.17g %.9g %.9g %.9g %.9g\n", r[0], r[1], r[2], r[3], r[4]);
    }
    fprintf(f, "EOD\n$val << EOD\n");
    for (int i = 0; i < s->nval; i++) fprintf(f, "%.17g %.9g\n", s->val[2 * i], s->val[2 * i + 1]);
    fprintf(f, "EOD\nset multiplot layout 2,2 title ");
    put_quoted(f, s->title[0] ? s->title : "loom training run");
    fprintf(f, "\nset grid\nset xlabel 'step'\nset key top right\n"
               "set title 'loss'\nset ylabel 'nats'\nplot $train using 1:2 with lines lw 1.5 title 'train loss'%s\n"
               "set title 'learning rate'\nset ylabel ''\nset format y '%%.1e'\n"
               "plot $train using 1:3 with lines title 'learning rate'\nset format y '%%g'\n"
               "set title 'throughput'\nplot $train using 1:4 with lines title 'tokens/s'\nset title 'MFU'\n",
            s->nval ? ", $val using 1:2 with linespoints pt 7 title 'validation loss'" : "");
    if (s->has_mfu) fprintf(f, "set ylabel '%%'\nplot $train using 1:5 with lines title 'MFU (%%)'\n");
    else
        fprintf(f, "set label 1 'MFU: not recorded (no hardware peak known; loom train --peak-tflops X)' "
                   "at graph 0.5,0.5 center\nset yrange [0:1]\nunset ytics\nset xrange [%.17g:%.17g]\nplot 2 notitle\n",
                s->train[0], s->train[(size_t)TRAIN_COLS * (s->ntrain - 1)] + (s->ntrain == 1));
    fprintf(f, "unset multiplot\n");
}

// Runs `gnuplot script` with its output in log. Errors: LOOM_EIO (no gnuplot, or it failed:
// its first line of output).
static loom_status run_gnuplot(const char *script, const char *log) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    char *argv[] = {"gnuplot", (char *)script, NULL};
    int err = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ), status = 0;
    posix_spawn_file_actions_destroy(&fa);
    if (err)
        return loom_fail(LOOM_EIO, "install gnuplot: apt-get install gnuplot-nox (scripts/setup.sh does)",
                         "cannot run gnuplot: %s", strerror(err));
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return LOOM_OK;
    char first[256] = "no output";
    FILE *f = fopen(log, "r");
    if (f && fgets(first, sizeof first, f)) first[strcspn(first, "\n")] = '\0';
    if (f) fclose(f);
    return loom_fail(LOOM_EIO, "check the metrics file and gnuplot", "gnuplot failed (exit status %d): %s",
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1, first);
}

static const char *extension(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot && !strchr(dot, '/') ? dot : "";
}

static loom_status check_extension(const char *out_path) {
    const char *ext = extension(out_path);
    if (strcmp(ext, ".png") != 0 && strcmp(ext, ".svg") != 0)
        return loom_fail(LOOM_EINVAL, "name the plot FILE.png or FILE.svg",
                         "plot %s: unknown image format '%s' (png or svg)", out_path, ext);
    return LOOM_OK;
}

// Creates the empty temporary that gnuplot writes (it only warns when it cannot) beside out_path.
// Errors: LOOM_EIO naming out_path.
static loom_status create_temporary(const char *out_path, char *tmp, size_t cap) {
    snprintf(tmp, cap, "%s.tmp.%d", out_path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return loom_fail(LOOM_EIO, "check the folder of the plot", "cannot write plot %s: %s", out_path, strerror(errno));
    fclose(f);
    return LOOM_OK;
}

loom_status cli_plot_check(const char *out_path) {
    char tmp[4200], log[] = "/tmp/loom_gnuplot_XXXXXX";
    LOOM_TRY(check_extension(out_path));
    LOOM_TRY(create_temporary(out_path, tmp, sizeof tmp));
    unlink(tmp);
    int fd = mkstemp(log);
    if (fd < 0) return loom_fail(LOOM_EIO, "check /tmp", "cannot create a temporary file: %s", strerror(errno));
    close(fd);
    loom_status s = run_gnuplot("--version", log); // gnuplot on the PATH
    unlink(log);
    return s;
}

loom_status cli_plot_metrics(const char *metrics_path, const char *out_path) {
    LOOM_TRY(check_extension(out_path));
    series s = {0};
    loom_status st = read_series(metrics_path, &s);
    char tmp_out[4200] = "", script[] = "/tmp/loom_plot_XXXXXX", log[64];
    if (st == LOOM_OK) st = create_temporary(out_path, tmp_out, sizeof tmp_out);
    int fd = st == LOOM_OK ? mkstemp(script) : -1;
    if (st == LOOM_OK && fd < 0)
        st = loom_fail(LOOM_EIO, "check /tmp", "cannot create %s: %s", script, strerror(errno));
    if (st == LOOM_OK) {
        FILE *f = fdopen(fd, "w");
        write_script(f, &s, strcmp(extension(out_path), ".svg") == 0, tmp_out);
        st = fclose(f) == 0 ? LOOM_OK : loom_fail(LOOM_EIO, "check /tmp", "cannot write %s", script);
        snprintf(log, sizeof log, "%s.log", script);
        if (st == LOOM_OK) st = run_gnuplot(script, log);
        unlink(log);
        unlink(script);
    }
    if (st == LOOM_OK && rename(tmp_out, out_path) != 0)
        st = loom_fail(LOOM_EIO, "check the folder of the plot", "cannot write plot %s: %s", out_path, strerror(errno));
    if (st != LOOM_OK && tmp_out[0]) unlink(tmp_out);
    free(s.train);
    free(s.val);
    return st;
}
