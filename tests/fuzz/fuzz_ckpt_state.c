// libFuzzer target: the optimizer state reader (ckpt/checkpoint.h, loom_ckpt_load_state) on
// arbitrary contents of a state file. The caller's expectations (step, element count) are
// taken from the file's own header when it has one with a count in [0, 65536], as a resume
// whose metadata matches the file would have them; else step 1 with 16 elements. Rank 0,
// with and without room for master weights (and the FP8 scaling state, taken with them).
// Accepted moments are finite, second moments >= 0, scaling values finite and >= 0.
#include "ckpt/checkpoint.h"
#include "fuzz_common.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    loom_train_state st = {.step = 1};
    int64_t n = 16, h[32];
    if (size >= sizeof h) {
        memcpy(h, data, sizeof h);
        if (h[5] >= 0 && h[5] <= 65536 && h[4] >= 0 && h[4] <= 99999999) st.step = h[4], n = h[5];
    }
    char path[512];
    snprintf(path, sizeof path, "%s/state_%08lld_%05d.bin", fuzz_dir(), (long long)st.step, 0);
    fuzz_write(path, data, size);
    float *m = malloc((size_t)(n ? n : 1) * sizeof(float) * 3), *v = m + n, *master = v + n;
    for (int with_master = 0; with_master < 2; with_master++) {
        bool has_master = true;
        float *fp8 = NULL;
        int64_t fp8_n = -1;
        loom_status s = loom_ckpt_load_state(fuzz_dir(), &st, 0, m, v, with_master ? master : NULL,
                                             &has_master, n, with_master ? &fp8 : NULL, &fp8_n);
        if (s == LOOM_OK && has_master && !with_master) abort(); // master weights it had no room for
        if (s != LOOM_OK && has_master) abort();
        if (with_master && (fp8_n < 0 || (fp8_n == 0) != (fp8 == NULL) || (s != LOOM_OK && fp8))) abort();
        for (int64_t i = 0; s == LOOM_OK && i < n; i++)
            if (!isfinite(m[i]) || !isfinite(v[i]) || v[i] < 0) abort(); // a moment no step can make
        for (int64_t i = 0; fp8 && i < fp8_n; i++)
            if (!isfinite(fp8[i]) || fp8[i] < 0) abort(); // a scaling value no save can make
        free(fp8);
    }
    free(m);
    unlink(path);
    return 0;
}
