// Replays a fuzz target's committed inputs in the ordinary build (ctest fuzz_replay_<target>),
// without libFuzzer or the sanitizers: the target's LLVMFuzzerTestOneInput once per file of each
// folder given (its seeds, its regressions), so the property checks and the fixed crashes of
// tests/fuzz run in every test run. scripts/fuzz.sh runs the same inputs under ASan + UBSan.
//   test_fuzz_replay_<target> FOLDER...   (a missing folder is skipped: no regressions yet)
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int skip_hidden(const struct dirent *e) { return e->d_name[0] != '.'; }

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int inputs = 0;
    for (int a = 1; a < argc; a++) {
        struct dirent **names;
        int n = scandir(argv[a], &names, skip_hidden, alphasort);
        for (int i = 0; i < n; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], names[i]->d_name);
            free(names[i]);
            FILE *f = fopen(path, "rb");
            if (!f) {
                perror(path);
                return 1;
            }
            fseek(f, 0, SEEK_END);
            long size = ftell(f);
            rewind(f);
            uint8_t *data = malloc(size > 0 ? (size_t)size : 1);
            if (size < 0 || fread(data, 1, (size_t)size, f) != (size_t)size) {
                fprintf(stderr, "%s: short read\n", path);
                return 1;
            }
            fclose(f);
            fprintf(stderr, "replay %s (%ld bytes)\n", path, size);
            LLVMFuzzerTestOneInput(data, (size_t)size); // a finding aborts
            free(data);
            inputs++;
        }
        if (n >= 0) free(names);
    }
    printf("fuzz replay: %d inputs, no finding\n", inputs);
    return inputs > 0 ? 0 : 1;
}
