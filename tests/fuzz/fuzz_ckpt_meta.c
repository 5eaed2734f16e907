// libFuzzer target: the checkpoint metadata reader (ckpt/checkpoint.h, loom_ckpt_load_meta) on
// arbitrary contents of ckpt_00000001.json, beside an (empty) model_00000001.bin: the file valid
// metadata names. Accepted metadata must be what a save writes: step 1, its state files and data
// position following from the mesh.
#include "ckpt/checkpoint.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/model_00000001.bin", fuzz_dir());
    if (access(path, F_OK) != 0) fuzz_write(path, data, 0);
    snprintf(path, sizeof path, "%s/ckpt_00000001.json", fuzz_dir());
    fuzz_write(path, data, size);
    loom_train_state st;
    if (loom_ckpt_load_meta(fuzz_dir(), 1, &st) != LOOM_OK) return 0; // a clean rejection
    int64_t mp = (int64_t)st.tp * st.pp * st.cp, dp = st.world_size / mp;
    if (st.step != 1 || st.world_size % mp != 0 || st.state_files != (st.zero == 0 ? mp : st.world_size) ||
        st.data_position != dp * st.grad_accum) {
        fprintf(stderr, "loom fuzz: accepted metadata a save cannot write (step %lld, %d ranks, %d state files)\n",
                (long long)st.step, st.world_size, st.state_files);
        abort();
    }
    return 0;
}
