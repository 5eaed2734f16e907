// Helpers shared by the libFuzzer targets (tests/fuzz/README.md): a private temporary folder
// for readers that take a path, and a whole-buffer write into it. Every target treats a
// loom_status error as a pass (a clean rejection); a crash, leak, hang or sanitizer report is
// a finding.
#pragma once
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir_path[256];

static inline int fuzz_rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb, (void)type, (void)ftw;
    return remove(path);
}

static inline void fuzz_rm_dir(void) {
    if (fuzz_dir_path[0]) nftw(fuzz_dir_path, fuzz_rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

// The target's own folder (made on first use, removed at a normal exit): under $LOOM_FUZZ_TMP
// when set (scripts/fuzz.sh: a folder it removes, as a crash skips the clean-up), else /dev/shm
// when writable (no disk writes per execution), else $TMPDIR or /tmp.
static inline const char *fuzz_dir(void) {
    if (!fuzz_dir_path[0]) {
        const char *base = getenv("LOOM_FUZZ_TMP");
        if (!base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/loom-fuzz-XXXXXX", base ? base : "/tmp");
        if (!mkdtemp(fuzz_dir_path)) {
            perror("loom fuzz: mkdtemp");
            abort();
        }
        atexit(fuzz_rm_dir);
    }
    return fuzz_dir_path;
}

// Writes data[0, size) to `path` (replacing it); aborts on failure: the harness, not loom,
// would be broken.
static inline void fuzz_write(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}
