// Command-line flags for the loom subcommands, parsed with getopt_long. Each subcommand
// declares a table of flags (name, type, destination, help, and for numbers their range);
// values are checked here for their type (a malformed number is an error naming the flag and
// the text) and their range (before anything runs), and the usage prints both.
#pragma once
#include "core/status.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum { FLAG_INT, FLAG_I64, FLAG_FLOAT, FLAG_STR, FLAG_BOOL } loom_flag_type;

// Which ends of a numeric flag's range are excluded: (min, max], [min, max), (min, max).
enum { FLAG_ABOVE_MIN = 1, FLAG_BELOW_MAX = 2 };

typedef struct {
    const char *name; // long name without the dashes: "lr" for --lr
    loom_flag_type type;
    void *dst;        // int*, int64_t*, float*, const char**, bool*
    const char *help; // one line; the default is printed from *dst
    double min, max;  // numbers: the accepted range, inclusive unless `open` says (every numeric flag has one)
    int open;         // FLAG_ABOVE_MIN | FLAG_BELOW_MAX
} loom_flag;

typedef struct {
    const char *command; // "train"
    const char *summary; // one line
    const char *usage;   // e.g. "loom train [flags]"
    const loom_flag *flags;
    int nflags;
    int max_positional; // positional arguments accepted (0: none)
} loom_cli;

// Parses argv[1..argc) (argv[0] is the subcommand name). On success *help is true when
// --help/-h was given (usage already printed to stdout), and positional arguments are left in
// pos[0..*npos) (pointers into argv). Errors: LOOM_EINVAL for an unknown flag, a missing or
// malformed value, a number outside its flag's range ("--threads must be in [0, 1024], got
// 100000"), or too many positional arguments.
loom_status loom_flags_parse(const loom_cli *cli, int argc, char **argv, bool *help, char ***pos,
                             int *npos);
void loom_flags_usage(const loom_cli *cli, FILE *f);
