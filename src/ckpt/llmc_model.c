#include "ckpt/llmc_model.h"

#include "core/bf16.h"
#include "core/fileio.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

static loom_status read_params(FILE *f, const char *path, int version, float *params, int64_t n, uint32_t *crc) {
    size_t got, bytes;
    if (version == LOOM_LLMC_FP32) {
        got = fread(params, sizeof(float), (size_t)n, f);
        bytes = got * sizeof(float);
        if (crc) *crc = (uint32_t)crc32_z(*crc, (const Bytef *)params, bytes);
    } else {
        uint16_t *raw = loom_xmalloc((size_t)n * sizeof(uint16_t));
        got = fread(raw, sizeof(uint16_t), (size_t)n, f);
        bytes = got * sizeof(uint16_t);
        if (crc) *crc = (uint32_t)crc32_z(*crc, (const Bytef *)raw, bytes);
        for (int64_t i = 0; i < (int64_t)got; i++) params[i] = loom_bf16_to_f32(raw[i]);
        free(raw);
    }
    if (got != (size_t)n) return loom_fail(LOOM_EIO, NULL, "model file %s: short read", path);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(params[i]))
            return loom_fail(LOOM_EFORMAT, "it was saved from a diverged run: use an earlier model or checkpoint",
                             "model file %s: parameter %lld of %lld is %g, not a finite number", path,
                             (long long)i, (long long)n, (double)params[i]);
    return LOOM_OK;
}

// The element count of the header's config, in double: header dims up to 2^31 each overflow
// int64 (12 L C^2) but not this, which is exact for any file that can exist (< 2^53 elements).
// loom_gpt2_file_elements gives the same count in int64 once the file size has matched it.
static double header_elements(const loom_gpt2_config *c) {
    double C = c->channels, L = c->num_layers;
    return ((double)c->padded_vocab_size + c->max_seq_len) * C + L * (12 * C * C + 13 * C) + 2 * C;
}

loom_status loom_llmc_read_crc(const char *path, loom_gpt2_config *cfg, float **params, int64_t *n,
                               uint32_t *crc) {
    *params = NULL;
    *n = 0;
    FILE *f;
    LOOM_TRY(loom_fopen_regular(path, "model file", "check the --model/--init path", &f));
    struct stat st;
    int32_t h[256];
    const char *hint = "is it an llm.c GPT-2 model file (train_gpt2.py's write_model)?";
    loom_status s = LOOM_OK;
    if (fstat(fileno(f), &st) != 0 || fread(h, sizeof(int32_t), 256, f) != 256) {
        s = loom_fail(LOOM_EFORMAT, hint, "model file %s: shorter than its 1024-byte header", path);
    } else if (h[0] != LOOM_LLMC_MODEL_MAGIC) {
        s = loom_fail(LOOM_EFORMAT, hint, "model file %s: bad magic %d (expected %d)", path, h[0],
                      LOOM_LLMC_MODEL_MAGIC);
    } else if (h[1] != LOOM_LLMC_FP32 && h[1] != LOOM_LLMC_BF16) {
        s = loom_fail(LOOM_EFORMAT, "versions 3 (fp32) and 5 (bf16) are supported",
                      "model file %s: unsupported version %d", path, h[1]);
    } else {
        *cfg = (loom_gpt2_config){.max_seq_len = h[2], .vocab_size = h[3], .num_layers = h[4],
                                  .num_heads = h[5], .channels = h[6], .padded_vocab_size = h[7]};
        if (loom_gpt2_config_validate(cfg) != LOOM_OK) {
            s = loom_fail(LOOM_EFORMAT, hint, "model file %s: invalid header: %s", path,
                          loom_error_message());
        } else {
            double elements = header_elements(cfg), want = 1024 + elements * (h[1] == LOOM_LLMC_FP32 ? 4 : 2);
            if ((double)st.st_size != want) {
                s = loom_fail(LOOM_EFORMAT, "the file is truncated or its header is wrong",
                              "model file %s: header describes %.0f parameters (%.0f bytes) but the "
                              "file holds %lld bytes",
                              path, elements, want, (long long)st.st_size);
            } else {
                int64_t count = loom_gpt2_file_elements(cfg);
                *params = malloc((size_t)count * sizeof(float));
                if (!*params) {
                    s = loom_fail(LOOM_ENOMEM, NULL, "cannot allocate %lld parameters", (long long)count);
                } else {
                    if (crc) *crc = (uint32_t)crc32_z(0, (const Bytef *)h, sizeof h);
                    if ((s = read_params(f, path, h[1], *params, count, crc)) == LOOM_OK) *n = count;
                }
            }
        }
    }
    fclose(f);
    if (s != LOOM_OK) {
        free(*params);
        *params = NULL;
    }
    return s;
}

loom_status loom_llmc_read(const char *path, loom_gpt2_config *cfg, float **params, int64_t *n) {
    return loom_llmc_read_crc(path, cfg, params, n, NULL);
}

loom_status loom_llmc_write(const char *path, const loom_gpt2_config *cfg, const float *params,
                            int64_t n, uint32_t *crc) {
    int32_t h[256] = {LOOM_LLMC_MODEL_MAGIC, LOOM_LLMC_FP32, cfg->max_seq_len, cfg->vocab_size,
                      cfg->num_layers, cfg->num_heads, cfg->channels, cfg->padded_vocab_size};
    size_t bytes = (size_t)n * sizeof(float);
    if (crc) *crc = (uint32_t)crc32_z(crc32_z(0, (const Bytef *)h, sizeof h), (const Bytef *)params, bytes);
    return loom_atomic_save(path, (const void *[]){h, params}, (size_t[]){sizeof h, bytes}, 2);
}
