// libFuzzer target: the llm.c model reader (ckpt/llmc_model.h, loom_llmc_read) on arbitrary
// file contents. An accepted file has a valid config whose element count matches the payload.
#include "ckpt/llmc_model.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.bin", fuzz_dir());
    fuzz_write(path, data, size);
    loom_gpt2_config cfg;
    float *params = (float *)1; // the reader must set it on every path
    int64_t n = -1;
    if (loom_llmc_read(path, &cfg, &params, &n) != LOOM_OK) {
        if (params != NULL || n != 0) abort(); // a rejection leaves nothing behind
        return 0;
    }
    if (loom_gpt2_config_validate(&cfg) != LOOM_OK || n != loom_gpt2_file_elements(&cfg) || n < 1) abort();
    volatile float sink = params[0] + params[n - 1]; // the whole buffer is there
    (void)sink;
    free(params);
    return 0;
}
