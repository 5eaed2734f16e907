#include "ckpt/safetensors.h"

#include "core/bf16.h"
#include "core/fileio.h"
#include "model/gpt2_params.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// One exported tensor: its name, its shape (rows, cols; cols 0 for a vector) and where its values
// lie in the llm.c parameters: as they are, or (cols, rows) to be transposed.
typedef struct {
    char name[80];
    int64_t rows, cols;
    const float *src;
    bool transposed;
} export_tensor;

// A block's tensors under transformers' names: the llm.c file tensor, and whether it is a matrix
// that GPT-2's Conv1D holds transposed.
static const struct {
    const char *name;
    int file_tensor;
    bool matrix;
} BLOCK[] = {
    {"ln_1.weight", P_LN1W, false},      {"ln_1.bias", P_LN1B, false},
    {"attn.c_attn.weight", P_QKVW, true}, {"attn.c_attn.bias", P_QKVB, false},
    {"attn.c_proj.weight", P_ATTPROJW, true}, {"attn.c_proj.bias", P_ATTPROJB, false},
    {"ln_2.weight", P_LN2W, false},      {"ln_2.bias", P_LN2B, false},
    {"mlp.c_fc.weight", P_FCW, true},    {"mlp.c_fc.bias", P_FCB, false},
    {"mlp.c_proj.weight", P_FCPROJW, true}, {"mlp.c_proj.bias", P_FCPROJB, false},
};
enum { BLOCK_TENSORS = sizeof BLOCK / sizeof BLOCK[0] };

// The export's tensors in order into out (2 + 12 L + 2 of them); returns their count.
static int list_tensors(const loom_gpt2_config *cfg, const float *params, export_tensor *out) {
    loom_gpt2_tensor f[LOOM_GPT2_NUM_TENSORS];
    loom_gpt2_file_layout(cfg, f);
    int n = 0, L = cfg->num_layers, C = cfg->channels;
    out[n++] = (export_tensor){"transformer.wte.weight", cfg->vocab_size, C, params + f[P_WTE].offset, false};
    out[n++] = (export_tensor){"transformer.wpe.weight", cfg->max_seq_len, C, params + f[P_WPE].offset, false};
    for (int l = 0; l < L; l++)
        for (int k = 0; k < BLOCK_TENSORS; k++) {
            const loom_gpt2_tensor *t = &f[BLOCK[k].file_tensor];
            export_tensor *e = &out[n++];
            snprintf(e->name, sizeof e->name, "transformer.h.%d.%s", l, BLOCK[k].name);
            e->src = params + t->offset + (size_t)l * (size_t)(t->numel / L);
            e->transposed = BLOCK[k].matrix;
            e->rows = BLOCK[k].matrix ? t->shape[2] : t->shape[1]; // (out, in) in llm.c: (in, out) here
            e->cols = BLOCK[k].matrix ? t->shape[1] : 0;
        }
    out[n++] = (export_tensor){"transformer.ln_f.weight", C, 0, params + f[P_LNFW].offset, false};
    out[n++] = (export_tensor){"transformer.ln_f.bias", C, 0, params + f[P_LNFB].offset, false};
    return n;
}

static int64_t numel(const export_tensor *e) { return e->rows * (e->cols ? e->cols : 1); }

// The header JSON, padded with spaces to a multiple of 8 bytes (malloc'ed, *len bytes).
static char *header(const export_tensor *t, int n, size_t es, size_t *len) {
    cJSON *j = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "format", "pt");
    cJSON_AddItemToObject(j, "__metadata__", meta);
    double at = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        double shape[2] = {(double)t[i].rows, (double)t[i].cols}, bytes = (double)numel(&t[i]) * (double)es;
        cJSON_AddStringToObject(e, "dtype", es == 2 ? "BF16" : "F32");
        cJSON_AddItemToObject(e, "shape", cJSON_CreateDoubleArray(shape, t[i].cols ? 2 : 1));
        cJSON_AddItemToObject(e, "data_offsets", cJSON_CreateDoubleArray((const double[]){at, at + bytes}, 2));
        cJSON_AddItemToObject(j, t[i].name, e);
        at += bytes;
    }
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    LOOM_CHECK(text);
    size_t raw = strlen(text), padded = (raw + 7) / 8 * 8;
    char *out = loom_xmalloc(padded);
    memcpy(out, text, raw);
    memset(out + raw, ' ', padded - raw);
    free(text);
    *len = padded;
    return out;
}

// Tensor e's values in the export's order and dtype into buf.
static void convert(const export_tensor *e, bool bf16, void *buf) {
    int64_t R = e->rows, K = e->cols ? e->cols : 1;
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < K; k++) {
            float x = e->transposed ? e->src[k * R + r] : e->src[r * K + k];
            if (bf16)
                ((uint16_t *)buf)[r * K + k] = loom_f32_to_bf16(x);
            else
                ((float *)buf)[r * K + k] = x;
        }
}

static loom_status write_tensors(const char *path, const export_tensor *t, int n, bool bf16) {
    size_t es = bf16 ? 2 : 4, len, most = 0;
    char *head = header(t, n, es, &len);
    uint64_t len64 = len; // little-endian on every host loom builds for (x86-64, aarch64)
    for (int i = 0; i < n; i++) most = (size_t)numel(&t[i]) > most ? (size_t)numel(&t[i]) : most;
    void *buf = loom_xmalloc(most * es);
    loom_atomic_file af;
    loom_status s = loom_atomic_open(&af, path);
    if (s == LOOM_OK) s = loom_atomic_write(&af, &len64, sizeof len64);
    if (s == LOOM_OK) s = loom_atomic_write(&af, head, len);
    for (int i = 0; s == LOOM_OK && i < n; i++) {
        convert(&t[i], bf16, buf);
        s = loom_atomic_write(&af, buf, (size_t)numel(&t[i]) * es);
    }
    if (s == LOOM_OK)
        s = loom_atomic_commit(&af);
    else if (af.f)
        loom_atomic_abort(&af);
    free(buf);
    free(head);
    return s;
}

static loom_status write_config(const char *path, const loom_gpt2_config *cfg, bool bf16) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray((const char *[]){"GPT2LMHeadModel"}, 1));
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON_AddNumberToObject(j, "vocab_size", cfg->vocab_size);
    cJSON_AddNumberToObject(j, "n_positions", cfg->max_seq_len);
    cJSON_AddNumberToObject(j, "n_ctx", cfg->max_seq_len);
    cJSON_AddNumberToObject(j, "n_embd", cfg->channels);
    cJSON_AddNumberToObject(j, "n_layer", cfg->num_layers);
    cJSON_AddNumberToObject(j, "n_head", cfg->num_heads);
    cJSON_AddNullToObject(j, "n_inner"); // 4 n_embd
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", 1e-5);
    cJSON_AddNumberToObject(j, "resid_pdrop", 0);
    cJSON_AddNumberToObject(j, "embd_pdrop", 0);
    cJSON_AddNumberToObject(j, "attn_pdrop", 0);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", true);
    if (cfg->vocab_size == 50257) { // GPT-2's BPE: <|endoftext|> begins and ends a text
        cJSON_AddNumberToObject(j, "bos_token_id", 50256);
        cJSON_AddNumberToObject(j, "eos_token_id", 50256);
    }
    cJSON_AddStringToObject(j, "torch_dtype", bf16 ? "bfloat16" : "float32");
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    LOOM_CHECK(text);
    const void *parts[] = {text, "\n"};
    size_t sizes[] = {strlen(text), 1};
    loom_status s = loom_atomic_save(path, parts, sizes, 2);
    free(text);
    return s;
}

loom_status loom_safetensors_write_gpt2(const char *dir, const loom_gpt2_config *cfg, const float *params, bool bf16) {
    export_tensor *t = loom_xcalloc((size_t)(4 + BLOCK_TENSORS * cfg->num_layers), sizeof *t);
    int n = list_tensors(cfg, params, t);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    loom_status s = write_tensors(path, t, n, bf16);
    free(t);
    snprintf(path, sizeof path, "%s/config.json", dir);
    return s == LOOM_OK ? write_config(path, cfg, bf16) : s;
}
