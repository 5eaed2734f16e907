// `loom export --model FILE --out DIR`: an llm.c model file (a checkpoint's model_S.bin, or
// `loom train --init`'s) as a Hugging Face transformers folder (src/ckpt/safetensors.h).
#include "ckpt/llmc_model.h"
#include "ckpt/safetensors.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int loom_cmd_export(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *dtype = "fp32";
    const loom_flag flags[] = {
        {"model", FLAG_STR, &model, "llm.c model file (version 3 fp32 or 5 bf16)"},
        {"out", FLAG_STR, &out, "folder for model.safetensors and config.json (created if missing)"},
        {"dtype", FLAG_STR, &dtype, "the tensors' type: fp32 or bf16"},
    };
    const loom_cli cli = {"export",
                          "Write a model file as a Hugging Face transformers folder (model.safetensors, config.json)"
                          "\nthat GPT2LMHeadModel.from_pretrained loads.",
                          "loom export --model FILE --out DIR [--dtype fp32|bf16]", flags, 3, 0};
    bool help;
    char **pos;
    int npos;
    loom_gpt2_config cfg;
    float *params = NULL;
    int64_t n;
    loom_status s = loom_flags_parse(&cli, argc, argv, &help, &pos, &npos);
    if (s == LOOM_OK && help) return 0;
    if (s == LOOM_OK && (!model || !out))
        s = loom_fail(LOOM_EINVAL, "e.g. loom export --model ckpt/model_00005000.bin --out hf",
                      "--model and --out are required");
    bool bf16 = strcmp(dtype, "bf16") == 0;
    if (s == LOOM_OK && !bf16 && strcmp(dtype, "fp32") != 0)
        s = loom_fail(LOOM_EINVAL, "use --dtype fp32 or bf16", "unknown --dtype '%s'", dtype);
    if (s == LOOM_OK) s = loom_llmc_read(model, &cfg, &params, &n);
    if (s == LOOM_OK && mkdir(out, 0755) != 0 && errno != EEXIST)
        s = loom_fail(LOOM_EIO, "check the path and its permissions", "cannot create the folder %s: %s", out,
                      strerror(errno));
    if (s == LOOM_OK) s = loom_safetensors_write_gpt2(out, &cfg, params, bf16);
    free(params);
    if (s != LOOM_OK) {
        loom_print_error();
        return 1;
    }
    loom_info("export %s -> %s/model.safetensors, %s/config.json (%s, GPT2LMHeadModel: L=%d NH=%d C=%d V=%d)\n", model,
              out, out, dtype, cfg.num_layers, cfg.num_heads, cfg.channels, cfg.vocab_size);
    return 0;
}
