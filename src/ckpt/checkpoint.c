// Checkpoint files: names, the model file (an llm.c file with its checksum), the per-rank
// optimizer state, the newest complete step. The metadata is checkpoint_meta.c's.
#include "ckpt/checkpoint.h"

#include "ckpt/llmc_model.h"
#include "core/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

static const char *DAMAGED = "the checkpoint is damaged or from a diverged run; resume from an older step";

void loom_ckpt_path(char *out, size_t cap, const char *dir, loom_ckpt_file kind, int64_t step, int rank) {
    const char *sep = dir ? "/" : "";
    dir = dir ? dir : "";
    if (kind == LOOM_CKPT_MODEL) snprintf(out, cap, "%s%smodel_%08lld.bin", dir, sep, (long long)step);
    else if (kind == LOOM_CKPT_STATE) snprintf(out, cap, "%s%sstate_%08lld_%05d.bin", dir, sep, (long long)step, rank);
    else snprintf(out, cap, "%s%sckpt_%08lld.json", dir, sep, (long long)step);
}

loom_status loom_ckpt_save_model(const char *dir, loom_train_state *st, const loom_gpt2_config *cfg,
                                 const float *params, int64_t n) {
    char path[4200];
    uint32_t crc;
    loom_ckpt_path(path, sizeof path, dir, LOOM_CKPT_MODEL, st->step, 0);
    LOOM_TRY(loom_llmc_write(path, cfg, params, n, &crc));
    st->model_crc32 = crc;
    return LOOM_OK;
}

static uint32_t payload_crc(const float *m, const float *v, const float *master, size_t bytes, const float *fp8,
                            size_t fp8_bytes) {
    uLong crc = crc32_z(crc32_z(0, (const Bytef *)m, bytes), (const Bytef *)v, bytes);
    if (master) crc = crc32_z(crc, (const Bytef *)master, bytes);
    return (uint32_t)(fp8_bytes ? crc32_z(crc, (const Bytef *)fp8, fp8_bytes) : crc);
}

loom_status loom_ckpt_save_state(const char *dir, const loom_train_state *st, int rank, const float *m,
                                 const float *v, const float *master, int64_t n, const float *fp8, int64_t fp8_n) {
    char path[4200];
    loom_ckpt_path(path, sizeof path, dir, LOOM_CKPT_STATE, st->step, rank);
    size_t bytes = (size_t)n * sizeof(float), fp8_bytes = (size_t)fp8_n * sizeof(float);
    int64_t h[32] = {LOOM_STATE_MAGIC, LOOM_STATE_VERSION, rank, st->world_size, st->step, n,
                     st->data_position, (int64_t)st->seed, st->zero, master != NULL,
                     payload_crc(m, v, master, bytes, fp8, fp8_bytes), fp8_n};
    const void *parts[5] = {h, m, v};
    size_t sizes[5] = {sizeof h, bytes, bytes};
    int k = 3;
    if (master) parts[k] = master, sizes[k++] = bytes;
    if (fp8_n) parts[k] = fp8, sizes[k++] = fp8_bytes;
    return loom_atomic_save(path, parts, sizes, k);
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

loom_status loom_ckpt_load_model(const char *dir, const loom_train_state *st, loom_gpt2_config *cfg,
                                 float **params, int64_t *n) {
    char path[4200];
    uint32_t crc;
    loom_ckpt_path(path, sizeof path, dir, LOOM_CKPT_MODEL, st->step, 0);
    LOOM_TRY(loom_llmc_read_crc(path, cfg, params, n, &crc));
    if (st->model_crc32 < 0 || crc == (uint32_t)st->model_crc32) return LOOM_OK;
    free(*params);
    *params = NULL;
    *n = 0;
    return loom_fail(LOOM_EFORMAT, DAMAGED, "model file %s: checksum %08x, but the checkpoint recorded %08x", path,
                     (unsigned)crc, (unsigned)st->model_crc32);
}

// Every value finite (and >= 0 for the second moment and the scaling state). Errors: LOOM_EFORMAT
// naming the first bad one.
static loom_status check_values(const char *path, const char *what, const float *x, int64_t n, bool nonneg) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (nonneg && x[i] < 0))
            return loom_fail(LOOM_EFORMAT, DAMAGED, "optimizer state %s: %s %lld of %lld is %g, %s", path, what,
                             (long long)i, (long long)n, (double)x[i], isfinite(x[i]) ? "below 0" : "not a finite number");
    return LOOM_OK;
}

// The header after magic, version and what the caller expects: the layout of the file.
static loom_status check_header(const char *path, const int64_t h[32], const loom_train_state *st, int rank,
                                int64_t n, off_t size) {
    if (h[0] != LOOM_STATE_MAGIC || h[1] < 2 || h[1] > LOOM_STATE_VERSION)
        return loom_fail(LOOM_EFORMAT, "is it a loom optimizer state file (version 2, 3 or 4)?",
                         "optimizer state %s: bad header (magic %lld, version %lld)", path, (long long)h[0],
                         (long long)h[1]);
    if (h[2] != rank || h[4] != st->step || h[5] != n)
        return loom_fail(LOOM_EFORMAT, "the checkpoint files are from different runs",
                         "optimizer state %s: rank %lld step %lld with %lld elements, expected rank %d step %lld "
                         "with %lld", path, (long long)h[2], (long long)h[4], (long long)h[5], rank,
                         (long long)st->step, (long long)n);
    if (h[9] != 0 && h[9] != 1)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "optimizer state %s: bad header (master weights flag %lld)", path,
                         (long long)h[9]);
    if (h[1] >= 4 && (h[11] < 0 || h[11] > ((int64_t)1 << 40)))
        return loom_fail(LOOM_EFORMAT, DAMAGED, "optimizer state %s: bad header (FP8 scaling values %lld)", path,
                         (long long)h[11]);
    double want = 256.0 + 4.0 * (double)n * (h[9] ? 3 : 2) + 4.0 * (double)(h[1] >= 4 ? h[11] : 0);
    if ((double)size != want)
        return loom_fail(LOOM_EFORMAT, DAMAGED, "optimizer state %s holds %lld bytes, but its header describes %.0f",
                         path, (long long)size, want);
    return LOOM_OK;
}

loom_status loom_ckpt_load_state(const char *dir, const loom_train_state *st, int rank, float *m, float *v,
                                 float *master, bool *has_master, int64_t n, float **fp8, int64_t *fp8_n) {
    *has_master = false;
    if (fp8) *fp8 = NULL, *fp8_n = 0;
    char path[4200];
    loom_ckpt_path(path, sizeof path, dir, LOOM_CKPT_STATE, st->step, rank);
    FILE *f;
    LOOM_TRY(loom_fopen_regular(path, "optimizer state", "is the checkpoint complete? resume from an older step", &f));
    int64_t h[32];
    struct stat sb;
    size_t bytes = (size_t)n * sizeof(float);
    float *scratch = NULL; // the master weights the caller has no room for, read to check the sum
    loom_status s = LOOM_OK;
    if (fstat(fileno(f), &sb) != 0 || fread(h, sizeof h, 1, f) != 1)
        s = loom_fail(LOOM_EFORMAT, DAMAGED, "optimizer state %s is shorter than its header", path);
    if (s == LOOM_OK) s = check_header(path, h, st, rank, n, sb.st_size);
    if (s == LOOM_OK && h[9] && !master) master = scratch = loom_xmalloc(bytes);
    int64_t k = s == LOOM_OK && h[1] >= 4 ? h[11] : 0; // FP8 scaling values (the size check bounds them)
    float *scaling = k ? loom_xmalloc((size_t)k * sizeof(float)) : NULL;
    if (s == LOOM_OK && (fread(m, 1, bytes, f) != bytes || fread(v, 1, bytes, f) != bytes ||
                         (h[9] && fread(master, 1, bytes, f) != bytes) ||
                         (k && fread(scaling, sizeof(float), (size_t)k, f) != (size_t)k)))
        s = loom_fail(LOOM_EIO, NULL, "optimizer state %s: short read", path);
    uint32_t crc = s == LOOM_OK ? payload_crc(m, v, h[9] ? master : NULL, bytes, scaling, (size_t)k * sizeof(float)) : 0;
    if (s == LOOM_OK && h[1] >= 3 && crc != (uint64_t)h[10])
        s = loom_fail(LOOM_EFORMAT, DAMAGED, "optimizer state %s: checksum %08x, but its header recorded %08llx",
                      path, (unsigned)crc, (unsigned long long)h[10]);
    if (s == LOOM_OK) s = check_values(path, "first moment", m, n, false);
    if (s == LOOM_OK) s = check_values(path, "second moment", v, n, true);
    if (s == LOOM_OK && h[9]) s = check_values(path, "master weight", master, n, false);
    if (s == LOOM_OK) s = check_values(path, "FP8 scaling value", scaling, k, true);
    if (s == LOOM_OK) *has_master = h[9] && !scratch;
    if (s == LOOM_OK && fp8) *fp8 = scaling, *fp8_n = k, scaling = NULL;
    free(scaling);
    free(scratch);
    fclose(f);
    return s;
}
