// loom: one program, subcommands for each job. `loom help` (or --help) lists them, `loom help
// COMMAND` shows a command's flags, `loom --version` the version and commit.
#include "cli/commands.h"
#include "cli/version.h"

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
    {"launch", loom_cmd_launch, "run a training job, restart it from its checkpoint when it fails or hangs"},
    {"eval", loom_cmd_eval, "validation loss of a model file"},
    {"sample", loom_cmd_sample, "generate text from a model file"},
    {"export", loom_cmd_export, "write a model file as a Hugging Face folder (safetensors, config.json)"},
    {"bench", loom_cmd_bench, "time training steps of a named config"},
    {"bench-comm", loom_cmd_bench_comm, "bandwidth of the collectives over the launched ranks"},
    {"schedule", loom_cmd_schedule, "draw a pipeline schedule: timeline, bubble, memory"},
    {"plot", loom_cmd_plot, "draw a metrics file's curves (loss, lr, tokens/s, MFU) with gnuplot"},
};
enum { NUM_COMMANDS = sizeof COMMANDS / sizeof COMMANDS[0] };

static void usage(FILE *f) {
    fprintf(f, "loom: distributed LLM training in C\n\nusage: loom <command> [flags]\n\ncommands:\n");
    for (int i = 0; i < NUM_COMMANDS; i++) fprintf(f, "  %-10s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f, "\n'loom help <command>' (or 'loom <command> --help') lists a command's flags;\n"
               "'loom --version' prints the version and the commit loom was built from.\n");
}

static const command *find(const char *name) {
    for (int i = 0; i < NUM_COMMANDS; i++)
        if (strcmp(name, COMMANDS[i].name) == 0) return &COMMANDS[i];
    fprintf(stderr, "loom: error: unknown command '%s' (hint: run 'loom help' for the commands)\n", name);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        (strcmp(argv[1], "help") == 0 && argc == 2)) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        char line[128];
        cli_version_line(line, sizeof line);
        printf("%s\n", line);
        return 0;
    }
    if (strcmp(argv[1], "help") == 0) { // loom help COMMAND: the command's --help
        if (argc > 3) {
            fprintf(stderr, "loom: error: 'loom help' takes one command, got %d (hint: loom help train)\n", argc - 2);
            return 1;
        }
        const command *c = find(argv[2]);
        char *args[] = {argv[2], "--help", NULL};
        return c ? c->run(2, args) : 1;
    }
    const command *c = find(argv[1]);
    return c ? c->run(argc - 1, argv + 1) : 1;
}
