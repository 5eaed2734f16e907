// libFuzzer target: the checkpoint metadata reader (ckpt/checkpoint.h, loom_ckpt_load_meta) on
// arbitrary contents of ckpt_00000001.json.
#include "ckpt/checkpoint.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/ckpt_00000001.json", fuzz_dir());
    fuzz_write(path, data, size);
    loom_train_state st;
    if (loom_ckpt_load_meta(fuzz_dir(), 1, &st) != LOOM_OK) return 0; // a clean rejection
    volatile int64_t sink = st.step + st.world_size + st.state_files + st.bucket_elements;
    (void)sink;
    return 0;
}
