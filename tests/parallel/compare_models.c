// compare_models A B TOL: compares two llm.c model files. Prints the relative error
// ||a - b|| / ||b|| over all parameters and the worst tensor's, and exits 1 if the former
// exceeds TOL (TOL 0: every value must be identical). The whole-model figure is the test:
// a tensor can differ far more than rounding when its gradient is itself rounding noise — the
// key bias of attention has an exactly zero gradient, so Adam turns noise into +-lr steps.
#include "ckpt/llmc_model.h"
#include "model/gpt2_params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: compare_models A B TOL\n");
        return 2;
    }
    loom_gpt2_config ca, cb;
    float *a, *b;
    int64_t na, nb;
    if (loom_llmc_read(argv[1], &ca, &a, &na) != LOOM_OK || loom_llmc_read(argv[2], &cb, &b, &nb) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_error_message());
        return 2;
    }
    if (na != nb || memcmp(&ca, &cb, sizeof ca) != 0) {
        fprintf(stderr, "configs differ\n");
        return 1;
    }
    loom_gpt2_tensor specs[LOOM_GPT2_NUM_TENSORS];
    loom_gpt2_file_layout(&ca, specs);
    double all_dd = 0, all_bb = 1e-300, worst = 0;
    int64_t differ = 0;
    const char *worst_name = "-";
    for (int t = 0; t < LOOM_GPT2_NUM_TENSORS; t++) {
        double dd = 0, bb = 1e-300;
        for (int64_t i = specs[t].offset; i < specs[t].offset + specs[t].numel; i++) {
            double d = (double)a[i] - (double)b[i];
            differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
            dd += d * d, bb += (double)b[i] * b[i];
        }
        all_dd += dd, all_bb += bb;
        if (!(sqrt(dd / bb) <= worst)) worst = sqrt(dd / bb), worst_name = specs[t].name;
    }
    double rel = sqrt(all_dd / all_bb), tol = atof(argv[3]);
    printf("rel err %.3g (worst tensor %s %.3g), %lld values differ\n", rel, worst_name, worst, (long long)differ);
    free(a);
    free(b);
    return (tol == 0 ? differ == 0 : rel <= tol) ? 0 : 1;
}
