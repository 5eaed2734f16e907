// The optimizer state file (ckpt/checkpoint.h, version 4) with and without FP8 delayed scaling's
// state: what loom_ckpt_save_state writes, loom_ckpt_load_state gives back bit for bit (the
// moments, the master weights, the scaling values and their count; none from a file without
// them); a scaling value below 0 or not finite is refused with a message naming it, as is a
// flipped byte of the scaling values (the checksum covers them). Fresh random values each run.
#include "harness.h"

#include "ckpt/checkpoint.h"
#include "core/status.h"

#include <stdbool.h>
#include <string.h>
#include <unistd.h>

enum { N = 37, K = 15 };

static float m[N], v[N], master[N], fp8[K], gm[N], gv[N], gmaster[N];

static loom_status load(const char *dir, const loom_train_state *st, float **got, int64_t *got_n) {
    bool has_master;
    return loom_ckpt_load_state(dir, st, 0, gm, gv, gmaster, &has_master, N, got, got_n);
}

int main(void) {
    t_seed();
    char dir[] = "/tmp/loom_ckpt_state_XXXXXX";
    T_ASSERT(mkdtemp(dir) != NULL, "mkdtemp");
    loom_train_state st = {.step = 7, .world_size = 1, .seed = 5};
    t_fill_normal(m, N, 1.0f), t_fill_normal(v, N, 1.0f), t_fill_normal(master, N, 1.0f), t_fill_normal(fp8, K, 3.0f);
    for (int i = 0; i < N; i++) v[i] = fabsf(v[i]);
    for (int i = 0; i < K; i++) fp8[i] = fabsf(fp8[i]);

    for (int with = 0; with < 2; with++) { // without, then with the scaling state
        T_ASSERT(loom_ckpt_save_state(dir, &st, 0, m, v, master, N, with ? fp8 : NULL, with ? K : 0) == LOOM_OK,
                 "save: %s", loom_error_message());
        float *got = (float *)1;
        int64_t got_n = -1;
        T_ASSERT(load(dir, &st, &got, &got_n) == LOOM_OK, "load: %s", loom_error_message());
        T_ASSERT(!memcmp(gm, m, sizeof m) && !memcmp(gv, v, sizeof v) && !memcmp(gmaster, master, sizeof master),
                 "moments and master weights back bit for bit (scaling state %d)", with);
        if (with)
            T_ASSERT(got_n == K && got && !memcmp(got, fp8, sizeof fp8), "scaling state back: %lld values",
                     (long long)got_n);
        else
            T_ASSERT(got_n == 0 && got == NULL, "no scaling state: %lld values", (long long)got_n);
        if (with && got) free(got);
    }

    for (int bad = 0; bad < 2; bad++) { // a negative value, then one not finite
        float saved = fp8[K - 2];
        fp8[K - 2] = bad ? NAN : -0.5f;
        T_ASSERT(loom_ckpt_save_state(dir, &st, 0, m, v, master, N, fp8, K) == LOOM_OK, "save");
        float *got = NULL;
        int64_t got_n = 0;
        loom_status s = load(dir, &st, &got, &got_n);
        T_ASSERT(s == LOOM_EFORMAT && strstr(loom_error_message(), "FP8 scaling value 13 of 15") && !got,
                 "refused: %s", loom_error_message());
        fp8[K - 2] = saved;
    }

    // a flipped byte in the scaling values (the file's last 4 K bytes)
    T_ASSERT(loom_ckpt_save_state(dir, &st, 0, m, v, master, N, fp8, K) == LOOM_OK, "save");
    char path[512];
    loom_ckpt_path(path, sizeof path, dir, LOOM_CKPT_STATE, st.step, 0);
    FILE *f = fopen(path, "r+b");
    int byte = f && fseek(f, -3, SEEK_END) == 0 ? fgetc(f) : EOF; // changed for certain: xor, not a fixed value
    T_ASSERT(byte != EOF && fseek(f, -3, SEEK_END) == 0 && fputc(byte ^ 0x5a, f) != EOF && fclose(f) == 0,
             "flip a byte");
    float *got = NULL;
    int64_t got_n = 0;
    loom_status s = load(dir, &st, &got, &got_n);
    T_ASSERT(s == LOOM_EFORMAT && strstr(loom_error_message(), "checksum") && !got, "flipped byte: %s",
             loom_error_message());
    unlink(path);
    rmdir(dir);
    return t_done("ckpt_state");
}
