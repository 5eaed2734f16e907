// loom: one program, subcommands for each job. `loom --help` lists them.
#include "cli/commands.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command COMMANDS[] = {
    {"tokenize", loom_cmd_tokenize, "text or JSON Lines files -> GPT-2 token shards"},
    {"encode", loom_cmd_encode, "print the GPT-2 token ids of a text"},
    {"decode", loom_cmd_decode, "print the text of GPT-2 token ids"},
    {"train", loom_cmd_train, "train a GPT-2 model on token shards"},
    {"eval", loom_cmd_eval, "validation loss of a model file"},
    {"sample", loom_cmd_sample, "generate text from a model file"},
    {"bench", loom_cmd_bench, "time training steps of a named config"},
    {"bench-comm", loom_cmd_bench_comm, "bandwidth of the collectives over the launched ranks"},
    {"schedule", loom_cmd_schedule, "draw a pipeline schedule: timeline, bubble, memory"},
};

static void usage(FILE *f) {
    fprintf(f, "loom: distributed LLM training in C\n\nusage: loom <command> [flags]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(f, "  %-10s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f, "\n'loom <command> --help' lists a command's flags.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (strcmp(argv[1], COMMANDS[i].name) == 0) return COMMANDS[i].run(argc - 1, argv + 1);
    fprintf(stderr, "loom: error: unknown command '%s' (hint: run 'loom --help' for the commands)\n",
            argv[1]);
    return 1;
}
