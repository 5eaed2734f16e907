// libFuzzer target: the flag parser (cli/flags.h, loom_flags_parse) on an arbitrary argument
// vector: the input split at NUL bytes (each ends an argument) into argv[0] (the subcommand)
// and its arguments, over a table with every flag type. On success every number must lie in
// its flag's range (floats finite) and the positional arguments must be the tail of argv; a
// second parse of the same vector must give the same result.
#include "cli/flags.h"
#include "fuzz_common.h"

#include <float.h>
#include <math.h>

enum { MAX_ARGS = 256 };

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (!freopen("/dev/null", "w", stdout)) abort(); // --help prints the usage there
    return 0;
}

typedef struct {
    int steps, threads;
    int64_t shard_tokens;
    float lr, beta2;
    const char *out, *model;
    bool resume, sp;
} values;

// One parse of argv[0, argc) (a copy: getopt_long permutes it) into v; the status, with the
// positional arguments (as indices into the original vector) in pos_index/npos.
static loom_status parse(char **orig, int argc, values *v, bool *help, int *pos_index, int *npos, int max_pos) {
    char *argv[MAX_ARGS + 1];
    memcpy(argv, orig, (size_t)(argc + 1) * sizeof *argv);
    *v = (values){100, 0, 100000000, 6e-4f, 0.95f, NULL, "gpt2-mini", false, false};
    const loom_flag flags[] = {
        {"steps", FLAG_INT, &v->steps, "optimizer steps", 1, 1e6},
        {"threads", FLAG_INT, &v->threads, "CPU threads", 0, 1024},
        {"shard-tokens", FLAG_I64, &v->shard_tokens, "tokens per shard at most", 1, INT32_MAX},
        {"lr", FLAG_FLOAT, &v->lr, "peak learning rate", 0, FLT_MAX, FLAG_ABOVE_MIN},
        {"beta2", FLAG_FLOAT, &v->beta2, "AdamW beta2", 0, 1, FLAG_BELOW_MAX},
        {"out", FLAG_STR, &v->out, "output folder"},
        {"model", FLAG_STR, &v->model, "named config"},
        {"resume", FLAG_BOOL, &v->resume, "continue from the newest checkpoint"},
        {"sp", FLAG_BOOL, &v->sp, "sequence parallelism"},
    };
    const loom_cli cli = {"fuzz", "The fuzz target's flags.", "loom fuzz [flags] [INPUT...]", flags,
                          (int)(sizeof flags / sizeof flags[0]), max_pos};
    char **pos = NULL;
    *help = false;
    *npos = -1;
    loom_status s = loom_flags_parse(&cli, argc, argv, help, &pos, npos);
    if (s != LOOM_OK || *help) return s;
    if (!isfinite(v->lr) || !isfinite(v->beta2) || !(v->lr > 0) || !(v->beta2 >= 0 && v->beta2 < 1) ||
        v->steps < 1 || v->steps > 1000000 || v->threads < 0 || v->threads > 1024 || v->shard_tokens < 1 ||
        v->shard_tokens > INT32_MAX) {
        fprintf(stderr, "loom fuzz: a value outside its range was accepted: steps %d threads %d shard-tokens %lld "
                        "lr %g beta2 %g\n", v->steps, v->threads, (long long)v->shard_tokens, (double)v->lr,
                (double)v->beta2);
        abort();
    }
    if (*npos < 0 || *npos > max_pos || pos + *npos != argv + argc) abort();
    for (int i = 0; i < *npos; i++) { // each one of the arguments
        int k = 0;
        while (k < argc && orig[k] != pos[i]) k++;
        if (k == argc) abort();
        pos_index[i] = k;
    }
    return s;
}

static bool same(const values *a, const values *b) {
    return a->steps == b->steps && a->threads == b->threads && a->shard_tokens == b->shard_tokens &&
           a->lr == b->lr && a->beta2 == b->beta2 && a->out == b->out && a->model == b->model &&
           a->resume == b->resume && a->sp == b->sp;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1), *argv[MAX_ARGS + 1];
    memcpy(buf, data, size);
    buf[size] = '\0';
    int argc = 0;
    for (char *p = buf; p < buf + size && argc < MAX_ARGS; p += strlen(p) + 1) argv[argc++] = p;
    if (argc == 0) argv[argc++] = buf; // argv[0], the subcommand, is always there
    argv[argc] = NULL;

    // Twice: the parser keeps no state from one call to the next (getopt's is global), so the
    // second parse of the same vector must agree with the first.
    values v[2];
    bool help[2];
    int pos_index[2][MAX_ARGS], npos[2];
    loom_status s[2];
    for (int k = 0; k < 2; k++) s[k] = parse(argv, argc, &v[k], &help[k], pos_index[k], &npos[k], (int)(size % 3));
    if (s[0] != s[1] || help[0] != help[1] || (s[0] == LOOM_OK && !help[0] &&
        (!same(&v[0], &v[1]) || npos[0] != npos[1] ||
         memcmp(pos_index[0], pos_index[1], (size_t)npos[0] * sizeof(int)) != 0))) {
        fprintf(stderr, "loom fuzz: two parses of the same arguments differ (status %d/%d, help %d/%d)\n",
                s[0], s[1], help[0], help[1]);
        abort();
    }
    free(buf);
    return 0;
}
